"""Sharded Task controllers in separate processes on the real control plane: the replicas
split the Tasks, a 4th joins, one is SIGKILLed and another cut off by a frozen proxy, the cut-off
one comes back, one leaves cleanly; the ledger of every reconcile shows that no two replicas
ever reconciled one Task at overlapping times, and the API server's audit log shows how long
each slot went without a claimant around each event. Run with the ``ShardedListAndWatch`` gate
on (the server filters) and off (the replicas filter)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport
from tests.integration.ring_support import (
    SLOTS,
    Replica,
    balanced,
    create_tasks,
    identity_kubeconfig,
    keep_touching,
    lease_changes,
    longest,
    overlaps,
    start_replica,
    unclaimed_gaps,
    until,
    until_converged,
)


async def scenario(
    plane: ControlPlane, namespace: str, count: int, out: Path, *, server_filters: bool
) -> dict[str, float]:
    """The whole story; returns the timings measured (seconds) and the longest time a slot
    went without a claimant around each event (``gap_*``)."""
    timings: dict[str, float] = {}
    assert plane.audit_log is not None
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
        await create_tasks(transport, namespace, count)
        host, port = plane.server.removeprefix("https://").rsplit(":", 1)
        proxy = await FaultProxy(host, int(port)).start()
        ring = f"tasks-{uuid.uuid4().hex[:6]}"
        replicas: list[Replica] = []
        touching: asyncio.Task[int] | None = None
        moments: dict[str, float] = {}  # wall clock, the audit log's

        def replica(name: str, via: FaultProxy | None = None) -> Replica:
            config = identity_kubeconfig(plane, name, out, via)
            return start_replica(config, namespace, ring, name, out)

        try:
            a = replica("replica-a")
            b = replica("replica-b")
            c = replica("replica-c", proxy)
            replicas = [a, b, c]
            await until(lambda: balanced(replicas), 120, "3 replicas to split the slots")
            timings["converge_3"] = await until_converged(transport, namespace, 600)
            # Each replica's cache holds its share: about a third, never everything. Judged on
            # one status snapshot per replica, taken when the ring is balanced and every cache
            # synced (on a loaded machine a replica may miss its renew deadline and hand its
            # slots over for a while: then the others hold more, and the check waits).
            snapshots: list[dict[str, Any]] = []

            def settled() -> bool:
                snapshots[:] = [r.status() for r in replicas]
                slots = sorted(s for snap in snapshots for s in snap["slots"])
                loads = [len(snap["slots"]) for snap in snapshots]
                return (
                    slots == list(range(SLOTS))
                    and max(loads) - min(loads) <= 1
                    and all(snap["synced"] for snap in snapshots)
                    and sum(snap["objects"] for snap in snapshots) == count
                )

            await until(settled, 300, "the ring balanced with every cache synced")
            for member, snap in zip(replicas, snapshots, strict=True):
                objects = snap["objects"]
                share = len(snap["slots"]) / SLOTS
                assert abs(objects - share * count) <= 0.15 * count, (member.identity, objects)
                assert objects < 0.5 * count
                # Objects received (list items and watch events, before client-side
                # filtering): a share when the server filters; every object once per owned
                # slot when it does not.
                received = snap["received"]
                if server_filters:
                    assert received < count, (member.identity, received)
                else:
                    assert received >= len(snap["slots"]) * count, (member.identity, received)

            # A 4th replica joins while Tasks keep changing.
            stop = asyncio.Event()
            touching = asyncio.create_task(keep_touching(transport, namespace, count, stop))
            moments["join"] = time.time()
            d = replica("replica-d")
            replicas.append(d)
            timings["join"] = await until(lambda: balanced(replicas), 120, "4 replicas balanced")
            moments["joined"] = time.time()

            # SIGKILL b, and cut c off from the API server (frozen, not closed).
            held_by_gone = b.slots() | c.slots()
            moments["crash"] = b.kill()
            proxy.freeze()
            survivors = [a, d]
            timings["crash_and_cut_off"] = await until(
                lambda: balanced(survivors), 120, "the 2 survivors to take every slot"
            )
            moments["taken_over"] = time.time()
            # c noticed by its own renew deadline and dropped everything.
            await until(lambda: not c.slots(), 30, "the cut-off replica to drop its slots")
            stop.set()
            timings["touched"] = await touching
            timings["converge_after_crash"] = await until_converged(transport, namespace, 600)

            # c comes back and rejoins; then a leaves cleanly (SIGTERM drains and releases)
            # while Tasks keep changing, and the changes to a's Tasks are not lost.
            moments["thaw"] = time.time()
            proxy.thaw()
            back = [a, c, d]
            await until(lambda: balanced(back), 120, "the cut-off replica to rejoin")
            moments["rejoined"] = time.time()
            stop = asyncio.Event()
            touching = asyncio.create_task(keep_touching(transport, namespace, count, stop))
            moments["leave"] = time.time()
            leaving = asyncio.create_task(asyncio.to_thread(a.terminate))
            timings["clean_leave"] = await until(
                lambda: balanced([c, d]), 120, "the others to take over a clean leave"
            )
            moments["left"] = time.time()
            assert await leaving == 0
            stop.set()
            timings["touched_during_leave"] = await touching
            timings["converge_after_leave"] = await until_converged(transport, namespace, 600)

            total, found = overlaps([a, b, c, d], time.monotonic())
            assert total >= count  # every Task was reconciled at least once
            assert not found, "overlapping reconciles:\n" + "\n".join(found[:20])
            timings["reconciles"] = total

            # How long slots went without a claimant (a live replica's Lease claiming them),
            # from the API server's own record of every Lease write.
            changes = lease_changes(plane.audit_log, namespace, ring)
            crash = unclaimed_gaps(
                changes,
                since=moments["crash"],
                until=moments["taken_over"],
                not_counted={
                    "replica-b": [(moments["crash"], float("inf"))],
                    "replica-c": [(moments["crash"], moments["thaw"])],
                },
            )
            gaps = {
                "join": unclaimed_gaps(changes, since=moments["join"], until=moments["joined"]),
                "crash_other_slots": [g for g in crash if g.slot not in held_by_gone],
                "crash_their_slots": [g for g in crash if g.slot in held_by_gone],
                "rejoin": unclaimed_gaps(changes, since=moments["thaw"], until=moments["rejoined"]),
                "clean_leave": unclaimed_gaps(
                    changes, since=moments["leave"], until=moments["left"]
                ),
            }
            for event, found_gaps in gaps.items():
                timings[f"gap_{event}"] = round(longest(found_gaps), 3)
            # Measured and reported (docs/scaling.md), not asserted here: with the short
            # timings of these replicas (retry 1 s) on a loaded machine the survivors
            # themselves may miss a renew deadline now and then (fenced, they hand over
            # too); test_sharding_membership.py asserts the bound with longer timings.
            print("longest unclaimed gaps (s):", {e: timings[f"gap_{e}"] for e in gaps})
        finally:
            if touching is not None and not touching.done():
                touching.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await touching
            for member in replicas:
                if member.process.poll() is None:
                    member.process.kill()
                    member.process.wait(10)
            await proxy.stop()
    return timings


async def test_replicas_share_10k_tasks_and_hand_over_without_overlap(
    audited_plane: ControlPlane, tmp_path: Path
) -> None:
    namespace = f"t-ring-{uuid.uuid4().hex[:8]}"
    async with Transport(await load_kubeconfig(audited_plane.kubeconfig)) as transport:
        await transport.request(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
        )
    timings = await scenario(audited_plane, namespace, 10_000, tmp_path, server_filters=True)
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
