"""Process RSS before, during and after a controller over N ConfigMaps is added to a running
manager and stopped: what a stopped controller gives back.

    python -m bench.dynamic_release [--objects 10000] [--keep-freed] [--json FILE]

Starts the local control plane, creates N ConfigMaps (about 1 KiB each) in a fresh namespace,
runs a Manager (no leader election, no servers) in this process, and reads this process's RSS
(``/proc/self/statm``) at: the running manager with no controller (baseline); the controller
added and its informer synced; the controller stopped (``remove_controller``) and
``gc.collect()`` run, then 1 and 5 seconds later. The API server's open watches on
ConfigMaps are read beside (``apiserver_longrunning_requests``). Where the RSS is: the C
heap (``[heap]`` in ``/proc/self/smaps``, glibc's ``malloc``: bodies above 512 B) and the
anonymous mappings (CPython's 1 MiB arenas for smaller objects, thread stacks). The time the
factory's :func:`~informers.memory.release_freed_memory` took is reported too.

``--keep-freed`` skips that call (the informer's store is still freed at the stop): what
the C library keeps without it. One process, one run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import uuid
from pathlib import Path
from typing import Any

from controller_runtime import ControllerBuilder, Request
from controller_runtime.envtest import ControlPlane
from controller_runtime.manager import Manager, ManagerOptions
from informers import memory, shared
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def _where() -> dict[str, int]:
    """Resident bytes of the C heap and of anonymous mappings (``/proc/self/smaps``)."""
    out = {"heap": 0, "anonymous": 0}
    region = ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=6)
            if head and not head[0].endswith(":"):  # a mapping's first line
                name = head[5].strip() if len(head) > 5 else ""
                region = "heap" if name == "[heap]" else ("anonymous" if not name else "")
            elif head and head[0] == "Rss:" and region:
                out[region] += int(head[1]) * 1024
    return out


async def _watches(transport: Transport) -> float:
    text = (await transport.request("GET", "/metrics")).body.decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_longrunning_requests{")
        and 'verb="WATCH"' in line
        and 'resource="configmaps"' in line
    )


async def _create_configmaps(transport: Transport, namespace: str, n: int) -> None:
    gate = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        async with gate:
            await transport.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/configmaps",
                body={"metadata": {"name": f"cm-{i:06d}"}, "data": {"v": "x" * 1000}},
            )

    await asyncio.gather(*(create(i) for i in range(n)))


async def measure(kubeconfig: Path, n: int, *, keep_freed: bool = False) -> dict[str, Any]:
    trims: list[float] = []

    def timed_release() -> bool:
        started = time.perf_counter()
        try:
            return False if keep_freed else memory.release_freed_memory()
        finally:
            trims.append(time.perf_counter() - started)

    shared.release_freed_memory = timed_release  # type: ignore[attr-defined]
    config = await load_kubeconfig(kubeconfig)
    namespace = f"bench-release-{uuid.uuid4().hex[:6]}"
    async with Transport(config) as transport:
        await transport.request(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
        )
        await _create_configmaps(transport, namespace, n)
        manager = Manager(
            config,
            ManagerOptions(
                namespaces=[namespace], metrics_bind_address=None, health_probe_bind_address=None
            ),
        )
        running = asyncio.create_task(manager.run())
        while not manager.is_leader:  # noqa: ASYNC110 (a figure, not a test)
            await asyncio.sleep(0.05)
        gc.collect()
        figures: dict[str, Any] = {"objects": n, "baseline_rss": _rss()}
        figures["baseline_where"] = _where()
        figures["baseline_watches"] = await _watches(transport)
        done = asyncio.Event()
        seen: set[str] = set()

        async def reconcile(request: Request) -> None:
            seen.add(request.name)
            if len(seen) >= n:
                done.set()

        controller = await (
            ControllerBuilder(manager)
            .named("release")
            .for_("v1", "ConfigMap")
            .with_options(max_concurrent_reconciles=4)
            .complete(reconcile)
        )
        await manager.add_controller(controller)
        await done.wait()
        figures["running_rss"] = _rss()
        figures["running_where"] = _where()
        figures["running_watches"] = await _watches(transport)
        started = time.monotonic()
        await manager.remove_controller(controller)
        gc.collect()
        figures["stop_seconds"] = time.monotonic() - started
        figures["stopped_rss"] = _rss()
        await asyncio.sleep(1)
        figures["stopped_rss_1s"] = _rss()
        await asyncio.sleep(4)
        figures["stopped_rss_5s"] = _rss()
        figures["stopped_where"] = _where()
        figures["release_seconds"] = sum(trims)
        figures["released"] = not keep_freed
        figures["stopped_watches"] = await _watches(transport)
        manager.request_stop()
        await running
        await transport.request("DELETE", f"/api/v1/namespaces/{namespace}")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dynamic_release", description=__doc__)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument(
        "--keep-freed",
        action="store_true",
        help="do not give the freed pages back to the system (what the allocator keeps)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with ControlPlane() as plane:
        figures = asyncio.run(measure(plane.kubeconfig, args.objects, keep_freed=args.keep_freed))
    mib = 2**20
    print(
        f"{figures['objects']} ConfigMaps: RSS {figures['baseline_rss'] / mib:.1f} MiB before, "
        f"{figures['running_rss'] / mib:.1f} MiB with the controller, "
        f"{figures['stopped_rss'] / mib:.1f} MiB at stop ({figures['stop_seconds']:.2f} s), "
        f"{figures['stopped_rss_1s'] / mib:.1f} MiB 1 s and "
        f"{figures['stopped_rss_5s'] / mib:.1f} MiB 5 s later; API server watches on "
        f"ConfigMaps {figures['baseline_watches']:.0f} -> {figures['running_watches']:.0f} -> "
        f"{figures['stopped_watches']:.0f}"
    )
    for moment in ("baseline", "running", "stopped"):
        where = figures[f"{moment}_where"]
        print(
            f"  {moment:<8} C heap {where['heap'] / mib:6.1f} MiB, anonymous mappings "
            f"{where['anonymous'] / mib:6.1f} MiB"
        )
    trimmed = "skipped (--keep-freed)" if args.keep_freed else "ran"
    print(f"  release_freed_memory {trimmed}: {figures['release_seconds'] * 1000:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
