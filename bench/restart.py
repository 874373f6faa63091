"""The restart scenario: N Tasks already reconciled, a controller process starts on them.

What an operator restart (upgrade, failover, eviction) costs: list and cache every object and
reconcile each once, with nothing to write. The harness creates the N Tasks once, with the
status the controller would derive (:func:`bench.kube.create_reconciled_tasks`), and every
implementation and repeat starts on that same namespace.

"Done" is read the same way for every implementation, from outside: the harness scrapes the
process's Prometheus endpoint every ``SCRAPE_INTERVAL`` seconds until
``controller_runtime_reconcile_total{controller="task"}`` summed over results reaches N and
``workqueue_depth`` of the task queue is 0 (:mod:`bench.scrape`). Seconds run from process
start to the first scrape that says so; peak RSS and CPU are read at that moment.

RSS per cached object = (peak RSS - the RSS of the same program on an empty namespace) / N.
The empty-namespace RSS is read once per implementation and run, ``EMPTY_SETTLE`` seconds
after its controller's series first appear on its endpoint.

The limit beside them (:mod:`bench.runners.listlimit`): a plain paginated LIST (500 per page)
of the same namespace, decoded with orjson, as its own process from start to exit.

kopf is left out: it serves no reconcile counter, so "done" cannot be observed the same way
(nothing is written, so the observer's watch sees nothing either), and at ≈ 80 KiB per object
(docs/benchmarks.md) 100k Tasks would need ≈ 8 GiB.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from bench.procs import Child, cpu_seconds
from bench.report import Result
from bench.scrape import Progress, scrape

if TYPE_CHECKING:
    from bench.harness import Cluster

SCRAPE_INTERVAL = 0.2
EMPTY_SETTLE = 2.0
KOPF_LEFT_OUT = (
    "kopf is left out of restart: it serves no reconcile counter, and with nothing to write "
    "nothing shows it is done; at ~80 KiB/object 100k Tasks would need ~8 GiB"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _say(message: str) -> None:
    from bench.harness import say  # noqa: PLC0415

    say(message)


async def _until_done(
    child: Child,
    session: aiohttp.ClientSession,
    url: str,
    n: int,
    *,
    timeout: float,
    label: str,
) -> tuple[bool, Progress | None]:
    deadline = child.started + timeout
    last_report = time.monotonic()
    progress: Progress | None = None
    while True:
        progress = await scrape(session, url, "task") or progress
        if progress is not None and progress.done(n):
            return True, progress
        if not child.alive():
            _say(f"  {label}: the process exited ({child.popen.returncode}):\n{child.log_tail()}")
            return False, progress
        now = time.monotonic()
        if now > deadline:
            _say(f"  {label}: timed out ({progress})")
            return False, progress
        if now - last_report >= 5:
            last_report = now
            done = progress.reconciles if progress else 0
            _say(
                f"  {label}: {done:.0f}/{n} reconciled, {now - child.started:.0f}s, "
                f"RSS {(child.rss() or 0) / 2**20:.0f} MiB, CPU {child.cpu_seconds() or 0:.1f}s"
            )
        await asyncio.sleep(SCRAPE_INTERVAL)


async def empty_rss(cluster: Cluster, implementation: str, namespace: str, repeat: int) -> int:
    """The RSS of ``implementation`` started on an empty namespace, once its controller runs."""
    from bench.harness import Launch  # noqa: PLC0415

    port = free_port()
    launch = Launch(implementation, namespace, metrics_port=port)
    child = cluster.start(launch, "restart-empty", repeat)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        async with aiohttp.ClientSession() as session:
            ok, _ = await _until_done(
                child, session, url, 0, timeout=120.0, label=f"restart-empty/{implementation}"
            )
        if not ok:
            raise RuntimeError(f"{implementation} did not start on an empty namespace")
        await asyncio.sleep(EMPTY_SETTLE)
        rss = child.rss()
        if rss is None:
            raise RuntimeError(f"{implementation} exited on an empty namespace")
        return rss
    finally:
        child.stop()


async def run_restart(
    cluster: Cluster, implementation: str, namespace: str, *, empty: str, n: int, repeat: int
) -> Result:
    """One restart of ``implementation`` on ``namespace`` (N reconciled Tasks)."""
    from bench.harness import Launch, _delta, _summary  # noqa: PLC0415

    label = f"restart/{implementation}"
    baseline = await empty_rss(cluster, implementation, empty, repeat)
    port = free_port()
    server_before = cluster.server_cpu()
    child = cluster.start(Launch(implementation, namespace, metrics_port=port), "restart", repeat)
    _say(f"[{label}] started pid {child.pid} on {namespace}")
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        async with aiohttp.ClientSession() as session:
            ok, progress = await _until_done(
                child, session, url, n, timeout=cluster.settings.timeout, label=label
            )
        seconds = time.monotonic() - child.started
        peak = child.peak_rss()
        cpu = child.cpu_seconds()
        server_after = cluster.server_cpu()
    finally:
        child.stop()
    result: Result = cluster.base("restart", implementation) | {
        "objects": n,
        "seconds": seconds,
        "per_second": n / seconds,
        "peak_rss_bytes": peak,
        "cpu_seconds": cpu,
        "server_cpu_seconds": _delta(server_before, server_after),
        "empty_rss_bytes": baseline,
        "rss_per_object": (peak - baseline) / n if peak is not None else 0.0,
        "workers": cluster.settings.workers,
        "complete": ok,
    }
    if implementation == "ours-budget":
        result["memory_limit"] = cluster.settings.memory_limit
    if progress is not None:
        result["reconcile_errors"] = int(progress.errors)
        if implementation == "ours-budget":
            result["fetches_on_miss"] = int(progress.fetches)
    if not ok:
        result["objects_done"] = int(progress.reconciles) if progress else 0
    _say(
        f"[{label}] {_summary(result)}, {result['rss_per_object']:.0f} B/object over an empty "
        f"{baseline / 2**20:.0f} MiB"
    )
    return result


async def run_list_limit(cluster: Cluster, namespace: str, n: int, repeat: int) -> Result:
    """The plain paginated LIST + orjson decode of ``namespace``, as its own process."""
    from bench.harness import Launch, _delta, _summary  # noqa: PLC0415

    label = "restart/limit"
    server_before = cluster.server_cpu()
    child = cluster.start(Launch("listlimit", namespace), "restart", repeat)
    ok = await asyncio.to_thread(child.wait_exit, cluster.settings.timeout)
    seconds = time.monotonic() - child.started
    server_after = cluster.server_cpu()
    code = child.stop()
    summary: dict[str, Any] = {}
    for line in reversed(child.log_tail(5).splitlines()):
        if line.startswith("{"):
            summary = orjson.loads(line)
            break
    listed = int(summary.get("objects", 0))
    ok = ok and code == 0 and listed == n
    if not ok and summary and not summary.get("complete", True):
        _say(f"  {label}: stopped after {summary['pages']} pages, {listed} objects, as asked")
    elif not ok:
        _say(f"  {label}: exited {code}, {summary}:\n{child.log_tail()}")
    result: Result = cluster.base("restart", "limit") | {
        "objects": n,
        "seconds": seconds,
        "per_second": (listed if summary else n) / seconds,
        "peak_rss_bytes": child.peak_rss(),
        "cpu_seconds": child.cpu_seconds(),
        "server_cpu_seconds": _delta(server_before, server_after),
        "list_bytes": int(summary.get("bytes", 0)),
        "json_per_object": summary.get("bytes", 0) / max(1, listed),
        "listed": listed,
        "pages": summary.get("pages"),
        "page_seconds": summary.get("page_seconds"),
        "complete": ok,
        "version": f"aiohttp {cluster.versions['aiohttp']} + orjson "
        f"{cluster.versions['orjson']}, LIST 500/page, no framework",
    }
    _say(f"[{label}] {_summary(result)}, {result['list_bytes'] / 2**20:.0f} MiB listed")
    return result


async def run_restart_round(
    cluster: Cluster, transport: Any, implementations: tuple[str, ...]
) -> None:
    """Create the N reconciled Tasks once, then each implementation (and the limit) restarts
    on them ``--repeat`` times, in rotating order."""
    from bench.kube import create_namespace, create_reconciled_tasks  # noqa: PLC0415

    s = cluster.settings
    n = s.restart_objects
    namespace = f"bench-restart-{cluster.run_id}"
    empty = f"bench-restart-empty-{cluster.run_id}"
    await create_namespace(transport, empty)
    if s.restart_load == "etcd":
        from bench.etcdload import load_reconciled_tasks  # noqa: PLC0415

        if cluster.plane is None or getattr(cluster.plane, "storage", "etcd") != "etcd":
            raise RuntimeError("--restart-load etcd needs the control plane on etcd")

        _say(f"writing {n} reconciled Tasks of {namespace} into etcd")
        took = await load_reconciled_tasks(cluster.etcd_url, transport, namespace, n, progress=_say)
        _say(f"  written and served in {took:.1f}s ({n / took:.0f}/s); not measured")
        quiet = await wait_for_quiet_server(cluster.server_pids)
        _say(f"  the control plane settled after {quiet:.0f}s more (below {QUIET_CORES} cores)")
    else:
        _say(f"creating {n} reconciled Tasks in {namespace}")
        took = await create_reconciled_tasks(transport, namespace, n, progress=_say)
        _say(f"  created and reconciled in {took:.1f}s ({n / took:.0f}/s); not measured")
    if "kopf" in implementations:
        _say(f"  {KOPF_LEFT_OUT}")
    order = [i for i in implementations if i != "kopf"] + ["limit"]
    if s.memory_limit is not None:
        from bench.harness import BUDGETED  # noqa: PLC0415

        order.insert(order.index("ours") + 1 if "ours" in order else 0, BUDGETED)
    if s.restart_shards:
        order.append(SHARDED)
    for repeat in range(s.repeat):
        shift = repeat % len(order)
        for implementation in order[shift:] + order[:shift]:
            if implementation == "limit":
                result = await run_list_limit(cluster, namespace, n, repeat)
            elif implementation == SHARDED:
                result = await run_sharded(cluster, namespace, n, s.restart_shards)
            else:
                result = await run_restart(
                    cluster, implementation, namespace, empty=empty, n=n, repeat=repeat
                )
            result["setup_seconds"] = took
            result |= server_memory(cluster)
            cluster.results.append(result)


QUIET_CORES = 0.3
"""The control plane counts as settled once its processes use less CPU than this, on
average over :data:`QUIET_WINDOW` seconds."""
QUIET_WINDOW = 5.0
QUIET_LONGEST = 900.0


async def wait_for_quiet_server(server_pids: Sequence[int]) -> float:
    """Wait until the control plane has digested a bulk load: an API server that has just
    taken a million objects through its etcd watch kept both cores busy for about two
    minutes here (not traced further; most likely filling its watch cache), and the first
    implementation to restart would pay for it. Returns the seconds waited (at most
    ``QUIET_LONGEST``; immediately when the server's CPU is not readable)."""
    started = time.monotonic()
    before = cpu_seconds(server_pids)
    while before is not None and time.monotonic() - started < QUIET_LONGEST:
        await asyncio.sleep(QUIET_WINDOW)
        after = cpu_seconds(server_pids)
        if after is None or (after - before) / QUIET_WINDOW < QUIET_CORES:
            break
        before = after
    return time.monotonic() - started


SHARDED = "ours-sharded"
"""The restart row of the sharded Task controller (``--restart-shards R`` replicas)."""


def server_memory(cluster: Cluster) -> dict[str, int]:
    """The API server's and etcd's RSS now (their peaks are the whole run's, not this one's)."""
    out: dict[str, int] = {}
    for pid, name in zip(cluster.server_pids, ("etcd", "apiserver"), strict=False):
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        out[f"{name}_rss_bytes"] = int(line.split()[1]) * 1024
        except OSError:
            continue
    return out


async def run_sharded(cluster: Cluster, namespace: str, n: int, replicas: int) -> Result:
    """A restart of the sharded Task controller with ``replicas`` replicas started at once
    (server-side sharded watches: the control plane runs with ``ShardedListAndWatch``), each
    talking to the API server directly; done when every Task was reconciled by some replica
    (:func:`bench.sharded_restart.run_ring`). ``peak_rss_bytes`` is the largest replica's."""
    from bench.harness import _summary  # noqa: PLC0415
    from bench.sharded_restart import run_ring  # noqa: PLC0415

    assert cluster.plane is not None
    out = cluster.settings.logs_dir / "sharded"
    out.mkdir(parents=True, exist_ok=True)
    s = cluster.settings
    ring = await run_ring(
        cluster.plane, namespace, replicas, n, out, s.timeout, s.restart_shard_settle, proxied=False
    )
    peaks = [int(mib * 2**20) for mib in ring["peak_rss_mib"]]
    cpus = [c for c in ring["cpu_seconds"] if c is not None]
    seconds = float(ring["seconds_to_all_reconciled"])
    result: Result = cluster.base("restart", SHARDED) | {
        "objects": n,
        "seconds": seconds,
        "per_second": n / seconds,
        "peak_rss_bytes": max(peaks),
        "cpu_seconds": sum(cpus) if cpus else None,
        "replicas": replicas,
        "settle": s.restart_shard_settle,
        "replica_peak_rss_bytes": peaks,
        "replica_cached_objects": ring["cached_objects"],
        "complete": True,
        "version": f"{cluster.base('restart', 'ours')['version']}, {replicas} sharded replicas",
    }
    _say(f"[restart/{SHARDED}] {_summary(result)}, per replica {[p >> 20 for p in peaks]} MiB")
    return result
