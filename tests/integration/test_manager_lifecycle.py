"""The manager's lifecycle against the real control plane: nothing stays open when a program
fails after it talked to the API server but before ``run``, and the manager's own event
recorder is flushed when it stops."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from controller_runtime import ControllerBuilder, Manager, ManagerOptions, Request
from controller_runtime.envtest import ControlPlane
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TASKS = "tasks.crpy.io/v1"

PROGRAM = """
import asyncio, sys
import controller_runtime as ctrl

OPTIONS = ctrl.ManagerOptions(metrics_bind_address=None, health_probe_bind_address=None)

async def reconcile(request):
    return None

async def main(case):
    config = await ctrl.load_config()
    async with ctrl.Manager(config, OPTIONS) as manager:
        if case == "second-controller-fails":
            # One controller built (discovery done, informers started), then a bad kind.
            await ctrl.ControllerBuilder(manager).named("first").for_("v1", "ConfigMap").complete(
                reconcile
            )
        await ctrl.ControllerBuilder(manager).named("bad").for_("v9", "Nope").complete(reconcile)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("case", ["unknown-kind", "second-controller-fails"])
def test_a_builder_error_after_talking_to_the_server_leaves_nothing_open(
    control_plane: ControlPlane, tmp_path: Path, case: str
) -> None:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM))
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "always::ResourceWarning", str(program), case],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={"KUBECONFIG": str(control_plane.kubeconfig), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "UnknownKindError: the API server serves no kind 'Nope'" in done.stderr, done.stderr
    for leak in ("Unclosed", "ResourceWarning", "was never awaited", "Task was destroyed"):
        assert leak not in done.stderr, done.stderr


async def test_the_managers_recorder_is_flushed_when_the_manager_stops(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    # More events about one object than the recorder's rate limit lets out at once (a burst
    # of 25, then one per 5 s): only the manager's flush at stop writes them all in time.
    count = 40
    reporter = f"crpy.io/flush-{uuid.uuid4().hex[:6]}"
    recorded = asyncio.Event()
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace], metrics_bind_address=None, health_probe_bind_address=None
        ),
    )
    recorder = manager.event_recorder(reporter)

    async def reconcile(request: Request) -> None:
        task = await manager.client.get(TASKS, "Task", request)
        for i in range(count):
            recorder.record(task, "Normal", "Counted", f"event {i}", "Count")
        recorded.set()

    await (
        ControllerBuilder(manager)
        .named(reporter.split("/")[1])
        .for_(TASKS, "Task")
        .complete(reconcile)
    )
    body = {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": "t", "namespace": namespace},
        "spec": {"priority": 1},
    }
    await transport.request(
        "POST", f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks", body=body
    )
    run = asyncio.create_task(manager.run())
    await asyncio.wait_for(recorded.wait(), 60)
    manager.request_stop()
    await asyncio.wait_for(run, 60)
    listing = await transport.get_json(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    ours = [e for e in listing["items"] if e.get("reportingController") == reporter]
    assert sorted(e["note"] for e in ours) == sorted(f"event {i}" for i in range(count))
    assert recorder.pending == 0 and recorder.dropped == 0


async def test_the_servers_start_once_the_informers_first_watches_are_written(
    admin_config: ClusterConfig, namespace: str
) -> None:
    """Start-up order: the informers the builder started send their first requests before
    the manager imports and starts its HTTP servers (which hold the event loop for a while),
    so the API server answers them meanwhile."""
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address="127.0.0.1:0",
        ),
    )
    order: list[str] = []
    stream = manager.transport.stream

    def recording_stream(*args: Any, **kwargs: Any) -> Any:
        order.append("watch begun")
        return stream(*args, **kwargs)

    serve = manager._serve

    async def recording_serve() -> None:
        # What the servers' start would find: every watch begun is written already.
        order.append(f"servers start, unsent watches: {manager.transport._unsent_watches}")
        await serve()

    manager.transport.stream = recording_stream  # type: ignore[method-assign]
    manager._serve = recording_serve  # type: ignore[method-assign]
    await ControllerBuilder(manager).named("order").for_(TASKS, "Task").complete(_no_op)
    run = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(manager.cache.wait_for_sync(60), 60)
        assert manager.health_url is not None
    finally:
        manager.request_stop()
        await asyncio.wait_for(run, 60)
    assert order[:2] == ["watch begun", "servers start, unsent watches: 0"], order


async def _no_op(request: Request) -> None:
    return None
