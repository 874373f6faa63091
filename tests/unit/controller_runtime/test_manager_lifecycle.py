"""The manager opens nothing when created, closes everything on every way out, owns its event
recorders, and bounds a start against an API server it cannot reach. No API server is needed
here: the server address is a loopback port nobody listens on."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from controller_runtime import (
    Controller,
    ControllerBuilder,
    EventRecorderOptions,
    Manager,
    ManagerOptions,
    Request,
    ServerUnreachableError,
)
from kubeclient.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[3]


def options(start_timeout: float | None = 120.0) -> ManagerOptions:
    """Metrics and probes off (nothing to bind)."""
    return ManagerOptions(
        metrics_bind_address=None, health_probe_bind_address=None, start_timeout=start_timeout
    )


def refused_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def nowhere() -> ClusterConfig:
    return ClusterConfig(f"https://127.0.0.1:{refused_port()}", ssl.create_default_context())


async def reconcile(request: Request) -> None:
    return None


async def test_creating_a_manager_opens_nothing() -> None:
    before = asyncio.all_tasks()
    manager = Manager(nowhere(), options())
    assert manager.transport._session is None and manager.transport._watch_session is None
    assert asyncio.all_tasks() == before
    await manager.close()


async def test_close_is_idempotent_and_a_closed_manager_does_not_run() -> None:
    async with Manager(nowhere(), options()) as manager:
        pass
    await manager.close()
    with pytest.raises(RuntimeError, match="create a new one"):
        await manager.run()


async def test_close_stops_the_controllers_and_frees_their_names() -> None:
    async with Manager(nowhere(), options()) as manager:
        with pytest.raises(TypeError, match="is a class"):  # a builder error: nothing taken
            await (
                ControllerBuilder(manager)
                .named("closing")
                .for_("v1", "Pod")
                .complete(
                    Manager  # type: ignore[arg-type]
                )
            )
        manager.add(Controller("closing", reconcile))
        with pytest.raises(ValueError, match="already runs"):
            Controller("closing", reconcile)
    await Controller("closing", reconcile).stop()  # the manager's close freed the name


def test_start_timeout_must_be_positive_or_none() -> None:
    with pytest.raises(ValueError, match="start_timeout"):
        Manager(nowhere(), ManagerOptions(start_timeout=0))
    Manager(nowhere(), ManagerOptions(start_timeout=None))


async def test_the_manager_owns_one_event_recorder_per_name() -> None:
    async with Manager(nowhere(), options()) as manager:
        recorder = manager.event_recorder("crpy.io/demo")
        assert manager.event_recorder("crpy.io/demo") is recorder
        assert recorder.reporting_controller == "crpy.io/demo"
        assert recorder.reporting_instance == socket.gethostname()[:128]
        assert manager.event_recorder("crpy.io/other") is not recorder
        with pytest.raises(ValueError, match="other options"):
            manager.event_recorder("crpy.io/demo", options=EventRecorderOptions(burst=1))
        with pytest.raises(ValueError, match="qualified name"):
            manager.event_recorder("not a name!")


async def test_an_unreachable_api_server_is_reported_at_once_and_the_start_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = nowhere()
    requests: list[int] = []
    async with Manager(config, options(start_timeout=2.0)) as manager:
        manager.transport.on_request = lambda method, path, params, status: requests.append(status)
        first_warning_after: list[int] = []

        class FirstWarning(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if not first_warning_after:
                    first_warning_after.append(len(requests))

        handler = FirstWarning(logging.WARNING)
        logging.getLogger("kubeclient.discovery").addHandler(handler)
        started = time.monotonic()
        try:
            with (
                caplog.at_level(logging.WARNING, logger="kubeclient.discovery"),
                pytest.raises(ServerUnreachableError) as gave_up,
            ):
                await ControllerBuilder(manager).for_("v1", "ConfigMap").complete(reconcile)
        finally:
            logging.getLogger("kubeclient.discovery").removeHandler(handler)
        waited = time.monotonic() - started
    # The first failure is logged after the first request, not after the transport's own
    # retries, and names the server and the reason.
    assert first_warning_after == [1]
    first = caplog.records[0].getMessage()
    assert f"cannot reach the API server {config.server}" in first
    assert "TransportError" in first and "giving up after 2s" in first
    # Bounded: it gave up after start_timeout (generously bounded above: a loaded machine).
    assert 2.0 <= waited < 30.0
    error = gave_up.value
    assert error.server == config.server and error.last is not None and error.attempts >= 1
    assert str(error).startswith(f"cannot reach the API server {config.server}: gave up after 2s")
    assert "\n" not in str(error)


PROGRAM = """
import asyncio, socket, ssl, sys
import controller_runtime as ctrl
from kubeclient.config import ClusterConfig

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    PORT = s.getsockname()[1]
CONFIG = ClusterConfig(f"https://127.0.0.1:{PORT}", ssl.create_default_context())
OPTIONS = ctrl.ManagerOptions(start_timeout=1.0)

class Reconciler:
    async def reconcile(self, request): return None

async def main(case):
    if case == "builder-error-plain":
        manager = ctrl.Manager(CONFIG, OPTIONS)
        await ctrl.ControllerBuilder(manager).for_("v1", "ConfigMap").complete(Reconciler)
    elif case == "builder-error-with":
        async with ctrl.Manager(CONFIG, OPTIONS) as manager:
            await ctrl.ControllerBuilder(manager).for_("v1", "ConfigMap").complete(Reconciler)
    elif case == "unreachable-with":
        async with ctrl.Manager(CONFIG, OPTIONS) as manager:
            await ctrl.ControllerBuilder(manager).for_("v1", "ConfigMap").complete(
                Reconciler()
            )
    elif case == "unreachable-plain":  # no async with, no close(): what the check must see
        manager = ctrl.Manager(CONFIG, OPTIONS)
        await ctrl.ControllerBuilder(manager).for_("v1", "ConfigMap").complete(Reconciler())
    elif case == "recorder-then-error":
        async with ctrl.Manager(CONFIG, OPTIONS) as manager:
            recorder = manager.event_recorder("crpy.io/demo")
            obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}
            recorder.record(obj, "Normal", "Demo", "a note", "Demo")
            raise RuntimeError("the program fails after recording")

asyncio.run(main(sys.argv[1]))
"""


def run_program(tmp_path: Path, case: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM))
    # -X dev: asyncio's debug mode and every ResourceWarning shown (unclosed sockets and
    # transports, coroutines never awaited); aiohttp reports an unclosed session on its own.
    return subprocess.run(
        [sys.executable, "-X", "dev", "-W", "always::ResourceWarning", str(program), case],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )


LEAKS = ("Unclosed", "ResourceWarning", "was never awaited", "Task was destroyed")


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("builder-error-plain", "TypeError: the reconciler Reconciler is a class"),
        ("builder-error-with", "TypeError: the reconciler Reconciler is a class"),
        ("unreachable-with", "ServerUnreachableError: cannot reach the API server"),
        ("recorder-then-error", "RuntimeError: the program fails after recording"),
    ],
)
def test_a_program_that_fails_before_run_leaves_nothing_open(
    tmp_path: Path, case: str, error: str
) -> None:
    done = run_program(tmp_path, case)
    assert done.returncode == 1, done.stderr
    assert error in done.stderr, done.stderr
    for leak in LEAKS:
        assert leak not in done.stderr, done.stderr


def test_the_check_sees_a_session_left_open(tmp_path: Path) -> None:
    # Guards the test above: a manager that opened its connections (the discovery) and is
    # neither run nor closed does leave them open, and the check reports it. (Hence
    # ``async with Manager(...)`` in every example.)
    done = run_program(tmp_path, "unreachable-plain")
    assert "ServerUnreachableError" in done.stderr, done.stderr
    assert "Unclosed client session" in done.stderr, done.stderr
