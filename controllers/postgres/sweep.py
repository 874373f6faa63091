"""The orphan-role sweep of one PostgresInstance: drop the roles the operator created for it
that no PostgresUser claims any more.

A role is normally dropped by its PostgresUser's finalizer. It can outlive its user when the
user vanished without that finalizer running (the API server's delete/finalizer race,
kubernetes/kubernetes#77988, or a finalizer removed by hand) while the PostgresUser
controller was creating the role, and the controller did not reach its check that the user
still exists (the process died, or the reconcile was cancelled when leadership was lost).
Nothing would ever drop such a role; the sweep does.

What the sweep may drop (each condition is necessary):

- the role carries the operator's ownership mark for this very instance (namespace and
  name; :mod:`controllers.postgres.ownership`): a role created by hand, by another tool, by
  an earlier operator version and never claimed since, or marked for another instance, is
  never touched;
- no PostgresUser claims it (:func:`~controllers.postgres.ownership.claims_role`: same
  namespace, same ``instanceRef``, same ``roleName``; a user being deleted claims it as long as
  the operator's finalizer is on it), first by the cache, then confirmed by a live list of the
  namespace's PostgresUsers read *after* taking the role's advisory lock;
- nobody is creating or converging it at that moment: the PostgresUser controller holds the
  same lock while it does (:func:`controllers.postgres.sql.ensure_role`), and the sweep skips a
  role whose lock it cannot take at once (the next sweep looks again).

So a user created at any moment keeps its role: either its reconcile took the lock first, and
then the user exists before the live list (which reads the API server, not a cache), or the
sweep took it first and the reconcile creates the role again afterwards.

Each dropped role is a ``Normal`` Event ``OrphanRoleDropped`` on the instance; a drop that
fails (e.g. the role owns objects in a database other than its own) is a ``Warning``
``OrphanRoleNotDropped`` and is tried again at the next sweep. The instance controller runs
the sweep while the instance is Ready: at every reconcile (so at start-up and after each
PostgresUser deletion) and every ``sweep_every`` seconds.
"""

from __future__ import annotations

import logging
from typing import Any

from controller_runtime import Client, EventRecorder
from controller_runtime.cache import NotCachedError
from controllers.postgres import sql
from controllers.postgres.api import API_VERSION, USER
from controllers.postgres.ownership import RoleOwner, unclaimed_roles

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ACTION = "SweepRoles"


async def sweep_orphan_roles(
    client: Client, recorder: EventRecorder, instance: Obj, info: sql.ConnInfo
) -> list[str]:
    """Drop the roles of ``instance`` (on the server ``info`` reaches) that no PostgresUser
    claims (see the module docs); return their names. One query when none is marked for the
    instance; a live list of PostgresUsers per role about to be dropped."""
    meta = instance["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    owned = {
        role: owner
        for role, owner in (await sql.owned_roles(info)).items()
        if (owner.namespace, owner.instance) == (namespace, name)
    }
    if not owned:
        return []
    # The cache first: in the usual case every role is claimed and nothing is read live.
    try:
        cached = client.cache.list(API_VERSION, USER, namespace=namespace)
    except NotCachedError:
        cached = []  # every marked role is then confirmed live
    dropped: list[str] = []
    for role in unclaimed_roles(owned, namespace, name, cached):
        try:
            owner = await _drop_if_unclaimed(client, info, namespace, name, role)
        except sql.DatabaseError as err:
            message = f"could not drop role {role}, which no PostgresUser claims: {err}"
            log.warning("%s/%s: %s", namespace, name, message)
            recorder.record(instance, "Warning", "OrphanRoleNotDropped", message, ACTION)
            continue
        if owner is None:
            continue
        dropped.append(role)
        message = (
            f"dropped role {role}: it was created for PostgresUser {owner.user} of this "
            "instance, and no PostgresUser claims it any more"
        )
        log.info("%s/%s: %s", namespace, name, message)
        recorder.record(instance, "Normal", "OrphanRoleDropped", message, ACTION)
    return dropped


async def _drop_if_unclaimed(
    client: Client, info: sql.ConnInfo, namespace: str, instance: str, role: str
) -> RoleOwner | None:
    """Under the role's advisory lock, read its mark and the PostgresUsers again and drop it
    if it is still this instance's and unclaimed; its mark when dropped, else ``None``."""
    async with sql.role_lock(info, role) as held:
        if not held:
            return None  # a reconcile is creating or converging it right now
        owner = (await sql.owned_roles(info)).get(role)
        if owner is None or (owner.namespace, owner.instance) != (namespace, instance):
            return None
        users = await client.live.list(API_VERSION, USER, namespace=namespace)
        if not unclaimed_roles({role: owner}, namespace, instance, users):
            return None
        await sql.drop_role(info, role, owner.database)
        return owner
