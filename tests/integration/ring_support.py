"""What the ring tests share: replica processes of ``tests.integration.shard_replica`` (each
with an identity of its own, so the API server's audit log tells who sent what), waits on
their status files, Task helpers, the reconcile ledger's overlap check, and the claims of the
ring replayed from the audit log (who claimed which slot when, and the gaps in between)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.audit import audit_events
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.sharding import CLAIMS_ANNOTATION
from informers.sharding import fnv1a64, split_hash_space
from kubeclient.transport import Transport

REPO = Path(__file__).resolve().parents[2]
SLOTS = 16
TASKS_PATH = "/apis/tasks.crpy.io/v1/namespaces/{}/tasks"
RETRY = 1.0
"""The replicas' retry period (shard_replica.py: lease 6 s, renew deadline 4 s, retry 1 s)."""
LEASE = 6.0
DEADLINE = 4.0


@dataclass
class Replica:
    identity: str
    directory: Path
    process: subprocess.Popen[bytes]
    killed_at: float | None = None
    """``time.monotonic()`` of a SIGKILL (the ledger's clock)."""
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

    def kill(self) -> float:
        """SIGKILL; returns the wall-clock time of the kill (the audit log's clock)."""
        at = time.time()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.killed_at = time.monotonic()
        return at

    def terminate(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


def identity_kubeconfig(
    plane: ControlPlane, name: str, out: Path, proxy: FaultProxy | None = None
) -> Path:
    """A kubeconfig of a user of its own (``system:masters``), through ``proxy`` if given."""
    minted = plane.mint_identity(name, ["system:masters"])
    path = out / f"kubeconfig-{name}.yaml"
    text = minted.kubeconfig.read_text()
    if proxy is not None:
        text = text.replace(plane.server, proxy.url)
    path.write_text(text)
    return path


def start_replica(
    kubeconfig: Path, namespace: str, ring: str, name: str, out: Path, *extra: str
) -> Replica:
    log = (out / f"{name}.log").open("ab")
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
            *extra,
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


async def create_tasks(
    transport: Transport, namespace: str, count: int, spec: Mapping[str, Any] | None = None
) -> None:
    path = TASKS_PATH.format(namespace)
    queue = list(range(count))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            body = {
                "apiVersion": "tasks.crpy.io/v1",
                "kind": "Task",
                "metadata": {"name": f"task-{i:05d}"},
                "spec": {"title": f"task {i}", "priority": 1 + i % 3, **(spec or {})},
            }
            await transport.request("POST", path, body=body)

    await asyncio.gather(*(worker() for _ in range(32)))


async def list_tasks(transport: Transport, namespace: str) -> list[dict[str, Any]]:
    answer = await transport.request("GET", TASKS_PATH.format(namespace))
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


async def unconverged(transport: Transport, namespace: str) -> int:
    """Tasks whose status does not describe their current spec."""
    return sum(
        1
        for t in await list_tasks(transport, namespace)
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


class Ring:
    """Replicas of one ring, each with an identity of its own; ``timings`` (lease, renew
    deadline, retry period) default to shard_replica's (6, 4, 1)."""

    def __init__(
        self,
        plane: ControlPlane,
        namespace: str,
        out: Path,
        timings: tuple[float, float, float] = (LEASE, DEADLINE, RETRY),
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.out = out
        self.timings = timings
        self.name = f"tasks-{uuid.uuid4().hex[:6]}"
        self.replicas: list[Replica] = []

    def start(self, name: str, proxy: FaultProxy | None = None) -> Replica:
        config = identity_kubeconfig(self.plane, name, self.out, proxy)
        timings = ",".join(str(t) for t in self.timings)
        replica = start_replica(config, self.namespace, self.name, name, self.out, timings)
        self.replicas.append(replica)
        return replica

    def stop(self) -> None:
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait(10)


def slot_of(uid: str) -> int:
    """The ring slot of an object with this uid (the ring shards by uid)."""
    value = fnv1a64(uid.encode())
    return next(i for i, r in enumerate(split_hash_space(SLOTS)) if value in r)


# -- the ring's claims, replayed from the audit log ----------------------------------------------


@dataclass(frozen=True)
class LeaseChange:
    """A successful write of a member Lease, when the API server completed it."""

    at: float  # POSIX seconds
    lease: str
    holder: str
    claims: frozenset[int] | None  # None: deleted


def lease_changes(audit_log: Path, namespace: str, ring: str) -> list[LeaseChange]:
    """Every successful write of the ring's member Leases in ``namespace``, in order."""
    out: list[LeaseChange] = []
    holders: dict[str, str] = {}
    for event in audit_events(audit_log):
        if event.resource != "leases" or event.namespace != namespace:
            continue
        if not event.name.startswith(f"{ring}-") or not event.succeeded:
            continue
        at = event.completed.timestamp()
        if event.verb == "delete":
            out.append(LeaseChange(at, event.name, holders.get(event.name, ""), None))
            continue
        obj = event.response_object or {}
        holder = str((obj.get("spec") or {}).get("holderIdentity") or "")
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(CLAIMS_ANNOTATION, "")
        claims = frozenset(int(p) for p in text.split(",") if p.strip().isdigit())
        holders[event.name] = holder
        out.append(LeaseChange(at, event.name, holder, claims))
    out.sort(key=lambda c: c.at)
    return out


@dataclass(frozen=True)
class Gap:
    """A time during which no live replica's Lease claimed ``slot``."""

    slot: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def unclaimed_gaps(
    changes: Iterable[LeaseChange],
    *,
    since: float,
    until: float,
    not_counted: Mapping[str, Iterable[tuple[float, float]]] = {},
) -> list[Gap]:
    """Each slot's stretches within [``since``, ``until``] without a claimant: no member
    Lease claims it, or only Leases of holders that cannot work on it then (``not_counted``:
    holder -> intervals, e.g. from a SIGKILL on, or while cut off)."""
    changes = sorted(changes, key=lambda c: c.at)
    blind = {h: list(spans) for h, spans in not_counted.items()}
    moments = sorted(
        {since, until}
        | {c.at for c in changes if since < c.at < until}
        | {t for spans in blind.values() for span in spans for t in span if since < t < until}
    )
    state: dict[str, tuple[str, frozenset[int]]] = {}
    pending = iter(changes)
    upcoming = next(pending, None)
    gaps: list[Gap] = []
    open_since: dict[int, float] = {}
    for moment in moments:
        while upcoming is not None and upcoming.at <= moment:
            if upcoming.claims is None:
                state.pop(upcoming.lease, None)
            else:
                state[upcoming.lease] = (upcoming.holder, upcoming.claims)
            upcoming = next(pending, None)
        counted = [
            claims
            for holder, claims in state.values()
            if not any(a <= moment < b for a, b in blind.get(holder, ()))
        ]
        claimed = frozenset().union(*counted) if counted else frozenset()
        for slot in range(SLOTS):
            if slot in claimed or moment >= until:
                start = open_since.pop(slot, None)
                if start is not None:
                    gaps.append(Gap(slot, start, moment))
            elif slot not in open_since:
                open_since[slot] = moment
    return gaps


def longest(gaps: Iterable[Gap]) -> float:
    return max((g.seconds for g in gaps), default=0.0)
