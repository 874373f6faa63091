"""The proof of the read-your-own-writes guard, on the real control plane.

A reconciler that reads after its own write: for each Task it wants exactly one child
ConfigMap, and creates one (with ``generateName``) when its cache shows none. The informers
see the API server through a proxy that delays everything by 0.4 s (injected informer lag),
while writes go straight to the server, and every reconcile asks to run again 50 ms later.

* Guard off: a reconcile runs before the cache has seen the child it just created, sees
  none, and creates a second one: the wrong action, every time the lag is longer than the
  requeue.
* Guard on: the reconcile of that Task is requeued (not blocked) until the cache has
  observed the write; no second child is ever created.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from controller_runtime import ControllerBuilder, ControllerOptions, Request, Result
from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.consistency import ReadYourWritesGuard
from controller_runtime.controller import Controller
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.metrics import REGISTRY
from controller_runtime.reconcile import ConsistencyGuard
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.discovery import ResourceInfo
from kubeclient.transport import Transport

pytestmark = pytest.mark.integration

TASKS = "tasks.crpy.io/v1"
PARENTS = 8
LAG = 0.4
REQUEUE = 0.05
RECONCILES_PER_PARENT = 12


class TimedGuard:
    """Wraps the real guard and measures, per write, how long until the cache caught up."""

    def __init__(self, guard: ReadYourWritesGuard) -> None:
        self.guard = guard
        self.stale_since: dict[Request, float] = {}
        self.catch_up: list[float] = []
        self.skips = 0

    def record_write(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        self.guard.record_write(request, resource, obj)

    def record_delete(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        self.guard.record_delete(request, resource, obj)

    def check(self, request: Request) -> float | None:
        delay = self.guard.check(request)
        now = time.monotonic()
        if delay is not None:
            self.skips += 1
            self.stale_since.setdefault(request, now)
        elif request in self.stale_since:
            self.catch_up.append(now - self.stale_since.pop(request))
        return delay


@dataclasses.dataclass
class Run:
    created: dict[str, int]
    reconciles: int
    guard: TimedGuard | None


@pytest.fixture
async def lagging(
    admin_config: ClusterConfig,
) -> AsyncIterator[tuple[Transport, Transport, FaultProxy]]:
    host, port = admin_config.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    proxy.latency = LAG
    async with (
        Transport(dataclasses.replace(admin_config, server=proxy.url)) as watching,
        Transport(admin_config) as writing,
    ):
        yield watching, writing, proxy
    await proxy.stop()


async def run_scenario(
    watching: Transport,
    writing: Transport,
    namespace: str,
    *,
    guarded: bool,
    memory_limit: int | None = None,
) -> Run:
    """``memory_limit``: the cache's budget (0: it holds the metadata of every object and
    no body, so each read of a child is a live GET, at no older a version than cached)."""
    factory = InformerFactory(watching)
    cache = Cache(factory, namespaces=[namespace], memory_limit=memory_limit)
    client = Client(writing, cache)
    created: dict[str, int] = {}
    reconciles = 0
    timed: TimedGuard | None = None

    async def reconcile(request: Request) -> Result | None:
        nonlocal reconciles
        reconciles += 1
        children = await client.list(
            "v1", "ConfigMap", namespace=request.namespace, label_selector=f"parent={request.name}"
        )
        if not children:
            await client.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "generateName": f"{request.name}-child-",
                        "namespace": request.namespace,
                        "labels": {"parent": request.name},
                    },
                }
            )
            created[request.name] = created.get(request.name, 0) + 1
        if reconciles < PARENTS * RECONCILES_PER_PARENT:
            return Result(requeue_after=REQUEUE)
        return None

    def guard_factory(name: str) -> ConsistencyGuard:
        nonlocal timed
        timed = TimedGuard(ReadYourWritesGuard(name, cache))
        return timed

    controller = await _build(cache, guard_factory if guarded else None, reconcile)
    await cache.watch("v1", "ConfigMap")
    await cache.wait_for_sync(30)
    await controller.start()
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    for i in range(PARENTS):
        body = {
            "apiVersion": TASKS,
            "kind": "Task",
            "metadata": {"name": f"p{i}"},
            "spec": {"priority": 1},
        }
        await writing.request("POST", base, body=body)
    deadline = time.monotonic() + 60
    while reconciles < PARENTS * RECONCILES_PER_PARENT:
        assert time.monotonic() < deadline, f"only {reconciles} reconciles"
        await asyncio.sleep(0.05)
    await controller.stop()
    await cache.stop()
    return Run(created, reconciles, timed)


async def _build(
    cache: Cache,
    guard_factory: Callable[[str], ConsistencyGuard] | None,
    reconcile: Callable[[Request], Awaitable[Result | None]],
) -> Controller:
    return await (
        ControllerBuilder(cache, guard_factory=guard_factory)
        .named(f"proof-{uuid.uuid4().hex[:8]}")
        .for_(TASKS, "Task")
        .with_options(ControllerOptions(max_concurrent_reconciles=4))
        .complete(reconcile)
    )


async def _children(transport: Transport, namespace: str) -> dict[str, int]:
    listed = await transport.get_json(f"/api/v1/namespaces/{namespace}/configmaps")
    counts: dict[str, int] = {}
    for item in listed["items"]:
        parent = (item["metadata"].get("labels") or {}).get("parent")
        if parent:
            counts[parent] = counts.get(parent, 0) + 1
    return counts


async def test_without_the_guard_a_lagging_cache_causes_duplicate_children(
    lagging: tuple[Transport, Transport, FaultProxy], namespace: str
) -> None:
    watching, writing, _ = lagging
    run = await run_scenario(watching, writing, namespace, guarded=False)
    on_server = await _children(writing, namespace)
    assert on_server == run.created
    duplicated = {parent: n for parent, n in on_server.items() if n > 1}
    assert duplicated, f"expected the wrong action under {LAG}s lag; children: {on_server}"


async def test_with_the_guard_no_reconcile_acts_on_a_stale_cache(
    lagging: tuple[Transport, Transport, FaultProxy], namespace: str
) -> None:
    watching, writing, _ = lagging
    run = await run_scenario(watching, writing, namespace, guarded=True)
    on_server = await _children(writing, namespace)
    assert on_server == {f"p{i}": 1 for i in range(PARENTS)}
    assert run.guard is not None
    assert run.guard.skips > 0, "the lag never made the guard requeue: the test proves nothing"
    catch_up = sorted(run.guard.catch_up)
    assert catch_up, "no stale reconcile ever caught up"
    median = statistics.median(catch_up)
    p99 = catch_up[min(len(catch_up) - 1, int(0.99 * len(catch_up)))]
    assert median >= LAG * 0.5  # it waited for the lag, roughly, not for nothing
    skips_metric = sum(
        s.value
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == "controller_runtime_stale_skips_total"
    )
    assert skips_metric >= run.guard.skips
    print(
        f"guard: {run.guard.skips} requeues over {run.reconciles} reconciles; catch-up "
        f"median {median * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (n={len(catch_up)})"
    )
