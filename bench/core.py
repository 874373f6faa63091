"""The core data path, fed in-process from recorded watch bytes: no network, no API server.

    python -m bench.core --objects 100000 [--objects 1000000] [--json FILE]

``bench/data/task-watch-event.json`` is one watch event recorded from the real API server
(a Task with managedFields and a status condition, 1.4 kB). It is replayed N times with
distinct names, UIDs and resourceVersions, as the body of one watch, in 64 KiB chunks.

Stages, each in a fresh interpreter (so memory figures are the stage's own):

- ``decode``: ``orjson.loads`` of every line, nothing else: the limit for Python.
- ``informer``: the real :class:`~informers.reflector.Reflector` (framing, decoding, the state
  machine, the default transform, encoding into the store) and a no-op handler.
- ``controller``: the same, with a real :class:`~controller_runtime.controller.Controller`
  behind it: handler -> work queue -> workers -> a no-op reconcile per object.

Reported: events per second, CPU seconds of the timed part, and RSS growth per cached object
beside the JSON size. In the harness's results (``python -m bench --scenarios core``) the
``decode`` stage is the implementation ``limit`` (orjson alone, the limit for Python) and the
other two are ``ours``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench._core_controller import controller_sink
from informers.reflector import Reflector
from informers.reflector_machine import ReflectorOptions
from informers.store import Store
from kubeclient.discovery import ResourceInfo
from kubeclient.transport import Response

TEMPLATE = Path(__file__).with_name("data") / "task-watch-event.json"
CHUNK = 64 * 1024
TASK = ResourceInfo("tasks.crpy.io", "v1", "Task", "tasks", namespaced=True)


def recorded_body(n: int) -> bytes:
    """N ADDED events shaped exactly like the recorded one."""
    event = orjson.loads(TEMPLATE.read_bytes())
    obj = event["object"]
    lines = []
    for i in range(n):
        meta = obj["metadata"]
        meta["name"] = f"task-{i:07d}"
        meta["namespace"] = f"team-{i % 50:02d}"
        meta["uid"] = f"00000000-0000-4000-8000-{i:012d}"
        meta["resourceVersion"] = str(1000 + i)
        lines.append(orjson.dumps({"type": "ADDED", "object": obj}))
    return b"\n".join(lines) + b"\n"


class _Content:
    def __init__(self, body: bytes) -> None:
        self._view = memoryview(body)
        self._at = 0

    async def readany(self) -> bytes:
        chunk = self._view[self._at : self._at + CHUNK].tobytes()
        self._at += len(chunk)
        if self._at % (CHUNK * 64) == 0:
            await asyncio.sleep(0)  # let workers run, as a real socket read would
        return chunk


class _Answer:
    def __init__(self, body: bytes) -> None:
        self.status = 200
        self.content = _Content(body)


class RecordedTransport:
    """Serves an empty LIST, then the recorded body as the watch."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def request(self, method: str, path: str, **_: Any) -> Response:
        empty = {"kind": "TaskList", "metadata": {"resourceVersion": "999"}, "items": []}
        return Response(200, {}, orjson.dumps(empty))

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str] | None = None, **_: Any
    ) -> AsyncIterator[_Answer]:
        yield _Answer(self.body)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def run_stage(stage: str, n: int) -> dict[str, Any]:
    body = recorded_body(n)
    lines = body.splitlines()
    json_per_object = 0.0
    baseline = _rss()
    started = time.perf_counter()
    cpu_started = time.process_time()
    if stage == "decode":
        for line in lines:
            orjson.loads(line)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        grown = 0
    else:
        del lines
        store = Store()
        done = asyncio.Event()
        seen = 0
        finish: Any = None
        if stage == "controller":
            sink, finish = await controller_sink(n, done)
        else:

            async def sink(deltas: Any, initial: bool) -> None:
                nonlocal seen
                seen += len(deltas)
                if seen >= n:
                    done.set()

        reflector = Reflector(
            RecordedTransport(body),  # type: ignore[arg-type]
            TASK,
            store,
            options=ReflectorOptions(streaming_list=False),
            sink=sink,
        )
        baseline = _rss()
        started = time.perf_counter()
        cpu_started = time.process_time()
        task = asyncio.create_task(reflector.run())
        await done.wait()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if finish is not None:
            await finish()
        del body
        grown = _rss() - baseline
        keys = store.keys()
        json_per_object = sum(len(store.get_raw(k) or b"") for k in keys) / n
        assert len(store) == n, f"store holds {len(store)} of {n}"
    return {
        "scenario": "core",
        "stage": stage,
        "implementation": "limit" if stage == "decode" else "ours",
        "objects": n,
        "seconds": seconds,
        "per_second": n / seconds,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cpu_seconds": cpu,
        "rss_per_object": grown / n,
        "json_per_object": json_per_object,
    }


def _say(message: str) -> None:
    print(message, flush=True)


def run_core(
    sizes: Sequence[int],
    stages: Sequence[str] = ("decode", "informer", "controller"),
    progress: Callable[[str], None] = _say,
) -> list[dict[str, Any]]:
    """Every stage at every size, each in a fresh interpreter; the results."""
    results = []
    for n in sizes:
        for stage in stages:
            out = subprocess.run(
                [sys.executable, "-m", "bench.core", "--child", stage, str(n)],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results.append(result)
            progress(
                f"  core {stage:10} {n:>8} objects  {result['seconds']:7.2f}s  "
                f"{result['per_second']:>9.0f} events/s  "
                f"RSS {result['rss_per_object']:5.0f} B/object "
                f"(JSON {result['json_per_object']:4.0f} B)"
            )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__)
    parser.add_argument("--objects", type=int, action="append", help="repeatable; default 100000")
    parser.add_argument("--stages", default="decode,informer,controller")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("STAGE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(run_stage(args.child[0], int(args.child[1])))))
        return
    results = run_core(args.objects or [100_000], args.stages.split(","))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
