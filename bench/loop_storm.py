"""A connection-refused storm against the event loop: the API server restarted in a loop while
operator processes and client processes keep many requests and watches in flight.

Run ``python -m bench.loop_storm --loop uvloop --minutes 10`` (``--loop asyncio`` for the
standard loop; ``--gdb`` runs every child under ``gdb -batch`` so that an abort prints the
native backtrace of every thread). What ran and what came of it is in docs/reliability.md,
"The event loop".

It starts a local control plane with N Tasks (``--tasks``, default 300), then:

- ``--operators`` (default 2) ``python -m controllers --controllers task`` processes with
  leader election on short timings (lease 4 s, renew deadline 3 s, retry 1 s: attempts are
  cancelled after their deadline, mid-connect when the server is down) and every Task
  watched; one of them reconciles, all keep watches open. An operator that exits (losing the
  Lease exits non-zero, by design) is started again, as the kubelet would;
- ``--clients`` (default 2) processes of this module's ``client`` mode, each with
  ``--concurrency`` (default 100) loops of GET/LIST/PATCH through the project's
  :class:`~kubeclient.transport.Transport` (a third of them cancelled by a random timeout of
  1 to 300 ms: cancellations inside ``create_connection``), and ``--watches`` (default 10)
  watch loops that re-open at once on any failure;
- the harness patches Tasks while the API server is up (work for the leader), and stops and
  starts the API server in a loop (``--down`` seconds down, default 3; ``--up`` up, default 6:
  long enough to reconnect and put many requests in flight, then every one of them refused).

Every child runs on the loop asked for (``CRPY_EVENT_LOOP``), with faulthandler on and core
dumps allowed (``ulimit -c unlimited`` in the child; the core lands in the run's directory).
A child that dies of a signal (SIGABRT: ``Fatal Python error: Aborted``) is reported with the
last lines of its stderr, and, with ``--gdb``, its native backtrace. Prints one JSON line at
the end; logs stay in the directory printed first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.kube import task_name

REPO = Path(__file__).resolve().parents[1]
TASKS = "tasks.crpy.io/v1"


# -- a client process ------------------------------------------------------------------------


async def client(kubeconfig: str, namespace: str, concurrency: int, watches: int) -> int:
    """Requests and watches against the API server until SIGTERM, ignoring every failure."""
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    config = await load_kubeconfig(kubeconfig)
    path = f"/apis/{TASKS}/namespaces/{namespace}/tasks"
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    outcomes: Counter[str] = Counter()

    async with Transport(config, max_retries=0) as transport:

        async def one(i: int) -> None:
            rng = random.Random(i)
            while not stop.is_set():
                name = task_name(rng.randrange(100))
                kind = rng.choice(("get", "list", "patch"))
                try:
                    if kind == "get":
                        call = transport.request("GET", f"{path}/{name}")
                    elif kind == "list":
                        call = transport.request("GET", path, params={"limit": "5"})
                    else:
                        body = {"status": {"storm": rng.random()}}
                        call = transport.request(
                            "PATCH",
                            f"{path}/{name}/status",
                            body=body,
                            content_type="application/merge-patch+json",
                        )
                    if i % 3 == 0:
                        await asyncio.wait_for(call, rng.uniform(0.001, 0.3))
                    else:
                        await call
                    outcomes[f"{kind} ok"] += 1
                except (Exception, asyncio.CancelledError) as err:
                    if isinstance(err, asyncio.CancelledError) and stop.is_set():
                        return
                    outcomes[f"{kind} {type(err).__name__}"] += 1
                    await asyncio.sleep(rng.uniform(0, 0.05))

        async def watch(i: int) -> None:
            while not stop.is_set():
                try:
                    async with transport.stream(path, {"watch": "1"}) as response:
                        async for _ in response.content.iter_any():
                            outcomes["watch bytes"] += 1
                except (Exception, asyncio.CancelledError) as err:
                    if isinstance(err, asyncio.CancelledError) and stop.is_set():
                        return
                    outcomes[f"watch {type(err).__name__}"] += 1

        tasks = [asyncio.create_task(one(i)) for i in range(concurrency)]
        tasks += [asyncio.create_task(watch(i)) for i in range(watches)]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(dict(outcomes)), flush=True)
    return 0


# -- the harness -----------------------------------------------------------------------------


def _allow_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


class Child:
    """One child process (started again when it exits, unless stopping)."""

    def __init__(self, name: str, command: list[str], out: Path, args: argparse.Namespace) -> None:
        self.name, self.command, self.out = name, command, out
        self.loop, self.gdb = str(args.loop), bool(args.gdb)
        self.starts = 0
        self.killed = False  # by the harness (a slow start): not a death
        self.exits: Counter[int] = Counter()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.starts += 1
        self.killed = False
        command = self.command
        if self.gdb:
            command = [
                "gdb", "-batch", "-q", "-iex", "set auto-load safe-path /",
                "-ex", "handle SIGPIPE nostop noprint pass",
                "-ex", "handle SIGTERM nostop noprint pass",
                "-ex", "run",
                "-ex", "thread apply all bt 40",
                "-ex", "py-bt",
                "--args", *command,
            ]  # fmt: skip
        log = (self.out / f"{self.name}.{self.starts}.log").open("wb")
        env = {**os.environ, "CRPY_EVENT_LOOP": self.loop, "PYTHONFAULTHANDLER": "1"}
        self.process = subprocess.Popen(
            command,
            cwd=self.out,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_allow_cores,  # noqa: PLW1509 (a bench child, no threads yet)
        )
        log.close()

    def died_of_a_signal(self) -> str | None:
        """The log's tail if the last run ended by a signal (or, under gdb, an abort)."""
        assert self.process is not None
        log = self.out / f"{self.name}.{self.starts}.log"
        text = log.read_text(errors="replace")
        aborted = "Fatal Python error" in text or "SIGABRT" in text or "SIGSEGV" in text
        signalled = self.process.returncode is not None and self.process.returncode < 0
        if aborted or (signalled and not self.killed):
            return "\n".join(text.splitlines()[-80:])
        return None


async def _start_apiserver(plane: Any, children: list[Child]) -> int:
    """Start the API server again; how many starts were not ready within the start timeout
    under the storm (each is retried, from the second on with the clients killed first: the
    reaper starts them again)."""
    from controller_runtime.envtest import ControlPlaneError  # noqa: PLC0415

    for attempt in range(4):
        try:
            await asyncio.to_thread(plane.start_apiserver)
        except ControlPlaneError as err:
            print(f"slow start: {str(err)[:120]}", file=sys.stderr, flush=True)
            await asyncio.to_thread(plane.stop_apiserver)
            if attempt >= 1:
                for child in children:
                    if child.name.startswith("client") and child.process is not None:
                        child.killed = True
                        child.process.kill()
        else:
            return attempt
    raise RuntimeError("the API server did not come back after 4 starts")


def _late_deaths(out: Path, reported: set[str]) -> list[dict[str, Any]]:
    """Children that aborted after the harness's last look (or while stopping): their logs
    hold faulthandler's ``Fatal Python error``."""
    return [
        {"child": log.stem, "returncode": None, "at_seconds": None, "log": log.name}
        for log in sorted(out.glob("*.log"))
        if log.name not in reported and "Fatal Python error" in log.read_text(errors="replace")
    ]


def _operator_command(plane: Any, namespace: str) -> list[str]:
    election = ["--leader-elect", "--leader-election-namespace", namespace]
    timings = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1"]
    quiet = ["--metrics-bind-address", "0", "--health-probe-bind-address", "0"]
    return [
        *(sys.executable, "-m", "controllers", "--kubeconfig", str(plane.kubeconfig)),
        *("--controllers", "task", "--namespace", namespace, *election, *timings, *quiet),
        *("--max-concurrent-reconciles", "8", "--log-level", "warning"),
    ]


def _client_command(plane: Any, namespace: str, args: argparse.Namespace) -> list[str]:
    return [
        *(sys.executable, "-m", "bench.loop_storm", "client", str(plane.kubeconfig)),
        *(namespace, str(args.concurrency), str(args.watches), args.loop),
    ]


async def _patch_tasks(
    transport: Any, namespace: str, tasks: int, stop: asyncio.Event
) -> Counter[str]:
    """Work for the leader: spec patches of random Tasks while the server answers."""
    path = f"/apis/{TASKS}/namespaces/{namespace}/tasks"
    done: Counter[str] = Counter()
    rng = random.Random(7)
    while not stop.is_set():
        name = task_name(rng.randrange(tasks))
        try:
            await transport.request(
                "PATCH",
                f"{path}/{name}",
                body={"spec": {"details": uuid.uuid4().hex}},
                content_type="application/merge-patch+json",
            )
            done["patched"] += 1
        except Exception:
            done["refused"] += 1
            await asyncio.sleep(0.2)
    return done


async def run(args: argparse.Namespace) -> dict[str, Any]:  # noqa: PLR0915 (the scenario)
    from bench.kube import create_tasks  # noqa: PLC0415
    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    out = Path(tempfile.mkdtemp(prefix=f"crpy-loop-storm-{args.loop}-"))
    print(f"logs in {out}", file=sys.stderr, flush=True)
    namespace = f"storm-{uuid.uuid4().hex[:6]}"
    deaths: list[dict[str, Any]] = []
    restarts = slow_starts = 0
    with ControlPlane() as plane:
        async with Transport(await load_kubeconfig(plane.kubeconfig)) as admin:
            await create_tasks(admin, namespace, args.tasks)
            children = [
                Child(f"operator-{i}", _operator_command(plane, namespace), out, args)
                for i in range(args.operators)
            ]
            children += [
                Child(f"client-{i}", _client_command(plane, namespace, args), out, args)
                for i in range(args.clients)
            ]
            for child in children:
                child.start()
            stop = asyncio.Event()
            patching = asyncio.create_task(_patch_tasks(admin, namespace, args.tasks, stop))
            started = time.monotonic()

            def reap() -> None:
                for child in children:
                    if child.process is None or child.process.poll() is None:
                        continue
                    child.exits[child.process.returncode] += 1
                    tail = child.died_of_a_signal()
                    if tail is not None:
                        deaths.append(
                            {
                                "child": child.name,
                                "returncode": child.process.returncode,
                                "at_seconds": round(time.monotonic() - started),
                                "log": f"{child.name}.{child.starts}.log",
                                "tail": tail,
                            }
                        )
                        print(f"{child.name} died: see {out}/{child.name}.{child.starts}.log",
                              file=sys.stderr, flush=True)  # fmt: skip
                    child.start()

            try:
                while time.monotonic() - started < args.minutes * 60:
                    await asyncio.sleep(args.up)
                    reap()
                    await asyncio.to_thread(plane.stop_apiserver)
                    await asyncio.sleep(args.down)
                    reap()
                    slow_starts += await _start_apiserver(plane, children)
                    restarts += 1
                    if deaths and args.stop_at_first:
                        break
            finally:
                stop.set()
                patched = await patching
                for child in children:
                    if child.process is not None and child.process.poll() is None:
                        child.process.send_signal(signal.SIGTERM)
                for child in children:
                    if child.process is not None:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            child.process.wait(30)
                        if child.process.poll() is None:
                            child.process.kill()
                            child.process.wait()
    deaths += await asyncio.to_thread(_late_deaths, out, {d["log"] for d in deaths})
    return {
        "loop": args.loop,
        "minutes": round((time.monotonic() - started) / 60, 1),
        "apiserver_restarts": restarts,
        "slow_starts": slow_starts,
        "down_seconds": args.down,
        "up_seconds": args.up,
        "operators": args.operators,
        "clients": args.clients,
        "concurrency": args.concurrency,
        "watches": args.watches,
        "harness": dict(patched),
        "exits": {c.name: {str(k): v for k, v in c.exits.items()} for c in children},
        "deaths": [{k: v for k, v in d.items() if k != "tail"} for d in deaths],
        "cores": sorted(p.name for p in await asyncio.to_thread(lambda: list(out.glob("core*")))),
        "dir": str(out),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["client"]:
        kubeconfig, namespace, concurrency, watches, loop = argv[1:6]
        from controller_runtime.manager import install_event_loop  # noqa: PLC0415

        install_event_loop(loop)
        return asyncio.run(client(kubeconfig, namespace, int(concurrency), int(watches)))
    p = argparse.ArgumentParser(prog="python -m bench.loop_storm", description=__doc__)
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--tasks", type=int, default=300)
    p.add_argument("--operators", type=int, default=2)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--watches", type=int, default=10)
    p.add_argument("--down", type=float, default=3.0, help="seconds the API server is down")
    p.add_argument("--up", type=float, default=6.0, help="seconds it is up between")
    p.add_argument("--gdb", action="store_true", help="run every child under gdb -batch")
    p.add_argument("--stop-at-first", action="store_true", help="stop at the first death")
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    return 1 if result["deaths"] else 0


if __name__ == "__main__":
    sys.exit(main())
