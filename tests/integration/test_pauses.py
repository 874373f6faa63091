"""A whole process paused (SIGSTOP) past its renew deadline, with work falling due during the
pause, then resumed (SIGCONT) -- a shard ring replica, and a leader-elected operator. Checked
from the API server's audit log (``audited_plane``): after the pause, the paused process sends
nothing for what it lost.

* The ring replica: its first request about its Lease after the pause claims nothing (it is
  the delete of the fenced replica's Lease); every Task status or Event it writes after the
  pause is for a slot it claimed again, in a Lease write sent after the pause.
* The leader: no write at all after the pause; it steps down (exit status 1).

The work due: Tasks whose deadline falls within the pause, reconciled by the paused process
before it (so a requeue for the deadline is pending in it), taken over by the others during
the pause (their status turns Overdue, written by another identity).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.audit import AuditEvent, audit_events
from controller_runtime.sharding import CLAIMS_ANNOTATION, ShardRingConfig
from kubeclient.transport import Transport
from tests.integration.ring_support import (
    DEADLINE,
    REPO,
    TASKS_PATH,
    Ring,
    balanced,
    create_tasks,
    identity_kubeconfig,
    list_tasks,
    slot_of,
    until,
    until_converged,
)

pytestmark = pytest.mark.integration

TASKS = 300
DUE = 24
"""Tasks given a deadline within the pause."""
DUE_IN = 10.0
"""Seconds from setting the deadlines to the deadline: the paused process reconciles them
first (status OnTime, a requeue pending for the deadline), then is stopped."""


def _rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def give_deadlines(admin: Transport, namespace: str, names: list[str], at: float) -> None:
    path = TASKS_PATH.format(namespace)
    for name in names:
        await admin.request(
            "PATCH",
            f"{path}/{name}",
            body={"spec": {"deadline": _rfc3339(at)}},
            content_type="application/merge-patch+json",
        )


async def states(admin: Transport, namespace: str, names: list[str]) -> dict[str, str]:
    wanted = set(names)
    out: dict[str, str] = {}
    for task in await list_tasks(admin, namespace):
        name = task["metadata"]["name"]
        if name in wanted:
            status = task.get("status") or {}
            fresh = status.get("observedGeneration") == task["metadata"]["generation"]
            out[name] = str(status.get("state")) if fresh else "stale"
    return out


async def until_states(
    admin: Transport, namespace: str, names: list[str], ok: set[str], *, timeout: float, what: str
) -> None:
    started = time.monotonic()
    while True:
        now = await states(admin, namespace, names)
        if all(now.get(n) in ok for n in names):
            return
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out waiting for {what}: {now}")
        await asyncio.sleep(0.2)


def writes_by(audit_log: Path, user: str, namespace: str) -> Iterator[AuditEvent]:
    for event in audit_events(audit_log):
        if event.user == user and event.namespace == namespace:
            yield event


def _claims(obj: dict[str, Any] | None) -> frozenset[int]:
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(CLAIMS_ANNOTATION) or ""
    return frozenset(int(p) for p in text.split(",") if p.strip().isdigit())


def _task_of(event: AuditEvent) -> str:
    """The Task a write is about: a Task status write names it; an Event's name is
    ``<task>.<hex>``."""
    return event.name.rsplit(".", 1)[0] if event.resource == "events" else event.name


async def test_a_ring_replica_paused_past_its_deadline_sends_nothing_for_the_slots_it_lost(
    audited_plane: ControlPlane, audited_admin: Transport, audited_namespace: str, tmp_path: Path
) -> None:
    assert audited_plane.audit_log is not None
    admin, namespace = audited_admin, audited_namespace
    await create_tasks(admin, namespace, TASKS)
    ring = Ring(audited_plane, namespace, tmp_path)
    try:
        a, b, c = ring.start("replica-a"), ring.start("replica-b"), ring.start("replica-c")
        await until(lambda: balanced([a, b, c]), 120, "3 replicas to split the slots")
        await until_converged(admin, namespace, 300)
        tasks = await list_tasks(admin, namespace)
        uids = {t["metadata"]["name"]: t["metadata"]["uid"] for t in tasks}
        lost = c.slots()
        due = sorted(n for n, uid in uids.items() if slot_of(uid) in lost)[:DUE]
        assert due, "the replica to pause works on no Task"
        deadline = time.time() + DUE_IN
        await give_deadlines(admin, namespace, due, deadline)
        await until_states(
            admin, namespace, due, {"Pending"}, timeout=DUE_IN, what="c to reconcile"
        )
        paused_at = time.time()
        assert paused_at < deadline - 1, "c took too long: the deadline is not within the pause"
        c.process.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: balanced([a, b]), 120, "the others to take c's slots")
            await until_states(
                admin, namespace, due, {"Overdue"}, timeout=120, what="the others' Overdue"
            )
        finally:
            resumed_at = time.time()
            c.process.send_signal(signal.SIGCONT)
        assert resumed_at - paused_at > DEADLINE  # paused past its renew deadline
        await until(lambda: balanced([a, b, c]), 120, "c to join again after its back-off")
    finally:
        ring.stop()

    # The work was due during the pause, and c had it pending: it wrote their OnTime status
    # before the pause, and the others wrote Overdue during it.
    c_before = {
        e.name
        for e in writes_by(audited_plane.audit_log, "replica-c", namespace)
        if e.subresource == "status" and e.succeeded and e.received.timestamp() < paused_at
    }
    assert set(due) <= c_before
    others = {
        e.name
        for user in ("replica-a", "replica-b")
        for e in writes_by(audited_plane.audit_log, user, namespace)
        if e.subresource == "status" and paused_at < e.received.timestamp() < resumed_at
    }
    assert set(due) <= others

    # After the pause: c's first request about its Lease claims nothing (the fenced
    # replica deletes it), and each of its other writes is for a slot it claimed again.
    lease = ShardRingConfig(ring.name, namespace, identity="replica-c").timings.name
    after = sorted(
        (
            e
            for e in writes_by(audited_plane.audit_log, "replica-c", namespace)
            if e.received.timestamp() >= resumed_at
        ),
        key=lambda e: e.received,
    )
    lease_requests = [e for e in after if e.resource == "leases" and e.name == lease]
    assert lease_requests, "c never wrote its Lease again after the pause"
    first = lease_requests[0]
    assert first.verb == "delete" or not _claims(first.request_object), first
    claimed: set[int] = set()
    violations = []
    for event in after:
        if event.resource == "leases":
            if event.name == lease and event.succeeded and event.verb != "delete":
                claimed = set(_claims(event.response_object))
            continue
        task = _task_of(event)
        slot = slot_of(uids[task]) if task in uids else None
        if slot is None or slot not in claimed:
            violations.append(
                f"{event.verb} {event.resource}/{event.subresource} {event.name} at "
                f"{event.received.timestamp() - resumed_at:+.3f}s (slot {slot}; c claimed "
                f"{sorted(claimed)})"
            )
    assert not violations, "writes after the pause for slots c did not hold:\n" + "\n".join(
        violations
    )


def start_operator(
    kubeconfig: Path, namespace: str, lease_id: str, log: Path
) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(
        [
            sys.executable, "-m", "controllers",
            "--kubeconfig", str(kubeconfig),
            "--controllers", "task",
            "--namespace", namespace,
            "--leader-elect",
            "--leader-election-namespace", namespace,
            "--leader-election-id", lease_id,
            "--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "1",
            "--metrics-bind-address", "0",
            "--health-probe-bind-address", "0",
        ],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def holder_writes(audit_log: Path, namespace: str, lease_id: str) -> list[tuple[float, str]]:
    """(time, user) of every successful write of the Lease that names its writer's holder."""
    out = []
    for event in audit_events(audit_log):
        if event.resource != "leases" or event.namespace != namespace:
            continue
        if event.name != lease_id or not event.succeeded or event.verb == "delete":
            continue
        holder = ((event.response_object or {}).get("spec") or {}).get("holderIdentity")
        if holder:
            out.append((event.completed.timestamp(), event.user))
    return sorted(out)


async def test_a_leader_paused_past_its_deadline_writes_nothing_before_it_steps_down(
    audited_plane: ControlPlane, audited_admin: Transport, audited_namespace: str, tmp_path: Path
) -> None:
    assert audited_plane.audit_log is not None
    admin, namespace = audited_admin, audited_namespace
    audit_log = audited_plane.audit_log
    lease_id = f"operator-{uuid.uuid4().hex[:6]}"
    await create_tasks(admin, namespace, 100)
    processes = {
        user: start_operator(
            identity_kubeconfig(audited_plane, user, tmp_path),
            namespace,
            lease_id,
            tmp_path / f"{user}.log",
        )
        for user in ("operator-a", "operator-b")
    }
    try:
        await until(lambda: bool(holder_writes(audit_log, namespace, lease_id)), 120, "a leader")
        leader = holder_writes(audit_log, namespace, lease_id)[-1][1]
        follower = next(u for u in processes if u != leader)
        await until_converged(admin, namespace, 300)
        due = [f"task-{i:05d}" for i in range(DUE)]
        deadline = time.time() + DUE_IN
        await give_deadlines(admin, namespace, due, deadline)
        await until_states(
            admin, namespace, due, {"Pending"}, timeout=DUE_IN, what="the leader to reconcile"
        )
        paused_at = time.time()
        assert paused_at < deadline - 1, "too slow: the deadline is not within the pause"
        processes[leader].send_signal(signal.SIGSTOP)
        try:

            def follower_leads() -> bool:
                writes = holder_writes(audit_log, namespace, lease_id)
                return any(t > paused_at and u == follower for t, u in writes)

            await until(follower_leads, 120, "the follower to take over")
            await until_states(
                admin, namespace, due, {"Overdue"}, timeout=120, what="the follower's Overdue"
            )
        finally:
            resumed_at = time.time()
            processes[leader].send_signal(signal.SIGCONT)
        status = await asyncio.to_thread(processes[leader].wait, 60)
        assert status == 1, f"the resumed leader exited with {status}, not by stepping down"
    finally:
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
            if process.poll() is None:
                process.kill()
                process.wait(10)

    before = {
        e.name
        for e in writes_by(audit_log, leader, namespace)
        if e.subresource == "status" and e.succeeded and e.received.timestamp() < paused_at
    }
    assert set(due) <= before, "the leader had no work pending for the pause"
    late = [
        f"{e.verb} {e.resource}/{e.subresource} {e.name} at "
        f"{e.received.timestamp() - resumed_at:+.3f}s ({e.code})"
        for e in writes_by(audit_log, leader, namespace)
        if e.received.timestamp() >= resumed_at
    ]
    assert not late, "the resumed leader wrote before stepping down:\n" + "\n".join(late)
