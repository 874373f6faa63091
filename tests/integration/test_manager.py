"""The manager on the real control plane: leader election between two managers, failover,
the metrics and health endpoints, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from controller_runtime import ControllerBuilder, ControllerOptions, Request
from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.leaderelection import LeaderElectionConfig, LeaderElectionLostError
from controller_runtime.manager import Manager, ManagerOptions
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport

pytestmark = pytest.mark.integration

TASKS = "tasks.crpy.io/v1"


def task(name: str) -> dict[str, object]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {"priority": 1},
    }


@dataclass
class LeaderTimeline:
    """A leader-only runnable that records when this manager could act."""

    name: str
    need_leader_election: bool = True
    started_at: float | None = None
    stopped_at: float | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self.started_at = time.monotonic()
        self.started.set()

    async def stop(self, drain_timeout: float | None) -> None:
        if self.started_at is not None and self.stopped_at is None:
            self.stopped_at = time.monotonic()
            self.stopped.set()


@dataclass
class Member:
    manager: Manager
    timeline: LeaderTimeline
    reconciled: list[Request]
    task: asyncio.Task[None] | None = None


async def member(
    config: ClusterConfig, namespace: str, label: str, election: LeaderElectionConfig
) -> Member:
    manager = Manager(
        config,
        ManagerOptions(
            namespaces=[namespace],
            leader_election=election,
            metrics_bind_address=None,
            health_probe_bind_address=None,
            graceful_shutdown_timeout=5,
        ),
    )
    reconciled: list[Request] = []

    async def reconcile(request: Request) -> None:
        reconciled.append(request)

    await (
        ControllerBuilder(manager)
        .named(f"leader-test-{label}-{uuid.uuid4().hex[:6]}")
        .for_(TASKS, "Task")
        .complete(reconcile)
    )
    timeline = LeaderTimeline(label)
    manager.add(timeline)
    return Member(manager, timeline, reconciled)


async def start(m: Member) -> Member:
    m.task = asyncio.create_task(m.manager.run())
    return m


async def finish(m: Member) -> BaseException | None:
    m.manager.request_stop()
    assert m.task is not None
    try:
        await asyncio.wait_for(m.task, 30)
    except (LeaderElectionLostError, asyncio.CancelledError) as err:
        return err
    return None


async def _first_leader(a: Member, b: Member, timeout: float = 30) -> tuple[Member, Member]:
    waits = {
        asyncio.create_task(a.timeline.started.wait()): (a, b),
        asyncio.create_task(b.timeline.started.wait()): (b, a),
    }
    done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    assert done, "nobody became leader"
    return waits[done.pop()]


async def test_exactly_one_of_two_managers_reconciles_and_a_clean_stop_hands_over(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    election = LeaderElectionConfig(namespace=namespace, name="operator")  # 15 s / 10 s / 2 s
    a = await start(
        await member(admin_config, namespace, "a", dataclasses.replace(election, identity="a"))
    )
    b = await start(
        await member(admin_config, namespace, "b", dataclasses.replace(election, identity="b"))
    )
    try:
        leader, follower = await _first_leader(a, b)
        base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
        for i in range(5):
            await transport.request("POST", base, body=task(f"t{i}"))
        await _until(lambda: len({r.name for r in leader.reconciled}) == 5)
        assert follower.reconciled == []
        assert not follower.timeline.started.is_set()

        stop_requested = time.monotonic()
        assert await finish(leader) is None
        await asyncio.wait_for(follower.timeline.started.wait(), 20)
        handover = (follower.timeline.started_at or 0) - stop_requested
        # A clean stop releases the Lease: the follower takes over at its next retry.
        assert handover < election.lease_duration
        # Nobody acted twice: the old leader had stopped before the new one started.
        assert leader.timeline.stopped_at is not None
        assert follower.timeline.started_at is not None
        assert leader.timeline.stopped_at <= follower.timeline.started_at
        await transport.request("POST", base, body=task("after"))
        await _until(lambda: any(r.name == "after" for r in follower.reconciled))
        assert all(r.name != "after" for r in leader.reconciled)
    finally:
        for m in (a, b):
            if m.task is not None and not m.task.done():
                await finish(m)


async def test_a_cut_off_leader_stops_before_the_follower_takes_over(
    control_plane: ControlPlane, admin_config: ClusterConfig, namespace: str
) -> None:
    """The leader loses the API server (a frozen proxy): it stops acting once its renew
    deadline passes and its run() raises; the follower takes over only after the lease
    expires. Shorter timings than the defaults keep the test quick; the ratios are the same."""
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    election = LeaderElectionConfig(
        namespace=namespace, name="operator", lease_duration=6, renew_deadline=4, retry_period=1
    )
    via_proxy = dataclasses.replace(admin_config, server=proxy.url)
    cut = await start(
        await member(via_proxy, namespace, "cut", dataclasses.replace(election, identity="cut"))
    )
    await asyncio.wait_for(cut.timeline.started.wait(), 20)
    other = await start(
        await member(
            admin_config, namespace, "other", dataclasses.replace(election, identity="other")
        )
    )
    try:
        frozen_at = time.monotonic()
        proxy.freeze()
        assert cut.task is not None
        with pytest.raises(LeaderElectionLostError):
            await asyncio.wait_for(cut.task, 30)
        await asyncio.wait_for(other.timeline.started.wait(), 30)
        assert cut.timeline.stopped_at is not None and other.timeline.started_at is not None
        gap = other.timeline.started_at - cut.timeline.stopped_at
        assert gap > 0, f"both could act for {-gap:.2f}s"
        failover = other.timeline.started_at - frozen_at
        assert failover < election.lease_duration + election.renew_deadline + 5
        print(f"cut-off failover {failover:.2f}s, gap between leaders {gap:.2f}s")
    finally:
        proxy.thaw()
        await proxy.stop()
        await finish(other)
        if cut.task is not None and not cut.task.done():
            await finish(cut)


async def _until(predicate: object, timeout: float = 30) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def served(
    admin_config: ClusterConfig, namespace: str
) -> AsyncIterator[tuple[Manager, FaultProxy]]:
    """A manager whose cache goes through a proxy (frozen until the test thaws it), with
    both endpoints on free loopback ports."""
    host, port = admin_config.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    config = dataclasses.replace(admin_config, server=proxy.url)
    manager = Manager(
        config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address="127.0.0.1:0",
            health_probe_bind_address="127.0.0.1:0",
        ),
    )

    async def reconcile(request: Request) -> None:
        return None

    # Discovery answers are cached: resolve now, so that only the informers meet the freeze.
    await manager.cache.discovery.resolve(TASKS, "Task")
    proxy.freeze()
    await (
        ControllerBuilder(manager)
        .named(f"served-{uuid.uuid4().hex[:6]}")
        .for_(TASKS, "Task")
        .with_options(ControllerOptions(max_concurrent_reconciles=2))
        .complete(reconcile)
    )
    run = asyncio.create_task(manager.run())
    await _until(lambda: manager.health_url is not None and manager.metrics_url is not None)
    yield manager, proxy
    proxy.thaw()
    manager.request_stop()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(run, 30)
    await proxy.stop()


async def test_readyz_turns_ready_only_after_the_caches_synced(
    served: tuple[Manager, FaultProxy],
) -> None:
    manager, proxy = served
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{manager.health_url}/healthz") as answer:
            assert answer.status == 200
        async with http.get(f"{manager.health_url}/readyz") as answer:
            assert answer.status == 503
            assert "[-]informers-synced" in await answer.text()
        proxy.thaw()
        deadline = time.monotonic() + 30
        while True:
            async with http.get(f"{manager.health_url}/readyz") as answer:
                if answer.status == 200:
                    break
            assert time.monotonic() < deadline, "never became ready"
            await asyncio.sleep(0.05)


async def test_readyz_fails_while_a_crashed_reflector_is_being_restarted(
    served: tuple[Manager, FaultProxy],
) -> None:
    """An exception no reflector expects (here: raised once from its next request) ends the
    reflector; its informer restarts it, and /readyz says not ready until it has relisted."""
    manager, proxy = served
    proxy.thaw()

    async def readyz() -> tuple[int, str]:
        async with http.get(f"{manager.health_url}/readyz") as answer:
            return answer.status, await answer.text()

    async def until_readyz(status: int) -> str:
        deadline = time.monotonic() + 60
        while True:
            got, text = await readyz()
            if got == status:
                return text
            assert time.monotonic() < deadline, f"/readyz never answered {status}: {text}"
            await asyncio.sleep(0.05)

    async with aiohttp.ClientSession() as http:
        await until_readyz(200)
        (informer,) = manager.factory.informers()
        reflector = informer.reflector
        original = reflector._perform
        crashed = asyncio.Event()

        async def crash_once(request: object) -> object:
            reflector._perform = original  # type: ignore[method-assign]
            crashed.set()
            raise ZeroDivisionError("an unexpected bug")

        reflector._perform = crash_once  # type: ignore[assignment,method-assign]
        proxy.cut_all()  # the watch ends; the reflector's next request meets the bug
        await asyncio.wait_for(crashed.wait(), 60)
        text = await until_readyz(503)
        assert "[-]informers-healthy" in text
        await until_readyz(200)
        assert informer.healthy


async def test_metrics_endpoint_exposes_the_named_series(
    served: tuple[Manager, FaultProxy], transport: Transport, namespace: str
) -> None:
    manager, proxy = served
    proxy.thaw()
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    await transport.request("POST", base, body=task("measured"))
    names = (
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "controller_runtime_active_workers",
        "controller_runtime_max_concurrent_reconciles",
        "controller_runtime_stale_skips_total",
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
        "rest_client_requests_total",
        "rest_client_request_duration_seconds_bucket",
        "informer_events_total",
        "informer_store_objects",
        "process_cpu_seconds_total",
    )
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 30
        while True:
            async with http.get(f"{manager.metrics_url}/metrics") as answer:
                assert answer.status == 200
                text = await answer.text()
            if 'result="success"' in text:
                break
            assert time.monotonic() < deadline, "no successful reconcile in the metrics"
            await asyncio.sleep(0.1)
    missing = [n for n in names if f"\n{n}" not in text]
    assert not missing, f"missing series: {missing}"


SLOW_OPERATOR = Path(__file__).with_name("slow_operator.py")


@pytest.mark.parametrize("second_signal", [False, True])
async def test_sigterm_lets_in_flight_reconciles_finish(
    control_plane: ControlPlane,
    transport: Transport,
    namespace: str,
    tmp_path: Path,
    second_signal: bool,
) -> None:
    """The first SIGTERM drains: the reconcile in flight completes and the process exits 0.
    A second signal exits at once, with status 1."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SLOW_OPERATOR),
        str(control_plane.kubeconfig),
        namespace,
        str(tmp_path),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    try:
        await _until((tmp_path / "ready").exists)
        base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
        await transport.request("POST", base, body=task("slow"))
        await _until((tmp_path / "started").exists)
        proc.send_signal(signal.SIGTERM)
        if second_signal:
            await asyncio.sleep(0.2)  # let the first signal be handled before the second
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        if second_signal:
            assert code == 1
            assert not (tmp_path / "finished").exists()
        else:
            assert code == 0
            assert (tmp_path / "finished").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
