"""Each backend as a process: where it listens, where the API server puts what, what it
refuses. The suites that run whole on each backend are listed in docs/informers.md."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from bench import etcdload
from bench.kube import create_namespace, task_body, task_name, tasks_path
from bench.storage import write_directly
from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.binaries import find_kine
from controller_runtime.envtest.storage import KINE_SQLITE, StorageError, StorageProcess
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport
from tests.integration.storage.conftest import plane_on
from tests.integration.storage.inspect import stored_keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plane(backend: str, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    with plane_on(backend, request) as p:
        yield p


def _listening(pid: int) -> list[tuple[str, int]]:
    process = psutil.Process(pid)
    return [
        (c.laddr.ip, c.laddr.port)
        for c in process.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]


def test_every_storage_process_listens_on_loopback_only(backend: str, plane: ControlPlane) -> None:
    process = plane.storage_processes[backend]
    assert process.pid is not None
    listening = _listening(process.pid)
    assert listening, "no listener found"
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
    ports = {port for _, port in listening}
    assert process.port in ports
    assert 2379 not in ports and 8080 not in ports  # kine's defaults, overridden
    if backend != "etcd":
        assert process.metrics_port in ports  # kine's metrics, moved off :8080


def test_objects_go_to_the_chosen_backend(backend: str, plane: ControlPlane) -> None:
    plane.kubectl("create", "configmap", "where", "-n", "default", "--from-literal=a=b")
    keys = asyncio.run(stored_keys(plane.storage_processes[backend], "/registry/configmaps/"))
    assert "/registry/configmaps/default/where" in keys


def test_built_in_resources_overridden_to_other_backends(
    request: pytest.FixtureRequest,
) -> None:
    overrides = {"/configmaps": "kine-sqlite", "coordination.k8s.io/leases": "kine-postgres"}
    with plane_on("etcd", request, crd_directory=None, storage_overrides=overrides) as p:
        assert set(p.storage_processes) == {"etcd", "kine-sqlite", "kine-postgres"}
        p.kubectl("create", "configmap", "moved", "-n", "default", "--from-literal=a=b")
        p.kubectl("create", "secret", "generic", "stays", "-n", "default", "--from-literal=a=b")
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "moved", "namespace": "default"},
            "spec": {"holderIdentity": "me"},
        }
        path = p.workdir / "lease.json"
        path.write_text(json.dumps(lease))
        p.kubectl("create", "-f", str(path))

        def keys(backend: str, prefix: str) -> set[str]:
            return asyncio.run(stored_keys(p.storage_processes[backend], prefix))

        assert "/registry/configmaps/default/moved" in keys("kine-sqlite", "/registry/configmaps/")
        assert not keys("etcd", "/registry/configmaps/default/")
        assert "/registry/leases/default/moved" in keys("kine-postgres", "/registry/leases/")
        assert not keys("etcd", "/registry/leases/default/")
        assert "/registry/secrets/default/stays" in keys("etcd", "/registry/secrets/")
        assert not keys("kine-sqlite", "/registry/secrets/")


def test_an_override_of_a_custom_resource_is_refused() -> None:
    plane = ControlPlane(storage_overrides={"tasks.crpy.io/tasks": "kine-sqlite"})
    with pytest.raises(StorageError, match="only to resources compiled into it"):
        plane.start()
    assert plane.storage_processes == {}


def test_why_the_api_server_ignores_overrides_of_custom_resources(tmp_path: Path) -> None:
    """The same flag names a built-in resource and a custom one: kube-apiserver moves the
    ConfigMap and leaves the Task on the main storage, without a word."""
    kine = StorageProcess(KINE_SQLITE, tmp_path, find_kine())
    kine.start()
    try:
        flag = f"/configmaps#{kine.url},tasks.crpy.io/tasks#{kine.url}"
        with ControlPlane(
            storage="etcd", extra_apiserver_args={"--etcd-servers-overrides": flag}
        ) as plane:
            plane.kubectl("create", "configmap", "moved", "-n", "default")
            task = {
                "apiVersion": "tasks.crpy.io/v1",
                "kind": "Task",
                "metadata": {"name": "not-moved", "namespace": "default"},
                "spec": {"priority": 1, "deadline": "2030-01-01T00:00:00Z"},
            }
            path = plane.workdir / "task.json"
            path.write_text(json.dumps(task))
            plane.kubectl("create", "-f", str(path))
            on_kine = asyncio.run(stored_keys(kine, "/registry/"))
            on_etcd = asyncio.run(stored_keys(plane.storage_processes["etcd"], "/registry/"))
            assert "/registry/configmaps/default/moved" in on_kine
            assert "/registry/tasks.crpy.io/tasks/default/not-moved" in on_etcd
            assert not {k for k in on_kine if k.startswith("/registry/tasks.crpy.io/")}
    finally:
        kine.remove()


async def test_kine_has_no_etcd_gateway(backend: str, plane: ControlPlane) -> None:
    """etcd serves its API as JSON over HTTP/1.1 too (the etcd-only tests compact through
    it); kine serves gRPC only, so such a request gets HTTP/2 frames back."""
    url = f"{plane.storage_processes[backend].url}/v3/kv/compaction"
    async with aiohttp.ClientSession() as session:
        if backend == "etcd":
            async with session.post(url, json={"revision": "1"}) as answer:
                assert answer.content_type == "application/json", await answer.text()
            return
        with pytest.raises(aiohttp.ClientResponseError, match="Bad status line"):
            async with session.post(url, json={"revision": "1"}):
                pass


# ------------------------------------------------ the benchmark's direct loaders, on each backend

FIRST_RUNG, SECOND_RUNG = 6_000, 8_000  # more than one of kineload's batches


async def _listed(transport: Transport, path: str, **params: str) -> dict[str, str]:
    """name -> resourceVersion of every object a paginated LIST returns."""
    found: dict[str, str] = {}
    token = ""
    while True:
        page = await transport.get_json(
            path, params={"limit": "500", **params, **({"continue": token} if token else {})}
        )
        found |= {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in page["items"]}
        token = page["metadata"].get("continue", "")
        if not token:
            return found


async def _direct_load(plane: ControlPlane) -> None:
    config = await load_kubeconfig(plane.kubeconfig)
    async with Transport(config) as transport:
        namespace = f"direct-{uuid.uuid4().hex[:6]}"
        await create_namespace(transport, namespace)
        path = tasks_path(namespace)
        await write_directly(plane, transport, namespace, (0, FIRST_RUNG))
        await write_directly(plane, transport, namespace, (FIRST_RUNG, SECOND_RUNG))

        # The loader returned once the watch cache had reached what it wrote; the cache and
        # the storage (a LIST with no resourceVersion) then hold the same Tasks at the same
        # versions: the storage's watch delivered every one as stored.
        from_storage = await _listed(transport, path)
        newest = max(int(rv) for rv in from_storage.values())
        assert await etcdload.cache_lag(transport, namespace, newest) is None
        assert await etcdload.cache_lag(transport, namespace, newest + 1000) is not None
        from_cache = await _listed(transport, path, resourceVersion="0")
        assert sorted(from_storage) == sorted(task_name(i) for i in range(SECOND_RUNG))
        assert from_cache == from_storage

        # Stored as the API server stores a reconciled Task.
        one = await transport.get_json(f"{path}/{task_name(7)}")
        assert one["spec"] == task_body(7)["spec"]
        assert one["status"]["state"] and one["status"]["observedGeneration"] == 1
        assert one["metadata"]["uid"] and one["metadata"]["generation"] == 1

        # The storage goes on as before: an update of a loaded Task, and a create after them.
        patched = await transport.request(
            "PATCH",
            f"{path}/{task_name(7)}",
            body={"spec": {"details": "checked"}},
            content_type="application/merge-patch+json",
        )
        assert int(patched.json()["metadata"]["resourceVersion"]) > newest
        created = await transport.request("POST", path, body=task_body(SECOND_RUNG))
        assert int(created.json()["metadata"]["resourceVersion"]) > newest
        assert len(await _listed(transport, path)) == SECOND_RUNG + 1


def test_tasks_written_straight_into_the_storage_are_served_as_stored(
    plane: ControlPlane,
) -> None:
    asyncio.run(_direct_load(plane))
