"""The PostgresVersionPolicy API (``postgres.crpy.io/v1beta1``, and v1alpha1 with the same
schema): the classes its CRD is generated from.

PostgresVersionPolicy: the versions instances may choose. A singleton named "default", edited by
an administrator. See docs/postgres.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from controller_runtime.resource import (
    ListType,
    MaxItems,
    Pattern,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
    crd,
    field,
)
from controllers.api.postgres.group import GROUP, V1ALPHA1, VERSION


class PostgresVersionPolicySpecVersionsItem(Schema):
    version: Annotated[str, Pattern("^[0-9]{1,3}(\\.[0-9]{1,3})?$")]
    """MAJOR (every MAJOR.x) or MAJOR.MINOR (that release only)."""
    enabled: bool = True
    """Disabled versions keep running where they run, but cannot be newly chosen."""
    image: str | None = None
    """Image of this version (default from defaultImage)."""


class PostgresVersionPolicySpec(Schema):
    """Which PostgreSQL versions instances may choose, and their images. Rule: the policy is a
    singleton named default."""

    default_version: Annotated[str, Pattern("^[0-9]{1,3}(\\.[0-9]{1,3})?$")] | None = None
    """The version an in-cluster PostgresInstance without spec.version gets (set by the
    operator's defaulting webhook; it must be enabled here)."""
    default_image: str | None = None
    """Image of a version without its own; "{version}" is replaced (default postgres:{version})."""
    versions: Annotated[
        list[PostgresVersionPolicySpecVersionsItem],
        MaxItems(100),
        ListType("map", keys=("version",)),
    ] = field(default_factory=list)
    """Versions instances may choose. "15" covers every 15.x; "15.4" only that release and wins
    over "15"."""


def _declare(version: str, *, storage: bool) -> Callable[[type[Resource]], type[Resource]]:
    """The CRD options of PostgresVersionPolicy, the same in every version."""
    return crd(
        group=GROUP,
        kind="PostgresVersionPolicy",
        header=(
            'PostgresVersionPolicy: the versions instances may choose. A singleton named "default",'
            " edited by\nan administrator. See docs/postgres.md."
        ),
        version=version,
        storage=storage,
        scope="Cluster",
        short_names=("pgvp",),
        categories=("postgres",),
        printer_columns=(
            PrinterColumn("Default image", ".spec.defaultImage"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )


@_declare(VERSION, storage=True)
class PostgresVersionPolicy(Resource):
    __markers__ = (
        Rule(
            "self.metadata.name == 'default'",
            message="the version policy is a singleton: name it 'default'",
            reason="FieldValueInvalid",
        ),
    )

    spec: PostgresVersionPolicySpec


@_declare(V1ALPHA1, storage=False)
class PostgresVersionPolicyV1alpha1(Resource):
    # The previous version, still served: the same schema, so the API server converts
    # between the two by rewriting apiVersion (no webhook).
    __markers__ = (
        Rule(
            "self.metadata.name == 'default'",
            message="the version policy is a singleton: name it 'default'",
            reason="FieldValueInvalid",
        ),
    )

    spec: PostgresVersionPolicySpec
