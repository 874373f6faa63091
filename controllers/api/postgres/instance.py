"""The PostgresInstance API (``postgres.crpy.io/v1beta1``, the storage version and the conversion
hub): the classes its CRD is generated from. ``instance_v1alpha1`` has the previous version,
``conversion`` converts between them.

PostgresInstance: a PostgreSQL server the operator runs (a StatefulSet and its Services), or an
existing one it connects to (spec.external). See docs/postgres.md.
"""

from __future__ import annotations

from typing import Annotated, Any

from controller_runtime.resource import (
    Conditions,
    Default,
    Enum,
    Int64,
    Maximum,
    MaxLength,
    MaxProperties,
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
from controllers.api.postgres.group import CONVERSION, GROUP, VERSION


class PostgresInstanceSpecReplicationSynchronous(Schema):
    """Synchronous replication: a commit returns once enough standbys have it."""

    number: Annotated[int, Minimum(1), Maximum(8)] = 1
    """Standbys each commit waits for (default 1); at most replicas - 1 count."""
    method: Annotated[str, Enum("First", "Any")] = "First"
    """First (default): the first standbys by pod number are synchronous, the others take over
    when one goes; Any: any standbys of the number (a quorum commit)."""


class PostgresInstanceSpecReplication(Schema):
    """How standbys (replicas > 1) follow the primary (asynchronously, unless synchronous is
    set), and how the operator fails over."""

    synchronous: PostgresInstanceSpecReplicationSynchronous | None = None
    """Make commits wait for standbys (off at 1 replica, which has none)."""
    sync_policy: Annotated[str, Enum("ZeroLoss", "DegradeToAsync")] = "ZeroLoss"
    """With synchronous set, what gives way when standbys are missing. ZeroLoss (default):
    commits wait for the configured number of synchronous standbys, however long, and failover
    promotes only a member that has every acknowledged commit (or waits). DegradeToAsync: while
    fewer standbys stream than the number, commits wait only for those that do (for none when
    none does), and failover promotes the most advanced standby that answers; what it had not
    received is lost."""
    failover_delay: Annotated[int, Minimum(0), Maximum(3600)] = 0
    """Seconds the primary must be unhealthy (its agent does not answer, or it does not accept
    connections) before failover starts (default 0: at once; a primary whose server died is
    then replaced rather than restarted in place)."""


class PostgresInstanceSpecStorage(Schema):
    """The data volume of each pod (size and class are fixed once the StatefulSet exists)."""

    size: Annotated[str, Pattern("^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")] = "1Gi"
    """Volume size per pod (fixed once the StatefulSet exists)."""
    storage_class_name: str | None = None
    """StorageClass of the volumes (default the cluster's default class)."""


class PostgresInstanceSpecTls(Schema):
    """Serve TLS only, with tls.crt and tls.key from this Secret."""

    secret_name: Annotated[str, MinLength(1)]
    """A kubernetes.io/tls Secret in the instance's namespace."""


class PostgresInstanceSpecRestore(Schema):
    """Create the instance from a Backup (set at creation only)."""

    backup_name: Annotated[str, MinLength(1)]
    """A Succeeded pg_dump Backup in the instance's namespace, restored once the server is up."""


class PostgresInstanceSpecExternalAdminSecretRef(Schema):
    """A Secret with the credentials of a role that may create roles and databases."""

    name: Annotated[str, MinLength(1)]
    """The Secret's name (same namespace as the instance)."""
    username_key: str = "username"
    """Key of the user name in the Secret (default username)."""
    password_key: str = "password"
    """Key of the password in the Secret (default password)."""


class PostgresInstanceSpecExternal(Schema, kw_only=True):
    """Use an existing server instead of running one."""

    host: Annotated[str, MinLength(1)]
    """Host name or address of the existing server."""
    port: Annotated[int, Minimum(1), Maximum(65535)] = 5432
    """Port of the existing server (default 5432)."""
    database: str = "postgres"
    """The maintenance database the operator connects to."""
    ssl_mode: Annotated[
        str, Enum("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
    ] = "prefer"
    """libpq sslmode for the operator's and the applications' connections (default prefer)."""
    admin_secret_ref: PostgresInstanceSpecExternalAdminSecretRef


class PostgresInstanceSpec(Schema):
    """The server wanted. Rules: spec.version is required unless spec.external is set; replicas,
    tls and restore apply only to in-cluster instances; an instance cannot switch between
    in-cluster and external; spec.restore is set at creation and cannot change."""

    version: Annotated[str, Pattern("^[0-9]{1,3}(\\.[0-9]{1,3})?$")] | None = None
    """PostgreSQL version, MAJOR or MAJOR.MINOR (e.g. "16" or "16.2"). It must be enabled by the
    PostgresVersionPolicy "default". A minor change rolls in place; a major change needs
    allowMajorVersionUpgrade. Optional for an external server (then checked against the server's
    version)."""
    allow_major_version_upgrade: Annotated[bool, Default(False)] = False
    """Allow a change of the major version (the image must upgrade the data)."""
    replicas: Annotated[int, Minimum(1), Maximum(9)] = 1
    """Pods; one is the primary (status.currentPrimary: pod 0 at creation, then whichever the
    operator promotes), the others stream from it."""
    replication: PostgresInstanceSpecReplication | None = None
    storage: PostgresInstanceSpecStorage | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    """Requests and limits of the postgres container (a ResourceRequirements)."""
    parameters: Annotated[dict[str, Annotated[str, MaxLength(1024)]], MaxProperties(200)] = field(
        default_factory=dict
    )
    """postgresql.conf parameters; a change rolls the pods."""
    tls: PostgresInstanceSpecTls | None = None
    deletion_policy: Annotated[str, Enum("Retain", "Delete")] = "Retain"
    """Retain (default) or Delete the volumes when the instance is deleted."""
    restore: PostgresInstanceSpecRestore | None = None
    external: PostgresInstanceSpecExternal | None = None

    __markers__ = (
        Rule(
            "has(self.external) || has(self.version)",
            message="an instance needs spec.version, or spec.external to use an existing server",
            reason="FieldValueRequired",
        ),
        Rule(
            "!has(self.external) || (!has(self.tls) && !has(self.restore) && self.replicas == 1)",
            message="replicas, tls and restore apply to in-cluster instances, not to spec.external",
            reason="FieldValueForbidden",
        ),
        Rule(
            "has(self.external) == has(oldSelf.external)",
            message="an instance cannot switch between in-cluster and external; create another",
            reason="FieldValueForbidden",
        ),
        Rule(
            "has(self.restore) == has(oldSelf.restore)"
            " && (!has(self.restore) || self.restore == oldSelf.restore)",
            message="spec.restore is set when the instance is created and cannot change",
            field_path=".restore",
            reason="FieldValueForbidden",
        ),
    )


class PostgresInstanceStatusEndpoint(Schema):
    """Where applications connect."""

    host: str | None = None
    """Host name applications connect to (the primary's Service, or spec.external.host)."""
    port: int | None = None
    """Port applications connect to."""


class PostgresInstanceStatusRestore(Schema):
    """Progress of spec.restore."""

    job_name: str | None = None
    """The Job that restores the Backup."""
    phase: str | None = None
    """Pending, Succeeded or Failed."""


class PostgresInstanceStatusHa(Schema):
    """The operator's high-availability state (phase, fenced members, timestamps), written by
    the failover controller; a new leader resumes from it."""

    phase: str | None = None
    """Bootstrap, Healthy, Fencing (a failover or switchover stopped the old primary) or
    Promoting."""
    fenced: list[str] = field(default_factory=list)
    """Members that must not run as primary."""
    timeline: Int64 | None = None
    """The current primary's timeline."""
    state: dict[str, Any] = field(default_factory=dict)
    """The rest of the state machine's record."""


class PostgresInstanceStatus(Schema):
    """Written by the operator; never set it."""

    current_primary: str | None = None
    """The Pod that runs as primary (labelled postgres.crpy.io/role=primary: the
    <name>-primary Service selects it)."""
    current_primary_timestamp: str | None = None
    """When currentPrimary last changed."""
    target_primary: str | None = None
    """The Pod that should run as primary; "pending" while a failover or switchover has fenced
    the old primary and not yet chosen the new one. It differs from currentPrimary only then."""
    target_primary_timestamp: str | None = None
    """When targetPrimary last changed."""
    failovers: Int64 | None = None
    """Failovers completed (the primary failed and a standby took over)."""
    switchovers: Int64 | None = None
    """Switchovers completed (asked for with the postgres.crpy.io/switchover-to annotation, by
    a rolling update, or because the primary's Pod was deleted)."""
    last_transition_seconds: float | None = None
    """Duration of the last failover or switchover, from its start to the new primary."""
    ha: PostgresInstanceStatusHa | None = None

    endpoint: PostgresInstanceStatusEndpoint | None = None
    version: str | None = None
    """The version that runs."""
    ready_replicas: int | None = None
    """Pods of the StatefulSet that are ready."""
    restore: PostgresInstanceStatusRestore | None = None
    conditions: Conditions = field(default_factory=list)
    """Ready, and the kind's other conditions (metav1.Condition)."""
    observed_generation: Int64 | None = None
    """The metadata.generation the status describes."""


@crd(
    group=GROUP,
    kind="PostgresInstance",
    header=(
        "PostgresInstance: a PostgreSQL server the operator runs (a StatefulSet and its Services),"
        " or an\nexisting one it connects to (spec.external). See docs/postgres.md."
    ),
    version=VERSION,
    conversion=CONVERSION,
    short_names=("pgi",),
    categories=("postgres",),
    printer_columns=(
        PrinterColumn("Version", ".status.version"),
        PrinterColumn("Replicas", ".spec.replicas", "integer"),
        PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        PrinterColumn("Primary", ".status.currentPrimary"),
        PrinterColumn("Host", ".status.endpoint.host"),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
)
class PostgresInstance(Resource):
    spec: PostgresInstanceSpec
    status: PostgresInstanceStatus = field(default_factory=PostgresInstanceStatus)
