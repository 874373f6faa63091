"""Compaction and the 410 relist on every backend, the way a production API server compacts.

The API server compacts its storage itself (``--etcd-compaction-interval``, 5 min by default,
2 s here): at each tick it records the revision it saw at the previous tick under
``compact_rev_key`` and asks the storage to compact to it. etcd then forgets every older
revision, so a watch from one of them is answered 410 Gone. kine (v0.17, with its own
compaction off, its default) compacts when asked too, but never past its newest revision
minus ``--compact-min-retain`` (1000): a watcher is expired only once it is more than 1000
revisions behind, however often the API server compacts. etcd's gRPC gateway
(``/v3/kv/compaction``, which the etcd-only tests call) does not exist on kine.

With the watch cache off, watches are served from the storage, so a 410 here is the
storage's own answer, and the informer must relist and converge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from informers._framing import LineFramer
from informers.shared import SharedInformer
from kubeclient.config import load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.errors import GoneError
from kubeclient.transport import Transport
from tests.integration.storage.conftest import args, plane_on
from tests.integration.storage.inspect import requested_compaction
from tests.integration.test_informers import configmap, create_all, eventually, sample

pytestmark = pytest.mark.integration

KINE_RETAINED = 1000
"""kine's ``--compact-min-retain`` default: revisions it keeps whatever the API server asks."""


@pytest.fixture(scope="module")
def compacting_plane(backend: str, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """No watch cache, and the API server compacts every 2 s."""
    flags = args(watch_cache="false", etcd_compaction_interval="2s")
    with plane_on(backend, request, crd_directory=None, extra_apiserver_args=flags) as plane:
        yield plane


@pytest.fixture
async def admin(compacting_plane: ControlPlane) -> AsyncIterator[Transport]:
    async with Transport(await load_kubeconfig(compacting_plane.kubeconfig)) as transport:
        yield transport


async def new_namespace(transport: Transport) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await transport.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


async def watch_expired(transport: Transport, path: str, resource_version: str) -> bool:
    """Whether a watch of ``path`` from ``resource_version`` is answered 410 (compacted)."""
    params = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": "1"}
    try:
        async with transport.stream(path, params) as response:
            framer = LineFramer()
            async for chunk in response.content.iter_any():
                for line in framer.feed(chunk):
                    event = orjson.loads(line)
                    return bool(event["type"] == "ERROR" and event["object"].get("code") == 410)
    except GoneError:
        return True
    return False


async def until_expired(
    transport: Transport, path: str, resource_version: str, timeout: float = 60.0
) -> None:
    """Until a watch from ``resource_version`` is answered 410 (nothing announces it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await watch_expired(transport, path, resource_version):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"a watch from {resource_version} still resumes")
        await asyncio.sleep(0.5)


async def advance(transport: Transport, namespace: str, revisions: int) -> str:
    """Make ``revisions`` new revisions (16 new ConfigMaps, then updates of them); the last
    resourceVersion."""
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    tag = uuid.uuid4().hex[:6]
    names = [f"filler-{tag}-{i}" for i in range(16)]
    await create_all(transport, base, [configmap(n) for n in names])
    queue = list(range(max(revisions - len(names), 0)))
    highest = 0

    async def worker(name: str) -> None:
        nonlocal highest
        while queue:
            i = queue.pop()
            answer = await transport.request(
                "PATCH",
                f"{base}/{name}",
                body={"data": {"i": str(i)}},
                content_type="application/merge-patch+json",
            )
            highest = max(highest, int(answer.json()["metadata"]["resourceVersion"]))

    await asyncio.gather(*(worker(n) for n in names))
    return str(highest)


async def compacted_past(plane: ControlPlane, revision: int, timeout: float = 60.0) -> None:
    """Until the API server has asked the storage to compact to at least ``revision``."""
    process = plane.storage_processes[plane.storage]
    deadline = asyncio.get_running_loop().time() + timeout
    while (asked := await requested_compaction(process)) < revision:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no compaction past {revision} in {timeout}s (last: {asked})")
        await asyncio.sleep(0.25)


async def compacted_done(plane: ControlPlane, revision: int) -> None:
    """Until the storage has carried out a compaction the API server asked for at
    ``revision`` or later. The API server records the revision, then compacts, then waits an
    interval, in one loop: once it records a newer one, the compaction before has returned."""
    await compacted_past(plane, revision)
    asked = await requested_compaction(plane.storage_processes[plane.storage])
    await compacted_past(plane, asked + 1)


async def test_a_watch_from_a_compacted_revision_is_410_and_the_informer_relists(
    compacting_plane: ControlPlane, admin: Transport
) -> None:
    config = await load_kubeconfig(compacting_plane.kubeconfig)
    host, port = compacting_plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    ns = await new_namespace(admin)
    base = f"/api/v1/namespaces/{ns}/configmaps"
    await create_all(admin, base, [configmap(f"cm{i}") for i in range(5)])
    proxied = Transport(dataclasses.replace(config, server=proxy.url))
    async with proxied:
        informer = SharedInformer(
            proxied, await Discovery(proxied).resolve("v1", "ConfigMap"), namespace=ns
        )
        informer.start()
        try:
            assert await informer.wait_for_sync(60)
            synced_at = informer.store.last_observed_resource_version
            assert synced_at is not None
            expired = sample(
                "informer_relists_total", resource="configmaps", reason="watch expired"
            )
            proxy.freeze()  # the informer hears nothing from here on
            await admin.request("DELETE", f"{base}/cm0")
            await admin.request(
                "PATCH",
                f"{base}/cm1",
                body={"data": {"k": "v"}},
                content_type="application/merge-patch+json",
            )
            await create_all(admin, base, [configmap("new")])
            # Far enough ahead that kine's retained window no longer holds the informer's
            # revision; then wait for the API server's compaction to get there.
            last = await advance(admin, ns, KINE_RETAINED + 100)
            await compacted_past(compacting_plane, int(last) - 50)
            await until_expired(admin, base, synced_at)
            proxy.cut_all()
            proxy.thaw()
            await eventually(
                lambda: f"{ns}/new" in informer.store, timeout=60, what="relist after 410"
            )
            assert f"{ns}/cm0" not in informer.store
            cm1 = informer.store.get(f"{ns}/cm1")
            assert cm1 is not None and cm1["data"] == {"k": "v"}
            assert (
                sample("informer_relists_total", resource="configmaps", reason="watch expired")
                > expired
            )
            await eventually(
                lambda: len(informer.store) == 4 + 1 + 16, what="the fillers after the relist"
            )
        finally:
            await informer.stop()
            await proxy.stop()


async def test_how_far_behind_a_watch_may_be_before_compaction_expires_it(
    backend: str, compacting_plane: ControlPlane, admin: Transport
) -> None:
    """etcd expires a watch as soon as the API server compacted past it; kine keeps the last
    1000 revisions, so the same watch still resumes until it is 1000 revisions behind."""
    ns = await new_namespace(admin)
    base = f"/api/v1/namespaces/{ns}/configmaps"
    start = await create_all(admin, base, [configmap("start")])
    ahead = await advance(admin, ns, 50)
    await compacted_done(compacting_plane, int(start) + 1)
    if backend == "etcd":
        assert await watch_expired(admin, base, start)
        return
    # The API server asked for a compaction past ``start``, and kine kept it anyway.
    assert int(ahead) - int(start) < KINE_RETAINED
    assert not await watch_expired(admin, base, start)
    last = await advance(admin, ns, KINE_RETAINED + 50)
    await compacted_done(compacting_plane, int(last))
    assert await watch_expired(admin, base, start)
