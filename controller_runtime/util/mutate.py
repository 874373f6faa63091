"""``create_or_update`` and ``create_or_patch``: bring one object to a desired shape.

Both read the object from the API server (not the cache: a lagging cache would turn into
spurious conflicts or duplicate creates), let a ``mutate`` callback shape it, and write only
when the callback changed something. They report what happened as an :class:`OperationResult`.

The callback receives the *current* object (or, when there is none, a copy of the template)
and must change it in place to the desired state; it may be sync or async. It must set every
field it owns each time, because it starts from what the server has, and must not change the
name or namespace. The template passed in is never modified; the functions return the state
the server answered with.
"""

from __future__ import annotations

import copy
import enum
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from controller_runtime.client import PatchType
from kubeclient.errors import NotFoundError

Mutate = Callable[[dict[str, Any]], Awaitable[None] | None]


class OperationResult(enum.Enum):
    """What a create-or-* call did (controller-runtime's ``OperationResult`` values)."""

    UNCHANGED = "unchanged"
    CREATED = "created"
    UPDATED = "updated"
    UPDATED_STATUS = "updatedStatus"
    """``create_or_patch`` patched the object and its status."""
    UPDATED_STATUS_ONLY = "updatedStatusOnly"
    """``create_or_patch`` patched only the status."""


class _LiveReader(Protocol):
    async def get(
        self, api_version: str, kind: str, /, *, name: str, namespace: str | None = None
    ) -> dict[str, Any]: ...


class MutateClient(Protocol):
    """What these helpers need of :class:`controller_runtime.client.Client`."""

    @property
    def live(self) -> _LiveReader: ...

    async def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]: ...

    async def update(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def patch(
        self, obj: dict[str, Any], patch: Any, *, patch_type: PatchType = "merge"
    ) -> dict[str, Any]: ...

    async def patch_status(
        self, obj: dict[str, Any], patch: Any, *, patch_type: PatchType = "merge"
    ) -> dict[str, Any]: ...


def merge_patch(before: Any, after: Any) -> Any:
    """The RFC 7386 merge patch that turns ``before`` into ``after``.

    Objects are diffed key by key (a removed key becomes ``null``); anything else, lists
    included, is replaced whole. A ``null`` *value* in ``after`` cannot be expressed (merge
    patch reads it as "remove") and removes the key.
    """
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return copy.deepcopy(after)
    patch: dict[str, Any] = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, value in after.items():
        if key not in before:
            patch[key] = copy.deepcopy(value)
        elif before[key] != value:
            if isinstance(before[key], Mapping) and isinstance(value, Mapping):
                patch[key] = merge_patch(before[key], value)
            else:
                patch[key] = copy.deepcopy(value)
    return patch


async def _run(mutate: Mutate, obj: dict[str, Any]) -> None:
    result = mutate(obj)
    if inspect.isawaitable(result):
        await result


def _identity(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = obj.get("metadata") or {}
    return obj.get("apiVersion"), obj.get("kind"), meta.get("name"), meta.get("namespace")


async def _mutate_checked(mutate: Mutate, obj: dict[str, Any], identity: tuple[Any, ...]) -> None:
    await _run(mutate, obj)
    if _identity(obj) != identity:
        raise ValueError(
            "mutate must not change the object's apiVersion, kind, name or namespace "
            f"(was {identity}, now {_identity(obj)})"
        )


async def _get_live(client: MutateClient, template: Mapping[str, Any]) -> dict[str, Any] | None:
    api_version, kind, name, namespace = _identity(template)
    if not (api_version and kind and name):
        raise ValueError("the template needs apiVersion, kind and metadata.name")
    try:
        return await client.live.get(api_version, kind, name=name, namespace=namespace)
    except NotFoundError:
        return None


async def create_or_update(
    client: MutateClient, obj: Mapping[str, Any], mutate: Mutate
) -> tuple[OperationResult, dict[str, Any]]:
    """Create ``obj`` (shaped by ``mutate``) if absent, else ``update`` (PUT) it if ``mutate``
    changed it; return what happened and the server's state.

    The change test is a deep comparison of the whole object before and after ``mutate``.
    The update carries the ``resourceVersion`` that was read, so a concurrent change raises
    :class:`~kubeclient.errors.ConflictError` (retry the reconcile). Caveat: for kinds with a
    status subresource the PUT ignores ``status``; a status-only change reports ``UPDATED``
    but is not stored. Use :func:`create_or_patch` for status.
    """
    current = await _get_live(client, obj)
    if current is None:
        desired = copy.deepcopy(dict(obj))
        await _mutate_checked(mutate, desired, _identity(obj))
        return OperationResult.CREATED, await client.create(desired)
    before = copy.deepcopy(current)
    await _mutate_checked(mutate, current, _identity(before))
    if current == before:
        return OperationResult.UNCHANGED, before
    return OperationResult.UPDATED, await client.update(current)


async def create_or_patch(
    client: MutateClient,
    obj: Mapping[str, Any],
    mutate: Mutate,
    *,
    optimistic_lock: bool = False,
) -> tuple[OperationResult, dict[str, Any]]:
    """Create ``obj`` (shaped by ``mutate``) if absent, else send merge patches of what
    ``mutate`` changed: one to the object (without ``status``) and one to the status
    subresource (only ``status``); return what happened and the server's latest state.

    Results: ``CREATED``, ``UNCHANGED``, ``UPDATED`` (object only), ``UPDATED_STATUS`` (both),
    ``UPDATED_STATUS_ONLY``. On create, a ``status`` set by ``mutate`` that the server did not
    store (status subresource) is written with a status patch after the create.

    A merge patch replaces lists whole (``finalizers``, ``ownerReferences``, conditions of a
    CRD), so a concurrent change to the same list would be lost; ``optimistic_lock=True``
    adds the ``resourceVersion`` that was read to the object patch, turning that race into a
    :class:`~kubeclient.errors.ConflictError`. The default (off) is controller-runtime's.
    """
    current = await _get_live(client, obj)
    if current is None:
        desired = copy.deepcopy(dict(obj))
        await _mutate_checked(mutate, desired, _identity(obj))
        created = await client.create(desired)
        if "status" in desired and created.get("status") != desired["status"]:
            patch = {"status": merge_patch(created.get("status") or {}, desired["status"])}
            created = await client.patch_status(created, patch)
        return OperationResult.CREATED, created
    before = copy.deepcopy(current)
    await _mutate_checked(mutate, current, _identity(before))
    before_status, after_status = before.pop("status", None), current.pop("status", None)
    latest = before
    result = OperationResult.UNCHANGED
    if current != before:
        patch = merge_patch(before, current)
        if optimistic_lock:
            patch.setdefault("metadata", {})["resourceVersion"] = before["metadata"][
                "resourceVersion"
            ]
        latest = await client.patch(before, patch)
        result = OperationResult.UPDATED
    if after_status != before_status:
        status_patch = {"status": merge_patch(before_status or {}, after_status or {})}
        if after_status is None:
            status_patch = {"status": None}
        latest = await client.patch_status(before, status_patch)
        result = (
            OperationResult.UPDATED_STATUS
            if result is OperationResult.UPDATED
            else OperationResult.UPDATED_STATUS_ONLY
        )
    elif before_status is not None and "status" not in latest:
        latest["status"] = before_status
    return result, latest
