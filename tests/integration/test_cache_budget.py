"""The cache's memory budget on the real control plane: above it the cache keeps every
object's metadata and the most recently used bodies; the client fetches an evicted body live,
counts it, and never answers with a body older than the metadata the cache holds (a fault
proxy puts a newer version of an object's metadata into the watch than the server holds of
it, to attack that). The read-your-own-writes guard keeps holding with every body evicted
and the informers lagging behind a proxy; a reader holds a kind for a block only
(``cache.use``); and the operator's map functions answer under a budget."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from controller_runtime import metrics
from controller_runtime.cache import (
    ByObject,
    Cache,
    CacheSyncTimeoutError,
    EvictedBodyError,
    NotCachedError,
    StaleFetchError,
)
from controller_runtime.client import Client
from controller_runtime.envtest.faultproxy import FaultProxy
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport
from tests.integration import test_guard_proof as guard_proof
from tests.integration.test_dynamic_controllers import (
    _at_least,
    _at_most,
    apiserver_watches,
    until,
)
from tests.integration.test_informers import eventually, opening_proxy  # noqa: F401

pytestmark = pytest.mark.integration

CONFIGMAP = ("v1", "ConfigMap")
N = 20


CONFIGMAP_LABELS = {"group": "", "kind": "ConfigMap"}


def fetches() -> float:
    value = metrics.REGISTRY.get_sample_value("cache_fetch_on_miss_total", CONFIGMAP_LABELS)
    return value or 0.0


def cache_bytes() -> float | None:
    return metrics.REGISTRY.get_sample_value("cache_bytes", CONFIGMAP_LABELS)


def configmap(name: str, size: int = 1000) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": "demo"}}, "data": {"v": "x" * size}}


@pytest.fixture
async def budgeted(transport: Transport, namespace: str) -> AsyncIterator[tuple[Cache, Client]]:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(N):
        await transport.request("POST", base, body=configmap(f"cm-{i:02d}"))
    cache = Cache(
        InformerFactory(transport),
        namespaces=[namespace],
        # Only the test's ConfigMaps (a cluster adds its root CA bundle to every namespace).
        by_object={CONFIGMAP: ByObject(memory_limit=3 * 1200, label_selector="app=demo")},
    )
    entry = await cache.watch(*CONFIGMAP)
    assert await entry.wait_for_sync(30)
    yield cache, Client(transport, cache, read_own_writes=True)
    await cache.stop()


async def test_above_the_budget_evicted_bodies_are_fetched_live_and_counted(
    budgeted: tuple[Cache, Client], transport: Transport, namespace: str
) -> None:
    cache, client = budgeted
    (informer,) = cache.watched(*CONFIGMAP).informers.values()  # type: ignore[union-attr]
    store = informer.store
    keys = store.keys()
    evicted = [k for k in keys if store.evicted(k)]
    assert len(store) == N and N - 3 <= len(evicted) < N  # metadata of all, bodies of a few
    assert 0 < (cache_bytes() or 0) < N * 1000  # bodies of three, metadata of the rest
    with pytest.raises(EvictedBodyError, match=r"client\.get"):
        cache.get(*CONFIGMAP, name=evicted[0].split("/")[1], namespace=namespace)

    before = fetches()
    for key in evicted:
        name = key.split("/")[1]
        got = await client.get(*CONFIGMAP, name=name, namespace=namespace)
        live = await client.live.get(*CONFIGMAP, name=name, namespace=namespace)
        assert (
            got["data"] == live["data"]
            and got["metadata"]["resourceVersion"] == (live["metadata"]["resourceVersion"])
        )
        assert "managedFields" not in got["metadata"]  # the informer's transform, applied
    assert fetches() == before + len(evicted)
    listed = await client.list(*CONFIGMAP, namespace=namespace, label_selector="app=demo")
    assert sorted(o["metadata"]["name"] for o in listed) == [f"cm-{i:02d}" for i in range(N)]
    assert all(o["data"]["v"] == "x" * 1000 for o in listed)


async def test_a_write_to_an_evicted_object_is_read_back(
    budgeted: tuple[Cache, Client], namespace: str
) -> None:
    cache, client = budgeted
    (informer,) = cache.watched(*CONFIGMAP).informers.values()  # type: ignore[union-attr]
    keys = informer.store.keys()
    key = next(k for k in keys if informer.store.evicted(k))
    name = key.split("/")[1]
    current = await client.get(*CONFIGMAP, name=name, namespace=namespace)
    written = await client.patch(current, {"data": {"v": "written"}})
    got = await client.get(*CONFIGMAP, name=name, namespace=namespace)
    assert got["data"]["v"] == "written"
    assert int(got["metadata"]["resourceVersion"]) >= int(written["metadata"]["resourceVersion"])


async def test_a_fetch_answering_older_than_the_cached_metadata_is_refused(
    admin_config: ClusterConfig,
    opening_proxy: FaultProxy,  # noqa: F811
    transport: Transport,
    namespace: str,
) -> None:
    """The proxy adds to the watch a MODIFIED of ``x`` at the resourceVersion of a later
    write (``y``'s): a version the server has reached, so the live GET "not older than" it
    is answered, with ``x`` as the server holds it, at its own older version. With a budget
    of 0 the cache holds only ``x``'s metadata, at the newer version: the client must refuse
    the older body (StaleFetchError), not answer with it nor hold it."""
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    created = (await transport.request("POST", base, body=configmap("x", 10))).json()
    later = (await transport.request("POST", base, body=configmap("y", 10))).json()
    newer = later["metadata"]["resourceVersion"]
    assert int(newer) > int(created["metadata"]["resourceVersion"])
    config = dataclasses.replace(admin_config, server=opening_proxy.url)
    async with Transport(config) as proxied:
        cache = Cache(
            InformerFactory(proxied),
            namespaces=[namespace],
            by_object={CONFIGMAP: ByObject(memory_limit=0)},
        )
        client = Client(proxied, cache)
        try:
            entry = await cache.watch(*CONFIGMAP)
            assert await entry.wait_for_sync(30)
            (informer,) = entry.informers.values()
            key = f"{namespace}/x"
            assert informer.store.evicted(key)
            got = await client.get(*CONFIGMAP, name="x", namespace=namespace)
            assert got["data"] == {"v": "x" * 10}  # a fetch at the version held: fine
            ahead = {**created, "metadata": {**created["metadata"], "resourceVersion": newer}}
            line = orjson.dumps({"type": "MODIFIED", "object": ahead})
            await eventually(lambda: opening_proxy.inject_line(line) > 0, what="an open watch")
            await eventually(
                lambda: informer.store.resource_version_of(key) == newer,
                what="the newer metadata in the cache",
            )
            assert informer.store.evicted(key)
            before = fetches()
            with pytest.raises(StaleFetchError, match="older than") as refused:
                await client.get(*CONFIGMAP, name="x", namespace=namespace)
            assert created["metadata"]["resourceVersion"] in str(refused.value)
            assert fetches() == before + 1
            # Not taken back either: the cache still holds the metadata only, at the newer
            # version, and a list through the client is refused the same way.
            assert informer.store.evicted(key)
            assert informer.store.resource_version_of(key) == newer
            with pytest.raises(StaleFetchError):
                await client.list(*CONFIGMAP, namespace=namespace)
        finally:
            await cache.stop()


@pytest.fixture
async def lagging(
    admin_config: ClusterConfig,
) -> AsyncIterator[tuple[Transport, Transport, FaultProxy]]:
    """The informers read through a proxy that delays everything by ``guard_proof.LAG``;
    writes go straight to the server (as in tests/integration/test_guard_proof.py)."""
    host, port = admin_config.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    proxy.latency = guard_proof.LAG
    async with (
        Transport(dataclasses.replace(admin_config, server=proxy.url)) as watching,
        Transport(admin_config) as writing,
    ):
        yield watching, writing, proxy
    await proxy.stop()


async def test_the_guard_holds_with_every_body_evicted_behind_a_lagging_proxy(
    lagging: tuple[Transport, Transport, FaultProxy], namespace: str
) -> None:
    """The guard's proof (test_guard_proof.py) with a budget of 0: the cache holds the
    metadata of every Task and child ConfigMap and no body, so each child the reconciler
    lists is fetched live. A reconcile run before the lagging cache saw the child it just
    created would create a second: the guard (which reads only the metadata kept) must
    requeue it instead, and no Task gets two children."""
    watching, writing, _ = lagging
    before = sum(
        s.value
        for family in metrics.REGISTRY.collect()
        for s in family.samples
        if s.name == "cache_fetch_on_miss_total" and s.labels.get("kind") == "ConfigMap"
    )
    run = await guard_proof.run_scenario(watching, writing, namespace, guarded=True, memory_limit=0)
    on_server = await guard_proof._children(writing, namespace)
    assert on_server == {f"p{i}": 1 for i in range(guard_proof.PARENTS)}
    assert run.guard is not None
    assert run.guard.skips > 0, "the lag never made the guard requeue: the test proves nothing"
    fetched = sum(
        s.value
        for family in metrics.REGISTRY.collect()
        for s in family.samples
        if s.name == "cache_fetch_on_miss_total" and s.labels.get("kind") == "ConfigMap"
    )
    assert fetched > before, "no child was read through a fetch: the budget was not in play"


async def test_without_the_guard_the_same_run_with_evicted_bodies_duplicates_children(
    lagging: tuple[Transport, Transport, FaultProxy], namespace: str
) -> None:
    """The control: the budget's fetches alone do not save a reconcile from a lagging
    cache (a child the cache has not seen is not listed, evicted or not)."""
    watching, writing, _ = lagging
    run = await guard_proof.run_scenario(
        watching, writing, namespace, guarded=False, memory_limit=0
    )
    on_server = await guard_proof._children(writing, namespace)
    assert on_server == run.created
    assert any(n > 1 for n in on_server.values()), f"no duplicate under lag: {on_server}"


async def test_a_reader_holds_a_kind_for_its_block_only(
    transport: Transport, namespace: str
) -> None:
    """``cache.use``: watched and synced on entry, released on exit (the watch closes and
    the store is emptied at once), nested readers counted, a pinned kind left alone, and a
    sync timeout releases what it took."""
    await transport.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("settings", 10)
    )
    factory = InformerFactory(transport)
    cache = Cache(factory, namespaces=[namespace])
    baseline = await apiserver_watches(transport, "configmaps")
    try:
        async with cache.use(*CONFIGMAP, sync_timeout=30) as entry:
            assert cache.holders(*CONFIGMAP) == 1
            got = cache.get(*CONFIGMAP, name="settings", namespace=namespace)
            assert got["data"] == {"v": "x" * 10}
            (informer,) = entry.informers.values()
            store = informer.store
            async with cache.use(*CONFIGMAP) as inner:
                assert inner is entry and cache.holders(*CONFIGMAP) == 2
            assert cache.holders(*CONFIGMAP) == 1 and cache.watched(*CONFIGMAP) is entry
            await until(
                lambda: _at_least(apiserver_watches(transport, "configmaps"), baseline + 1),
                10,
                "the reader's watch is open",
            )
        assert cache.watched(*CONFIGMAP) is None and factory.informers() == []
        assert len(store) == 0  # emptied when the last holder left, not when collected
        with pytest.raises(NotCachedError):
            cache.get(*CONFIGMAP, name="settings", namespace=namespace)
        await until(
            lambda: _at_most(apiserver_watches(transport, "configmaps"), baseline),
            5,
            "the reader's watch is closed",
        )

        await cache.watch(*CONFIGMAP)  # pinned: a reader's exit leaves it watched
        async with cache.use(*CONFIGMAP, sync_timeout=30):
            assert cache.holders(*CONFIGMAP) == 2
        assert cache.holders(*CONFIGMAP) == 1 and cache.watched(*CONFIGMAP) is not None

        # Not synced in time: refused, and nothing is left held.
        with pytest.raises(CacheSyncTimeoutError, match="Secret"):
            async with cache.use("v1", "Secret", sync_timeout=0):
                raise AssertionError("the block ran without a synced cache")
        assert cache.watched("v1", "Secret") is None and cache.holders("v1", "Secret") == 0
    finally:
        await cache.stop()


async def test_the_operators_map_functions_answer_under_a_budget(
    transport: Transport, namespace: str
) -> None:
    """The PostgresUser/ServiceBinding map functions filter the referrers of an instance by
    ``spec.instanceRef``, a body field. With every body evicted, a plain ``cache.list``
    refuses (EvictedBodyError); the map functions enqueue every object they cannot read
    (a reconcile too many), never miss one; the reconciler's own read is exact."""
    from controller_runtime.reconcile import Request  # noqa: PLC0415
    from controllers.postgres.api import API_VERSION, INSTANCE, USER  # noqa: PLC0415
    from controllers.postgres.common import (  # noqa: PLC0415
        instance_referrers,
        referrer_requests,
    )

    base = f"/apis/{API_VERSION}/namespaces/{namespace}/postgresusers"
    for name, ref in (("app", "db"), ("reporting", "db"), ("other", "elsewhere")):
        await transport.request(
            "POST",
            base,
            body={
                "apiVersion": API_VERSION,
                "kind": USER,
                "metadata": {"name": name},
                "spec": {
                    "instanceRef": {"name": ref},
                    "roleName": name,
                    "database": "app",
                    "passwordSecretRef": {"name": f"{name}-password"},
                },
            },
        )
    instance = {"metadata": {"name": "db", "namespace": namespace}}
    referring = [Request(namespace, "app"), Request(namespace, "reporting")]
    for limit, expected in ((None, referring), (0, [*referring, Request(namespace, "other")])):
        by_object = {(API_VERSION, USER): ByObject(memory_limit=limit)}
        cache = Cache(InformerFactory(transport), namespaces=[namespace], by_object=by_object)
        try:
            assert await (await cache.watch(API_VERSION, USER)).wait_for_sync(30)
            assert await (await cache.watch(API_VERSION, INSTANCE)).wait_for_sync(30)
            if limit == 0:
                with pytest.raises(EvictedBodyError):
                    cache.list(API_VERSION, USER, namespace=namespace)
            assert sorted(referrer_requests(cache, API_VERSION, USER, instance)) == sorted(expected)
            exact = await instance_referrers(Client(transport, cache), API_VERSION, USER, instance)
            assert sorted(u["metadata"]["name"] for u in exact) == ["app", "reporting"]
        finally:
            await cache.stop()


async def test_a_sharded_controllers_slots_share_the_kinds_budget(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    """With a shard ring, every slot's informer is under the cache's budget (one budget for
    the kind), and a reconcile reading through the client gets the whole body fetched."""
    from controller_runtime import ControllerBuilder, Request  # noqa: PLC0415
    from controller_runtime.manager import Manager, ManagerOptions  # noqa: PLC0415
    from tests.integration.test_sharding_manager import (  # noqa: PLC0415
        TASKS,
        ring_config,
        task,
    )

    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    for i in range(10):
        await transport.request("POST", base, body=task(f"t{i}"))
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            shard_ring=ring_config(namespace, f"budget-{uuid.uuid4().hex[:6]}"),
            cache_memory_limit=0,
        ),
    )
    read: dict[str, dict[str, Any]] = {}
    all_read = asyncio.Event()

    async def reconcile(request: Request) -> None:
        read[request.name] = await manager.client.get(TASKS, "Task", request)
        if len(read) == 10:
            all_read.set()

    labels = {"group": "tasks.crpy.io", "kind": "Task"}
    before = metrics.REGISTRY.get_sample_value("cache_fetch_on_miss_total", labels) or 0.0
    sharded = await (
        ControllerBuilder(manager)
        .for_(TASKS, "Task")
        .with_options(skip_name_validation=True)
        .complete_sharded(reconcile)
    )
    running = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(all_read.wait(), 60)
        informers = list(sharded.entry.informers.values())
        assert informers and all(i.store.budget is manager.cache.budget for i in informers)
        held = [(i.store, k) for i in informers for k in i.store.keys()]  # noqa: SIM118 (a Store)
        assert len(held) == 10 and all(store.evicted(k) for store, k in held)
        assert all(o["spec"]["priority"] == 1 for o in read.values())  # the whole body
        after = metrics.REGISTRY.get_sample_value("cache_fetch_on_miss_total", labels) or 0.0
        assert after - before >= 10
    finally:
        manager.request_stop()
        await asyncio.wait_for(running, 60)
