"""A manager with a shard ring, in process: one replica takes every slot, its reads go through
the sharded cache, /readyz and /metrics tell about the ring, and a graceful stop deletes the
replica's Lease. Also what complete_sharded refuses."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import aiohttp
import pytest

from controller_runtime import ControllerBuilder, Request
from controller_runtime.manager import Manager, ManagerOptions
from controller_runtime.sharding import RING_LABEL, ShardRingConfig
from controllers.task import TaskReconciler
from kubeclient.config import ClusterConfig
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport

TASKS = "tasks.crpy.io/v1"


def task(name: str) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {"title": name, "priority": 1},
    }


def ring_config(namespace: str, ring: str) -> ShardRingConfig:
    return ShardRingConfig(
        ring,
        namespace,
        identity=f"solo-{uuid.uuid4().hex[:6]}",
        lease_duration=6,
        renew_deadline=4,
        retry_period=1,
        settle=0.5,
    )


async def test_one_replica_owns_every_slot_and_reports_it(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    for i in range(30):
        await transport.request("POST", base, body=task(f"t{i:02d}"))
    # Tasks in another namespace: outside the manager's scope, so never cached nor reconciled.
    elsewhere = f"{namespace}-x"
    await transport.request("POST", "/api/v1/namespaces", body={"metadata": {"name": elsewhere}})
    for i in range(5):
        await transport.request(
            "POST", f"/apis/tasks.crpy.io/v1/namespaces/{elsewhere}/tasks", body=task(f"t{i:02d}")
        )
    ring = f"solo-{uuid.uuid4().hex[:6]}"
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address="127.0.0.1:0",
            health_probe_bind_address="127.0.0.1:0",
            shard_ring=ring_config(namespace, ring),
        ),
    )
    inner = TaskReconciler(manager.client)
    reconciled: set[str] = set()
    all_seen = asyncio.Event()

    async def reconcile(request: Request) -> None:
        await inner.reconcile(request)  # reads through the sharded cache
        reconciled.add(f"{request.namespace}/{request.name}")
        if len(reconciled) == 30:
            all_seen.set()

    sharded = await (
        ControllerBuilder(manager)
        .for_(TASKS, "Task")
        .with_options(skip_name_validation=True)
        .complete_sharded(reconcile)
    )
    running = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(all_seen.wait(), 60)
        assert manager.shard_ring is not None
        assert manager.shard_ring.active == set(range(16))
        assert {key.split("/")[0] for key in reconciled} == {namespace}
        assert sum(len(i.store) for i in sharded.entry.informers.values()) == 30
        items = (await transport.request("GET", base)).json()["items"]
        assert all(t.get("status", {}).get("state") == "Pending" for t in items)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{manager.health_url}/readyz?verbose") as answer:
                assert answer.status == 200
                assert "[+]shards-synced ok" in await answer.text()
            async with http.get(f"{manager.metrics_url}/metrics") as answer:
                text = await answer.text()
        assert f'shard_ring_owned_slots{{ring="{ring}"}} 16.0' in text
        assert f'shard_ring_members{{ring="{ring}"}} 1.0' in text
        assert f'shard_ring_handovers_total{{kind="acquire",ring="{ring}"}} 16.0' in text
        # The store gauge counts every slot's store, not only the last one started.
        assert 'informer_store_objects{resource="tasks.tasks.crpy.io"} 30.0' in text
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        listed = (
            await transport.request("GET", leases, params={"labelSelector": f"{RING_LABEL}={ring}"})
        ).json()
        (lease,) = listed["items"]
        claims = lease["metadata"]["annotations"]["crpy.io/shard-claims"]
        assert claims == ",".join(str(s) for s in range(16))
        manager.request_stop()
        await asyncio.wait_for(running, 60)
        with pytest.raises(NotFoundError):
            await transport.request("GET", f"{leases}/{lease['metadata']['name']}")
    finally:
        manager.request_stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 60)


async def test_complete_sharded_refuses_what_it_cannot_shard(
    admin_config: ClusterConfig, namespace: str
) -> None:
    async def reconcile(request: Request) -> None:
        return None

    plain = Manager(admin_config, ManagerOptions(namespaces=[namespace]))
    sharded = Manager(
        admin_config,
        ManagerOptions(namespaces=[namespace], shard_ring=ring_config(namespace, "refusals")),
    )
    try:
        with pytest.raises(ValueError, match="no shard ring"):
            await ControllerBuilder(plain).for_(TASKS, "Task").complete_sharded(reconcile)
        with pytest.raises(ValueError, match="for_\\(\\) only"):
            await (
                ControllerBuilder(sharded)
                .for_(TASKS, "Task")
                .owns("v1", "ConfigMap")
                .complete_sharded(reconcile)
            )
        await sharded.cache.watch(TASKS, "Task")  # cached unsharded already
        with pytest.raises(ValueError, match="already cached"):
            await (
                ControllerBuilder(sharded)
                .named("refused")
                .for_(TASKS, "Task")
                .complete_sharded(reconcile)
            )
    finally:
        await plain.transport.close()
        await sharded.cache.stop()
        await sharded.transport.close()
