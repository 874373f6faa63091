"""The chaos suite's cluster: an audited control plane of its own, three leader-elected
replicas of ``python -m controllers`` (two with short lease timings, one with the defaults),
each with its own client certificate and FaultProxy, the faults, and the checks common to
every workload (who wrote while holding the Lease, readiness, metrics).

Environment: ``CHAOS_SEED`` (default: random, printed), ``CHAOS_TASKS`` (default 200),
``CHAOS_BINDINGS`` (default 12), ``CHAOS_SECONDS`` of faults (default 20).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.faultproxy import FaultProxy
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport

SEED = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
TASKS = int(os.environ.get("CHAOS_TASKS", "200"))
BINDINGS = int(os.environ.get("CHAOS_BINDINGS", "12"))
FAULT_SECONDS = float(os.environ.get("CHAOS_SECONDS", "20"))
CONVERGE_WITHIN = 120.0
"""Seconds every Task has after the last fault: a lease takeover (15 s with the defaults)
plus a full resync of every Task on a shared, loaded machine, with a wide margin."""
TIMEOUT = 300 + 2 * FAULT_SECONDS + CONVERGE_WITHIN + TASKS * 0.1
"""Seconds per chaos test: start-up, the load's creates, the faults and convergence."""
LEASE_NAMESPACE = "default"
SHORT_LEASE = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1"]
WATCH_TIMEOUT = 5
"""The replicas' ``--watch-timeout``: a watch silent for ``[5, 10) + 10`` s is presumed dead,
so a ``long-freeze`` (24 s) outlasts the idle window and must be noticed."""
LONG_FREEZE = 2 * WATCH_TIMEOUT + 10 + 4
WATCH_OPEN_WITHIN = 90.0
"""Seconds a long freeze waits for its victim to have a watch open: past the longest backoff
sleep (60 s) and a relist."""
NOTICE_GRACE = 30.0
"""Seconds after a long freeze's thaw within which the follower's silence count must grow."""
FAULTS = (
    "cut",
    "freeze",
    "long-freeze",
    "latency",
    "apiserver-restart",
    "compaction",
    "kill-leader",
    "partition-leader",
    "all-cut-off",
)
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: RequestResponse
  verbs: ["create", "update", "patch"]
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - {group: "tasks.crpy.io", resources: ["tasks/status"]}
  - {group: "postgres.crpy.io", resources: ["servicebindings", "servicebindings/status",
     "postgresusers", "postgresusers/status"]}
  - {group: "", resources: ["secrets"]}
- level: None
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Replica:
    name: str
    args: list[str]
    proxy: FaultProxy
    kubeconfig: Path
    metrics_port: int
    health_port: int
    log: Path
    namespace: str
    controllers: str
    lease_id: str
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    exits: int = 0
    busy: bool = False

    async def start(self) -> None:
        out = self.log.open("ab")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controllers",
            "--kubeconfig", str(self.kubeconfig),
            "--controllers", self.controllers,
            "--namespace", self.namespace,
            "--leader-elect", "--leader-election-namespace", LEASE_NAMESPACE,
            "--leader-election-id", self.lease_id,
            "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
            "--health-probe-bind-address", f"127.0.0.1:{self.health_port}",
            *self.args,
            stdout=out, stderr=out,
        )  # fmt: skip
        out.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self, signal_number: int = 15) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal_number)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), 20)
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()


@dataclasses.dataclass
class Chaos:
    plane: ControlPlane
    admin: Transport
    replicas: list[Replica]
    audit_log: Path
    namespace: str
    lease_id: str
    rng: random.Random
    faults: Counter[str] = dataclasses.field(default_factory=Counter)
    loader_ops: Counter[str] = dataclasses.field(default_factory=Counter)
    idle_checks: list[IdleCheck] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class IdleCheck:
    """One long freeze of a follower: its idle-timeout watch restarts before and after."""

    replica: str
    before: float
    after: float
    same_process: bool
    watching: bool = True
    """Whether the follower had a watch open to freeze (none within ``WATCH_OPEN_WITHIN``: the
    check fails, as a reflector that never watches for that long is stuck)."""


@pytest.fixture(scope="session")
def audited_plane() -> Iterator[tuple[ControlPlane, Path]]:
    if use_existing_cluster():
        pytest.skip("needs a local control plane with an audit log")
    workdir = Path(tempfile.mkdtemp(prefix="crpy-chaos-"))
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = workdir / "audit.log"
    args = {
        "--audit-policy-file": str(policy),
        "--audit-log-path": str(audit_log),
        "--audit-log-maxsize": "0",
    }
    with ControlPlane(extra_apiserver_args=args) as plane:
        yield plane, audit_log
    shutil.rmtree(workdir, ignore_errors=True)


@contextlib.asynccontextmanager
async def replicas(
    audited_plane: tuple[ControlPlane, Path], namespace: str, controllers: str
) -> AsyncIterator[Chaos]:
    """Three replicas running ``controllers`` on ``namespace`` (created here), each behind
    its own FaultProxy; stopped on exit."""
    plane, audit_log = audited_plane
    config = await load_kubeconfig(plane.kubeconfig)
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    lease_id = f"chaos-{namespace}"
    started: list[Replica] = []
    async with Transport(config) as admin:
        await admin.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        try:
            for index, timings in enumerate([SHORT_LEASE, SHORT_LEASE, []]):
                proxy = await FaultProxy(host, int(port)).start()
                user = f"chaos-replica-{index}"
                identity = plane.mint_identity(user, ["system:masters"])
                kubeconfig = identity.kubeconfig.with_name(f"{namespace}-{user}.yaml")
                kubeconfig.write_text(
                    identity.kubeconfig.read_text().replace(plane.server, proxy.url)
                )
                replica = Replica(
                    user,
                    [*timings, "--watch-timeout", str(WATCH_TIMEOUT), "--log-level", "warning"],
                    proxy,
                    kubeconfig,
                    _free_port(),
                    _free_port(),
                    audit_log.with_name(f"{namespace}-replica-{index}.log"),
                    namespace,
                    controllers,
                    lease_id,
                )
                await replica.start()
                started.append(replica)
            yield Chaos(plane, admin, started, audit_log, namespace, lease_id, random.Random(SEED))
        finally:
            for replica in started:
                await replica.stop()
                await replica.proxy.stop()


# -- faults ------------------------------------------------------------------------------------


async def leader(chaos: Chaos) -> Replica | None:
    """The replica whose identity holds the Lease (from the audit log's last lease write)."""
    holders = lease_history(chaos.audit_log, chaos.lease_id)
    if not holders:
        return None
    user = holders[-1][1]
    return next((r for r in chaos.replicas if r.name == user), None)


async def inject(chaos: Chaos, fault: str) -> None:
    rng, replicas = chaos.rng, chaos.replicas
    chaos.faults[fault] += 1
    if fault == "cut":
        for replica in replicas:
            replica.proxy.cut_all()
    elif fault == "freeze":
        victim = rng.choice(replicas)
        victim.proxy.freeze()
        await asyncio.sleep(rng.uniform(2, 6))
        victim.proxy.thaw()
    elif fault == "long-freeze":
        await long_freeze(chaos)
    elif fault == "latency":
        for replica in replicas:
            replica.proxy.latency = rng.choice([0.2, 0.5, 1.0])
        await asyncio.sleep(rng.uniform(2, 5))
        for replica in replicas:
            replica.proxy.latency = 0.0
    elif fault == "apiserver-restart":
        await asyncio.to_thread(chaos.plane.stop_apiserver)
        await asyncio.to_thread(chaos.plane.start_apiserver)
    elif fault == "compaction":
        await compact(chaos.plane.etcd_url)
        for replica in replicas:
            replica.proxy.cut_all()  # the re-watch asks for a compacted resourceVersion
    elif fault == "kill-leader":
        killed = await leader(chaos)
        if killed is not None and killed.running:
            killed.busy = True
            await killed.stop(9)
            killed.restarts += 1
            await killed.start()  # the Pod restarts, as a follower
            killed.busy = False
    elif fault == "partition-leader":
        alone = await leader(chaos)
        if alone is not None:
            alone.proxy.refuse = True
            alone.proxy.cut_all()
            await asyncio.sleep(rng.uniform(3, 8))
            alone.proxy.refuse = False
    elif fault == "all-cut-off":
        for replica in replicas:
            replica.proxy.refuse = True
            replica.proxy.cut_all()
        await asyncio.sleep(rng.uniform(2, 6))
        for replica in replicas:
            replica.proxy.refuse = False


async def long_freeze(chaos: Chaos) -> None:
    """Freeze one follower's connections past its watches' idle window, and record whether it
    noticed (its watch restarts for silence, :func:`idle_restarts`, grew)."""
    lead = await leader(chaos)
    followers = [r for r in chaos.replicas if r is not lead and r.running and not r.busy]
    if not followers:
        return
    victim = chaos.rng.choice(followers)
    assert victim.process is not None
    pid = victim.process.pid
    # Freeze an open watch: a reflector sleeping in its backoff (up to a minute after a run of
    # API-server restarts) or listing has no stream whose silence it could notice.
    give_up = asyncio.get_running_loop().time() + WATCH_OPEN_WITHIN
    while await asyncio.to_thread(watches_open, victim) < 1:
        if asyncio.get_running_loop().time() > give_up:
            same = victim.process is not None and victim.process.pid == pid and victim.running
            chaos.idle_checks.append(IdleCheck(victim.name, -1.0, -1.0, same, watching=False))
            return
        await asyncio.sleep(0.5)  # polling a metric: no event to await from outside
    before = await asyncio.to_thread(idle_restarts, victim)
    victim.proxy.freeze()
    await asyncio.sleep(LONG_FREEZE)
    victim.proxy.thaw()
    # The restart is counted when the reflector acts on its idle timer, which a loaded
    # machine can delay past the thaw: wait (bounded) for the count to grow.
    give_up = asyncio.get_running_loop().time() + NOTICE_GRACE
    after = await asyncio.to_thread(idle_restarts, victim)
    while after <= before and asyncio.get_running_loop().time() < give_up:
        await asyncio.sleep(0.5)  # polling a metric: no event to await from outside
        after = await asyncio.to_thread(idle_restarts, victim)
    same = victim.process is not None and victim.process.pid == pid and victim.running
    chaos.idle_checks.append(IdleCheck(victim.name, before, after, same))


NOTICED_SILENCE = ('reason="idle timeout"', 'reason="watch refused (0)"')
"""Watch restarts that show a replica noticed a silent server: an open watch with no byte for
its idle window, or a watch request with no response within it (a watch re-opened during
the freeze, after the server ended the old one)."""


def idle_restarts(replica: Replica) -> float:
    """The replica's watch restarts for silence (:data:`NOTICED_SILENCE`; -1 when it does not
    answer)."""
    return _metric_sum(
        replica,
        lambda line: (
            line.startswith("informer_watch_restarts_total{")
            and any(reason in line for reason in NOTICED_SILENCE)
        ),
    )


def watches_open(replica: Replica) -> float:
    """The replica's watch streams open now, over all its informers (-1 when it does not
    answer)."""
    return _metric_sum(replica, lambda line: line.startswith("informer_watches_open{"))


def _metric_sum(replica: Replica, wanted: Callable[[str], bool]) -> float:
    url = f"http://127.0.0.1:{replica.metrics_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if wanted(line))


async def compact(etcd_url: str) -> None:
    """Compact etcd at its current revision (its JSON gateway): older watches get a real 410."""

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            etcd_url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = orjson.loads(answer.read())
            return result

    def run() -> None:
        revision = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": revision, "physical": True})

    await asyncio.to_thread(run)


# -- checks ------------------------------------------------------------------------------------


def _events(audit_log: Path) -> Iterator[dict[str, Any]]:
    with audit_log.open("rb") as lines:
        for line in lines:
            with contextlib.suppress(orjson.JSONDecodeError):
                yield orjson.loads(line)


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00"))


def lease_history(audit_log: Path, lease_id: str) -> list[tuple[datetime, str]]:
    """(time, user) of every successful write of the operator's Lease that names its writer as
    holder, in order."""
    out: list[tuple[datetime, str]] = []
    for event in _events(audit_log):
        ref = event.get("objectRef") or {}
        if ref.get("resource") != "leases" or ref.get("name") != lease_id:
            continue
        if (event.get("responseStatus") or {}).get("code", 0) >= 300:
            continue
        holder = ((event.get("responseObject") or {}).get("spec") or {}).get("holderIdentity")
        if holder:
            out.append((_at(event), event["user"]["username"]))
    out.sort()
    return out


def writes_without_the_lease(chaos: Chaos) -> tuple[int, list[str]]:
    """Successful writes by the replicas in the workload's namespace (what the audit policy
    records: Task status, bindings, users, Secrets), and those whose writer was not the last
    to write the Lease as its holder at that moment."""
    holders = lease_history(chaos.audit_log, chaos.lease_id)
    writes, bad = 0, []
    for event in _events(chaos.audit_log):
        ref = event.get("objectRef") or {}
        user = event["user"]["username"]
        if ref.get("namespace") != chaos.namespace or not user.startswith("chaos-replica-"):
            continue
        if (event.get("responseStatus") or {}).get("code", 0) >= 300:
            continue
        writes += 1
        at = _at(event)
        current = [u for t, u in holders if t <= at]
        if not current or current[-1] != user:
            what = f"{event.get('verb')} {ref.get('resource')}/{ref.get('subresource') or ''}"
            bad.append(f"{user}: {what} {ref.get('name')} at {at} while the holder was "
                       f"{current[-1] if current else 'nobody'}")  # fmt: skip
    return writes, bad


def scrape(replica: Replica) -> dict[str, float]:
    """Sums of the operator's own metrics (by name, over labels)."""
    url = f"http://127.0.0.1:{replica.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        with contextlib.suppress(ValueError):
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def ready(replica: Replica) -> bool:
    url = f"http://127.0.0.1:{replica.health_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


async def _until_led(chaos: Chaos, timeout: float = 120.0) -> None:
    """Wait until a replica holds the Lease (the faults aimed at the leader need one)."""
    deadline = time.monotonic() + timeout
    while not lease_history(chaos.audit_log, chaos.lease_id):
        assert time.monotonic() < deadline, f"no replica took the Lease within {timeout:.0f}s"
        await asyncio.sleep(0.5)  # polling the audit log


async def _until_ready(replicas: list[Replica], timeout: float = 60.0) -> list[str]:
    """Names of the replicas whose /readyz is not 200 within ``timeout`` (a replica started
    again a moment ago is still syncing)."""
    deadline = time.monotonic() + timeout
    while True:
        unready = [r.name for r in replicas if not await asyncio.to_thread(ready, r)]
        if not unready or time.monotonic() > deadline:
            return unready
        await asyncio.sleep(0.5)  # polling the probe endpoint


def reproduce_command() -> str:
    return (
        f"CHAOS_SEED={SEED} CHAOS_TASKS={TASKS} CHAOS_BINDINGS={BINDINGS} "
        f"CHAOS_SECONDS={FAULT_SECONDS:g} make integration "
        'PYTEST_ARGS="-s -k test_chaos_"'
    )


Loader = Callable[[Chaos, asyncio.Event], Coroutine[Any, Any, None]]
Check = Callable[[Chaos], Awaitable[list[str]]]


async def supervise(chaos: Chaos) -> None:
    """What the kubelet does: start a replica again when it exits (an operator that loses
    its Lease exits non-zero on purpose)."""
    while True:
        for replica in chaos.replicas:
            if (
                not replica.busy
                and replica.process is not None
                and replica.process.returncode is not None
            ):
                replica.exits += 1
                await replica.start()
        await asyncio.sleep(0.5)  # the kubelet's restart delay, shortened


async def run_chaos(
    chaos: Chaos,
    load: Loader,
    unconverged: Check,
    objects: int,
    *,
    converge_within: float = CONVERGE_WITHIN,
) -> None:
    """Load and faults for ``FAULT_SECONDS``, then wait ``converge_within`` seconds at most
    for convergence and check who wrote;
    prints (and with ``CHAOS_REPORT`` appends) the run's numbers."""
    print(f"\nchaos seed {SEED}: {objects} objects in {chaos.namespace}, {FAULT_SECONDS:g}s of "
          f"faults; repeat with:\n  {reproduce_command()}")  # fmt: skip
    stop = asyncio.Event()
    supervisor = asyncio.create_task(supervise(chaos))
    await _until_led(chaos)
    loader = asyncio.create_task(load(chaos, stop))
    # Every run checks a freeze past the idle window: one first, under load, so that the
    # convergence time below is measured from a drawn fault, not from a follower's thaw
    # (the leader works on through a follower's freeze).
    await inject(chaos, "long-freeze")
    started = time.monotonic()
    while time.monotonic() - started < FAULT_SECONDS:
        await asyncio.sleep(chaos.rng.uniform(0.5, 3.0))
        await inject(chaos, chaos.rng.choice(FAULTS))
    last_fault = time.monotonic()
    stop.set()
    await loader
    remaining: list[str] = []
    while time.monotonic() - last_fault < converge_within:
        remaining = await unconverged(chaos)
        if not remaining:
            break
        await asyncio.sleep(0.5)  # polling the API server for the end state
    converge = time.monotonic() - last_fault
    supervisor.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await supervisor
    writes, bad = writes_without_the_lease(chaos)
    holders = [u for _, u in lease_history(chaos.audit_log, chaos.lease_id)]
    changes = sum(1 for a, b in itertools.pairwise(holders) if a != b)
    running = [r for r in chaos.replicas if r.running]
    unready = await _until_ready(running)
    metrics = {r.name: await asyncio.to_thread(scrape, r) for r in running if r.name not in unready}
    total: dict[str, float] = {}
    for sample in metrics.values():
        for name, value in sample.items():
            total[name] = total.get(name, 0.0) + value
    summary = {
        "workload": chaos.namespace,
        "seed": SEED,
        "objects": objects,
        "faults": dict(chaos.faults),
        "loader": dict(chaos.loader_ops),
        "converge_seconds": round(converge, 1),
        "writes": writes,
        "writes_without_lease": len(bad),
        "leader_changes": changes,
        "stale_skips": total.get("controller_runtime_stale_skips_total", 0),
        "relists": total.get("informer_relists_total", 0),
        "watch_restarts": total.get("informer_watch_restarts_total", 0),
        "kills": sum(r.restarts for r in chaos.replicas),
        "exits": sum(r.exits for r in chaos.replicas),
        "reflector_restarts": total.get("informer_reflector_restarts_total", 0),
        "reconcile_errors": total.get("controller_runtime_reconcile_errors_total", 0),
        "retries": total.get("workqueue_retries_total", 0),
        "long_freezes": [dataclasses.asdict(c) for c in chaos.idle_checks],
        "outcome": "pass" if not remaining and not bad else "FAIL",
    }
    print("chaos result:", orjson.dumps(summary).decode())
    report = os.environ.get("CHAOS_REPORT")
    if report:
        with Path(report).open("ab") as out:  # noqa: ASYNC230 (one short line, at the end)
            out.write(orjson.dumps(summary) + b"\n")
    hint = f"repeat with: {reproduce_command()}"
    if remaining or bad:
        for replica in chaos.replicas:
            lines = replica.log.read_text(errors="replace").splitlines()[-15:]
            print(f"--- last lines of {replica.name} ({replica.log.name}):", *lines, sep="\n")
    assert not remaining, (
        f"not converged {converge_within:.0f}s after the last fault: {remaining[:5]}; {hint}"
    )
    assert not bad, f"writes without the Lease: {bad[:5]}; {hint}"
    assert writes > 0, "the audit log shows no write by any replica: the check proves nothing"
    assert running, f"no replica is running at the end; {hint}"
    assert not unready, f"running replicas not ready within 60s: {unready}; {hint}"
    missing = [n for n, m in metrics.items() if "rest_client_requests_total" not in m]
    assert not missing, f"no client metrics from {missing}"
    dead = {n: m["informer_reflector_restarts_total"] for n, m in metrics.items()
            if m.get("informer_reflector_restarts_total")}  # fmt: skip
    stuck = [c for c in chaos.idle_checks if c.same_process and not c.watching]
    assert not stuck, f"a follower had no watch open for {WATCH_OPEN_WITHIN:.0f}s: {stuck}; {hint}"
    unnoticed = [
        c for c in chaos.idle_checks if c.same_process and c.watching and c.after <= c.before
    ]
    assert not unnoticed, (
        f"a follower frozen {LONG_FREEZE}s (past its idle window) did not restart a watch for "
        f"silence: {unnoticed}; {hint}"
    )
    assert not dead, f"reflectors died (and were restarted) in {dead}: see the logs; {hint}"
