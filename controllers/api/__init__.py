"""The operator's APIs as typed classes: what ``manifests/crds/`` is generated from."""

from controllers.api.postgres import (
    Backup,
    BackupPlan,
    PostgresInstance,
    PostgresUser,
    PostgresVersionPolicy,
    ServiceBinding,
)
from controllers.api.tasks import Task, TaskSpec, TaskStatus

__all__ = [
    "Backup",
    "BackupPlan",
    "PostgresInstance",
    "PostgresUser",
    "PostgresVersionPolicy",
    "ServiceBinding",
    "Task",
    "TaskSpec",
    "TaskStatus",
]
