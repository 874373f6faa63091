"""controller_runtime: an asyncio controller runtime for Kubernetes.

The public API is re-exported here; see ``docs/controllers.md`` for how to write a controller.
"""

from controller_runtime.builder import ControllerBuilder, ControllerHost, GuardFactory
from controller_runtime.cache import Cache, NotCachedError
from controller_runtime.controller import (
    Controller,
    ControllerOptions,
    ReconcileLogFilter,
    ReconcileTimeoutError,
    reconcile_logger,
)
from controller_runtime.handlers import (
    EnqueueRequestForObject,
    EnqueueRequestForOwner,
    EnqueueRequestsFromMapFunc,
    EventHandler,
)
from controller_runtime.predicates import (
    AnnotationsChanged,
    GenerationChanged,
    LabelsChanged,
    LabelSelectorPredicate,
    Predicate,
    PredicateFuncs,
    ResourceVersionChanged,
    and_,
    not_,
    or_,
)
from controller_runtime.reconcile import (
    ConsistencyGuard,
    ReconcileContext,
    Reconciler,
    Request,
    Result,
    TerminalError,
    current_reconcile,
)
from controller_runtime.workqueue import LOW_PRIORITY, WorkQueue

__all__ = [
    "LOW_PRIORITY",
    "AnnotationsChanged",
    "Cache",
    "ConsistencyGuard",
    "Controller",
    "ControllerBuilder",
    "ControllerHost",
    "ControllerOptions",
    "EnqueueRequestForObject",
    "EnqueueRequestForOwner",
    "EnqueueRequestsFromMapFunc",
    "EventHandler",
    "GenerationChanged",
    "GuardFactory",
    "LabelSelectorPredicate",
    "LabelsChanged",
    "NotCachedError",
    "Predicate",
    "PredicateFuncs",
    "ReconcileContext",
    "ReconcileLogFilter",
    "ReconcileTimeoutError",
    "Reconciler",
    "Request",
    "ResourceVersionChanged",
    "Result",
    "TerminalError",
    "WorkQueue",
    "and_",
    "current_reconcile",
    "not_",
    "or_",
    "reconcile_logger",
]
