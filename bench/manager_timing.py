"""Leader-election failover and operator start-to-ready, on the local control plane.

    python -m bench.manager_timing [--trials 5] [--objects 10000] [--json FILE]

- **failover, clean stop**: two managers (default timings 15 s / 10 s / 2 s); the leader
  stops gracefully and releases the Lease; time from the stop request until the follower
  leads.
- **failover, leader cut off**: the leader's connection is frozen (a proxy that stops
  moving bytes, as a partition would); time from the freeze until the follower leads, and
  the gap between the old leader stopping and the new one starting (positive: never two).
- **start-to-ready**: with N Tasks existing, time from starting ``python -m controllers``
  until its ``/readyz`` answers 200 (caches synced), and until every Task has a status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from bench.informer_sync import create_tasks
from controller_runtime import ControllerBuilder, Request
from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.leaderelection import LeaderElectionConfig, LeaderElectionLostError
from controller_runtime.manager import Manager, ManagerOptions
from kubeclient.config import ClusterConfig, load_kubeconfig
from kubeclient.transport import Transport


@dataclasses.dataclass
class Leading:
    """A leader-only runnable recording when its manager led."""

    need_leader_election: bool = True
    started_at: float | None = None
    stopped_at: float | None = None
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self.started_at = time.monotonic()
        self.started.set()

    async def stop(self, drain_timeout: float | None) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()


async def _member(config: ClusterConfig, election: LeaderElectionConfig) -> tuple[Manager, Leading]:
    manager = Manager(
        config,
        ManagerOptions(
            leader_election=election, metrics_bind_address=None, health_probe_bind_address=None
        ),
    )

    async def reconcile(request: Request) -> None:
        return None

    await (
        ControllerBuilder(manager)
        .named(f"failover-{uuid.uuid4().hex[:8]}")
        .for_("tasks.crpy.io/v1", "Task")
        .complete(reconcile)
    )
    leading = Leading()
    manager.add(leading)
    return manager, leading


async def failover_trial(plane: ControlPlane, *, cut: bool) -> dict[str, float]:
    config = await load_kubeconfig(plane.kubeconfig)
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    name = f"bench-{uuid.uuid4().hex[:6]}"
    first_config = dataclasses.replace(config, server=proxy.url)
    a, a_lead = await _member(first_config, LeaderElectionConfig("default", name, identity="a"))
    a_run = asyncio.create_task(a.run())
    await asyncio.wait_for(a_lead.started.wait(), 60)
    b, b_lead = await _member(config, LeaderElectionConfig("default", name, identity="b"))
    b_run = asyncio.create_task(b.run())
    await asyncio.sleep(3)  # the follower has observed the Lease at least once
    began = time.monotonic()
    if cut:
        proxy.freeze()
    else:
        a.request_stop()
    await asyncio.wait_for(b_lead.started.wait(), 120)
    took = (b_lead.started_at or 0) - began
    with contextlib.suppress(LeaderElectionLostError):
        await asyncio.wait_for(a_run, 60)
    gap = (b_lead.started_at or 0) - (a_lead.stopped_at or 0)
    b.request_stop()
    await asyncio.wait_for(b_run, 60)
    proxy.thaw()
    await proxy.stop()
    return {"failover_seconds": took, "gap_seconds": gap}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def start_to_ready(plane: ControlPlane, n: int) -> dict[str, Any]:
    namespace = f"ready-{uuid.uuid4().hex[:6]}"
    await create_tasks(plane.kubeconfig, namespace, n)
    port = _free_port()
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controllers", "--kubeconfig", str(plane.kubeconfig),
        "--namespace", namespace, "--metrics-bind-address", "0",
        "--health-probe-bind-address", f"127.0.0.1:{port}", "--log-level", "warning",
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/readyz") as answer:
                        if answer.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)
        ready = time.monotonic() - started
        config = await load_kubeconfig(plane.kubeconfig)
        async with Transport(config) as transport:
            path = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
            while True:
                items = (await transport.get_json(path))["items"]
                if all((item.get("status") or {}).get("state") for item in items):
                    break
                await asyncio.sleep(0.2)
        reconciled = time.monotonic() - started
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    return {"objects": n, "ready_seconds": ready, "all_reconciled_seconds": reconciled}


async def main_async(trials: int, objects: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with ControlPlane() as plane:
        for cut in (False, True):
            label = "cut" if cut else "clean"
            runs = []
            for i in range(trials):
                runs.append(await failover_trial(plane, cut=cut))
                print(f"failover ({label}) trial {i + 1}: {runs[-1]}", flush=True)
            results[f"failover_{label}"] = {
                "median_seconds": statistics.median(r["failover_seconds"] for r in runs),
                "min_gap_seconds": min(r["gap_seconds"] for r in runs),
                "runs": runs,
            }
        results["start_to_ready"] = await start_to_ready(plane, objects)
    print(json.dumps(results, indent=2))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.manager_timing", description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = asyncio.run(main_async(args.trials, args.objects))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
