"""Sharded Task controllers in separate processes on the real control plane: the replicas
split the Tasks, a 4th joins, one is SIGKILLed and another cut off by a frozen proxy, and the
ledger of every reconcile shows that no two replicas ever reconciled one Task at overlapping
times. Run with the ``ShardedListAndWatch`` gate on (the server filters) and off (the
replicas filter)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport

REPO = Path(__file__).resolve().parents[2]
SLOTS = 16
TASKS_PATH = "/apis/tasks.crpy.io/v1/namespaces/{}/tasks"


@dataclass
class Replica:
    identity: str
    directory: Path
    process: subprocess.Popen[bytes]
    killed_at: float | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / f"{self.identity}.log"

    def status(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(
                (self.directory / f"{self.identity}.json").read_text()
            )
        except (FileNotFoundError, json.JSONDecodeError):
            return {"slots": [], "members": [], "objects": 0, "received": 0, "synced": False}
        return data

    def slots(self) -> set[int]:
        return set(self.status()["slots"])

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.killed_at = time.monotonic()

    def terminate(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


def start_replica(kubeconfig: Path, namespace: str, ring: str, name: str, out: Path) -> Replica:
    log = (out / f"{name}.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.shard_replica",
            str(kubeconfig),
            namespace,
            ring,
            name,
            str(out),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return Replica(name, out, process)


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` (state of other processes: nothing to await); seconds it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def partition(replicas: list[Replica]) -> bool:
    """Every slot worked on by exactly one of ``replicas``."""
    held = [s for r in replicas for s in r.slots()]
    return sorted(held) == list(range(SLOTS))


def balanced(replicas: list[Replica]) -> bool:
    loads = [len(r.slots()) for r in replicas]
    return (
        partition(replicas)
        and max(loads) - min(loads) <= 1
        and all(len(r.status()["members"]) == len(replicas) for r in replicas)
    )


async def create_tasks(transport: Transport, namespace: str, count: int) -> None:
    path = TASKS_PATH.format(namespace)
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            body = {
                "apiVersion": "tasks.crpy.io/v1",
                "kind": "Task",
                "metadata": {"name": f"task-{i:05d}"},
                "spec": {"title": f"task {i}", "priority": 1 + i % 3},
            }
            await transport.request("POST", path, body=body)

    await asyncio.gather(*(worker() for _ in range(32)))


async def unconverged(transport: Transport, namespace: str) -> int:
    """Tasks whose status does not describe their current spec."""
    items = (await transport.request("GET", TASKS_PATH.format(namespace))).json()["items"]
    return sum(
        1
        for t in items
        if (t.get("status") or {}).get("observedGeneration") != t["metadata"]["generation"]
    )


async def until_converged(transport: Transport, namespace: str, timeout: float) -> float:
    started = time.monotonic()
    while (left := await unconverged(transport, namespace)) > 0:
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{left} Tasks not reconciled after {timeout:.0f}s")
        await asyncio.sleep(1.0)
    return time.monotonic() - started


async def keep_touching(
    transport: Transport, namespace: str, count: int, stop: asyncio.Event
) -> int:
    """Change random Tasks' specs until ``stop``: reconciles keep flowing during handovers."""
    path = TASKS_PATH.format(namespace)
    touched = 0
    rnd = random.Random(7)

    async def worker() -> None:
        nonlocal touched
        while not stop.is_set():
            name = f"task-{rnd.randrange(count):05d}"
            patch = {"spec": {"title": f"touched {uuid.uuid4().hex[:6]}"}}
            await transport.request(
                "PATCH", f"{path}/{name}", body=patch, content_type="application/merge-patch+json"
            )
            touched += 1

    await asyncio.gather(*(worker() for _ in range(4)))
    return touched


def overlaps(replicas: list[Replica], now: float) -> tuple[int, list[str]]:
    """Reconcile intervals per Task from every ledger; returns the number of intervals and
    the overlaps between different replicas. A start without an end (SIGKILL) lasts until the
    kill; one without an end in a live replica lasts until ``now``."""
    intervals: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    total = 0
    for replica in replicas:
        open_: dict[str, list[float]] = defaultdict(list)
        ledger = replica.directory / f"{replica.identity}.ledger"
        for line in ledger.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3:
                continue  # a line cut by SIGKILL
            kind, key, moment = parts[0], parts[1], float(parts[2])
            if kind == "start":
                open_[key].append(moment)
            elif open_[key]:
                intervals[key].append((open_[key].pop(0), moment, replica.identity))
                total += 1
        for key, starts in open_.items():
            for start in starts:
                end = replica.killed_at if replica.killed_at is not None else now
                intervals[key].append((start, end, replica.identity))
                total += 1
    found = []
    for key, spans in intervals.items():
        spans.sort()
        for i, (start, end, who) in enumerate(spans):
            for later_start, _, other in spans[i + 1 :]:
                if later_start >= end:
                    break
                if other != who:
                    found.append(
                        f"{key}: {who} [{start:.3f}, {end:.3f}) and {other} from {later_start:.3f}"
                    )
    return total, found


@pytest.fixture
async def ring_namespace(transport: Transport) -> AsyncIterator[str]:
    name = f"t-ring-{uuid.uuid4().hex[:8]}"
    await transport.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    with contextlib.suppress(Exception):
        await transport.request("DELETE", f"/api/v1/namespaces/{name}")


def proxied_kubeconfig(plane: ControlPlane, proxy: FaultProxy, out: Path) -> Path:
    path = out / "kubeconfig-proxied.yaml"
    path.write_text(plane.kubeconfig.read_text().replace(plane.server, proxy.url))
    return path


async def scenario(
    plane: ControlPlane, namespace: str, count: int, out: Path, *, server_filters: bool
) -> dict[str, float]:
    """The whole story; returns the timings measured."""
    timings: dict[str, float] = {}
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
        await create_tasks(transport, namespace, count)
        host, port = plane.server.removeprefix("https://").rsplit(":", 1)
        proxy = await FaultProxy(host, int(port)).start()
        ring = f"tasks-{uuid.uuid4().hex[:6]}"
        replicas: list[Replica] = []
        touching: asyncio.Task[int] | None = None
        try:
            a = start_replica(plane.kubeconfig, namespace, ring, "replica-a", out)
            b = start_replica(plane.kubeconfig, namespace, ring, "replica-b", out)
            c = start_replica(
                proxied_kubeconfig(plane, proxy, out), namespace, ring, "replica-c", out
            )
            replicas = [a, b, c]
            await until(lambda: balanced(replicas), 120, "3 replicas to split the slots")
            timings["converge_3"] = await until_converged(transport, namespace, 600)
            # Each replica's cache holds its share: about a third, never everything.
            await until(lambda: all(r.status()["synced"] for r in replicas), 60, "caches synced")
            held = [r.status()["objects"] for r in replicas]
            assert sum(held) == count, f"caches hold {held}, not a partition of {count}"
            for replica, objects in zip(replicas, held, strict=True):
                share = len(replica.slots()) / SLOTS
                assert abs(objects - share * count) <= 0.15 * count, (replica.identity, objects)
                assert objects < 0.5 * count
                # Objects received (list items and watch events, before client-side
                # filtering): a share when the server filters; every object once per owned
                # slot when it does not.
                received = replica.status()["received"]
                if server_filters:
                    assert received < count, (replica.identity, received)
                else:
                    assert received >= len(replica.slots()) * count, (replica.identity, received)

            # A 4th replica joins while Tasks keep changing.
            stop = asyncio.Event()
            touching = asyncio.create_task(keep_touching(transport, namespace, count, stop))
            d = start_replica(plane.kubeconfig, namespace, ring, "replica-d", out)
            replicas.append(d)
            timings["join"] = await until(lambda: balanced(replicas), 120, "4 replicas balanced")

            # SIGKILL b, and cut c off from the API server (frozen, not closed).
            b.kill()
            proxy.freeze()
            survivors = [a, d]
            timings["crash_and_cut_off"] = await until(
                lambda: balanced(survivors), 120, "the 2 survivors to take every slot"
            )
            # c noticed by its own renew deadline and dropped everything.
            await until(lambda: not c.slots(), 30, "the cut-off replica to drop its slots")
            stop.set()
            timings["touched"] = await touching
            timings["converge_after_crash"] = await until_converged(transport, namespace, 600)

            # c comes back and rejoins; then a leaves cleanly (SIGTERM drains and releases)
            # while Tasks keep changing, and the changes to a's Tasks are not lost.
            proxy.thaw()
            back = [a, c, d]
            await until(lambda: balanced(back), 120, "the cut-off replica to rejoin")
            stop = asyncio.Event()
            touching = asyncio.create_task(keep_touching(transport, namespace, count, stop))
            leaving = asyncio.create_task(asyncio.to_thread(a.terminate))
            timings["clean_leave"] = await until(
                lambda: balanced([c, d]), 120, "the others to take over a clean leave"
            )
            assert await leaving == 0
            stop.set()
            timings["touched_during_leave"] = await touching
            timings["converge_after_leave"] = await until_converged(transport, namespace, 600)

            total, found = overlaps([a, b, c, d], time.monotonic())
            assert total >= count  # every Task was reconciled at least once
            assert not found, "overlapping reconciles:\n" + "\n".join(found[:20])
            timings["reconciles"] = total
        finally:
            if touching is not None and not touching.done():
                touching.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await touching
            for replica in replicas:
                if replica.process.poll() is None:
                    replica.process.kill()
                    replica.process.wait(10)
            await proxy.stop()
    return timings


@pytest.mark.usefixtures("sharding_gate_on")
async def test_replicas_share_10k_tasks_and_hand_over_without_overlap(
    control_plane: ControlPlane, ring_namespace: str, tmp_path: Path
) -> None:
    timings = await scenario(control_plane, ring_namespace, 10_000, tmp_path, server_filters=True)
    print("sharding timings (gate on):", json.dumps(timings))


async def test_the_same_through_client_side_filtering_with_the_gate_off(
    gates_off_plane: ControlPlane, tmp_path: Path
) -> None:
    namespace = f"t-ring-{uuid.uuid4().hex[:8]}"
    async with Transport(await load_kubeconfig(gates_off_plane.kubeconfig)) as transport:
        await transport.request(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
        )
    timings = await scenario(gates_off_plane, namespace, 1_000, tmp_path, server_filters=False)
    print("sharding timings (gate off):", json.dumps(timings))
