"""The Task resource and its controller on the real control plane: selectors (including the
CRD's selectable fields through kubectl), validation messages, and Overdue at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller_runtime import ControllerOptions, Request
from controller_runtime.envtest import ControlPlane
from controller_runtime.manager import Manager, ManagerOptions
from controllers.task import TASK_API_VERSION, TaskReconciler, setup_task_controller
from kubeclient.config import ClusterConfig
from kubeclient.errors import InvalidError
from kubeclient.transport import Transport

pytestmark = pytest.mark.integration


def task(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": TASK_API_VERSION,
        "kind": "Task",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_kubectl_label_and_field_selectors(
    control_plane: ControlPlane, transport: Transport, namespace: str
) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    for app in ("x", "y"):
        for priority in (1, 3):
            await transport.request(
                "POST", base, body=task(f"{app}-{priority}", {"app": app}, priority=priority)
            )
    out = await asyncio.to_thread(
        control_plane.kubectl,
        "get", "tasks", "-n", namespace, "--selector", "app=x",
        "--field-selector", "spec.priority=3", "-o", "name",
    )  # fmt: skip
    assert out.split() == ["task.tasks.crpy.io/x-3"]
    out = await asyncio.to_thread(
        control_plane.kubectl,
        "get", "tasks", "-n", namespace, "--field-selector", "spec.taskState=Pending",
        "-o", "name",
    )  # fmt: skip
    assert len(out.split()) == 4  # taskState defaults to Pending


async def test_kubectl_explain_states_the_rules(control_plane: ControlPlane) -> None:
    out = await asyncio.to_thread(control_plane.kubectl, "explain", "tasks.spec.priority")
    assert "1 (lowest) to 5 (highest); 4 and 5 need spec.deadline." in " ".join(out.split())
    out = await asyncio.to_thread(control_plane.kubectl, "explain", "tasks.status.state")
    assert "--field-selector status.state=Overdue" in " ".join(out.split())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            task("p7", priority=7),
            "spec.priority: Invalid value: 7: spec.priority in body "
            "should be less than or equal to 5",
        ),
        (
            task("urgent", priority=5),
            "spec.deadline: Required value: a task with priority 4 "
            "or 5 needs a deadline (spec.deadline)",
        ),
        (
            task("odd", priority=1, taskState="Maybe"),
            "spec.taskState: Unsupported value: "
            '"Maybe": supported values: "Pending", "InProgress", "Done", "Cancelled"',
        ),
    ],
)
async def test_validation_messages_say_what_is_wrong(
    transport: Transport, namespace: str, body: dict[str, Any], message: str
) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    with pytest.raises(InvalidError) as refused:
        await transport.request("POST", base, body=body)
    assert message in refused.value.message


async def test_a_closed_task_cannot_be_reopened(transport: Transport, namespace: str) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    await transport.request("POST", base, body=task("done", priority=1, taskState="Done"))
    with pytest.raises(InvalidError) as refused:
        await transport.request(
            "PATCH", f"{base}/done", body={"spec": {"taskState": "Pending"}},
            content_type="application/merge-patch+json",
        )  # fmt: skip
    assert "a task that is Done or Cancelled cannot change state" in refused.value.message


@pytest.fixture
async def task_manager(
    admin_config: ClusterConfig, namespace: str
) -> AsyncIterator[tuple[Manager, list[float]]]:
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace], metrics_bind_address=None, health_probe_bind_address=None
        ),
    )
    reconciled_at: list[float] = []
    controller = await setup_task_controller(
        manager, manager.client, options=ControllerOptions(skip_name_validation=True)
    )
    real = controller._reconcile

    async def counting(request: Any) -> Any:
        reconciled_at.append(time.monotonic())
        return await real(request)

    controller._reconcile = counting
    run = asyncio.create_task(manager.run())
    yield manager, reconciled_at
    manager.request_stop()
    await asyncio.wait_for(run, 30)


async def _status(transport: Transport, namespace: str, name: str) -> dict[str, Any]:
    obj = await transport.get_json(f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks/{name}")
    status: dict[str, Any] = obj.get("status") or {}
    return status


async def test_overdue_at_the_deadline_without_polling(
    task_manager: tuple[Manager, list[float]], transport: Transport, namespace: str
) -> None:
    _, reconciled_at = task_manager
    deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    await transport.request("POST", base, body=task("due", priority=4, deadline=rfc3339(deadline)))
    stop = time.monotonic() + 30
    states: list[str] = []
    while True:
        status = await _status(transport, namespace, "due")
        state = status.get("state")
        if state and (not states or states[-1] != state):
            states.append(state)
        if state == "Overdue":
            break
        assert time.monotonic() < stop, f"states seen: {states}"
        await asyncio.sleep(0.1)
    became_overdue = datetime.now(UTC)
    assert states == ["Pending", "Overdue"]
    assert became_overdue >= deadline
    # At the deadline (a requeue_after timer), not at some later poll or resync: the margin
    # covers the reconcile, the status write and this loop's polling on a loaded machine.
    assert (became_overdue - deadline).total_seconds() < 4.0
    overdue = next(c for c in status["conditions"] if c["type"] == "Overdue")
    assert overdue["status"] == "True" and overdue["reason"] == "DeadlinePassed"
    assert status["observedGeneration"] == 1
    # One reconcile for the create, one at the deadline: no polling in between.
    assert len(reconciled_at) == 2, reconciled_at


async def _await_state(transport: Transport, namespace: str, name: str, state: str) -> None:
    stop = time.monotonic() + 30
    while (await _status(transport, namespace, name)).get("state") != state:
        assert time.monotonic() < stop, f"{name} never became {state}"
        await asyncio.sleep(0.1)


async def test_overdue_tasks_are_selectable_and_announced_by_an_event(
    task_manager: tuple[Manager, list[float]],
    control_plane: ControlPlane,
    transport: Transport,
    namespace: str,
) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    past = rfc3339(datetime.now(UTC) - timedelta(hours=1))
    await transport.request("POST", base, body=task("late", priority=4, deadline=past))
    await transport.request("POST", base, body=task("fine", priority=1))
    await _await_state(transport, namespace, "late", "Overdue")
    await _await_state(transport, namespace, "fine", "Pending")
    out = await asyncio.to_thread(
        control_plane.kubectl,
        "get", "tasks", "-n", namespace, "--field-selector", "status.state=Overdue",
        "-o", "name",
    )  # fmt: skip
    assert out.split() == ["task.tasks.crpy.io/late"]
    events = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
    stop = time.monotonic() + 30
    while True:
        listed = await transport.get_json(events)
        overdue = [e for e in listed["items"] if e.get("reason") == "Overdue"]
        if overdue:
            break
        assert time.monotonic() < stop, "no Overdue event was recorded"
        await asyncio.sleep(0.2)
    (event,) = overdue
    assert event["type"] == "Warning"
    assert event["regarding"]["name"] == "late" and event["regarding"]["kind"] == "Task"
    assert past in event["note"]
    assert event["reportingController"] == "tasks.crpy.io/task-controller"


async def test_status_is_written_only_when_it_changes(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    await transport.request("POST", base, body=task("steady", priority=2))
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace], metrics_bind_address=None, health_probe_bind_address=None
        ),
    )
    reconciler = TaskReconciler(manager.client)
    await manager.cache.watch(TASK_API_VERSION, "Task")
    await manager.cache.wait_for_sync(30)
    request = Request(namespace, "steady")
    await reconciler.reconcile(request)
    first = (await transport.get_json(f"{base}/steady"))["metadata"]["resourceVersion"]
    deadline = time.monotonic() + 10
    informer = manager.cache.watched(TASK_API_VERSION, "Task")
    assert informer is not None
    while informer.stores[0].resource_version_of(f"{namespace}/steady") != first:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await reconciler.reconcile(request)
    await reconciler.reconcile(request)
    again = (await transport.get_json(f"{base}/steady"))["metadata"]["resourceVersion"]
    assert again == first
    await manager.cache.stop()
    await manager.transport.close()
