"""Read-your-own-writes: a reconcile of a key never runs on a cache that has not yet seen the
writes made by earlier reconciles of that key.

This is the pattern of KEP-5647 ("stale controller mitigation", kube-controller-manager 1.36):
every write records the resourceVersion the server returned; before the next reconcile of the
same key, the runtime checks that the informer caches have observed that version and, if not,
requeues the key after a short delay instead of running the reconcile on stale data. Deletes
are tracked by UID. ``docs/consistency.md`` states the guarantee and its limits precisely.

Two pieces live here:

- :class:`ReadYourWritesGuard`, one per controller, implementing
  :class:`~controller_runtime.reconcile.ConsistencyGuard`. The client records writes made while
  a reconcile runs; the controller calls :meth:`ReadYourWritesGuard.check` before each
  reconcile.
- :class:`OwnWritesOverlay`, an optional overlay for the client's cached ``get``: it returns the
  newer of the cached object and the client's own last write of it (client-go's
  ``MutationCache`` / JOSDK's temporary resource cache, in spirit).
- :class:`OwnWriteEchoes`, optional (``ControllerOptions.skip_own_write_echoes``): a filter on
  the controller's own kind that drops the watch event of an object whose only change is the
  controller's own conditioned write of it, so that write is not reconciled a second time.

Everything here runs on one event loop and is not thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from cachetools import LRUCache

from controller_runtime.cache import KindInformers
from controller_runtime.reconcile import EchoTicket, Request
from informers.labels import LabelSelector
from informers.resource_version import compare_resource_versions
from informers.shared import SharedInformer
from informers.store import Store, StoreDelta
from kubeclient.discovery import ResourceInfo

__all__ = [
    "DEFAULT_MAX_WAIT",
    "DEFAULT_REQUEUE_DELAY",
    "InformerSource",
    "OwnWriteEchoes",
    "OwnWritesOverlay",
    "ReadYourWritesGuard",
]

log = logging.getLogger(__name__)

DEFAULT_REQUEUE_DELAY = 0.05
"""Seconds before a held-back request is tried again. A healthy watch delivers an event within
milliseconds of the write on a local network (10-500 ms was reported under load,
mig-controller#1035); 50 ms adds little latency, and a skip costs one delayed queue add plus a
few dictionary lookups, so checking 20 times a second per stale key is cheap."""

DEFAULT_MAX_WAIT = 30.0
"""Seconds after which an unobserved write no longer holds reconciles back (fail open, with a
warning). Far above any healthy catch-up, and long enough to ride out a watch reconnect with
backoff; past it the cache itself is broken (its own metrics say so), and holding the key
forever would be worse than a possibly stale read, which optimistic concurrency still guards.
kube-controller-manager's expectations expire after 5 min; kopf and controller-runtime's
read-your-own-write design wait 5 s."""

ObjectKey = tuple[str, str, str]
"""``(group_resource, namespace, name)``; ``namespace`` is ``""`` for cluster-scoped objects."""


class InformerSource(Protocol):
    """What the guard needs from the cache: the informers per watched kind
    (:class:`~controller_runtime.cache.Cache` provides it)."""

    def kinds(self) -> list[KindInformers]: ...


@dataclass(slots=True)
class _Record:
    """The newest write (``rv``) or the delete (``uid``) of one object, made under one key."""

    rv: str | None
    uid: str | None
    deleted: bool
    at: float
    # Stores whose informer's selectors exclude the written object: skipped unless they still
    # hold the key (then the object is leaving the selector, and they wait for its removal).
    excluded: frozenset[int] = field(default_factory=frozenset)


def _store_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _covering_informers(
    source: InformerSource, group_resource: str, namespace: str
) -> list[SharedInformer]:
    """The informers whose stores would hold an object of ``group_resource`` in ``namespace``
    (the same rule as :meth:`~controller_runtime.cache.Cache.stores_for`)."""
    out: list[SharedInformer] = []
    for entry in source.kinds():
        if entry.resource.group_resource != group_resource:
            continue
        informer = entry.informer_for(namespace or None if entry.resource.namespaced else None)
        if informer is not None:
            out.append(informer)
    return out


def _field_value(obj: Mapping[str, Any], path: str) -> str | None:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, str | int | float):
        return str(node)
    return None


def _field_selector_excludes(selector: str, obj: Mapping[str, Any]) -> bool:
    """True only when ``obj`` certainly does not match the field ``selector``.

    Handles ``f=v``, ``f==v`` and ``f!=v`` terms on fields present in ``obj`` with a scalar
    value; anything else (escapes, absent fields, whose server-side default we cannot know) is
    "maybe matches", so the guard waits rather than skip a store that may receive the object.
    """
    if "\\" in selector:
        return False
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            path, _, want = term.partition("!=")
            negate = True
        else:
            path, _, want = term.replace("==", "=", 1).partition("=")
            negate = False
        have = _field_value(obj, path.strip())
        if have is None:
            continue
        if (have == want.strip()) == negate:
            return True
    return False


def _excludes(informer: SharedInformer, obj: Mapping[str, Any]) -> bool:
    if informer.label_selector and not LabelSelector.parse(informer.label_selector).matches_object(
        obj
    ):
        return True
    return bool(informer.field_selector) and _field_selector_excludes(
        informer.field_selector or "", obj
    )


class ReadYourWritesGuard:
    """Holds a controller's reconciles of a key back until its cache has observed the writes
    made by earlier reconciles of that key.

    **Recording.** For every write made while a reconcile of ``request`` runs, the client calls
    :meth:`record_write` with the object the server returned; the guard keeps, per request and
    per written object ``(group_resource, namespace, name)``, the newest resourceVersion. A
    delete is recorded by :meth:`record_delete` with the object's UID (a later write of the same
    name replaces it, and vice versa).

    **Checking.** :meth:`check` treats a written object as observed when every store that would
    hold it (the cache's informers for its group/resource and namespace) either holds it at that
    resourceVersion or newer, or has observed a newer resourceVersion overall
    (``last_observed_resource_version``: the object changed again or left the watch since). A
    store whose informer's selector excludes the written object is skipped unless it still holds
    the key (then it waits for the removal). A deleted object is observed when no covering store
    holds that name with that UID. No covering store: nothing to wait for. Observed records are
    cleared; when none remains, ``check`` returns ``None`` (run now); otherwise it returns
    ``requeue_delay`` and the controller requeues the request without blocking a worker.

    **Failing open.** Resource versions that cannot be compared (not ``[1-9][0-9]*``, e.g. from
    an aggregated API server) count as observed, logged once per guard. A record older than
    ``max_wait`` seconds counts as observed, with a warning. Records are pruned after
    ``max_wait`` even if their key is never reconciled again, so memory stays bounded.

    ``enabled=False`` makes the guard record nothing and never hold anything back.
    ``clock`` (default :func:`time.monotonic`) is injectable for tests.
    """

    def __init__(
        self,
        controller: str,
        cache: InformerSource,
        *,
        enabled: bool = True,
        requeue_delay: float = DEFAULT_REQUEUE_DELAY,
        max_wait: float = DEFAULT_MAX_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if requeue_delay <= 0 or max_wait <= 0:
            raise ValueError("requeue_delay and max_wait must be positive")
        self.controller = controller
        self.enabled = enabled
        self.requeue_delay = requeue_delay
        self.max_wait = max_wait
        self._cache = cache
        self._clock = clock
        self._records: dict[Request, dict[ObjectKey, _Record]] = {}
        self._warned_opaque = False
        self._last_prune = clock()

    # ------------------------------------------------------------------------------ recording

    def record_write(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        """The server accepted a write and answered ``obj`` (with its new resourceVersion)."""
        if not self.enabled:
            return
        meta = obj.get("metadata") or {}
        name, rv = meta.get("name"), meta.get("resourceVersion")
        if not name:
            return
        namespace = (meta.get("namespace") or "") if resource.namespaced else ""
        key = (resource.group_resource, namespace, name)
        informers = _covering_informers(self._cache, key[0], namespace)
        if not informers:
            return  # not cached: nothing will ever be read stale from the cache
        records = self._records.setdefault(request, {})
        old = records.get(key)
        if (
            old is not None
            and not old.deleted
            and old.rv
            and rv
            and compare_resource_versions(old.rv, str(rv)) == 1
        ):
            return  # an answer that arrived late; the newer write is already recorded
        excluded = frozenset(id(i.store) for i in informers if _excludes(i, obj))
        records[key] = _Record(str(rv or ""), None, False, self._clock(), excluded)
        self._maybe_prune()

    def record_delete(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        """The server accepted a delete of ``obj`` (its namespace, name and UID are used).

        Without a UID, the object counts as observed once no covering store holds the name.
        """
        if not self.enabled:
            return
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        namespace = (meta.get("namespace") or "") if resource.namespaced else ""
        key = (resource.group_resource, namespace, name)
        if not _covering_informers(self._cache, key[0], namespace):
            return
        uid = meta.get("uid")
        self._records.setdefault(request, {})[key] = _Record(
            None, str(uid) if uid else None, True, self._clock()
        )
        self._maybe_prune()

    def forget(self, request: Request) -> None:
        """Drop every record of ``request`` (its primary object is gone)."""
        self._records.pop(request, None)

    def pending(self, request: Request | None = None) -> int:
        """How many writes are recorded and not yet seen observed (for ``request``, or all)."""
        if request is not None:
            return len(self._records.get(request, ()))
        return sum(len(r) for r in self._records.values())

    # ------------------------------------------------------------------------------- checking

    def check(self, request: Request) -> float | None:
        """``None`` when the cache has observed every write recorded for ``request``; else the
        delay (``requeue_delay``) after which to try again. Clears observed records."""
        records = self._records.get(request)
        if not records:
            return None
        now = self._clock()
        for key, record in list(records.items()):
            if self._observed(key, record):
                del records[key]
            elif now - record.at > self.max_wait:
                log.warning(
                    "controller %s: the cache has not observed the %s of %s %s after %.0fs; "
                    "reconciling %s anyway (read-your-writes guard gives up, fail open)",
                    self.controller,
                    "delete" if record.deleted else f"write at resourceVersion {record.rv}",
                    key[0],
                    _store_key(key[1], key[2]),
                    now - record.at,
                    request,
                )
                del records[key]
        if records:
            return self.requeue_delay
        del self._records[request]
        return None

    def _observed(self, key: ObjectKey, record: _Record) -> bool:
        group_resource, namespace, name = key
        store_key = _store_key(namespace, name)
        for informer in _covering_informers(self._cache, group_resource, namespace):
            store = informer.store
            if record.deleted:
                if store_key in store and (
                    record.uid is None or store.uid_of(store_key) == record.uid
                ):
                    return False
            elif not self._store_observed(store, store_key, record):
                return False
        return True

    def _store_observed(self, store: Store, store_key: str, record: _Record) -> bool:
        assert record.rv is not None
        cached = store.resource_version_of(store_key)
        if cached is None and id(store) in record.excluded:
            return True  # the watch filters the object out and never held it
        if cached is not None:
            c = compare_resource_versions(cached, record.rv)
            if c is None:
                return self._fail_open(cached, record.rv)
            if c >= 0:
                return True
        # The last observed version only bounds staleness once the initial list is complete.
        last = store.last_observed_resource_version
        if last is None or not store.has_synced:
            return False
        c = compare_resource_versions(last, record.rv)
        if c is None:
            return self._fail_open(last, record.rv)
        return c >= 0

    def _fail_open(self, a: str, b: str) -> bool:
        if not self._warned_opaque:
            self._warned_opaque = True
            log.warning(
                "controller %s: resourceVersions %r and %r are not comparable; the "
                "read-your-writes guard does not hold reconciles back for such objects",
                self.controller,
                a,
                b,
            )
        return True

    def _maybe_prune(self) -> None:
        # Keys that are never reconciled again would keep their records forever; records past
        # max_wait would fail open anyway, so dropping them changes nothing else.
        now = self._clock()
        if now - self._last_prune < self.max_wait:
            return
        self._last_prune = now
        for request, records in list(self._records.items()):
            for key, record in list(records.items()):
                if now - record.at > self.max_wait:
                    del records[key]
            if not records:
                del self._records[request]


# ---------------------------------------------------------------------------------- overlay

OverlayKey = tuple[str, str, str, str]
"""``(api_version, kind, namespace, name)``."""


@dataclass(frozen=True, slots=True)
class _OwnWrite:
    rv: str | None
    raw: bytes | None  # the written object (JSON); None for a delete
    uid: str | None


class OwnWritesOverlay:
    """The client's own last write per object, for cached reads that must not go backwards.

    After a write, :meth:`resolve` returns whichever is newer: the cached object or the written
    one (by resourceVersion); after a delete, "not found" while the cache still holds the
    deleted UID. An entry is dropped as soon as the cache has caught up with it, when the
    versions are not comparable (fail open to the cache), and by LRU eviction beyond
    ``maxsize`` entries (default 1024). Objects are kept as JSON bytes without
    ``managedFields``, so each read returns a fresh dict.

    Not overlaid: lists (they come from the cache as is), and writes made by anyone else.
    """

    def __init__(self, maxsize: int = 1024) -> None:
        self._writes: LRUCache[OverlayKey, _OwnWrite] = LRUCache(maxsize=maxsize)

    def __len__(self) -> int:
        return len(self._writes)

    def remember_write(self, api_version: str, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (api_version, kind, meta.get("namespace") or "", meta.get("name") or "")
        rv = meta.get("resourceVersion")
        old = self._writes.get(key)
        if old is not None and old.rv and rv and compare_resource_versions(old.rv, rv) == 1:
            return
        stripped = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        self._writes[key] = _OwnWrite(rv, orjson.dumps(stripped), meta.get("uid"))

    def remember_delete(
        self, api_version: str, kind: str, namespace: str | None, name: str, uid: str | None
    ) -> None:
        self._writes[(api_version, kind, namespace or "", name)] = _OwnWrite(None, None, uid)

    # One return per case: no write of ours, our delete, our write seen or not yet seen by the
    # cache, and (absent from the cache) not seen yet or seen and gone since.
    def resolve(  # noqa: PLR0911
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        cached: dict[str, Any] | None,
        stores: list[Store],
    ) -> dict[str, Any] | None:
        """The object a cached read should return (``None``: not found), given the ``cached``
        copy (``None`` if absent) and the ``stores`` that would hold it."""
        key = (api_version, kind, namespace or "", name)
        own = self._writes.get(key)
        if own is None:
            return cached
        if own.raw is None:  # our delete
            cached_uid = (cached or {}).get("metadata", {}).get("uid")
            if cached is not None and (own.uid is None or cached_uid == own.uid):
                return None
            del self._writes[key]
            return cached
        own_rv = own.rv or ""
        if cached is not None:
            cached_rv = (cached.get("metadata") or {}).get("resourceVersion") or ""
            c = compare_resource_versions(cached_rv, own_rv)
            if c is None or c >= 0:
                del self._writes[key]
                return cached
            return orjson.loads(own.raw)  # type: ignore[no-any-return]
        # Absent from the cache: not seen yet, or seen and gone since.
        for store in stores:
            last = store.last_observed_resource_version
            c = compare_resource_versions(last, own_rv) if last is not None else -1
            if c is None or c >= 0:
                del self._writes[key]
                return None
        return orjson.loads(own.raw)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- own-write echoes

EchoChain = dict[str, str]
"""Of one object: each resourceVersion our conditioned writes required -> the one they made."""


def is_own_echo(chain: Mapping[str, str], old_rv: str | None, new_rv: str | None) -> bool:
    """Whether a change of an object from ``old_rv`` to ``new_rv`` is exactly one of our own
    conditioned writes (``chain``: required -> written resourceVersion).

    Sound because a write conditioned on ``old_rv`` succeeds only if the object is still at
    ``old_rv``: nothing else changed it between, so a change ``old_rv -> new_rv`` that ends at
    our write's answer holds no change of anyone else. A relist that skipped versions shows an
    older ``old_rv`` and does not match.
    """
    return old_rv is not None and new_rv is not None and chain.get(old_rv) == new_rv


def _rv(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) else None


class OwnWriteEchoes:
    """Drops the watch events that only echo the controller's own writes of its objects.

    A reconcile that writes the object it reconciles (typically its status) makes the server
    send that change back as a watch event, which would queue the object and reconcile it a
    second time; for a reconciler that converges in one pass (the next reconcile would write
    nothing), that second reconcile is pure cost. With
    ``ControllerOptions(skip_own_write_echoes=True)`` the builder puts this filter on the
    controller's ``for_`` kind, and the client reports every write made while reconciling an
    object, **conditioned on a resourceVersion** (``update``, ``update_status``, or a merge
    patch carrying ``metadata.resourceVersion``), of that same object: before sending it
    (:meth:`expect`), then with its answer (:meth:`answered`) or its failure (:meth:`failed`).
    A ``MODIFIED`` delta from exactly the required resourceVersion to exactly the one the write
    returned is dropped (:func:`is_own_echo`); every other delta passes.

    The echo often reaches the cache before the write's answer reaches the client: both leave
    the server at once. A ``MODIFIED`` delta from the required version of a write still in
    flight is therefore **held**: it is our echo if the write succeeds and returns that
    delta's new version (then it is dropped), and someone else's change otherwise (then it is
    delivered, through the handler given to :meth:`deliver_to`, as soon as that is known).
    Without such a handler (the filter used as a plain predicate) nothing is held, and an echo
    that outruns its answer passes.

    What it guarantees: no change made by anyone else is dropped (a conditioned write that
    succeeded proves nothing came between; one that failed, was cancelled or whose outcome is
    unknown delivers what it held). An unconditioned write (``apply``, a patch without a
    resourceVersion) is never skipped. A held change is delivered late by at most its write's
    round trip, during which that object is being reconciled anyway.

    **Caveat**: the reconcile of the controller's own write does not run. A reconciler that
    relies on it (writes a first step, for example adds a finalizer, and returns, counting on
    the update event to call it again) must requeue explicitly, or leave this off (the default).

    Memory: a record per written object until its echo (or any later change) arrives, at most
    ``max_records`` (oldest dropped first; dropping only loses a skip), and one entry per write
    in flight. ``skipped`` counts the events dropped, ``skipped_before_answer`` those of them
    that had been held.
    """

    def __init__(self, resource: ResourceInfo, *, max_records: int = 100_000) -> None:
        self.group_resource = resource.group_resource
        self.namespaced = resource.namespaced
        self.max_records = max_records
        self.skipped = 0
        self.skipped_before_answer = 0
        self._chains: dict[str, EchoChain] = {}
        # Per object key: the preconditions of its writes in flight (how many on each), and
        # the delta held for each precondition, if one came.
        self._in_flight: dict[str, dict[str, int]] = {}
        self._held: dict[str, dict[str, StoreDelta]] = {}
        self._deliver: Callable[[StoreDelta, bool], None] | None = None

    def __len__(self) -> int:
        return len(self._chains)

    @property
    def writes_in_flight(self) -> int:
        return sum(sum(flights.values()) for flights in self._in_flight.values())

    @property
    def deltas_held(self) -> int:
        return sum(len(held) for held in self._held.values())

    def deliver_to(self, handler: Callable[[StoreDelta, bool], None]) -> None:
        """Where a held delta goes when it turns out not to be our echo: the ``for_``
        handler bound without this filter (the builder sets it). Until set, nothing is held."""
        self._deliver = handler

    def expect(
        self,
        request: Request,
        resource: ResourceInfo,
        namespace: str | None,
        name: str,
        precondition: str,
    ) -> EchoTicket | None:
        """A write of ``namespace/name`` conditioned on ``precondition`` is about to be sent
        while reconciling ``request``. ``None`` unless it writes ``request``'s own object of
        this kind; otherwise the ticket to pass, exactly once, to :meth:`answered` or
        :meth:`failed`."""
        if resource.group_resource != self.group_resource or not precondition:
            return None
        namespace = (namespace or "") if self.namespaced else ""
        if name != request.name or namespace != request.namespace:
            return None
        key = f"{namespace}/{name}" if namespace else name
        flights = self._in_flight.setdefault(key, {})
        flights[precondition] = flights.get(precondition, 0) + 1
        return key, precondition

    def answered(self, ticket: EchoTicket, obj: Mapping[str, Any]) -> None:
        """The write of ``ticket`` succeeded with ``obj``: its echo, held or still to come, is
        dropped."""
        key, precondition = ticket
        still_in_flight = self._land(key, precondition)
        written = (obj.get("metadata") or {}).get("resourceVersion")
        held = self._held.get(key)
        echo = held.get(precondition) if held is not None else None
        if echo is not None:
            if isinstance(written, str) and _rv(echo.obj) == written:
                self._unhold(key, precondition)
                self.skipped += 1
                self.skipped_before_answer += 1
            elif not still_in_flight:  # a write that changed nothing: the held change is not ours
                self._release(key, precondition)
            return
        if not isinstance(written, str) or not written:
            return
        chains = self._chains
        chain = chains.get(key)
        if chain is None:
            if len(chains) >= self.max_records:
                del chains[next(iter(chains))]
            chains[key] = {precondition: written}
        else:
            chain[precondition] = written

    def failed(self, ticket: EchoTicket) -> None:
        """The write of ``ticket`` failed, was cancelled, or its outcome is unknown: the delta
        it held, if any, is delivered (once no other write on that precondition is in flight)."""
        key, precondition = ticket
        if not self._land(key, precondition):
            self._release(key, precondition)

    def record(
        self, request: Request, resource: ResourceInfo, precondition: str, obj: Mapping[str, Any]
    ) -> None:
        """A write of ``request``'s own object conditioned on ``precondition`` was answered with
        ``obj``: :meth:`expect` and :meth:`answered` at once, for a write not announced before
        it was sent. Writes of other objects, or of another kind, are ignored."""
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str):
            return
        ticket = self.expect(request, resource, meta.get("namespace"), name, precondition)
        if ticket is not None:
            self.answered(ticket, obj)

    def __call__(self, delta: StoreDelta) -> bool:
        """The predicate: ``False`` (drop, or hold) for the echo of a write of ours, else
        ``True``."""
        chains = self._chains
        if not chains and not self._in_flight:
            return True
        key = delta.key
        chain = chains.get(key)
        if chain is not None:
            if delta.type == "MODIFIED" and delta.has_old:
                old_rv = _rv(delta.old)
                if is_own_echo(chain, old_rv, _rv(delta.obj)):
                    assert old_rv is not None
                    del chain[old_rv]
                    if not chain:
                        del chains[key]
                    self.skipped += 1
                    return False
            # Anything else about this object: its later history is not ours alone any more.
            del chains[key]
        flights = self._in_flight.get(key)
        if flights is not None and self._deliver is not None and delta.type == "MODIFIED":
            old_rv = _rv(delta.old) if delta.has_old else None
            if old_rv is not None and old_rv in flights:
                held = self._held.setdefault(key, {})
                if old_rv not in held:
                    held[old_rv] = delta
                    return False
        return True

    def _land(self, key: str, precondition: str) -> int:
        """One write of ``key`` on ``precondition`` is no longer in flight; how many still
        are."""
        flights = self._in_flight.get(key)
        if flights is None or precondition not in flights:
            return 0
        left = flights[precondition] - 1
        if left:
            flights[precondition] = left
        else:
            del flights[precondition]
            if not flights:
                del self._in_flight[key]
        return left

    def _unhold(self, key: str, precondition: str) -> StoreDelta | None:
        held = self._held.get(key)
        if held is None:
            return None
        delta = held.pop(precondition, None)
        if not held:
            del self._held[key]
        return delta

    def _release(self, key: str, precondition: str) -> None:
        delta = self._unhold(key, precondition)
        if delta is not None and self._deliver is not None:
            self._deliver(delta, False)
