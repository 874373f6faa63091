"""``python -m controllers --shard-ring NAME`` as a user runs it: three replicas of the operator,
each a process of its own, on the local control plane (``ShardedListAndWatch`` on), a few
dozen Tasks.

What it proves, and why each check would fail if the flag were ignored:

* each replica holds a Lease of its own labelled with the ring's name (leader-elected or
  unsharded replicas hold none; leader election holds one for all);
* the Leases' claims split the hash space's slots among the replicas with no gap and no
  overlap, balanced to one slot, and every replica's ``/metrics`` agrees (members, owned
  slots) and its ``/readyz`` is ready;
* every Task converges (``observedGeneration`` is its generation, ``status.state`` the one its
  spec calls for), those created before the replicas (the initial lists) and after (the
  watches);
* each replica caches only its share: exactly the Tasks whose uid hashes into the slots its
  Lease claims, never all of them (a follower of leader election, or a replica that ignored
  the flag, caches every Task); and the server did the filtering;
* a SIGTERM leaves the ring cleanly: exit status 0, the Leases deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
import urllib.error
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane
from controller_runtime.sharding import CLAIMS_ANNOTATION, RING_LABEL, slot_range
from informers.sharding import fnv1a64
from kubeclient.transport import Transport
from tests.integration.test_operator_cli import ROOT, fetch
from tests.support import ClusterParts, watch_until

pytestmark = pytest.mark.integration

REPLICAS = 3
SLOTS = 16  # --shard-slots' default
TASKS = 48
TIMINGS = ["--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "1"]
"""Short Lease timings, as the ring tests use: a replica settles two retry periods (2 s)
before it claims slots."""
TIMEOUT = 45.0
TASK_RESOURCE = "tasks.tasks.crpy.io"


@dataclass
class Operator:
    """One ``python -m controllers`` process; its stderr is read as it comes (a full pipe
    would stall the process) and kept for failure messages."""

    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    serving: asyncio.Future[tuple[str, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.process.stderr is not None
        while line := (await self.process.stderr.readline()).decode(errors="replace"):
            self.lines.append(line.rstrip())
            found = re.search(
                r"serving metrics at (http://\S+)/metrics, probes at (http://\S+)/healthz", line
            )
            if found and not self.serving.done():
                self.serving.set_result((found[1], found[2]))
        if not self.serving.done():
            self.serving.set_exception(AssertionError(f"the operator ended:\n{self.tail()}"))

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.lines[-lines:])

    async def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics``, by series (``name{labels}``)."""
        base, _ = self.serving.result()
        _, body = await asyncio.to_thread(fetch, f"{base}/metrics")
        samples = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                samples[series] = float(value)
        return samples

    async def ready(self) -> bool:
        _, health = self.serving.result()
        try:
            status, _ = await asyncio.to_thread(fetch, f"{health}/readyz")
        except urllib.error.HTTPError:
            return False
        return status == 200


async def start_operator(plane: ControlPlane, namespace: str, ring: str) -> Operator:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controllers",
        "--kubeconfig", str(plane.kubeconfig),
        "--controllers", "task",
        "--namespace", namespace,
        "--shard-ring", ring,
        "--leader-election-namespace", namespace,  # where the ring's Leases go
        *TIMINGS,
        "--metrics-bind-address", "127.0.0.1:0",
        "--health-probe-bind-address", "127.0.0.1:0",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )  # fmt: skip
    operator = Operator(process)
    operator.reader = asyncio.create_task(operator.read())
    return operator


def task(name: str, overdue: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"title": name, "priority": 1}
    if overdue:
        spec["deadline"] = "2000-01-01T00:00:00Z"
    return {"apiVersion": "tasks.crpy.io/v1", "kind": "Task", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


def expected_states(names: range) -> dict[str, str]:
    """Every fourth Task is past its deadline (Overdue); the others stay Pending."""
    return {f"task-{i:02d}": "Overdue" if i % 4 == 0 else "Pending" for i in names}


async def create(transport: Transport, namespace: str, states: Mapping[str, str]) -> None:
    path = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    await asyncio.gather(
        *(
            transport.request("POST", path, body=task(name, state == "Overdue"))
            for name, state in states.items()
        )
    )


@dataclass(frozen=True)
class RingView:
    """The ring as its Leases and the replicas' endpoints show it."""

    holders: list[str]
    claims: list[frozenset[int]]
    members: list[float]
    owned: list[float]
    ready: list[bool]

    @property
    def settled(self) -> bool:
        sizes = [len(c) for c in self.claims]
        return (
            len(self.claims) == REPLICAS
            and len(set(self.holders)) == REPLICAS
            and sum(sizes) == SLOTS
            and frozenset().union(*self.claims) == frozenset(range(SLOTS))  # no gap, no overlap
            and max(sizes) - min(sizes) <= 1
            and self.members == [REPLICAS] * REPLICAS
            and sorted(self.owned) == sorted(sizes)
            and all(self.ready)
        )


async def ring_view(
    transport: Transport, namespace: str, ring: str, operators: list[Operator]
) -> RingView:
    leases = (
        await transport.request(
            "GET",
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
            params={"labelSelector": f"{RING_LABEL}={ring}"},
        )
    ).json()["items"]
    claims = [
        frozenset(int(s) for s in (annotations.get(CLAIMS_ANNOTATION) or "").split(",") if s)
        for annotations in (lease["metadata"].get("annotations") or {} for lease in leases)
    ]
    scraped = [await o.metrics() for o in operators]
    return RingView(
        holders=[lease["spec"].get("holderIdentity") or "" for lease in leases],
        claims=claims,
        members=[m.get(f'shard_ring_members{{ring="{ring}"}}', 0.0) for m in scraped],
        owned=[m.get(f'shard_ring_owned_slots{{ring="{ring}"}}', 0.0) for m in scraped],
        ready=[await o.ready() for o in operators],
    )


async def until_settled(
    transport: Transport, namespace: str, ring: str, operators: list[Operator]
) -> RingView:
    """Poll the Leases and the endpoints (state of other processes, over several objects: no
    single watch event says the ring settled) until :attr:`RingView.settled`."""
    deadline = time.monotonic() + TIMEOUT
    while not (view := await ring_view(transport, namespace, ring, operators)).settled:
        if time.monotonic() > deadline or any(o.process.returncode is not None for o in operators):
            logs = "\n\n".join(o.tail() for o in operators)
            pytest.fail(f"the ring did not settle within {TIMEOUT:.0f}s: {view}\n\n{logs}")
        await asyncio.sleep(0.25)
    return view


async def until_converged(transport: Transport, namespace: str, states: Mapping[str, str]) -> None:
    """Watch the Tasks (the current ones first, as ADDED) until each has the status its spec
    calls for, describing its current generation."""
    converged: dict[str, bool] = {}

    def check(event: Mapping[str, Any]) -> bool:
        obj = event["object"]
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        name = str(meta.get("name") or "")
        if name in states:
            converged[name] = (
                status.get("observedGeneration") == meta.get("generation")
                and status.get("state") == states[name]
            )
        return len(converged) == len(states) and all(converged.values())

    path = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    try:
        await watch_until(transport, path, check, timeout=TIMEOUT)
    except TimeoutError:
        left = sorted(n for n in states if not converged.get(n))
        pytest.fail(f"{len(left)} Tasks did not converge within {TIMEOUT:.0f}s: {left[:10]}")


def slot_of(uid: str) -> int:
    digest = fnv1a64(uid.encode())
    return next(s for s in range(SLOTS) if digest in slot_range(s, SLOTS))


async def test_three_operator_processes_split_the_tasks_over_the_ring(
    control_plane: ControlPlane, transport: Transport, namespace: str, cluster_parts: ClusterParts
) -> None:
    started = time.monotonic()
    ring = f"ops-{uuid.uuid4().hex[:6]}"
    early, late = expected_states(range(TASKS // 2)), expected_states(range(TASKS // 2, TASKS))
    await create(transport, namespace, early)  # found by the replicas' initial lists
    operators: list[Operator] = []
    try:
        operators = [await start_operator(control_plane, namespace, ring) for _ in range(REPLICAS)]
        for operator in operators:
            await asyncio.wait_for(asyncio.shield(operator.serving), TIMEOUT)
        view = await until_settled(transport, namespace, ring, operators)
        await create(transport, namespace, late)  # found by their watches
        await until_converged(transport, namespace, {**early, **late})

        # Each replica caches exactly the Tasks of the slots its Lease claims: a share.
        items = (
            await transport.request("GET", f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks")
        ).json()["items"]
        slots = Counter(slot_of(t["metadata"]["uid"]) for t in items)
        share = sorted((len(claimed), sum(slots[s] for s in claimed)) for claimed in view.claims)
        scraped = [await o.metrics() for o in operators]
        cached = sorted(
            (
                int(m[f'shard_ring_owned_slots{{ring="{ring}"}}']),
                int(m[f'informer_store_objects{{resource="{TASK_RESOURCE}"}}']),
            )
            for m in scraped
        )
        assert sum(n for _, n in cached) == TASKS, cached
        assert all(n < TASKS for _, n in cached), f"a replica caches every Task: {cached}"
        assert cached == share, f"caches {cached}, the Leases' claims hold {share}"
        filtered = [
            m.get(f'informer_shard_client_filtered_total{{resource="{TASK_RESOURCE}"}}', 0)
            for m in scraped
        ]
        if cluster_parts.filters_shards:  # the suite's local plane has ShardedListAndWatch on
            assert filtered == [0] * REPLICAS, f"the server did not filter: {filtered}"
        else:  # the server sends every Task: each replica drops those of others' slots
            assert all(n > 0 for n in filtered), f"a replica filtered nothing: {filtered}"
        # The ring did not move after it settled: the same claims now.
        after = await ring_view(transport, namespace, ring, operators)
        assert sorted(map(sorted, after.claims)) == sorted(map(sorted, view.claims))

        # A clean leave: every replica drains, deletes its Lease and exits 0.
        for operator in operators:
            operator.process.send_signal(signal.SIGTERM)
        for operator in operators:
            code = await asyncio.wait_for(operator.process.wait(), TIMEOUT)
            assert code == 0, operator.tail()
        gone = await ring_view(transport, namespace, ring, [])
        assert gone.claims == [], "a Lease stayed after a clean leave"
    finally:
        for operator in operators:
            if operator.process.returncode is None:
                operator.process.kill()
                await operator.process.wait()
            if operator.reader is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(operator.reader, 10)
    print(f"three sharded operators: {time.monotonic() - started:.1f}s")
