"""Finalizers: the in-place helpers, and the add/cleanup/remove flow against the server.

A finalizer keeps a deleted object on the server (with ``deletionTimestamp`` set) until its
owner removes it, which gives a controller the chance to clean up what the object stood for.
Once ``deletionTimestamp`` is set, finalizers can only be removed, and their order means
nothing.

Several controllers may hold finalizers on one object, and may add or remove them at the same
moment. A merge patch of ``metadata.finalizers`` replaces the whole list and would silently
drop another's change; so the writes here are JSON patches whose ``test`` operations pin the
state they were computed from (the finalizers list, or the ``resourceVersion`` when there is no
list). When the object changed in between, the server refuses the patch; the object is read
again from the server (not the cache, which may lag) and the patch recomputed, a bounded
number of times.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controller_runtime.client import PatchType
from controller_runtime.reconcile import Result, TerminalError
from kubeclient.errors import ConflictError, InvalidError, NotFoundError

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
"""Patch attempts before giving up with the last error (client-go's ``DefaultRetry``: 5)."""

JsonPatch = list[dict[str, Any]]


class _LiveReader(Protocol):
    async def get(
        self, api_version: str, kind: str, /, *, name: str, namespace: str | None = None
    ) -> dict[str, Any]: ...


class FinalizerClient(Protocol):
    """What these helpers need of :class:`controller_runtime.client.Client`."""

    @property
    def live(self) -> _LiveReader: ...

    async def patch(
        self, obj: dict[str, Any], patch: Any, *, patch_type: PatchType = "merge"
    ) -> dict[str, Any]: ...


# -- in place --------------------------------------------------------------------------------


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    meta = obj.get("metadata")
    found = meta.get("finalizers") if isinstance(meta, Mapping) else None
    return list(found) if isinstance(found, list) else []


def contains_finalizer(obj: Mapping[str, Any], name: str) -> bool:
    """Whether ``obj`` carries the finalizer ``name``."""
    return name in _finalizers(obj)


def add_finalizer(obj: dict[str, Any], name: str) -> bool:
    """Append ``name`` to ``obj``'s finalizers unless present; return whether ``obj`` changed."""
    if contains_finalizer(obj, name):
        return False
    obj.setdefault("metadata", {})["finalizers"] = [*_finalizers(obj), name]
    return True


def remove_finalizer(obj: dict[str, Any], name: str) -> bool:
    """Remove every occurrence of ``name`` from ``obj``'s finalizers; return whether ``obj``
    changed. The other finalizers keep their order."""
    if not contains_finalizer(obj, name):
        return False
    obj["metadata"]["finalizers"] = [f for f in _finalizers(obj) if f != name]
    return True


def is_being_deleted(obj: Mapping[str, Any]) -> bool:
    """Whether the server accepted a delete of ``obj`` (``metadata.deletionTimestamp`` set)."""
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


# -- patches (pure) --------------------------------------------------------------------------


def _pin_uid(obj: Mapping[str, Any]) -> JsonPatch:
    # A deleted and recreated object of the same name is another object: never touch it.
    uid = obj.get("metadata", {}).get("uid")
    return [{"op": "test", "path": "/metadata/uid", "value": uid}] if uid else []


def add_finalizer_patch(obj: Mapping[str, Any], name: str) -> JsonPatch | None:
    """A JSON patch that adds ``name`` to the state ``obj`` shows, and fails on any other
    state (or another object of the same name: the UID is tested too); ``None`` when ``obj``
    already carries it.

    With a list, the patch tests the list and appends; without one, it tests the
    ``resourceVersion`` (a test of an absent path always fails) and creates the list.
    """
    if contains_finalizer(obj, name):
        return None
    current = obj.get("metadata", {}).get("finalizers")
    if isinstance(current, list) and current:
        return [
            *_pin_uid(obj),
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "add", "path": "/metadata/finalizers/-", "value": name},
        ]
    rv = obj.get("metadata", {}).get("resourceVersion")
    if not rv:
        raise ValueError("the object has no metadata.resourceVersion: read it from the server")
    return [
        *_pin_uid(obj),
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": [name]},
    ]


def remove_finalizer_patch(obj: Mapping[str, Any], name: str) -> JsonPatch | None:
    """A JSON patch that removes ``name`` from the finalizers ``obj`` shows, and fails if the
    list on the server is any other (or the UID differs); ``None`` when ``obj`` does not
    carry it."""
    if not contains_finalizer(obj, name):
        return None
    current = _finalizers(obj)
    return [
        *_pin_uid(obj),
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {
            "op": "replace",
            "path": "/metadata/finalizers",
            "value": [f for f in current if f != name],
        },
    ]


# -- against the server ----------------------------------------------------------------------


class FinalizerSelectionError(TerminalError, ValueError):
    """A finalizer was to be added to an object of a kind the client's cache selects by label
    or field (``ByObject.label_selector`` / ``field_selector``).

    Such an object leaves the cache when its labels (or fields) stop matching: the informer
    reports it deleted, the reconcile reads "not found" and returns, and nothing ever removes
    the finalizer: once deleted, the object stays ``Terminating`` for good. So the finalizer
    helpers refuse to add one (a terminal error: retrying cannot help). Cache the kind
    without a selector and decide in the reconcile whether an object is yours (for one that is
    not, :func:`release_finalizer` and return), or keep the selector and clean up without a
    finalizer (owner references and garbage collection, say).
    """


def _check_selection(client: object, obj: Mapping[str, Any]) -> None:
    """Raise :class:`FinalizerSelectionError` if ``client``'s cache selects ``obj``'s kind."""
    by_object = getattr(getattr(client, "cache", None), "by_object", None)
    if not isinstance(by_object, Mapping):
        return
    options = by_object.get((obj.get("apiVersion"), obj.get("kind")))
    label = getattr(options, "label_selector", None)
    fields = getattr(options, "field_selector", None)
    if not (label or fields):
        return
    selection = " and ".join(
        f"{what} {value!r}"
        for what, value in (("label selector", label), ("field selector", fields))
        if value
    )
    raise FinalizerSelectionError(
        f"not adding a finalizer to {obj.get('kind')} {obj.get('metadata', {}).get('name')!r}: "
        f"the cache selects {obj.get('kind')} by {selection}, so an object that stops "
        "matching leaves the cache and its finalizer would never be removed (it would stay "
        "Terminating once deleted); cache the kind without the selector and skip objects "
        "that are not yours in the reconcile, or clean up without a finalizer"
    )


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str, str | None]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")


async def _read_live(client: FinalizerClient, obj: Mapping[str, Any]) -> dict[str, Any]:
    api_version, kind, name, namespace = _key(obj)
    return await client.live.get(api_version, kind, name=name, namespace=namespace)


async def _patch_until_done(
    client: FinalizerClient,
    obj: dict[str, Any],
    make_patch: Callable[[dict[str, Any]], JsonPatch | None],
) -> dict[str, Any]:
    """Apply ``make_patch(state)`` until it succeeds or there is nothing left to do; return the
    server's latest state.

    A refused patch (409, or 422: a failed ``test`` has no typed reason of its own) leads to a
    fresh read; if the object did not change since the patch was computed, the refusal was
    not a race but a real error, and is raised. If the name now belongs to another object
    (another UID), the one we were handed is gone: ``NotFoundError``.
    """
    state = obj
    uid = obj.get("metadata", {}).get("uid")
    for attempt in range(MAX_ATTEMPTS):
        patch = make_patch(state)
        if patch is None:
            return state
        try:
            return await client.patch(state, patch, patch_type="json")
        except (ConflictError, InvalidError) as err:
            fresh = await _read_live(client, state)
            if uid and fresh["metadata"].get("uid") != uid:
                raise NotFoundError(
                    404, "NotFound", f"{_key(state)} with uid {uid} was deleted (and recreated)"
                ) from err
            seen = state.get("metadata", {}).get("resourceVersion")
            if fresh["metadata"].get("resourceVersion") == seen or attempt == MAX_ATTEMPTS - 1:
                raise
            log.debug("finalizer patch of %s raced (%s); retrying", _key(state), err.reason)
            state = fresh
            # client-go's DefaultRetry: 10 ms steps with 10 % jitter
            await asyncio.sleep(0.01 * (1 + 0.1 * random.random()))
    raise AssertionError("unreachable")


async def ensure_finalizer(
    client: FinalizerClient, obj: dict[str, Any], name: str
) -> dict[str, Any]:
    """Add finalizer ``name`` on the server unless ``obj`` shows it; return the latest state.

    Nothing is added to an object that is being deleted (the server forbids new finalizers
    then): check :func:`contains_finalizer` on the result when that matters. Concurrent
    writers of other finalizers are not clobbered (see the module docs). Raises
    :class:`~kubeclient.errors.NotFoundError` if the object is gone, the last refusal after
    :data:`MAX_ATTEMPTS`, and :class:`FinalizerSelectionError` (before any request) when the
    client's cache selects the kind by label or field: such an object's finalizer could be
    stranded.
    """
    if not contains_finalizer(obj, name) and not is_being_deleted(obj):
        _check_selection(client, obj)

    def patch(state: dict[str, Any]) -> JsonPatch | None:
        return None if is_being_deleted(state) else add_finalizer_patch(state, name)

    return await _patch_until_done(client, obj, patch)


async def release_finalizer(
    client: FinalizerClient, obj: dict[str, Any], name: str
) -> dict[str, Any] | None:
    """Remove finalizer ``name`` on the server, keeping every other; return the latest state,
    or ``None`` when the object is already gone.

    Removing the last finalizer of an object that is being deleted lets the server delete
    it: the state returned is then its last one (still with ``deletionTimestamp``).
    """
    try:
        return await _patch_until_done(
            client, obj, lambda state: remove_finalizer_patch(state, name)
        )
    except NotFoundError:
        return None


class FinalizeAction(enum.Enum):
    """What :func:`handle_finalization` did."""

    UNCHANGED = "unchanged"
    """Not being deleted, and the finalizer was already there."""
    ADDED = "added"
    """Not being deleted; the finalizer was added."""
    FINALIZED = "finalized"
    """Being deleted: ``cleanup`` ran and the finalizer was removed."""
    SKIPPED = "skipped"
    """Being deleted (or gone) without our finalizer: nothing to do."""
    PENDING = "pending"
    """Being deleted: ``cleanup`` ran but is not finished (it returned
    :class:`CleanupPending`); the finalizer stays."""


@dataclass(frozen=True, slots=True)
class CleanupPending:
    """What a ``cleanup`` returns when it has started but is not finished (it waits for
    dependents to go, say): the finalizer stays and the reconcile ends without an error.

    ``requeue_after``: seconds until the reconcile should look again (``None``: only when an
    event arrives, for cleanup that waits on objects the controller watches, e.g. its owned
    objects going away). ``message`` says what it waits for, for logs and conditions.
    """

    message: str
    requeue_after: float | None = None


@dataclass(frozen=True, slots=True)
class FinalizeOutcome:
    """The result of :func:`handle_finalization`.

    ``obj`` is the latest state the server returned (``None`` if the object was found gone;
    after the removal of its last finalizer, the object's final state);
    ``deleting`` is true when the object is being deleted or gone, i.e. the reconcile should
    stop rather than act on the object; ``pending`` is what ``cleanup`` returned when it is not
    finished (action ``PENDING``), and :attr:`result` the reconcile's result for it.
    """

    action: FinalizeAction
    obj: dict[str, Any] | None
    deleting: bool
    pending: CleanupPending | None = None

    @property
    def result(self) -> Result | None:
        """``Result(requeue_after=...)`` when cleanup is pending with a delay, else ``None``:
        return it from the reconcile when :attr:`deleting`."""
        if self.pending is None or self.pending.requeue_after is None:
            return None
        return Result(requeue_after=self.pending.requeue_after)


async def handle_finalization(
    client: FinalizerClient,
    obj: dict[str, Any],
    name: str,
    cleanup: Callable[[dict[str, Any]], Awaitable[CleanupPending | None]],
) -> FinalizeOutcome:
    """The finalizer half of a reconcile.

    - Not being deleted: make sure finalizer ``name`` is on the object.
    - Being deleted with our finalizer: read the object from the server (so a lagging cache
      cannot trigger a second cleanup after the finalizer is gone), await ``cleanup(obj)``,
      then remove only ``name``. ``cleanup`` runs only on the very object handed in: when the
      server's object of that name has another UID (the cached one was deleted and a new one
      created under its name), or is not being deleted, nothing runs and the outcome is
      ``SKIPPED`` with ``obj=None``; the new object's own events bring the reconcile back.
      Finalizers of others are kept, even when they are added or removed concurrently.
    - Being deleted without it: nothing.

    If ``cleanup`` returns :class:`CleanupPending`, it is not finished: the finalizer stays
    and the outcome is ``PENDING`` (return ``outcome.result`` to requeue as it asked). If
    ``cleanup`` raises, the exception propagates and the finalizer stays, so the reconcile is
    retried with backoff. ``cleanup`` runs at least once per deletion and, if the removal
    fails afterwards (or the process dies in between), again on the next reconcile: make it
    idempotent.
    """
    if not is_being_deleted(obj):
        try:
            latest = await ensure_finalizer(client, obj, name)
        except NotFoundError:
            return FinalizeOutcome(FinalizeAction.SKIPPED, None, deleting=True)
        if is_being_deleted(latest):
            # Deleted while we looked; finalize now if the finalizer made it on.
            return await handle_finalization(client, latest, name, cleanup)
        action = FinalizeAction.UNCHANGED if latest is obj else FinalizeAction.ADDED
        return FinalizeOutcome(action, latest, deleting=False)
    return await _finalize(client, obj, name, cleanup)


def _same_incarnation(seen: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether ``live`` (read by name) is the object ``seen`` shows, and being deleted: the
    same UID (when ``seen`` has one) and a ``deletionTimestamp``. A deletion is never undone,
    so a live object of the same UID without one cannot be the one being finalized."""
    uid = seen.get("metadata", {}).get("uid")
    if uid and live.get("metadata", {}).get("uid") != uid:
        return False
    return is_being_deleted(live)


async def _finalize(
    client: FinalizerClient,
    obj: dict[str, Any],
    name: str,
    cleanup: Callable[[dict[str, Any]], Awaitable[CleanupPending | None]],
) -> FinalizeOutcome:
    """The being-deleted half of :func:`handle_finalization`."""
    if not contains_finalizer(obj, name):
        return FinalizeOutcome(FinalizeAction.SKIPPED, obj, deleting=True)
    try:
        live = await _read_live(client, obj)
    except NotFoundError:
        return FinalizeOutcome(FinalizeAction.SKIPPED, None, deleting=True)
    if not _same_incarnation(obj, live):
        # The name now belongs to another object (the cache still shows a deleted one): the
        # one handed in is gone, and undoing its effects on the new one's behalf would undo
        # the new one's. The new one's own events bring the reconcile back for it.
        log.debug(
            "%s: uid %s was deleted and recreated as %s; not finalizing the new object",
            _key(obj),
            obj.get("metadata", {}).get("uid"),
            live.get("metadata", {}).get("uid"),
        )
        return FinalizeOutcome(FinalizeAction.SKIPPED, None, deleting=True)
    if not contains_finalizer(live, name):
        return FinalizeOutcome(FinalizeAction.SKIPPED, live, deleting=True)
    pending = await cleanup(live)
    if pending is not None:
        return FinalizeOutcome(FinalizeAction.PENDING, live, deleting=True, pending=pending)
    remaining = await release_finalizer(client, live, name)
    return FinalizeOutcome(FinalizeAction.FINALIZED, remaining, deleting=True)
