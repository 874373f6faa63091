"""The startup scenario: how soon a small operator is ready and reconciles, from ``exec``.

For each size N of ``--startup-objects`` (default 0, 1000 and 10000), each program starts as a
fresh process on a namespace that holds N objects nobody has reconciled yet (created
beforehand, not measured):

- ``ours``: the operator as shipped, ``python -m controllers --controllers task`` (the Task
  controller on the manager, its default event loop, logging at warning), restricted to the
  namespace.
- ``go``: the Go peer (``bench/peers/go``), the same Task controller on controller-runtime.
- ``mirror``: the first controller of docs/controllers.md, run exactly as written there
  (extracted from the page into the results directory), over N ConfigMaps labelled
  ``app=demo``; each reconcile writes a Secret. It watches every namespace (and caches every
  Secret), so the harness deletes the run's ConfigMaps and Secrets after each run.

Measured from outside, the same way for all: *ready* is the first ``200`` from the process's
``/readyz`` (polled every ``POLL`` s; the Python manager and the Go peer are ready once their
caches have synced); *first reconcile* is when the harness's own watch first sees a status
written for the current generation (a Secret appear, for the mirror); *all* is when the N-th
is seen. At N = 0 there is nothing to reconcile: the harness reads the *idle RSS*
``IDLE_SETTLE`` s after ready (the process watching nothing), then creates one object and
records how long after its creation it was reconciled.

Beside the timings, ``python -X importtime`` of each Python program's imports, summed per
top-level package (:func:`import_breakdown`), shows where the interpreter's start-up goes.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from bench.procs import Child
from bench.report import Result

if TYPE_CHECKING:
    from bench.harness import Cluster

IMPLEMENTATIONS = ("ours", "go", "mirror")
POLL = 0.01
IDLE_SETTLE = 2.0
DOCS = Path(__file__).resolve().parents[1] / "docs" / "controllers.md"
MIRROR_LABEL = {"app": "demo"}
IMPORTS = {
    # What `python -m controllers` imports, in its order: the flags, then the runtime and the
    # app, then aiohttp's server half when it starts serving the probes.
    "ours": "import controllers.__main__; from controller_runtime import configure_logging; "
    "from controller_runtime.manager import install_event_loop; "
    "from controllers.app import run_operator; import aiohttp.web",
    "mirror": "import controller_runtime",
}
"""What each Python program imports before its first request (for the importtime table)."""

PACKAGES = ("controllers", "controller_runtime", "informers", "kubeclient")
"""The project's packages, compiled to bytecode before the runs (:func:`precompile`)."""


def precompile() -> None:
    """Compile the project's modules to bytecode, as the operator's image does when it is
    built (``compileall`` in the Dockerfile). A source checkout run with
    ``PYTHONDONTWRITEBYTECODE`` set (as the image sets it, and many shells and CI runners do)
    would otherwise compile each of its ~100 modules from source at every start, ~0.1 s of CPU
    no deployed operator pays. Bytecode already up to date is left as it is."""
    root = Path(__file__).resolve().parents[1]
    for package in PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


_PROBES = re.compile(r"probes at (http://[0-9.:]+)/healthz")


def _say(message: str) -> None:
    from bench.harness import say  # noqa: PLC0415

    say(message)


def mirror_program(docs: Path = DOCS) -> str:
    """The ``mirror.py`` code block of docs/controllers.md, verbatim."""
    found = re.search(r'```python title="mirror.py"\n(.*?)\n```', docs.read_text(), re.S)
    if found is None:
        raise RuntimeError(f"no mirror.py block in {docs}")
    return found.group(1) + "\n"


def import_breakdown(lines: Sequence[str], top: int = 8) -> dict[str, float]:
    """``python -X importtime`` output -> seconds per top-level package (self times summed),
    the ``top`` largest and ``"(rest)"``, plus ``"(total)"``."""
    per: dict[str, float] = defaultdict(float)
    for line in lines:
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if not self_us.isdigit():
            continue  # the header line
        per[name.split(".")[0]] += int(self_us) / 1e6
    ranked = sorted(per.items(), key=lambda kv: -kv[1])
    out = dict(ranked[:top])
    out["(rest)"] = sum(v for _, v in ranked[top:])
    out["(total)"] = sum(per.values())
    return out


def measure_imports(statement: str) -> dict[str, float]:
    """The import breakdown of ``statement`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
    )
    return import_breakdown(out.stderr.splitlines())


def configmap(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"cm-{i:07d}", "labels": dict(MIRROR_LABEL)},
        "data": {"greeting": "hello", "index": str(i)},
    }


async def create_configmaps(transport: Any, namespace: str, n: int, concurrency: int = 64) -> None:
    from bench.kube import create_namespace  # noqa: PLC0415

    await create_namespace(transport, namespace)
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await transport.request(
                "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=configmap(i)
            )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


class SecretObserver:
    """Watches the Secrets of one namespace: when the first and the N-th appeared."""

    def __init__(self, transport: Any, namespace: str) -> None:
        self.transport = transport
        self.namespace = namespace
        self.names: set[str] = set()
        self.first_at: float | None = None
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/secrets"
        listed = await self.transport.get_json(path)
        rv = listed["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._watch(path, rv))

    async def _watch(self, path: str, rv: str) -> None:
        params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "1800"}
        async with self.transport.stream(path, params) as response:
            buffer = b""
            async for chunk in response.content.iter_any():
                *lines, buffer = (buffer + chunk).split(b"\n")
                now = time.monotonic()
                for line in lines:
                    event = orjson.loads(line) if line else {}
                    if event.get("type") == "ADDED":
                        self.names.add(event["object"]["metadata"]["name"])
                        if self.first_at is None:
                            self.first_at = now
                self.changed.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def _ready_at(child: Child, url: str | None, timeout: float) -> float | None:
    """When ``url``/readyz first answered 200 (monotonic), polling every ``POLL`` s; for the
    mirror (``url`` None) the probe address is read from its log first."""
    deadline = child.started + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited:\n{child.log_tail()}")
            if url is None:
                found = _PROBES.search(child.log_path.read_text(errors="replace"))
                url = found.group(1) if found else None
            if url is not None:
                try:
                    async with session.get(f"{url}/readyz") as answer:
                        if answer.status == 200:
                            return time.monotonic()
                except (aiohttp.ClientError, TimeoutError, OSError):
                    pass
            await asyncio.sleep(POLL)
    return None


def version_of(implementation: str, base: str) -> str:
    return f"docs/controllers.md mirror.py, {base}" if implementation == "mirror" else base


def _command(cluster: Cluster, implementation: str, namespace: str, port: int) -> list[str]:
    probe = f"127.0.0.1:{port}"
    if implementation == "ours":
        return [
            sys.executable,
            "-m",
            "controllers",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={namespace}",
            "--controllers=task",
            f"--max-concurrent-reconciles={cluster.settings.workers}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address={probe}",
            "--log-level=warning",
        ]
    if implementation == "go":
        assert cluster.go_binary is not None
        return [
            str(cluster.go_binary),
            f"-namespace={namespace}",
            f"-workers={cluster.settings.workers}",
            f"-health-probe-bind-address={probe}",
        ]
    mirror = cluster.settings.logs_dir.parent / "mirror.py"
    mirror.write_text(mirror_program())
    return [sys.executable, str(mirror)]


async def _prepare(transport: Any, implementation: str, namespace: str, n: int) -> Any:
    """N fresh objects in ``namespace`` and a started observer of them."""
    from bench.kube import TaskObserver, create_namespace, create_tasks  # noqa: PLC0415

    if implementation == "mirror":
        await create_configmaps(transport, namespace, n)
        observer: Any = SecretObserver(transport, namespace)
    else:
        await create_namespace(transport, namespace)
        if n:
            await create_tasks(transport, namespace, n)
        observer = TaskObserver(transport, namespace)
    await observer.start()
    return observer


def _done(observer: Any) -> int:
    if isinstance(observer, SecretObserver):
        return len(observer.names)
    return int(observer.reconciled)


def _first(observer: Any) -> float | None:
    if isinstance(observer, SecretObserver):
        return observer.first_at
    times = [t for s in observer.objects.values() for t in s.first_reconciled.values()]
    return min(times) if times else None


async def _create_one(transport: Any, implementation: str, namespace: str) -> float:
    from bench.kube import task_body, tasks_path  # noqa: PLC0415

    created = time.monotonic()
    if implementation == "mirror":
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        await transport.request("POST", path, body=configmap(0))
    else:
        await transport.request("POST", tasks_path(namespace), body=task_body(0))
    return created


async def _until(observer: Any, target: int, child: Child, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _done(observer) < target and time.monotonic() < deadline and child.alive():
        observer.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(observer.changed.wait(), 1.0)


async def run_startup(
    cluster: Cluster, transport: Any, implementation: str, n: int, repeat: int
) -> Result:
    """One start of ``implementation`` on N fresh objects."""
    from bench.harness import _summary  # noqa: PLC0415
    from bench.restart import free_port  # noqa: PLC0415

    namespace = f"bench-start-{implementation}-{cluster.run_id}-{n}-{repeat}"
    observer = await _prepare(transport, implementation, namespace, n)
    port = free_port()
    label = f"startup/{implementation}/{n}"
    child = Child.start(
        implementation,
        _command(cluster, implementation, namespace, port),
        {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        cluster.settings.logs_dir / f"startup-{repeat}-{implementation}-{n}.log",
    )
    url = None if implementation == "mirror" else f"http://127.0.0.1:{port}"
    idle_rss = created = None
    try:
        ready = await _ready_at(child, url, cluster.settings.timeout)
        if ready is None:
            raise RuntimeError(f"{label}: not ready in time:\n{child.log_tail()}")
        if n == 0:
            await asyncio.sleep(IDLE_SETTLE)
            idle_rss = child.rss()
            created = await _create_one(transport, implementation, namespace)
        await _until(observer, max(n, 1), child, cluster.settings.timeout)
        all_at = time.monotonic()
        peak, cpu = child.peak_rss(), child.cpu_seconds()
    finally:
        child.stop()
        await observer.stop()
        if implementation == "mirror":
            # The mirror watches every namespace (and every Secret): leave nothing of this run
            # for the next one to list. No garbage collector runs here to remove the Secrets.
            for kind in ("configmaps", "secrets"):
                path = f"/api/v1/namespaces/{namespace}/{kind}"
                await transport.request("DELETE", path)
    first_at = _first(observer)
    ready_seconds = ready - child.started
    first_seconds = first_at - child.started if first_at is not None and n else None
    seconds = first_seconds if first_seconds is not None else ready_seconds
    base = cluster.base("startup", implementation)
    base["version"] = version_of(implementation, str(base.get("version", "")))
    result: Result = base | {
        "objects": n,
        "seconds": seconds,
        "per_second": 1 / seconds,
        "peak_rss_bytes": peak,
        "cpu_seconds": cpu,
        "ready_seconds": ready_seconds,
        "complete": _done(observer) >= max(n, 1),
        "workers": cluster.settings.workers,
    }
    extra = f", ready {ready_seconds:.2f}s"
    if first_seconds is not None:
        result["first_reconcile_seconds"] = first_seconds
        result["all_reconciled_seconds"] = all_at - child.started
        extra += f", first reconcile {first_seconds:.2f}s"
    if idle_rss is not None:
        result["idle_rss_bytes"] = idle_rss
        extra += f", idle RSS {idle_rss / 2**20:.0f} MiB"
    if created is not None and first_at is not None:
        result["reconcile_after_create_seconds"] = first_at - created
    if not result["complete"]:
        result["objects_done"] = _done(observer)
    _say(f"[{label}] {_summary(result)}{extra}")
    return result


async def run_startup_round(
    cluster: Cluster, transport: Any, implementations: Sequence[str], sizes: Sequence[int]
) -> None:
    """Every implementation at every size, ``--repeat`` times in rotating order; then the
    import breakdown of each Python program (once, appended to its results)."""
    order = [i for i in IMPLEMENTATIONS if i in implementations or i == "mirror"]
    if "go" not in implementations:
        order = [i for i in order if i != "go"]
    precompile()
    breakdown: Mapping[str, dict[str, float]] = {
        name: measure_imports(IMPORTS[name]) for name in order if name in IMPORTS
    }
    for name, parts in breakdown.items():
        shown = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in parts.items())
        _say(f"  imports of {name}: {shown}")
    for repeat in range(cluster.settings.repeat):
        shift = repeat % len(order)
        for n in sizes:
            for implementation in order[shift:] + order[:shift]:
                result = await run_startup(cluster, transport, implementation, n, repeat)
                if implementation in breakdown:
                    result["import_seconds"] = breakdown[implementation]
                cluster.results.append(result)
