"""Names shared by the PostgreSQL controllers: the API group, kinds, labels, finalizers, and
the validation of the names that reach PostgreSQL.

Every identifier that ends up in SQL (role and database names) passes :func:`check_identifier`
first and is then quoted by ``psycopg.sql.Identifier``: validation gives a readable error on
the resource, quoting makes injection impossible even if validation were wrong.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from controllers.api.postgres.group import GROUP, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
"""The version the controllers read and write: the storage version (objects of the previous
one, v1alpha1, reach them converted)."""

INSTANCE = "PostgresInstance"
USER = "PostgresUser"
BINDING = "ServiceBinding"
BACKUP = "Backup"
BACKUP_PLAN = "BackupPlan"
POLICY = "PostgresVersionPolicy"
POLICY_NAME = "default"
"""The version policy is a singleton: only the object of this name counts."""

INSTANCE_FINALIZER = f"{GROUP}/instance"
USER_FINALIZER = f"{GROUP}/drop-role"
BINDING_FINALIZER = f"{GROUP}/binding"
BACKUP_FINALIZER = f"{GROUP}/delete-object"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = "crpy-postgres-operator"
LABEL_PLAN = f"{GROUP}/backup-plan"
LABEL_BINDING = f"{GROUP}/binding"
LABEL_ROLE = f"{GROUP}/role"
"""On an instance's Pods, set by the failover controller (:mod:`controllers.postgres.ha`):
``primary`` on the current primary while the failover machine is Healthy, ``replica`` on the
standbys streaming from it (what the ``<name>-primary`` and ``<name>-replicas`` Services
select); absent on any other Pod (a fenced, failing or deleted one)."""
ROLE_PRIMARY = "primary"
ROLE_REPLICA = "replica"
ANNOTATION_SWITCHOVER = f"{GROUP}/switchover-to"
"""On a PostgresInstance: the Pod to switch the primary role over to (a planned switchover,
once that Pod streams within 16 MiB of the primary); the operator removes it once the Pod is
the primary, or at once (with a Warning Event) when it names no member of the instance."""
ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"
ANNOTATION_VERSION = f"{GROUP}/version"
ANNOTATION_SCHEDULED_AT = f"{GROUP}/scheduled-at"
ANNOTATION_INSTANCE_UID = f"{GROUP}/instance-uid"
"""On a backup Job: the UID of the PostgresInstance it backs up (a re-created instance of the
same name is another one)."""
ANNOTATION_BACKUP_UID = f"{GROUP}/backup-uid"
"""On an object-deletion Job (which has no owner reference): the UID of its Backup."""

IDENTIFIER_MAX = 63
"""PostgreSQL truncates identifiers to NAMEDATALEN - 1 = 63 bytes."""
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_RESERVED_PREFIXES = ("pg_",)
_RESERVED = frozenset({"postgres", "public", "template0", "template1", "replicator"})


class InvalidNameError(ValueError):
    """A role or database name PostgreSQL would not take as we need it."""


def check_identifier(name: str, what: str = "name") -> str:
    """Return ``name`` if it is a plain lowercase SQL identifier we accept, else raise
    :class:`InvalidNameError` saying why.

    Accepted: ``[a-z_][a-z0-9_]*``, at most 63 characters, not starting with ``pg_`` (reserved
    for system roles) and not one of the built-in names (``postgres``, ``template0``, ...).
    """
    if not _IDENTIFIER.match(name):
        raise InvalidNameError(
            f"{what} {name!r} is not valid: use 1 to 63 of a-z, 0-9 and _, starting with a "
            "letter or _"
        )
    if name.startswith(_RESERVED_PREFIXES) or name in _RESERVED:
        raise InvalidNameError(f"{what} {name!r} is reserved by PostgreSQL or the operator")
    return name


def identifier_from(*parts: str) -> str:
    """A valid identifier derived from Kubernetes names (``-`` and ``.`` become ``_``).

    Deterministic: the same parts always give the same identifier, so a reconcile that runs
    again (or on a stale cache) never invents a second role. Names longer than 63 characters
    are cut and end with a hash of the whole, so they stay distinct.
    """
    raw = "_".join(re.sub(r"[^a-z0-9_]", "_", p.lower()) for p in parts if p)
    if not raw or not re.match(r"[a-z_]", raw[0]):
        raw = f"r_{raw}"
    if raw.startswith("pg_") or raw in _RESERVED:
        raw = f"u_{raw}"
    if len(raw) > IDENTIFIER_MAX:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        raw = f"{raw[: IDENTIFIER_MAX - 9]}_{digest}"
    return check_identifier(raw)


def labels_for(instance_name: str, component: str) -> dict[str, str]:
    """The labels of everything rendered for an instance."""
    return {
        LABEL_NAME: "postgres",
        LABEL_INSTANCE: instance_name,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_COMPONENT: component,
    }


def ref_name(obj: Mapping[str, Any], field: str) -> str | None:
    """``spec.<field>.name`` of ``obj``, or ``None``."""
    ref = (obj.get("spec") or {}).get(field) or {}
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and name else None
