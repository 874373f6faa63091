"""The core data path, fed from recorded watch bytes over loopback HTTP: no API server.

    python -m bench.core --objects 100000 [--objects 1000000] [--repeat 3] [--json FILE]

``bench/data/task-watch-event.json`` is one watch event recorded from the real API server
(a Task with managedFields and a status condition, 1.4 kB). It is replayed N times with
distinct names, UIDs and resourceVersions into a body file (one event a line, in the cache
directory, made once per N), which :mod:`bench.core_server` serves over loopback HTTP as an
API server would: an empty LIST, then a watch whose events are the N objects as ADDED. Both
informers read those same bytes through their own HTTP clients.

Stages, each in a fresh process (so memory figures are the stage's own), per implementation
(``ours`` runs on asyncio's event loop; ``--implementations ours,ours-uvloop,go`` adds ours on
uvloop beside it):

- ``decode`` (``limit``): ``orjson.loads`` of every line, already split, nothing else: the
  limit for Python.
- ``informer``: ``ours`` is the real :class:`~informers.reflector.Reflector` (the transport,
  framing, decoding, the state machine, the default transform, the store) with a handler
  that counts deltas; ``go`` is client-go's SharedIndexInformer (Reflector, DeltaFIFO, the
  indexed store, managedFields stripped) with a handler that counts events
  (``bench/peers/go/core``).
- ``controller``: the same, with a real :class:`~controller_runtime.controller.Controller`
  behind ours (handler -> work queue -> one worker -> a no-op reconcile per object) and a
  client-go rate-limiting workqueue with one worker goroutine behind Go's.

Reported: events per second and CPU seconds from starting the informer to the N-th event
handled (or reconciled), and RSS growth per cached object over the same window (beside the
JSON size the store keeps, for ours; beside the live heap after a forced GC, for Go). With
``--repeat`` the runs of each size rotate, and the harness keeps the median run of each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import resource
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

TEMPLATE = Path(__file__).with_name("data") / "task-watch-event.json"
IMPLEMENTATIONS = ("ours", "go")
EVENT_LOOPS = {"ours": "asyncio", "ours-uvloop": "uvloop"}
"""The event loop each implementation of ours runs on (``ours-uvloop`` only when asked for)."""
STAGES = ("decode", "informer", "controller")


def _lines(n: int) -> Iterator[bytes]:
    event = orjson.loads(TEMPLATE.read_bytes())
    obj = event["object"]
    meta = obj["metadata"]
    for i in range(n):
        meta["name"] = f"task-{i:07d}"
        meta["namespace"] = f"team-{i % 50:02d}"
        meta["uid"] = f"00000000-0000-4000-8000-{i:012d}"
        meta["resourceVersion"] = str(1000 + i)
        yield orjson.dumps({"type": "ADDED", "object": obj})


def recorded_body(n: int) -> bytes:
    """N ADDED events shaped exactly like the recorded one, one a line."""
    return b"\n".join(_lines(n)) + b"\n"


def body_file(n: int) -> Path:
    """The recorded body of N events as a file in the cache directory, written once."""
    from controller_runtime.envtest.binaries import cache_root  # noqa: PLC0415

    digest = hashlib.sha256(TEMPLATE.read_bytes()).hexdigest()[:12]
    path = cache_root() / "bench" / f"core-body-{digest}-{n}.ndjson"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        batch: list[bytes] = []
        for line in _lines(n):
            batch.append(line)
            if len(batch) == 10_000:
                f.write(b"\n".join(batch) + b"\n")
                batch.clear()
        if batch:
            f.write(b"\n".join(batch) + b"\n")
    tmp.replace(path)
    return path


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def decode_stage(n: int) -> dict[str, Any]:
    """orjson alone over the N lines, already split: the limit for Python."""
    lines = body_file(n).read_bytes().splitlines()
    started = time.perf_counter()
    cpu_started = time.process_time()
    for line in lines:
        orjson.loads(line)
    seconds = time.perf_counter() - started
    return _result("decode", "limit", n, seconds, time.process_time() - cpu_started)


async def ours_stage(stage: str, n: int, server: str) -> dict[str, Any]:
    """Our informer (and, for ``controller``, a controller behind it) reading ``server``."""
    from bench._core_controller import controller_sink  # noqa: PLC0415
    from informers.reflector import Reflector  # noqa: PLC0415
    from informers.reflector_machine import ReflectorOptions  # noqa: PLC0415
    from informers.store import Store  # noqa: PLC0415
    from kubeclient.config import ClusterConfig  # noqa: PLC0415
    from kubeclient.discovery import ResourceInfo  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    task_kind = ResourceInfo("tasks.crpy.io", "v1", "Task", "tasks", namespaced=True)
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

    transport = Transport(ClusterConfig(server=server, ssl_context=ssl.create_default_context()))
    # The same path as client-go's peer (its streaming list is off): LIST, then the watch.
    reflector = Reflector(
        transport,
        task_kind,
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
    grown = _rss() - baseline
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if finish is not None:
        await finish()
    await transport.close()
    if len(store) != n:
        raise RuntimeError(f"the store holds {len(store)} of {n} objects")
    kept = 0
    cached = store.keys()
    for key in cached:
        raw = store.get_raw(key)
        kept += len(raw) if raw is not None else 0
    return _result(stage, "ours", n, seconds, cpu) | {
        "rss_per_object": grown / n,
        "json_per_object": kept / n,
    }


def go_stage(stage: str, n: int, server: str, binary: Path) -> dict[str, Any]:
    """client-go's informer (and workqueue, for ``controller``) reading ``server``."""
    env = {**os.environ, "KUBE_FEATURE_WatchListClient": "false"}
    command = [str(binary), f"-server={server}", f"-objects={n}", f"-stage={stage}"]
    out = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"the Go core peer failed ({out.returncode}):\n{out.stderr[-2000:]}")
    peer = json.loads(out.stdout.strip().splitlines()[-1])
    if peer["cached"] != n:
        raise RuntimeError(f"the Go store holds {peer['cached']} of {n} objects")
    return _result(stage, "go", n, peer["seconds"], peer["cpu_seconds"]) | {
        "peak_rss_bytes": peer["peak_rss_bytes"],
        "rss_per_object": peer["rss_grown"] / n,
        "heap_per_object": peer["heap_after_gc"] / n,
        "version": f"client-go (controller-runtime's pins), {peer['go_version']}, "
        f"GOMAXPROCS {peer['gomaxprocs']}",
    }


def _result(stage: str, implementation: str, n: int, seconds: float, cpu: float) -> dict[str, Any]:
    return {
        "scenario": "core",
        "stage": stage,
        "implementation": implementation,
        "objects": n,
        "seconds": seconds,
        "per_second": n / seconds,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cpu_seconds": cpu,
    }


def _say(message: str) -> None:
    print(message, flush=True)


@contextlib.contextmanager
def serving(body: Path) -> Iterator[str]:
    """:mod:`bench.core_server` on ``body`` in a process of its own; its URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.core_server", f"--body={body}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def core_runs(
    stages: Sequence[str], implementations: Sequence[str], repeat: int
) -> list[tuple[str, str]]:
    """The (stage, implementation) runs of one size, rotated by ``repeat`` so that none always
    runs first or last (the decode stage has the single implementation ``limit``)."""
    runs = [
        (stage, implementation)
        for stage in stages
        for implementation in (("limit",) if stage == "decode" else implementations)
    ]
    shift = repeat % len(runs) if runs else 0
    return runs[shift:] + runs[:shift]


def run_core(
    sizes: Sequence[int],
    stages: Sequence[str] = STAGES,
    progress: Callable[[str], None] = _say,
    *,
    implementations: Sequence[str] = IMPLEMENTATIONS,
    repeat: int = 1,
) -> list[dict[str, Any]]:
    """Every stage of every implementation at every size, each in a fresh process, ``repeat``
    times in rotating order; every run's result (the harness keeps the median)."""
    go_binary = None
    if "go" in implementations:
        from bench.peers.gopeer import core_peer_binary  # noqa: PLC0415

        go_binary = core_peer_binary(progress=progress)
    results = []
    for n in sizes:
        progress(f"  core: writing the recorded body of {n} events (once)")
        body = body_file(n)
        with serving(body) as server:
            for round_ in range(repeat):
                for stage, implementation in core_runs(stages, implementations, round_):
                    if implementation == "go":
                        assert go_binary is not None
                        result = go_stage(stage, n, server, go_binary)
                    else:
                        command = [sys.executable, "-m", "bench.core", "--child", stage, str(n)]
                        loop = EVENT_LOOPS.get(implementation, "asyncio")
                        out = subprocess.run(
                            [*command, f"--server={server}"],
                            capture_output=True,
                            text=True,
                            check=True,
                            env={**os.environ, "CRPY_EVENT_LOOP": loop},
                        )
                        result = json.loads(out.stdout.strip().splitlines()[-1])
                    results.append(result)
                    progress(
                        f"  core {stage:10} {implementation:5} {n:>8} objects  "
                        f"{result['seconds']:7.2f}s  {result['per_second']:>9.0f} events/s  "
                        f"CPU {result['cpu_seconds']:6.2f}s  "
                        f"RSS {result.get('rss_per_object', 0):5.0f} B/object"
                    )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__)
    parser.add_argument("--objects", type=int, action="append", help="repeatable; default 100000")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("STAGE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--server", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        stage, n = args.child[0], int(args.child[1])
        if stage == "decode":
            print(json.dumps(decode_stage(n)))
            return
        from controller_runtime.manager import install_event_loop  # noqa: PLC0415

        loop = install_event_loop()
        result = asyncio.run(ours_stage(stage, n, args.server))
        implementation = next(i for i, name in EVENT_LOOPS.items() if name == loop)
        print(json.dumps(result | {"implementation": implementation, "event_loop": loop}))
        return
    results = run_core(
        args.objects or [100_000],
        args.stages.split(","),
        implementations=args.implementations.split(","),
        repeat=max(1, args.repeat),
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
