"""One replica of a sharded Task controller, for the ring tests.

    python -m tests.integration.shard_replica KUBECONFIG NAMESPACE RING IDENTITY DIR [TIMINGS]

Runs a manager (namespace NAMESPACE) in the shard ring RING (Leases in NAMESPACE, short
timings: lease 6 s, renew deadline 4 s, retry 1 s, or TIMINGS ``lease,deadline,retry``) with
the Task reconciler. Writes:

* ``DIR/IDENTITY.ledger``: ``start KEY T`` before and ``end KEY T`` after every reconcile
  (``T`` from ``time.monotonic()``, one clock for every process of the machine);
* ``DIR/IDENTITY.json`` every 0.2 s: slots worked on, members seen, objects in the cache,
  objects received by the slot informers (before client-side filtering).

Each reconcile also waits ``RECONCILE_SECONDS`` (0.02 s) so that overlapping reconciles would
have room to show in the ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from controller_runtime import Request, Result
from controller_runtime.controller import ControllerOptions
from controller_runtime.manager import Manager, ManagerOptions, run_until_signalled
from controller_runtime.sharding import ShardRingConfig
from controllers.task import TaskReconciler, setup_sharded_task_controller
from kubeclient.config import load_kubeconfig

RECONCILE_SECONDS = 0.02


async def main(
    kubeconfig: str,
    namespace: str,
    ring: str,
    identity: str,
    out: Path,
    *,
    timings: tuple[float, float, float] = (6, 4, 1),
) -> int:
    lease, deadline, retry = timings
    manager = Manager(
        await load_kubeconfig(kubeconfig),
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            graceful_shutdown_timeout=10,
            shard_ring=ShardRingConfig(
                ring,
                namespace,
                identity=identity,
                lease_duration=lease,
                renew_deadline=deadline,
                retry_period=retry,
                drain_timeout=5,
            ),
        ),
    )
    sharded = await setup_sharded_task_controller(
        manager, manager.client, options=ControllerOptions(max_concurrent_reconciles=4)
    )
    ledger = (out / f"{identity}.ledger").open("a", buffering=1)
    inner = TaskReconciler(manager.client)

    async def reconcile(request: Request) -> Result | None:
        key = f"{request.namespace}/{request.name}"
        ledger.write(f"start {key} {time.monotonic():.6f}\n")
        try:
            await asyncio.sleep(RECONCILE_SECONDS)
            return await inner.reconcile(request)
        finally:
            ledger.write(f"end {key} {time.monotonic():.6f}\n")

    sharded.reconciler = reconcile
    assert manager.shard_ring is not None
    shard_ring = manager.shard_ring

    async def report() -> None:
        status = out / f"{identity}.json"
        while True:
            informers = list(sharded.entry.informers.values())
            filters = [i.reflector.shard_filter for i in informers]
            state = {
                "slots": sorted(shard_ring.active),
                "members": shard_ring.members,
                "objects": sum(len(i.store) for i in informers),
                "received": sum(f.received for f in filters if f is not None),
                "synced": sharded.has_synced,
            }
            tmp = status.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, status)
            await asyncio.sleep(0.2)

    reporting = asyncio.create_task(report())
    try:
        await run_until_signalled(manager)
    finally:
        reporting.cancel()
        ledger.close()
    return 0


if __name__ == "__main__":
    kubeconfig, namespace, ring, identity, out = sys.argv[1:6]
    lease, deadline, retry = (float(t) for t in (sys.argv[6:7] or ["6,4,1"])[0].split(","))
    sys.exit(
        asyncio.run(
            main(kubeconfig, namespace, ring, identity, Path(out), timings=(lease, deadline, retry))
        )
    )
