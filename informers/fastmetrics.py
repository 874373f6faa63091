"""Counters, gauges and histograms for hot paths, and the registry that holds them, exported
through ``prometheus_client`` only when collected.

``prometheus_client``'s own ``Counter.inc`` and ``Histogram.observe`` take a lock and run
validation on every call (about 1 µs each); a reconcile updates nine of them, which was a third
of the cost of a no-op reconcile. These keep plain Python numbers instead and turn them into
metric families only when the registry is collected (at scrape time).

The same surface as ``prometheus_client`` where the runtime uses it: ``Family.labels(...)``
returns a child with ``inc(amount=1)``, ``observe(value)``, or for a gauge ``set``/``inc``/
``dec``/``set_function``; families register themselves in the given registry (a
:class:`Registry`, or ``prometheus_client``'s ``CollectorRegistry``). Output is identical in
names, labels and buckets (without the ``_created`` series).

**Importing this module does not import prometheus_client** (with the ``http.server``,
``http.client`` and ``email`` packages its exposition pulls in: a tenth of an operator's
start-up imports): :class:`Registry` and the families import it when first collected, that is
when ``/metrics`` is scraped or a test reads a sample. An operator with metrics off never
loads it.

Caveat: updates are not locked. The runtime updates them from its one event loop, and the
metrics endpoint (aiohttp, same loop) collects there too; a collection from another thread may
see a histogram's count and sum from two instants a few microseconds apart.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client.core import Metric


class Collector(Protocol):
    """What a registry collects: anything with ``collect()`` yielding metric families."""

    def collect(self) -> Iterable[Metric]: ...


class _Registers(Protocol):
    def register(self, collector: _Family) -> None: ...


class Registry:
    """The collectors of one metrics endpoint: what the runtime uses of ``prometheus_client``'s
    ``CollectorRegistry`` (:meth:`register`, :meth:`unregister`, :meth:`collect`,
    :meth:`get_sample_value`), without importing it until collected. Serve it with
    ``prometheus_client.generate_latest(registry)``. Registering a second family of a name
    already registered raises ``ValueError``, as ``CollectorRegistry`` does."""

    def __init__(self) -> None:
        self._collectors: dict[int, Collector] = {}
        self._names: dict[str, int] = {}

    def register(self, collector: Collector) -> None:
        name = getattr(collector, "name", None)
        if isinstance(name, str):
            if name in self._names:
                raise ValueError(f"Duplicated timeseries in the registry: {name}")
            self._names[name] = id(collector)
        self._collectors[id(collector)] = collector

    def unregister(self, collector: Collector) -> None:
        del self._collectors[id(collector)]
        self._names = {n: i for n, i in self._names.items() if i != id(collector)}

    def collect(self) -> Iterator[Metric]:
        for collector in list(self._collectors.values()):
            yield from collector.collect()

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of sample ``name`` with exactly ``labels``, or ``None`` (for tests, as
        ``CollectorRegistry.get_sample_value``)."""
        wanted = labels or {}
        for metric in self.collect():
            for sample in metric.samples:
                if sample.name == name and sample.labels == wanted:
                    return float(sample.value)
        return None


class _Family:
    """Children by label values, and registration."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: _Registers
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], object] = {}
        registry.register(self)

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

    def collect(self) -> Iterable[Metric]:
        raise NotImplementedError


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
        from prometheus_client.core import CounterMetricFamily  # noqa: PLC0415

        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import CounterMetricFamily  # noqa: PLC0415

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
        registry: _Registers,
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
        from prometheus_client.core import HistogramMetricFamily  # noqa: PLC0415

        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import HistogramMetricFamily  # noqa: PLC0415

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


class GaugeChild:
    """One gauge series: a value, or a function read at each collection."""

    __slots__ = ("_function", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._function: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        self._value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._value -= amount

    def set_function(self, function: Callable[[], float]) -> None:
        """Read ``function()`` at each collection instead of a set value (it must be cheap and
        safe to call from the collecting thread)."""
        self._function = function

    @property
    def value(self) -> float:
        function = self._function
        return float(function()) if function is not None else self._value


class Gauge(_Family):
    """A gauge family (``prometheus_client.Gauge``'s labelled ``set``/``inc``/``dec``/
    ``set_function``)."""

    def labels(self, *values: object, **named: object) -> GaugeChild:
        key = self._key(values, named)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = GaugeChild()
        assert isinstance(child, GaugeChild)
        return child

    def describe(self) -> Iterable[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            assert isinstance(child, GaugeChild)
            family.add_metric(key, child.value)
        return [family]


def _le(bound: float) -> str:
    from prometheus_client.utils import floatToGoString  # noqa: PLC0415

    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]  # as prometheus_client prints it
