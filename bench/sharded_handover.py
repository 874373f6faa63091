"""Handover times of the sharded Task controller: a join, a clean leave and a crash.

Run ``python -m bench.sharded_handover --objects 2000 --timings default,short``; the numbers are
in docs/scaling.md.

It starts a local control plane (``ShardedListAndWatch`` on), creates N Tasks and, for each
set of ring timings asked for (``default``: lease 15 s, renew deadline 10 s, retry 2 s, what
a user gets; ``short``: lease 6 s, renew deadline 4 s, retry 1 s, the integration tests'), a
ring of its own:

1. starts 3 replica processes and waits until they hold all 16 slots between them;
2. **join**: starts a 4th and measures until the 4 hold 4 slots each and all see 4 members;
3. **clean leave**: SIGTERM to one (it drains, releases and deletes its Lease); measures until
   the other 3 hold all 16 slots;
4. **crash**: SIGKILL to another; measures until the 2 left hold all 16 slots.

Times run from the signal (or the spawn, for the join, which therefore includes the new
process's Python start-up, printed beside it). Every reconcile is written to a ledger; the
result counts the keys reconciled by two replicas at overlapping times (must be 0). Prints one
JSON line per timing set; logs stay in the directory printed first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.sharded_restart import create_tasks

REPO = Path(__file__).resolve().parents[1]
SLOTS = 16
TIMINGS: dict[str, tuple[float, float, float]] = {
    "default": (15.0, 10.0, 2.0),
    "short": (6.0, 4.0, 1.0),
}
"""lease duration, renew deadline, retry period (seconds)."""


# -- a replica ------------------------------------------------------------------------------


async def replica(  # noqa: PLR0917 (a bench entry point)
    kubeconfig: str, namespace: str, ring: str, identity: str, out: Path, timings: str
) -> int:
    from controller_runtime import Request, Result  # noqa: PLC0415 (replica mode only)
    from controller_runtime.controller import ControllerOptions  # noqa: PLC0415
    from controller_runtime.manager import (  # noqa: PLC0415
        Manager,
        ManagerOptions,
        run_until_signalled,
    )
    from controller_runtime.sharding import ShardRingConfig  # noqa: PLC0415
    from controllers.task import TaskReconciler, setup_sharded_task_controller  # noqa: PLC0415
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415

    lease, deadline, retry = TIMINGS[timings]
    manager = Manager(
        await load_kubeconfig(kubeconfig),
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            shard_ring=ShardRingConfig(
                ring,
                namespace,
                identity=identity,
                lease_duration=lease,
                renew_deadline=deadline,
                retry_period=retry,
            ),
        ),
    )
    sharded = await setup_sharded_task_controller(
        manager, manager.client, options=ControllerOptions(max_concurrent_reconciles=4)
    )
    assert manager.shard_ring is not None
    shard_ring = manager.shard_ring
    inner = TaskReconciler(manager.client)
    ledger = (out / f"{identity}.ledger").open("a", buffering=1)

    async def reconcile(request: Request) -> Result | None:
        key = f"{request.namespace}/{request.name}"
        ledger.write(f"start {key} {time.monotonic():.6f}\n")
        try:
            return await inner.reconcile(request)
        finally:
            ledger.write(f"end {key} {time.monotonic():.6f}\n")

    sharded.reconciler = reconcile

    async def report() -> None:
        status = out / f"{identity}.json"
        while True:
            state = {"slots": sorted(shard_ring.active), "members": shard_ring.members}
            tmp = status.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, status)
            await asyncio.sleep(0.1)

    reporting = asyncio.create_task(report())
    try:
        await run_until_signalled(manager)
    finally:
        reporting.cancel()
        ledger.close()
    return 0


# -- the driver -----------------------------------------------------------------------------


class Proc:
    def __init__(  # noqa: PLR0917 (one replica's command line)
        self, kubeconfig: Path, namespace: str, ring: str, name: str, out: Path, timings: str
    ) -> None:
        self.name, self.out = name, out
        self.status_file = out / f"{name}.json"
        self.log = (out / f"{name}.log").open("wb")
        command = [sys.executable, "-m", "bench.sharded_handover", "replica"]
        self.process = subprocess.Popen(
            [*command, str(kubeconfig), namespace, ring, name, str(out), timings],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def status(self) -> dict[str, Any] | None:
        try:
            state: dict[str, Any] = json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return state

    def slots(self) -> set[int]:
        state = self.status()
        return set(state["slots"]) if state else set()

    def members(self) -> int:
        state = self.status()
        return len(state["members"]) if state else 0


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not within {timeout:.0f}s: {what}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


def covered(procs: list[Proc]) -> bool:
    """Every slot worked on by exactly one of ``procs``."""
    held = [s for p in procs for s in p.slots()]
    return sorted(held) == list(range(SLOTS))


def overlapping_keys(out: Path, now: float, killed: dict[str, float]) -> int:
    """Keys reconciled by two replicas at overlapping times, from the ledgers. A reconcile
    with no end ran until its replica was killed (``killed``: name -> time), else until now."""
    intervals: dict[str, list[tuple[float, float, str]]] = {}
    for ledger in out.glob("*.ledger"):
        open_: dict[str, float] = {}
        for line in ledger.read_text().splitlines():
            kind, key, at = line.split()
            if kind == "start":
                open_[key] = float(at)
            elif key in open_:
                intervals.setdefault(key, []).append((open_.pop(key), float(at), ledger.stem))
        for key, start in open_.items():
            end = killed.get(ledger.stem, now)
            intervals.setdefault(key, []).append((start, end, ledger.stem))
    bad = 0
    for spans in intervals.values():
        spans.sort()
        # Each interval against the latest-ending one before it of another replica.
        latest: dict[str, float] = {}
        for start, end, who in spans:
            if any(start < e for w, e in latest.items() if w != who):
                bad += 1
                break
            latest[who] = max(latest.get(who, 0.0), end)
    return bad


async def run_ring(plane: Any, namespace: str, timings: str, out: Path) -> dict[str, Any]:
    ring = f"{timings}-{uuid.uuid4().hex[:6]}"
    budget = 120.0 + 4 * TIMINGS[timings][0]
    everyone: list[Proc] = []

    def spawn(i: int) -> Proc:
        everyone.append(Proc(plane.kubeconfig, namespace, ring, f"{ring}-r{i}", out, timings))
        return everyone[-1]

    result: dict[str, Any] = {"timings": timings, "lease_deadline_retry": TIMINGS[timings]}
    try:
        three = [spawn(i) for i in range(3)]
        result["start_3_s"] = round(await until(lambda: covered(three), budget, "3 cover"), 2)
        joiner = spawn(3)
        up = asyncio.create_task(until(lambda: joiner.status() is not None, budget, "up"))
        four = [*three, joiner]
        result["join_s"] = round(
            await until(
                lambda: (
                    covered(four)
                    and all(len(p.slots()) == 4 for p in four)
                    and all(p.members() == 4 for p in four)
                ),
                budget,
                "4 replicas hold 4 slots each",
            ),
            2,
        )
        result["join_process_up_s"] = round(await up, 2)
        leaver, victim, survivors = four[0], four[1], four[2:]
        leaver.process.send_signal(signal.SIGTERM)
        result["leave_s"] = round(
            await until(lambda: covered([victim, *survivors]), budget, "3 cover after leave"), 2
        )
        result["leaver_exit"] = await asyncio.to_thread(leaver.process.wait, 60)
        killed_at = time.monotonic()
        victim.process.kill()
        result["crash_s"] = round(
            await until(lambda: covered(survivors), budget, "2 cover after SIGKILL"), 2
        )
        result["overlapping_keys"] = overlapping_keys(
            out, time.monotonic(), {victim.name: killed_at}
        )
    finally:
        for p in everyone:
            if p.process.poll() is None:
                p.process.send_signal(signal.SIGTERM)
        for p in everyone:
            try:
                await asyncio.to_thread(p.process.wait, 60)
            except subprocess.TimeoutExpired:
                p.process.kill()
    return result


async def drive(objects: int, timing_sets: list[str]) -> None:
    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    with ControlPlane(feature_gates={"ShardedListAndWatch": True}) as plane:
        async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
            namespace = "bench-handover"
            await transport.request(
                "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
            )
            await create_tasks(transport, namespace, objects)
            out = Path(tempfile.mkdtemp(prefix="crpy-bench-handover-"))
            print(json.dumps({"objects": objects, "logs": str(out)}), flush=True)
            for n, timings in enumerate(timing_sets):
                ring_out = out / f"{n}-{timings}"
                ring_out.mkdir()
                result = await run_ring(plane, namespace, timings, ring_out)
                result["objects"] = objects
                result["loadavg"] = os.getloadavg()[0]
                print(json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "replica":
        kubeconfig, namespace, ring, identity, out, timings = args[1:7]
        return asyncio.run(replica(kubeconfig, namespace, ring, identity, Path(out), timings))
    p = argparse.ArgumentParser(prog="python -m bench.sharded_handover", description=__doc__)
    p.add_argument("--objects", type=int, default=2000)
    p.add_argument("--timings", default="default,short", help="comma-separated: default, short")
    opts = p.parse_args(args)
    sets = [t for t in opts.timings.split(",") if t]
    unknown = [t for t in sets if t not in TIMINGS]
    if unknown:
        p.error(f"unknown timings {unknown}; choose from {sorted(TIMINGS)}")
    asyncio.run(drive(opts.objects, sets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
