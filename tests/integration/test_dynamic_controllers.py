"""Controllers added to and stopped in a running manager, on the real control plane.

What is checked from outside: the API server's own count of open watches
(``apiserver_longrunning_requests{verb="WATCH"}``) and our informer registry (the factory's
informers, ``informer_store_objects``), and that a stopped controller's store is actually
freed (a weak reference to it dies). The CRD test installs a kind at run time, lets a
controller for it be added when it is established and stopped when it is deleted, and
checks that nothing was logged at WARNING or above on the way.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from controller_runtime import ControllerBuilder, Request, metrics
from controller_runtime.builder import ControllerHost
from controller_runtime.manager import Manager, ManagerOptions
from informers import metrics as informer_metrics
from kubeclient.config import ClusterConfig
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport
from tests.integration.test_docs_examples import load
from tests.support import watch_until

pytestmark = pytest.mark.integration

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE = "application/merge-patch+json"


async def apiserver_watches(transport: Transport, resource: str) -> float:
    """Watches the API server holds open on ``resource`` (its plural), from its metrics."""
    text = (await transport.request("GET", "/metrics")).body.decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_longrunning_requests{")
            and 'verb="WATCH"' in line
            and f'resource="{resource}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Poll an outside condition (the API server's metrics: nothing to await) until true;
    returns the seconds it took. Fails after ``timeout``."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


def series(controller: str) -> list[str]:
    """The names of the series exported for ``controller`` (by its ``controller`` label)."""
    return sorted(
        {
            sample.name
            for family in metrics.REGISTRY.collect()
            for sample in family.samples
            if sample.labels.get("controller") == controller
        }
    )


def store_objects(resource: str) -> float:
    value = informer_metrics.REGISTRY.get_sample_value(
        "informer_store_objects", {"resource": resource}
    )
    return value or 0.0


@pytest.fixture
async def running(admin_config: ClusterConfig) -> AsyncIterator[Callable[..., Any]]:
    """Start a manager (no leader election, no servers) and wait until it leads."""
    managers: list[tuple[Manager, asyncio.Task[None]]] = []

    async def start(namespaces: list[str] | None) -> Manager:
        manager = Manager(
            admin_config,
            ManagerOptions(
                namespaces=namespaces,
                metrics_bind_address=None,
                health_probe_bind_address=None,
                graceful_shutdown_timeout=5,
            ),
        )
        leading = asyncio.Event()

        class Leading:
            need_leader_election = True

            async def start(self) -> None:
                leading.set()

            async def stop(self, drain_timeout: float | None) -> None:
                return None

        manager.add(Leading())
        task = asyncio.create_task(manager.run())
        managers.append((manager, task))
        waiting = asyncio.create_task(leading.wait())
        done, _ = await asyncio.wait(
            {task, waiting}, timeout=60, return_when=asyncio.FIRST_COMPLETED
        )
        if waiting not in done:
            waiting.cancel()
            if task.done():
                task.result()  # the manager's own error says more
            raise AssertionError("the manager did not start leading within 60s")
        return manager

    yield start
    for manager, task in managers:
        manager.request_stop()
        await asyncio.wait_for(task, 30)


class Reconciled:
    """Requests a reconciler saw, with waiting."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._changed = asyncio.Event()

    async def reconcile(self, request: Request) -> None:
        self.names.append(request.name)
        self._changed.set()

    async def wait_for(self, name: str, timeout: float = 30.0) -> None:
        async def scan() -> None:
            while name not in self.names:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(scan(), timeout)

    async def wait_count(self, n: int, timeout: float = 120.0) -> None:
        async def scan() -> None:
            while len(set(self.names)) < n:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(scan(), timeout)


async def test_a_controller_added_at_run_time_and_stopped_releases_only_what_it_alone_held(
    running: Callable[..., Any], transport: Transport, namespace: str
) -> None:
    manager: Manager = await running([namespace])
    baseline = await apiserver_watches(transport, "configmaps")
    secrets_baseline = await apiserver_watches(transport, "secrets")

    # Two controllers share the ConfigMap informer; only the first watches Secrets.
    first, second = Reconciled(), Reconciled()
    host: ControllerHost = manager
    a = await (
        ControllerBuilder(host)
        .named(f"dyn-a-{uuid.uuid4().hex[:6]}")
        .for_("v1", "ConfigMap")
        .caches("v1", "Secret")
        .complete(first.reconcile)
    )
    await manager.add_controller(a)
    b = (
        await ControllerBuilder(host)
        .named(f"dyn-b-{uuid.uuid4().hex[:6]}")
        .for_("v1", "ConfigMap")
        .complete(second.reconcile)
    )
    await manager.add_controller(b)
    assert a.started and b.started
    assert manager.cache.holders("v1", "ConfigMap") == 2
    assert manager.cache.holders("v1", "Secret") == 1

    await transport.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", body={"metadata": {"name": "one"}}
    )
    await first.wait_for("one")
    await second.wait_for("one")
    await until(
        lambda: _at_least(apiserver_watches(transport, "secrets"), secrets_baseline + 1),
        10,
        "the Secret watch is open",
    )

    assert await manager.remove_controller(a)
    assert a not in manager.controllers
    # The Secret informer had one holder: gone at once, and its watch with it.
    assert manager.cache.watched("v1", "Secret") is None
    assert not [i for i in manager.factory.informers() if i.resource.plural == "secrets"]
    await until(
        lambda: _at_most(apiserver_watches(transport, "secrets"), secrets_baseline),
        5,
        "the Secret watch is closed",
    )
    # The ConfigMap informer is still b's: b still reconciles, through the same watch.
    assert manager.cache.holders("v1", "ConfigMap") == 1
    assert await apiserver_watches(transport, "configmaps") >= baseline + 1
    await transport.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", body={"metadata": {"name": "two"}}
    )
    await second.wait_for("two")
    assert "two" not in first.names

    await b.stop()  # the same as remove_controller
    assert b not in manager.controllers
    assert manager.cache.watched("v1", "ConfigMap") is None
    await until(
        lambda: _at_most(apiserver_watches(transport, "configmaps"), baseline),
        5,
        "the ConfigMap watch is closed",
    )


async def _at_most(value: Awaitable[float], expected: float) -> bool:
    return await value <= expected


async def _at_least(value: Awaitable[float], expected: float) -> bool:
    return await value >= expected


async def test_stopping_a_controller_over_10k_objects_frees_its_watch_and_store(
    running: Callable[..., Any], transport: Transport, namespace: str
) -> None:
    n = 10_000
    semaphore = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        async with semaphore:
            await transport.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/configmaps",
                body={"metadata": {"name": f"cm-{i:05d}"}, "data": {"i": str(i)}},
            )

    await asyncio.gather(*(create(i) for i in range(n)))
    manager: Manager = await running([namespace])
    baseline = await apiserver_watches(transport, "configmaps")
    assert store_objects("configmaps") == 0

    reconciled = Reconciled()
    stopped = False
    late: list[str] = []
    active = 0
    in_flight_at_return: list[int] = []

    async def reconcile(request: Request) -> None:
        nonlocal active
        if stopped:
            late.append(request.name)
        active += 1
        try:
            await asyncio.sleep(0)  # a reconcile that yields, as any real one does
            await reconciled.reconcile(request)
        finally:
            active -= 1

    name = f"dyn-10k-{uuid.uuid4().hex[:6]}"
    controller = await (
        ControllerBuilder(manager)
        .named(name)
        .for_("v1", "ConfigMap")
        .with_options(max_concurrent_reconciles=4)
        .complete(reconcile)
    )
    await manager.add_controller(controller)
    (informer,) = manager.cache.watched("v1", "ConfigMap").informers.values()  # type: ignore[union-attr]
    store = weakref.ref(informer.store)
    assert len(informer.store) >= n
    assert store_objects("configmaps") >= n
    del informer
    await until(
        lambda: _at_least(apiserver_watches(transport, "configmaps"), baseline + 1),
        10,
        "the watch is open",
    )
    await reconciled.wait_count(100)  # working through the backlog: stopped mid-flight
    assert series(name)

    await manager.remove_controller(controller)
    stopped = True
    in_flight_at_return.append(active)
    # Freed when remove_controller returns, not when the collector gets to it.
    held = store()
    assert held is None or len(held) == 0, "the stopped informer's store still holds objects"
    del held
    assert manager.factory.informers() == []
    assert store_objects("configmaps") == 0
    assert series(name) == [], "the stopped controller's metric series are still exported"
    took = await until(
        lambda: _at_most(apiserver_watches(transport, "configmaps"), baseline),
        5,
        "the API server closed the watch",
    )
    # Thousands of keys were still queued at the stop: had a worker outlived it, it would
    # have taken some of them while the watch closed.
    assert in_flight_at_return == [0] and late == [], f"reconciles after the stop: {late[:5]}"
    gc.collect()
    assert store() is None, "the stopped informer's store is still referenced"
    assert took < 5


async def test_the_docs_controller_of_kinds_named_at_run_time_goes_away_with_its_crd(
    running: Callable[..., Any],
    transport: Transport,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """docs/controllers.md's ``dynamic_kinds.py`` as written: a controller per CRD labelled
    ``dynamic=yes``, added when the CRD is served and stopped when it is deleted (its
    finalizer on the CRD holds the kind until the watch is closed, so no watch ever sees the
    resource vanish)."""
    caplog.set_level(logging.WARNING)
    manager: Manager = await running(None)
    program = load("dynamic_kinds.py")
    reconciled = Reconciled()
    watcher = await program.watch_dynamic_kinds(manager, reconciled.reconcile)
    await manager.add_controller(watcher)

    plural = f"gadgets{uuid.uuid4().hex[:6]}"
    group = "dynamic.crpy.io"
    crd_name = f"{plural}.{group}"
    kind = plural.capitalize()[:-1]
    await transport.request("POST", CRDS, body=_crd(group, plural, kind))
    # The kind is served a moment after the create (nothing to await on the server's side).
    body = {"apiVersion": f"{group}/v1", "kind": kind, "metadata": {"name": "g1"}}
    path = f"/apis/{group}/v1/namespaces/{namespace}/{plural}"
    deadline = time.monotonic() + 30
    while True:
        try:
            await transport.request("POST", path, body=body)
            break
        except NotFoundError:
            assert time.monotonic() < deadline, f"{plural} not served within 30s"
            await asyncio.sleep(0.1)
    await reconciled.wait_for("g1", timeout=60)
    assert manager.cache.holders(f"{group}/v1", kind) == 1
    assert await apiserver_watches(transport, plural) == 1

    gone = asyncio.create_task(
        watch_until(
            transport,
            CRDS,
            lambda e: e["type"] == "DELETED",
            params={"fieldSelector": f"metadata.name={crd_name}"},
            timeout=60,
        )
    )
    await transport.request("DELETE", f"{CRDS}/{crd_name}")
    await gone
    assert not [i for i in manager.factory.informers() if i.resource.plural == plural]
    assert manager.cache.watched(f"{group}/v1", kind) is None
    assert await apiserver_watches(transport, plural) == 0
    noisy = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert noisy == []


def _crd(group: str, plural: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {"dynamic": "yes"}},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
