"""Time to sync N custom resources from a real API server, with memory per cached object.

    python -m bench.informer_sync --objects 10000 [--objects 100000] [--json FILE]

Starts the local control plane (or uses ``--kubeconfig``), creates N Tasks in a fresh
namespace, then runs each sync mode in a fresh interpreter so that memory figures are the
informer's own:

- ``streaming``: a streaming list (watch with ``sendInitialEvents``), the default;
- ``list``: LIST (``resourceVersion=0``, pages of 500 when the server pages) then WATCH.

Reported per mode: seconds from informer start to synced, peak RSS of that process, RSS
growth per cached object, and the average size of a cached object's JSON (after the default
transform drops managedFields) for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from controller_runtime.envtest import ControlPlane
from informers.reflector_machine import ReflectorOptions
from informers.shared import SharedInformer
from kubeclient.config import load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.transport import Transport

TASKS = "tasks.crpy.io/v1"


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def create_tasks(kubeconfig: Path, namespace: str, n: int) -> float:
    config = await load_kubeconfig(kubeconfig)
    async with Transport(config) as transport:
        await transport.request(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
        )
        base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
        names = iter(range(n))
        started = time.monotonic()
        done = 0

        async def worker() -> None:
            nonlocal done
            for i in names:
                body = {
                    "apiVersion": TASKS,
                    "kind": "Task",
                    "metadata": {"name": f"task-{i:06d}", "labels": {"app": "bench"}},
                    "spec": {"priority": 1 + i % 3, "details": f"benchmark task number {i}"},
                }
                await transport.request("POST", base, body=body)
                done += 1
                if done % 10000 == 0:
                    print(f"  created {done}/{n} ({time.monotonic() - started:.0f}s)", flush=True)

        await asyncio.gather(*(worker() for _ in range(64)))
        return time.monotonic() - started


async def sync_once(kubeconfig: Path, namespace: str, mode: str) -> dict[str, Any]:
    config = await load_kubeconfig(kubeconfig)
    async with Transport(config) as transport:
        resource_info = await Discovery(transport).resolve(TASKS, "Task")
        baseline = _rss()
        informer = SharedInformer(
            transport,
            resource_info,
            namespace=namespace,
            options=ReflectorOptions(streaming_list=(mode == "streaming")),
        )
        started = time.monotonic()
        informer.start()
        synced = await informer.wait_for_sync(600)
        seconds = time.monotonic() - started
        store = informer.store
        count = len(store)
        keys = store.keys()
        json_bytes = sum(len(store.get_raw(k) or b"") for k in keys)
        grown = _rss() - baseline
        await informer.stop()
    return {
        "mode": mode,
        "synced": synced,
        "objects": count,
        "seconds": seconds,
        "per_second": count / seconds if seconds else 0.0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_per_object": grown / count if count else 0.0,
        "json_per_object": json_bytes / count if count else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.informer_sync", description=__doc__)
    parser.add_argument("--objects", type=int, action="append", help="(repeatable) default 10000")
    parser.add_argument("--kubeconfig", type=Path, help="use this cluster, not a local one")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--child", nargs=3, metavar=("KUBECONFIG", "NAMESPACE", "MODE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        result = asyncio.run(sync_once(Path(args.child[0]), args.child[1], args.child[2]))
        print(json.dumps(result))
        return

    results: list[dict[str, Any]] = []
    plane = None if args.kubeconfig else ControlPlane()
    try:
        if plane is not None:
            plane.start()
        kubeconfig = args.kubeconfig or (plane.kubeconfig if plane else None)
        assert kubeconfig is not None
        for n in args.objects or [10000]:
            namespace = f"bench-{uuid.uuid4().hex[:6]}"
            print(f"creating {n} Tasks in {namespace} ...", flush=True)
            took = asyncio.run(create_tasks(kubeconfig, namespace, n))
            print(f"  created in {took:.0f}s ({n / took:.0f}/s)", flush=True)
            for mode in ("streaming", "list"):
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.informer_sync",
                        "--child",
                        str(kubeconfig),
                        namespace,
                        mode,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                results.append(result)
                peak_mib = result["peak_rss_bytes"] / 2**20
                print(
                    f"  {mode:9} {result['objects']:>7} objects  {result['seconds']:6.2f}s  "
                    f"{result['per_second']:>8.0f}/s  peak RSS {peak_mib:6.1f} MiB  "
                    f"{result['rss_per_object']:6.0f} B/object "
                    f"(JSON {result['json_per_object']:.0f} B)",
                    flush=True,
                )
    finally:
        if plane is not None:
            plane.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
