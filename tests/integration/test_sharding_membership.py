"""Membership of the shard ring after a crash and after a fence, with real replica processes:
the API server's audit log shows how long each slot went without a claimant.

* A replacement started after a member was SIGKILLed never counts the dead member: its Lease
  was deleted by the survivors once it expired (the replacement, which never saw it renew,
  would otherwise count it for a whole lease duration and leave slots unclaimed); a clean
  leave hands over at once.
* A replica fenced at its renew deadline deletes its Lease and is no member while it backs
  off: the others do not hand it slots it would not claim before its back-off ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from kubeclient.transport import Transport
from tests.integration.ring_support import (
    Ring,
    balanced,
    create_tasks,
    lease_changes,
    longest,
    unclaimed_gaps,
    until,
    until_converged,
)

pytestmark = pytest.mark.integration

TASKS = 300
LEASE, DEADLINE, RETRY = 12.0, 8.0, 2.0
"""Longer than shard_replica's default timings: on a loaded machine a replica's event loop may
lag by a second or more, and the bound under test (2 x the retry period) must measure the
protocol, not that lag. The effects under test scale with the timings (a lease duration, a
back-off of settle x 2 = 4 retry periods), so they stay well apart from the bound."""
TIMINGS = (LEASE, DEADLINE, RETRY)


async def test_a_replacement_after_a_crash_and_a_clean_leave_leave_no_slot_waiting(
    audited_plane: ControlPlane, audited_admin: Transport, audited_namespace: str, tmp_path: Path
) -> None:
    """c is SIGKILLed; once the survivors took its slots (the crash's own cost: its Lease must
    expire), a replacement d joins: it must never count the dead member (whose Lease the
    survivors deleted once it expired; a newcomer that never saw it renew would otherwise count
    it for a whole lease duration, and the slots the others handed over for a division without
    it would wait). Then a leaves cleanly. Around the join and the leave no slot may go without
    a claimant for more than 2 retry periods."""
    assert audited_plane.audit_log is not None
    admin, namespace = audited_admin, audited_namespace
    await create_tasks(admin, namespace, TASKS)
    ring = Ring(audited_plane, namespace, tmp_path, TIMINGS)
    try:
        a, b, c = ring.start("replica-a"), ring.start("replica-b"), ring.start("replica-c")
        await until(lambda: balanced([a, b, c]), 180, "3 replicas to split the slots")
        killed = c.kill()
        await until(lambda: balanced([a, b]), 180, "the survivors to take the dead one's slots")
        joined = time.time()
        d = ring.start("replica-d")
        seen_by_d: set[str] = set()

        def settled() -> bool:
            seen_by_d.update(d.status()["members"])
            return balanced([a, b, d])

        await until(settled, 180, "the replacement to take its share")
        joined_done = time.time()
        leaving = time.time()
        assert await asyncio.to_thread(a.terminate) == 0
        await until(lambda: balanced([b, d]), 180, "the others to take over a clean leave")
        left = time.time()
        await until_converged(admin, namespace, 300)
    finally:
        ring.stop()
    changes = lease_changes(audited_plane.audit_log, namespace, ring.name)
    dead = {"replica-c": [(killed, float("inf"))]}
    join = unclaimed_gaps(changes, since=joined, until=joined_done, not_counted=dead)
    leave = unclaimed_gaps(changes, since=leaving, until=left, not_counted=dead)
    print(
        "longest unclaimed gap (s): replacement after a crash",
        json.dumps(round(longest(join), 3)),
        "clean leave",
        json.dumps(round(longest(leave), 3)),
    )
    assert "replica-c" not in seen_by_d, "the replacement counted the dead member"
    assert longest(join) <= 2 * RETRY, join
    assert longest(leave) <= 2 * RETRY, leave


async def test_a_fenced_replica_is_no_member_until_its_back_off_ends(
    audited_plane: ControlPlane, audited_admin: Transport, audited_namespace: str, tmp_path: Path
) -> None:
    """c is cut off (a frozen connection) until its watchdog fenced it, then reconnected at
    once, well within its back-off (settle x 2 = 4 retry periods): the others must not count
    it as a member until it is ready to claim, so no slot waits for it."""
    assert audited_plane.audit_log is not None
    admin, namespace = audited_admin, audited_namespace
    await create_tasks(admin, namespace, TASKS)
    host, port = audited_plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    ring = Ring(audited_plane, namespace, tmp_path, TIMINGS)
    try:
        a, b = ring.start("replica-a"), ring.start("replica-b")
        c = ring.start("replica-c", proxy)
        await until(lambda: balanced([a, b, c]), 180, "3 replicas to split the slots")
        frozen = time.time()
        proxy.freeze()
        await until(lambda: not c.slots(), 60, "the cut-off replica to be fenced")
        thawed = time.time()
        proxy.thaw()
        await until(lambda: balanced([a, b, c]), 180, "the fenced replica to rejoin")
        done = time.time()
        await until_converged(admin, namespace, 300)
    finally:
        ring.stop()
        proxy.thaw()
        await proxy.stop()
    changes = lease_changes(audited_plane.audit_log, namespace, ring.name)
    gaps = unclaimed_gaps(
        changes, since=thawed, until=done, not_counted={"replica-c": [(frozen, thawed)]}
    )
    print("longest unclaimed gap (s): rejoin after a fence", json.dumps(round(longest(gaps), 3)))
    assert longest(gaps) <= 2 * RETRY, gaps
