"""The Backup API (``postgres.crpy.io/v1beta1``, and v1alpha1 with the same schema): the
classes its CRD is generated from.

Backup: one pg_dump or pg_basebackup of an instance to S3-compatible storage, run as a Job. See
docs/postgres.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from controller_runtime.resource import (
    Conditions,
    DateTime,
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


class BackupSpecInstanceRef(Schema):
    """The PostgresInstance to back up (same namespace)."""

    name: Annotated[str, MinLength(1), MaxLength(253)]
    """The PostgresInstance's name."""


class BackupSpecStorageCredentialsSecretRef(Schema):
    """A Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""

    name: Annotated[str, MinLength(1)]
    """The Secret's name (same namespace)."""


class BackupSpecStorage(Schema, kw_only=True):
    """S3-compatible object storage."""

    endpoint: Annotated[str, MinLength(1)]
    """URL of the S3 API (e.g. https://s3.example.com)."""
    bucket: Annotated[str, MinLength(1)]
    """Bucket the dump goes to."""
    prefix: str = "backups"
    """Key prefix inside the bucket (default backups)."""
    region: str = "us-east-1"
    """Region of the bucket (default us-east-1)."""
    credentials_secret_ref: BackupSpecStorageCredentialsSecretRef


class BackupSpec(Schema, kw_only=True):
    """What to back up and where to. Rule: a Backup is one-shot, its spec cannot change."""

    instance_ref: BackupSpecInstanceRef
    method: Annotated[str, Enum("pg_dump", "pg_basebackup")] = "pg_dump"
    """pg_dump (one database, custom format) or pg_basebackup (the whole server, tar)."""
    database: Annotated[str, Pattern("^[a-z_][a-z0-9_]{0,62}$")] = "postgres"
    """The database pg_dump dumps (and a restore restores into)."""
    image: str | None = None
    """Image with pg_dump/pg_basebackup (default the instance's postgres image)."""
    uploader_image: str = "amazon/aws-cli:2.17.0"
    """Image with the aws CLI that uploads the dump."""
    storage: BackupSpecStorage

    __markers__ = (
        Rule(
            "self == oldSelf",
            message="a Backup is one-shot: its spec cannot change; create another Backup",
            reason="FieldValueForbidden",
        ),
    )


class BackupStatus(Schema):
    """Written by the operator; never set it."""

    phase: Annotated[str, Enum("Pending", "Running", "Succeeded", "Failed")] | None = None
    """Pending, Running, Succeeded or Failed."""
    job_name: str | None = None
    """The Job that takes the backup."""
    location: str | None = None
    """Where the dump is stored (s3://bucket/key)."""
    start_time: DateTime | None = None
    """When the Job started."""
    completion_time: DateTime | None = None
    """When the backup finished (succeeded or failed)."""
    conditions: Conditions = field(default_factory=list)
    """Ready, and the kind's other conditions (metav1.Condition)."""
    observed_generation: Int64 | None = None
    """The metadata.generation the status describes."""


def _declare(version: str, *, storage: bool) -> Callable[[type[Resource]], type[Resource]]:
    """The CRD options of Backup, the same in every version."""
    return crd(
        group=GROUP,
        kind="Backup",
        header=(
            "Backup: one pg_dump or pg_basebackup of an instance to S3-compatible storage, run as a"
            " Job.\nSee docs/postgres.md."
        ),
        version=version,
        storage=storage,
        short_names=("pgbk",),
        categories=("postgres",),
        printer_columns=(
            PrinterColumn("Instance", ".spec.instanceRef.name"),
            PrinterColumn("Method", ".spec.method"),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Completed", ".status.completionTime", "date"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
    )


@_declare(VERSION, storage=True)
class Backup(Resource):
    spec: BackupSpec
    status: BackupStatus = field(default_factory=BackupStatus)


@_declare(V1ALPHA1, storage=False)
class BackupV1alpha1(Resource):
    # The previous version, still served: the same schema, so the API server converts
    # between the two by rewriting apiVersion (no webhook).
    spec: BackupSpec
    status: BackupStatus = field(default_factory=BackupStatus)
