"""The ServiceBinding API (``postgres.crpy.io/v1beta1``, and v1alpha1 with the same schema): the
classes its CRD is generated from.

ServiceBinding: binds an application to a PostgresInstance: its own role (a PostgresUser) and a
Secret with the credentials. See docs/postgres.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from controller_runtime.resource import (
    Conditions,
    Enum,
    Int64,
    MaxLength,
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


class ServiceBindingSpecInstanceRef(Schema):
    """The PostgresInstance to bind to (same namespace); cannot change."""

    name: Annotated[str, MinLength(1), MaxLength(253)]
    """The PostgresInstance's name."""

    __markers__ = (
        Rule("self == oldSelf", message="spec.instanceRef cannot change: create another binding"),
    )


class ServiceBindingSpec(Schema):
    """Bind an application to a PostgresInstance: a role, a database and a Secret with credentials.
    Rules: instanceRef, database, roleName and secretName cannot change."""

    instance_ref: ServiceBindingSpecInstanceRef
    database: (
        Annotated[
            str,
            Pattern("^[a-z_][a-z0-9_]{0,62}$"),
            Rule("self == oldSelf", message="spec.database cannot change: create another binding"),
        ]
        | None
    ) = None
    """The database (default derived from the binding's name); created when absent; cannot
    change."""
    role_name: (
        Annotated[
            str,
            Pattern("^[a-z_][a-z0-9_]{0,62}$"),
            Rule("self == oldSelf", message="spec.roleName cannot change: create another binding"),
        ]
        | None
    ) = None
    """The binding's own role (default derived from namespace and name); cannot change."""
    privileges: Annotated[str, Enum("ReadWrite", "ReadOnly")] = "ReadWrite"
    """ReadWrite (default) or ReadOnly on the database."""
    secret_name: (
        Annotated[
            str,
            MaxLength(253),
            Pattern("^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
            Rule(
                "self == oldSelf", message="spec.secretName cannot change: create another binding"
            ),
        ]
        | None
    ) = None
    """The Secret to write the credentials to (default <binding>-credentials); cannot change."""


class ServiceBindingStatusBinding(Schema):
    """The Secret with the credentials (servicebinding.io)."""

    name: str | None = None
    """The Secret's name."""


class ServiceBindingStatus(Schema):
    """Written by the operator; never set it."""

    binding: ServiceBindingStatusBinding | None = None
    role_name: str | None = None
    """The binding's role."""
    database: str | None = None
    """The binding's database."""
    conditions: Conditions = field(default_factory=list)
    """Ready, and the kind's other conditions (metav1.Condition)."""
    observed_generation: Int64 | None = None
    """The metadata.generation the status describes."""


def _declare(version: str, *, storage: bool) -> Callable[[type[Resource]], type[Resource]]:
    """The CRD options of ServiceBinding, the same in every version."""
    return crd(
        group=GROUP,
        kind="ServiceBinding",
        header=(
            "ServiceBinding: binds an application to a PostgresInstance: its own role (a"
            " PostgresUser) and a\nSecret with the credentials. See docs/postgres.md."
        ),
        version=version,
        storage=storage,
        short_names=("pgsb",),
        categories=("postgres",),
        printer_columns=(
            PrinterColumn("Instance", ".spec.instanceRef.name"),
            PrinterColumn("Secret", ".status.binding.name"),
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )


@_declare(VERSION, storage=True)
class ServiceBinding(Resource):
    spec: ServiceBindingSpec
    status: ServiceBindingStatus = field(default_factory=ServiceBindingStatus)


@_declare(V1ALPHA1, storage=False)
class ServiceBindingV1alpha1(Resource):
    # The previous version, still served: the same schema, so the API server converts
    # between the two by rewriting apiVersion (no webhook).
    spec: ServiceBindingSpec
    status: ServiceBindingStatus = field(default_factory=ServiceBindingStatus)
