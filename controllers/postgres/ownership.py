"""Which roles on a server the operator owns, and which of those no PostgresUser claims.

A role the PostgresUser controller creates carries a comment (``COMMENT ON ROLE``, written in
the same transaction as ``CREATE ROLE``, so no role of ours is ever without it)::

    postgres.crpy.io/owner instance=<namespace>/<instance> user=<user> database=<database>

The comment is the ownership mark: only a role that carries it is ever dropped by the orphan
sweep (:mod:`controllers.postgres.sweep`), and only by the sweep of the instance it names.
A role with no comment (created by hand, by another tool, or by an operator of an earlier
version) or with any other comment is never swept. ``user`` and ``database`` say what the role
was created for (the Event of a sweep names them, and the sweep reassigns the role's objects in
that database before dropping it).

Everything here is pure: the SQL that reads and writes the comment is in
:mod:`controllers.postgres.sql`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controllers.postgres.api import USER_FINALIZER, ref_name

MARK_PREFIX = "postgres.crpy.io/owner "
"""How every ownership comment starts (what the sweep's query selects on)."""


@dataclass(frozen=True, slots=True)
class RoleOwner:
    """What an ownership comment says: the instance whose sweep may drop the role, and the
    PostgresUser and database it was created for."""

    namespace: str
    instance: str
    user: str
    database: str

    def comment(self) -> str:
        """The comment that marks a role as owned by this (see the module docs)."""
        return (
            f"{MARK_PREFIX}instance={self.namespace}/{self.instance} user={self.user} "
            f"database={self.database}"
        )


def parse_mark(comment: str | None) -> RoleOwner | None:
    """The owner a role's comment names; ``None`` when the comment is not an ownership mark
    of this operator (no comment, someone else's, or a malformed one: never ours to drop)."""
    if not comment or not comment.startswith(MARK_PREFIX):
        return None
    fields: dict[str, str] = {}
    for token in comment[len(MARK_PREFIX) :].split(" "):
        key, sep, value = token.partition("=")
        if not sep or not value or key in fields:
            return None
        fields[key] = value
    if set(fields) != {"instance", "user", "database"}:
        return None
    namespace, sep, instance = fields["instance"].partition("/")
    if not sep or not namespace or not instance or "/" in instance:
        return None
    return RoleOwner(namespace, instance, fields["user"], fields["database"])


def owner_of(user: Mapping[str, Any]) -> RoleOwner | None:
    """The owner to mark ``user``'s role with; ``None`` without an ``instanceRef``."""
    meta, spec = user["metadata"], user.get("spec") or {}
    instance = ref_name(user, "instanceRef")
    if instance is None:
        return None
    return RoleOwner(
        str(meta["namespace"]), instance, str(meta["name"]), str(spec.get("database", ""))
    )


def claims_role(user: Mapping[str, Any], namespace: str, instance: str, role: str) -> bool:
    """Whether PostgresUser ``user`` wants role ``role`` on instance ``namespace/instance``:
    it is in that namespace, refers to that instance, asks for that ``roleName``, and is not
    being deleted, or is being deleted with the operator's finalizer (which drops the role
    itself). A user being deleted without that finalizer will never drop it: no claim."""
    meta = user.get("metadata") or {}
    if meta.get("namespace") != namespace or ref_name(user, "instanceRef") != instance:
        return False
    if (user.get("spec") or {}).get("roleName") != role:
        return False
    return not meta.get("deletionTimestamp") or USER_FINALIZER in (meta.get("finalizers") or [])


def unclaimed_roles(
    owned: Mapping[str, RoleOwner],
    namespace: str,
    instance: str,
    users: Iterable[Mapping[str, Any]],
) -> list[str]:
    """The roles of ``owned`` (role name → its mark) that the sweep of instance
    ``namespace/instance`` may drop, sorted: those marked for that very instance that no user
    of ``users`` claims (:func:`claims_role`). A role marked for another instance, or claimed,
    is never in the result."""
    listed = list(users)
    return sorted(
        role
        for role, owner in owned.items()
        if (owner.namespace, owner.instance) == (namespace, instance)
        and not any(claims_role(user, namespace, instance, role) for user in listed)
    )
