"""The operator's APIs as typed classes: what ``manifests/crds/`` is generated from."""

from controllers.api.postgres import (
    Backup,
    BackupPlan,
    BackupPlanV1alpha1,
    BackupV1alpha1,
    PostgresInstance,
    PostgresInstanceV1alpha1,
    PostgresUser,
    PostgresUserV1alpha1,
    PostgresVersionPolicy,
    PostgresVersionPolicyV1alpha1,
    ServiceBinding,
    ServiceBindingV1alpha1,
)
from controllers.api.tasks import Task, TaskSpec, TaskStatus

__all__ = [
    "Backup",
    "BackupPlan",
    "BackupPlanV1alpha1",
    "BackupV1alpha1",
    "PostgresInstance",
    "PostgresInstanceV1alpha1",
    "PostgresUser",
    "PostgresUserV1alpha1",
    "PostgresVersionPolicy",
    "PostgresVersionPolicyV1alpha1",
    "ServiceBinding",
    "ServiceBindingV1alpha1",
    "Task",
    "TaskSpec",
    "TaskStatus",
]
