"""Memory per cached object and decode/apply throughput of the informer store.

Run ``python -m bench.store_memory --objects 100000``. Each variant runs in a fresh interpreter
(so allocator state from one cannot flatter another) and reports the RSS growth while its cache
is filled, divided by the number of objects. Objects are Task-like custom resources of about
960 B of JSON with ``managedFields``; like the informer's default transform, the pipeline strips
``managedFields`` before caching.

Variants:

- ``store``: :class:`informers.store.Store` (exact-size JSON bytes + index fields).
- ``store+labels``: the same with ``label_index=True``.
- ``store-nocopy``: the store keeping ``orjson.dumps``'s result as is (what the exact-size copy
  in ``informers.store._encode`` avoids).
- ``dict``: a plain ``dict`` of decoded (stripped) objects, for comparison.

Throughput (one process, one core): decoding watch lines alone; decode -> strip ->
``Store.apply``; and, for comparison, decode -> strip -> plain dict.

A sync's peak (``--objects N``, each in a fresh process too): the N objects as an initial
list arrives, in pages of 500 decoded one at a time, prepared as the reflector prepares
them (buffered for the atomic swap), swapped in, the deltas handed to
``EnqueueRequestForObject``'s handler on a controller's queue (every key queued at low
priority, as at a restart), then the budget enforced. ``list`` is unbounded, ``list+budget``
has a budget of a tenth of the bodies' bytes. Reported: the peak (``VmHWM``) and the RSS at
the end, above the process before the list, per object.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson

try:
    import psutil
except ImportError:  # a dev dependency; /proc/self/statm works on Linux without it
    psutil = None

from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.handlers import EnqueueRequestForObject
from controller_runtime.reconcile import Request
from controller_runtime.workqueue import WorkQueue
from informers import store as store_module
from informers.budget import BodyBudget
from informers.store import Store

VARIANTS = ("store", "store+labels", "store-nocopy", "dict")
NAMESPACES = 50


def task(i: int, rng: random.Random) -> dict[str, Any]:
    """A Task-like object, ~960 B of JSON with managedFields (~640 B without)."""
    ns = f"team-{i % NAMESPACES:02d}"
    ts = f"2026-01-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}Z"
    return {
        "apiVersion": "example.com/v1",
        "kind": "Task",
        "metadata": {
            "name": f"task-{i:07d}",
            "namespace": ns,
            "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "resourceVersion": str(100000 + i),
            "generation": 1 + i % 3,
            "creationTimestamp": ts,
            "labels": {
                "app.kubernetes.io/name": "task",
                "example.com/queue": f"queue-{i % 8}",
                "example.com/owner": f"user-{i % 500:03d}",
            },
            "managedFields": [
                {
                    "manager": "task-cli",
                    "operation": "Update",
                    "apiVersion": "example.com/v1",
                    "time": ts,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {".": {}, "f:example.com/queue": {}}},
                        "f:spec": {
                            ".": {},
                            "f:deadline": {},
                            "f:details": {},
                            "f:priority": {},
                            "f:taskState": {},
                        },
                    },
                },
            ],
        },
        "spec": {
            "priority": rng.randrange(100),
            "details": "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=24)),
            "deadline": ts,
            "taskState": rng.choice(["Pending", "Running", "Done"]),
        },
        "status": {
            "phase": "Scheduled",
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastTransitionTime": ts,
                    "reason": "Scheduled",
                    "message": "task accepted",
                }
            ],
        },
    }


def watch_lines(n: int) -> Iterator[bytes]:
    """``n`` watch-event lines, generated lazily so the input does not sit in memory."""
    rng = random.Random(42)
    for i in range(n):
        yield orjson.dumps({"type": "ADDED", "object": task(i, rng)})


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].pop("managedFields", None)
    return obj


def rss_bytes() -> int:
    """Resident set size of this process (psutil if installed, else /proc/self/statm)."""
    if psutil is not None:
        return int(psutil.Process().memory_info().rss)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_memory(variant: str, n: int) -> dict[str, Any]:
    """Fill one cache of ``n`` objects; RSS growth per object (run in a fresh process)."""
    cache: Any
    if variant == "dict":
        cache = {}
        sink: Callable[[dict[str, Any]], Any] = lambda o: cache.__setitem__(  # noqa: E731
            f"{o['metadata']['namespace']}/{o['metadata']['name']}", o
        )
    else:
        if variant == "store-nocopy":
            store_module._encode = orjson.dumps  # type: ignore[assignment]
        cache = Store(label_index=variant == "store+labels")
        sink = lambda o: cache.apply("ADDED", o)  # noqa: E731
    json_full = json_stripped = 0
    # Warm up imports and allocator pools outside the measured window.
    for line in watch_lines(100):
        strip(orjson.loads(line)["object"])
    gc.collect()
    before = rss_bytes()
    for line in watch_lines(n):
        json_full += len(orjson.dumps(orjson.loads(line)["object"]))
        obj = strip(orjson.loads(line)["object"])
        json_stripped += len(orjson.dumps(obj))
        sink(obj)
    gc.collect()
    after = rss_bytes()
    assert len(cache) == n
    return {
        "variant": variant,
        "rss_per_object": (after - before) / n,
        "json_full": json_full / n,
        "json_stripped": json_stripped / n,
    }


SYNC_VARIANTS = ("list", "list+budget")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _controller_queue() -> WorkQueue[Request]:
    """The queue of a controller (never started), as a restart fills it."""

    async def reconcile(request: Request) -> None:
        return None

    options = ControllerOptions(skip_name_validation=True)
    return Controller("store-memory", reconcile, options=options).queue


def measure_sync_peak(variant: str, n: int) -> dict[str, Any]:
    """One initial list of ``n`` objects through the reflector's list path (module docs)."""
    budget_bytes = None
    if variant == "list+budget":
        stripped = sum(
            len(orjson.dumps(strip(orjson.loads(line)["object"]))) for line in watch_lines(n)
        )
        budget_bytes = stripped // 10
    gc.collect()
    before = _status_kib("VmRSS")
    store = Store(budget=BodyBudget(budget_bytes) if budget_bytes is not None else None)
    store.start_list()
    buffered = []
    lines = watch_lines(n)
    for _ in range(0, n, 500):  # one page decoded at a time, as the reflector reads them
        page = orjson.loads(b"[" + b",".join(itertools.islice(lines, 500)) + b"]")
        for event in page:
            buffered.append(store.prepare(strip(event["object"]), buffered=True).drop_object())
        del page
    deltas = store.replace_prepared(buffered, str(100000 + n))
    buffered.clear()
    queue = _controller_queue()
    handle = EnqueueRequestForObject().bind(queue)
    for delta in deltas:
        handle(delta, True)
    del deltas
    store.enforce_budget()
    gc.collect()
    assert len(store) == n and len(queue) == n
    return {
        "variant": variant,
        "budget_bytes": budget_bytes,
        "peak_per_object": (_status_kib("VmHWM") - before) * 1024 / n,
        "end_per_object": (_status_kib("VmRSS") - before) * 1024 / n,
    }


def measure_throughput(n: int) -> dict[str, float]:
    lines = list(watch_lines(n))
    t0 = time.perf_counter()
    for line in lines:
        orjson.loads(line)
    decode = n / (time.perf_counter() - t0)
    store = Store()
    t0 = time.perf_counter()
    for line in lines:
        event = orjson.loads(line)
        store.apply(event["type"], strip(event["object"]))
    pipeline = n / (time.perf_counter() - t0)
    assert len(store) == n
    del store
    gc.collect()
    cache: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for line in lines:
        obj = strip(orjson.loads(line)["object"])
        meta = obj["metadata"]
        cache[f"{meta['namespace']}/{meta['name']}"] = obj
    dict_cache = n / (time.perf_counter() - t0)
    assert len(cache) == n
    return {"decode": decode, "decode_strip_apply": pipeline, "decode_strip_dict": dict_cache}


def run_child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.store_memory", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=100_000, help="objects per variant")
    parser.add_argument(
        "--child", choices=[*VARIANTS, *SYNC_VARIANTS, "throughput"], help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    n = args.objects
    if args.child == "throughput":
        print(json.dumps(measure_throughput(n)))
        return
    if args.child in SYNC_VARIANTS:
        print(json.dumps(measure_sync_peak(args.child, n)))
        return
    if args.child:
        print(json.dumps(measure_memory(args.child, n)))
        return

    print(f"{n} Task-like objects; each variant in a fresh process (RSS delta / N)\n")
    print(f"{'variant':<14} {'RSS/object':>11} {'JSON/object':>12} {'JSON w/ mF':>11}")
    for variant in VARIANTS:
        r = run_child(["--objects", str(n), "--child", variant])
        print(
            f"{variant:<14} {r['rss_per_object']:>9.0f} B {r['json_stripped']:>10.0f} B "
            f"{r['json_full']:>9.0f} B"
        )
    t = run_child(["--objects", str(n), "--child", "throughput"])
    print("\nthroughput, one core:")
    print(f"  decode (orjson.loads of watch lines)      {t['decode']:>10,.0f} events/s")
    print(f"  decode -> strip managedFields -> apply    {t['decode_strip_apply']:>10,.0f} events/s")
    print(f"  decode -> strip -> plain dict cache       {t['decode_strip_dict']:>10,.0f} events/s")
    print("\nan initial list, swapped in and queued (RSS above the process before it / N):")
    for variant in SYNC_VARIANTS:
        r = run_child(["--objects", str(n), "--child", variant])
        budget = f"budget {r['budget_bytes'] / 2**20:.1f} MiB" if r["budget_bytes"] else ""
        peak, after = r["peak_per_object"], r["end_per_object"]
        print(f"  {variant:<12} peak {peak:>6.0f} B, after {after:>6.0f} B {budget}")


if __name__ == "__main__":
    main()
