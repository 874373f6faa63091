"""The PostgreSQL data-service API (``postgres.crpy.io``) as typed classes, one module per kind."""

from controllers.api.postgres.backup import Backup
from controllers.api.postgres.binding import ServiceBinding
from controllers.api.postgres.instance import PostgresInstance
from controllers.api.postgres.plan import BackupPlan
from controllers.api.postgres.policy import PostgresVersionPolicy
from controllers.api.postgres.user import PostgresUser

__all__ = [
    "Backup",
    "BackupPlan",
    "PostgresInstance",
    "PostgresUser",
    "PostgresVersionPolicy",
    "ServiceBinding",
]
