"""The PostgreSQL data-service API (``postgres.crpy.io``) as typed classes, one module per kind.

``v1beta1`` is served and stored (the unsuffixed classes); ``v1alpha1``, the previous version,
is still served (the ``V1alpha1`` classes). Only PostgresInstance differs between the two
(``spec.replication``), and converts through the operator's webhook (``conversion``).
"""

from controllers.api.postgres.backup import Backup, BackupV1alpha1
from controllers.api.postgres.binding import ServiceBinding, ServiceBindingV1alpha1
from controllers.api.postgres.instance import PostgresInstance
from controllers.api.postgres.instance_v1alpha1 import PostgresInstanceV1alpha1
from controllers.api.postgres.plan import BackupPlan, BackupPlanV1alpha1
from controllers.api.postgres.policy import PostgresVersionPolicy, PostgresVersionPolicyV1alpha1
from controllers.api.postgres.user import PostgresUser, PostgresUserV1alpha1

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
]
