"""The benchmark harness: ``python -m bench`` (``make bench``). See docs/benchmarks.md.

One local control plane (:class:`~controller_runtime.envtest.ControlPlane`) for the whole run.
Each implementation gets its own namespace holding the same N Tasks (created up front with
concurrent POSTs), and runs as its own OS process, one after another, so that its RSS and CPU
are its own and nothing else of the benchmark runs beside it but the harness's observer and
loader.

Scenarios (all observed from outside through the harness's own watch, the same way for every
implementation; see :mod:`bench.kube`):

``sync``
    The implementation starts with N Tasks that have no status. Measured from process start
    until every Task's ``status.observedGeneration`` equals its ``metadata.generation`` (each
    has been reconciled once, and its derived status written): seconds, peak RSS, CPU seconds.
``churn``
    The same process, once synced: the harness's loader patches ``spec.details`` of every Task
    once, at a fixed rate (open loop). Lag of one update = from the loader sending the patch to
    the observer seeing the status reach the generation that patch made. p50/p99 lag, and
    updates per second from the first send to the last status seen.
``write-heavy``
    A new process in write-heavy mode (every reconcile writes: see
    :mod:`bench.runners.stamp`) on the same namespace; ``rounds`` writes per Task. Writes per
    second from the first stamped status seen to the last. Beside it, ``limit``: a plain
    aiohttp client making the same writes (:mod:`bench.runners.limit`) to a namespace of its
    own holding the same fresh N Tasks, brought to the state the implementations' namespaces
    are in when their write-heavy run starts (synced first, unmeasured, when ``sync`` ran), in
    the same rotating order as the implementations.
``restart``
    :mod:`bench.restart`: N Tasks already reconciled (``--restart-objects``, default 100,000,
    created once and reused); each implementation starts on them and must reconcile each once,
    nothing to write. Done is read from the process's own Prometheus endpoint (the same metric
    names in ours and Go). Beside it, ``limit``: a plain paginated LIST + orjson decode.
``startup``
    :mod:`bench.startup`: ``python -m controllers`` (Task controller), the docs' mirror
    controller and the Go peer from exec to ready and to the first reconcile at 0, 1k and
    10k objects, with the idle RSS and ``python -X importtime`` per package.
``core``
    :mod:`bench.core` (no API server): recorded watch bytes served over loopback HTTP, read by
    our informer (-> queue -> no-op reconcile) and by client-go's (-> workqueue), beside
    orjson decoding alone.

``webhook``
    :mod:`bench.webhook` (a control plane of its own): a validating webhook of Tasks, ours
    beside controller-runtime's, timed directly and through the API server at
    ``--webhook-rate`` requests a second, and the most the API server takes through each.
    Its rows go to ``bench/results/webhook.json`` and a table of their own.

``--storage etcd,kine-sqlite,kine-postgres`` runs the storage comparison instead
(:mod:`bench.storage`): one control plane per backend, the same measurements on each.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import report
from bench.cpus import CoreSplit, parse_split
from bench.cpus import apply as apply_split
from bench.kube import TaskObserver, churn, create_tasks, task_name
from bench.procs import Child, cpu_seconds
from bench.report import Result
from controller_runtime.envtest.binaries import BinaryError

SCENARIOS = ("sync", "churn", "write-heavy", "restart", "startup", "core", "webhook")
CLUSTER_SCENARIOS = ("sync", "churn", "write-heavy", "restart", "startup")
IMPLEMENTATIONS = ("ours", "go", "kopf")
EXTRA_IMPLEMENTATIONS = ("ours-echoes", "ours-uvloop")
BUDGETED = "ours-budget"
"""The restart row of ours with a cache memory budget (``--memory-limit BYTES``)."""
"""Run only when named: ``ours-echoes`` is ours in write-heavy reconciling the echo of each of
its own writes again (``--reconcile-echoes``), as it did before ``skip_own_write_echoes``;
``ours-uvloop`` is ours on uvloop's event loop (``CRPY_EVENT_LOOP=uvloop``; ``ours`` always
runs on asyncio's, whatever the environment says)."""
EVENT_LOOPS = {"ours-uvloop": "uvloop"}
"""The event loop of each implementation of ours that does not run on asyncio's."""
RESULTS_DIR = Path(__file__).with_name("results")
REPO = Path(__file__).resolve().parents[1]
KOPF_FILE = Path(__file__).with_name("peers") / "kopf_task.py"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Settings:
    """What the command line decides; defaults in :func:`parser`."""

    scenarios: tuple[str, ...]
    implementations: tuple[str, ...]
    objects: int
    restart_objects: int
    restart_load: str
    restart_shards: int
    etcd_quota_gib: float | None
    startup_objects: tuple[int, ...]
    core_objects: tuple[int, ...]
    workers: int
    churn_rate: float
    write_rounds: int
    limit_concurrency: tuple[int, ...]
    repeat: int
    limit_watch: bool
    timeout: float
    json_path: Path
    plots_dir: Path
    logs_dir: Path
    storage: tuple[str, ...] = ()
    storage_sizes: tuple[int, ...] = ()
    storage_churn: int = 1000
    etcd_quota: int = 2 * 2**30
    storage_load: str = "api"
    storage_list_limit_seconds: float | None = None
    storage_serve_timeout: float | None = None
    kine_poll_batch_size: int | None = None
    storage_json: Path = Path("storage.json")
    memory_limit: int | None = None
    webhook_rate: float = 100.0
    webhook_seconds: float = 20.0
    webhook_json: Path = Path("webhook.json")
    split_cores: CoreSplit | None = None
    restart_limit_seconds: float = 0.0
    restart_shard_settle: float | None = None


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _ints(value: str) -> tuple[int, ...]:
    return tuple(int(part) for part in _csv(value))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Reconcile-throughput benchmarks of this runtime beside a Go "
        "controller-runtime peer and a kopf peer, on one local control plane.",
    )
    p.add_argument(
        "--scenarios",
        type=_csv,
        default=SCENARIOS,
        help=f"comma-separated, of {','.join(SCENARIOS)} (default: all)",
    )
    p.add_argument(
        "--implementations",
        type=_csv,
        default=IMPLEMENTATIONS,
        help=f"comma-separated, of {','.join(IMPLEMENTATIONS)} (default: all), or "
        f"{','.join(EXTRA_IMPLEMENTATIONS)} (only when named); "
        "write-heavy always adds the plain-client limit",
    )
    p.add_argument("--objects", type=int, help="Tasks per implementation (default 10000)")
    p.add_argument(
        "--restart-objects",
        type=int,
        help="reconciled Tasks the restart scenario starts on (default 100000); with "
        "--storage, the restart runs on the first rung of the ladder holding that many",
    )
    p.add_argument(
        "--restart-load",
        choices=("api", "etcd"),
        default="api",
        help="restart: create the reconciled Tasks through the API server (a POST and a "
        "status PATCH each), or write them straight into etcd (bench/etcdload.py; for a "
        "million objects) (default: %(default)s)",
    )
    p.add_argument(
        "--restart-shards",
        type=int,
        default=0,
        help="restart: also run the sharded Task controller with this many replicas "
        "(server-side sharded watches; the row ours-sharded; default: 0, not run)",
    )
    p.add_argument(
        "--restart-shard-settle",
        type=float,
        default=None,
        help="restart: the sharded replicas' ShardRingConfig(settle=SECONDS), how long a "
        "replica waits for the others before claiming shards (default: the runtime's, two "
        "retry periods; docs/scaling.md says to set it above the replicas' start-up)",
    )
    p.add_argument(
        "--restart-limit-seconds",
        type=float,
        default=0.0,
        help="restart: stop the plain paginated LIST (the row limit) after this many seconds "
        "and report its pages' times instead of the whole list (at a million objects the "
        "API server serves it a page every few seconds; default 0: list it all)",
    )
    p.add_argument(
        "--memory-limit",
        type=int,
        help="restart: also run ours with ManagerOptions(cache_memory_limit=BYTES), the row "
        "ours-budget (default: not run)",
    )
    p.add_argument(
        "--etcd-quota-gib",
        type=float,
        help="etcd's --quota-backend-bytes in GiB (default: etcd's 2 GiB; a million Tasks "
        "need about 4)",
    )
    p.add_argument(
        "--startup-objects",
        type=_ints,
        help="comma-separated sizes of the startup scenario (default 0,1000,10000)",
    )
    p.add_argument(
        "--core-objects",
        type=_ints,
        help="comma-separated sizes of the core scenario (default 100000,1000000)",
    )
    p.add_argument(
        "--webhook-rate",
        type=float,
        default=100.0,
        help="webhook: admission requests a second, open loop (default: %(default)s)",
    )
    p.add_argument(
        "--webhook-seconds",
        type=float,
        help="webhook: seconds each measurement sends for (default 20; 5 with --quick)",
    )
    p.add_argument(
        "--webhook-json", type=Path, default=RESULTS_DIR / "webhook.json", dest="webhook_json"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=32,
        help="concurrent reconciles of ours and the Go peer (kopf has one worker per object; "
        "default: %(default)s)",
    )
    p.add_argument(
        "--churn-rate",
        type=float,
        default=100.0,
        help="churn updates per second sent by the loader (default: %(default)s)",
    )
    p.add_argument(
        "--write-rounds",
        type=int,
        default=1,
        help="write-heavy: status writes per Task (default: %(default)s)",
    )
    p.add_argument(
        "--limit-concurrency",
        type=_ints,
        default=(16, 64),
        help="write-heavy: requests in flight of the plain client; several values run it "
        "once each, the best is the limit (default: 16,64)",
    )
    p.add_argument(
        "--limit-watch",
        action="store_true",
        help="write-heavy: also run the plain client with a watch of its namespace that "
        "decodes every event, at --workers requests in flight (the row limit-watch)",
    )
    p.add_argument(
        "--split-cores",
        metavar="SERVER:CLIENT",
        help="pin the control plane to the cores before the colon and the harness with the "
        "implementations it starts to those after it, e.g. 0:1 (bench/cpus.py; default: "
        "everything shares every core)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of sync and write-heavy per implementation, in rotating order, each on "
        "fresh Tasks; the table shows the median run (churn runs once; default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds one measured phase may take before it is recorded as incomplete "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1000 Tasks, restart at 1000, core at 20000, 120 s timeout",
    )
    p.add_argument(
        "--storage",
        type=_csv,
        default=(),
        help="run the storage comparison on these backends (of etcd,kine-sqlite,kine-postgres) "
        "instead of the scenarios above; see docs/benchmarks.md, Storage",
    )
    p.add_argument(
        "--storage-sizes",
        type=_ints,
        help="storage: the object counts of the ladder (default 10000,100000,1000000)",
    )
    p.add_argument(
        "--storage-churn",
        type=int,
        default=1000,
        help="storage: updates of the watch-latency run, at --churn-rate (default: %(default)s)",
    )
    p.add_argument(
        "--etcd-quota",
        type=int,
        default=2 * 2**30,
        help="storage: etcd's --quota-backend-bytes (default: 2 GiB, etcd's own default)",
    )
    p.add_argument(
        "--storage-load",
        choices=("api", "direct"),
        default="api",
        help="storage: create each rung's Tasks through the API server (api, their rate "
        "measured), or write them reconciled straight into etcd or kine's table (direct: "
        "minutes for a million; bench/etcdload.py, bench/kineload.py)",
    )
    p.add_argument(
        "--storage-list-limit-seconds",
        type=float,
        help="storage: stop each rung's paginated LIST after this long (default: never)",
    )
    p.add_argument(
        "--storage-serve-timeout",
        type=float,
        help="storage, with --storage-load direct: seconds the API server may take to serve "
        "what was written before the rung is recorded as not served (default: no bound)",
    )
    p.add_argument(
        "--kine-poll-batch-size",
        type=int,
        help="storage: kine's --poll-batch-size, the rows its watch reads per query (default: "
        "kine's own, 500). Each query costs in proportion to the whole backlog, so a backlog of "
        "R rows drains in about R*R/(2*size) row reads: raise it for bulk loads",
    )
    p.add_argument(
        "--storage-json", type=Path, default=RESULTS_DIR / "storage.json", dest="storage_json"
    )
    p.add_argument("--json", type=Path, default=RESULTS_DIR / "latest.json", dest="json_path")
    p.add_argument("--plots", type=Path, default=RESULTS_DIR, dest="plots_dir")
    return p


def settings_from(argv: Sequence[str] | None = None) -> Settings:
    p = parser()
    args = p.parse_args(argv)
    from controller_runtime.envtest.storage import BACKENDS  # noqa: PLC0415

    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    known = IMPLEMENTATIONS + EXTRA_IMPLEMENTATIONS
    unknown += [i for i in args.implementations if i not in known]
    unknown += [b for b in args.storage if b not in BACKENDS]
    if unknown:
        p.error(f"unknown: {', '.join(unknown)}")
    objects = args.objects or (1000 if args.quick else 10000)
    try:
        split = parse_split(args.split_cores) if args.split_cores else None
    except ValueError as e:
        p.error(str(e))
    core = args.core_objects or ((20000,) if args.quick else (100_000, 1_000_000))
    return Settings(
        scenarios=tuple(s for s in SCENARIOS if s in args.scenarios),
        implementations=tuple(args.implementations),
        objects=objects,
        restart_objects=args.restart_objects or (1000 if args.quick else 100_000),
        restart_load=args.restart_load,
        restart_shards=args.restart_shards,
        memory_limit=args.memory_limit,
        etcd_quota_gib=args.etcd_quota_gib,
        startup_objects=args.startup_objects
        if args.startup_objects is not None
        else ((0, 1000) if args.quick else (0, 1000, 10_000)),
        core_objects=core,
        workers=args.workers,
        churn_rate=args.churn_rate,
        write_rounds=args.write_rounds,
        limit_concurrency=args.limit_concurrency,
        repeat=max(1, args.repeat),
        limit_watch=args.limit_watch,
        timeout=min(args.timeout, 120.0) if args.quick else args.timeout,
        json_path=args.json_path,
        plots_dir=args.plots_dir,
        logs_dir=args.plots_dir / "logs",
        storage=tuple(args.storage),
        storage_sizes=args.storage_sizes
        or ((1000, 5000) if args.quick else (10_000, 100_000, 1_000_000)),
        storage_churn=200 if args.quick and args.storage_churn == 1000 else args.storage_churn,
        etcd_quota=args.etcd_quota,
        storage_load=args.storage_load,
        storage_list_limit_seconds=args.storage_list_limit_seconds,
        storage_serve_timeout=args.storage_serve_timeout,
        kine_poll_batch_size=args.kine_poll_batch_size,
        storage_json=args.storage_json,
        webhook_rate=args.webhook_rate,
        webhook_seconds=args.webhook_seconds or (5.0 if args.quick else 20.0),
        webhook_json=args.webhook_json,
        split_cores=split,
        restart_limit_seconds=args.restart_limit_seconds,
        restart_shard_settle=args.restart_shard_settle,
    )


# -- versions ---------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from bench.peers.gopeer import controller_runtime_version  # noqa: PLC0415
    from controller_runtime.envtest import ETCD_VERSION, KUBERNETES_VERSION  # noqa: PLC0415
    from controller_runtime.envtest.binaries import KINE_VERSION  # noqa: PLC0415

    def dist(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    go = shutil.which("go")
    go_version = (
        subprocess.run(
            [go, "env", "GOVERSION"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if go
        else "none"
    )
    return {
        "python": platform.python_version(),
        "ours": dist("controller-runtime-py"),
        "kopf": dist("kopf"),
        "uvloop": dist("uvloop"),
        "aiohttp": dist("aiohttp"),
        "orjson": dist("orjson"),
        "controller-runtime": controller_runtime_version(),
        "go": go_version,
        "kube-apiserver": KUBERNETES_VERSION,
        "etcd": ETCD_VERSION,
        "kine": KINE_VERSION,
    }


def version_of(implementation: str, v: dict[str, str]) -> str:
    if implementation == "go":
        return f"controller-runtime {v['controller-runtime']}, {v['go']}"
    if implementation == "kopf":
        return f"kopf {v['kopf']}, Python {v['python']}"
    return f"controller-runtime-py {v['ours']}, Python {v['python']}"


# -- one implementation process ---------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """How to start one implementation against one namespace."""

    implementation: str
    namespace: str
    mode: str = "normal"
    stamp: str = ""
    rounds: int = 1
    concurrency: int = 64
    watch: bool = False
    """The limit: also watch the namespace and decode every event (``limit-watch``)."""
    sync_only: bool = False
    """The limit: only write the derived status of every Task, then exit (an unmeasured pass
    that does what ``sync`` did to the implementations' namespaces)."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on 127.0.0.1:PORT (the restart scenario)."""


class Cluster:
    """The shared state of the cluster scenarios of one run."""

    def __init__(self, settings: Settings, kubeconfig: Path, server_pids: list[int]) -> None:
        self.settings = settings
        self.kubeconfig = kubeconfig
        self.server_pids = server_pids
        self.versions = versions()
        self.go_binary: Path | None = None
        self.run_id = time.strftime("%H%M%S")
        self.results: list[Result] = []
        self.plane: Any = None
        self.etcd_url = ""

    def command(self, launch: Launch) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        workers = str(self.settings.workers)
        if launch.implementation in ("ours", "ours-echoes", "ours-uvloop", BUDGETED):
            env["CRPY_EVENT_LOOP"] = EVENT_LOOPS.get(launch.implementation, "asyncio")
            command = [
                sys.executable,
                "-m",
                "bench.runners.ours",
                f"--kubeconfig={self.kubeconfig}",
                f"--namespace={launch.namespace}",
                f"--mode={launch.mode}",
                f"--stamp={launch.stamp}",
                f"--rounds={launch.rounds}",
                f"--workers={workers}",
                f"--cache-sync-timeout={self.settings.timeout}",
            ]
            if launch.implementation == "ours-echoes":
                command.append("--reconcile-echoes")
            if launch.implementation == BUDGETED:
                command.append(f"--memory-limit={self.settings.memory_limit}")
            if launch.metrics_port is not None:
                command.append(f"--metrics-bind-address=127.0.0.1:{launch.metrics_port}")
        elif launch.implementation == "go":
            assert self.go_binary is not None
            command = [
                str(self.go_binary),
                f"-namespace={launch.namespace}",
                f"-mode={launch.mode}",
                f"-stamp={launch.stamp}",
                f"-rounds={launch.rounds}",
                f"-workers={workers}",
                f"-cache-sync-timeout={self.settings.timeout}s",
            ]
            if launch.metrics_port is not None:
                command.append(f"-metrics-bind-address=127.0.0.1:{launch.metrics_port}")
        elif launch.implementation == "kopf":
            env |= {
                "BENCH_MODE": launch.mode,
                "BENCH_STAMP": launch.stamp,
                "BENCH_ROUNDS": str(launch.rounds),
            }
            command = [
                sys.executable,
                "-m",
                "kopf",
                "run",
                "--standalone",
                "--quiet",
                f"--namespace={launch.namespace}",
                str(KOPF_FILE),
            ]
        elif launch.implementation in ("limit", "listlimit"):
            command = self._limit_command(launch)
        else:
            raise ValueError(launch.implementation)
        return command, env

    def _limit_command(self, launch: Launch) -> list[str]:
        """The plain client of write-heavy (``limit``) or the paginated LIST of restart
        (``listlimit``)."""
        if launch.implementation == "limit":
            command = [
                sys.executable,
                "-m",
                "bench.runners.limit",
                f"--kubeconfig={self.kubeconfig}",
                f"--namespace={launch.namespace}",
                f"--stamp={launch.stamp}",
                f"--rounds={launch.rounds}",
                f"--concurrency={launch.concurrency}",
            ]
            if launch.watch:
                command.append("--watch")
            if launch.sync_only:
                command.append("--sync-only")
            return command
        command = [
            sys.executable,
            "-m",
            "bench.runners.listlimit",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={launch.namespace}",
        ]
        if self.settings.restart_limit_seconds:
            command.append(f"--seconds={self.settings.restart_limit_seconds}")
        return command

    def start(self, launch: Launch, scenario: str, repeat: int) -> Child:
        command, env = self.command(launch)
        name = launch.implementation
        if name == "limit":
            name += f"{'-watch' if launch.watch else ''}{launch.concurrency}"
        log = self.settings.logs_dir / f"{scenario}-{repeat}-{name}.log"
        return Child.start(launch.implementation, command, env, log)

    def server_cpu(self) -> float | None:
        return cpu_seconds(self.server_pids) if self.server_pids else None

    def namespace(self, implementation: str, repeat: int = 0) -> str:
        return f"bench-{implementation}-{self.run_id}-{repeat}"

    def base(self, scenario: str, implementation: str) -> Result:
        return {
            "scenario": scenario,
            "implementation": implementation,
            "objects": self.settings.objects,
            "version": version_of(implementation, self.versions),
            **(
                {"cores": self.settings.split_cores.describe()} if self.settings.split_cores else {}
            ),
        }


async def _progress_until(
    observer: TaskObserver,
    child: Child,
    label: str,
    count: Callable[[], int],
    timeout: float,
    *,
    extra_done: Callable[[], bool] | None = None,
) -> bool:
    """Wait until ``count()`` reaches N (and ``extra_done()``, when given), printing progress
    every 5 s. False on timeout or if the child died."""
    n = len(observer.objects)
    deadline = time.monotonic() + timeout
    last = time.monotonic()

    def done() -> bool:
        return count() >= n and (extra_done is None or extra_done())

    while not done():
        if not child.alive() and (child.name != "limit" or child.popen.returncode != 0):
            say(f"  {label}: the process exited ({child.popen.returncode}):\n{child.log_tail()}")
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            say(f"  {label}: timed out at {count()}/{n}")
            return False
        await observer.wait(done, min(remaining, 5.0))
        now = time.monotonic()
        if now - last >= 5:
            last = now
            rss = child.rss()
            cpu = child.cpu_seconds()
            say(
                f"  {label}: {count()}/{n}, {now - child.started:.0f}s, "
                f"RSS {(rss or 0) / 2**20:.0f} MiB, CPU {cpu or 0:.1f}s"
            )
    return True


async def run_sync_and_churn(
    cluster: Cluster, implementation: str, transport: Any, *, repeat: int, churning: bool
) -> None:
    """The sync scenario and, in the same process once synced (and ``churning``), churn."""
    s = cluster.settings
    namespace = cluster.namespace(implementation, repeat)
    observer = TaskObserver(transport, namespace)
    await observer.start()
    n = len(observer.objects)
    if observer.reconciled:
        raise RuntimeError(f"{namespace} has reconciled Tasks already; a fresh one is needed")
    server_before = cluster.server_cpu()
    child = cluster.start(Launch(implementation, namespace), "sync", repeat)
    label = f"sync/{implementation}"
    say(f"[{label}] started pid {child.pid} on {namespace}")
    try:
        ok = await _progress_until(observer, child, label, lambda: observer.reconciled, s.timeout)
        done_at = time.monotonic()
        seconds = done_at - child.started
        server_after = cluster.server_cpu()
        sync: Result = cluster.base("sync", implementation) | {
            "seconds": seconds,
            "per_second": observer.reconciled / seconds,
            "peak_rss_bytes": child.peak_rss(),
            "cpu_seconds": child.cpu_seconds(),
            "server_cpu_seconds": _delta(server_before, server_after),
            "workers": s.workers,
            "complete": ok,
        }
        if not ok:
            sync["objects_done"] = observer.reconciled
        say(f"[{label}] {_summary(sync)}")
        if "sync" in s.scenarios:
            cluster.results.append(sync)
        if churning and ok:
            await asyncio.sleep(1.0)  # let the echoes of the last status writes arrive
            cluster.results.append(await _churn(cluster, implementation, observer, child, n))
    finally:
        child.stop()
        await observer.stop()


async def _churn(
    cluster: Cluster, implementation: str, observer: TaskObserver, child: Child, n: int
) -> Result:
    s = cluster.settings
    label = f"churn/{implementation}"
    names = [task_name(i) for i in range(n)]
    cpu_before = child.cpu_seconds()
    server_before = cluster.server_cpu()
    say(f"[{label}] {n} updates at {s.churn_rate:.0f}/s")
    loading = asyncio.create_task(
        churn(observer.transport, observer.namespace, names, rate=s.churn_rate, progress=say)
    )

    def caught_up() -> bool:
        if not loading.done():
            return False
        target = loading.result().target_generation
        return all(
            observer.objects[name].observed_generation >= generation
            for name, generation in target.items()
        )

    ok = await _progress_until(
        observer, child, label, lambda: observer.reconciled, s.timeout, extra_done=caught_up
    )
    if not loading.done():
        loading.cancel()
    done_at = time.monotonic()
    cpu_after = child.cpu_seconds()
    server_after = cluster.server_cpu()
    load = await loading if ok else None
    lags: list[float] = []
    last_seen = done_at
    if load is not None:
        last_seen = 0.0
        for name, generation in load.target_generation.items():
            history = observer.objects[name].first_reconciled
            reached = [t for g, t in history.items() if g >= generation]
            if reached:
                seen = min(reached)
                lags.append(seen - load.sent_at[name])
                last_seen = max(last_seen, seen)
        if load.failures:
            say(f"  {label}: {load.failures} loader writes failed")
    first_sent = load.first_sent if load is not None else done_at
    seconds = max(last_seen - first_sent, 1e-9)
    result: Result = cluster.base("churn", implementation) | {
        "seconds": seconds,
        "per_second": len(lags) / seconds,
        "peak_rss_bytes": child.peak_rss(),
        "cpu_seconds": _delta(cpu_before, cpu_after),
        "server_cpu_seconds": _delta(server_before, server_after),
        "workers": s.workers,
        "complete": ok and len(lags) == n,
    }
    if lags:
        result |= {
            "p50_seconds": report.percentile(lags, 50),
            "p99_seconds": report.percentile(lags, 99),
            "lag_quantiles": report.quantiles(lags),
        }
    if not result["complete"]:
        result["objects_done"] = len(lags)
    say(f"[{label}] {_summary(result)}")
    return result


async def run_write_heavy(cluster: Cluster, launch: Launch, transport: Any, repeat: int) -> Result:
    s = cluster.settings
    observer = TaskObserver(transport, launch.namespace, stamp=launch.stamp, rounds=launch.rounds)
    await observer.start()
    n = len(observer.objects)
    server_before = cluster.server_cpu()
    child = cluster.start(launch, "write-heavy", repeat)
    label = f"write-heavy/{launch.implementation}{'-watch' if launch.watch else ''}"
    say(f"[{label}] started pid {child.pid} on {launch.namespace}, {launch.rounds} write(s)/Task")
    try:
        ok = await _progress_until(
            observer, child, label, lambda: observer.fully_stamped, s.timeout
        )
        if launch.implementation == "limit" and ok:
            child.wait_exit(30)  # it exits when done: then its rusage is all there is
        cpu = child.cpu_seconds()
        peak = child.peak_rss()
        server_after = cluster.server_cpu()
    finally:
        code = child.stop()
        await observer.stop()
    if launch.implementation == "limit" and code not in (0, None):
        say(f"  {label}: exited {code}:\n{child.log_tail()}")
    first = observer.first_stamp_at or child.started
    last = observer.last_stamp_at or time.monotonic()
    seconds = max(last - first, 1e-9)
    result: Result = cluster.base("write-heavy", launch.implementation) | {
        "objects": n,
        "seconds": seconds,
        "per_second": observer.stamped_writes / seconds,
        "peak_rss_bytes": peak,
        "cpu_seconds": cpu,
        "server_cpu_seconds": _delta(server_before, server_after),
        "rounds": launch.rounds,
        "complete": ok,
    }
    if launch.implementation == "limit":
        result["concurrency"] = launch.concurrency
        result["version"] = f"aiohttp {cluster.versions['aiohttp']}, no framework" + (
            ", a watch decoded with orjson" if launch.watch else ""
        )
    else:
        result["workers"] = s.workers
    if not ok:
        result["objects_done"] = observer.fully_stamped
    say(f"[{label}] {_summary(result)}")
    return result


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _summary(result: Result) -> str:
    text = (
        f"{result['seconds']:.2f}s, {result['per_second']:,.0f}/s, "
        f"peak RSS {(result['peak_rss_bytes'] or 0) / 2**20:.0f} MiB, "
        f"CPU {result['cpu_seconds'] or 0:.1f}s"
    )
    if result.get("server_cpu_seconds") is not None:
        text += f", server CPU {result['server_cpu_seconds']:.1f}s"
    if "p50_seconds" in result:
        text += f", lag p50 {result['p50_seconds'] * 1000:.0f} ms p99 "
        text += f"{result['p99_seconds'] * 1000:.0f} ms"
    if "reconcile_errors" in result:
        text += f", {result['reconcile_errors']} reconcile errors"
    if "fetches_on_miss" in result:
        text += f", {result['fetches_on_miss']} fetched on a miss"
    if not result.get("complete", True):
        text += f" (INCOMPLETE: {result.get('objects_done')} done)"
    return text


async def run_cluster(cluster: Cluster) -> None:
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    s = cluster.settings
    config = await load_kubeconfig(cluster.kubeconfig)
    async with Transport(config, max_connections=128) as transport:
        if "restart" in s.scenarios:
            from bench.restart import run_restart_round  # noqa: PLC0415

            await run_restart_round(cluster, transport, s.implementations)
        if "startup" in s.scenarios:
            from bench.startup import run_startup_round  # noqa: PLC0415

            await run_startup_round(cluster, transport, s.implementations, s.startup_objects)
        if not {"sync", "churn", "write-heavy"} & set(s.scenarios):
            return
        for repeat in range(s.repeat):
            # Rotate the order, so that no implementation always runs first or last.
            shift = repeat % len(s.implementations)
            order = s.implementations[shift:] + s.implementations[:shift]
            limits = [f"limit{c}" for c in s.limit_concurrency]
            limits += ["limit-watch"] if s.limit_watch else []
            fresh = [*order, *limits] if "write-heavy" in s.scenarios else order
            for implementation in fresh:
                namespace = cluster.namespace(implementation, repeat)
                say(f"creating {s.objects} Tasks in {namespace}")
                took = await create_tasks(transport, namespace, s.objects, progress=say)
                say(f"  created in {took:.1f}s ({s.objects / took:.0f}/s)")
            if "sync" in s.scenarios or ("churn" in s.scenarios and repeat == 0):
                for implementation in order:
                    await run_sync_and_churn(
                        cluster,
                        implementation,
                        transport,
                        repeat=repeat,
                        churning="churn" in s.scenarios and repeat == 0,
                    )
            if "write-heavy" in s.scenarios:
                await _write_heavy_round(cluster, transport, order, repeat)


async def _sync_limit_namespace(cluster: Cluster, launch: Launch, repeat: int) -> None:
    """Run the limit in ``--sync-only`` mode to its exit (unmeasured)."""
    say(f"  syncing {launch.namespace} with the plain client (not measured)")
    child = cluster.start(launch, "write-heavy-sync", repeat)
    try:
        exited = await asyncio.to_thread(child.wait_exit, cluster.settings.timeout)
    finally:
        code = child.stop()
    if not exited or code != 0:
        raise RuntimeError(
            f"the limit's sync pass on {launch.namespace} failed (exit {code}):\n{child.log_tail()}"
        )


def write_heavy_order(
    implementations: Sequence[str],
    limit_concurrency: Sequence[int],
    repeat: int,
    *,
    limit_watch: int | None = None,
) -> list[tuple[str, int | None]]:
    """The write-heavy runs of one round, ``(implementation, limit concurrency or None)``:
    the implementations, the limit at each concurrency and, with ``limit_watch`` (its
    concurrency), ``limit-watch``; rotated by ``repeat`` so that none always runs first or
    last (the API server's state grows during a run)."""
    runs: list[tuple[str, int | None]] = [(name, None) for name in implementations]
    runs += [("limit", concurrency) for concurrency in limit_concurrency]
    if limit_watch is not None:
        runs.append(("limit-watch", limit_watch))
    shift = repeat % len(runs)
    return runs[shift:] + runs[:shift]


async def _write_heavy_round(
    cluster: Cluster, transport: Any, order: Sequence[str], repeat: int
) -> None:
    s = cluster.settings
    limits = []
    runs = write_heavy_order(
        order, s.limit_concurrency, repeat, limit_watch=s.workers if s.limit_watch else None
    )
    for implementation, concurrency in runs:
        if concurrency is None:
            launch = Launch(
                implementation,
                cluster.namespace(implementation, repeat),
                mode="write-heavy",
                stamp=f"{implementation}-{cluster.run_id}-{repeat}",
                rounds=s.write_rounds,
            )
            cluster.results.append(await run_write_heavy(cluster, launch, transport, repeat))
            continue
        # The limit writes to fresh Tasks of its own, synced first (unmeasured) when the
        # implementations' were, so that every write-heavy run starts from the same state.
        watch = implementation == "limit-watch"
        label = implementation if watch else f"limit{concurrency}"
        launch = Launch(
            "limit",
            cluster.namespace(label, repeat),
            mode="write-heavy",
            stamp=f"{label}-{cluster.run_id}-{repeat}",
            rounds=s.write_rounds,
            concurrency=concurrency,
            watch=watch,
        )
        if "sync" in s.scenarios:
            await _sync_limit_namespace(
                cluster, replace(launch, sync_only=True, watch=False), repeat
            )
        result = await run_write_heavy(cluster, launch, transport, repeat)
        if watch:
            cluster.results.append(result | {"implementation": "limit-watch"})
        else:
            limits.append(result)
    # The best of the limit's concurrencies is the limit.
    cluster.results.append(max(limits, key=lambda r: r["per_second"]))


def run(settings: Settings) -> list[Result]:
    results: list[Result] = []
    cluster_scenarios = [s for s in settings.scenarios if s in CLUSTER_SCENARIOS]
    started = time.monotonic()
    if cluster_scenarios:
        results += _run_cluster_scenarios(settings)
    if "core" in settings.scenarios:
        from bench.core import run_core  # noqa: PLC0415

        say(f"core: {', '.join(map(str, settings.core_objects))} objects")
        results += run_core(
            settings.core_objects,
            progress=say,
            implementations=[
                i for i in settings.implementations if i in ("ours", "ours-uvloop", "go")
            ],
            repeat=settings.repeat,
        )
    say(f"all done in {time.monotonic() - started:.0f}s")
    return results


def _run_cluster_scenarios(settings: Settings) -> list[Result]:
    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415

    cluster_settings = settings
    go_binary = None
    if "go" in settings.implementations:
        from bench.peers.gopeer import peer_binary  # noqa: PLC0415

        go_binary = peer_binary(progress=say)
    if "kopf" in settings.implementations:
        try:
            importlib.metadata.version("kopf")
        except importlib.metadata.PackageNotFoundError:
            say("kopf is not installed (make venv-bench); skipping the kopf peer")
            cluster_settings = replace(
                settings,
                implementations=tuple(i for i in settings.implementations if i != "kopf"),
            )
    for old in settings.logs_dir.glob("*.log"):
        old.unlink()
    say("starting the local control plane")
    etcd_args: dict[str, list[str]] = {}
    if settings.etcd_quota_gib:
        etcd_args["etcd"] = [f"--quota-backend-bytes={int(settings.etcd_quota_gib * 2**30)}"]
    gates = {"ShardedListAndWatch": True} if settings.restart_shards else {}
    with ControlPlane(storage_args=etcd_args, feature_gates=gates) as plane:
        cluster = Cluster(cluster_settings, plane.kubeconfig, plane.pids())
        if settings.split_cores:
            apply_split(settings.split_cores, plane.pids())
            say(settings.split_cores.describe())
        cluster.go_binary = go_binary
        cluster.plane = plane
        cluster.etcd_url = plane.etcd_url
        asyncio.run(run_cluster(cluster))
        return cluster.results


def run_storage_comparison(settings: Settings) -> int:
    """``--storage``: :mod:`bench.storage` on each backend; its own JSON file and table."""
    from bench.storage import StorageSettings, format_table, run_storage  # noqa: PLC0415

    implementations = tuple(i for i in settings.implementations if i in ("ours", "go"))
    go_binary = None
    if "go" in implementations:
        from bench.peers.gopeer import peer_binary  # noqa: PLC0415

        go_binary = peer_binary(progress=say)

    def make_cluster(plane: Any) -> Cluster:
        cluster = Cluster(settings, plane.kubeconfig, plane.pids())
        cluster.go_binary = go_binary
        return cluster

    storage = StorageSettings(
        backends=settings.storage,
        sizes=settings.storage_sizes,
        churn=settings.storage_churn,
        churn_rate=settings.churn_rate,
        etcd_quota=settings.etcd_quota,
        restart_objects=settings.restart_objects if "restart" in settings.scenarios else 0,
        implementations=implementations,
        timeout=settings.timeout,
        json_path=settings.storage_json,
        plots_dir=settings.plots_dir,
        load=settings.storage_load,
        list_limit_seconds=settings.storage_list_limit_seconds,
        serve_timeout=settings.storage_serve_timeout,
        kine_poll_batch_size=settings.kine_poll_batch_size,
    )
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    the_versions = versions()

    def save(results: list[Any]) -> None:
        storage.json_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "load_average_at_end": list(os.getloadavg()),
            "versions": the_versions,
            "etcd_quota_bytes": settings.etcd_quota,
            "results": results,
        }
        storage.json_path.write_text(json.dumps(payload, indent=1) + "\n")

    try:
        results = run_storage(storage, make_cluster, say, save)
    except BinaryError as err:
        say(f"bench: {err}")
        return 1
    print(format_table(results), flush=True)
    say(f"results: {storage.json_path}")
    try:
        from bench.plots import write_storage_plots  # noqa: PLC0415
    except ImportError as err:
        say(f"no plots ({err}; pip install -e '.[bench]')")
    else:
        for path in write_storage_plots(results, settings.plots_dir):
            say(f"plot: {path}")
    return 0


def run_webhook_scenario(settings: Settings) -> int:
    """``--scenarios webhook``: :mod:`bench.webhook`; its own JSON file and table."""
    from bench.webhook import format_table, run_webhook  # noqa: PLC0415

    implementations = [i for i in settings.implementations if i in ("ours", "go")]
    say(
        f"webhook: {', '.join(implementations)} at {settings.webhook_rate:.0f}/s for "
        f"{settings.webhook_seconds:.0f} s, {settings.repeat} round(s)"
    )
    try:
        rows = run_webhook(
            rate=settings.webhook_rate,
            seconds=settings.webhook_seconds,
            implementations=implementations,
            repeat=settings.repeat,
            progress=say,
        )
    except BinaryError as err:
        say(f"bench: {err}")
        return 1
    settings.webhook_json.parent.mkdir(parents=True, exist_ok=True)
    settings.webhook_json.write_text(json.dumps(rows, indent=2) + "\n")
    print(format_table(rows), flush=True)
    say(f"results: {settings.webhook_json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from(argv)
    if settings.storage:
        return run_storage_comparison(settings)
    say(
        f"bench: scenarios {','.join(settings.scenarios)}; implementations "
        f"{','.join(settings.implementations)}; {settings.objects} Tasks; "
        f"{os.cpu_count()} CPUs"
    )
    if "webhook" in settings.scenarios:
        if run_webhook_scenario(settings):
            return 1
        others = tuple(s for s in settings.scenarios if s != "webhook")
        settings = replace(settings, scenarios=others)
        if not settings.scenarios:
            return 0
    try:
        results = report.median_of_runs(run(settings))
    except BinaryError as err:
        say(f"bench: {err}")
        return 1
    report.write_json(settings.json_path, results)
    print(report.format_table(results), flush=True)
    say(f"results: {settings.json_path}")
    try:
        from bench.plots import write_plots  # noqa: PLC0415
    except ImportError as err:
        say(f"no plots ({err}; make venv-bench)")
    else:
        for path in write_plots(results, settings.plots_dir):
            say(f"plot: {path}")
    return 0
