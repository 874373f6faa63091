"""The storage scenario: ``python -m bench --storage etcd,kine-sqlite,kine-postgres``.

One control plane per backend, one after another on the same machine, each measured the same
way from outside (docs/benchmarks.md, "Storage"):

``ladder``
    Tasks are created (64 concurrent POSTs) up to each size of ``--storage-sizes`` in turn
    (10k, 100k, 1M by default). At each size: the create rate of the step that reached it
    (objects/s), a full paginated LIST of the namespace (500 per page, ``resourceVersion``
    unset: what a controller's first list or a ``kubectl get`` does) with its total time and
    the p50/p99 of its pages, and then the memory (RSS) of the API server and of the storage
    (etcd, or kine, plus the PSS of every PostgreSQL process for kine-postgres) and the bytes
    the data takes on disk (etcd: its data directory, with the WAL's preallocated 64 MiB
    segments, and its bbolt database alone; kine-sqlite: the database file with its WAL;
    kine-postgres: ``pg_database_size``). A step that fails (etcd's quota: ``mvcc: database space
    exceeded``) ends that backend's ladder and is recorded with the error.
``watch``
    At the first size: a watch of the namespace from now, while a loader patches
    ``--storage-churn`` Tasks at ``--churn-rate`` per second; latency of one update = from
    sending the PATCH to the watch event carrying the resourceVersion its answer named;
    p50/p99.
``restart``
    :mod:`bench.restart` on this backend's control plane, on the ladder's namespace once it
    reached its last size: every Task is given the status the controller would derive (one
    status PATCH each, not measured), then ours and the Go peer (and the plain paginated
    LIST, ``limit``) start on them and must reconcile each once. With the watch cache on (the
    default), the informers' lists are served from the API server's cache, so this tells how
    much the backend still matters to a controller restart.

etcd runs with ``--quota-backend-bytes`` = ``--etcd-quota`` (2 GiB, etcd's default, unless
told), so the ladder shows where etcd stops and how far the SQL backends go past it. All
backends run without durability (etcd ``--unsafe-no-fsync``, SQLite ``synchronous=OFF``,
PostgreSQL ``fsync=off``), as in the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.kube import create_namespace, task_body, task_name, tasks_path
from bench.report import percentile, quantiles
from controller_runtime.envtest.storage import directory_bytes
from informers._framing import LineFramer
from kubeclient.errors import ApiError
from kubeclient.transport import Transport

StorageResult = dict[str, Any]
Say = Callable[[str], None]

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 5_000)
ETCD_DEFAULT_QUOTA = 2 * 2**30
PAGE = 500
KINE_POLL_BATCH_SIZE = 500
"""kine's default ``--poll-batch-size``."""


@dataclass(frozen=True)
class StorageSettings:
    backends: tuple[str, ...]
    sizes: tuple[int, ...]
    churn: int
    churn_rate: float
    etcd_quota: int
    restart_objects: int
    implementations: tuple[str, ...]
    timeout: float
    json_path: Path
    plots_dir: Path
    load: str = "api"
    """``api``: every rung's Tasks are created through the API server (their rate measured);
    ``direct``: written straight into the storage, reconciled (:func:`load_directly`)."""
    list_limit_seconds: float | None = None
    """Stop each rung's paginated LIST after this long (it may take many minutes at 1M)."""
    serve_timeout: float | None = None
    """With ``load="direct"``: how long the API server may take to serve what was written
    (its watch cache catching up through the storage's watch) before the rung is recorded
    as not served and measured as it is."""
    kine_poll_batch_size: int | None = None
    """kine's ``--poll-batch-size`` (None: kine's default, 500 rows per poll)."""


def _rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def _pss_tree(pid: int | None) -> int | None:
    """PSS of a process and its children (PostgreSQL's shared buffers counted once)."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        total = 0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += int(process.memory_full_info().pss)
        return total
    except psutil.Error:
        return None


def memory(plane: Any) -> dict[str, int | None]:
    """RSS of the API server and of the main storage process, and PSS of a PostgreSQL server
    the control plane started."""
    pids = plane.storage_pids()
    return {
        "apiserver_rss_bytes": _rss(plane.apiserver_pid()),
        "storage_rss_bytes": _rss(pids.get(plane.storage)),
        "postgres_pss_bytes": _pss_tree(pids.get("postgres")),
    }


async def create_range(
    transport: Transport, namespace: str, start: int, stop: int, *, concurrency: int = 64
) -> tuple[float, int, str | None]:
    """POST Tasks ``start`` .. ``stop - 1``; (seconds, created, first error or None). The
    first error other than "already exists" stops every worker."""
    path = tasks_path(namespace)
    numbers = iter(range(start, stop))
    created = 0
    error: str | None = None
    began = time.monotonic()

    async def worker() -> None:
        nonlocal created, error
        for i in numbers:
            if error is not None:
                return
            try:
                await transport.request("POST", path, body=task_body(i))
            except ApiError as err:
                if err.status == 409:
                    continue
                error = error or f"{err.status} {err}"
                return
            created += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - began, created, error


class ListError(Exception):
    """A page of the rung's LIST was refused (``seconds`` into it)."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


async def paginated_list(
    transport: Transport, namespace: str, *, limit_seconds: float | None = None
) -> tuple[float, list[float], int]:
    """A full LIST of the namespace, 500 per page: (seconds, page seconds, objects); stopped
    after the first page that ends past ``limit_seconds``, if given."""
    path = tasks_path(namespace)
    pages: list[float] = []
    objects = 0
    token = ""
    began = time.monotonic()
    while limit_seconds is None or time.monotonic() - began < limit_seconds:
        params = {"limit": str(PAGE), **({"continue": token} if token else {})}
        page_began = time.monotonic()
        try:
            answer = await transport.request("GET", path, params=params)
        except ApiError as err:  # 504 Too large resource version: a watch cache far behind
            raise ListError(f"{err.status} {err}"[:300], time.monotonic() - began) from err
        pages.append(time.monotonic() - page_began)
        body = orjson.loads(answer.body)
        objects += len(body["items"])
        token = body["metadata"].get("continue", "")
        if not token:
            break
    return time.monotonic() - began, pages, objects


async def write_directly(
    plane: Any,
    transport: Transport,
    namespace: str,
    span: tuple[int, int],
    *,
    say: Say = lambda _: None,
    serve_timeout: float | None = None,
) -> float:
    """Reconciled Tasks ``first`` .. ``n - 1`` (``span``) written straight into the plane's
    storage (:mod:`bench.etcdload`, :mod:`bench.kineload`); seconds until the API server
    serves them (``NotServedError`` after ``serve_timeout``)."""
    from bench import etcdload, kineload  # noqa: PLC0415

    first, n = span
    process = plane.storage_processes[plane.storage]
    if plane.storage == "etcd":
        return await etcdload.load_reconciled_tasks(
            process.url,
            transport,
            namespace,
            n,
            first=first,
            progress=say,
            serve_timeout=serve_timeout,
        )
    return await kineload.load_reconciled_tasks(
        process, transport, namespace, n, first=first, progress=say, serve_timeout=serve_timeout
    )


async def load_directly(
    plane: Any,
    transport: Transport,
    namespace: str,
    span: tuple[int, int],
    say: Say,
    *,
    serve_timeout: float | None = None,
) -> tuple[float, int, str | None]:
    """:func:`write_directly`, answered as :func:`create_range` does (seconds until served,
    written, error or None), then a wait for the control plane to settle."""
    from bench.etcdload import NotServedError  # noqa: PLC0415

    first, n = span
    began = time.monotonic()
    try:
        seconds = await write_directly(
            plane, transport, namespace, span, say=say, serve_timeout=serve_timeout
        )
    except NotServedError as err:  # in the storage, not yet in the watch cache
        return time.monotonic() - began, n - first, str(err)
    except RuntimeError as err:  # etcd's quota, for one
        return 0.0, 0, str(err)
    # Served is not digested: the API server goes on working off a bulk load for minutes,
    # which the rung's LIST would pay for.
    from bench.restart import wait_for_quiet_server  # noqa: PLC0415

    quiet = await wait_for_quiet_server(plane.pids())
    say(f"  the control plane settled {quiet:.0f}s after the load")
    return seconds, n - first, None


@dataclass
class EventTimes:
    """A watch of one path from ``start_rv``: when each resourceVersion was first seen.

    A stream the server ends is opened again from the last event seen (``reopened`` counts
    them); an ERROR event is kept in ``errors``, and ends the watch if it is a 410."""

    transport: Transport
    path: str
    start_rv: str
    on_chunk: Callable[[], None]
    seen: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    reopened: int = 0

    async def run(self) -> None:
        last = self.start_rv
        while True:
            params = {"watch": "1", "resourceVersion": last, "allowWatchBookmarks": "false"}
            async with self.transport.stream(self.path, params) as response:
                framer = LineFramer()
                async for chunk in response.content.iter_any():
                    now = time.monotonic()
                    for line in framer.feed(chunk):
                        event = orjson.loads(line)
                        if event.get("type") == "ERROR":
                            self.errors.append(str(event.get("object"))[:300])
                            if (event.get("object") or {}).get("code") == 410:
                                return
                            continue
                        rv = event["object"].get("metadata", {}).get("resourceVersion", "")
                        # An event may arrive before the PATCH's own answer: keep every one.
                        self.seen.setdefault(rv, now)
                        last = rv or last
                    self.on_chunk()
            self.reopened += 1


async def watch_latency(
    transport: Transport, namespace: str, n: int, rate: float, *, timeout: float
) -> dict[str, Any]:
    """Patch ``n`` existing Tasks at ``rate``/s while watching; the send-to-event lags."""
    path = tasks_path(namespace)
    first = await transport.request("GET", path, params={"limit": "1"})
    start_rv = orjson.loads(first.body)["metadata"]["resourceVersion"]
    sent: dict[str, float] = {}
    wanted: set[str] = set()
    done = asyncio.Event()
    failures = 0

    def check() -> None:
        if len(wanted) + failures >= n and wanted <= seen.keys():
            done.set()

    events = EventTimes(transport, path, start_rv, check)
    seen = events.seen
    watcher = asyncio.create_task(events.run())
    began = time.monotonic()
    try:
        for i in range(n):
            due = began + i / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            name = task_name(i)
            t0 = time.monotonic()
            try:
                answer = await transport.request(
                    "PATCH",
                    f"{path}/{name}",
                    body={"spec": {"details": f"churn {uuid.uuid4().hex}"}},
                    content_type="application/merge-patch+json",
                )
            except ApiError:
                failures += 1
                continue
            rv = orjson.loads(answer.body)["metadata"]["resourceVersion"]
            sent[rv] = t0
            wanted.add(rv)
        check()
        # Every event is due a moment after its PATCH; past a minute more it is not coming.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), min(timeout, 60.0))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    lags = [seen[rv] - sent[rv] for rv in sent if rv in seen]
    result: dict[str, Any] = {
        "updates": n,
        "rate": rate,
        "delivered": len(lags),
        "failures": failures,
        "complete": len(lags) == n,
        "watch_reopened": events.reopened,
        "watch_errors": events.errors,
    }
    if lags:
        result |= {
            "p50_seconds": percentile(lags, 50),
            "p99_seconds": percentile(lags, 99),
            "max_seconds": max(lags),
            "lag_quantiles": quantiles(lags),
        }
    return result


AtRung = Callable[[str, int, bool], Awaitable[list[StorageResult]]]
"""Called after each rung of the ladder with (namespace, Tasks it holds, whether it is the
last rung: the largest size, or where the backend stopped): rows to add."""


async def ladder(
    plane: Any,
    transport: Transport,
    settings: StorageSettings,
    say: Say,
    at_rung: AtRung | None = None,
) -> tuple[list[StorageResult], str, int]:
    """The size ladder on a fresh namespace: (rows, namespace, Tasks it holds at the end).

    ``at_rung`` runs after each rung's measurements, before the next rung's creates (the
    restart scenario uses it to start on exactly the rung of its size)."""
    backend = plane.storage
    namespace = f"bench-storage-{uuid.uuid4().hex[:6]}"
    await create_namespace(transport, namespace)
    results: list[StorageResult] = []
    have = 0
    for size in settings.sizes:
        if settings.load == "direct":
            say(f"[storage/{backend}] writing Tasks {have}..{size - 1} into the storage")
            seconds, created, error = await load_directly(
                plane, transport, namespace, (have, size), say, serve_timeout=settings.serve_timeout
            )
        else:
            say(f"[storage/{backend}] creating Tasks {have}..{size - 1}")
            seconds, created, error = await create_range(transport, namespace, have, size)
        have += created
        row: StorageResult = {
            "scenario": "storage-ladder",
            "backend": backend,
            "objects": have,
            "target": size,
            "load": settings.load,
            "create_seconds": seconds,
            "create_per_second": created / seconds if seconds > 0 else 0.0,
            "complete": error is None,
        }
        if backend.startswith("kine"):
            row["kine_poll_batch_size"] = settings.kine_poll_batch_size or KINE_POLL_BATCH_SIZE
        if error is not None:
            row["error"] = error[:300]
            say(f"[storage/{backend}] stopped at {have} objects: {row['error']}")
        try:
            list_seconds, pages, listed = await paginated_list(
                transport, namespace, limit_seconds=settings.list_limit_seconds
            )
        except ListError as err:
            list_seconds, pages, listed = err.seconds, [], 0
            row["list_error"] = str(err)
            say(f"[storage/{backend}] the LIST was refused: {err}")
        row |= {
            "list_seconds": list_seconds,
            "list_objects": listed,
            "list_complete": listed >= have,
            "page_p50_seconds": percentile(pages, 50) if pages else None,
            "page_p99_seconds": percentile(pages, 99) if pages else None,
            "pages": len(pages),
        }
        row |= memory(plane)
        process = plane.storage_processes[backend]
        row["disk_bytes"] = await asyncio.to_thread(process.disk_bytes)
        if backend == "etcd":
            # etcd's data directory holds its WAL, preallocated in 64 MiB segments; the
            # database itself is the bbolt file under member/snap.
            row["db_bytes"] = directory_bytes(process.data_dir / "member" / "snap")
        say(f"[storage/{backend}] {summary(row)}")
        results.append(row)
        if size == settings.sizes[0] and settings.churn:
            say(f"[storage/{backend}] watch latency: {settings.churn} updates")
            lag = await watch_latency(
                transport,
                namespace,
                min(settings.churn, have),
                settings.churn_rate,
                timeout=settings.timeout,
            )
            results.append({"scenario": "storage-watch", "backend": backend, "objects": have} | lag)
            say(
                f"[storage/{backend}] watch lag p50 {lag.get('p50_seconds', 0) * 1000:.0f} ms"
                f" p99 {lag.get('p99_seconds', 0) * 1000:.0f} ms"
            )
        if at_rung is not None:
            last = error is not None or size == settings.sizes[-1]
            results += await at_rung(namespace, have, last)
        if error is not None:
            break
    return results, namespace, have


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def summary(row: StorageResult) -> str:
    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / 2**20:.0f}"

    return (
        f"{row['objects']} objects: create {row['create_per_second']:.0f}/s, LIST "
        f"{row['list_seconds']:.2f}s (page p99 {_ms(row['page_p99_seconds'])} ms), "
        f"API server {mib(row['apiserver_rss_bytes'])} MiB, storage "
        f"{mib(row['storage_rss_bytes'])} MiB"
        + (f" + postgres {mib(row['postgres_pss_bytes'])} MiB" if row["postgres_pss_bytes"] else "")
        + f", disk {mib(row['disk_bytes'])} MiB"
    )


def plane_for(backend: str, settings: StorageSettings) -> Any:
    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415

    kine = (
        [f"--poll-batch-size={settings.kine_poll_batch_size}"]
        if settings.kine_poll_batch_size
        else []
    )
    return ControlPlane(
        storage=backend,
        storage_args={
            "etcd": [f"--quota-backend-bytes={settings.etcd_quota}"],
            "kine-sqlite": kine,
            "kine-postgres": kine,
        },
        start_timeout=180.0,
    )


async def reconcile_existing(transport: Transport, namespace: str, say: Say) -> float:
    """Give every Task of ``namespace`` the status the Task controller would derive (a status
    merge patch each, 64 in flight); seconds taken.

    The whole list is read first: patching between pages made a slow backend's LIST outlive
    the API server's compaction (every 5 min), and its continue token then expired (410).
    """
    from controllers.task import derive_status, utcnow  # noqa: PLC0415

    path = tasks_path(namespace)
    began = time.monotonic()
    tasks: list[dict[str, Any]] = []
    token = ""
    while True:
        params = {"limit": str(PAGE), **({"continue": token} if token else {})}
        body = orjson.loads((await transport.request("GET", path, params=params)).body)
        tasks += body["items"]
        token = body["metadata"].get("continue", "")
        if not token:
            break
    items = iter(tasks)

    async def worker() -> None:
        for task in items:
            status, _ = derive_status(task, utcnow())
            if status != (task.get("status") or {}):
                await transport.request(
                    "PATCH",
                    f"{path}/{task['metadata']['name']}/status",
                    body={"status": status},
                    content_type="application/merge-patch+json",
                )

    await asyncio.gather(*(worker() for _ in range(64)))
    say(f"  {namespace}: {len(tasks)} Tasks reconciled in {time.monotonic() - began:.0f}s")
    return time.monotonic() - began


async def restart_on(
    cluster: Any,
    transport: Transport,
    namespace: str,
    n: int,
    *,
    settings: StorageSettings,
    say: Say,
) -> list[StorageResult]:
    """The restart scenario of :mod:`bench.restart` on the ladder's ``n`` Tasks."""
    from bench.restart import run_list_limit, run_restart  # noqa: PLC0415

    empty = f"{namespace}-empty"
    await create_namespace(transport, empty)
    took = await reconcile_existing(transport, namespace, say)
    rows: list[StorageResult] = []
    for implementation in [*settings.implementations, "limit"]:
        if implementation == "limit":
            result = await run_list_limit(cluster, namespace, n, 0)
        else:
            result = await run_restart(
                cluster, implementation, namespace, empty=empty, n=n, repeat=0
            )
        result["setup_seconds"] = took
        rows.append({**result, "scenario": "storage-restart", "backend": cluster.backend})
    return rows


async def measure_backend(
    plane: Any, settings: StorageSettings, make_cluster: Callable[[Any], Any], say: Say
) -> list[StorageResult]:
    """The ladder and watch latency on one running plane, with the restart scenario on the
    first rung that holds ``restart_objects`` Tasks (or the last rung reached)."""
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415

    config = await load_kubeconfig(plane.kubeconfig)
    async with Transport(config, max_connections=128) as transport:
        restarted = False

        async def restart_at(namespace: str, have: int, last: bool) -> list[StorageResult]:
            nonlocal restarted
            if restarted or not (settings.restart_objects and settings.implementations):
                return []
            if not restarts_at(have, last=last, wanted=settings.restart_objects):
                return []
            restarted = True
            cluster = make_cluster(plane)
            cluster.backend = plane.storage
            return await restart_on(cluster, transport, namespace, have, settings=settings, say=say)

        rows, _, _ = await ladder(plane, transport, settings, say, at_rung=restart_at)
    return rows


def restarts_at(have: int, *, last: bool, wanted: int) -> bool:
    """Whether the restart scenario runs on a rung that ended with ``have`` Tasks: the first
    rung with at least ``wanted``, or the last one if the ladder never got that far."""
    return have >= wanted or last


def run_storage(
    settings: StorageSettings,
    make_cluster: Callable[[Any], Any],
    say: Say,
    save: Callable[[list[StorageResult]], None] = lambda _: None,
) -> list[StorageResult]:
    """Every backend in turn, each on a control plane of its own, stopped before the next;
    ``save`` gets the results so far after each backend (a long run interrupted keeps them)."""
    results: list[StorageResult] = []
    load = os.getloadavg()
    say(f"storage: {', '.join(settings.backends)}; sizes {settings.sizes}; load {load[0]:.1f}")
    for backend in settings.backends:
        say(f"[storage/{backend}] starting the control plane")
        began = time.monotonic()
        with plane_for(backend, settings) as plane:
            rows = asyncio.run(measure_backend(plane, settings, make_cluster, say))
        for row in rows:
            row["load_average"] = list(os.getloadavg())
        results += rows
        save(results)
        say(f"[storage/{backend}] done in {time.monotonic() - began:.0f}s")
    return results


def format_table(results: Sequence[StorageResult]) -> str:
    def mib(value: Any) -> str:
        return "-" if value is None else f"{value / 2**20:,.0f}"

    lines = [
        "| backend | objects | create/s | LIST s | page p50 ms | page p99 ms | API server MiB "
        "| storage MiB | disk MiB | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if r["scenario"] != "storage-ladder":
            continue
        storage = mib(r["storage_rss_bytes"])
        if r.get("postgres_pss_bytes"):
            storage += f" + {mib(r['postgres_pss_bytes'])} (PostgreSQL PSS)"
        rate = f"{r['create_per_second']:,.0f}"
        if r.get("load") == "direct":
            rate = f"direct ({rate})"
        listed = f"{r['list_seconds']:.2f}"
        if r.get("list_error"):
            listed = f"refused: {r['list_error'][:80]}"
        elif not r.get("list_complete", True):
            listed += f" ({r['list_objects']:,} listed)"
        lines.append(
            f"| {r['backend']} | {r['objects']:,} | {rate} | "
            f"{listed} | {_ms(r['page_p50_seconds'])} | "
            f"{_ms(r['page_p99_seconds'])} | {mib(r['apiserver_rss_bytes'])} | {storage} | "
            f"{mib(r['disk_bytes'])}"
            + (f" ({mib(r['db_bytes'])} bbolt)" if r.get("db_bytes") is not None else "")
            + f" | {r.get('error', '')} |"
        )
    watch = [r for r in results if r["scenario"] == "storage-watch"]
    if watch:
        lines += [
            "",
            "| backend | updates | rate/s | delivered | lag p50 ms | lag p99 ms |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in watch:
            lines.append(
                f"| {r['backend']} | {r['updates']} | {r['rate']:.0f} | {r['delivered']} | "
                f"{r.get('p50_seconds', 0) * 1000:.0f} | {r.get('p99_seconds', 0) * 1000:.0f} |"
            )
    restart = [r for r in results if r["scenario"] == "storage-restart"]
    if restart:
        lines += [
            "",
            "| backend | implementation | objects | seconds | peak RSS MiB | CPU s "
            "| server CPU s |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in restart:
            server = r.get("server_cpu_seconds")
            lines.append(
                f"| {r['backend']} | {r['implementation']} | {r['objects']:,} | "
                f"{r['seconds']:.1f} | {mib(r.get('peak_rss_bytes'))} | "
                f"{r.get('cpu_seconds') or 0:.1f} | {'-' if server is None else f'{server:.1f}'} |"
            )
    return "\n".join(lines)
