"""Memory per pending request of a controller's work queue, on the path a restart takes.

Run ``python -m bench.queue_memory --keys 100000``. Each case runs in a fresh interpreter, twice:
once measuring the process's RSS growth (``/proc/self/statm``, after ``gc.collect()``), once
under ``tracemalloc`` to say where the bytes go (by allocation site). The store's key strings
(``namespace/name``, one namespace, names like the restart benchmark's Tasks) are built
before the measurement starts: the store holds them whatever the queue does.

Cases:

- ``initial``: every key handed to :class:`~controller_runtime.handlers.EnqueueRequestForObject`'s
  handler as a delta of an initial list, so queued at ``LOW_PRIORITY`` (what a restart does),
  on the queue of a :class:`~controller_runtime.controller.Controller` (never started).
- ``fresh``: the same at priority 0 (live changes).
- ``delayed``: each request enqueued with a distinct delay of about ten minutes (what a
  periodic ``requeue_after`` leaves queued).
- ``processing``: ``initial``, then a tenth of the keys handed out and not yet done.

Printed per case: bytes per queued request (RSS, and tracemalloc's total), then the
allocation sites that hold them, in bytes per request. ``--json PATH`` also writes the figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc
from typing import Any

from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.handlers import EnqueueRequestForObject
from controller_runtime.reconcile import Request
from controller_runtime.workqueue import WorkQueue
from informers.store import ADDED, StoreDelta

CASES = ("initial", "fresh", "delayed", "processing")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * _PAGE


def _keys(n: int) -> list[str]:
    # One namespace and Task names, as the restart benchmark creates them.
    return [f"bench-restart-1/task-{i:07d}" for i in range(n)]


async def _noop(request: Request) -> None:
    return None


def _fill(case: str, keys: list[str]) -> WorkQueue[Request]:
    # A controller's own queue (never started): its options, metrics and rate limiter.
    controller = Controller(
        "bench-queue-memory", _noop, options=ControllerOptions(skip_name_validation=True)
    )
    queue = controller.queue
    if case == "delayed":
        for i, key in enumerate(keys):
            namespace, _, name = key.rpartition("/")
            controller.enqueue(Request(namespace, name), after=600.0 + i * 1e-3)
        return queue
    handle = EnqueueRequestForObject().bind(queue)
    initial = case != "fresh"
    for key in keys:
        handle(StoreDelta(ADDED, None, raw=b"{}", key=key), initial)
    if case == "processing":
        for _ in range(len(keys) // 10):
            queue.get_nowait()
    return queue


def measure(case: str, n: int, trace: bool) -> dict[str, Any]:
    """One case in this process: RSS growth, or (``trace``) tracemalloc's view."""
    keys = _keys(n)
    gc.collect()
    if trace:
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
    rss_before = _rss()
    queue = _fill(case, keys)
    gc.collect()
    rss_after = _rss()
    out: dict[str, Any] = {"case": case, "keys": n, "queued": len(queue._entries)}
    if not trace:
        out["rss_per_request"] = (rss_after - rss_before) / n
        return out
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "lineno")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sites = []
    for stat in stats:
        if stat.size_diff < n:  # under 1 B per request
            continue
        frame = stat.traceback[0]
        where = frame.filename
        if where.startswith(here):
            where = os.path.relpath(where, here)
        sites.append((f"{where}:{frame.lineno}", stat.size_diff / n, stat.count_diff / n))
    out["traced_per_request"] = sum(s.size_diff for s in stats) / n
    out["sites"] = sites
    del queue
    return out


def _child(case: str, n: int, trace: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.queue_memory", "--child", case, "--keys", str(n)]
    if trace:
        cmd.append("--trace")
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.keys, args.trace)))
        return
    print(f"Work queue memory, {args.keys} keys; Python {sys.version.split()[0]}")
    results = []
    for case in args.cases.split(","):
        rss = _child(case, args.keys, trace=False)
        traced = _child(case, args.keys, trace=True)
        result = {**traced, **rss}
        results.append(result)
        print(
            f"\n{case}: {result['queued']} queued, {result['rss_per_request']:.0f} B of RSS "
            f"per request, {result['traced_per_request']:.0f} B traced"
        )
        for where, size, count in result["sites"]:
            print(f"  {size:7.1f} B  {count:5.2f} blocks  {where}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
