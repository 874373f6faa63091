"""Prometheus metrics of the informer layer, in :data:`REGISTRY`.

The runtime's metrics endpoint serves this registry beside ``controller_runtime.metrics``'s
(``informers`` imports nothing from ``controller_runtime``, so it keeps a registry of its own).

REST client metrics carry controller-runtime's names (``rest_client_requests_total``,
``rest_client_request_duration_seconds``). Informer metrics are ours; every series carries
``resource`` (``plural.group``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sized
from urllib.parse import urlsplit

from informers.fastmetrics import Counter, Gauge, Histogram, Registry
from kubeclient.transport import RequestObserver

REGISTRY = Registry()

REST_REQUESTS = Counter(
    "rest_client_requests_total",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ("code", "method", "host"),
    registry=REGISTRY,
)
REST_LATENCY = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb, and host.",
    ("verb", "host"),
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
    registry=REGISTRY,
)

WATCH_RESTARTS = Counter(
    "informer_watch_restarts_total",
    "Watches re-opened, by reason (timeout, error, idle, too_many_requests, ...).",
    ("resource", "reason"),
    registry=REGISTRY,
)
RELISTS = Counter(
    "informer_relists_total",
    "Full lists (initial and relists), by reason (initial, expired, too_large, ...).",
    ("resource", "reason"),
    registry=REGISTRY,
)
EVENTS = Counter(
    "informer_events_total",
    "Watch events received, by type.",
    ("resource", "type"),
    registry=REGISTRY,
)
HANDLER_ERRORS = Counter(
    "informer_handler_errors_total",
    "Exceptions raised by event handlers (logged; the watch goes on).",
    ("resource",),
    registry=REGISTRY,
)
MALFORMED_EVENTS = Counter(
    "informer_malformed_events_total",
    "Watch lines that were not a usable event (each closes the watch and relists), and listed "
    "or watched objects the store could not take (each ignored).",
    ("resource", "what"),
    registry=REGISTRY,
)
REFLECTOR_RESTARTS = Counter(
    "informer_reflector_restarts_total",
    "Reflector tasks that ended unexpectedly (a bug, logged with its traceback) and were "
    "restarted by their informer after a backoff.",
    ("resource",),
    registry=REGISTRY,
)
WATCHES_OPEN = Gauge(
    "informer_watches_open",
    "Watch streams open now: response headers received and the stream not yet ended (0 while "
    "the reflector lists, backs off, or waits for a response).",
    ("resource",),
    registry=REGISTRY,
)
STORE_OBJECTS = Gauge(
    "informer_store_objects",
    "Objects in the informer's store.",
    ("resource",),
    registry=REGISTRY,
)

_STORES: dict[str, weakref.WeakSet[Sized]] = {}


def track_store(resource: str, store: Sized) -> None:
    """Count ``store`` in ``informer_store_objects{resource}`` (the sum over every store of the
    resource, read at scrape time). Held weakly: the metric never keeps a store alive."""
    stores = _STORES.get(resource)
    if stores is None:
        stores = _STORES[resource] = weakref.WeakSet()
    stores.add(store)
    STORE_OBJECTS.labels(resource).set_function(lambda: sum(len(s) for s in list(stores)))


def untrack_store(resource: str, store: Sized) -> None:
    """Stop counting ``store`` (its informer stopped): the series falls at once, not when the
    store is collected."""
    stores = _STORES.get(resource)
    if stores is not None:
        stores.discard(store)


def rest_observer(server: str) -> RequestObserver:
    """A transport observer that feeds the REST client metrics for ``server``."""
    host = urlsplit(server).netloc

    def observe(method: str, status: int, seconds: float) -> None:
        REST_REQUESTS.labels(str(status) if status else "<error>", method, host).inc()
        REST_LATENCY.labels(method, host).observe(seconds)

    return observe
