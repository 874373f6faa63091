"""The operator's event recorders: the manager's own (``Manager.event_recorder``), one per
controller, flushed and closed by the manager when it stops."""

from __future__ import annotations

from controller_runtime import EventRecorder, Manager
from controller_runtime.builder import ControllerHost


def controller_recorder(
    host: ControllerHost, reporting_controller: str, recorder: EventRecorder | None = None
) -> EventRecorder:
    """``recorder`` if given, else the manager's recorder reporting as
    ``reporting_controller`` (a qualified name such as ``crpy.io/task-controller``)."""
    if recorder is not None:
        return recorder
    if not isinstance(host, Manager):
        raise TypeError(
            f"{reporting_controller}: no event recorder; build the controller on a Manager or "
            "pass recorder="
        )
    return host.event_recorder(reporting_controller)
