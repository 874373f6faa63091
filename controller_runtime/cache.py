"""The manager's informer cache: which kinds are watched, in which scope, and reads from them.

Nothing is watched implicitly. A kind is watched once something asks for it with
:meth:`Cache.watch` (the builder does this for ``for_``/``owns``/``watches``); reading a kind
that is not watched raises :class:`NotCachedError` saying what to configure, instead of
silently starting a cluster-wide watch (controller-runtime's default does the latter).

Holders (who keeps a kind watched): :meth:`Cache.watch` names the holder it watches for (a
controller the builder built, a reader's token from :meth:`Cache.use`; default: pinned, for
the cache's life). :meth:`Cache.release` (or :meth:`Cache.release_all`, or leaving
:meth:`Cache.use`) drops one; when a kind's last holder is gone its informers are stopped
(their watches closed) and forgotten, so their stores are freed, and reads of the kind raise
:class:`NotCachedError` again. A controller built by the builder holds its kinds until it is
stopped. Cached reads (:meth:`Cache.get`, :meth:`Cache.list`, and the client's reads through
the cache) never start an informer, so no informer is ever started lazily behind a holder's
back, and none outlives its last holder: there is no idle timeout to wait for.

Scope: ``namespaces`` limits every namespaced kind to those namespaces (one informer per
namespace, like controller-runtime's ``DefaultNamespaces``); ``by_object`` overrides the
scope, selectors and mode per kind. Cluster-scoped kinds always get one informer.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import orjson

from controller_runtime import metrics as _metrics
from controller_runtime.objectkey import resolve_key
from controller_runtime.reconcile import Request
from controller_runtime.resource import Resource, adopt, split_target
from informers.budget import BodyBudget, EvictedBodyError
from informers.labels import LabelSelector
from informers.resource_version import compare_resource_versions
from informers.shared import PINNED, EventHandler, InformerFactory, Registration, SharedInformer
from informers.store import ADDED, DELETED, MODIFIED, IndexFunc, Store, StoreDelta
from kubeclient.discovery import ResourceInfo
from kubeclient.errors import ApiError, NotFoundError

# The cache and the informer layer under it, for code that runs a cache of its own or looks
# at deltas (their types, ADDED/MODIFIED/DELETED) rather than through predicates.
__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "PINNED",
    "ByObject",
    "Cache",
    "CacheSyncTimeoutError",
    "EvictedBodyError",
    "IndexFunc",
    "InformerFactory",
    "KindInformers",
    "KindKey",
    "LabelSelector",
    "NotCachedError",
    "StaleFetchError",
    "StoreDelta",
]

KindKey = tuple[str, str]
"""``(apiVersion, kind)``."""

R = TypeVar("R", bound=Resource)


class NotCachedError(LookupError):
    """A cached read of a kind the cache does not watch (or outside its scope)."""


class CacheSyncTimeoutError(TimeoutError):
    """Informers did not sync in time; the message names the kinds."""


class StaleFetchError(ApiError):
    """A live GET of an evicted body answered with an object older than the metadata the
    cache holds (the server, or something between, served an old state): refused, never
    returned. The reconcile fails and is retried."""


@dataclass(frozen=True)
class ByObject:
    """Per-kind cache options. ``None`` fields fall back to the cache's defaults."""

    namespaces: tuple[str, ...] | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    metadata_only: bool = False
    indexers: Mapping[str, IndexFunc] | None = None
    memory_limit: int | None = None
    """Bytes of full bodies this kind's cache may hold (``None``: the cache's overall budget,
    if any, else unbounded). Above it, the least recently used bodies are evicted and only
    their metadata kept; the client fetches an evicted body live on a read."""


@dataclass
class KindInformers:
    """The informers serving one kind: one, or one per configured namespace."""

    resource: ResourceInfo
    informers: dict[str | None, SharedInformer] = field(default_factory=dict)
    label_selector: LabelSelector | None = None

    @property
    def stores(self) -> list[Store]:
        return [i.store for i in self.informers.values()]

    @property
    def has_synced(self) -> bool:
        return all(i.has_synced for i in self.informers.values())

    def covers(self, namespace: str | None) -> bool:
        """True if reads of ``namespace`` (``None``: all namespaces) are served."""
        if None in self.informers or not self.resource.namespaced:
            return True
        return namespace is not None and namespace in self.informers

    def informer_for(self, namespace: str | None) -> SharedInformer | None:
        if None in self.informers:
            return self.informers[None]
        return self.informers.get(namespace)

    def stores_for(self, namespace: str | None) -> list[Store]:
        """Stores that would hold an object of ``namespace``."""
        informer = self.informer_for(namespace if self.resource.namespaced else None)
        return [informer.store] if informer is not None else []

    def informers_for(self, namespace: str | None) -> list[SharedInformer]:
        """Informers to list ``namespace`` from (``None``: all of them)."""
        if namespace is None or not self.resource.namespaced:
            return list(self.informers.values())
        return [i for i in [self.informer_for(namespace)] if i is not None]

    def add_handler(self, handler: EventHandler) -> list[Registration]:
        return [i.add_handler(handler) for i in self.informers.values()]

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """True once every informer of the kind synced; ``False`` after ``timeout``."""
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for i in self.informers.values()))
        return all(results)


class Cache:
    """Informers per kind, created on :meth:`watch`, read with :meth:`get` and :meth:`list`.

    Reads return fresh dicts (the store decodes on every read); mutating them is safe. Every
    method that takes ``api_version, kind`` also takes a resource class in their place
    (:mod:`controller_runtime.resource`): reads then return instances of it, decoded from the
    cache's bytes.
    """

    def __init__(
        self,
        factory: InformerFactory,
        *,
        namespaces: Sequence[str] | None = None,
        by_object: Mapping[KindKey, ByObject] | None = None,
        start_timeout: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self.factory = factory
        # One budget shared by every kind without a memory_limit of its own.
        self.budget = BodyBudget(memory_limit) if memory_limit is not None else None
        self._budgets: dict[KindKey, BodyBudget] = {}  # the kinds with a memory_limit
        self.namespaces = tuple(namespaces) if namespaces else None
        self.by_object = dict(by_object or {})
        self.start_timeout = start_timeout
        self._kinds: dict[KindKey, KindInformers] = {}
        self._holders: dict[KindKey, set[object]] = {}
        self._lock = asyncio.Lock()

    @property
    def discovery(self) -> Any:
        return self.factory.discovery

    async def watch(
        self,
        api_version: str | type[Resource],
        kind: str | None = None,
        *,
        holder: object = PINNED,
    ) -> KindInformers:
        """Watch ``kind`` (idempotent) for ``holder`` and return its informers, started.

        ``holder`` (any hashable object; default pinned: watched for the cache's life) keeps
        the kind watched until :meth:`release` (module docs). Holding twice counts once.

        While the API server cannot be reached, this waits for it (discovery retries with
        backoff and logs each failure, the first at once) for at most ``start_timeout``
        seconds, then raises :class:`~kubeclient.discovery.ServerUnreachableError`
        (``None``, the default of a bare cache: until the caller is cancelled; a manager
        passes ``ManagerOptions.start_timeout``)."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="Cache.watch")
        key = (api_version, kind)
        async with self._lock:
            existing = self._kinds.get(key)
            if existing is not None:
                if key in self._holders:  # else attached: its owner manages it
                    self._holders[key].add(holder)
                return existing
            # Waits (and logs) while the API server is unreachable, e.g. at start.
            resource = await self.factory.discovery.resolve(
                api_version, kind, wait_for_server=True, wait_timeout=self.start_timeout
            )
            options = self.by_object.get(key, ByObject())
            namespaces: Sequence[str | None] = [None]
            if resource.namespaced:
                scope = options.namespaces or self.namespaces
                if scope:
                    namespaces = list(scope)
            budget = self.budget_for(api_version, kind)
            entry = KindInformers(
                resource,
                label_selector=(
                    LabelSelector.parse(options.label_selector) if options.label_selector else None
                ),
            )
            for namespace in namespaces:
                entry.informers[namespace] = await self.factory.informer(
                    api_version,
                    kind,
                    namespace=namespace,
                    label_selector=options.label_selector,
                    field_selector=options.field_selector,
                    metadata_only=options.metadata_only,
                    indexers=options.indexers,
                    holder=(self, key),
                    budget=budget,
                )
            self._kinds[key] = entry
            self._holders[key] = {holder}
            self._count_bytes(resource)
            return entry

    def budget_for(
        self, api_version: str | type[Resource], kind: str | None = None
    ) -> BodyBudget | None:
        """The body budget of ``kind``'s informers: its own (``ByObject(memory_limit=)``,
        one per kind, shared by the kind's informers, e.g. one per namespace or per shard
        slot), else the cache's overall one, else ``None`` (unbounded)."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="Cache.budget_for")
        key = (api_version, kind)
        options = self.by_object.get(key)
        if options is None or options.memory_limit is None:
            return self.budget
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = BodyBudget(options.memory_limit)
        return budget

    def _count_bytes(self, resource: ResourceInfo) -> None:
        """``cache_bytes{group, kind}`` from this cache's stores of the kind, at scrape time
        (the cache held weakly). Every version of a group and kind counts in one series."""
        ref = weakref.ref(self)
        group, kind = resource.group, resource.kind

        def held() -> float:
            cache = ref()
            if cache is None:
                return 0.0
            return float(sum(s.held_bytes() for s in cache._stores_of(group, kind)))

        _metrics.CACHE_BYTES.labels(group, kind).set_function(held)

    def _stores_of(self, group: str, kind: str) -> builtins.list[Store]:
        return [
            store
            for entry in list(self._kinds.values())
            if entry.resource.group == group and entry.resource.kind == kind
            for store in entry.stores
        ]

    async def release(
        self,
        api_version: str | type[Resource],
        kind: str | None = None,
        *,
        holder: object,
    ) -> bool:
        """Drop ``holder``'s hold on ``kind``. When no holder is left, the kind's informers are
        stopped and forgotten (their stores freed; reads raise :class:`NotCachedError`) and
        this returns ``True``. Releasing what ``holder`` does not hold does nothing."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="Cache.release")
        async with self._lock:
            return await self._release((api_version, kind), holder)

    async def release_all(self, holder: object) -> list[KindKey]:
        """:meth:`release` every kind ``holder`` holds; returns the kinds whose informers were
        stopped."""
        async with self._lock:
            held = [key for key, holders in self._holders.items() if holder in holders]
            return [key for key in held if await self._release(key, holder)]

    async def _release(self, key: KindKey, holder: object) -> bool:
        holders = self._holders.get(key)
        if holders is None or holder not in holders:
            return False
        holders.discard(holder)
        if holders:
            return False
        del self._holders[key]
        entry = self._kinds.pop(key)
        resource = entry.resource
        if not any(
            (e.resource.group, e.resource.kind) == (resource.group, resource.kind)
            for e in self._kinds.values()
        ):  # the last cached version of this group and kind: its series go
            with contextlib.suppress(KeyError):
                _metrics.CACHE_BYTES.remove(resource.group, resource.kind)
            _metrics.CACHE_FETCH_ON_MISS.remove(resource.group, resource.kind)
        for informer in entry.informers.values():
            await self.factory.release(informer, (self, key))
        entry.informers.clear()
        return True

    def holders(self, api_version: str | type[Resource], kind: str | None = None) -> int:
        """How many holders keep ``kind`` watched (0: not watched, or attached by its owner)."""
        _, api_version, kind, _ = split_target(api_version, kind, None, method="Cache.holders")
        return len(self._holders.get((api_version, kind), ()))

    @contextlib.asynccontextmanager
    async def use(
        self,
        api_version: str | type[Resource],
        kind: str | None = None,
        *,
        sync_timeout: float | None = None,
    ) -> AsyncIterator[KindInformers]:
        """Hold ``kind`` for the block: watched (and synced, waiting at most ``sync_timeout``
        seconds, ``None``: no limit; :class:`CacheSyncTimeoutError` past it) on entry,
        released on exit, so a reader that needs a kind for a while frees it after::

            async with cache.use("v1", "ConfigMap"):
                config = cache.get("v1", "ConfigMap", name="settings", namespace="ops")
        """
        holder = _Reader()
        entry = await self.watch(api_version, kind, holder=holder)
        try:
            if not await entry.wait_for_sync(sync_timeout):
                raise CacheSyncTimeoutError(
                    f"{entry.resource.kind} ({entry.resource.api_version}) did not sync within "
                    f"{sync_timeout}s; check RBAC (list/watch) and that its CRD is installed"
                )
            yield entry
        finally:
            await self.release(api_version, kind, holder=holder)

    def attach(self, api_version: str, kind: str, entry: KindInformers) -> None:
        """Serve reads of ``kind`` from ``entry``, whose informers someone else manages (a
        sharded controller's slots). Raises ``ValueError`` if the kind is watched already."""
        key = (api_version, kind)
        if key in self._kinds:
            raise ValueError(
                f"{kind} ({api_version}) is already cached; a sharded controller needs its "
                "kind to be cached by its shards only (do not also watch it unsharded)"
            )
        self._kinds[key] = entry
        self._count_bytes(entry.resource)

    def watched(
        self, api_version: str | type[Resource], kind: str | None = None
    ) -> KindInformers | None:
        _, api_version, kind, _ = split_target(api_version, kind, None, method="Cache.watched")
        return self._kinds.get((api_version, kind))

    def kinds(self) -> list[KindInformers]:
        return list(self._kinds.values())

    def stores_for(self, group_resource: str, namespace: str | None) -> list[Store]:
        """Every store (of any watched kind of this group/resource) holding ``namespace``."""
        return [
            store
            for entry in self._kinds.values()
            if entry.resource.group_resource == group_resource
            for store in entry.stores_for(namespace)
        ]

    def _entry(
        self, api_version: str, kind: str, namespace: str | None, *, listing: bool = False
    ) -> KindInformers:
        entry = self._kinds.get((api_version, kind))
        if entry is None:
            raise NotCachedError(
                f"{kind} ({api_version}) is not in the cache: watch it first (the builder's "
                "for_/owns/watches/caches, or cache.watch(...)), or read it live with "
                "client.live"
            )
        # A list of every namespace is served from whatever namespaces are cached.
        if not (listing and namespace is None) and not entry.covers(namespace):
            scope = ", ".join(sorted(n for n in entry.informers if n)) or "-"
            raise NotCachedError(
                f"{kind} in namespace {namespace or '<all>'} is outside the cache's scope "
                f"({scope}); read it live with client.live or widen the cache's namespaces"
            )
        return entry

    @overload
    def get(
        self,
        api_version: type[R],
        kind: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> R: ...

    @overload
    def get(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]: ...

    def get(
        self,
        api_version: str | type[R],
        kind: str | Request | None = None,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Any:
        """The cached object, keyed by a ``Request`` or by ``name=``/``namespace=`` (see
        :mod:`controller_runtime.objectkey`); raises :class:`~kubeclient.errors.NotFoundError`
        when absent. ``get(Task, request)`` returns a ``Task``."""
        cls, api_version, kind, key = split_target(api_version, kind, key, method="Cache.get")
        namespace, name = resolve_key(key, name, namespace, method="Cache.get")
        entry = self._entry(api_version, kind, namespace)
        store_key = f"{namespace}/{name}" if entry.resource.namespaced and namespace else name
        for store in entry.stores_for(namespace):
            if cls is not None:
                raw = store.get_raw(store_key)
                if raw is not None:
                    return cls.from_json(raw)
                continue
            obj = store.get(store_key)
            if obj is not None:
                return obj
        raise NotFoundError(
            404, "NotFound", f'{entry.resource.group_resource} "{name}" not found (in the cache)'
        )

    @overload
    def list(
        self,
        api_version: type[R],
        kind: None = None,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> list[R]: ...

    @overload
    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> list[dict[str, Any]]: ...

    def list(
        self,
        api_version: str | type[R],
        kind: str | None = None,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> Any:
        """Cached objects of ``kind`` in ``namespace``; ``namespace=None``: every object the
        cache holds, across the namespaces it caches when its scope is restricted (so the
        answer is the same whichever namespaces a deployment configures). Raises
        :class:`NotCachedError` for a kind not cached, or a namespace outside the scope.
        ``list(Task)`` returns ``Task`` instances."""
        cls, api_version, kind, _ = split_target(api_version, kind, None, method="Cache.list")
        entry = self._entry(api_version, kind, namespace, listing=True)
        selector = (
            LabelSelector.parse(label_selector)
            if isinstance(label_selector, str)
            else label_selector
        )
        out: list[dict[str, Any]] = []
        for informer in entry.informers_for(namespace):
            out.extend(
                informer.store.list(
                    namespace=namespace if entry.resource.namespaced else None, selector=selector
                )
            )
        if cls is not None:
            return [adopt(cls, obj) for obj in out]
        return out

    def list_held(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> tuple[builtins.list[dict[str, Any]], builtins.list[Request]]:
        """:meth:`list` for synchronous readers (map functions, handlers, predicates), which
        cannot fetch: the matching objects whose bodies the cache holds, and the requests
        (namespace, name) of the matching ones it holds as metadata only (a memory budget
        evicted their bodies; label selectors match on the metadata kept). Never raises
        :class:`EvictedBodyError`; without a budget the second list is always empty. A map
        function that filters on a body field cannot tell for the second list: enqueueing
        them is the safe answer (each reconcile reads its object whole, through the
        client)."""
        entry = self._entry(api_version, kind, namespace, listing=True)
        selector = (
            LabelSelector.parse(label_selector)
            if isinstance(label_selector, str)
            else label_selector
        )
        bodies: builtins.list[dict[str, Any]] = []
        evicted: builtins.list[Request] = []
        for informer in entry.informers_for(namespace):
            held, keys = informer.store.list_held(
                namespace=namespace if entry.resource.namespaced else None, selector=selector
            )
            bodies.extend(held)
            for key, _ in keys:
                ns, _, name = key.rpartition("/")
                evicted.append(Request(ns, name))
        return bodies, evicted

    async def get_or_fetch(
        self, api_version: str, kind: str, *, name: str, namespace: str | None
    ) -> dict[str, Any]:
        """:meth:`get`, and for an object whose body the memory budget evicted, a live GET no
        older than the metadata the cache holds (``resourceVersion`` set to it, the server's
        not-older-than rule, checked again on the answer: :class:`StaleFetchError` rather
        than an older body). The body fetched passes through the informer's transform, is
        counted in ``cache_fetch_on_miss_total{kind}``, and is held again when it is at the
        cached version. Raises what :meth:`get` raises, and the GET's API errors (a 404: the
        object was deleted since the cache last heard of it)."""
        try:
            return self.get(api_version, kind, name=name, namespace=namespace)
        except EvictedBodyError as evicted:
            return await self._fetch(api_version, kind, namespace, name, evicted.resource_version)

    async def list_or_fetch(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """:meth:`list`, fetching evicted bodies as :meth:`get_or_fetch` does (one GET each,
        at most 8 at a time; an object deleted meanwhile is left out)."""
        entry = self._entry(api_version, kind, namespace, listing=True)
        selector = (
            LabelSelector.parse(label_selector)
            if isinstance(label_selector, str)
            else label_selector
        )
        out: builtins.list[dict[str, Any]] = []
        missing: builtins.list[tuple[str, str]] = []
        for informer in entry.informers_for(namespace):
            bodies, evicted = informer.store.list_held(
                namespace=namespace if entry.resource.namespaced else None, selector=selector
            )
            out.extend(bodies)
            missing.extend(evicted)
        if missing:
            gate = asyncio.Semaphore(8)

            async def fetch(key: str, rv: str) -> dict[str, Any] | None:
                ns, _, name = key.rpartition("/")
                async with gate:
                    try:
                        return await self._fetch(api_version, kind, ns or None, name, rv)
                    except NotFoundError:
                        return None

            fetched = await asyncio.gather(*(fetch(k, rv) for k, rv in missing))
            out.extend(o for o in fetched if o is not None)
        return out

    async def _fetch(
        self, api_version: str, kind: str, namespace: str | None, name: str, held: str
    ) -> dict[str, Any]:
        entry = self._entry(api_version, kind, namespace)
        resource = entry.resource
        path = resource.path(namespace if resource.namespaced else None, name)
        params = {"resourceVersion": held} if held else None
        _metrics.CACHE_FETCH_ON_MISS.labels(resource.group, resource.kind).inc()
        response = await self.factory.transport.request("GET", path, params=params)
        obj: dict[str, Any] = response.json()
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        got = (obj.get("metadata") or {}).get("resourceVersion") or ""
        if held and compare_resource_versions(got, held) == -1:
            raise StaleFetchError(
                0,
                "StaleRead",
                f"a live GET of {kind} {name} answered resourceVersion {got}, older than the "
                f"{held} the cache holds; refused (retried with the reconcile)",
                method="GET",
                path=path,
            )
        key = f"{namespace}/{name}" if resource.namespaced and namespace else name
        # The informer holding the key (with shards, one of several), for its transform and
        # to hold the body again.
        candidates = entry.informers_for(namespace if resource.namespaced else None)
        informer = next((i for i in candidates if key in i.store), None)
        if informer is None:
            informer = entry.informer_for(namespace if resource.namespaced else None)
        if informer is not None:
            if informer.transform is not None:
                obj = informer.transform(obj)
            informer.store.readmit(key, orjson.dumps(obj))
        return obj

    async def wait_for_sync(self, timeout: float | None = None) -> None:
        """Wait until every watched kind synced; :class:`CacheSyncTimeoutError` names the
        laggards."""
        pending = [
            (entry, informer)
            for entry in self._kinds.values()
            for informer in entry.informers.values()
        ]
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for _, i in pending))
        late = sorted(
            {
                f"{entry.resource.kind} ({entry.resource.api_version})"
                + (f" in {informer.namespace}" if informer.namespace else "")
                for (entry, informer), ok in zip(pending, results, strict=True)
                if not ok
            }
        )
        if late:
            raise CacheSyncTimeoutError(
                f"caches did not sync within {timeout}s: {', '.join(late)}; check RBAC "
                "(list/watch) for these kinds and that their CRDs are installed"
            )

    async def stop(self) -> None:
        """Stop every informer, held or not (what they cached stays readable)."""
        await self.factory.stop()


class _Reader:
    """The holder of one :meth:`Cache.use` block."""

    __slots__ = ()
