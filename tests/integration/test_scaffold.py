"""From an empty directory to a green test suite, as a user does it: the library installed
from this checkout's wheel into a clean virtualenv, ``python -m controller_runtime init``
and ``create api`` there, then the project's own ``make test`` (which makes the project's
virtualenv, installs the project against that wheel, checks its manifests and runs its
generated tests on the local control plane) and ``make run`` (its manager on a local control
plane, until SIGTERM). Everything installs offline, from the wheel and the wheel cache.

Also: the generated code is clean for ``ruff`` (check and format) and ``mypy --strict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.packaging_support import child_env, offline_pip_env, run

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def project(library_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scaffold") / "my-operator"
    root.mkdir()
    started = time.monotonic()
    cli: list[str | Path] = [library_venv, "-m", "controller_runtime"]
    run([*cli, "init", "--domain", "example.com", "--name", "my-operator"], cwd=root)
    run([*cli, "create", "api", "--group", "shop", "--version", "v1", "--kind", "Widget"], cwd=root)
    print(f"[scaffold] init + create api: {time.monotonic() - started:.1f}s")
    return root


def test_the_generated_project_passes_make_test(project: Path, library_wheels: list[Path]) -> None:
    started = time.monotonic()
    result = run(
        ["make", "test"],
        cwd=project,
        env={**offline_pip_env(*library_wheels), "PYTHON": sys.executable},
        what="make test in the generated project (its venv, its manifests, its tests)",
    )
    print(f"[scaffold] make test: {time.monotonic() - started:.1f}s")
    assert re.search(r"\b3 passed\b", result.stdout), result.stdout
    assert (project / ".venv" / "bin" / "python").is_file()


async def test_make_run_starts_the_manager_on_a_local_control_plane(project: Path) -> None:
    # After make test: the project's virtualenv exists, so make run starts at once.
    assert (project / ".venv" / ".installed").is_file(), "runs after make test"
    process = await asyncio.create_subprocess_exec(
        "make",
        "run",
        "ARGS=--local=always --metrics-bind-address=0 --health-probe-bind-address=0",
        cwd=project,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(180):
            while not any("caches synced" in line for line in seen):
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise AssertionError("make run ended:\n" + "".join(seen))
                seen.append(line)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)
        await _group_gone(process.pid)
    output = "".join(seen)
    assert "local control plane; kubeconfig:" in output
    assert "caches synced: 1 kinds" in output, output


async def _group_gone(group: int, timeout: float = 60) -> None:
    """Wait until every process of ``group`` ended (make's child, the manager, shuts down
    gracefully after make itself is gone); only a cleanup, so polling is fine."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.1)


def test_the_generated_code_is_lint_and_type_clean(project: Path) -> None:
    for command in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        run([BIN / command[0], *command[1:]], cwd=project)
    result = subprocess.run(
        [BIN / "mypy", "--strict", "my_operator", "tests"],
        cwd=project,
        env={**os.environ, "MYPYPATH": str(project)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout
