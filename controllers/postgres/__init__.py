"""PostgreSQL data-service automation: instances, service bindings, database users, backups
and backup plans (API group ``postgres.crpy.io``). See ``docs/postgres.md``.

Each resource has its own single-purpose controller; ``setup_*_controller(manager, client)``
builds one on a manager.
"""

from controllers.postgres.backup import setup_backup_controller
from controllers.postgres.binding import setup_binding_controller
from controllers.postgres.instance import setup_instance_controller
from controllers.postgres.plan import setup_plan_controller
from controllers.postgres.user import setup_user_controller

__all__ = [
    "setup_backup_controller",
    "setup_binding_controller",
    "setup_instance_controller",
    "setup_plan_controller",
    "setup_user_controller",
]
