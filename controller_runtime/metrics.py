"""Prometheus metrics of the runtime, all in one registry: :data:`REGISTRY`.

Names, labels and buckets follow controller-runtime, so existing dashboards and alerts work
unchanged. Serve :data:`REGISTRY` (not ``prometheus_client.REGISTRY``) from the metrics
endpoint.

Each section owns one family of metrics. Metric objects are module-level singletons; the code
that updates them binds its labelled children once (``.labels(...)`` is too slow for a hot
path) and keeps the child.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = [
    "REGISTRY",
    "WORKQUEUE_ADDS",
    "WORKQUEUE_BUCKETS",
    "WORKQUEUE_GAUGES",
    "WORKQUEUE_LABELS",
    "WORKQUEUE_QUEUE_DURATION",
    "WORKQUEUE_RETRIES",
    "WORKQUEUE_WORK_DURATION",
    "WorkqueueGaugeCollector",
    "WorkqueueGaugeSource",
    "WorkqueueGauges",
]

REGISTRY = CollectorRegistry(auto_describe=True)
"""The registry every metric of the runtime is registered in."""


# --- Workqueue ---------------------------------------------------------------------------------
#
# controller-runtime's pkg/internal/metrics/workqueue.go. Every series carries ``name`` and
# ``controller`` (both the controller's name by default); ``workqueue_depth`` also carries
# ``priority``, as with controller-runtime's priority queue.
#
# Counters and histograms are updated on the queue's hot path. The three gauges are computed
# when the registry is collected, from the live queues (:class:`WorkqueueGaugeCollector`):
# nothing is updated per item and nothing ticks in the background, and the values are exact at
# scrape time rather than up to 500 ms old as in client-go.

WORKQUEUE_LABELS = ("name", "controller")

WORKQUEUE_BUCKETS = tuple(10.0**e for e in range(-8, 4))
"""``prometheus.ExponentialBuckets(1e-8, 10, 12)``: 10 ns … 1000 s."""

WORKQUEUE_ADDS = Counter(
    "workqueue_adds_total",
    "Total number of adds handled by workqueue",
    WORKQUEUE_LABELS,
    registry=REGISTRY,
)
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries_total",
    "Total number of retries handled by workqueue",
    WORKQUEUE_LABELS,
    registry=REGISTRY,
)
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested",
    WORKQUEUE_LABELS,
    buckets=WORKQUEUE_BUCKETS,
    registry=REGISTRY,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    WORKQUEUE_LABELS,
    buckets=WORKQUEUE_BUCKETS,
    registry=REGISTRY,
)


class WorkqueueGauges(NamedTuple):
    """A queue's gauge values at one instant."""

    name: str
    controller: str
    depth: Mapping[int, int]
    """Items ready to be handed out, by priority (waiting and in-flight items excluded)."""
    unfinished_work_seconds: float
    """Sum over in-flight items of the time since they were handed out."""
    longest_running_processor_seconds: float
    """Time since the oldest in-flight item was handed out (0 when none)."""


class WorkqueueGaugeSource(Protocol):
    """Anything that can report :class:`WorkqueueGauges` (a ``WorkQueue``)."""

    def metric_gauges(self) -> WorkqueueGauges: ...


class WorkqueueGaugeCollector:
    """Computes ``workqueue_depth``, ``workqueue_unfinished_work_seconds`` and
    ``workqueue_longest_running_processor_seconds`` at collection time from tracked queues.

    Queues are held weakly: a queue that is garbage-collected stops being reported. Queues with
    the same labels are summed (depth, unfinished) or maxed (longest running), so the output
    never has duplicate series.

    Collection may run in another thread (``prometheus_client``'s HTTP server): it copies the
    set of queues and each queue's state with single C-level copies, which the GIL keeps
    atomic, so it never sees a dict changing size under it.
    """

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[WorkqueueGaugeSource]] = {}

    def track(self, source: WorkqueueGaugeSource) -> None:
        key = id(source)

        def _gone(_: object) -> None:
            self._refs.pop(key, None)

        self._refs[key] = weakref.ref(source, _gone)

    def untrack(self, source: WorkqueueGaugeSource) -> None:
        self._refs.pop(id(source), None)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "workqueue_depth",
                "Current depth of workqueue",
                labels=(*WORKQUEUE_LABELS, "priority"),
            ),
            GaugeMetricFamily(
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been "
                "observed by work_duration. Large values indicate stuck threads. One can "
                "deduce the number of stuck threads by observing the rate at which this "
                "increases.",
                labels=WORKQUEUE_LABELS,
            ),
            GaugeMetricFamily(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                labels=WORKQUEUE_LABELS,
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        depth: dict[tuple[str, str, str], int] = {}
        unfinished: dict[tuple[str, str], float] = {}
        longest: dict[tuple[str, str], float] = {}
        for ref in list(self._refs.values()):
            source = ref()
            if source is None:
                continue
            g = source.metric_gauges()
            labels = (g.name, g.controller)
            for priority, n in g.depth.items():
                key = (*labels, str(priority))
                depth[key] = depth.get(key, 0) + n
            unfinished[labels] = unfinished.get(labels, 0.0) + g.unfinished_work_seconds
            longest[labels] = max(longest.get(labels, 0.0), g.longest_running_processor_seconds)
        depth_f, unfinished_f, longest_f = self._families()
        for key, n in depth.items():
            depth_f.add_metric(key, n)
        for labels, v in unfinished.items():
            unfinished_f.add_metric(labels, v)
        for labels, v in longest.items():
            longest_f.add_metric(labels, v)
        return (depth_f, unfinished_f, longest_f)


WORKQUEUE_GAUGES = WorkqueueGaugeCollector()
REGISTRY.register(WORKQUEUE_GAUGES)
