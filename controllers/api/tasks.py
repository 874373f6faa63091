"""The Task API (``tasks.crpy.io/v1``): the classes its CRD is generated from.

``manifests/crds/tasks.crpy.io_tasks.yaml`` is written from these classes by
``make manifests``; a test fails when the two disagree.
"""

from __future__ import annotations

from typing import Annotated

from controller_runtime.resource import (
    Conditions,
    DateTime,
    Enum,
    Int64,
    Maximum,
    MaxLength,
    Minimum,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
    crd,
    field,
)

GROUP = "tasks.crpy.io"
VERSION = "v1"

TASK_STATES = ("Pending", "InProgress", "Done", "Cancelled")
"""What the owner sets in ``spec.taskState``."""
STATUS_STATES = (*TASK_STATES, "Overdue")
"""What the controller derives into ``status.state``."""


class TaskSpec(Schema):
    """What the task is, set by its owner. Rules: priority 4 or 5 needs a deadline; a task that
    is Done or Cancelled cannot change state."""

    priority: Annotated[int, Minimum(1), Maximum(5)]
    """1 (lowest) to 5 (highest); 4 and 5 need spec.deadline."""
    details: Annotated[str, MaxLength(4096)] | None = None
    """Free text describing the work."""
    deadline: DateTime | None = None
    """When the task is due (RFC 3339). Past it, an open task is Overdue."""
    task_state: Annotated[str, Enum(*TASK_STATES)] = "Pending"
    """The state the owner sets (default Pending); once Done or Cancelled it cannot change."""

    __markers__ = (
        Rule(
            "self.priority < 4 || has(self.deadline)",
            message="a task with priority 4 or 5 needs a deadline (spec.deadline)",
            field_path=".deadline",
            reason="FieldValueRequired",
        ),
        Rule(
            "!(oldSelf.taskState in ['Done', 'Cancelled']) || self.taskState == oldSelf.taskState",
            message=(
                "a task that is Done or Cancelled cannot change state; create a new task instead"
            ),
            field_path=".taskState",
            reason="FieldValueForbidden",
        ),
    )


class TaskStatus(Schema):
    """Derived by the Task controller from the spec and the clock; never set it."""

    state: Annotated[str, Enum(*STATUS_STATES)] | None = None
    """spec.taskState, or Overdue once spec.deadline passed while the task is Pending or
    InProgress. Selectable: kubectl get tasks --field-selector status.state=Overdue."""
    observed_generation: Int64 | None = None
    """The metadata.generation the status describes."""
    conditions: Conditions = field(default_factory=list)
    """Overdue (True once the deadline passed while the task is open), as metav1.Condition
    entries."""


@crd(
    group=GROUP,
    version=VERSION,
    short_names=("tsk",),
    selectable_fields=(".spec.priority", ".spec.taskState", ".status.state"),
    printer_columns=(
        PrinterColumn("Priority", ".spec.priority", "integer"),
        PrinterColumn("Desired", ".spec.taskState"),
        PrinterColumn("State", ".status.state"),
        PrinterColumn("Deadline", ".spec.deadline", format="date-time"),
        PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
    ),
    header=(
        "Task: a unit of work with a priority, a deadline and a state. The Task controller\n"
        "derives status.state (Overdue once the deadline passes while the task is not Done or\n"
        "Cancelled), a selectable field like spec.priority and spec.taskState."
    ),
)
class Task(Resource):
    """A unit of work with a priority, a deadline and a state; the Task controller derives its
    status."""

    spec: TaskSpec
    status: TaskStatus = field(default_factory=TaskStatus)
