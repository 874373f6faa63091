"""The PostgresUser API (``postgres.crpy.io/v1beta1``, and v1alpha1 with the same schema): the
classes its CRD is generated from.

PostgresUser: one role (with its database and grants) on an instance's server, converged
idempotently and dropped on delete. See docs/postgres.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from controller_runtime.resource import (
    Conditions,
    Enum,
    Int64,
    MaxLength,
    Minimum,
    MinLength,
    Pattern,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
    crd,
    field,
)
from controllers.api.postgres.group import GROUP, V1ALPHA1, VERSION


class PostgresUserSpecInstanceRef(Schema):
    """The PostgresInstance (same namespace); cannot change."""

    name: Annotated[str, MinLength(1), MaxLength(253)]
    """The PostgresInstance's name."""

    __markers__ = (
        Rule(
            "self == oldSelf", message="spec.instanceRef cannot change: create another PostgresUser"
        ),
    )


class PostgresUserSpecPasswordSecretRef(Schema):
    """The Secret (same namespace) holding the role's password."""

    name: Annotated[str, MinLength(1)]
    """The Secret's name."""
    key: str = "password"
    """Key of the password in the Secret (default password)."""


class PostgresUserSpec(Schema, kw_only=True):
    """A role on a PostgresInstance's server, with a password from a Secret. Rules: instanceRef,
    roleName and database cannot change."""

    instance_ref: PostgresUserSpecInstanceRef
    role_name: Annotated[
        str,
        Pattern("^[a-z_][a-z0-9_]{0,62}$"),
        Rule("self == oldSelf", message="spec.roleName cannot change: create another PostgresUser"),
        Rule(
            "!self.startsWith('pg_') && !(self in ['postgres', 'public', 'replicator'])",
            message="spec.roleName is reserved",
        ),
    ]
    """The role to create (cannot change; names starting with pg_ and postgres, public, replicator
    are reserved)."""
    database: Annotated[
        str,
        Pattern("^[a-z_][a-z0-9_]{0,62}$"),
        Rule("self == oldSelf", message="spec.database cannot change: create another PostgresUser"),
    ]
    """Created when absent (owned by the administrator); the role gets the privileges there. Cannot
    change."""
    privileges: Annotated[str, Enum("ReadWrite", "ReadOnly")] = "ReadWrite"
    """ReadWrite (default) or ReadOnly on the database."""
    connection_limit: Annotated[int, Minimum(-1)] = -1
    """-1 for no limit."""
    password_secret_ref: PostgresUserSpecPasswordSecretRef


class PostgresUserStatus(Schema):
    """Written by the operator; never set it."""

    role_name: str | None = None
    """The role that exists on the server."""
    database: str | None = None
    """The database the role has its privileges on."""
    conditions: Conditions = field(default_factory=list)
    """Ready, and the kind's other conditions (metav1.Condition)."""
    observed_generation: Int64 | None = None
    """The metadata.generation the status describes."""


def _declare(version: str, *, storage: bool) -> Callable[[type[Resource]], type[Resource]]:
    """The CRD options of PostgresUser, the same in every version."""
    return crd(
        group=GROUP,
        kind="PostgresUser",
        header=(
            "PostgresUser: one role (with its database and grants) on an instance's server,"
            " converged\nidempotently and dropped on delete. See docs/postgres.md."
        ),
        version=version,
        storage=storage,
        short_names=("pgu",),
        categories=("postgres",),
        printer_columns=(
            PrinterColumn("Role", ".spec.roleName"),
            PrinterColumn("Database", ".spec.database"),
            PrinterColumn("Instance", ".spec.instanceRef.name"),
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )


@_declare(VERSION, storage=True)
class PostgresUser(Resource):
    spec: PostgresUserSpec
    status: PostgresUserStatus = field(default_factory=PostgresUserStatus)


@_declare(V1ALPHA1, storage=False)
class PostgresUserV1alpha1(Resource):
    # The previous version, still served: the same schema, so the API server converts
    # between the two by rewriting apiVersion (no webhook).
    spec: PostgresUserSpec
    status: PostgresUserStatus = field(default_factory=PostgresUserStatus)
