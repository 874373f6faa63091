"""Helpers for reconcilers: create-or-update, owner references, finalizers, conditions and
events (controller-runtime's ``controllerutil``, ``meta`` conditions and event recorder).

See ``docs/helpers.md`` for an example of each. Everything listed in ``__all__`` is also
importable from ``controller_runtime`` itself; the patch bodies some helpers send
(``merge_patch``, ``add_finalizer_patch``, ``remove_finalizer_patch``) are in
:mod:`controller_runtime.patches`.
"""

from controller_runtime.util.conditions import (
    Condition,
    ConditionStatus,
    format_time,
    get_condition,
    is_true,
    remove_condition,
    set_condition,
    set_conditions,
    status_conditions,
)
from controller_runtime.util.events import EventRecorder, EventRecorderOptions
from controller_runtime.util.finalizers import (
    CleanupPending,
    FinalizeAction,
    FinalizeOutcome,
    FinalizerSelectionError,
    add_finalizer,
    contains_finalizer,
    ensure_finalizer,
    handle_finalization,
    is_being_deleted,
    release_finalizer,
    remove_finalizer,
)
from controller_runtime.util.mutate import (
    OperationResult,
    create_or_patch,
    create_or_update,
)
from controller_runtime.util.ownership import (
    AlreadyOwnedError,
    ClusterScopedDependentError,
    CrossNamespaceOwnerError,
    OwnerReferenceError,
    get_controller_of,
    has_controller_reference,
    is_controlled_by,
    remove_owner_reference,
    set_controller_reference,
    set_owner_reference,
    validate_owner,
)

__all__ = [
    "AlreadyOwnedError",
    "CleanupPending",
    "ClusterScopedDependentError",
    "Condition",
    "ConditionStatus",
    "CrossNamespaceOwnerError",
    "EventRecorder",
    "EventRecorderOptions",
    "FinalizeAction",
    "FinalizeOutcome",
    "FinalizerSelectionError",
    "OperationResult",
    "OwnerReferenceError",
    "add_finalizer",
    "contains_finalizer",
    "create_or_patch",
    "create_or_update",
    "ensure_finalizer",
    "format_time",
    "get_condition",
    "get_controller_of",
    "handle_finalization",
    "has_controller_reference",
    "is_being_deleted",
    "is_controlled_by",
    "is_true",
    "release_finalizer",
    "remove_condition",
    "remove_finalizer",
    "remove_owner_reference",
    "set_condition",
    "set_conditions",
    "set_controller_reference",
    "set_owner_reference",
    "status_conditions",
    "validate_owner",
]
