"""A restart of the sharded Task controller with 1, 2, 4 ... replicas over N existing Tasks.

Run ``python -m bench.sharded_restart --objects 20000 --replicas 1,2,4`` (``--gate off`` for
the API server without ``ShardedListAndWatch``: the replicas then filter on the client).

It starts a local control plane (feature gate as asked), creates N Tasks and lets a
warm-up ring converge them (not measured), so that every measured run is a restart: each Task
is reconciled once and nothing needs writing. Then, per replica count R, it starts R replica
processes at once (each through a proxy of its own that counts the bytes the API server sends
it) and measures:

* **time to all reconciled**: from spawning the processes until every Task has been
  reconciled at least once by some replica (including the ring's start-up handovers, as the
  replicas appear one after another);
* **peak RSS** of each replica (``VmHWM``), and the objects its cache held at the end;
* **bytes sent** by the API server to each replica (TLS records, ring Leases included).

Replica processes run ``python -m bench.sharded_restart replica ...`` (default ring timings:
lease 15 s, renew deadline 10 s, retry 2 s, settle 4 s unless ``--settle``; 4 workers per
slot). Prints one JSON
line per run; replica logs stay in the directory printed first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


# -- a replica ------------------------------------------------------------------------------


REPLICA_SYNC_TIMEOUT = 3600.0
"""Seconds a replica's initial list may take: the driver's own timeout bounds the run, and a
replica's share of a million objects can take longer than the runtime's default 120 s."""


async def replica(  # noqa: PLR0917 (a bench entry point)
    kubeconfig: str, namespace: str, ring: str, identity: str, out: Path, settle: float | None
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

    manager = Manager(
        await load_kubeconfig(kubeconfig),
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            shard_ring=ShardRingConfig(ring, namespace, identity=identity, settle=settle),
            cache_sync_timeout=REPLICA_SYNC_TIMEOUT,
        ),
    )
    sharded = await setup_sharded_task_controller(
        manager,
        manager.client,
        options=ControllerOptions(
            max_concurrent_reconciles=4, cache_sync_timeout=REPLICA_SYNC_TIMEOUT
        ),
    )
    inner = TaskReconciler(manager.client)
    seen: set[str] = set()

    async def reconcile(request: Request) -> Result | None:
        seen.add(f"{request.namespace}/{request.name}")
        return await inner.reconcile(request)

    sharded.reconciler = reconcile

    async def report() -> None:
        status = out / f"{identity}.json"
        while True:
            state = {
                "reconciled": len(seen),
                "objects": sum(len(i.store) for i in sharded.entry.informers.values()),
                "slots": len(sharded.controllers),
            }
            tmp = status.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, status)
            await asyncio.sleep(0.25)

    reporting = asyncio.create_task(report())
    try:
        await run_until_signalled(manager)
    finally:
        reporting.cancel()
    return 0


# -- the driver -----------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float | None:
    from bench.procs import cpu_seconds  # noqa: PLC0415

    return cpu_seconds([pid])


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def create_tasks(transport: Any, namespace: str, count: int) -> None:
    path = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            body = {
                "apiVersion": "tasks.crpy.io/v1",
                "kind": "Task",
                "metadata": {"name": f"task-{i:06d}"},
                "spec": {"title": f"task {i}", "priority": 1 + i % 3},
            }
            await transport.request("POST", path, body=body)

    await asyncio.gather(*(worker() for _ in range(32)))


async def run_ring(  # noqa: PLR0917 (a bench driver)
    plane: Any,
    namespace: str,
    replicas: int,
    count: int,
    out: Path,
    timeout: float,
    settle: float | None,
    *,
    proxied: bool = True,
) -> dict[str, Any]:
    """Start ``replicas`` replicas at once; measure until ``count`` Tasks were reconciled.
    ``proxied`` (default): each talks through a proxy of its own that counts the bytes the
    API server sends it (``mib_from_apiserver``); without, straight to the API server (no
    proxy CPU beside them)."""
    from controller_runtime.envtest.faultproxy import FaultProxy  # noqa: PLC0415

    ring = f"bench-{uuid.uuid4().hex[:6]}"
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    proxies, processes, names = [], [], []
    started = time.monotonic()
    for i in range(replicas):
        kubeconfig = out / f"{ring}-{i}.yaml"
        if proxied:
            proxy = await FaultProxy(host, int(port)).start()
            proxies.append(proxy)
            kubeconfig.write_text(plane.kubeconfig.read_text().replace(plane.server, proxy.url))
        else:
            kubeconfig.write_text(plane.kubeconfig.read_text())
        name = f"{ring}-r{i}"
        log = (out / f"{name}.log").open("wb")
        processes.append(
            subprocess.Popen(  # noqa: ASYNC220 (started once per run, not on a hot path)
                [
                    sys.executable,
                    "-m",
                    "bench.sharded_restart",
                    "replica",
                    str(kubeconfig),
                    namespace,
                    ring,
                    name,
                    str(out),
                    "" if settle is None else str(settle),
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        names.append(name)

    def states() -> list[dict[str, Any]]:
        result = []
        for name in names:
            try:
                result.append(json.loads((out / f"{name}.json").read_text()))
            except (FileNotFoundError, json.JSONDecodeError):
                result.append({"reconciled": 0, "objects": 0, "slots": 0})
        return result

    try:
        while sum(s["reconciled"] for s in states()) < count:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{replicas} replicas: not all {count} Tasks reconciled")
            for p in processes:
                if p.poll() is not None:
                    raise RuntimeError(f"a replica exited with {p.returncode}; see {out}")
            await asyncio.sleep(0.25)
        elapsed = time.monotonic() - started
        await asyncio.sleep(1.0)  # a last status write after the final reconciles
        final = states()
    except BaseException:
        for p in processes:
            p.kill()
        raise
    result = {
        "replicas": replicas,
        "objects": count,
        "seconds_to_all_reconciled": round(elapsed, 2),
        "peak_rss_mib": [round(peak_rss_mib(p.pid), 1) for p in processes],
        "cached_objects": [s["objects"] for s in final],
        "slots": [s["slots"] for s in final],
        "mib_from_apiserver": [round(p.bytes_to_client / 2**20, 1) for p in proxies],
        "cpu_seconds": [_cpu_seconds(p.pid) for p in processes],
    }
    for p in processes:
        p.send_signal(signal.SIGTERM)
    for p in processes:
        await asyncio.to_thread(p.wait, 60)
    for proxy in proxies:
        await proxy.stop()
    return result


async def drive(
    objects: int, replica_counts: list[int], gate: bool, timeout: float, settle: float | None
) -> None:
    import tempfile  # noqa: PLC0415

    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    with ControlPlane(feature_gates={"ShardedListAndWatch": gate}) as plane:
        async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
            namespace = "bench-sharded"
            await transport.request(
                "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
            )
            t0 = time.monotonic()
            await create_tasks(transport, namespace, objects)
            print(json.dumps({"created": objects, "seconds": round(time.monotonic() - t0, 1)}))
            out = Path(tempfile.mkdtemp(prefix="crpy-bench-shard-"))
            print(json.dumps({"logs": str(out)}))
            warm = await run_ring(plane, namespace, 4, objects, out, timeout, None)
            print(json.dumps({"warm_up": warm}), flush=True)
            for count in replica_counts:
                result = await run_ring(plane, namespace, count, objects, out, timeout, settle)
                result["settle"] = settle
                result["gate"] = "on" if gate else "off"
                print(json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "replica":
        kubeconfig, namespace, ring, identity, out = args[1:6]
        settle = float(args[6]) if len(args) > 6 and args[6] else None
        return asyncio.run(replica(kubeconfig, namespace, ring, identity, Path(out), settle))
    p = argparse.ArgumentParser(prog="python -m bench.sharded_restart", description=__doc__)
    p.add_argument("--objects", type=int, default=20_000)
    p.add_argument("--replicas", default="1,2,4", help="comma-separated replica counts")
    p.add_argument("--gate", choices=["on", "off"], default="on")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument(
        "--settle", type=float, default=None, help="the ring's settle (s) in the measured runs"
    )
    opts = p.parse_args(args)
    counts = [int(c) for c in opts.replicas.split(",")]
    asyncio.run(drive(opts.objects, counts, opts.gate == "on", opts.timeout, opts.settle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
