"""The programs in docs/controllers.md run as written against the local control plane.

Each fenced block titled ``title="<file>.py"`` is a complete program. The test loads it as a
module and runs its ``main()`` (logging, config loading from ``$KUBECONFIG``, the manager,
signal handling), changing only ``OPTIONS``: the cache limited to the test's namespace, and
metrics and probes off unless the program asks for free ports (fixed ports, the defaults, may
be taken on a shared machine). It stops the program as an operator would, with SIGTERM. The
webhook example is a module and its test: that test runs as the docs say, with pytest and the
library's plugin, in a process of its own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller_runtime import Client, InvalidError, Manager, ManagerOptions, NotFoundError
from controller_runtime.cache import Cache, InformerFactory
from controller_runtime.client import Transport
from controller_runtime.config import load_kubeconfig
from controller_runtime.crdgen import crd_documents, render_all
from controller_runtime.envtest import ControlPlane
from controller_runtime.rbac import cluster_role, record
from controller_runtime.testing import wait_for

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "controllers.md"
PROGRAM = re.compile(r'^```python title="(?P<file>[\w.]+)"\n(?P<code>.*?)^```', re.M | re.S)


def documented_programs() -> dict[str, str]:
    return {m.group("file"): m.group("code") for m in PROGRAM.finditer(DOC.read_text())}


def load(file: str) -> types.ModuleType:
    code = documented_programs()[file]
    name = f"docs_example_{file.removesuffix('.py')}"
    module = types.ModuleType(name)
    module.__file__ = f"docs/controllers.md:{file}"
    sys.modules[name] = module
    exec(compile(code, module.__file__, "exec"), module.__dict__)
    return module


def test_the_mirror_example_fits_in_40_lines_with_one_runtime_import() -> None:
    code = documented_programs()["mirror.py"]
    assert len(code.splitlines()) <= 40
    runtime_imports = re.findall(
        r"^(?:from|import) (?:controller_runtime|kubeclient|informers)\b.*", code, re.M
    )
    assert runtime_imports == ["import controller_runtime as ctrl"]


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
async def watcher(transport: Transport, namespace: str) -> AsyncIterator[Watcher]:
    cache = Cache(InformerFactory(transport), namespaces=[namespace])
    yield Watcher(cache, Client(transport, cache), namespace)
    await cache.stop()


class Watcher:
    """Waits, on watch events rather than by polling, until a cached object passes a check."""

    def __init__(self, cache: Cache, client: Client, namespace: str) -> None:
        self.cache, self.client, self.namespace = cache, client, namespace
        self.changed = asyncio.Event()

    async def watch(self, api_version: str, kind: str) -> None:
        entry = await self.cache.watch(api_version, kind)
        entry.add_handler(lambda delta, initial: self.changed.set())
        await self.cache.wait_for_sync(30)

    async def until(
        self, api_version: str, kind: str, name: str, check: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        last: dict[str, Any] | None = None
        async with asyncio.timeout(60):
            while True:
                self.changed.clear()
                try:
                    last = self.cache.get(api_version, kind, name=name, namespace=self.namespace)
                except NotFoundError:
                    last = None
                if last is not None and check(last):
                    return last
                await self.changed.wait()


def free_port_or_off(address: str | None) -> str | None:
    """The example's address if it asks for a free port (it cannot collide), else off."""
    return address if address is not None and address.endswith(":0") else None


async def run_main(module: types.ModuleType, namespace: str) -> asyncio.Task[None]:
    options: ManagerOptions = module.OPTIONS
    module.OPTIONS = dataclasses.replace(  # type: ignore[attr-defined]
        options,
        namespaces=[namespace],
        metrics_bind_address=free_port_or_off(options.metrics_bind_address),
        health_probe_bind_address=free_port_or_off(options.health_probe_bind_address),
    )
    return asyncio.create_task(module.main())


async def stop(run: asyncio.Task[None]) -> None:
    """SIGTERM, as an operator stops the program; it must end gracefully."""
    if run.done():
        run.result()  # raises what ended it early
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN, None):
        # The program has not reached run_until_signalled (a failure before): a SIGTERM
        # would end the test process itself.
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        return
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(run, 60)


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


async def test_the_mirror_controller_mirrors_follows_and_restores(  # noqa: PLR0917 (fixtures)
    control_plane: ControlPlane,
    watcher: Watcher,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    client = watcher.client
    await watcher.watch("v1", "Secret")
    mirror = load("mirror.py")
    run = await run_main(mirror, namespace)
    try:
        labelled = {"name": "web", "namespace": namespace, "labels": {"app": "demo"}}
        web = await client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": labelled, "data": {"a": "1"}}
        )
        other = {"name": "other", "namespace": namespace, "labels": {"app": "else"}}
        await client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": other})

        secret = await watcher.until("v1", "Secret", "web", lambda s: decoded(s) == {"a": "1"})
        owner = secret["metadata"]["ownerReferences"][0]
        assert owner["uid"] == web["metadata"]["uid"] and owner["controller"] is True

        # It follows changes, removed keys included.
        await client.patch(web, {"data": {"a": None, "b": "2", "c": "3"}})
        await watcher.until("v1", "Secret", "web", lambda s: decoded(s) == {"b": "2", "c": "3"})

        # A deleted Secret comes back (the controller owns it).
        await client.delete("v1", "Secret", name="web", namespace=namespace)
        first_uid = secret["metadata"]["uid"]
        back = await watcher.until(
            "v1", "Secret", "web", lambda s: s["metadata"]["uid"] != first_uid
        )
        assert decoded(back) == {"b": "2", "c": "3"}

        # The ConfigMap without the label was never mirrored.
        with pytest.raises(NotFoundError):
            await client.live.get("v1", "Secret", name="other", namespace=namespace)
    finally:
        await stop(run)
    log = capsys.readouterr().err
    assert re.search(
        rf"mirrored 2 keys controller=configmap-mirror namespace={namespace} object_name=web "
        r"reconcile_id=\S+",
        log,
    ), log
    # Free ports, not make run's 8080/8081, and the log says which were bound.
    bound = re.search(
        r"serving metrics at http://127\.0\.0\.1:(\d+)/metrics, probes at "
        r"http://127\.0\.0\.1:(\d+)/healthz and http://127\.0\.0\.1:\2/readyz",
        log,
    )
    assert bound, log
    assert {int(bound[1]), int(bound[2])}.isdisjoint({0, 8080, 8081})


async def test_the_task_example_keeps_a_summary_and_the_status(  # noqa: PLR0917 (fixtures)
    control_plane: ControlPlane,
    watcher: Watcher,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    tasks = load("tasks.py")
    await watcher.watch("v1", "ConfigMap")
    run = await run_main(tasks, namespace)
    try:
        body = {
            "apiVersion": tasks.TASKS,
            "kind": "Task",
            "metadata": {"name": "report", "namespace": namespace},
            "spec": {"priority": 2},
        }
        task = await watcher.client.create(body)
        await watcher.until(
            "v1", "ConfigMap", "report-summary", lambda c: c["data"]["priority"] == "2"
        )
        await watcher.client.patch(task, {"spec": {"priority": 3}})
        summary = await watcher.until(
            "v1", "ConfigMap", "report-summary", lambda c: c["data"]["priority"] == "3"
        )
        assert summary["data"]["state"] == "Pending"
        assert summary["metadata"]["ownerReferences"][0]["uid"] == task["metadata"]["uid"]
        live = await watcher.client.live.get(
            tasks.TASKS, "Task", name="report", namespace=namespace
        )
        assert live["status"]["state"] == "Pending"
    finally:
        await stop(run)
    assert '"controller":"task-summary"' in capsys.readouterr().err


async def test_the_widget_example_keeps_a_configmap_and_its_status(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    widget = load("widget.py")
    ((name, _, _),) = crd_documents([widget.Widget])
    (tmp_path / name).write_text(render_all([widget.Widget])[name])
    control_plane.install_crds(tmp_path)
    config = await load_kubeconfig(control_plane.kubeconfig)
    options = ManagerOptions(
        namespaces=[namespace], metrics_bind_address=None, health_probe_bind_address=None
    )
    async with Manager(config, options) as manager:
        await widget.setup(manager)
        run = asyncio.create_task(manager.run())
        try:
            client = manager.client
            body = widget.Widget(spec=widget.WidgetSpec(size=3, color="red"))
            body.metadata.name, body.metadata.namespace = "w", namespace
            created = await client.create(body)
            done = await wait_for(
                client,
                widget.Widget,
                name="w",
                namespace=namespace,
                until=lambda w: w.status.observed_generation == created.metadata.generation,
            )
            assert done.status.config_map == "w-widget"
            configmap = await client.live.get(
                "v1", "ConfigMap", name="w-widget", namespace=namespace
            )
            assert configmap["data"] == {"size": "3", "color": "red"}
            assert configmap["metadata"]["ownerReferences"][0]["uid"] == created.metadata.uid
            # The CEL rule, enforced by the API server.
            big = widget.Widget(spec=widget.WidgetSpec(size=20))
            big.metadata.name, big.metadata.namespace = "big", namespace
            with pytest.raises(InvalidError, match="big widgets are blue"):
                await client.create(big)
        finally:
            manager.request_stop()
            await asyncio.wait_for(run, 60)


async def test_the_widget_example_generates_its_rbac() -> None:
    widget = load("widget.py")
    (recorded,) = await record([widget.setup])
    assert recorded.watched == (("shop.example.com", "widgets"), ("", "configmaps"))
    text = cluster_role("widget", [recorded])
    assert "    resources: [widgets/finalizers, widgets/status]\n    verbs: [update]\n" in text
    assert "  # its status; blockOwnerDeletion\n" in text


def test_the_webhook_example_passes_its_documented_test(tmp_path: Path) -> None:
    """``widget_webhooks.py`` and ``test_widget_webhooks.py`` as written, run as the docs say
    (``pytest -p controller_runtime.testing``) in a process of their own: its session control
    plane, WebhookInstallOptions, the plugin's manager serving the webhooks."""
    programs = documented_programs()
    for name in ("widget_webhooks.py", "test_widget_webhooks.py"):
        (tmp_path / name).write_text(programs[name])
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    plugin = ["-p", "controller_runtime.testing", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-v", "test_widget_webhooks.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert re.search(
        r"::test_a_default_lands_a_denial_reaches_the_client_and_v1_converts PASSED",
        result.stdout,
    ), result.stdout
