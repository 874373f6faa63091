"""The BackupPlan API (``postgres.crpy.io/v1beta1``, and v1alpha1 with the same schema): the
classes its CRD is generated from.

BackupPlan: creates Backups on a cron schedule and prunes them by retention. See
docs/postgres.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from controller_runtime.resource import (
    Conditions,
    DateTime,
    Default,
    Enum,
    Int64,
    MaxLength,
    Minimum,
    MinLength,
    Pattern,
    PrinterColumn,
    Resource,
    Schema,
    crd,
    field,
)
from controllers.api.postgres.group import GROUP, V1ALPHA1, VERSION


class BackupPlanSpecRetention(Schema):
    """Finished Backups to keep; both limits apply when both are set."""

    keep_last: Annotated[int, Minimum(1)] | None = None
    """Keep at most this many finished Backups (the newest)."""
    max_age: Annotated[str, Pattern("^[0-9]+(m|h|d)$")] | None = None
    """e.g. 30m, 12h, 7d."""


class BackupPlanSpecBackupTemplateSpecInstanceRef(Schema):
    """The PostgresInstance to back up (same namespace)."""

    name: Annotated[str, MinLength(1), MaxLength(253)]
    """The PostgresInstance's name."""


class BackupPlanSpecBackupTemplateSpecStorageCredentialsSecretRef(Schema):
    """A Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""

    name: Annotated[str, MinLength(1)]
    """The Secret's name (same namespace)."""


class BackupPlanSpecBackupTemplateSpecStorage(Schema, kw_only=True):
    """S3-compatible object storage."""

    endpoint: Annotated[str, MinLength(1)]
    """URL of the S3 API (e.g. https://s3.example.com)."""
    bucket: Annotated[str, MinLength(1)]
    """Bucket the dumps go to."""
    prefix: str = "backups"
    """Key prefix inside the bucket (default backups)."""
    region: str = "us-east-1"
    """Region of the bucket (default us-east-1)."""
    credentials_secret_ref: BackupPlanSpecBackupTemplateSpecStorageCredentialsSecretRef


class BackupPlanSpecBackupTemplateSpec(Schema, kw_only=True):
    """The spec of each Backup (see the Backup kind)."""

    instance_ref: BackupPlanSpecBackupTemplateSpecInstanceRef
    method: Annotated[str, Enum("pg_dump", "pg_basebackup")] = "pg_dump"
    """pg_dump (one database, custom format) or pg_basebackup (the whole server, tar)."""
    database: Annotated[str, Pattern("^[a-z_][a-z0-9_]{0,62}$")] = "postgres"
    """The database pg_dump dumps (and a restore restores into)."""
    image: str | None = None
    """Image with pg_dump/pg_basebackup (default the instance's postgres image)."""
    uploader_image: str = "amazon/aws-cli:2.17.0"
    """Image with the aws CLI that uploads the dump."""
    storage: BackupPlanSpecBackupTemplateSpecStorage


class BackupPlanSpecBackupTemplate(Schema):
    """The Backup created at each scheduled run."""

    spec: BackupPlanSpecBackupTemplateSpec


class BackupPlanSpec(Schema, kw_only=True):
    """When to back up, how, and how many Backups to keep."""

    schedule: Annotated[str, MinLength(1), MaxLength(200)]
    """Cron schedule in UTC (5 fields, or @hourly, @daily, @weekly, @monthly, @yearly)."""
    suspend: Annotated[bool, Default(False)] = False
    """Create no new Backups while true (existing ones are kept and still pruned)."""
    concurrency_policy: Annotated[str, Enum("Allow", "Forbid", "Replace")] = "Forbid"
    """While a Backup of the plan still runs, Allow another, Forbid (skip this run) or Replace
    it."""
    starting_deadline_seconds: Annotated[int, Minimum(1)] | None = None
    """A run missed by more than this is skipped (default no deadline)."""
    retention: BackupPlanSpecRetention | None = None
    backup_template: BackupPlanSpecBackupTemplate


class BackupPlanStatus(Schema):
    """Written by the operator; never set it."""

    last_schedule_time: DateTime | None = None
    """When the plan last created a Backup."""
    last_successful_time: DateTime | None = None
    """When a Backup of the plan last succeeded."""
    active: list[str] = field(default_factory=list)
    """Backups of the plan that have not finished."""
    conditions: Conditions = field(default_factory=list)
    """Ready, and the kind's other conditions (metav1.Condition)."""
    observed_generation: Int64 | None = None
    """The metadata.generation the status describes."""


def _declare(version: str, *, storage: bool) -> Callable[[type[Resource]], type[Resource]]:
    """The CRD options of BackupPlan, the same in every version."""
    return crd(
        group=GROUP,
        kind="BackupPlan",
        header=(
            "BackupPlan: creates Backups on a cron schedule and prunes them by retention. See\n"
            "docs/postgres.md."
        ),
        version=version,
        storage=storage,
        short_names=("pgbp",),
        categories=("postgres",),
        printer_columns=(
            PrinterColumn("Schedule", ".spec.schedule"),
            PrinterColumn("Suspend", ".spec.suspend", "boolean"),
            PrinterColumn("Last", ".status.lastScheduleTime", "date"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )


@_declare(VERSION, storage=True)
class BackupPlan(Resource):
    spec: BackupPlanSpec
    status: BackupPlanStatus = field(default_factory=BackupPlanStatus)


@_declare(V1ALPHA1, storage=False)
class BackupPlanV1alpha1(Resource):
    # The previous version, still served: the same schema, so the API server converts
    # between the two by rewriting apiVersion (no webhook).
    spec: BackupPlanSpec
    status: BackupPlanStatus = field(default_factory=BackupPlanStatus)
