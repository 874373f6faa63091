"""The operator's command line as a person meets it: --help and bad flags answer before
anything starts, and a busy metrics or probe port ends in one line naming the flag to change,
not a traceback."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller_runtime.envtest import ControlPlane

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """Exit status, stdout, stderr and seconds taken of ``python -m <args>``."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def nothing_configured(tmp_path: Path) -> dict[str, str]:
    """No cluster configured and no control-plane binaries: anything that tried to start
    would fail differently from the argument parser (status 2)."""
    return {
        "HOME": str(tmp_path),
        "KUBECONFIG": "",
        "KUBEBUILDER_ASSETS": str(tmp_path / "no-binaries"),
    }


@pytest.mark.parametrize("module", ["controllers", "controllers.dev"])
async def test_help_answers_at_once(module: str, tmp_path: Path) -> None:
    env = {**nothing_configured(tmp_path), "PYTHONPROFILEIMPORTTIME": "1"}
    code, out, err, took = await run(module, "--help", env=env)
    assert code == 0, err
    assert f"usage: python -m {module}" in out
    assert "--metrics-bind-address" in out and "--health-probe-bind-address" in out
    assert "kubeconfig:" not in out  # no control plane was started
    # Nothing heavy was even imported: the flags are read first (-X importtime lists every
    # import on stderr).
    imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if "|" in line}
    assert "controllers.cli" in imported
    assert not {m for m in imported if m.split(".")[0] in ("controller_runtime", "aiohttp")}
    assert took < 60, took  # generous: the machine is shared


@pytest.mark.parametrize("module", ["controllers", "controllers.dev"])
async def test_a_bad_flag_is_refused_before_anything_starts(module: str, tmp_path: Path) -> None:
    code, out, err, _ = await run(module, "--no-such-flag", env=nothing_configured(tmp_path))
    assert code == 2, (out, err)
    assert "unrecognized arguments: --no-such-flag" in err
    assert "Traceback" not in err and "kubeconfig:" not in out


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--health-probe-bind-address", "0"], "--metrics-bind-address"),
        (["--metrics-bind-address", "0"], "--health-probe-bind-address"),
    ],
)
async def test_a_busy_port_ends_in_one_line_naming_the_flag(
    control_plane: ControlPlane, busy_port: int, flags: list[str], named: str
) -> None:
    address = f"127.0.0.1:{busy_port}"
    # The endpoint that is not turned off gets the busy address.
    endpoint_flag = named
    code, _, err, _ = await run(
        "controllers",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--controllers",
        "task",
        *flags,
        endpoint_flag,
        address,
    )
    assert code == 1, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1, err
    assert f"on {address}: the address is already in use" in errors[0]
    assert f"{named}=HOST:PORT" in errors[0]


async def test_the_operator_logs_where_metrics_and_probes_listen(
    control_plane: ControlPlane,
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "controllers",
        "--kubeconfig",
        str(control_plane.kubeconfig),
        "--controllers",
        "task",
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--health-probe-bind-address",
        "127.0.0.1:0",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(120):
            while b"serving metrics at" not in (line := await proc.stderr.readline()):
                assert line, "the operator ended without saying where it serves"
        found = re.search(
            r"serving metrics at (http://\S+/metrics), probes at (http://\S+/healthz) and ",
            line.decode(),
        )
        assert found, line
        for url in found.groups():
            status, _ = await asyncio.to_thread(fetch, url)
            assert status == 200, url
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def fetch(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.status, answer.read()
