"""The ``webhook`` scenario: admission latency and throughput of a validating webhook, ours
beside controller-runtime's (Go), behind the same API server.

Both webhooks make the same decisions about Tasks (``tasks.crpy.io/v1``): a new Task may not
be due in the past (``spec.deadline`` before now), its details may not hold the word
"forbidden", and a Task of priority 5 is admitted with a warning. Ours is
:class:`~controller_runtime.webhook.WebhookServer` with :func:`validating_handler` in a process
of its own (``python -m bench.webhook --child``); the peer is ``bench/peers/go/webhook``
(controller-runtime's ``webhook.Server`` and ``admission.WithValidator``), HTTP/1.1 on both.
Each serves the same certificate (a CA made for the run), on 127.0.0.1.

For each implementation in turn (rotating the order every round), the harness:

1. starts it, waits until it answers an AdmissionReview, and points a
   ValidatingWebhookConfiguration (``failurePolicy: Fail``, ``timeoutSeconds: 5``) at it, then
   waits until the API server refuses a Task the rules refuse (the API server picks the
   configuration up from its own watch, a moment after it is stored);
2. **through the API server**, open loop: ``--webhook-rate`` dry-run creates of valid Tasks a
   second (``POST ...?dryRun=All``, each a new name) for ``--webhook-seconds``; the latency
   of each create, as the harness's client sees it. A round with no configuration at all
   (``none``) gives the API server's own latency for the same requests, so the webhook's
   share is the difference;
3. **directly**, open loop at the same rate: AdmissionReviews (the bytes the API server sends)
   posted to the webhook over one kept-alive TLS connection: the handler path alone;
4. **the most it takes**: dry-run creates through the API server, 32 at a time, for half of
   ``--webhook-seconds``: requests per second;

and reads the process's CPU seconds and peak RSS. Every request that is not admitted counts
as a failure (none is expected).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import itertools
import os
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson

from bench.procs import Child
from bench.report import Result, percentile

PATH = "/validate-tasks-crpy-io-v1-task"
"""controller-runtime's default path of a validating webhook of tasks.crpy.io/v1 Task."""
CONFIGURATION = "bench-webhook"
TASKS = "/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
IMPLEMENTATIONS = ("ours", "go")
MAX_CONCURRENCY = 32
Say = Callable[[str], None]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the rules (ours; bench/peers/go/webhook/main.go has the same) ----


class TaskRules:
    """The validator both webhooks implement (see the module docstring)."""

    async def validate_create(self, request: Any, client: Any, obj: dict[str, Any]) -> list[str]:
        from controller_runtime.webhook import Denied  # noqa: PLC0415

        spec = obj.get("spec") or {}
        deadline = spec.get("deadline")
        if deadline:
            try:
                due = datetime.datetime.fromisoformat(deadline)
            except ValueError:
                raise Denied(
                    f"spec.deadline: {deadline!r} is not an RFC 3339 time", field="spec.deadline"
                ) from None
            if due < datetime.datetime.now(datetime.UTC):
                raise Denied(
                    f"spec.deadline: a new task cannot be due in the past ({deadline})",
                    field="spec.deadline",
                )
        if "forbidden" in (spec.get("details") or ""):
            raise Denied('spec.details: the word "forbidden" is not allowed', field="spec.details")
        if spec.get("priority") == 5:
            return ["priority 5 pages whoever is on call"]
        return []

    async def validate_update(
        self, request: Any, client: Any, obj: dict[str, Any], old: dict[str, Any]
    ) -> list[str]:
        return []

    async def validate_delete(self, request: Any, client: Any, obj: dict[str, Any]) -> list[str]:
        return []


async def serve_child(port: int, cert_dir: Path) -> None:
    """Ours, as the child process: the webhook server until SIGTERM."""
    import signal  # noqa: PLC0415

    from controller_runtime.webhook import WebhookServer, validating_handler  # noqa: PLC0415

    server = WebhookServer(port=port, host="127.0.0.1", cert_dir=cert_dir, handler_timeout=4.0)
    # The rules read nothing from the cluster: no client is needed.
    server.register(PATH, validating_handler(TaskRules(), cast(Any, None)))
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop()


# ---- the harness's side ----


def task(
    name: str, *, details: str = "benchmark task: do the work", priority: int = 2
) -> dict[str, Any]:
    deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    return {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": {"name": name},
        "spec": {
            "priority": priority,
            "details": details,
            "deadline": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }


def admission_review(namespace: str, obj: dict[str, Any]) -> bytes:
    """An AdmissionReview of a CREATE, as the API server sends it."""
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "tasks.crpy.io", "version": "v1", "kind": "Task"},
                "resource": {"group": "tasks.crpy.io", "version": "v1", "resource": "tasks"},
                "requestKind": {"group": "tasks.crpy.io", "version": "v1", "kind": "Task"},
                "requestResource": {
                    "group": "tasks.crpy.io",
                    "version": "v1",
                    "resource": "tasks",
                },
                "name": obj["metadata"]["name"],
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
                "object": obj,
                "oldObject": None,
                "dryRun": True,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        }
    )


def configuration(port: int, ca_pem: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION},
        "webhooks": [
            {
                "name": "vtask.tasks.crpy.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}{PATH}",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["tasks.crpy.io"],
                        "apiVersions": ["v1"],
                        "resources": ["tasks"],
                        "operations": ["CREATE"],
                    }
                ],
            }
        ],
    }


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    if not seconds:
        return {"p50_seconds": 0.0, "p99_seconds": 0.0, "max_seconds": 0.0}
    return {
        "p50_seconds": percentile(seconds, 50),
        "p99_seconds": percentile(seconds, 99),
        "max_seconds": max(seconds),
    }


async def open_loop(
    send: Callable[[int], Any], rate: float, seconds: float
) -> tuple[list[float], int]:
    """``send(i)`` ``rate`` times a second for ``seconds`` (each on time, whatever the ones
    before it are doing); the latency of each that succeeded, and how many failed."""
    latencies: list[float] = []
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        began = time.perf_counter()
        try:
            await send(i)
        except Exception:
            failures += 1
            return
        latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    pending: list[asyncio.Task[None]] = []
    for i in range(int(rate * seconds)):
        due = started + i / rate
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        pending.append(asyncio.create_task(one(i)))
    await asyncio.gather(*pending)
    return latencies, failures


async def closed_loop(
    send: Callable[[int], Any], concurrency: int, seconds: float
) -> tuple[int, int, float]:
    """``concurrency`` senders back to back for ``seconds``: (done, failed, elapsed)."""
    counter = itertools.count()
    done = failed = 0
    deadline = time.perf_counter() + seconds

    async def sender() -> None:
        nonlocal done, failed
        while time.perf_counter() < deadline:
            try:
                await send(next(counter))
                done += 1
            except Exception:
                failed += 1

    began = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return done, failed, time.perf_counter() - began


async def _until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if await check():
                return
        except Exception as err:
            last = err
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} not within {timeout:.0f}s (last error: {last})")


class Run:
    """One run of the scenario: the control plane, the run's certificate, the namespace."""

    def __init__(self, plane: Any, transport: Any, work: Path, *, rate: float, seconds: float):
        from controller_runtime.envtest.certs import CertificateAuthority  # noqa: PLC0415

        self.plane = plane
        self.transport = transport
        self.rate = rate
        self.seconds = seconds
        self.work = work
        ca = CertificateAuthority("controller-runtime-py-bench-webhook-ca")
        self.cert_dir = work / "certs"
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        ca.issue_serving(["127.0.0.1", "localhost"]).write(self.cert_dir, "tls")
        self.ca_pem = ca.cert_pem
        self.namespace = f"bench-webhook-{uuid.uuid4().hex[:6]}"
        self.names = itertools.count()

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        context.set_alpn_protocols(["http/1.1"])
        return context

    async def create(self, *, details: str = "benchmark task: do the work") -> None:
        name = f"t-{next(self.names):08d}"
        await self.transport.request(
            "POST",
            TASKS.format(namespace=self.namespace),
            body=task(name, details=details),
            params={"dryRun": "All"},
        )

    async def refused(self) -> bool:
        from kubeclient.errors import ApiError  # noqa: PLC0415

        try:
            await self.create(details="this is forbidden")
        except ApiError as err:
            return "forbidden" in str(err) and err.status in (400, 403, 422)
        return False

    async def install(self, port: int) -> None:
        from kubeclient.errors import ApiError  # noqa: PLC0415

        path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
        with contextlib.suppress(ApiError):
            await self.transport.request("DELETE", f"{path}/{CONFIGURATION}")
        await self.transport.request("POST", path, body=configuration(port, self.ca_pem))
        await _until(self.refused, "the API server calling the webhook")

    async def uninstall(self) -> None:
        from kubeclient.errors import ApiError  # noqa: PLC0415

        path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
        with contextlib.suppress(ApiError):
            await self.transport.request("DELETE", f"{path}/{CONFIGURATION}")

        async def admitted() -> bool:
            return not await self.refused()

        await _until(admitted, "the API server dropping the webhook")

    def start(self, implementation: str, port: int, go_binary: Path | None) -> Child:
        if implementation == "go":
            assert go_binary is not None
            command = [str(go_binary), f"--port={port}", f"--cert-dir={self.cert_dir}"]
        else:
            command = [
                sys.executable,
                "-m",
                "bench.webhook",
                "--child",
                f"--port={port}",
                f"--cert-dir={self.cert_dir}",
            ]
        log = self.work / f"{implementation}-{port}.log"
        return Child.start(implementation, command, os.environ, log)

    async def direct(self, port: int, concurrency: int | None = None) -> dict[str, Any]:
        """AdmissionReviews straight to the webhook: open loop at the rate, over one
        kept-alive connection (as the API server reuses its own)."""
        url = f"https://127.0.0.1:{port}{PATH}"
        reviews = [admission_review(self.namespace, task(f"d-{i}")) for i in range(64)]
        connector = aiohttp.TCPConnector(ssl=self.ssl_context(), limit=concurrency or 8)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def send(i: int) -> None:
                async with session.post(
                    url,
                    data=reviews[i % len(reviews)],
                    headers={"Content-Type": "application/json"},
                ) as answer:
                    body = await answer.read()
                    if answer.status != 200 or not orjson.loads(body)["response"]["allowed"]:
                        raise RuntimeError(f"{answer.status}: {body[:200]!r}")

            await _until(lambda: _ok(send), "the webhook answering")
            latencies, failures = await open_loop(send, self.rate, self.seconds)
        return {"latencies": latencies, "failures": failures}


async def _ok(send: Callable[[int], Any]) -> bool:
    await send(0)
    return True


async def measure(
    run: Run, implementation: str, go_binary: Path | None, round_: int, say: Say
) -> list[Result]:
    from controller_runtime.envtest.controlplane import _free_port  # noqa: PLC0415

    base: Result = {
        "scenario": "webhook",
        "implementation": implementation,
        "round": round_,
        "rate": run.rate,
        "seconds": run.seconds,
    }
    rows: list[Result] = []
    child = None
    if implementation != "none":
        port = _free_port()
        child = run.start(implementation, port, go_binary)
    try:
        if child is not None:
            direct = await run.direct(port)
            rows.append(
                base
                | {"via": "direct", "failures": direct["failures"]}
                | latency_summary(direct["latencies"])
            )
            await run.install(port)
        latencies, failures = await open_loop(lambda _: run.create(), run.rate, run.seconds)
        rows.append(base | {"via": "apiserver", "failures": failures} | latency_summary(latencies))
        done, failed, elapsed = await closed_loop(
            lambda _: run.create(), MAX_CONCURRENCY, run.seconds / 2
        )
        rows.append(
            base
            | {
                "via": "apiserver-max",
                "concurrency": MAX_CONCURRENCY,
                "failures": failed,
                "per_second": done / elapsed,
            }
        )
        if child is not None:
            for row in rows:
                row["cpu_seconds"] = child.cpu_seconds()
                row["peak_rss_bytes"] = child.peak_rss()
            await run.uninstall()
    finally:
        if child is not None:
            child.stop()
    for row in rows:
        if "p50_seconds" in row:
            say(
                f"  webhook/{implementation} via {row['via']}: p50 "
                f"{row['p50_seconds'] * 1000:.2f} ms, p99 {row['p99_seconds'] * 1000:.2f} ms, "
                f"{row['failures']} failed"
            )
        else:
            say(
                f"  webhook/{implementation} via {row['via']}: {row['per_second']:.0f}/s, "
                f"{row['failures']} failed"
            )
    return rows


def rotation(implementations: Sequence[str], round_: int) -> list[str]:
    """The order of a round: shifted by one each round, so no implementation always runs
    first (on a warm or a cold API server)."""
    order = list(implementations)
    shift = round_ % len(order) if order else 0
    return order[shift:] + order[:shift]


def run_webhook(
    *,
    rate: float,
    seconds: float,
    implementations: Sequence[str] = IMPLEMENTATIONS,
    repeat: int = 3,
    progress: Say = _say,
) -> list[Result]:
    """The scenario on a control plane of its own: every run's rows (the report keeps the
    median of each implementation and path)."""
    from controller_runtime.envtest import ControlPlane  # noqa: PLC0415

    go_binary = None
    if "go" in implementations:
        from bench.peers.gopeer import webhook_peer_binary  # noqa: PLC0415

        go_binary = webhook_peer_binary(progress=progress)
    names = [*implementations, "none"]
    with ControlPlane() as plane, tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:

        async def main() -> list[Result]:
            from bench.kube import create_namespace  # noqa: PLC0415
            from kubeclient.config import load_kubeconfig  # noqa: PLC0415
            from kubeclient.transport import Transport  # noqa: PLC0415

            config = await load_kubeconfig(plane.kubeconfig)
            rows: list[Result] = []
            async with Transport(config, max_connections=MAX_CONCURRENCY * 2) as transport:
                run = Run(plane, transport, Path(tmp), rate=rate, seconds=seconds)
                await create_namespace(transport, run.namespace)
                for round_ in range(repeat):
                    for implementation in rotation(names, round_):
                        progress(f"webhook: round {round_ + 1}/{repeat}, {implementation}")
                        rows += await measure(run, implementation, go_binary, round_, progress)
            return rows

        return asyncio.run(main())


def median_rows(rows: Sequence[Result]) -> list[Result]:
    """Per implementation and path, the run with the median p99 (or rate)."""
    out: list[Result] = []
    keys = sorted({(r["implementation"], r["via"]) for r in rows})
    for implementation, via in keys:
        group = [r for r in rows if r["implementation"] == implementation and r["via"] == via]
        measure_of = "per_second" if via == "apiserver-max" else "p99_seconds"
        group.sort(key=lambda r: r[measure_of])
        out.append(group[len(group) // 2] | {"runs": len(group)})
    return out


def format_table(rows: Sequence[Result]) -> str:
    """The medians as a markdown table, with ours / Go ratios."""
    medians = {(r["implementation"], r["via"]): r for r in median_rows(rows)}
    lines = [
        "| implementation | direct p50 / p99 (ms) | via API server p50 / p99 (ms) "
        f"| via API server, {MAX_CONCURRENCY} at a time (req/s) | CPU s | peak RSS (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def ms(row: Result | None) -> str:
        if row is None:
            return "-"
        return f"{row['p50_seconds'] * 1000:.2f} / {row['p99_seconds'] * 1000:.2f}"

    for implementation in sorted({i for i, _ in medians}, key=lambda i: (i == "none", i)):
        api = medians.get((implementation, "apiserver"))
        most = medians.get((implementation, "apiserver-max"))
        rate = f"{most['per_second']:.0f}" if most else "-"
        cpu = (api or {}).get("cpu_seconds")
        rss = (api or {}).get("peak_rss_bytes")
        lines.append(
            f"| {implementation} | {ms(medians.get((implementation, 'direct')))} | {ms(api)} "
            f"| {rate} | {f'{cpu:.1f}' if cpu else '-'} "
            f"| {f'{rss / 2**20:.0f}' if rss else '-'} |"
        )
    ours = medians.get(("ours", "apiserver"))
    go = medians.get(("go", "apiserver"))
    if ours and go and go["p99_seconds"]:
        lines.append("")
        lines.append(
            f"ours / Go p99 through the API server: {ours['p99_seconds'] / go['p99_seconds']:.2f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook", allow_abbrev=False)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=9443)
    parser.add_argument("--cert-dir", type=Path)
    args = parser.parse_args(argv)
    if not args.child or args.cert_dir is None:
        parser.error("run the scenario with python -m bench --scenarios webhook")
    from controller_runtime.manager import install_event_loop  # noqa: PLC0415

    install_event_loop()
    asyncio.run(serve_child(args.port, args.cert_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
