"""Rendering of the Jobs that back up an instance (pure functions).

A backup Job has two steps, sharing an ``emptyDir``: an init container dumps with the
PostgreSQL client tools (``pg_dump --format=custom`` of one database, or
``pg_basebackup --format=tar --gzip --wal-method=fetch`` of the whole server), then the
main container uploads the file with the AWS CLI to an S3-compatible endpoint. Credentials
come from Secrets through environment variables (``secretKeyRef``): nothing secret is
rendered into the Job itself.

Object key: ``<prefix>/<namespace>/<instance>/<backup>.<dump|tar.gz>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from controllers.postgres.api import (
    ANNOTATION_BACKUP_UID,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from controllers.postgres.render import REPLICATION_USER, Names, endpoint

Obj = dict[str, Any]
WORK_DIR = "/backup"
LABEL_BACKUP = "postgres.crpy.io/backup"
DEFAULT_UPLOADER = "amazon/aws-cli:2.17.0"


def job_name(backup_name: str, suffix: str = "backup") -> str:
    """``<backup>-<suffix>``, cut to 63 characters with a hash when longer (Job names end
    up in a label value)."""
    name = f"{backup_name}-{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-.')}-{digest}"


def object_key(backup: Mapping[str, Any]) -> str:
    spec = backup.get("spec") or {}
    meta = backup["metadata"]
    prefix = str((spec.get("storage") or {}).get("prefix", "backups")).strip("/")
    ext = "tar.gz" if spec.get("method") == "pg_basebackup" else "dump"
    instance = (spec.get("instanceRef") or {}).get("name", "")
    parts = [p for p in (prefix, meta["namespace"], instance, f"{meta['name']}.{ext}") if p]
    return "/".join(parts)


def location(backup: Mapping[str, Any]) -> str:
    storage = (backup.get("spec") or {}).get("storage") or {}
    return f"s3://{storage.get('bucket', '')}/{object_key(backup)}"


def _secret_env(name: str, secret: str, key: str) -> Obj:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def database_env(instance: Mapping[str, Any], *, replication: bool = False) -> list[Obj]:
    """libpq environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGSSLMODE) to reach
    ``instance`` as its administrator, or as the replication user of an in-cluster instance
    (``replication=True``, for ``pg_basebackup``)."""
    spec = instance.get("spec") or {}
    where = endpoint(instance)
    env: list[Obj] = [
        {"name": "PGHOST", "value": str(where["host"])},
        {"name": "PGPORT", "value": str(where["port"])},
    ]
    external = spec.get("external")
    if external:
        ref = external.get("adminSecretRef") or {}
        env += [
            _secret_env("PGUSER", ref["name"], ref.get("usernameKey", "username")),
            _secret_env("PGPASSWORD", ref["name"], ref.get("passwordKey", "password")),
            {"name": "PGSSLMODE", "value": external.get("sslMode", "prefer")},
        ]
        return env
    secret = Names(instance["metadata"]["name"]).superuser
    if replication:
        env += [
            {"name": "PGUSER", "value": REPLICATION_USER},
            _secret_env("PGPASSWORD", secret, "replication-password"),
        ]
    else:
        env += [
            _secret_env("PGUSER", secret, "username"),
            _secret_env("PGPASSWORD", secret, "password"),
        ]
    tls = (spec.get("tls") or {}).get("secretName")
    env.append({"name": "PGSSLMODE", "value": "require" if tls else "prefer"})
    return env


def s3_env(storage: Mapping[str, Any]) -> list[Obj]:
    secret = (storage.get("credentialsSecretRef") or {}).get("name", "")
    return [
        _secret_env("AWS_ACCESS_KEY_ID", secret, "AWS_ACCESS_KEY_ID"),
        _secret_env("AWS_SECRET_ACCESS_KEY", secret, "AWS_SECRET_ACCESS_KEY"),
        {"name": "AWS_DEFAULT_REGION", "value": str(storage.get("region", "us-east-1"))},
        {"name": "S3_ENDPOINT", "value": str(storage.get("endpoint", ""))},
    ]


def backup_job(backup: Mapping[str, Any], instance: Mapping[str, Any], image: str) -> Obj:
    """The Job that takes ``backup`` of ``instance`` with the client tools of ``image``."""
    spec = backup.get("spec") or {}
    meta = backup["metadata"]
    storage = spec.get("storage") or {}
    basebackup = spec.get("method") == "pg_basebackup"
    if basebackup:
        dump = (
            f"pg_basebackup --pgdata={WORK_DIR}/base --format=tar --gzip --wal-method=fetch"
            f" --no-password && mv {WORK_DIR}/base/base.tar.gz {WORK_DIR}/backup"
        )
    else:
        dump = (
            f'pg_dump --format=custom --no-password --file={WORK_DIR}/backup --dbname="$DATABASE"'
        )
    upload = (
        f'aws s3 cp --only-show-errors --endpoint-url "$S3_ENDPOINT" {WORK_DIR}/backup '
        f'"s3://{storage.get("bucket", "")}/{object_key(backup)}"'
    )
    labels = {
        LABEL_BACKUP: meta["name"],
        LABEL_INSTANCE: (spec.get("instanceRef") or {}).get("name", ""),
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    return _two_step_job(
        job_name(meta["name"]),
        meta["namespace"],
        labels,
        first=_step(
            "dump",
            image,
            dump,
            [
                *database_env(instance, replication=basebackup),
                {"name": "DATABASE", "value": str(spec.get("database", "postgres"))},
            ],
        ),
        second=_step(
            "upload",
            str(spec.get("uploaderImage", DEFAULT_UPLOADER)),
            upload,
            s3_env(storage),
        ),
    )


def restore_job(instance: Mapping[str, Any], backup: Mapping[str, Any], image: str) -> Obj:
    """The Job that restores a ``pg_dump`` ``backup`` into ``instance``: download, create the
    database if absent, ``pg_restore --clean --if-exists --no-owner``."""
    spec = backup.get("spec") or {}
    storage = spec.get("storage") or {}
    meta = instance["metadata"]
    database = str(spec.get("database", "postgres"))
    download = (
        f'aws s3 cp --only-show-errors --endpoint-url "$S3_ENDPOINT" '
        f'"s3://{storage.get("bucket", "")}/{object_key(backup)}" {WORK_DIR}/backup'
    )
    # psql variables (:'db') quote the name; -c would not interpolate them, stdin does.
    restore = (
        "echo \"SELECT 1 FROM pg_database WHERE datname = :'db'\" | "
        'psql --no-password -d postgres -tA -v db="$DATABASE" | grep -q 1 || '
        'createdb --no-password "$DATABASE"; '
        f'pg_restore --no-password --clean --if-exists --no-owner --dbname="$DATABASE" '
        f"{WORK_DIR}/backup"
    )
    labels = {LABEL_INSTANCE: meta["name"], LABEL_MANAGED_BY: MANAGED_BY}
    return _two_step_job(
        job_name(meta["name"], "restore"),
        meta["namespace"],
        labels,
        first=_step(
            "download",
            str(spec.get("uploaderImage", DEFAULT_UPLOADER)),
            download,
            s3_env(storage),
        ),
        second=_step(
            "restore",
            image,
            restore,
            [*database_env(instance), {"name": "DATABASE", "value": database}],
        ),
    )


DELETE_JOB_TTL_SECONDS = 300
"""A finished object-deletion Job is removed by the operator; this TTL is the safety net."""


def delete_object_job(backup: Mapping[str, Any]) -> Obj:
    """The Job ``<backup>-delete`` that deletes the Backup's object from the bucket with the
    AWS CLI (the uploader image, the same endpoint and credentials as the upload).

    It has no owner reference, so a foreground deletion of the Backup does not remove it
    while it runs; it carries the Backup's label (the Backup controller maps its events back),
    the Backup's UID (annotation ``postgres.crpy.io/backup-uid``: a later Backup of the same
    name never takes it for its own) and ``ttlSecondsAfterFinished``. One attempt plus one
    retry (``backoffLimit: 1``).
    Deleting an object that does not exist succeeds (S3's DELETE is idempotent)."""
    spec = backup.get("spec") or {}
    storage = spec.get("storage") or {}
    meta = backup["metadata"]
    remove = (
        f'aws s3 rm --only-show-errors --endpoint-url "$S3_ENDPOINT" '
        f'"s3://{storage.get("bucket", "")}/{object_key(backup)}"'
    )
    labels = {
        LABEL_BACKUP: meta["name"],
        LABEL_INSTANCE: (spec.get("instanceRef") or {}).get("name", ""),
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    container = _step("delete", str(spec.get("uploaderImage", DEFAULT_UPLOADER)), remove, [])
    container["env"] = s3_env(storage)
    container.pop("volumeMounts")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(meta["name"], "delete"),
            "namespace": meta["namespace"],
            "labels": labels,
            **({"annotations": {ANNOTATION_BACKUP_UID: meta["uid"]}} if meta.get("uid") else {}),
        },
        "spec": {
            "backoffLimit": 1,
            "ttlSecondsAfterFinished": DELETE_JOB_TTL_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }


def _step(name: str, image: str, script: str, env: list[Obj]) -> Obj:
    """A container running ``script`` with the shared work directory mounted."""
    return {
        "name": name,
        "image": image,
        "command": ["/bin/sh", "-ec", script],
        "env": env,
        "volumeMounts": [{"name": "work", "mountPath": WORK_DIR}],
    }


def _two_step_job(name: str, namespace: str, labels: Obj, *, first: Obj, second: Obj) -> Obj:
    """A Job whose ``first`` step (an init container) hands files to its ``second`` through
    an emptyDir; retried twice, never restarted in place."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 2,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "volumes": [{"name": "work", "emptyDir": {}}],
                    "initContainers": [first],
                    "containers": [second],
                },
            },
        },
    }


def job_outcome(job: Mapping[str, Any] | None) -> tuple[str, str]:
    """(phase, message) of a Job as its controller reports it: ``Succeeded``/``Failed``
    from its conditions, ``Running`` once started, else ``Pending``."""
    if job is None:
        return "Pending", "the Job is not created yet"
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "Succeeded", "the Job completed"
        if condition.get("type") == "Failed":
            why = condition.get("message") or condition.get("reason") or "the Job failed"
            return "Failed", str(why)
    if status.get("startTime") or status.get("active"):
        return "Running", "the Job is running"
    return "Pending", "the Job has not started"
