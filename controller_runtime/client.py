"""The client: reads from the informer cache, writes to the API server.

Objects are plain dicts (``apiVersion``, ``kind``, ``metadata``, ...), or typed resources
(:mod:`controller_runtime.resource`): every method that takes ``api_version, kind`` also takes
a resource class in their place (``client.get(Task, request)`` returns a ``Task``), and every
write of a typed object returns the same class (its unknown fields kept, see
:meth:`~controller_runtime.resource.Resource.to_dict`). ``apiVersion`` + ``kind`` are
resolved to URLs through the cache's :class:`~kubeclient.discovery.Discovery`.

**Keys.** Methods that address an object by key take ``api_version, kind`` and then a
:class:`~controller_runtime.reconcile.Request` or keyword-only ``name=``/``namespace=``
(:mod:`controller_runtime.objectkey`): ``client.get(TASKS, "Task", request)``. Names are never
positional, so ``(name, namespace)`` cannot be swapped with ``Request(namespace, name)``.
Methods that write an object take the object; :meth:`Client.delete` takes either.
:func:`ignore_not_found` turns a ``NotFoundError`` into ``None``.

**Reads.** :meth:`Client.get` and :meth:`Client.list` read the cache. A kind the cache does
not watch raises :class:`~controller_runtime.cache.NotCachedError` saying what to configure;
nothing starts a watch behind the caller's back. :attr:`Client.live` reads the API server
itself (a consistent, most-recent read), for when freshness matters more than cost.

**Writes** go to the API server and raise the typed errors of :mod:`controller_runtime.errors`.
Every successful write made while a reconcile runs is recorded with that controller's
read-your-writes guard (:mod:`controller_runtime.consistency`), so the next reconcile of the
same key waits for the cache to catch up.

**Retries.** The transport retries what is safe, as client-go does: any request answered 429
with a ``Retry-After`` (the server did not process it), reads answered 5xx with a
``Retry-After``, and reads that failed on the connection. Nothing else is retried, and this
client adds no retries of its own: a write whose outcome is unknown (a timeout, a dropped
connection, a 5xx) is raised to the caller, because blindly repeating it could apply it twice.
A timeout raises :class:`~kubeclient.errors.ServerTimeoutError` (status 0 when it was the
client's own request timeout); after one, GET the object before retrying a create (the first
attempt may have succeeded). :func:`retry_on_conflict` is the one deliberate retry loop:
re-read, re-apply the change, write, on optimistic-concurrency conflicts only.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import msgspec

from controller_runtime.cache import Cache, EvictedBodyError
from controller_runtime.consistency import OwnWritesOverlay
from controller_runtime.fencing import before_send, check_fence, current_fence
from controller_runtime.objectkey import resolve_key
from controller_runtime.reconcile import CURRENT_RECONCILE, Request
from controller_runtime.resource import Resource, Schema, adopt, as_body, split_target
from informers.labels import LabelSelector
from kubeclient.discovery import Discovery, ResourceInfo
from kubeclient.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    GoneError,
    NotFoundError,
    ServerTimeoutError,
)
from kubeclient.transport import Response, Transport

__all__ = [
    "APPLY_CONTENT_TYPE",
    "Client",
    "LiveReader",
    "PatchType",
    "PropagationPolicy",
    "Transport",
    "ignore_not_found",
    "retry_on_conflict",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", bound=Resource)
Obj = dict[str, Any]
ObjList = list[Obj]  # spelled out here: inside Client, "list" is a method
PatchType = Literal["merge", "json", "strategic"]
PropagationPolicy = Literal["Foreground", "Background", "Orphan"]

PATCH_CONTENT_TYPES: Mapping[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
"""Server-side apply. The body is JSON, which is valid YAML."""

DEFAULT_FIELD_MANAGER = "controller-runtime-py"
LIST_PAGE_SIZE = 500


# ---------------------------------------------------------------------------------- retries


def _is_retriable_conflict(err: ConflictError) -> bool:
    # AlreadyExists is a 409 too, but re-reading cannot fix it; nor can it fix a server-side
    # apply conflict with another field manager (only force can).
    if isinstance(err, AlreadyExistsError):
        return False
    # (A StatusCause's type is serialised as "reason".)
    return not any(c.get("reason") == "FieldManagerConflict" for c in err.causes)


async def retry_on_conflict(
    fn: Callable[[], Awaitable[T]],
    *,
    steps: int = 5,
    base_delay: float = 0.01,
    factor: float = 1.0,
    jitter: float = 0.1,
    max_delay: float | None = None,
) -> T:
    """Run ``fn`` until it does not raise a conflict, at most ``steps`` times.

    client-go's ``retry.RetryOnConflict``; the defaults are its ``DefaultRetry`` (5 attempts,
    10 ms apart, x1, jitter 0.1). Between attempts it sleeps ``delay * (1 + jitter * U[0,1))``,
    then multiplies ``delay`` by ``factor`` (capped at ``max_delay``). ``fn`` must re-read the
    object each time: retrying a write with the same stale resourceVersion fails the same way.

    Retried: :class:`~kubeclient.errors.ConflictError` (a stale resourceVersion or a failed
    precondition). Not retried: ``AlreadyExistsError`` and server-side apply conflicts with
    another field manager. After the last attempt the last conflict is raised.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    delay = base_delay
    for attempt in range(1, steps + 1):
        try:
            return await fn()
        except ConflictError as err:
            if attempt == steps or not _is_retriable_conflict(err):
                raise
        await asyncio.sleep(delay * (1.0 + jitter * random.random()))
        delay *= factor
        if max_delay is not None:
            delay = min(delay, max_delay)
    raise AssertionError("unreachable")  # pragma: no cover


# ------------------------------------------------------------------------------- live reads


_READS = frozenset({"GET", "HEAD"})


async def _request(
    transport: Transport,
    method: str,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | None = None,
) -> Response:
    hook = None
    if method not in _READS:
        # A write for work whose lease (leadership, a slot) is no longer provably held is
        # never sent (controller_runtime.fencing): checked now and again right before each
        # time the transport sends it (after a pool wait, a Retry-After sleep, a refresh).
        fence = current_fence()
        check_fence(fence)
        hook = before_send(fence)
    try:
        if hook is None:
            return await transport.request(
                method, path, params=params, body=body, content_type=content_type, timeout=timeout
            )
        return await transport.request(
            method,
            path,
            params=params,
            body=body,
            content_type=content_type,
            timeout=timeout,
            before_send=hook,
        )
    except ApiError as err:
        # The transport reports its own request timeout as a bare transport error; callers
        # should see the same type as for a server-side timeout: the outcome is unknown.
        if err.status == 0 and isinstance(err.__cause__, TimeoutError):
            advice = "" if method in ("GET", "HEAD") else "; GET the object before retrying"
            raise ServerTimeoutError(
                0,
                "Timeout",
                f"no answer within the request timeout, the outcome is unknown{advice}",
                method=method,
                path=path,
            ) from err
        raise


def _with_type(items: list[Obj], resource: ResourceInfo) -> list[Obj]:
    # List items of built-in kinds come without apiVersion/kind.
    for item in items:
        item.setdefault("apiVersion", resource.api_version)
        item.setdefault("kind", resource.kind)
    return items


class LiveReader:
    """Reads straight from the API server (``resourceVersion`` unset: the most recent state).

    Costs a round trip (and, for lists, server work proportional to the collection); use it
    when a decision must not rest on the cache, e.g. before re-creating something whose create
    timed out. Lists are fetched in pages of 500.
    """

    def __init__(
        self, transport: Transport, discovery: Discovery, *, timeout: float | None = None
    ) -> None:
        self._transport = transport
        self._timeout = timeout
        self._discovery = discovery

    @overload
    async def get(
        self,
        api_version: type[R],
        kind: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> R: ...

    @overload
    async def get(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Obj: ...

    async def get(
        self,
        api_version: str | type[R],
        kind: str | Request | None = None,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Any:
        """The object, keyed by a ``Request`` or by ``name=``/``namespace=`` (see
        :mod:`controller_runtime.objectkey`); raises :class:`~kubeclient.errors.NotFoundError`
        when absent. With a resource class instead of ``api_version, kind``, an instance."""
        cls, api_version, kind, key = split_target(api_version, kind, key, method="client.live.get")
        namespace, name = resolve_key(key, name, namespace, method="client.live.get")
        resource = await self._discovery.resolve(api_version, kind)
        answer = await _request(
            self._transport, "GET", resource.path(namespace, name), timeout=self._timeout
        )
        if cls is not None:
            return cls.from_json(answer.body)
        return _with_type([answer.json()], resource)[0]

    @overload
    async def list(
        self,
        api_version: type[R],
        kind: None = None,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
        field_selector: str | None = None,
    ) -> builtins.list[R]: ...

    @overload
    async def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
        field_selector: str | None = None,
    ) -> builtins.list[Obj]: ...

    async def list(
        self,
        api_version: str | type[R],
        kind: str | None = None,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
        field_selector: str | None = None,
    ) -> Any:
        """Every object of ``kind`` (in ``namespace``; ``None``: all namespaces) matching the
        selectors. If a continue token expires mid-way (410), the list restarts unpaged, as
        client-go's pager does, so the result is always one consistent snapshot. With a
        resource class instead of ``api_version, kind``, instances of it."""
        cls, api_version, kind, _ = split_target(api_version, kind, None, method="client.live.list")
        items = await self._list(api_version, kind, namespace, label_selector, field_selector)
        return [adopt(cls, item) for item in items] if cls is not None else items

    async def _list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: LabelSelector | str | None,
        field_selector: str | None,
    ) -> builtins.list[Obj]:
        resource = await self._discovery.resolve(api_version, kind)
        path = resource.path(namespace)
        params: dict[str, str] = {}
        if label_selector is not None and str(label_selector):
            params["labelSelector"] = str(label_selector)
        if field_selector:
            params["fieldSelector"] = field_selector
        items: builtins.list[Obj] = []
        token = ""
        while True:
            page = {**params, "limit": str(LIST_PAGE_SIZE)}
            if token:
                page["continue"] = token
            try:
                answer = await _request(
                    self._transport, "GET", path, params=page, timeout=self._timeout
                )
            except GoneError:
                if not token:
                    raise
                answer = await _request(
                    self._transport, "GET", path, params=params, timeout=self._timeout
                )
                return _with_type(answer.json().get("items") or [], resource)
            body = answer.json()
            items.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return _with_type(items, resource)


# ----------------------------------------------------------------------------------- client


class Client:
    """Cached reads, live reads (:attr:`live`) and writes.

    ``field_manager`` (default ``"controller-runtime-py"``) names this client in
    ``managedFields`` for every write, and is the default manager of server-side apply.
    ``read_own_writes=True`` (default off) overlays the client's own writes on cached
    :meth:`get`: a get returns the newer of the cached object and the last write this client
    made of it (see :class:`~controller_runtime.consistency.OwnWritesOverlay`; lists are not
    overlaid). ``own_writes_size`` bounds that overlay (LRU, default 1024 objects).
    """

    def __init__(
        self,
        transport: Transport,
        cache: Cache,
        *,
        field_manager: str = DEFAULT_FIELD_MANAGER,
        read_own_writes: bool = False,
        own_writes_size: int = 1024,
        timeout: float | None = None,
    ) -> None:
        self.transport = transport
        self.timeout = timeout
        self.cache = cache
        self.discovery: Discovery = cache.discovery
        self.field_manager = field_manager
        self.live = LiveReader(transport, self.discovery, timeout=timeout)
        self._overlay = OwnWritesOverlay(own_writes_size) if read_own_writes else None

    # ------------------------------------------------------------------------- cached reads

    @overload
    async def get(
        self,
        api_version: type[R],
        kind: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> R: ...

    @overload
    async def get(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Obj: ...

    async def get(
        self,
        api_version: str | type[R],
        kind: str | Request | None = None,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Any:
        """The cached object, keyed by a ``Request`` (``client.get(TASKS, "Task", request)``)
        or by ``name=``/``namespace=`` keywords (see :mod:`controller_runtime.objectkey`);
        ``client.get(Task, request)`` returns a ``Task``.

        Raises :class:`~kubeclient.errors.NotFoundError` when the cache does not hold it
        (:func:`ignore_not_found` turns that into ``None``), and
        :class:`~controller_runtime.cache.NotCachedError` when the kind (or namespace) is not
        cached at all. A bare string or tuple as the key raises ``TypeError``.
        """
        cls, api_version, kind, key = split_target(api_version, kind, key, method="client.get")
        namespace, name = resolve_key(key, name, namespace, method="client.get")
        if self._overlay is None:
            try:
                if cls is not None:
                    return self.cache.get(cls, name=name, namespace=namespace)
                return self.cache.get(api_version, kind, name=name, namespace=namespace)
            except EvictedBodyError:  # a memory budget holds its metadata only: fetch it
                fetched = await self.cache.get_or_fetch(
                    api_version, kind, name=name, namespace=namespace
                )
                return adopt(cls, fetched) if cls is not None else fetched
        try:
            cached: Obj | None = await self.cache.get_or_fetch(
                api_version, kind, name=name, namespace=namespace
            )
        except NotFoundError:
            cached = None
        entry = self.cache.watched(api_version, kind)
        stores = entry.stores_for(namespace) if entry is not None else []
        obj = self._overlay.resolve(
            api_version, kind, namespace, name, cached=cached, stores=stores
        )
        if obj is None:
            raise NotFoundError(404, "NotFound", f'{kind} "{name}" not found (in the cache)')
        return adopt(cls, obj) if cls is not None else obj

    @overload
    async def list(
        self,
        api_version: type[R],
        kind: None = None,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> builtins.list[R]: ...

    @overload
    async def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> ObjList: ...

    async def list(
        self,
        api_version: str | type[R],
        kind: str | None = None,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> Any:
        """Cached objects of ``kind`` (in ``namespace``; ``None``: everything the cache holds,
        across the cached namespaces when the cache is restricted to some); raises
        :class:`~controller_runtime.cache.NotCachedError` for a kind not cached or a namespace
        outside the cache's scope. ``list(Task)`` returns ``Task`` instances."""
        cls, api_version, kind, _ = split_target(api_version, kind, None, method="client.list")
        try:
            if cls is not None:
                return self.cache.list(cls, namespace=namespace, label_selector=label_selector)
            return self.cache.list(
                api_version, kind, namespace=namespace, label_selector=label_selector
            )
        except EvictedBodyError:  # some bodies are not held (a memory budget): fetch those
            objs = await self.cache.list_or_fetch(
                api_version, kind, namespace=namespace, label_selector=label_selector
            )
            return [adopt(cls, o) for o in objs] if cls is not None else objs

    # ------------------------------------------------------------------------------ writes

    @overload
    async def create(self, obj: R, *, dry_run: bool = False) -> R: ...

    @overload
    async def create(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj: ...

    async def create(self, obj: Mapping[str, Any] | R, *, dry_run: bool = False) -> Any:
        """POST ``obj`` (``metadata.name`` or ``metadata.generateName``); returns the created
        object. Raises ``AlreadyExistsError``, ``InvalidError``, ``ForbiddenError``, ...

        A timeout leaves the outcome unknown: GET (by name, or list by label for
        ``generateName``) before creating again.
        """
        body, cls = as_body(obj)
        resource, namespace, _ = await self._locate(body, need_name=False)
        answer = await self._write(
            "POST", resource.path(namespace), resource, body=body, dry_run=dry_run
        )
        return _typed(cls, answer)

    @overload
    async def update(self, obj: R, *, dry_run: bool = False) -> R: ...

    @overload
    async def update(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj: ...

    async def update(self, obj: Mapping[str, Any] | R, *, dry_run: bool = False) -> Any:
        """PUT ``obj``. ``metadata.resourceVersion`` is required and acts as a precondition:
        if the object changed since, the server answers ``ConflictError`` (re-read and retry:
        :func:`retry_on_conflict`, :meth:`mutate_with_retry`). On a kind with a status
        subresource the server ignores ``status`` here (use :meth:`update_status`)."""
        body, cls = as_body(obj)
        resource, namespace, name = await self._locate(body)
        _require_resource_version(body, "update")
        answer = await self._write(
            "PUT",
            resource.path(namespace, name),
            resource,
            body=body,
            dry_run=dry_run,
            precondition=_precondition(body),
            target=(namespace, name),
        )
        return _typed(cls, answer)

    @overload
    async def patch(
        self,
        obj: R,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        patch_type: PatchType = "merge",
        dry_run: bool = False,
    ) -> R: ...

    @overload
    async def patch(
        self,
        obj: Mapping[str, Any],
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        patch_type: PatchType = "merge",
        dry_run: bool = False,
    ) -> Obj: ...

    async def patch(
        self,
        obj: Mapping[str, Any] | R,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        patch_type: PatchType = "merge",
        dry_run: bool = False,
    ) -> Any:
        """PATCH the object ``obj`` identifies (apiVersion, kind, namespace, name only).

        ``merge`` (RFC 7386, default), ``json`` (RFC 6902; a failing ``test`` operation makes
        the server refuse the whole patch, with ``InvalidError``) or ``strategic`` (built-in
        kinds only, not custom resources). A patch is unconditional unless it carries
        ``metadata.resourceVersion`` or a ``test`` operation.
        """
        body, cls = as_body(obj)
        resource, namespace, name = await self._locate(body)
        answer = await self._write(
            "PATCH",
            resource.path(namespace, name),
            resource,
            body=_patch_body(patch, patch_type),
            content_type=PATCH_CONTENT_TYPES[patch_type],
            dry_run=dry_run,
            precondition=_patch_precondition(patch, patch_type),
            target=(namespace, name),
        )
        return _typed(cls, answer)

    @overload
    async def apply(
        self,
        obj: R,
        *,
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> R: ...

    @overload
    async def apply(
        self,
        obj: Mapping[str, Any],
        *,
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> Obj: ...

    async def apply(
        self,
        obj: Mapping[str, Any] | R,
        *,
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> Any:
        """Server-side apply ``obj`` as ``field_manager`` (default: the client's); creates the
        object if absent. ``obj`` is the full intent of that manager: fields it omits that the
        manager owned are released. ``metadata.managedFields`` and ``metadata.resourceVersion``
        are stripped (apply is not a compare-and-swap). Setting a field another manager owns
        raises ``ConflictError`` unless ``force=True``, which takes ownership. A typed object
        states every field it holds (read ones included): build a fresh one to apply only
        your intent."""
        body, cls = as_body(obj)
        resource, namespace, name = await self._locate(body)
        answer = await self._apply(
            resource,
            resource.path(namespace, name),
            body,
            field_manager=field_manager,
            force=force,
            dry_run=dry_run,
        )
        return _typed(cls, answer)

    @overload
    async def update_status(self, obj: R) -> R: ...

    @overload
    async def update_status(self, obj: Mapping[str, Any]) -> Obj: ...

    async def update_status(self, obj: Mapping[str, Any] | R) -> Any:
        """PUT the status subresource: only ``status`` changes; ``metadata.resourceVersion``
        is required and checked, as for :meth:`update`. The typed way to write a status:
        change ``obj.status`` and pass ``obj``; status fields the class does not know are
        kept."""
        body, cls = as_body(obj)
        resource, namespace, name = await self._locate(body)
        _require_resource_version(body, "update_status")
        answer = await self._write(
            "PUT",
            resource.path(namespace, name, "status"),
            resource,
            body=body,
            precondition=_precondition(body),
            target=(namespace, name),
        )
        return _typed(cls, answer)

    @overload
    async def patch_status(
        self,
        obj: R,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]] | Schema,
        *,
        patch_type: PatchType = "merge",
    ) -> R: ...

    @overload
    async def patch_status(
        self,
        obj: Mapping[str, Any],
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]] | Schema,
        *,
        patch_type: PatchType = "merge",
    ) -> Obj: ...

    async def patch_status(
        self,
        obj: Mapping[str, Any] | R,
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]] | Schema,
        *,
        patch_type: PatchType = "merge",
    ) -> Any:
        """PATCH the status subresource (see :meth:`patch`). ``patch`` may be a typed status
        (a :class:`~controller_runtime.resource.Schema`): a merge patch
        ``{"status": <it>}``, which sets the fields it holds and leaves the others alone."""
        body, cls = as_body(obj)
        if isinstance(patch, Schema):
            if patch_type != "merge":
                raise TypeError("a typed status is sent as a merge patch: leave patch_type")
            patch = {"status": msgspec_builtins(patch)}
        resource, namespace, name = await self._locate(body)
        answer = await self._write(
            "PATCH",
            resource.path(namespace, name, "status"),
            resource,
            body=_patch_body(patch, patch_type),
            content_type=PATCH_CONTENT_TYPES[patch_type],
            precondition=_patch_precondition(patch, patch_type),
            target=(namespace, name),
        )
        return _typed(cls, answer)

    @overload
    async def apply_status(
        self, obj: R, *, field_manager: str | None = None, force: bool = False
    ) -> R: ...

    @overload
    async def apply_status(
        self, obj: Mapping[str, Any], *, field_manager: str | None = None, force: bool = False
    ) -> Obj: ...

    async def apply_status(
        self, obj: Mapping[str, Any] | R, *, field_manager: str | None = None, force: bool = False
    ) -> Any:
        """Server-side apply of the status subresource (see :meth:`apply`)."""
        body, cls = as_body(obj)
        resource, namespace, name = await self._locate(body)
        answer = await self._apply(
            resource,
            resource.path(namespace, name, "status"),
            body,
            field_manager=field_manager,
            force=force,
            dry_run=False,
        )
        return _typed(cls, answer)

    @overload
    async def delete(
        self,
        obj: R,
        /,
        *,
        propagation_policy: PropagationPolicy | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> R | None: ...

    @overload
    async def delete(
        self,
        obj: Mapping[str, Any],
        /,
        *,
        propagation_policy: PropagationPolicy | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> Obj | None: ...

    @overload
    async def delete(
        self,
        api_version: type[R],
        kind: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> R | None: ...

    @overload
    async def delete(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> Obj | None: ...

    async def delete(
        self,
        target: Mapping[str, Any] | R | str | type[R],
        kind: str | Request | None = None,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> Any:
        """DELETE an object: the one ``obj`` identifies (its apiVersion, kind, namespace and
        name; the rest is ignored), or ``api_version, kind`` and a key as for :meth:`get`
        (``delete(TASKS, "Task", request)``, ``delete(TASKS, "Task", name=..., namespace=...)``).

        ``propagation_policy``: ``"Background"`` (the server's default for most kinds: the
        object goes now, the garbage collector removes dependents later), ``"Foreground"``
        (the object stays, with the ``foregroundDeletion`` finalizer, until its blocking
        dependents are gone) or ``"Orphan"`` (dependents are kept). ``preconditions``
        (``{"uid": ..., "resourceVersion": ...}``) make the delete conditional:
        ``ConflictError`` if the object is not that one. ``NotFoundError`` if it is already
        gone.

        Returns ``None`` when the object is gone, or the object when it still exists, marked
        for deletion (finalizers, foreground deletion, graceful deletion).
        """
        obj, cls = _delete_target(target, kind, key, name, namespace)
        resource, namespace, name = await self._locate(obj)
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = dict(preconditions)
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if dry_run:
            # In the body: the server reads DeleteOptions from the body when there is one and
            # then ignores the query string (a dryRun query parameter would delete for real).
            options["dryRun"] = ["All"]
        answer = await _request(
            self.transport,
            "DELETE",
            resource.path(namespace, name),
            body=options,
            timeout=self.timeout,
        )
        _log_warnings(answer)
        result = answer.json() or {}
        if dry_run:
            return _typed(cls, result) if _still_exists(result) else None
        if _still_exists(result):
            self._recorded_write(resource, result)
            return _typed(cls, result)
        uid = _uid_of(result) or ((obj.get("metadata") or {}).get("uid"))
        self._recorded_delete(resource, namespace, name, uid)
        return None

    async def delete_all_of(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None,
        label_selector: LabelSelector | str | None = None,
        field_selector: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
    ) -> ObjList:
        """Delete every object of ``kind`` in ``namespace`` (required for namespaced kinds;
        ``None`` for cluster-scoped ones) that matches the selectors. Returns the deleted
        objects when the server lists them (it does for the generic registry), else ``[]``."""
        resource = await self.discovery.resolve(api_version, kind)
        if resource.namespaced and not namespace:
            raise ValueError(f"delete_all_of {kind} needs a namespace (it is namespaced)")
        params: dict[str, str] = {}
        if label_selector is not None and str(label_selector):
            params["labelSelector"] = str(label_selector)
        if field_selector:
            params["fieldSelector"] = field_selector
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        answer = await _request(
            self.transport,
            "DELETE",
            resource.path(namespace),
            params=params,
            body=options,
            timeout=self.timeout,
        )
        _log_warnings(answer)
        result = answer.json() or {}
        items: ObjList = (result.get("items") or []) if isinstance(result, dict) else []
        for item in items:
            meta = item.get("metadata") or {}
            if _still_exists(item):
                self._recorded_write(resource, item)
            else:
                self._recorded_delete(
                    resource, meta.get("namespace"), meta.get("name", ""), meta.get("uid")
                )
        return _with_type(items, resource)

    @overload
    async def mutate_with_retry(
        self,
        api_version: type[R],
        kind: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        mutate: Callable[[R], R | Awaitable[R | None] | None],
        steps: int = 5,
        base_delay: float = 0.01,
        factor: float = 1.0,
        jitter: float = 0.1,
        max_delay: float | None = None,
    ) -> R: ...

    @overload
    async def mutate_with_retry(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        mutate: Callable[[Obj], Obj | Awaitable[Obj | None] | None],
        steps: int = 5,
        base_delay: float = 0.01,
        factor: float = 1.0,
        jitter: float = 0.1,
        max_delay: float | None = None,
    ) -> Obj: ...

    async def mutate_with_retry(
        self,
        api_version: str | type[R],
        kind: str | Request | None = None,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        mutate: Callable[[Any], Any],
        steps: int = 5,
        base_delay: float = 0.01,
        factor: float = 1.0,
        jitter: float = 0.1,
        max_delay: float | None = None,
    ) -> Any:
        """Read the object live, apply ``mutate`` to it, update; on a conflict start over.

        The object is keyed as for :meth:`get` (a ``Request``, or ``name=``/``namespace=``);
        with a resource class, ``mutate`` gets (and the call returns) an instance of it.
        ``mutate`` changes the object in place (or returns a replacement); it may be async,
        and it must be safe to run more than once. If it changes nothing, no write is made
        and the live object is returned. Attempts and delays as :func:`retry_on_conflict`.
        """
        cls, api_version, kind, key = split_target(
            api_version, kind, key, method="client.mutate_with_retry"
        )
        namespace, name = resolve_key(key, name, namespace, method="client.mutate_with_retry")

        async def attempt() -> Any:
            current: Any
            if cls is not None:
                current = await self.live.get(cls, name=name, namespace=namespace)
            else:
                current = await self.live.get(api_version, kind, name=name, namespace=namespace)
            desired = copy.deepcopy(current)
            result = mutate(desired)
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                desired = result
            if desired == current:
                return current
            return await self.update(desired)

        answer: Obj | R = await retry_on_conflict(
            attempt,
            steps=steps,
            base_delay=base_delay,
            factor=factor,
            jitter=jitter,
            max_delay=max_delay,
        )
        return answer

    # ----------------------------------------------------------------------------- helpers

    async def _locate(
        self, obj: Mapping[str, Any], *, need_name: bool = True
    ) -> tuple[ResourceInfo, str | None, str]:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not api_version or not kind:
            raise ValueError("the object needs apiVersion and kind")
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        if need_name and not name:
            raise ValueError(f"the {kind} needs metadata.name")
        if not need_name and not name and not meta.get("generateName"):
            raise ValueError(f"the {kind} needs metadata.name or metadata.generateName")
        resource = await self.discovery.resolve(api_version, kind)
        namespace = meta.get("namespace") or None
        if resource.namespaced and namespace is None:
            raise ValueError(f"the {kind} {name!r} needs metadata.namespace (it is namespaced)")
        return resource, namespace if resource.namespaced else None, name

    async def _apply(
        self,
        resource: ResourceInfo,
        path: str,
        obj: Mapping[str, Any],
        *,
        field_manager: str | None,
        force: bool,
        dry_run: bool,
    ) -> Obj:
        meta = {
            k: v
            for k, v in (obj.get("metadata") or {}).items()
            if k not in ("managedFields", "resourceVersion")
        }
        params = {"fieldManager": field_manager or self.field_manager}
        if force:
            params["force"] = "true"
        return await self._write(
            "PATCH",
            path,
            resource,
            body={**obj, "metadata": meta},
            content_type=APPLY_CONTENT_TYPE,
            dry_run=dry_run,
            params=params,
        )

    async def _write(
        self,
        method: str,
        path: str,
        resource: ResourceInfo,
        *,
        body: Any,
        content_type: str = "application/json",
        dry_run: bool = False,
        params: Mapping[str, str] | None = None,
        precondition: str | None = None,
        target: tuple[str | None, str] | None = None,
    ) -> Obj:
        """Send one write; record its answer (``precondition``: the resourceVersion the write
        required, when it required one; ``target``: the namespace and name it writes)."""
        query = dict(params or {"fieldManager": self.field_manager})
        if dry_run:
            query["dryRun"] = "All"
        echoes, ticket = None, None
        if precondition and target is not None and not dry_run:
            context = CURRENT_RECONCILE.get()
            if context is not None and context.echoes is not None:
                echoes = context.echoes
                ticket = echoes.expect(context.request, resource, *target, precondition)
        try:
            answer = await _request(
                self.transport,
                method,
                path,
                params=query,
                body=body,
                content_type=content_type,
                timeout=self.timeout,
            )
            _log_warnings(answer)
            result: Obj = answer.json()
        except BaseException:
            if echoes is not None and ticket is not None:
                echoes.failed(ticket)
            raise
        if echoes is not None and ticket is not None:
            echoes.answered(ticket, result)
        if not dry_run:
            self._recorded_write(resource, result)
        return result

    def _recorded_write(self, resource: ResourceInfo, obj: Mapping[str, Any]) -> None:
        if self._overlay is not None:
            self._overlay.remember_write(resource.api_version, resource.kind, obj)
        context = CURRENT_RECONCILE.get()
        if context is None:
            return
        if context.guard is not None:
            context.guard.record_write(context.request, resource, obj)

    def _recorded_delete(
        self, resource: ResourceInfo, namespace: str | None, name: str, uid: str | None
    ) -> None:
        if self._overlay is not None:
            self._overlay.remember_delete(resource.api_version, resource.kind, namespace, name, uid)
        context = CURRENT_RECONCILE.get()
        if context is not None and context.guard is not None:
            meta = {"namespace": namespace, "name": name, "uid": uid}
            context.guard.record_delete(context.request, resource, {"metadata": meta})


async def ignore_not_found(read: Awaitable[T]) -> T | None:
    """Await ``read``; ``None`` if it raised :class:`~kubeclient.errors.NotFoundError`.

    controller-runtime's ``client.IgnoreNotFound`` for Python:
    ``task = await ignore_not_found(client.get(TASKS, "Task", request))``. Every other error
    propagates, including :class:`~controller_runtime.cache.NotCachedError` (a kind the cache
    does not watch is a configuration mistake, not an absent object).
    """
    try:
        return await read
    except NotFoundError:
        return None


def _delete_target(
    target: object,
    kind: str | Request | None,
    key: Request | None,
    name: str | None,
    namespace: str | None,
) -> tuple[Mapping[str, Any], type[Resource] | None]:
    if isinstance(target, Mapping | Resource):
        if kind is not None or key is not None or name is not None or namespace is not None:
            raise TypeError(
                "client.delete takes either an object, or api_version, kind and a key; not both"
            )
        return as_body(target)
    try:
        cls, api_version, kind, key = split_target(target, kind, key, method="client.delete")
    except TypeError:
        raise TypeError(
            "client.delete takes an object, or api_version, kind (or a resource class) and a "
            f"Request or name=/namespace= (got {target!r}, {kind!r})"
        ) from None
    namespace, name = resolve_key(key, name, namespace, method="client.delete")
    meta = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}, cls


@overload
def _typed(cls: None, answer: Obj) -> Obj: ...


@overload
def _typed(cls: type[R], answer: Obj) -> R: ...


def _typed(cls: type[R] | None, answer: Obj) -> Any:
    """The answer of a write, as the class of what was written (a dict stays a dict)."""
    return answer if cls is None else adopt(cls, answer)


def msgspec_builtins(value: Schema) -> Any:
    """A typed part (a status, a spec) as JSON data."""
    return msgspec.to_builtins(value)


def _require_resource_version(obj: Mapping[str, Any], verb: str) -> None:
    if not (obj.get("metadata") or {}).get("resourceVersion"):
        raise ValueError(
            f"{verb} needs metadata.resourceVersion (it is the optimistic-concurrency "
            "precondition); read the object first, or use patch/apply for an unconditional write"
        )


def _precondition(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return rv if isinstance(rv, str) and rv else None


def _patch_precondition(
    patch: Mapping[str, Any] | Sequence[Mapping[str, Any]], patch_type: str
) -> str | None:
    """The resourceVersion a merge or strategic patch requires (its
    ``metadata.resourceVersion``), if any. JSON patches' ``test`` operations are not read."""
    if patch_type == "json" or not isinstance(patch, Mapping):
        return None
    return _precondition(patch)


def _patch_body(patch: Mapping[str, Any] | Sequence[Mapping[str, Any]], patch_type: str) -> Any:
    if patch_type not in PATCH_CONTENT_TYPES:
        raise ValueError(f"patch_type must be one of {sorted(PATCH_CONTENT_TYPES)}")
    if (patch_type == "json") != isinstance(patch, Sequence):
        raise TypeError("a json patch is a list of operations; merge/strategic take a mapping")
    return list(patch) if isinstance(patch, Sequence) else dict(patch)


def _still_exists(answer: Mapping[str, Any]) -> bool:
    """A DELETE answer describes an object that still exists (marked for deletion)."""
    if answer.get("kind") == "Status":
        return False
    return bool((answer.get("metadata") or {}).get("deletionTimestamp"))


def _uid_of(answer: Mapping[str, Any]) -> str | None:
    if answer.get("kind") == "Status":
        uid = (answer.get("details") or {}).get("uid")
    else:
        uid = (answer.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) and uid else None


def _log_warnings(answer: Response) -> None:
    # client-go's default WarningHandler logs the server's warnings (e.g. unknown fields that
    # were dropped); so do we.
    getall = getattr(answer.headers, "getall", None)
    warnings = getall("Warning", []) if getall else [answer.headers.get("Warning", "")]
    for warning in warnings:
        if warning:
            log.warning("API server warning: %s", warning)
