"""Where the time of a ServiceBinding's cleanup goes, with and without watch lag, and how long
a restarted operator takes to get back to work.

Run ``python -m bench.binding_cleanup --lags 0,1,3 --bindings 20`` (``--workers`` per
controller, default 2 as the operator's; ``--json FILE``); the numbers are in
docs/postgres.md.

It starts a local control plane and a local PostgreSQL, an external PostgresInstance, and per
lag value an operator process (``python -m controllers`` with the instance, user and binding
controllers, in this module's ``operator`` mode, which records every request it makes with
:mod:`bench.request_trace`) behind a TLS-terminating FaultProxy whose ``watch_latency`` delays
what the operator's watches receive (its other requests are answered at once). Then:

1. **sequential**: ``--sequential`` bindings are deleted one at a time; each is timed from the
   DELETE to the harness seeing it gone (its own watch, not delayed): the time a same-name
   re-create is refused. The operator's requests in that window are the cleanup's critical
   path (printed for the first one, counted for all);
2. **burst**: the other bindings are deleted at once; the same times, per binding;
3. **outage**: the operator's connections are refused 2 s of every 3 for ``--outage`` seconds
   (an API server restarting in a loop) while the bindings are deleted in the gaps; timed
   from the end of the outage to each binding gone;
4. **restart**: the operator is stopped (SIGTERM: it releases its Lease; then SIGKILL: it
   does not) and started again, with leader election as in a Deployment (``--lease-duration``
   15 s, the default), and timed from the exec to "caches synced" (ready) and "became leader"
   in its log, and to the first cleanup done (a binding deleted at the exec).

Prints one JSON line per lag; logs and request traces stay in the directory printed first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
API = "postgres.crpy.io/v1beta1"
CONTROLLERS = "postgres-instance,postgres-user,service-binding"


# -- the operator, traced --------------------------------------------------------------------


def operator(argv: Sequence[str]) -> int:
    """``python -m controllers`` with every request recorded (``$BENCH_REQUEST_TRACE``)."""
    from bench.request_trace import install  # noqa: PLC0415

    target = os.environ.get("BENCH_REQUEST_TRACE")
    if target:
        install(Path(target) / f"operator-{os.getpid()}.jsonl", stream=True)
    from controllers.__main__ import main  # noqa: PLC0415

    return main(list(argv))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    """One operator process behind ``proxy``, its log and its trace in ``out``."""

    def __init__(  # noqa: PLR0917 (one process's command line)
        self, kubeconfig: Path, namespace: str, out: Path, name: str, workers: int, elect: bool
    ) -> None:
        self.health = _free_port()
        self.log_path = out / f"{name}.log"
        self.started = time.monotonic()
        args = [
            "--kubeconfig", str(kubeconfig),
            "--controllers", CONTROLLERS,
            "--namespace", namespace,
            "--metrics-bind-address", "0",
            "--health-probe-bind-address", f"127.0.0.1:{self.health}",
            "--max-concurrent-reconciles", str(workers),
            "--log-level", "info",
        ]  # fmt: skip
        if elect:
            args += ["--leader-elect", "--leader-election-id", f"bench-{namespace}"]
            args += ["--leader-election-namespace", namespace]
        env = {**os.environ, "BENCH_REQUEST_TRACE": str(out)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.binding_cleanup", "operator", *args],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def log_time(self, pattern: str) -> float | None:
        """Seconds from the exec to the first log line matching ``pattern`` (by its wall
        clock stamp, converted with the offset between the two clocks now)."""
        offset = time.time() - time.monotonic()
        for line in self.log_path.read_text(errors="replace").splitlines():
            if re.search(pattern, line):
                stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
                stamp += int(line[20:23]) / 1000
                return stamp - offset - self.started
        return None

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# -- the harness's own view --------------------------------------------------------------------


class Bindings:
    """The harness's watch of the namespace's ServiceBindings (direct: never delayed)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Event()

    def __call__(self, delta: Any, initial: bool) -> None:
        name = delta.obj["metadata"]["name"]
        if delta.type == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = delta.obj
        self.changed.set()

    def ready(self, name: str) -> bool:
        obj = self.objects.get(name) or {}
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (obj.get("status") or {}).get("conditions") or []
        )

    async def until(self, check: Any, timeout: float = 300.0) -> None:
        async def wait() -> None:
            while not check():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)


async def _prepare(transport: Any, server: Any, namespace: str) -> None:
    await transport.request(
        "POST",
        "/api/v1/namespaces",
        body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    major = server.version.split(".")[0]
    policy = {
        "apiVersion": API,
        "kind": "PostgresVersionPolicy",
        "metadata": {"name": "default"},
        "spec": {"versions": [{"version": major, "enabled": True}]},
    }
    await transport.request(
        "PATCH",
        f"/apis/{API}/postgresversionpolicies/default",
        body=policy,
        content_type="application/apply-patch+yaml",
        params={"fieldManager": "bench", "force": "true"},
    )
    await transport.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db-admin"},
            "stringData": {"username": server.user, "password": server.password},
        },
    )
    external = {"host": server.host, "port": server.port, "adminSecretRef": {"name": "db-admin"}}
    await transport.request(
        "POST",
        f"/apis/{API}/namespaces/{namespace}/postgresinstances",
        body={
            "apiVersion": API,
            "kind": "PostgresInstance",
            "metadata": {"name": "db"},
            "spec": {"external": external},
        },
    )


def _binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ServiceBinding",
        "metadata": {"name": name},
        "spec": {"instanceRef": {"name": "db"}},
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))], 3)

    return {"n": len(ordered), "p50": q(0.5), "p90": q(0.9), "max": round(ordered[-1], 3)}


def _requests(out: Path, start: float, end: float) -> list[dict[str, Any]]:
    """The operators' traced requests (no watches, no Leases) started in [start, end]."""
    found = []
    for trace in out.glob("operator-*.jsonl"):
        for line in trace.read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "WATCH" or "/leases" in record.get("path", ""):
                continue
            if start <= record["start"] <= end:
                found.append(record)
    return sorted(found, key=lambda r: r["start"])


# -- one lag value -----------------------------------------------------------------------------


async def measure(  # noqa: PLR0915 (one scenario, step by step)
    plane: Any, server: Any, lag: float, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    from controller_runtime.envtest.faultproxy import FaultProxy  # noqa: PLC0415
    from informers.shared import SharedInformer  # noqa: PLC0415
    from kubeclient.config import load_kubeconfig  # noqa: PLC0415
    from kubeclient.discovery import Discovery  # noqa: PLC0415
    from kubeclient.transport import Transport  # noqa: PLC0415

    namespace = f"cleanup-{uuid.uuid4().hex[:6]}"
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    pki = plane.workdir / "pki"
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
    upstream = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    upstream.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    proxy = await FaultProxy(host, int(port), tls=(serving, upstream)).start()
    proxy.watch_latency = lag
    proxy.latency = args.api_latency
    kubeconfig = out / f"{namespace}.kubeconfig"
    kubeconfig.write_text(plane.kubeconfig.read_text().replace(plane.server, proxy.url))
    result: dict[str, Any] = {
        "lag": lag,
        "api_latency": args.api_latency,
        "workers": args.workers,
        "bindings": args.bindings,
    }
    path = f"/apis/{API}/namespaces/{namespace}/servicebindings"
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as admin:
        await _prepare(admin, server, namespace)
        resource = await Discovery(admin).resolve(API, "ServiceBinding")
        seen = Bindings()
        informer = SharedInformer(admin, resource, namespace=namespace)
        informer.add_handler(seen)
        informer.start()
        await informer.wait_for_sync(60)
        names = [f"b{i}" for i in range(args.bindings)]
        op = Operator(kubeconfig, namespace, out, f"{namespace}-first", args.workers, True)
        try:
            await asyncio.gather(*(admin.request("POST", path, body=_binding(n)) for n in names))
            started = time.monotonic()
            await seen.until(lambda: all(seen.ready(n) for n in names))
            result["all_ready_seconds"] = round(time.monotonic() - started, 2)
            result["first_start"] = {
                "ready": _round(op.log_time("caches synced")),
                "leader": _round(op.log_time("became leader")),
            }

            async def cleanup(name: str) -> tuple[float, float, float]:
                sent = time.monotonic()
                await admin.request("DELETE", f"{path}/{name}")
                await seen.until(lambda: name not in seen.objects)
                return sent, time.monotonic(), time.monotonic() - sent

            sequential = [await cleanup(n) for n in names[: args.sequential]]
            burst = await asyncio.gather(*(cleanup(n) for n in names[args.sequential :]))
            result["sequential_seconds"] = _quantiles([s for _, _, s in sequential])
            result["burst_seconds"] = _quantiles([s for _, _, s in burst])

            # An outage: connections refused 2 s of every 3, bindings deleted in the gaps.
            await asyncio.gather(*(admin.request("POST", path, body=_binding(n)) for n in names))
            await seen.until(lambda: all(seen.ready(n) for n in names))
            if args.outage > 0:
                result["outage"] = await _outage(admin, path, names, seen, proxy, args.outage)
                await asyncio.gather(
                    *(admin.request("POST", path, body=_binding(n)) for n in names)
                )
                await seen.until(lambda: all(seen.ready(n) for n in names))

            # Restarts: SIGTERM (the Lease is released), then SIGKILL (it is not); each time a
            # new process, and a binding deleted at its exec.
            for how, signum, name in (
                ("restart_after_sigterm", signal.SIGTERM, names[0]),
                ("restart_after_sigkill", signal.SIGKILL, names[1]),
            ):
                # Off the loop: the proxy runs on it and must carry the Lease's release.
                await asyncio.to_thread(op.stop, signum)
                op = Operator(kubeconfig, namespace, out, f"{namespace}-{how}", args.workers, True)
                exec_at = op.started
                _, done, _ = await cleanup(name)
                result[how] = {
                    "ready": _round(op.log_time("caches synced")),
                    "leader": _round(op.log_time("became leader")),
                    "first_cleanup_done": round(done - exec_at, 2),
                }
        finally:
            await asyncio.to_thread(op.stop)
            await informer.stop()
            await proxy.stop()
    # The critical path of the first sequential cleanup, and request counts of each.
    counts = [len(_requests(out, s, e)) for s, e, _ in sequential]
    result["requests_per_sequential_cleanup"] = _quantiles([float(c) for c in counts])
    if sequential:
        s, e, _ = sequential[0]
        result["first_cleanup_path"] = [
            f"+{r['start'] - s:.3f}s {r['method']} {_short(r.get('path', ''))} "
            f"{(r['answered'] - r['start']) * 1000:.0f}ms"
            for r in _requests(out, s, e)
        ]
    return result


async def _outage(  # noqa: PLR0917 (the scenario's state)
    admin: Any, path: str, names: list[str], seen: Bindings, proxy: Any, seconds: float
) -> dict[str, Any]:
    """For ``seconds``: the operator's connections refused (and cut) 2 s of every 3, and at
    the start of each 1 s between, bindings deleted (evenly, all of them by the end), so
    that cleanups are cut in the middle. Times from the end of the outage until each binding
    is gone, and until every one is."""
    cycles = max(1, int(seconds // 3))
    per_cycle = -(-len(names) // cycles)
    pending = list(names)
    for _ in range(cycles):
        for name in pending[:per_cycle]:
            await admin.request("DELETE", f"{path}/{name}")
        pending = pending[per_cycle:]
        await asyncio.sleep(1.0)
        proxy.refuse = True
        proxy.cut_all()
        await asyncio.sleep(2.0)
        proxy.refuse = False
    ended = time.monotonic()
    gone_at: dict[str, float] = {}

    def all_gone() -> bool:
        for name in names:
            if name not in seen.objects and name not in gone_at:
                gone_at[name] = time.monotonic() - ended
        return len(gone_at) == len(names)

    await seen.until(all_gone, timeout=1200)
    return {
        "seconds": cycles * 3,
        "after_end_seconds": _quantiles(list(gone_at.values())),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _short(path: str) -> str:
    return re.sub(r"^/apis?/[^/]+(/v[^/]+)?/namespaces/[^/]+/", "", path)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415
    from controllers.postgres.localserver import LocalPostgres  # noqa: PLC0415

    out = Path(tempfile.mkdtemp(prefix="crpy-binding-cleanup-"))
    print(f"logs and request traces in {out}", file=sys.stderr, flush=True)
    results = []
    with ControlPlane() as plane, LocalPostgres() as server:
        for lag in args.lags:
            result = await measure(plane, server, lag, args, out)
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        return operator(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.binding_cleanup", description=__doc__)
    p.add_argument("--lags", default="0,1,3", help="watch lags in seconds (default %(default)s)")
    p.add_argument("--bindings", type=int, default=20, help="(default %(default)s)")
    p.add_argument("--sequential", type=int, default=5, help="(default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="per controller (default %(default)s)")
    p.add_argument(
        "--outage",
        type=float,
        default=30.0,
        help="seconds of flapping outage (default %(default)s)",
    )
    p.add_argument(
        "--api-latency",
        type=float,
        default=0.0,
        help="seconds added to every answer the operator gets, watches included (default 0)",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    args.lags = [float(v) for v in args.lags.split(",") if v.strip()]
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
