"""Controllers on the real control plane: a controller over the Task CRD reconciles creates,
updates and deletes; changes to owned ConfigMaps trigger their owner; predicates filter; and
under a flood of updates no key is ever reconciled concurrently.

Objects are written through the raw admin ``transport``. "Nothing was reconciled" is checked
deterministically: a second handler registered on the same informer after the controller's
sees each delta right after the controller's handler did (both are called inline, in order),
so once it has seen a change, any reconcile that change caused is either still queued or has
already started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

import pytest

from controller_runtime import metrics
from controller_runtime.builder import ControllerBuilder
from controller_runtime.cache import Cache
from controller_runtime.controller import Controller
from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.handlers import EnqueueRequestsFromMapFunc
from controller_runtime.predicates import GenerationChanged, LabelSelectorPredicate
from controller_runtime.reconcile import Request, Result
from controller_runtime.testing import eventually
from informers.shared import InformerFactory
from informers.store import StoreDelta
from kubeclient.config import ClusterConfig
from kubeclient.errors import ConflictError, NotFoundError
from kubeclient.transport import Transport

pytestmark = pytest.mark.integration

TASKS = "tasks.crpy.io/v1"
MERGE = "application/merge-patch+json"


def tasks_path(namespace: str, name: str = "", subresource: str = "") -> str:
    path = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    return "/".join(p for p in (path, name, subresource) if p)


def configmaps_path(namespace: str, name: str = "") -> str:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    return f"{path}/{name}" if name else path


def task(name: str, priority: int = 1, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"priority": priority, "deadline": "2030-01-01T00:00:00Z"},
    }


async def create_task(transport: Transport, namespace: str, name: str) -> dict[str, Any]:
    created = await transport.request("POST", tasks_path(namespace), body=task(name))
    return created.json()  # type: ignore[no-any-return]


async def patch(transport: Transport, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    response = await transport.request("PATCH", path, body=body, content_type=MERGE)
    return response.json()  # type: ignore[no-any-return]


def owner_reference(owner: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": controller,
    }


def sample(metric: str, controller: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(metric, {"controller": controller, **labels})
    return value or 0.0


class Seen:
    """What a reconciler saw: (request, cached object or None), with waiting."""

    def __init__(self) -> None:
        self.entries: list[tuple[Request, dict[str, Any] | None]] = []
        self._changed = asyncio.Event()

    def add(self, request: Request, obj: dict[str, Any] | None) -> None:
        self.entries.append((request, obj))
        self._changed.set()

    def count(self, name: str) -> int:
        return sum(1 for r, _ in self.entries if r.name == name)

    async def wait_for(
        self,
        name: str,
        condition: Callable[[dict[str, Any] | None], bool],
        timeout: float = 30.0,
        *,
        after: int = 0,
    ) -> dict[str, Any] | None:
        """The first object ``name``'s reconciles saw that satisfies ``condition``, skipping
        the first ``after`` reconciles of ``name``."""

        async def scan() -> dict[str, Any] | None:
            seen = 0
            skip = after
            while True:
                for request, obj in self.entries[seen:]:
                    if request.name != name:
                        continue
                    if skip:
                        skip -= 1
                    elif condition(obj):
                        return obj
                seen = len(self.entries)
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def wait_total(self, n: int, timeout: float = 30.0) -> None:
        """Until ``n`` reconciles (of any name) have been seen."""

        async def count() -> None:
            while len(self.entries) < n:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(count(), timeout)


class DeltaWatcher:
    """An informer handler that lets the test await a delta."""

    def __init__(self) -> None:
        self.deltas: list[StoreDelta] = []
        self._changed = asyncio.Event()

    def __call__(self, delta: StoreDelta, initial: bool) -> None:
        self.deltas.append(delta)
        self._changed.set()

    async def wait_for(
        self, condition: Callable[[StoreDelta], bool], timeout: float = 30.0
    ) -> None:
        async def scan() -> None:
            seen = 0
            while True:
                if any(condition(d) for d in self.deltas[seen:]):
                    return
                seen = len(self.deltas)
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(scan(), timeout)


def assert_nothing_queued(controller: Controller, seen: Seen, name: str, count: int) -> None:
    """No reconcile of ``name`` since ``count``, none queued, none running."""
    assert seen.count(name) == count
    assert len(controller.queue) == 0
    assert controller.active_workers == 0


@pytest.fixture
async def cache(transport: Transport, namespace: str) -> AsyncIterator[Cache]:
    c = Cache(InformerFactory(transport), namespaces=[namespace])
    yield c
    await c.stop()


@pytest.fixture
async def controllers() -> AsyncIterator[list[Controller]]:
    """Controllers to stop after the test."""
    started: list[Controller] = []
    yield started
    for controller in started:
        await controller.stop(drain_timeout=5)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_reconciles_creates_updates_and_deletes(
    cache: Cache, transport: Transport, namespace: str, controllers: list[Controller]
) -> None:
    seen = Seen()

    async def reconcile(request: Request) -> Result | None:
        try:
            obj = cache.get(TASKS, "Task", request)
        except NotFoundError:
            seen.add(request, None)  # deleted: nothing to do, not an error
            return None
        seen.add(request, obj)
        return None

    await create_task(transport, namespace, "before")  # reconciled from the initial list
    ctrl = (
        await ControllerBuilder(cache)
        .named(unique("tasks"))
        .for_(TASKS, "Task")
        .complete(reconcile)
    )
    controllers.append(ctrl)
    await ctrl.start()
    await seen.wait_for("before", lambda o: o is not None)

    await create_task(transport, namespace, "a")
    created = await seen.wait_for("a", lambda o: o is not None)
    assert created is not None and created["spec"]["priority"] == 1

    await patch(transport, tasks_path(namespace, "a"), {"spec": {"priority": 3}})
    await seen.wait_for("a", lambda o: o is not None and o["spec"]["priority"] == 3)

    await transport.request("DELETE", tasks_path(namespace, "a"))
    await seen.wait_for("a", lambda o: o is None)

    assert all(r == Request(namespace, r.name) for r, _ in seen.entries)
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 0
    assert sample("controller_runtime_reconcile_total", ctrl.name, result="success") >= 4


async def test_changes_to_owned_objects_trigger_their_owner(
    cache: Cache, transport: Transport, namespace: str, controllers: list[Controller]
) -> None:
    seen = Seen()

    async def reconcile(request: Request) -> None:
        try:
            obj = cache.get(TASKS, "Task", request)
        except NotFoundError:
            return
        owned = [
            cm
            for cm in cache.list("v1", "ConfigMap", namespace=request.namespace)
            if any(
                ref.get("uid") == obj["metadata"]["uid"]
                for ref in cm["metadata"].get("ownerReferences", [])
            )
        ]
        seen.add(request, {"data": [cm.get("data", {}) for cm in owned]})

    ctrl = await (
        ControllerBuilder(cache)
        .named(unique("owner"))
        .for_(TASKS, "Task")
        .owns("v1", "ConfigMap")
        .complete(reconcile)
    )
    controllers.append(ctrl)
    watcher = DeltaWatcher()
    entry = cache.watched("v1", "ConfigMap")
    assert entry is not None
    entry.add_handler(watcher)  # after the controller's handler: sees deltas after it
    await ctrl.start()

    owner = await create_task(transport, namespace, "t")
    await seen.wait_for("t", lambda o: o == {"data": []})

    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "ownerReferences": [owner_reference(owner)]},
        "data": {"v": "1"},
    }
    await transport.request("POST", configmaps_path(namespace), body=cm)
    await seen.wait_for("t", lambda o: o == {"data": [{"v": "1"}]})
    await patch(transport, configmaps_path(namespace, "cm"), {"data": {"v": "2"}})
    await seen.wait_for("t", lambda o: o == {"data": [{"v": "2"}]})
    before_delete = seen.count("t")
    await transport.request("DELETE", configmaps_path(namespace, "cm"))
    # after=: the Task's very first reconcile also saw no ConfigMap; wait for a new one.
    await seen.wait_for("t", lambda o: o == {"data": []}, after=before_delete)

    # Neither an unowned ConfigMap nor one the Task owns without being its controller
    # triggers a reconcile.
    count = seen.count("t")
    unowned = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unowned"}}
    await transport.request("POST", configmaps_path(namespace), body=unowned)
    weak = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "weak", "ownerReferences": [owner_reference(owner, controller=False)]},
    }
    await transport.request("POST", configmaps_path(namespace), body=weak)
    await watcher.wait_for(lambda d: d.obj["metadata"]["name"] == "weak")
    assert_nothing_queued(ctrl, seen, "t", count)
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 0


async def test_predicates_filter_events(
    cache: Cache, transport: Transport, namespace: str, controllers: list[Controller]
) -> None:
    seen = Seen()

    async def reconcile(request: Request) -> None:
        try:
            seen.add(request, cache.get(TASKS, "Task", request))
        except NotFoundError:
            seen.add(request, None)

    def configmap_to_task(obj: Mapping[str, Any]) -> Iterable[Request]:
        target = (obj["metadata"].get("labels") or {}).get("crpy.io/task")
        return [Request(obj["metadata"]["namespace"], target)] if target else []

    ctrl = await (
        ControllerBuilder(cache)
        .named(unique("filtered"))
        .for_(TASKS, "Task", predicates=[GenerationChanged()])
        .watches(
            "v1",
            "ConfigMap",
            EnqueueRequestsFromMapFunc(configmap_to_task),
            predicates=[LabelSelectorPredicate("crpy.io/watched=yes")],
        )
        .complete(reconcile)
    )
    controllers.append(ctrl)
    tasks_watcher, cms_watcher = DeltaWatcher(), DeltaWatcher()
    for kind, api_version, watcher in (
        ("Task", TASKS, tasks_watcher),
        ("ConfigMap", "v1", cms_watcher),
    ):
        entry = cache.watched(api_version, kind)
        assert entry is not None
        entry.add_handler(watcher)
    await ctrl.start()

    await create_task(transport, namespace, "t")
    await seen.wait_for("t", lambda o: o is not None and o["metadata"]["generation"] == 1)

    # A status-only write (the CRD has the status subresource): generation unchanged.
    await patch(
        transport, tasks_path(namespace, "t", "status"), {"status": {"state": "InProgress"}}
    )
    await tasks_watcher.wait_for(lambda d: d.obj.get("status", {}).get("state") == "InProgress")
    assert_nothing_queued(ctrl, seen, "t", 1)

    # A label-only change: generation unchanged.
    await patch(transport, tasks_path(namespace, "t"), {"metadata": {"labels": {"x": "y"}}})
    await tasks_watcher.wait_for(lambda d: d.obj["metadata"].get("labels") == {"x": "y"})
    assert_nothing_queued(ctrl, seen, "t", 1)

    # A ConfigMap pointing at the task but outside the label selector.
    ignored = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ignored", "labels": {"crpy.io/task": "t"}},
    }
    await transport.request("POST", configmaps_path(namespace), body=ignored)
    await cms_watcher.wait_for(lambda d: d.obj["metadata"]["name"] == "ignored")
    assert_nothing_queued(ctrl, seen, "t", 1)

    # A spec change passes, and that reconcile sees the state the skipped events left.
    await patch(transport, tasks_path(namespace, "t"), {"spec": {"priority": 2}})
    obj = await seen.wait_for("t", lambda o: o is not None and o["metadata"]["generation"] == 2)
    assert obj is not None
    assert obj["status"]["state"] == "InProgress" and obj["metadata"]["labels"] == {"x": "y"}
    assert seen.count("t") == 2

    # A ConfigMap inside the selector is mapped to the task.
    watched = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "watched", "labels": {"crpy.io/task": "t", "crpy.io/watched": "yes"}},
    }
    await transport.request("POST", configmaps_path(namespace), body=watched)
    await seen.wait_for("t", lambda o: True, after=2)
    assert seen.count("t") == 3


async def test_no_key_is_reconciled_concurrently_under_a_flood_of_updates(
    cache: Cache, transport: Transport, namespace: str, controllers: list[Controller]
) -> None:
    names = ["f0", "f1", "f2"]
    in_flight: set[str] = set()
    violations: list[str] = []
    max_parallel = 0
    reconciles = 0
    seen = Seen()

    async def reconcile(request: Request) -> None:
        nonlocal max_parallel, reconciles
        reconciles += 1
        if request.name in in_flight:
            violations.append(request.name)
        in_flight.add(request.name)
        max_parallel = max(max_parallel, len(in_flight))
        try:
            obj = cache.get(TASKS, "Task", request)
            await asyncio.sleep(0.005)  # the reconcile's "work": widens any overlap
            seen.add(request, obj)
        except NotFoundError:
            seen.add(request, None)
        finally:
            in_flight.discard(request.name)

    ctrl = await (
        ControllerBuilder(cache)
        .named(unique("flood"))
        .for_(TASKS, "Task")
        .with_options(max_concurrent_reconciles=4)
        .complete(reconcile)
    )
    controllers.append(ctrl)
    await ctrl.start()
    for name in names:
        await create_task(transport, namespace, name)

    patches = [(names[i % len(names)], i) for i in range(300)]

    async def patcher() -> None:
        while patches:
            name, i = patches.pop()
            await patch(transport, tasks_path(namespace, name), {"spec": {"details": str(i)}})

    await asyncio.gather(*(patcher() for _ in range(16)))
    for name in names:
        await patch(transport, tasks_path(namespace, name), {"spec": {"details": "final"}})
    for name in names:
        await seen.wait_for(
            name, lambda o: o is not None and o["spec"].get("details") == "final", timeout=60
        )

    assert violations == []
    assert max_parallel > 1, "different keys were never reconciled concurrently"
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 0
    assert reconciles >= len(names)


async def echo_controller(
    cache: Cache,
    reconcile: Callable[[Request], Awaitable[None]],
    controllers: list[Controller],
    *,
    skip: bool = True,
    workers: int = 1,
) -> tuple[Controller, DeltaWatcher]:
    """A started controller over Tasks (``skip_own_write_echoes=skip``), and a handler on its
    informer registered after the controller's, which sees each delta right after it."""
    ctrl = await (
        ControllerBuilder(cache)
        .named(unique("echoes"))
        .for_(TASKS, "Task")
        .with_options(skip_own_write_echoes=skip, max_concurrent_reconciles=workers)
        .complete(reconcile)
    )
    controllers.append(ctrl)
    watcher = DeltaWatcher()
    entry = cache.watched(TASKS, "Task")
    assert entry is not None
    entry.add_handler(watcher)
    await ctrl.start()
    return ctrl, watcher


@pytest.mark.parametrize("skip", [True, False])
async def test_the_echo_of_an_own_conditioned_write_is_not_reconciled_with_the_option(
    cache: Cache,
    transport: Transport,
    namespace: str,
    controllers: list[Controller],
    skip: bool,
) -> None:
    from controller_runtime.client import Client  # noqa: PLC0415
    from controller_runtime.consistency import OwnWriteEchoes  # noqa: PLC0415

    client = Client(transport, cache)
    seen, answered = Seen(), Seen()
    n = 10

    async def reconcile(request: Request) -> None:
        obj = cache.get(TASKS, "Task", request)
        seen.add(request, obj)
        if (obj.get("status") or {}).get("state") != "Done":
            rv = obj["metadata"]["resourceVersion"]
            status = {"metadata": {"resourceVersion": rv}, "status": {"state": "Done"}}
            answered.add(request, await client.patch_status(obj, status))

    ctrl, watcher = await echo_controller(cache, reconcile, controllers, skip=skip, workers=4)
    names = [f"t{i}" for i in range(n)]
    for name in names:
        await create_task(transport, namespace, name)

    def echoed() -> set[str]:
        return {
            d.obj["metadata"]["name"]
            for d in watcher.deltas
            if (d.obj.get("status") or {}).get("state") == "Done"
        }

    # Once every echo has reached the controller, each reconcile it caused is queued or running.
    await watcher.wait_for(lambda _: echoed() == set(names))
    # With the option, every echo is dropped, whether it came before or after its answer.
    expected = n if skip else 2 * n
    await seen.wait_total(expected)
    await answered.wait_total(n)
    if skip:
        assert isinstance(ctrl.echoes, OwnWriteEchoes)
        assert ctrl.echoes.skipped == n
        assert (ctrl.echoes.writes_in_flight, ctrl.echoes.deltas_held) == (0, 0)
    else:
        assert ctrl.echoes is None
    for name in names:
        assert seen.count(name) == expected // n
    assert len(seen.entries) == expected
    assert len(ctrl.queue) == 0

    # Someone else's change is reconciled as always.
    before = seen.count("t0")
    await patch(transport, tasks_path(namespace, "t0"), {"spec": {"priority": 3}})
    await seen.wait_for("t0", lambda o: (o or {}).get("spec", {}).get("priority") == 3)
    assert seen.count("t0") == before + 1


@pytest.fixture
async def proxy(control_plane: ControlPlane) -> AsyncIterator[FaultProxy]:
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    p = await FaultProxy(host, int(port)).start()
    yield p
    p.release_answers()
    await p.stop()


def is_done(name: str, delta: StoreDelta) -> bool:
    return (
        delta.obj["metadata"]["name"] == name
        and (delta.obj.get("status") or {}).get("state") == "Done"
    )


async def test_an_echo_that_arrives_before_its_answer_is_held_and_dropped(  # noqa: PLR0917 (fixtures)
    admin_config: ClusterConfig,
    proxy: FaultProxy,
    cache: Cache,
    transport: Transport,
    namespace: str,
    controllers: list[Controller],
) -> None:
    """The client writes through a proxy that holds the answers while the cache watches
    directly: each echo reaches the controller while its write is still in flight."""
    from controller_runtime.client import Client  # noqa: PLC0415
    from controller_runtime.consistency import OwnWriteEchoes  # noqa: PLC0415

    seen, answered = Seen(), Seen()
    async with Transport(dataclasses.replace(admin_config, server=proxy.url)) as slow:
        client = Client(slow, cache)
        # Kinds resolved and a connection open first: a TLS handshake would wait for held
        # answers too.
        await client.discovery.resolve(TASKS, "Task")
        await slow.request("GET", tasks_path(namespace))

        async def reconcile(request: Request) -> None:
            obj = cache.get(TASKS, "Task", request)
            seen.add(request, obj)
            if (obj.get("status") or {}).get("state") != "Done":
                rv = obj["metadata"]["resourceVersion"]
                status = {"metadata": {"resourceVersion": rv}, "status": {"state": "Done"}}
                answered.add(request, await client.patch_status(obj, status))

        ctrl, watcher = await echo_controller(cache, reconcile, controllers)
        echoes = ctrl.echoes
        assert isinstance(echoes, OwnWriteEchoes)
        names = ["t0", "t1", "t2"]
        for i, name in enumerate(names):
            proxy.hold_answers()
            await create_task(transport, namespace, name)
            await watcher.wait_for(partial(is_done, name))
            # The write took effect, its echo came, its answer has not: the echo is held.
            assert (echoes.writes_in_flight, echoes.deltas_held) == (1, 1)
            assert len(ctrl.queue) == 0
            proxy.release_answers()
            await answered.wait_total(i + 1)
            assert echoes.skipped_before_answer == i + 1
            assert (echoes.writes_in_flight, echoes.deltas_held) == (0, 0)
        assert [seen.count(name) for name in names] == [1, 1, 1]
        assert len(ctrl.queue) == 0


async def test_a_change_held_behind_a_write_that_fails_is_reconciled(  # noqa: PLR0917 (fixtures)
    admin_config: ClusterConfig,
    control_plane: ControlPlane,
    proxy: FaultProxy,
    transport: Transport,
    namespace: str,
    controllers: list[Controller],
) -> None:
    """Someone else's change comes from the very version our write was conditioned on, while
    that write is in flight: it is held, the write is refused (409), and the change reaches
    the controller. The cache watches through a second proxy, frozen while the write is sent,
    so that the change arrives after the write has left; the write's answer is held until the
    change has arrived."""
    from controller_runtime.client import Client  # noqa: PLC0415
    from controller_runtime.consistency import OwnWriteEchoes  # noqa: PLC0415

    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    watch_proxy = await FaultProxy(host, int(port)).start()
    seen = Seen()
    reading, go_on, refused = asyncio.Event(), asyncio.Event(), asyncio.Event()
    try:
        async with (
            Transport(dataclasses.replace(admin_config, server=watch_proxy.url)) as watching,
            Transport(dataclasses.replace(admin_config, server=proxy.url)) as slow,
        ):
            cache = Cache(InformerFactory(watching), namespaces=[namespace])
            client = Client(slow, cache)
            await client.discovery.resolve(TASKS, "Task")
            await slow.request("GET", tasks_path(namespace))  # a connection, before holding

            async def reconcile(request: Request) -> None:
                obj = cache.get(TASKS, "Task", request)
                seen.add(request, obj)
                if seen.count(request.name) > 1:
                    return
                reading.set()
                await go_on.wait()
                rv = obj["metadata"]["resourceVersion"]
                body = {"metadata": {"resourceVersion": rv}, "status": {"state": "Done"}}
                try:
                    await client.patch_status(obj, body)
                except ConflictError:
                    refused.set()  # and nothing else: no error, no requeue of its own

            try:
                ctrl, watcher = await echo_controller(cache, reconcile, controllers)
                echoes = ctrl.echoes
                assert isinstance(echoes, OwnWriteEchoes)
                await create_task(transport, namespace, "t0")
                await asyncio.wait_for(reading.wait(), 30)  # it read the created version

                watch_proxy.freeze()
                await patch(transport, tasks_path(namespace, "t0"), {"spec": {"priority": 4}})
                proxy.hold_answers()
                go_on.set()
                # The write has left (no event says so).
                await eventually(lambda: echoes.writes_in_flight == 1, interval=0.01)
                watch_proxy.thaw()
                await watcher.wait_for(lambda d: d.obj["spec"].get("priority") == 4)
                assert echoes.deltas_held == 1  # it might have been our echo
                assert seen.count("t0") == 1

                proxy.release_answers()
                await asyncio.wait_for(refused.wait(), 30)
                after = await seen.wait_for("t0", lambda o: True, after=1)
                assert after is not None and after["spec"]["priority"] == 4
                assert (echoes.skipped, echoes.writes_in_flight, echoes.deltas_held) == (0, 0, 0)
            finally:
                await cache.stop()
    finally:
        watch_proxy.thaw()
        await watch_proxy.stop()
