"""A PostgresInstance's status has two writers, each owning its own fields: the failover
controller (:data:`HA_FIELDS` and the :data:`HA_CONDITIONS`) and the instance controller
(everything else). Each writes with the resourceVersion it read, so a write computed from an
outdated object is refused (409). Between the two that refusal is no staleness: the other
writer's fields moved, and the instance controller's reconcile (seconds: it renders, reads
Pods and connects to PostgreSQL) can lose the race to a failover controller that writes every
second or two, again and again, with an exponential back-off growing between the attempts.

:func:`write_shared_status` therefore answers a 409 once by reading the object live: when
nothing moved there but the *other* writer's fields and conditions (same generation, no
deletion, none of this writer's fields changed), this writer's changes are applied to the live
status (:func:`rebase_status`) and written with the live resourceVersion. Any other conflict
(this writer's own fields moved: its read was stale) is raised as before, so a write computed
from a stale view of its own fields is still refused."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from controller_runtime import Client, ConflictError
from controllers.postgres.common import write_status

Obj = dict[str, Any]

HA_FIELDS = frozenset(
    {
        "currentPrimary",
        "targetPrimary",
        "currentPrimaryTimestamp",
        "targetPrimaryTimestamp",
        "failovers",
        "switchovers",
        "lastTransitionSeconds",
        "ha",
    }
)
"""Top-level status fields the failover controller owns."""
HA_CONDITIONS = frozenset({"PrimaryAvailable"})
"""Condition types the failover controller owns."""


def owned_by_failover(name: str) -> bool:
    """Whether the failover controller owns the status field or condition type ``name``
    (fields are lower camel case, condition types upper: the two never collide)."""
    return name in HA_FIELDS or name in HA_CONDITIONS


def owned_by_instance(name: str) -> bool:
    """Whether the instance controller owns the status field or condition type ``name``."""
    return not owned_by_failover(name)


def _conditions(status: Mapping[str, Any]) -> dict[str, Any]:
    return {
        str(c["type"]): c
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and isinstance(c.get("type"), str)
    }


def moved_only_theirs(
    read: Mapping[str, Any], live: Mapping[str, Any], mine: Callable[[str], bool]
) -> bool:
    """Whether ``live`` differs from ``read`` (two statuses) in no field and no condition
    type that ``mine`` (a field or condition-type predicate) says this writer owns."""
    for key in set(read) | set(live):
        if key != "conditions" and mine(key) and read.get(key) != live.get(key):
            return False
    read_c, live_c = _conditions(read), _conditions(live)
    return all(read_c.get(t) == live_c.get(t) for t in set(read_c) | set(live_c) if mine(t))


def rebase_status(
    read: Mapping[str, Any], wanted: Mapping[str, Any], live: Mapping[str, Any]
) -> Obj:
    """``live`` with the changes from ``read`` to ``wanted`` applied: each top-level field
    that differs is set (or removed), each condition type that differs is set (or removed);
    everything else stays as ``live`` has it."""
    out: Obj = copy.deepcopy(dict(live))
    for key in set(read) | set(wanted):
        if key == "conditions" or read.get(key) == wanted.get(key):
            continue
        if key in wanted:
            out[key] = copy.deepcopy(wanted[key])
        else:
            out.pop(key, None)
    read_c, wanted_c = _conditions(read), _conditions(wanted)
    changed = {t for t in set(read_c) | set(wanted_c) if read_c.get(t) != wanted_c.get(t)}
    if changed:
        kept = [
            c
            for c in out.get("conditions") or []
            if not (isinstance(c, Mapping) and c.get("type") in changed)
        ]
        added = [copy.deepcopy(wanted_c[t]) for t in sorted(changed) if t in wanted_c]
        out["conditions"] = kept + added
    return out


async def write_shared_status(
    client: Client, obj: Obj, status: Mapping[str, Any], *, mine: Callable[[str], bool]
) -> Obj:
    """:func:`~controllers.postgres.common.write_status`, with a 409 caused only by the other
    writer's fields answered once by a rebase onto the live object (module docs). Raises
    ``ConflictError`` when this writer's own fields, the generation or the deletion moved."""
    try:
        return await write_status(client, obj, status)
    except ConflictError:
        meta = obj["metadata"]
        live = await client.live.get(
            obj["apiVersion"], obj["kind"], name=meta["name"], namespace=meta.get("namespace")
        )
        live_meta = live["metadata"]
        read_status: Mapping[str, Any] = obj.get("status") or {}
        live_status: Mapping[str, Any] = live.get("status") or {}
        if (
            live_meta.get("uid") != meta.get("uid")
            or live_meta.get("generation") != meta.get("generation")
            or live_meta.get("deletionTimestamp") != meta.get("deletionTimestamp")
            or not moved_only_theirs(read_status, live_status, mine)
        ):
            raise
        return await write_status(client, live, rebase_status(read_status, status, live_status))
