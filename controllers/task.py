"""The Task controller: derives ``status.state`` from the spec and the clock.

Rules (:func:`derive_status`):

* ``spec.taskState`` Done or Cancelled → that state (a closed task is never Overdue);
* an open task (Pending, InProgress) whose ``spec.deadline`` has passed → ``Overdue``;
* otherwise → ``spec.taskState``.

The ``Overdue`` condition says the same with a reason, and ``observedGeneration`` records
which spec the status describes. The status is written only when it changes (a merge patch
of the status subresource, conditioned on the resourceVersion read), and an open task with a
future deadline is requeued for the moment the deadline passes: no polling.

When a task turns Overdue, the controller records a Warning Event (reason ``Overdue``) about
it, once per transition (after the status write that made it so succeeded), so
``kubectl describe task`` and ``kubectl get events`` show it. ``status.state`` is a selectable
field of the CRD: ``kubectl get tasks --field-selector status.state=Overdue`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from controller_runtime import (
    Client,
    Controller,
    ControllerBuilder,
    ControllerOptions,
    EventRecorder,
    GenerationChanged,
    Request,
    Result,
    ignore_not_found,
    set_condition,
)
from controller_runtime.builder import ControllerHost
from controllers.recording import controller_recorder

if TYPE_CHECKING:  # the sharded controller is imported only by an operator that shards
    from controller_runtime.sharded_controller import ShardedController

TASK_API_VERSION = "tasks.crpy.io/v1"
TASK_KIND = "Task"
OPEN_STATES = frozenset({"Pending", "InProgress"})
WAKE_MARGIN = 0.05
"""Seconds added to a deadline wake-up, so the reconcile runs just after it, not before."""

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def parse_time(value: str) -> datetime:
    """An RFC 3339 timestamp as the API server stores it (``Z`` or an offset)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def derive_status(task: dict[str, Any], now: datetime) -> tuple[dict[str, Any], float | None]:
    """The status ``task`` should have at ``now``, and the seconds until it changes by
    itself (the deadline of an open task), or ``None``. ``task`` is not mutated; the new
    status shares the conditions it leaves unchanged with it (replace a condition, as
    ``set_condition`` does, rather than edit it in place)."""
    spec = task.get("spec") or {}
    desired = spec.get("taskState") or "Pending"
    deadline_text = spec.get("deadline")
    deadline = parse_time(deadline_text) if deadline_text else None
    wake_in: float | None = None
    # Copy on write, no deep copy: the status and its conditions list are new, set_condition
    # replaces a condition rather than editing it, and nothing else nested is touched, so
    # ``task`` is never mutated (unchanged conditions are shared with it).
    status = dict(task.get("status") or {})
    conditions: list[dict[str, Any]] = list(status.get("conditions") or [])
    status["conditions"] = conditions
    generation = task.get("metadata", {}).get("generation")
    if desired not in OPEN_STATES:
        state, overdue, reason, message = desired, False, "Closed", f"the task is {desired}"
    elif deadline is not None and now >= deadline:
        state, overdue, reason = "Overdue", True, "DeadlinePassed"
        message = f"the deadline {deadline_text} has passed"
    else:
        state, overdue = desired, False
        if deadline is None:
            reason, message = "NoDeadline", "the task has no deadline"
        else:
            reason, message = "OnTime", f"due {deadline_text}"
            wake_in = (deadline - now).total_seconds() + WAKE_MARGIN
    status["state"] = state
    status["observedGeneration"] = generation
    set_condition(
        conditions,
        "Overdue",
        overdue,
        reason=reason,
        message=message,
        observed_generation=generation,
        now=now,
    )
    return status, wake_in


class TaskReconciler:
    """Reconciles one Task; ``clock`` is injectable for tests. With a ``recorder``, a task
    turning Overdue gets a Warning Event (none without one)."""

    def __init__(
        self, client: Client, *, clock: Clock = utcnow, recorder: EventRecorder | None = None
    ) -> None:
        self.client = client
        self.clock = clock
        self.recorder = recorder

    async def reconcile(self, request: Request) -> Result | None:
        task = await ignore_not_found(self.client.get(TASK_API_VERSION, TASK_KIND, request))
        if task is None:
            return None  # deleted: nothing to do
        status, wake_in = derive_status(task, self.clock())
        if status != (task.get("status") or {}):
            patch = {
                "metadata": {"resourceVersion": task["metadata"]["resourceVersion"]},
                "status": status,
            }
            await self.client.patch_status(task, patch)
            was = (task.get("status") or {}).get("state")
            if status["state"] == "Overdue" and was != "Overdue" and self.recorder is not None:
                deadline = (task.get("spec") or {}).get("deadline")
                self.recorder.record(
                    task, "Warning", "Overdue", f"the deadline {deadline} has passed", "Derive"
                )
        return Result(requeue_after=wake_in) if wake_in is not None else None


def _task_builder(host: ControllerHost, options: ControllerOptions | None) -> ControllerBuilder:
    return (
        ControllerBuilder(host)
        .named("task")
        .for_(TASK_API_VERSION, TASK_KIND, predicates=[GenerationChanged()])
        .with_options(options)
    )


async def setup_task_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    clock: Clock = utcnow,
    recorder: EventRecorder | None = None,
) -> Controller:
    """Build the Task controller on ``host`` (a manager): watch Tasks, reconcile on spec
    changes (``GenerationChanged``: its own status writes do not trigger it again). Events
    go to ``recorder``, by default a new one reporting as ``tasks.crpy.io/task-controller``
    that is closed when ``host`` stops."""
    recorder = controller_recorder(host, "tasks.crpy.io/task-controller", recorder)
    reconciler = TaskReconciler(client, clock=clock, recorder=recorder)
    return await _task_builder(host, options).complete(reconciler)


async def setup_sharded_task_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    clock: Clock = utcnow,
    recorder: EventRecorder | None = None,
) -> ShardedController:
    """The Task controller sharded over the manager's ring (``ManagerOptions.shard_ring``):
    each replica reconciles the Tasks of the slots it owns. Events as for
    :func:`setup_task_controller`."""
    recorder = controller_recorder(host, "tasks.crpy.io/task-controller", recorder)
    reconciler = TaskReconciler(client, clock=clock, recorder=recorder)
    return await _task_builder(host, options).complete_sharded(reconciler)
