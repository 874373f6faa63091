"""Throughput of :class:`controller_runtime.workqueue.WorkQueue`.

Run ``python -m bench.queue_throughput --keys 100000``. One process, one core, one event loop.

Rows:

- ``add``: ``add()`` of N distinct keys (half at ``LOW_PRIORITY``), into an empty queue.
- ``add (dup)``: ``add()`` of the same N keys again while queued (deduplicated).
- ``add_after``: ``add_after()`` of N distinct keys with distinct delays (one loop timer).
- ``get+done``: ``await get()`` then ``done()`` until the N queued keys are drained.
- ``add+get+done``: a full cycle per key on a queue holding N other keys.
- ``reconcile xW``: W worker tasks ``get`` → no-op reconcile → ``done`` over N queued keys;
  ``yield`` variants await ``asyncio.sleep(0)`` once per reconcile, as any reconcile doing I/O
  does, so workers interleave.
- ``handler`` and ``handler get+done``: a controller's own queue (``Request`` items), fed by
  :class:`~controller_runtime.handlers.EnqueueRequestForObject`'s handler with the deltas of
  an initial list (the path of a restart), then drained with ``get`` and ``done``.

Each row is run with metrics on (the ``workqueue_*`` series) and off; ops/s count keys.
Also reported: Python heap per queued key (tracemalloc), for N queued keys.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable

from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.handlers import EnqueueRequestForObject
from controller_runtime.reconcile import REQUEST_KEYS, Request
from controller_runtime.workqueue import LOW_PRIORITY, WorkQueue
from informers.store import ADDED, StoreDelta

_names = itertools.count()
_now = time.perf_counter  # --cpu: time.process_time


def _queue(metrics: bool) -> WorkQueue[str]:
    return WorkQueue(f"bench-{next(_names)}", metrics=metrics)


def _keys(n: int) -> list[str]:
    # Request-like keys: "namespace/name".
    return [f"ns-{i % 50:02d}/obj-{i:07d}" for i in range(n)]


def _fill(q: WorkQueue[str], keys: list[str]) -> None:
    for i, key in enumerate(keys):
        q.add(key, priority=LOW_PRIORITY if i & 1 else 0)


async def bench_add(keys: list[str], metrics: bool) -> float:
    q = _queue(metrics)
    t = _now()
    _fill(q, keys)
    return _now() - t


async def bench_add_dup(keys: list[str], metrics: bool) -> float:
    q = _queue(metrics)
    _fill(q, keys)
    t = _now()
    _fill(q, keys)
    return _now() - t


async def bench_add_after(keys: list[str], metrics: bool) -> float:
    q = _queue(metrics)
    t = _now()
    for i, key in enumerate(keys):
        q.add_after(key, 1000.0 + i * 1e-3)
    elapsed = _now() - t
    q.shutdown()
    return elapsed


async def bench_get_done(keys: list[str], metrics: bool) -> float:
    q = _queue(metrics)
    _fill(q, keys)
    t = _now()
    for _ in range(len(keys)):
        q.done(await q.get())
    return _now() - t


async def bench_cycle(keys: list[str], metrics: bool) -> float:
    q = _queue(metrics)
    _fill(q, keys)  # N keys already queued: heaps at full depth
    fresh = [f"fresh/{k}" for k in keys]
    t = _now()
    for key in fresh:
        q.add(key)
        q.done(await q.get())
    return _now() - t


def bench_reconcile(
    workers: int, yield_once: bool
) -> Callable[[list[str], bool], Awaitable[float]]:
    async def reconcile_noop(key: str) -> None:
        return None

    async def reconcile_yield(key: str) -> None:
        await asyncio.sleep(0)

    reconcile = reconcile_yield if yield_once else reconcile_noop

    async def run(keys: list[str], metrics: bool) -> float:
        q = _queue(metrics)
        _fill(q, keys)
        remaining = len(keys)
        finished = asyncio.Event()

        async def worker() -> None:
            nonlocal remaining
            while True:
                key = await q.get()
                await reconcile(key)
                q.done(key)
                remaining -= 1
                if not remaining:
                    finished.set()

        t = _now()
        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        await finished.wait()
        elapsed = _now() - t
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return elapsed

    return run


def _controller_queue(metrics: bool) -> tuple[WorkQueue[Request], Callable[..., None]]:
    async def reconcile(request: Request) -> None:
        return None

    options = ControllerOptions(skip_name_validation=True)
    queue = Controller(f"bench-{next(_names)}", reconcile, options=options).queue
    if not metrics:
        queue = WorkQueue(queue.name, metrics=False, keys=REQUEST_KEYS)
    return queue, EnqueueRequestForObject().bind(queue)


def _deltas(keys: list[str]) -> list[StoreDelta]:
    return [StoreDelta(ADDED, None, raw=b"{}", key=key) for key in keys]


async def bench_handler(keys: list[str], metrics: bool) -> float:
    deltas = _deltas(keys)
    _, handle = _controller_queue(metrics)
    t = _now()
    for delta in deltas:
        handle(delta, True)
    return _now() - t


async def bench_handler_get_done(keys: list[str], metrics: bool) -> float:
    deltas = _deltas(keys)
    q, handle = _controller_queue(metrics)
    for delta in deltas:
        handle(delta, True)
    t = _now()
    for _ in range(len(keys)):
        q.done(await q.get())
    return _now() - t


def heap_per_key(keys: list[str]) -> tuple[float, float]:
    """Python heap bytes per key held by a queue: ready keys, and delayed keys."""
    results = []
    for delayed in (False, True):
        gc.collect()
        tracemalloc.start()
        q: WorkQueue[str] = WorkQueue(f"bench-{next(_names)}", metrics=False)
        before = tracemalloc.get_traced_memory()[0]
        for key in keys:
            if delayed:
                q.add_after(key, 1000.0)
            else:
                q.add(key)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        results.append((after - before) / len(keys))
        q.shutdown()
    return results[0], results[1]


ROWS: list[tuple[str, Callable[[list[str], bool], Awaitable[float]]]] = [
    ("add", bench_add),
    ("add (dup)", bench_add_dup),
    ("add_after", bench_add_after),
    ("get+done", bench_get_done),
    ("add+get+done", bench_cycle),
    ("reconcile x1", bench_reconcile(1, False)),
    ("reconcile x10 yield", bench_reconcile(10, True)),
    ("reconcile x100 yield", bench_reconcile(100, True)),
    ("handler", bench_handler),
    ("handler get+done", bench_handler_get_done),
]


async def main_async(n: int, repeat: int) -> None:
    keys = _keys(n)
    print(
        f"WorkQueue throughput, {n} keys, best of {repeat}; Python {sys.version.split()[0]}, "
        f"loop {type(asyncio.get_running_loop()).__module__}, timed by {_now.__name__}"
    )
    print(f"{'operation':<22}{'metrics on':>14}{'metrics off':>14}   (keys/s)")
    for label, fn in ROWS:
        cols = []
        for metrics in (True, False):
            best = float("inf")
            for _ in range(repeat):
                gc.collect()
                best = min(best, await fn(keys, metrics))
            cols.append(n / best)
        print(f"{label:<22}{cols[0]:>14,.0f}{cols[1]:>14,.0f}")
    ready, delayed = heap_per_key(keys)
    print(
        f"heap per queued key: {ready:.0f} B ready, {delayed:.0f} B delayed "
        "(tracemalloc, keys themselves excluded)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="time with this process's CPU time rather than the wall clock (steadier when "
        "the machine is shared: waiting for a core is not counted)",
    )
    args = parser.parse_args()
    if args.cpu:
        global _now  # noqa: PLW0603 - the one switch of the whole run
        _now = time.process_time
    if args.uvloop:
        import uvloop  # noqa: PLC0415 - optional: only when asked for

        uvloop.run(main_async(args.keys, args.repeat))
    else:
        asyncio.run(main_async(args.keys, args.repeat))


if __name__ == "__main__":
    main()
