"""Typed resources against a real API server: reads, writes and status writes with classes,
unknown fields surviving a read-modify-write against a newer CRD, and dicts still working
beside them."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml

from controller_runtime import Client, ControllerBuilder, NotFoundError, Request
from controller_runtime.cache import Cache, InformerFactory
from controller_runtime.client import Transport
from controller_runtime.crdgen import crd_documents
from controller_runtime.envtest import ControlPlane
from controller_runtime.resource import Minimum, Resource, Schema, crd, field
from controller_runtime.testing import wait_for
from controllers.api import Task, TaskSpec, TaskStatus

pytestmark = pytest.mark.integration


class GizmoSpec(Schema):
    size: Annotated[int, Minimum(1)]


class GizmoStatus(Schema):
    ready: bool = False


@crd(group="typed.crpy.io", version="v1")
class Gizmo(Resource):
    """What an older client knows of a Gizmo: the newer CRD has more fields."""

    spec: GizmoSpec
    status: GizmoStatus = field(default_factory=GizmoStatus)


@pytest.fixture(scope="module")
def newer_gizmo_crd(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The Gizmo CRD as a newer version of the API has it: ``spec.color`` and
    ``status.phase``, which the class above does not know."""
    ((_, document, _),) = crd_documents([Gizmo])
    schema = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    schema["spec"]["properties"]["color"] = {"type": "string"}
    schema["status"]["properties"]["phase"] = {"type": "string"}
    path = tmp_path_factory.mktemp("crds") / "gizmo.yaml"
    path.write_text(yaml.safe_dump(document))
    control_plane.install_crds([path])


@pytest.fixture
async def client(transport: Transport, namespace: str) -> AsyncIterator[Client]:
    cache = Cache(InformerFactory(transport), namespaces=[namespace])
    yield Client(transport, cache)
    await cache.stop()


async def test_typed_create_get_list_update_status_and_delete(
    client: Client, namespace: str
) -> None:
    task = Task(spec=TaskSpec(priority=2, details="typed"))
    task.metadata.name, task.metadata.namespace = "typed", namespace
    created = await client.create(task)
    assert isinstance(created, Task)
    assert created.metadata.uid and created.metadata.generation == 1
    assert created.spec.task_state == "Pending"  # the CRD's default, applied by the server

    request = Request(namespace, "typed")
    cached = await wait_for(client, Task, name="typed", namespace=namespace)
    assert cached == created
    assert [t.name for t in await client.list(Task, namespace=namespace)] == ["typed"]
    live = await client.live.get(Task, request)
    assert live.spec.details == "typed"
    assert [t.name for t in await client.live.list(Task, namespace=namespace)] == ["typed"]

    # A status write takes the typed status.
    live.status = TaskStatus(state="InProgress", observed_generation=live.metadata.generation)
    written = await client.update_status(live)
    assert isinstance(written, Task) and written.status.state == "InProgress"
    patched = await client.patch_status(written, TaskStatus(state="Done"))
    assert patched.status.state == "Done" and patched.status.observed_generation == 1

    # Dicts keep working beside the class, on the same objects.
    as_dict = await client.live.get(Task.api_version, "Task", request)
    assert as_dict["status"]["state"] == "Done"

    updated = await client.mutate_with_retry(
        Task, request, mutate=lambda t: setattr(t.spec, "priority", 3)
    )
    assert isinstance(updated, Task) and updated.spec.priority == 3

    assert await client.delete(Task, request) is None
    with pytest.raises(NotFoundError):
        await client.live.get(Task, request)


async def test_the_server_refuses_what_the_markers_say(client: Client, namespace: str) -> None:
    # Generated from TaskSpec: priority 1..5 and the CEL rule on priority 4 and 5.
    task = Task(spec=TaskSpec(priority=4))
    task.metadata.name, task.metadata.namespace = "urgent", namespace
    with pytest.raises(Exception, match="needs a deadline"):
        await client.create(task)
    task.spec.priority = 7
    with pytest.raises(Exception, match="should be less than or equal to 5"):
        await client.create(task)


async def test_unknown_fields_survive_a_typed_read_modify_write(
    newer_gizmo_crd: None, client: Client, namespace: str
) -> None:
    body: dict[str, Any] = {
        "apiVersion": Gizmo.api_version,
        "kind": "Gizmo",
        "metadata": {"name": "g", "namespace": namespace, "labels": {"team": "a"}},
        "spec": {"size": 1, "color": "green"},
    }
    created = await client.create(body)
    await client.patch_status(created, {"status": {"ready": False, "phase": "Growing"}})

    gizmo = await client.live.get(Gizmo, name="g", namespace=namespace)
    gizmo.spec.size = 2
    updated = await client.update(gizmo)
    assert updated.spec.size == 2
    gizmo = copy.deepcopy(updated)
    gizmo.status.ready = True
    await client.update_status(gizmo)

    raw = await client.live.get(Gizmo.api_version, "Gizmo", name="g", namespace=namespace)
    assert raw["spec"] == {"size": 2, "color": "green"}
    assert raw["status"] == {"ready": True, "phase": "Growing"}
    assert raw["metadata"]["labels"] == {"team": "a"}


async def test_a_typed_controller_reconciles_a_typed_object(client: Client, namespace: str) -> None:
    seen: asyncio.Queue[Task] = asyncio.Queue()

    async def reconcile(request: Request) -> None:
        task = await client.get(Task, request)
        if task.status.state is None:
            task.status.state = task.spec.task_state
            await client.update_status(task)
        await seen.put(task)

    controller = await (
        ControllerBuilder(client.cache).named(f"typed-{namespace}").for_(Task).complete(reconcile)
    )
    await controller.start()
    try:
        task = Task(spec=TaskSpec(priority=1))
        task.metadata.name, task.metadata.namespace = "watched", namespace
        await client.create(task)
        first = await asyncio.wait_for(seen.get(), 30)
        assert isinstance(first, Task) and first.name == "watched"
        live = await client.live.get(Task, name="watched", namespace=namespace)
        assert live.status.state == "Pending"
    finally:
        await controller.stop()


async def test_an_informer_for_a_class(transport: Transport, namespace: str) -> None:
    factory = InformerFactory(transport)
    informer = await factory.informer(Task, namespace=namespace)
    try:
        assert informer.resource.group_resource == "tasks.tasks.crpy.io"
        assert informer is await factory.informer(Task.api_version, "Task", namespace=namespace)
        assert await informer.wait_for_sync(30)
    finally:
        await factory.stop()


def test_the_gizmo_crd_is_generated_from_the_class(tmp_path: Path) -> None:
    ((name, document, _),) = crd_documents([Gizmo])
    assert name == "typed.crpy.io_gizmos.yaml"
    assert document["spec"]["versions"][0]["subresources"] == {"status": {}}
