"""The cache's memory budget on the real control plane: above it the cache keeps every
object's metadata and the most recently used bodies; the client fetches an evicted body live,
counts it, and never answers with a body older than the metadata the cache holds (a fault
proxy puts metadata from the future into the watch to attack that)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from controller_runtime import metrics
from controller_runtime.cache import ByObject, Cache, EvictedBodyError
from controller_runtime.client import Client
from controller_runtime.envtest.faultproxy import FaultProxy
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.errors import ApiError
from kubeclient.transport import Transport
from tests.integration.test_informers import eventually, opening_proxy  # noqa: F401

pytestmark = pytest.mark.integration

CONFIGMAP = ("v1", "ConfigMap")
N = 20


def fetches() -> float:
    value = metrics.REGISTRY.get_sample_value("cache_fetch_on_miss_total", {"kind": "ConfigMap"})
    return value or 0.0


def cache_bytes() -> float:
    value = metrics.REGISTRY.get_sample_value("cache_bytes", {"kind": "ConfigMap"})
    return value or 0.0


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
    assert 0 < cache_bytes() < N * 1000  # bodies of three, metadata of the rest
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


async def test_a_fetched_body_is_never_older_than_the_metadata_the_cache_holds(
    admin_config: ClusterConfig,
    opening_proxy: FaultProxy,  # noqa: F811
    transport: Transport,
    namespace: str,
) -> None:
    """The proxy adds to the watch a MODIFIED event from the future (a resourceVersion the
    server has not reached); with a budget of 0 the cache keeps only its metadata. The server
    holds an older body: the client must not answer with it."""
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    created = (await transport.request("POST", base, body=configmap("x", 10))).json()
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
            assert informer.store.evicted(f"{namespace}/x")
            assert (await client.get(*CONFIGMAP, name="x", namespace=namespace))["data"] == {
                "v": "x" * 10
            }
            future = str(int(created["metadata"]["resourceVersion"]) + 1_000_000)
            ahead = {**created, "metadata": {**created["metadata"], "resourceVersion": future}}
            ahead["data"] = {"v": "future"}
            line = orjson.dumps({"type": "MODIFIED", "object": ahead})
            await eventually(lambda: opening_proxy.inject_line(line) > 0, what="an open watch")
            await eventually(
                lambda: informer.store.resource_version_of(f"{namespace}/x") == future,
                what="the future metadata in the cache",
            )
            assert informer.store.evicted(f"{namespace}/x")
            with pytest.raises(ApiError):
                await client.get(*CONFIGMAP, name="x", namespace=namespace)
        finally:
            await cache.stop()
