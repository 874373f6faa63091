"""Prometheus metrics of the runtime, all in one registry: :data:`REGISTRY`.

Names, labels and buckets follow controller-runtime, so existing dashboards and alerts work
unchanged. Serve :data:`REGISTRY` (not ``prometheus_client.REGISTRY``) from the metrics
endpoint.

Each section owns one family of metrics. Metric objects are module-level singletons; the code
that updates them binds its labelled children once (``.labels(...)`` is too slow for a hot
path) and keeps the child.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple, Protocol

from informers.fastmetrics import Counter, Gauge, Histogram, Registry

if TYPE_CHECKING:  # prometheus_client is imported when the registry is collected
    from prometheus_client.core import GaugeMetricFamily, Metric

# The registry is the public part: every series is read from it by name (controller-runtime's
# names, listed in docs/controllers.md and docs/reference.md); the metric objects below are the
# runtime's own.
__all__ = ["REGISTRY"]

REGISTRY = Registry()
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
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

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


# --- Controller --------------------------------------------------------------------------------
#
# controller-runtime's pkg/internal/controller/metrics/metrics.go, plus the stale-skip counter of
# the consistency guard (KEP-5647's ``*_stale_sync_skips_total``, one series per controller).
# ``Controller`` binds its children once (:func:`controller_metrics`); ``active_workers`` is read
# from the controller at collection time, so a successful reconcile pays for one counter
# increment and one histogram observation, nothing more.

CONTROLLER_LABELS = ("controller",)

RECONCILE_RESULTS = ("success", "error", "requeue", "requeue_after")
"""Values of ``controller_runtime_reconcile_total``'s ``result`` label. ``requeue`` exists for
dashboard parity only: :class:`~controller_runtime.reconcile.Result` has no deprecated
``Requeue`` flag, so it stays at 0."""

RECONCILE_TIME_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0),
    *(6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
)
"""controller-runtime's buckets for ``controller_runtime_reconcile_time_seconds`` (5 ms … 60 s)."""

RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total",
    "Total number of reconciliations per controller",
    ("controller", "result"),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total",
    "Total number of reconciliation errors per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)
TERMINAL_RECONCILE_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors_total",
    "Total number of terminal reconciliation errors per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)
RECONCILE_PANICS = Counter(
    "controller_runtime_reconcile_panics_total",
    "Total number of reconciliation panics per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)
RECONCILE_TIMEOUTS = Counter(
    "controller_runtime_reconcile_timeouts_total",
    "Total number of reconciliation timeouts per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    CONTROLLER_LABELS,
    buckets=RECONCILE_TIME_BUCKETS,
    registry=REGISTRY,
)
MAX_CONCURRENT_RECONCILES = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers",
    "Number of currently used workers per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)
STALE_SKIPS = Counter(
    "controller_runtime_stale_skips_total",
    "Total number of reconciles deferred because the cache had not yet observed the "
    "controller's own writes, per controller",
    CONTROLLER_LABELS,
    registry=REGISTRY,
)


# --- The cache's memory budget ------------------------------------------------------------------

# Labelled by API group (``""`` for the core group) and kind, so a Kind served by two groups
# has two series. A kind's series are removed when the cache stops watching it.

CACHE_LABELS = ("group", "kind")

CACHE_BYTES = Gauge(
    "cache_bytes",
    "Encoded bytes the cache holds per group and kind: full bodies, and the metadata of "
    "objects whose body a memory budget evicted (read at scrape time)",
    CACHE_LABELS,
    registry=REGISTRY,
)
CACHE_FETCH_ON_MISS = Counter(
    "cache_fetch_on_miss_total",
    "Cached reads answered by a live GET because the memory budget had evicted the body, "
    "per group and kind",
    CACHE_LABELS,
    registry=REGISTRY,
)


# --- Supervision -------------------------------------------------------------------------------
#
# The manager's long-running tasks (leader election, the metrics and health servers, the
# controllers' workers) and what happened to them when they failed unexpectedly. ``task`` names
# the kind of task (``leader-election``, ``metrics-server``, ``health-server``,
# ``controller-worker``); the values are documented in docs/manager.md.

TASK_FAILURES = Counter(
    "controller_runtime_task_failures_total",
    "Unexpected exceptions in the manager's long-running tasks, by task",
    ("task",),
    registry=REGISTRY,
)
TASK_RESTARTS = Counter(
    "controller_runtime_task_restarts_total",
    "Restarts of the manager's long-running tasks after an unexpected failure, by task",
    ("task",),
    registry=REGISTRY,
)


# --- Webhooks ----------------------------------------------------------------------------------
#
# controller-runtime's pkg/webhook/internal/metrics: ``webhook`` is the path served
# (``/validate-shop-example-com-v1-widget``, ``/convert``), ``code`` the HTTP status answered.

WEBHOOK_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Prometheus' default buckets, which controller-runtime's webhook latency uses."""

WEBHOOK_LATENCY = Histogram(
    "controller_runtime_webhook_latency_seconds",
    "Histogram of the latency of processing admission requests",
    ("webhook",),
    buckets=WEBHOOK_LATENCY_BUCKETS,
    registry=REGISTRY,
)
WEBHOOK_REQUESTS = Counter(
    "controller_runtime_webhook_requests_total",
    "Total number of admission requests by HTTP status code.",
    ("webhook", "code"),
    registry=REGISTRY,
)
WEBHOOK_IN_FLIGHT = Gauge(
    "controller_runtime_webhook_requests_in_flight",
    "Current number of admission requests being served.",
    ("webhook",),
    registry=REGISTRY,
)


class ControllerMetrics(NamedTuple):
    """One controller's bound metric updaters (``inc``/``observe`` of its labelled children)."""

    success: Callable[[], None]
    error: Callable[[], None]
    requeue_after: Callable[[], None]
    errors: Callable[[], None]
    terminal_errors: Callable[[], None]
    panics: Callable[[], None]
    timeouts: Callable[[], None]
    stale_skips: Callable[[], None]
    reconcile_time: Callable[[float], None]


def controller_metrics(
    controller: str, *, active_workers: Callable[[], float], max_concurrent_reconciles: int
) -> ControllerMetrics:
    """Create ``controller``'s series (all at 0, as controller-runtime does at start, so rates
    and alerts work before the first event) and return their bound updaters.

    ``active_workers`` is called at each collection (possibly from the metrics server's
    thread): it must be cheap and thread-safe, e.g. read an int attribute.
    """
    total = {result: RECONCILE_TOTAL.labels(controller, result) for result in RECONCILE_RESULTS}
    ACTIVE_WORKERS.labels(controller).set_function(active_workers)
    MAX_CONCURRENT_RECONCILES.labels(controller).set(max_concurrent_reconciles)
    return ControllerMetrics(
        success=total["success"].inc,
        error=total["error"].inc,
        requeue_after=total["requeue_after"].inc,
        errors=RECONCILE_ERRORS.labels(controller).inc,
        terminal_errors=TERMINAL_RECONCILE_ERRORS.labels(controller).inc,
        panics=RECONCILE_PANICS.labels(controller).inc,
        timeouts=RECONCILE_TIMEOUTS.labels(controller).inc,
        stale_skips=STALE_SKIPS.labels(controller).inc,
        reconcile_time=RECONCILE_TIME.labels(controller).observe,
    )


def remove_controller_series(controller: str, queue: WorkqueueGaugeSource | None = None) -> None:
    """Drop every series of ``controller`` (its ``controller_runtime_*`` ones) and, given its
    work queue, the queue's (``workqueue_*{name, controller}``): for a controller stopped
    while the process runs on, so that a controller per CRD does not leave series behind
    for every CRD it ever served. A controller of the same name made later starts its
    series at 0 again (Prometheus reads that as a counter reset)."""
    for result in RECONCILE_RESULTS:
        RECONCILE_TOTAL.remove(controller, result)
    for family in (
        RECONCILE_ERRORS,
        TERMINAL_RECONCILE_ERRORS,
        RECONCILE_PANICS,
        RECONCILE_TIMEOUTS,
        RECONCILE_TIME,
        STALE_SKIPS,
    ):
        family.remove(controller)
    for gauge in (ACTIVE_WORKERS, MAX_CONCURRENT_RECONCILES):
        with contextlib.suppress(KeyError):
            gauge.remove(controller)
    if queue is not None:
        WORKQUEUE_GAUGES.untrack(queue)
        g = queue.metric_gauges()
        for queue_family in (
            WORKQUEUE_ADDS,
            WORKQUEUE_RETRIES,
            WORKQUEUE_QUEUE_DURATION,
            WORKQUEUE_WORK_DURATION,
        ):
            queue_family.remove(g.name, g.controller)
