"""Event handlers: turn an informer's :class:`~informers.store.StoreDelta` into reconcile
requests on a controller's queue.

A handler maps a delta to the :class:`~controller_runtime.reconcile.Request` keys to
reconcile (:meth:`EventHandler.requests`); :meth:`EventHandler.bind` makes the function that is
registered on an informer: it applies the predicates, maps, and adds the keys to the queue.

Priorities follow controller-runtime's priority queue: deltas from an informer's initial list
are queued at :data:`~controller_runtime.workqueue.LOW_PRIORITY`, fresh changes at 0, so after
a restart live changes are reconciled before the backlog. (This runtime's informers never
resync, so there are no resync updates to demote.)

Handlers run inline in the informer's dispatch, in order, for every change: they are plain
synchronous functions, and anything they call (predicates, map functions) must be fast and
non-blocking. An exception in a handler is logged and counted by the informer
(``informer_handler_errors_total``) and that delta is skipped; the watch goes on.

Mapping to controller-runtime's ``pkg/handler``: :class:`EnqueueRequestForObject`,
:class:`EnqueueRequestForOwner` (``OnlyControllerOwner()`` is ``only_controller=True``, the
default), :class:`EnqueueRequestsFromMapFunc`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from controller_runtime.predicates import PredicateLike, combine
from controller_runtime.reconcile import REQUEST_KEYS, Request, request_key
from controller_runtime.workqueue import LOW_PRIORITY, WorkQueue
from informers.store import MODIFIED, StoreDelta

# What a controller author uses (all of it re-exported by ``controller_runtime``);
# ``DeltaHandler`` and ``RequestQueue`` are the seams to informers and the controller's queue.
__all__ = [
    "EnqueueRequestForObject",
    "EnqueueRequestForOwner",
    "EnqueueRequestsFromMapFunc",
    "EventHandler",
    "MapFunc",
    "request_for",
]

DeltaHandler = Callable[[StoreDelta, bool], None]
"""What an informer calls: ``handler(delta, initial)``."""

MapFunc = Callable[[Mapping[str, Any]], Iterable[Request]]
"""Maps an object (read-only) to the requests it should trigger."""


class RequestQueue(Protocol):
    """Where handlers put requests (a :class:`~controller_runtime.workqueue.WorkQueue`)."""

    def add(self, item: Request, *, priority: int = 0) -> None: ...


def request_for(obj: Mapping[str, Any]) -> Request:
    """The request for ``obj`` itself: its namespace (``""`` if cluster-scoped) and name."""
    meta = obj["metadata"]
    return Request(meta.get("namespace") or "", meta["name"])


class EventHandler:
    """Maps deltas to requests. Subclasses implement :meth:`requests`."""

    def requests(self, delta: StoreDelta) -> Iterable[Request]:
        """The keys to reconcile for ``delta``, without duplicates."""
        raise NotImplementedError

    def bind(self, queue: RequestQueue, predicates: Sequence[PredicateLike] = ()) -> DeltaHandler:
        """The informer handler: if every predicate passes, add each request to ``queue`` at
        ``LOW_PRIORITY`` for initial-list deltas, else at priority 0."""
        check = combine(predicates)
        requests = self.requests
        add = queue.add

        def handle(delta: StoreDelta, initial: bool) -> None:
            if check is not None and not check(delta):
                return
            priority = LOW_PRIORITY if initial else 0
            for request in requests(delta):
                add(request, priority=priority)

        return handle

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _request_from_key(key: str) -> Request:
    """The request for a store key (``namespace/name``, or ``name`` if cluster-scoped)."""
    namespace, _, name = key.rpartition("/")
    # Interned: every queued request of a namespace shares one string (~70 B each otherwise).
    return Request(sys.intern(namespace), name)


class EnqueueRequestForObject(EventHandler):
    """Enqueues the object that changed (what the builder's ``for_`` uses)."""

    def requests(self, delta: StoreDelta) -> Iterable[Request]:
        return (_request_from_key(delta.key),)

    def bind(self, queue: RequestQueue, predicates: Sequence[PredicateLike] = ()) -> DeltaHandler:
        # The hottest handler: specialised so that an event costs one call, no iterator, and
        # reads only the delta's key: objects of an initial list are never decoded for it.
        check = combine(predicates)
        if isinstance(queue, WorkQueue) and queue.keys is REQUEST_KEYS:
            # A controller's queue holds requests as store keys: queue the store's own key
            # string, so a queued request costs no object of its own.
            add_key = queue.add_key

            def handle_key(delta: StoreDelta, initial: bool) -> None:
                if check is not None and not check(delta):
                    return
                key = delta.key
                add_key(
                    # A key starting with "/" names no object an API server accepts, and is
                    # not the key of the request it stands for (see REQUEST_KEYS).
                    request_key(_request_from_key(key)) if key.startswith("/") else key,
                    priority=LOW_PRIORITY if initial else 0,
                )

            return handle_key
        add = queue.add
        intern = sys.intern  # see _request_from_key

        def handle(delta: StoreDelta, initial: bool) -> None:
            if check is not None and not check(delta):
                return
            namespace, _, name = delta.key.rpartition("/")
            add(Request(intern(namespace), name), priority=LOW_PRIORITY if initial else 0)

        return handle


class EnqueueRequestForOwner(EventHandler):
    """Enqueues the owners of the object that changed, found in its
    ``metadata.ownerReferences`` (what the builder's ``owns`` uses).

    Args:
        owner_api_version: the owner's ``apiVersion`` (``"tasks.crpy.io/v1"``, ``"v1"``).
            Only its group is compared, so a reference written with another version of the
            same group matches, as in controller-runtime.
        owner_kind: the owner's kind (``"Task"``).
        only_controller: only the reference marked ``controller: true`` counts (default,
            controller-runtime's ``OnlyControllerOwner()``); ``False`` enqueues every owner of
            that kind.
        owner_namespaced: whether the owner kind is namespaced (default ``True``): its
            request then carries the object's namespace (owner references never cross
            namespaces), else ``""``. The builder sets it from discovery.

    For an update, owners of both the old and the new state are enqueued, so a reference
    that moved from one owner to another triggers both. That decodes the old state of every
    update of an owned object.
    """

    def __init__(
        self,
        owner_api_version: str,
        owner_kind: str,
        *,
        only_controller: bool = True,
        owner_namespaced: bool = True,
    ) -> None:
        self.owner_group = _group(owner_api_version)
        self.owner_kind = owner_kind
        self.only_controller = only_controller
        self.owner_namespaced = owner_namespaced

    def owners(self, obj: Mapping[str, Any]) -> list[Request]:
        """The requests for ``obj``'s matching owners."""
        meta = obj.get("metadata") or {}
        refs = meta.get("ownerReferences")
        if not refs:
            return []
        namespace = (meta.get("namespace") or "") if self.owner_namespaced else ""
        out: list[Request] = []
        for ref in refs:
            if self.only_controller and not ref.get("controller"):
                continue
            if ref.get("kind") != self.owner_kind:
                continue
            if _group(ref.get("apiVersion") or "") != self.owner_group:
                continue
            request = Request(namespace, ref["name"])
            if request not in out:
                out.append(request)
        return out

    def requests(self, delta: StoreDelta) -> Iterable[Request]:
        out = self.owners(delta.obj)
        if delta.type == MODIFIED and delta.old is not None:
            for request in self.owners(delta.old):
                if request not in out:
                    out.append(request)
        return out

    def __repr__(self) -> str:
        group = self.owner_group or "core"
        only = "" if self.only_controller else ", only_controller=False"
        return f"EnqueueRequestForOwner({group}/{self.owner_kind}{only})"


class EnqueueRequestsFromMapFunc(EventHandler):
    """Enqueues whatever ``fn(obj)`` returns: ``fn`` maps an object to requests (any
    iterable of :class:`~controller_runtime.reconcile.Request`; duplicates are dropped).

    For an update, ``fn`` is called on the old and on the new state, and the union is
    enqueued (as in controller-runtime), so an object that stops matching still triggers what
    it matched before. For a delete, ``fn`` gets the last known state.

    ``fn`` is synchronous on purpose: it runs inline for every event, before anything is
    queued. Keep it to a computation over the object, or a read of the cache (e.g. list the
    objects that reference this one, through an index); never do network I/O in it.
    """

    def __init__(self, fn: MapFunc) -> None:
        if not callable(fn):
            raise TypeError(f"the map function must be callable, got {fn!r}")
        self.fn = fn

    def requests(self, delta: StoreDelta) -> Iterable[Request]:
        fn = self.fn
        out = dict.fromkeys(fn(delta.obj))  # ordered, deduplicated
        if delta.type == MODIFIED and delta.old is not None:
            out.update(dict.fromkeys(fn(delta.old)))
        return out.keys()

    def __repr__(self) -> str:
        return f"EnqueueRequestsFromMapFunc({getattr(self.fn, '__qualname__', self.fn)})"


def _group(api_version: str) -> str:
    """``"apps/v1"`` → ``"apps"``; ``"v1"`` → ``""`` (the core group)."""
    return api_version.rpartition("/")[0]
