"""The operator's event recorders: one per controller, reporting from this process, closed
when the manager stops."""

from __future__ import annotations

import os
import socket

from controller_runtime import Client, EventRecorder


class RecorderRunnable:
    """Closes an :class:`EventRecorder` when the manager stops (a manager runnable)."""

    need_leader_election = False

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    async def start(self) -> None:
        return None

    async def stop(self, drain_timeout: float | None) -> None:
        await self.recorder.close()


def make_recorder(client: Client, reporting_controller: str) -> EventRecorder:
    """An event recorder reporting as ``reporting_controller`` (a qualified name such as
    ``crpy.io/task-controller``) from this process: the Pod name in a cluster (``POD_NAME``),
    the host name elsewhere."""
    instance = os.environ.get("POD_NAME") or socket.gethostname() or "operator"
    return EventRecorder(
        client, reporting_controller=reporting_controller, reporting_instance=instance[:128]
    )


def controller_recorder(
    host: object, client: Client, reporting_controller: str, recorder: EventRecorder | None
) -> EventRecorder:
    """``recorder``, or a new one for ``reporting_controller`` that is closed when ``host`` (a
    manager, if it has ``add``) stops."""
    if recorder is not None:
        return recorder
    recorder = make_recorder(client, reporting_controller)
    add = getattr(host, "add", None)
    if add is not None:
        add(RecorderRunnable(recorder))
    return recorder
