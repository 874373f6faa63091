"""Counters and histograms for hot paths, exported through ``prometheus_client``.

``prometheus_client``'s own ``Counter.inc`` and ``Histogram.observe`` take a lock and run
validation on every call (about 1 µs each); a reconcile updates nine of them, which was a third
of the cost of a no-op reconcile. These keep plain Python numbers instead and turn them into
metric families only when the registry is collected (at scrape time).

The same surface as ``prometheus_client`` where the runtime uses it: ``Family.labels(...)``
returns a child with ``inc(amount=1)`` or ``observe(value)``; families register themselves in
the given ``CollectorRegistry``. Output is identical in names, labels and buckets (without the
``_created`` series).

Caveat: updates are not locked. The runtime updates them from its one event loop, and the
metrics endpoint (aiohttp, same loop) collects there too; a collection from another thread may
see a histogram's count and sum from two instants a few microseconds apart.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class _Family:
    """Children by label values, and registration."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], object] = {}
        registry.register(self)  # type: ignore[arg-type]

    def _key(self, values: Sequence[object], named: dict[str, object]) -> tuple[str, ...]:
        if named:
            if values:
                raise ValueError("pass label values either by position or by name, not both")
            try:
                values = [named[label] for label in self.labelnames]
            except KeyError as missing:
                raise ValueError(f"{self.name}: missing label {missing}") from None
            if len(named) != len(self.labelnames):
                raise ValueError(f"{self.name}: unknown labels {set(named) - set(self.labelnames)}")
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(values)}")
        return tuple(str(v) for v in values)

    def remove(self, *values: object) -> None:
        """Drop the series of these label values (as ``prometheus_client``'s ``remove``);
        nothing happens if there is none."""
        self._children.pop(self._key(values, {}), None)


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class Counter(_Family):
    """A counter family (the name ends in ``_total``, as the exposition shows it)."""

    def labels(self, *values: object, **named: object) -> CounterChild:
        key = self._key(values, named)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = CounterChild()
        assert isinstance(child, CounterChild)
        return child

    def describe(self) -> Iterable[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            assert isinstance(child, CounterChild)
            family.add_metric(key, child.value)
        return [family]


class HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value


class Histogram(_Family):
    """A histogram family with fixed upper bounds (``le``); +Inf is added."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
        if not bounds:
            raise ValueError("a histogram needs at least one finite bucket")
        self.bounds = bounds
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: object, **named: object) -> HistogramChild:
        key = self._key(values, named)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = HistogramChild(self.bounds)
        assert isinstance(child, HistogramChild)
        return child

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        edges = [*(_le(b) for b in self.bounds), "+Inf"]
        for key, child in list(self._children.items()):
            assert isinstance(child, HistogramChild)
            counts, running, buckets = list(child.counts), 0, []
            for edge, count in zip(edges, counts, strict=True):
                running += count
                buckets.append((edge, float(running)))
            family.add_metric(list(key), buckets, child.sum)
        return [family]


def _le(bound: float) -> str:
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]  # as prometheus_client prints it
