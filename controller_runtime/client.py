"""The client: reads from the informer cache, writes to the API server.

Objects are plain dicts (``apiVersion``, ``kind``, ``metadata``, ...). ``apiVersion`` + ``kind``
are resolved to URLs through the cache's :class:`~kubeclient.discovery.Discovery`.

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
import copy
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from controller_runtime.cache import Cache
from controller_runtime.consistency import OwnWritesOverlay
from controller_runtime.objectkey import resolve_key
from controller_runtime.reconcile import CURRENT_RECONCILE, Request
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
    try:
        return await transport.request(
            method, path, params=params, body=body, content_type=content_type, timeout=timeout
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

    async def get(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Obj:
        """The object, keyed by a ``Request`` or by ``name=``/``namespace=`` (see
        :mod:`controller_runtime.objectkey`); raises :class:`~kubeclient.errors.NotFoundError`
        when absent."""
        namespace, name = resolve_key(key, name, namespace, method="client.live.get")
        resource = await self._discovery.resolve(api_version, kind)
        answer = await _request(
            self._transport, "GET", resource.path(namespace, name), timeout=self._timeout
        )
        return _with_type([answer.json()], resource)[0]

    async def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """Every object of ``kind`` (in ``namespace``; ``None``: all namespaces) matching the
        selectors. If a continue token expires mid-way (410), the list restarts unpaged, as
        client-go's pager does, so the result is always one consistent snapshot."""
        resource = await self._discovery.resolve(api_version, kind)
        path = resource.path(namespace)
        params: dict[str, str] = {}
        if label_selector is not None and str(label_selector):
            params["labelSelector"] = str(label_selector)
        if field_selector:
            params["fieldSelector"] = field_selector
        items: list[Obj] = []
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

    async def get(
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Obj:
        """The cached object, keyed by a ``Request`` (``client.get(TASKS, "Task", request)``)
        or by ``name=``/``namespace=`` keywords (see :mod:`controller_runtime.objectkey`).

        Raises :class:`~kubeclient.errors.NotFoundError` when the cache does not hold it
        (:func:`ignore_not_found` turns that into ``None``), and
        :class:`~controller_runtime.cache.NotCachedError` when the kind (or namespace) is not
        cached at all. A bare string or tuple as the key raises ``TypeError``.
        """
        namespace, name = resolve_key(key, name, namespace, method="client.get")
        if self._overlay is None:
            return self.cache.get(api_version, kind, name=name, namespace=namespace)
        try:
            cached: Obj | None = self.cache.get(api_version, kind, name=name, namespace=namespace)
        except NotFoundError:
            cached = None
        entry = self.cache.watched(api_version, kind)
        stores = entry.stores_for(namespace) if entry is not None else []
        obj = self._overlay.resolve(
            api_version, kind, namespace, name, cached=cached, stores=stores
        )
        if obj is None:
            raise NotFoundError(404, "NotFound", f'{kind} "{name}" not found (in the cache)')
        return obj

    async def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> ObjList:
        """Cached objects of ``kind`` (in ``namespace``; ``None``: everything the cache holds,
        across the cached namespaces when the cache is restricted to some); raises
        :class:`~controller_runtime.cache.NotCachedError` for a kind not cached or a namespace
        outside the cache's scope."""
        return self.cache.list(
            api_version, kind, namespace=namespace, label_selector=label_selector
        )

    # ------------------------------------------------------------------------------ writes

    async def create(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj:
        """POST ``obj`` (``metadata.name`` or ``metadata.generateName``); returns the created
        object. Raises ``AlreadyExistsError``, ``InvalidError``, ``ForbiddenError``, ...

        A timeout leaves the outcome unknown: GET (by name, or list by label for
        ``generateName``) before creating again.
        """
        resource, namespace, _ = await self._locate(obj, need_name=False)
        answer = await self._write(
            "POST", resource.path(namespace), resource, body=obj, dry_run=dry_run
        )
        return answer

    async def update(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Obj:
        """PUT ``obj``. ``metadata.resourceVersion`` is required and acts as a precondition:
        if the object changed since, the server answers ``ConflictError`` (re-read and retry:
        :func:`retry_on_conflict`, :meth:`mutate_with_retry`). On a kind with a status
        subresource the server ignores ``status`` here (use :meth:`update_status`)."""
        resource, namespace, name = await self._locate(obj)
        _require_resource_version(obj, "update")
        return await self._write(
            "PUT", resource.path(namespace, name), resource, body=obj, dry_run=dry_run
        )

    async def patch(
        self,
        obj: Mapping[str, Any],
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        patch_type: PatchType = "merge",
        dry_run: bool = False,
    ) -> Obj:
        """PATCH the object ``obj`` identifies (apiVersion, kind, namespace, name only).

        ``merge`` (RFC 7386, default), ``json`` (RFC 6902; a failing ``test`` operation makes
        the server refuse the whole patch, with ``InvalidError``) or ``strategic`` (built-in
        kinds only, not custom resources). A patch is unconditional unless it carries
        ``metadata.resourceVersion`` or a ``test`` operation.
        """
        resource, namespace, name = await self._locate(obj)
        return await self._write(
            "PATCH",
            resource.path(namespace, name),
            resource,
            body=_patch_body(patch, patch_type),
            content_type=PATCH_CONTENT_TYPES[patch_type],
            dry_run=dry_run,
        )

    async def apply(
        self,
        obj: Mapping[str, Any],
        *,
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> Obj:
        """Server-side apply ``obj`` as ``field_manager`` (default: the client's); creates the
        object if absent. ``obj`` is the full intent of that manager: fields it omits that the
        manager owned are released. ``metadata.managedFields`` and ``metadata.resourceVersion``
        are stripped (apply is not a compare-and-swap). Setting a field another manager owns
        raises ``ConflictError`` unless ``force=True``, which takes ownership."""
        resource, namespace, name = await self._locate(obj)
        return await self._apply(
            resource,
            resource.path(namespace, name),
            obj,
            field_manager=field_manager,
            force=force,
            dry_run=dry_run,
        )

    async def update_status(self, obj: Mapping[str, Any]) -> Obj:
        """PUT the status subresource: only ``status`` changes; ``metadata.resourceVersion``
        is required and checked, as for :meth:`update`."""
        resource, namespace, name = await self._locate(obj)
        _require_resource_version(obj, "update_status")
        return await self._write(
            "PUT", resource.path(namespace, name, "status"), resource, body=obj
        )

    async def patch_status(
        self,
        obj: Mapping[str, Any],
        patch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        patch_type: PatchType = "merge",
    ) -> Obj:
        """PATCH the status subresource (see :meth:`patch`)."""
        resource, namespace, name = await self._locate(obj)
        return await self._write(
            "PATCH",
            resource.path(namespace, name, "status"),
            resource,
            body=_patch_body(patch, patch_type),
            content_type=PATCH_CONTENT_TYPES[patch_type],
        )

    async def apply_status(
        self, obj: Mapping[str, Any], *, field_manager: str | None = None, force: bool = False
    ) -> Obj:
        """Server-side apply of the status subresource (see :meth:`apply`)."""
        resource, namespace, name = await self._locate(obj)
        return await self._apply(
            resource,
            resource.path(namespace, name, "status"),
            obj,
            field_manager=field_manager,
            force=force,
            dry_run=False,
        )

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
        target: Mapping[str, Any] | str,
        kind: str | None = None,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        preconditions: Mapping[str, str] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> Obj | None:
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
        obj = _delete_target(target, kind, key, name, namespace)
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
            return result if _still_exists(result) else None
        if _still_exists(result):
            self._recorded_write(resource, result)
            return result
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
    ) -> Obj:
        """Read the object live, apply ``mutate`` to it, update; on a conflict start over.

        The object is keyed as for :meth:`get` (a ``Request``, or ``name=``/``namespace=``).
        ``mutate`` changes the dict in place (or returns a replacement); it may be async, and
        it must be safe to run more than once. If it changes nothing, no write is made and
        the live object is returned. Attempts and delays as :func:`retry_on_conflict`.
        """

        namespace, name = resolve_key(key, name, namespace, method="client.mutate_with_retry")

        async def attempt() -> Obj:
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

        return await retry_on_conflict(
            attempt,
            steps=steps,
            base_delay=base_delay,
            factor=factor,
            jitter=jitter,
            max_delay=max_delay,
        )

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
    ) -> Obj:
        query = dict(params or {"fieldManager": self.field_manager})
        if dry_run:
            query["dryRun"] = "All"
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
        if not dry_run:
            self._recorded_write(resource, result)
        return result

    def _recorded_write(self, resource: ResourceInfo, obj: Mapping[str, Any]) -> None:
        if self._overlay is not None:
            self._overlay.remember_write(resource.api_version, resource.kind, obj)
        context = CURRENT_RECONCILE.get()
        if context is not None and context.guard is not None:
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
    target: Mapping[str, Any] | str,
    kind: str | None,
    key: Request | None,
    name: str | None,
    namespace: str | None,
) -> Mapping[str, Any]:
    if isinstance(target, Mapping):
        if kind is not None or key is not None or name is not None or namespace is not None:
            raise TypeError(
                "client.delete takes either an object, or api_version, kind and a key; not both"
            )
        return target
    if not isinstance(target, str) or not isinstance(kind, str):
        raise TypeError(
            "client.delete takes an object, or api_version, kind and a Request or "
            f"name=/namespace= (got {target!r}, {kind!r})"
        )
    namespace, name = resolve_key(key, name, namespace, method="client.delete")
    meta = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": target, "kind": kind, "metadata": meta}


def _require_resource_version(obj: Mapping[str, Any], verb: str) -> None:
    if not (obj.get("metadata") or {}).get("resourceVersion"):
        raise ValueError(
            f"{verb} needs metadata.resourceVersion (it is the optimistic-concurrency "
            "precondition); read the object first, or use patch/apply for an unconditional write"
        )


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
