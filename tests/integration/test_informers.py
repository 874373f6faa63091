"""Informers against the real local control plane: list+watch, pagination, streaming lists,
selectors, metadata-only mode, and every failure the wire can produce (through a
fault-injecting proxy, etcd compaction, flow control and an API server restart)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.predicates import GenerationChanged
from informers import metrics, reflector
from informers.reflector_machine import ReflectorOptions
from informers.shared import InformerFactory, SharedInformer
from informers.store import StoreDelta
from kubeclient.config import ClusterConfig, load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.transport import Transport
from tests.support import ROOT_CA_CONFIGMAP, grant_list_configmaps, until_allowed

pytestmark = pytest.mark.integration

TASKS = "tasks.crpy.io/v1"


def task(name: str, priority: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"priority": priority, "deadline": "2030-01-01T00:00:00Z"},
    }


def configmap(name: str, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data or {}}


async def create_all(
    transport: Transport, path: str, bodies: list[dict[str, Any]], concurrency: int = 32
) -> str:
    """Create the objects; return the highest resourceVersion the server gave."""
    queue = list(reversed(bodies))
    highest = 0

    async def worker() -> None:
        nonlocal highest
        while queue:
            body = queue.pop()
            created = (await transport.request("POST", path, body=body)).json()
            highest = max(highest, int(created["metadata"]["resourceVersion"]))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return str(highest)


async def eventually(
    predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll a condition that no event announces (metrics, store contents) with a deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


class Recorder:
    """An event handler that keeps every delta and wakes waiters."""

    def __init__(self) -> None:
        self.deltas: list[tuple[str, dict[str, Any], bool]] = []
        self._changed = asyncio.Event()

    def __call__(self, delta: StoreDelta, initial: bool) -> None:
        self.deltas.append((delta.type, delta.obj, initial))
        self._changed.set()

    async def wait_for(
        self, predicate: Callable[[str, dict[str, Any]], bool], timeout: float = 30.0
    ) -> tuple[str, dict[str, Any]]:
        async def scan() -> tuple[str, dict[str, Any]]:
            seen = 0
            while True:
                for kind, obj, _ in self.deltas[seen:]:
                    if predicate(kind, obj):
                        return kind, obj
                seen = len(self.deltas)
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)


def named(name: str, kind: str | None = None) -> Callable[[str, dict[str, Any]], bool]:
    return lambda k, o: o["metadata"]["name"] == name and (kind is None or k == kind)


@pytest.fixture
async def factory(transport: Transport) -> AsyncIterator[InformerFactory]:
    f = InformerFactory(transport)
    yield f
    await f.stop()


async def test_informer_follows_creates_updates_and_deletes_of_a_crd(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    informer = await factory.informer(TASKS, "Task", namespace=namespace)
    recorder = Recorder()
    registration = informer.add_handler(recorder)
    assert await informer.wait_for_sync(30)
    await registration.wait_synced()

    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    await transport.request("POST", base, body=task("a", 2))
    await recorder.wait_for(named("a", "ADDED"))
    await transport.request(
        "PATCH",
        f"{base}/a",
        body={"spec": {"priority": 3}},
        content_type="application/merge-patch+json",
    )
    _, updated = await recorder.wait_for(named("a", "MODIFIED"))
    assert updated["spec"]["priority"] == 3
    assert "managedFields" not in updated["metadata"]
    cached = informer.store.get(f"{namespace}/a")
    assert cached is not None and cached["spec"]["priority"] == 3
    await transport.request("DELETE", f"{base}/a")
    await recorder.wait_for(named("a", "DELETED"))
    assert f"{namespace}/a" not in informer.store
    assert [kind for kind, _, _ in recorder.deltas] == ["ADDED", "MODIFIED", "DELETED"]


async def test_informer_on_a_built_in_kind_and_a_late_handler(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    await create_all(transport, base, [configmap(f"cm{i}", {"i": str(i)}) for i in range(5)])
    informer = await factory.informer("v1", "ConfigMap", namespace=namespace)
    early = Recorder()
    informer.add_handler(early)
    assert await informer.wait_for_sync(30)
    assert {f"cm{i}" for i in range(5)} <= {o["metadata"]["name"] for _, o, _ in early.deltas}
    assert all(initial for _, _, initial in early.deltas)

    # A handler added after sync first gets the current state, as initial ADDEDs ...
    late = Recorder()
    registration = informer.add_handler(late)
    assert registration.has_synced
    assert {o["metadata"]["name"] for _, o, _ in late.deltas} == {
        o["metadata"]["name"] for o in informer.store.list()
    }
    assert all(kind == "ADDED" and initial for kind, _, initial in late.deltas)
    # ... then live changes, like everyone else.
    await transport.request("POST", base, body=configmap("later"))
    await late.wait_for(named("later", "ADDED"))
    await early.wait_for(named("later", "ADDED"))


async def test_a_failing_and_a_slow_handler_do_not_stop_the_watch(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    informer = await factory.informer("v1", "ConfigMap", namespace=namespace)

    def failing(delta: StoreDelta, initial: bool) -> None:
        raise RuntimeError("handler bug")

    slow_seen: list[str] = []
    release = asyncio.Event()

    async def slow(delta: StoreDelta, initial: bool) -> None:
        await release.wait()
        slow_seen.append(delta.obj["metadata"]["name"])

    errors_before = sample("informer_handler_errors_total", resource="configmaps")
    informer.add_handler(failing)
    slow_registration = informer.add_handler(slow, buffer_size=2)
    recorder = Recorder()
    informer.add_handler(recorder)
    assert await informer.wait_for_sync(30)
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    await transport.request("POST", base, body=configmap("one"))
    await recorder.wait_for(named("one", "ADDED"))
    assert sample("informer_handler_errors_total", resource="configmaps") > errors_before
    # The slow handler's buffer holds 2; more changes wait for it instead of piling up.
    await create_all(transport, base, [configmap(f"x{i}") for i in range(6)], concurrency=1)
    release.set()
    await slow_registration.wait_synced()
    await eventually(lambda: {f"x{i}" for i in range(6)} <= set(slow_seen), what="slow handler")
    await recorder.wait_for(named("x5", "ADDED"))


@pytest.fixture(scope="module")
async def ten_thousand(transport: Transport) -> AsyncIterator[str]:
    """A namespace holding 10,000 Tasks (created once for the module)."""
    name = f"t-10k-{uuid.uuid4().hex[:6]}"
    await transport.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    base = f"/apis/tasks.crpy.io/v1/namespaces/{name}/tasks"
    await create_all(transport, base, [task(f"task-{i:05d}", 1 + i % 5) for i in range(10_000)])
    yield name
    await transport.request("DELETE", f"/api/v1/namespaces/{name}")


async def test_ten_thousand_objects_through_a_streaming_list(
    admin_config: ClusterConfig, transport: Transport, ten_thousand: str
) -> None:
    requests: list[str] = []

    async with Transport(admin_config, observer=lambda m, s, t: requests.append(m)) as counted:
        informer = SharedInformer(
            counted, await Discovery(transport).resolve(TASKS, "Task"), namespace=ten_thousand
        )
        informer.start()
        try:
            assert await informer.wait_for_sync(120)
            assert len(informer.store) == 10_000
            assert "GET" not in requests  # no LIST: the initial state came on the watch
            assert informer.reflector.machine.streaming_supported
        finally:
            await informer.stop()


async def test_label_and_crd_selectable_field_selectors(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    bodies = [task(f"{app}-p{p}", p, {"app": app}) for app in ("x", "y") for p in (1, 2, 3)]
    await create_all(transport, base, bodies)
    informer = await factory.informer(
        TASKS, "Task", namespace=namespace, label_selector="app=x", field_selector="spec.priority=3"
    )
    assert await informer.wait_for_sync(30)
    assert informer.store.keys() == [f"{namespace}/x-p3"]


async def test_metadata_only_mode(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    await transport.request("POST", base, body=configmap("meta", {"secret-ish": "v" * 1000}))
    informer = await factory.informer("v1", "ConfigMap", namespace=namespace, metadata_only=True)
    recorder = Recorder()
    informer.add_handler(recorder)
    assert await informer.wait_for_sync(30)
    cached = informer.store.get(f"{namespace}/meta")
    assert cached is not None
    assert cached["kind"] == "PartialObjectMetadata"
    assert "data" not in cached
    await transport.request(
        "PATCH",
        f"{base}/meta",
        body={"metadata": {"labels": {"a": "b"}}},
        content_type="application/merge-patch+json",
    )
    _, obj = await recorder.wait_for(lambda k, o: k == "MODIFIED")
    assert obj["kind"] == "PartialObjectMetadata" and obj["metadata"]["labels"] == {"a": "b"}


def _via(config: ClusterConfig, proxy: FaultProxy) -> ClusterConfig:
    return dataclasses.replace(config, server=proxy.url)


@pytest.fixture
async def proxy(control_plane: ControlPlane) -> AsyncIterator[FaultProxy]:
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    p = await FaultProxy(host, int(port)).start()
    yield p
    await p.stop()


async def test_cut_mid_object_yields_no_corrupt_event_and_resumes(
    admin_config: ClusterConfig, proxy: FaultProxy, transport: Transport, namespace: str
) -> None:
    big = "a" * 600_000
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    await transport.request("POST", base, body=configmap("big", {"v": big}))
    async with Transport(_via(admin_config, proxy)) as proxied:
        informer = SharedInformer(
            proxied, await Discovery(proxied).resolve("v1", "ConfigMap"), namespace=namespace
        )
        recorder = Recorder()
        informer.add_handler(recorder)
        informer.start()
        try:
            assert await informer.wait_for_sync(30)
            restarts = sample(
                "informer_watch_restarts_total", resource="configmaps", reason="connection lost"
            )
            proxy.cut_after(100_000)  # the next event (~600 kB) is cut a sixth of the way in
            new = "b" * 600_000
            await transport.request(
                "PATCH",
                f"{base}/big",
                body={"data": {"v": new}},
                content_type="application/merge-patch+json",
            )
            _, obj = await recorder.wait_for(named("big", "MODIFIED"))
            assert obj["data"]["v"] == new
            assert proxy.cuts >= 1
            assert (
                sample(
                    "informer_watch_restarts_total", resource="configmaps", reason="connection lost"
                )
                > restarts
            )
            # Every object any handler ever saw was whole (on an existing cluster the
            # namespace also holds the cluster's root CA ConfigMap).
            seen = [o for _, o, _ in recorder.deltas if o["metadata"]["name"] == "big"]
            assert seen and all(o["data"]["v"] in (big, new) for o in seen)
            cached = informer.store.get(f"{namespace}/big")
            assert cached is not None and cached["data"]["v"] == new
        finally:
            await informer.stop()


async def test_half_open_connection_is_detected_by_the_idle_timer(
    admin_config: ClusterConfig, proxy: FaultProxy, transport: Transport, namespace: str
) -> None:
    """A frozen proxy delivers nothing, not even the end of the stream: only the idle timer
    can tell. The informer reconnects and catches up once bytes flow again."""
    options = ReflectorOptions(watch_timeout_min=2, watch_timeout_max=3, idle_margin=1.0)
    async with Transport(_via(admin_config, proxy)) as proxied:
        informer = SharedInformer(
            proxied,
            await Discovery(transport).resolve("v1", "ConfigMap"),
            namespace=namespace,
            options=options,
        )
        informer.start()
        try:
            assert await informer.wait_for_sync(30)
            await eventually(
                lambda: _watches_open("configmaps") == 1, timeout=30, what="the watch to open"
            )
            before = sample(
                "informer_watch_restarts_total", resource="configmaps", reason="idle timeout"
            )
            proxy.freeze()
            base = f"/api/v1/namespaces/{namespace}/configmaps"
            await transport.request("POST", base, body=configmap("during-freeze"))
            await eventually(
                lambda: (
                    sample(
                        "informer_watch_restarts_total",
                        resource="configmaps",
                        reason="idle timeout",
                    )
                    > before
                ),
                timeout=30,
                what="the idle timer to fire",
            )
            assert f"{namespace}/during-freeze" not in informer.store
            # The re-opened watch gets no response headers through the frozen proxy.
            assert _watches_open("configmaps") == 0
            proxy.thaw()
            await eventually(
                lambda: f"{namespace}/during-freeze" in informer.store,
                timeout=60,
                what="catch-up after thaw",
            )
            await eventually(
                lambda: _watches_open("configmaps") == 1, timeout=30, what="the watch to reopen"
            )
        finally:
            await informer.stop()
        assert _watches_open("configmaps") == 0


def _watches_open(resource: str) -> float:
    return sample("informer_watches_open", resource=resource)


async def test_server_timeout_rewatches_without_relist(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    options = ReflectorOptions(watch_timeout_min=2, watch_timeout_max=3)
    informer = SharedInformer(
        transport,
        await factory.discovery.resolve("v1", "Secret"),
        namespace=namespace,
        options=options,
    )
    informer.start()
    try:
        assert await informer.wait_for_sync(30)
        before = sample(
            "informer_watch_restarts_total", resource="secrets", reason="server closed the watch"
        )
        relists = sum_samples("informer_relists_total", resource="secrets")
        await eventually(
            lambda: (
                sample(
                    "informer_watch_restarts_total",
                    resource="secrets",
                    reason="server closed the watch",
                )
                >= before + 2
            ),
            timeout=20,
            what="two clean server timeouts",
        )
        assert sum_samples("informer_relists_total", resource="secrets") == relists
        assert informer.reflector.machine.backoff_step == 0
    finally:
        await informer.stop()


def sum_samples(name: str, **labels: str) -> float:
    total = 0.0
    for family in metrics.REGISTRY.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def test_bookmarks_advance_the_observed_resource_version(
    factory: InformerFactory, transport: Transport, namespace: str
) -> None:
    options = ReflectorOptions(watch_timeout_min=4, watch_timeout_max=5)
    informer = SharedInformer(
        transport,
        await factory.discovery.resolve(TASKS, "Task"),
        namespace=namespace,
        options=options,
    )
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    try:
        assert await informer.wait_for_sync(30)
        # Tasks in another namespace move the resource's resourceVersion; this namespaced
        # watch filters their events out, so only bookmarks can tell the informer.
        other = f"t-{uuid.uuid4().hex[:8]}"
        await transport.request("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})
        elsewhere = f"/apis/tasks.crpy.io/v1/namespaces/{other}/tasks"
        rv = await create_all(transport, elsewhere, [task(f"c{i}") for i in range(3)])
        bookmarks = sample("informer_events_total", resource="tasks.tasks.crpy.io", type="BOOKMARK")
        assert await informer.store.wait_for_resource_version(rv, timeout=30)
        assert (
            sample("informer_events_total", resource="tasks.tasks.crpy.io", type="BOOKMARK")
            > bookmarks
        )
        assert recorder.deltas == []
    finally:
        await informer.stop()


# -- faults that need a control plane of their own ---------------------------------------------


@pytest.fixture(scope="module")
def uncached_plane() -> Iterator[ControlPlane]:
    """Watches served straight from etcd, so etcd compaction produces real 410s."""
    if use_existing_cluster():
        pytest.skip("needs a local control plane with its own flags")
    with ControlPlane(extra_apiserver_args={"--watch-cache": "false"}) as p:
        yield p


async def _etcd_compact(plane: ControlPlane, revision: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{plane.etcd_url}/v3/kv/compaction",
            json={"revision": revision, "physical": True},
        ) as answer,
    ):
        assert answer.status == 200, await answer.text()


async def test_ten_thousand_objects_through_a_paginated_list(
    uncached_plane: ControlPlane,
) -> None:
    """With the watch cache on, a LIST at resourceVersion "0" is served whole from the cache
    (the server ignores ``limit``, as it may); without it, the pages are real."""
    config = await load_kubeconfig(uncached_plane.kubeconfig)
    pages: list[int] = []

    def observe(method: str, status: int, seconds: float) -> None:
        if method == "GET":
            pages.append(status)

    async with Transport(config) as admin, Transport(config, observer=observe) as counted:
        ns = f"t-{uuid.uuid4().hex[:8]}"
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        base = f"/apis/tasks.crpy.io/v1/namespaces/{ns}/tasks"
        await create_all(admin, base, [task(f"task-{i:05d}", 1 + i % 5) for i in range(10_000)])
        informer = SharedInformer(
            counted,
            await Discovery(admin).resolve(TASKS, "Task"),
            namespace=ns,
            options=ReflectorOptions(streaming_list=False),
        )
        informer.start()
        try:
            assert await informer.wait_for_sync(120)
            assert len(informer.store) == 10_000
            assert len(pages) >= 20  # 500 per page
            assert all(status == 200 for status in pages)
        finally:
            await informer.stop()


async def test_real_410_after_etcd_compaction_relists_and_converges(
    uncached_plane: ControlPlane,
) -> None:
    config = await load_kubeconfig(uncached_plane.kubeconfig)
    host, port = uncached_plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    async with Transport(config) as admin, Transport(_via(config, proxy)) as proxied:
        ns = f"t-{uuid.uuid4().hex[:8]}"
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        base = f"/api/v1/namespaces/{ns}/configmaps"
        await create_all(admin, base, [configmap(f"cm{i}") for i in range(5)])
        informer = SharedInformer(
            proxied, await Discovery(proxied).resolve("v1", "ConfigMap"), namespace=ns
        )
        informer.start()
        try:
            assert await informer.wait_for_sync(30)
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
            rv = await create_all(admin, base, [configmap("new")])
            await _etcd_compact(uncached_plane, rv)
            proxy.cut_all()
            proxy.thaw()
            await eventually(lambda: f"{ns}/new" in informer.store, what="relist after 410")
            assert f"{ns}/cm0" not in informer.store
            cm1 = informer.store.get(f"{ns}/cm1")
            assert cm1 is not None and cm1["data"] == {"k": "v"}
            assert (
                sample("informer_relists_total", resource="configmaps", reason="watch expired")
                > expired
            )
        finally:
            await informer.stop()
            await proxy.stop()


async def test_api_server_restart_recovers_and_converges(uncached_plane: ControlPlane) -> None:
    config = await load_kubeconfig(uncached_plane.kubeconfig)
    async with Transport(config) as admin:
        ns = f"t-{uuid.uuid4().hex[:8]}"
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        informer = SharedInformer(
            admin, await Discovery(admin).resolve("v1", "ConfigMap"), namespace=ns
        )
        recorder = Recorder()
        informer.add_handler(recorder)
        informer.start()
        try:
            assert await informer.wait_for_sync(30)
            await asyncio.to_thread(uncached_plane.stop_apiserver)
            await asyncio.to_thread(uncached_plane.start_apiserver)
            await admin.request(
                "POST", f"/api/v1/namespaces/{ns}/configmaps", body=configmap("after")
            )
            await recorder.wait_for(named("after", "ADDED"), timeout=90)
            assert f"{ns}/after" in informer.store
        finally:
            await informer.stop()


async def test_real_429s_from_flow_control_are_honoured(throttled_plane: ControlPlane) -> None:
    await grant_list_configmaps(throttled_plane, "reader")
    # system:masters is exempt from the in-flight limit; a plain user is not.
    reader = throttled_plane.mint_identity("reader")
    statuses: list[int] = []
    config = await load_kubeconfig(reader.kubeconfig)
    async with Transport(config, observer=lambda m, s, t: statuses.append(s)) as limited:
        await until_allowed(limited, "list", "configmaps")
        answers = await asyncio.gather(
            *(limited.get_json("/api/v1/namespaces/default/configmaps") for _ in range(40))
        )
        assert all(a["kind"] == "ConfigMapList" for a in answers)
        assert 429 in statuses, "flow control never pushed back"


# -- issue 12: robustness ----------------------------------------------------------------------


async def test_a_slow_handler_is_not_a_dead_connection_and_loses_no_event(
    transport: Transport, namespace: str
) -> None:
    """A coroutine handler with a one-slot buffer, far slower than the idle window: the reader
    waits on it for many idle windows. The idle timer must not fire (the server was not
    silent), and the handler must get every object."""
    # Idle window 5-6 s (the margin leaves a loaded server 1 s to close at its timeout); the
    # events queued behind the handler take ~8 s to hand over.
    options = ReflectorOptions(watch_timeout_min=4, watch_timeout_max=5, idle_margin=1.0)
    informer = SharedInformer(
        transport,
        await Discovery(transport).resolve("v1", "ConfigMap"),
        namespace=namespace,
        options=options,
    )
    got: list[str] = []
    done = asyncio.Event()
    names = [f"cm-{i:03d}" for i in range(80)]

    async def slow(delta: StoreDelta, initial: bool) -> None:
        await asyncio.sleep(0.1)  # a slow handler
        got.append(delta.key.split("/", 1)[1])
        if set(names) <= set(got):
            done.set()

    informer.add_handler(slow, buffer_size=1)
    informer.start()
    try:
        assert await informer.wait_for_sync(30)
        idle_before = sample(
            "informer_watch_restarts_total", resource="configmaps", reason="idle timeout"
        )
        base = f"/api/v1/namespaces/{namespace}/configmaps"
        await create_all(transport, base, [configmap(n) for n in names], concurrency=8)
        await asyncio.wait_for(done.wait(), 120)
        assert sorted(set(got) - {ROOT_CA_CONFIGMAP}) == names  # the cluster's, if any
        assert (
            sample("informer_watch_restarts_total", resource="configmaps", reason="idle timeout")
            == idle_before
        )
    finally:
        await informer.stop()


async def test_uid_change_behind_a_410_reaches_handlers_as_delete_then_add(
    uncached_plane: ControlPlane,
) -> None:
    """A Task deleted and re-created with the same name (both at generation 1) while the
    informer was cut off, then a 410 and a relist: handlers see the old one deleted and the
    new one added, so GenerationChanged lets the new one through."""
    config = await load_kubeconfig(uncached_plane.kubeconfig)
    host, port = uncached_plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    async with Transport(config) as admin, Transport(_via(config, proxy)) as proxied:
        ns = f"t-{uuid.uuid4().hex[:8]}"
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        base = f"/apis/tasks.crpy.io/v1/namespaces/{ns}/tasks"
        old = (await admin.request("POST", base, body=task("same"))).json()
        informer = SharedInformer(
            proxied, await Discovery(proxied).resolve(TASKS, "Task"), namespace=ns
        )
        recorder = Recorder()
        passed: list[str] = []
        predicate = GenerationChanged()

        def reconcile_if_new(delta: StoreDelta, initial: bool) -> None:
            if predicate(delta):
                passed.append(delta.obj["metadata"]["uid"])

        informer.add_handler(recorder)
        informer.add_handler(reconcile_if_new)
        informer.start()
        try:
            assert await informer.wait_for_sync(30)
            proxy.freeze()
            await admin.request("DELETE", f"{base}/same")
            new = (await admin.request("POST", base, body=task("same"))).json()
            assert new["metadata"]["generation"] == old["metadata"]["generation"] == 1
            rv = await create_all(admin, base, [task("marker")])
            await _etcd_compact(uncached_plane, rv)
            proxy.cut_all()
            proxy.thaw()
            new_uid = new["metadata"]["uid"]
            await recorder.wait_for(
                lambda k, o: k == "ADDED" and o["metadata"]["uid"] == new_uid, timeout=60
            )
            events = [
                (k, o["metadata"]["uid"])
                for k, o, _ in recorder.deltas
                if o["metadata"]["name"] == "same"
            ]
            old_uid = old["metadata"]["uid"]
            assert ("DELETED", old_uid) in events
            assert events.index(("DELETED", old_uid)) < events.index(("ADDED", new_uid))
            assert all(
                uid == old_uid or kind == "ADDED" for kind, uid in events if kind != "DELETED"
            )
            assert new_uid in passed
            assert informer.store.uid_of(f"{ns}/same") == new_uid
        finally:
            await informer.stop()
            await proxy.stop()


class _FlakyConnector(aiohttp.TCPConnector):
    """Raises ``error`` from the next connect, once."""

    error: BaseException | None = None

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return await super().connect(req, traces, timeout)


class _FlakyTransport(Transport):
    """A real transport whose watch connections go through a :class:`_FlakyConnector`."""

    def __init__(self, config: ClusterConfig) -> None:
        super().__init__(config)
        self.connector: _FlakyConnector | None = None

    def _sessions(self) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
        if self._watch_session is None or self._watch_session.closed:
            self.connector = _FlakyConnector(ssl=self.config.ssl_context, limit=0)
            self._watch_session = aiohttp.ClientSession(
                connector=self.connector, timeout=self._watch_timeout, headers=self._headers
            )
        return super()._sessions()


async def test_uvloop_fd_error_on_a_watch_is_a_connection_failure_and_a_crash_is_supervised(
    admin_config: ClusterConfig, proxy: FaultProxy, transport: Transport, namespace: str
) -> None:
    """A RuntimeError like uvloop's while reconnecting a watch is a connection failure (the
    reflector backs off and re-watches, never ends). An exception that is no connection error
    at all ends the reflector: its informer restarts it, and reports unhealthy meanwhile."""
    options = ReflectorOptions(watch_timeout_min=30, watch_timeout_max=31)
    resource = await Discovery(transport).resolve("v1", "ConfigMap")
    label = resource.group_resource
    flaky = _FlakyTransport(_via(admin_config, proxy))
    async with flaky:
        factory = InformerFactory(flaky, options=options)
        informer = await factory.informer("v1", "ConfigMap", namespace=namespace)
        recorder = Recorder()
        informer.add_handler(recorder)
        base = f"/api/v1/namespaces/{namespace}/configmaps"
        try:
            assert await informer.wait_for_sync(30)
            assert informer.healthy and factory.unhealthy() == []
            restarts = sample("informer_reflector_restarts_total", resource=label)
            assert flaky.connector is not None
            flaky.connector.error = RuntimeError("File descriptor 9 is used by transport")
            proxy.cut_all()  # the re-watch meets the error
            await transport.request("POST", base, body=configmap("after-fd-error"))
            await recorder.wait_for(named("after-fd-error", "ADDED"), timeout=60)
            assert sample("informer_reflector_restarts_total", resource=label) == restarts
            assert informer.healthy

            # Not a connection error at all: the reflector ends; the informer restarts it.
            flaky.connector.error = ZeroDivisionError("a bug")
            proxy.cut_all()
            await eventually(
                lambda: sample("informer_reflector_restarts_total", resource=label) > restarts,
                what="the reflector to crash and be counted",
            )
            assert not informer.healthy and factory.unhealthy() == [informer]
            await transport.request("POST", base, body=configmap("after-crash"))
            await recorder.wait_for(named("after-crash", "ADDED"), timeout=60)
            await eventually(lambda: informer.healthy, what="health after the relist")
            assert factory.unhealthy() == []
        finally:
            await factory.stop()


@pytest.fixture
async def opening_proxy(control_plane: ControlPlane) -> AsyncIterator[FaultProxy]:
    """A fault proxy that terminates TLS (serving the API server's own certificate, calling
    upstream as the admin), so that it can inject lines into watch responses."""
    if use_existing_cluster():
        pytest.skip("needs the local control plane's certificates")
    pki = control_plane.workdir / "pki"
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
    upstream = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    upstream.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    p = await FaultProxy(host, int(port), tls=(serving, upstream)).start()
    yield p
    await p.stop()


@pytest.mark.parametrize(
    "case",
    [
        (b'{"type":"ADDED","object":null}', ("informer_malformed_events_total", "what", "event")),
        (
            b'{"type":"MODIFIED","object":{"metadata":"text"}}',
            ("informer_malformed_events_total", "what", "object"),
        ),
        (b'{"type":{"x":1},"object":{}}', ("informer_malformed_events_total", "what", "event")),
        (b'{"type":"BOOKMARK","object":null}', ("informer_events_total", "type", "BOOKMARK")),
        (
            b'{"type":"ERROR","object":null}',
            ("informer_relists_total", "reason", "watch failed (500)"),
        ),
        (b"\x00\xffnot json", ("informer_malformed_events_total", "what", "event")),
    ],
)
async def test_a_malformed_line_on_a_real_watch_relists_and_the_informer_goes_on(
    admin_config: ClusterConfig,
    opening_proxy: FaultProxy,
    transport: Transport,
    namespace: str,
    case: tuple[bytes, tuple[str, str, str]],
) -> None:
    """The line really reaches the reflector (the metric that names its fate moves), and the
    informer goes on, on the same reflector task."""
    resource = await Discovery(transport).resolve("v1", "ConfigMap")
    label = resource.group_resource
    line, (metric, key, value) = case
    seen_before = sample(metric, resource=label, **{key: value})
    async with Transport(_via(admin_config, opening_proxy)) as proxied:
        informer = SharedInformer(proxied, resource, namespace=namespace)
        recorder = Recorder()
        informer.add_handler(recorder)
        informer.start()
        base = f"/api/v1/namespaces/{namespace}/configmaps"
        try:
            assert await informer.wait_for_sync(30)
            task = informer._task
            restarts = sample("informer_reflector_restarts_total", resource=label)
            await transport.request("POST", base, body=configmap("before"))
            await recorder.wait_for(named("before", "ADDED"))
            await eventually(lambda: opening_proxy.inject_line(line) > 0, what="an open watch")
            await transport.request("POST", base, body=configmap("after"))
            await recorder.wait_for(named("after", "ADDED"), timeout=60)
            assert f"{namespace}/before" in informer.store
            assert informer._task is task and informer.healthy
            assert sample("informer_reflector_restarts_total", resource=label) == restarts
            assert sample(metric, resource=label, **{key: value}) > seen_before
        finally:
            await informer.stop()


async def test_watch_latency_delays_the_watch_and_not_the_reads(
    admin_config: ClusterConfig, opening_proxy: FaultProxy, transport: Transport, namespace: str
) -> None:
    """The proxy's ``watch_latency`` holds back what watches receive, in order, while a read
    through the same proxy sees the server's current state: a cache that lags behind live
    reads, as a new leader's may."""
    resource = await Discovery(transport).resolve("v1", "ConfigMap")
    lag = 5.0
    async with Transport(_via(admin_config, opening_proxy)) as proxied:
        informer = SharedInformer(proxied, resource, namespace=namespace)
        recorder = Recorder()
        informer.add_handler(recorder)
        informer.start()
        base = f"/api/v1/namespaces/{namespace}/configmaps"
        try:
            assert await informer.wait_for_sync(30)
            opening_proxy.watch_latency = lag
            loop = asyncio.get_running_loop()
            created_at = loop.time()
            await transport.request("POST", base, body=configmap("first"))
            await transport.request("POST", base, body=configmap("second"))
            read = await proxied.get_json(f"{base}/second")
            assert read["metadata"]["name"] == "second"
            assert f"{namespace}/first" not in informer.store, "the watch was not delayed"
            await recorder.wait_for(named("second", "ADDED"), timeout=60)
            assert loop.time() - created_at >= lag
            added = [o["metadata"]["name"] for k, o, _ in recorder.deltas if k == "ADDED"]
            assert added[-2:] == ["first", "second"]
        finally:
            opening_proxy.watch_latency = 0.0
            await informer.stop()


async def test_a_streaming_list_waits_for_a_slow_answer_and_a_plain_watch_does_not(
    admin_config: ClusterConfig,
    opening_proxy: FaultProxy,
    transport: Transport,
    namespace: str,
    *,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server answers a streaming list only once it has its initial events, which at
    a million objects took longer than a plain watch's handshake bound. With every watch
    answer held back longer than that bound (scaled down here): the streaming list waits
    and syncs without falling back to LIST, while a plain watch still gives up at the
    bound."""
    monkeypatch.setattr(reflector, "WATCH_HANDSHAKE_TIMEOUT", 0.5)
    opening_proxy.watch_latency = 2.0
    resource = await Discovery(transport).resolve("v1", "ConfigMap")
    await transport.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap("present")
    )
    caplog.set_level(logging.DEBUG, logger="informers")
    async with Transport(_via(admin_config, opening_proxy)) as proxied:
        streaming = SharedInformer(proxied, resource, namespace=namespace)
        streaming.start()
        try:
            assert await streaming.wait_for_sync(30)
            assert f"{namespace}/present" in streaming.store
        finally:
            await streaming.stop()
        assert "falling back to LIST" not in caplog.text
        assert "no response to the watch request" not in caplog.text

        plain = SharedInformer(
            proxied,
            resource,
            namespace=namespace,
            options=ReflectorOptions(streaming_list=False),
        )
        plain.start()
        try:
            assert await plain.wait_for_sync(30)  # a LIST: not held back
            await eventually(
                lambda: "no response to the watch request" in caplog.text,
                timeout=30,
                what="the plain watch to give up at its handshake bound",
            )
        finally:
            await plain.stop()
