"""PostgreSQL data-service automation: instances, service bindings, database users, backups
and backup plans (API group ``postgres.crpy.io``). See ``docs/postgres.md``.

Each resource has its own single-purpose controller; ``setup_*_controller(manager, client)``
builds one on a manager. They are imported when first used: the agent that runs in every
PostgreSQL Pod (:mod:`controllers.postgres.agent`) imports this package without the
controllers and the runtime under them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controllers.postgres.backup import setup_backup_controller
    from controllers.postgres.binding import setup_binding_controller
    from controllers.postgres.instance import setup_instance_controller
    from controllers.postgres.plan import setup_plan_controller
    from controllers.postgres.user import setup_user_controller

_WHERE = {
    "setup_backup_controller": "backup",
    "setup_binding_controller": "binding",
    "setup_instance_controller": "instance",
    "setup_plan_controller": "plan",
    "setup_user_controller": "user",
}

__all__ = [
    "setup_backup_controller",
    "setup_binding_controller",
    "setup_instance_controller",
    "setup_plan_controller",
    "setup_user_controller",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"controllers.postgres.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
