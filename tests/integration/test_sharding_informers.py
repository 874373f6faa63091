"""Sharded list and watch on the real API server (KEP-5866): our hash is the server's, and a
sharded informer holds exactly its shard, with the gate on (the server filters) and off (we
filter)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from informers.sharding import HashRange, ShardField, ShardSelector, split_hash_space
from informers.shared import SharedInformer
from kubeclient.config import load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.transport import Transport
from tests.support import ClusterParts

TASKS = "tasks.crpy.io/v1"
HALF = ShardSelector(ShardField.UID, [HashRange(0, 1 << 63)])


def task(name: str) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {"title": name, "priority": 1},
    }


async def create_tasks(transport: Transport, namespace: str, names: list[str]) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    queue = list(names)

    async def worker() -> None:
        while queue:
            await transport.request("POST", base, body=task(queue.pop()))

    await asyncio.gather(*(worker() for _ in range(16)))


async def new_namespace(transport: Transport) -> str:
    name = f"t-shard-{uuid.uuid4().hex[:8]}"
    await transport.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


async def snapshot(
    transport: Transport, path: str, selector: ShardSelector | None, rv: str | None = None
) -> tuple[set[str], dict[str, Any]]:
    """``namespace/name`` of the objects listed (at ``rv`` exactly, if given) and the list's
    metadata."""
    params = {"shardSelector": selector.wire} if selector is not None else {}
    if rv is not None:
        params |= {"resourceVersion": rv, "resourceVersionMatch": "Exact"}
    body = (await transport.request("GET", path, params=params)).json()
    keys = {f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in body["items"]}
    return keys, body["metadata"]


@pytest.mark.usefixtures("sharding_gate_on")
@pytest.mark.parametrize("field", list(ShardField))
@pytest.mark.parametrize("path", ["/api/v1/namespaces", "/apis/tasks.crpy.io/v1/tasks"])
async def test_client_hash_equals_the_servers(
    control_plane: ControlPlane, transport: Transport, field: ShardField, path: str
) -> None:
    # Tasks in three namespaces, so hashing by namespace splits them too.
    for _ in range(3):
        namespace = await new_namespace(transport)
        await create_tasks(transport, namespace, [f"task-{i}" for i in range(20)])
    everything = (await transport.request("GET", path)).json()
    rv = everything["metadata"]["resourceVersion"]
    by_key = {
        f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}": i
        for i in everything["items"]
    }
    quarters = split_hash_space(4)
    seen: set[str] = set()
    for quarter in quarters:
        selector = ShardSelector(field, [quarter])
        served, meta = await snapshot(transport, path, selector, rv)
        expected = {key for key, obj in by_key.items() if selector.matches(obj)}
        assert served == expected, f"{field.name} {quarter}: server and client disagree"
        seen |= served
        # What the server echoes is not a reliable sign: built-in kinds carry shardInfo,
        # custom resources (1.36.3) do not, though both are filtered.
        if path.startswith("/api/"):
            assert meta.get("shardInfo", {}).get("selector") == selector.wire
    assert seen == set(by_key)  # the quarters tile the space: nothing lost


async def sharded_informer(
    transport: Transport, namespace: str, selector: ShardSelector
) -> SharedInformer:
    resource = await Discovery(transport).resolve(TASKS, "Task")
    informer = SharedInformer(transport, resource, namespace=namespace, shard_selector=selector)
    informer.start()
    assert await informer.wait_for_sync(60)
    return informer


async def check_informer_holds_its_shard(transport: Transport, server_filters: bool) -> None:
    namespace = await new_namespace(transport)
    names = [f"task-{i:03d}" for i in range(60)]
    await create_tasks(transport, namespace, names)
    path = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    items = (await transport.request("GET", path)).json()["items"]
    expected = {f"{namespace}/{i['metadata']['name']}" for i in items if HALF.matches(i)}
    assert 0 < len(expected) < len(names)
    informer = await sharded_informer(transport, namespace, HALF)
    try:
        assert set(informer.store.keys()) == expected
        shard_filter = informer.reflector.shard_filter
        assert shard_filter is not None
        assert shard_filter.server_filtering is server_filters
        assert (shard_filter.dropped == 0) is server_filters
        # Watch events follow the same rule: create more, and wait for the store to hold
        # exactly the in-shard ones.
        later = [f"later-{i:03d}" for i in range(40)]
        await create_tasks(transport, namespace, later)
        items = (await transport.request("GET", path)).json()["items"]
        expected = {f"{namespace}/{i['metadata']['name']}" for i in items if HALF.matches(i)}
        for _ in range(600):
            if set(informer.store.keys()) == expected:
                break
            await asyncio.sleep(0.05)
        assert set(informer.store.keys()) == expected
    finally:
        await informer.stop()


@pytest.mark.usefixtures("sharding_gate_on")
async def test_sharded_informer_with_the_gate_on_is_filtered_by_the_server(
    transport: Transport,
) -> None:
    await check_informer_holds_its_shard(transport, server_filters=True)


@pytest.fixture
async def gates_off_transport(
    request: pytest.FixtureRequest, cluster_parts: ClusterParts
) -> AsyncIterator[Transport]:
    """An API server that ignores ``shardSelector``: ``gates_off_plane``, or the existing
    cluster itself when its server does (it has no such second plane to start)."""
    if use_existing_cluster() and not cluster_parts.filters_shards:
        plane: ControlPlane = request.getfixturevalue("control_plane")
    else:
        plane = request.getfixturevalue("gates_off_plane")
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as t:
        yield t


async def test_sharded_informer_with_the_gate_off_filters_on_the_client(
    gates_off_transport: Transport,
) -> None:
    await check_informer_holds_its_shard(gates_off_transport, server_filters=False)
