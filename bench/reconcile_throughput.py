"""In-process no-op reconciles per second through the real :class:`Controller`.

Run ``python -m bench.reconcile_throughput --keys 100000`` (``--uvloop`` for uvloop). One
process, one core, one event loop, no network. Every row but the first three goes through the
whole controller: its work queue (dedup, priorities, ``workqueue_*`` metrics), its workers, the
reconcile context variable, result handling and the ``controller_runtime_*`` metrics.

Rows (keys/s; every key is distinct, so nothing is coalesced):

- ``queue add``, ``queue get+done``, ``queue add+get+done``: the bare ``WorkQueue`` under
  the controller (N adds; draining N queued keys; a full cycle per key on a queue holding N
  others).
- ``enqueue, xW``: ``Controller.enqueue`` of N requests, then W workers reconcile them all;
  timed from the first enqueue to the last reconcile. ``yield`` variants await
  ``asyncio.sleep(0)`` once per reconcile, as any reconcile doing I/O does.
- ``handler ...``: N :class:`~informers.store.StoreDelta` objects fanned out through a bound
  handler, as an informer's dispatch calls it (batches of 500, the loop runs between
  batches), reconciled by W workers: ``for-object`` (``ADDED``), ``for-object +
  GenerationChanged`` (``MODIFIED`` deltas with a generation bump, so the predicate decodes the
  old state), ``for-owner`` (``ADDED`` owned objects, each with a distinct controller owner).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.handlers import EnqueueRequestForObject, EnqueueRequestForOwner
from controller_runtime.predicates import GenerationChanged
from controller_runtime.reconcile import Request
from controller_runtime.workqueue import WorkQueue
from informers.store import ADDED, MODIFIED, StoreDelta

_names = itertools.count()
_BATCH = 500

Row = Callable[[int], Awaitable[float]]


def _requests(n: int) -> list[Request]:
    return [Request(f"ns-{i % 50:02d}", f"obj-{i:07d}") for i in range(n)]


def _object(i: int, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": {
            "name": f"obj-{i:07d}",
            "namespace": f"ns-{i % 50:02d}",
            "uid": f"uid-{i}",
            "resourceVersion": str(1000 + i),
            "generation": generation,
        },
        "spec": {"priority": 1},
    }


def _owned(i: int) -> dict[str, Any]:
    obj = _object(i)
    obj["metadata"]["name"] = f"cm-{i:07d}"
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "tasks.crpy.io/v1",
            "kind": "Task",
            "name": f"obj-{i:07d}",
            "uid": f"uid-{i}",
            "controller": True,
        }
    ]
    return obj


class _Run:
    """A controller whose no-op reconciler signals when ``n`` reconciles have run."""

    def __init__(self, n: int, workers: int, yield_once: bool) -> None:
        self.n = n
        self.count = 0
        self.finished = asyncio.Event()

        async def noop(request: Request) -> None:
            self.count += 1
            if self.count == n:
                self.finished.set()

        async def yielding(request: Request) -> None:
            await asyncio.sleep(0)
            self.count += 1
            if self.count == n:
                self.finished.set()

        self.controller = Controller(
            f"bench-{next(_names)}",
            yielding if yield_once else noop,
            options=ControllerOptions(max_concurrent_reconciles=workers, skip_name_validation=True),
        )

    async def finish(self) -> None:
        await self.finished.wait()
        await self.controller.stop()


def bench_queue_add(n: int) -> Row:
    async def run(_: int) -> float:
        q: WorkQueue[Request] = WorkQueue(f"bench-{next(_names)}")
        keys = _requests(n)
        t = time.perf_counter()
        for key in keys:
            q.add(key)
        elapsed = time.perf_counter() - t
        q.shutdown()
        return elapsed

    return run


def bench_queue_get_done(n: int) -> Row:
    async def run(_: int) -> float:
        q: WorkQueue[Request] = WorkQueue(f"bench-{next(_names)}")
        for key in _requests(n):
            q.add(key)
        t = time.perf_counter()
        for _ in range(n):
            q.done(await q.get())
        return time.perf_counter() - t

    return run


def bench_queue_cycle(n: int) -> Row:
    async def run(_: int) -> float:
        q: WorkQueue[Request] = WorkQueue(f"bench-{next(_names)}")
        for key in _requests(n):
            q.add(key)
        fresh = [Request("fresh", r.name) for r in _requests(n)]
        t = time.perf_counter()
        for key in fresh:
            q.add(key)
            q.done(await q.get())
        elapsed = time.perf_counter() - t
        q.shutdown()
        return elapsed

    return run


def bench_enqueue(workers: int, yield_once: bool) -> Row:
    async def run(n: int) -> float:
        requests = _requests(n)
        r = _Run(n, workers, yield_once)
        await r.controller.start()
        t = time.perf_counter()
        for request in requests:
            r.controller.enqueue(request)
        await r.finished.wait()
        elapsed = time.perf_counter() - t
        await r.controller.stop()
        return elapsed

    return run


def bench_handler(kind: str, workers: int) -> Row:
    async def run(n: int) -> float:
        if kind == "owner":
            deltas = [StoreDelta(ADDED, _owned(i)) for i in range(n)]
        elif kind == "generation":
            deltas = [
                StoreDelta(MODIFIED, _object(i, 2), orjson.dumps(_object(i, 1))) for i in range(n)
            ]
        else:
            deltas = [StoreDelta(ADDED, _object(i)) for i in range(n)]
        r = _Run(n, workers, yield_once=workers > 1)
        if kind == "owner":
            handle = EnqueueRequestForOwner("tasks.crpy.io/v1", "Task").bind(r.controller.queue)
        elif kind == "generation":
            handle = EnqueueRequestForObject().bind(r.controller.queue, [GenerationChanged()])
        else:
            handle = EnqueueRequestForObject().bind(r.controller.queue)
        await r.controller.start()
        t = time.perf_counter()
        for start in range(0, n, _BATCH):
            for delta in deltas[start : start + _BATCH]:
                handle(delta, False)
            await asyncio.sleep(0)  # the informer awaits between batches
        await r.finished.wait()
        elapsed = time.perf_counter() - t
        await r.controller.stop()
        return elapsed

    return run


def rows(n: int) -> list[tuple[str, Row]]:
    return [
        ("queue add", bench_queue_add(n)),
        ("queue get+done", bench_queue_get_done(n)),
        ("queue add+get+done", bench_queue_cycle(n)),
        ("enqueue, x1", bench_enqueue(1, False)),
        ("enqueue, x10 yield", bench_enqueue(10, True)),
        ("enqueue, x100 yield", bench_enqueue(100, True)),
        ("handler for-object, x1", bench_handler("object", 1)),
        ("handler for-object + GenerationChanged, x1", bench_handler("generation", 1)),
        ("handler for-owner, x1", bench_handler("owner", 1)),
        ("handler for-object, x10 yield", bench_handler("object", 10)),
    ]


async def main_async(n: int, repeat: int) -> None:
    print(
        f"Controller throughput, {n} distinct keys, best of {repeat}; Python "
        f"{sys.version.split()[0]}, loop {type(asyncio.get_running_loop()).__module__}"
    )
    print(f"{'row':<46}{'keys/s':>12}{'us/key':>10}")
    for label, fn in rows(n):
        best = float("inf")
        for _ in range(repeat):
            gc.collect()
            best = min(best, await fn(n))
        print(f"{label:<46}{n / best:>12,.0f}{best / n * 1e6:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop  # noqa: PLC0415 - optional: only when asked for

        uvloop.run(main_async(args.keys, args.repeat))
    else:
        asyncio.run(main_async(args.keys, args.repeat))


if __name__ == "__main__":
    main()
