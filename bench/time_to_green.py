"""From an empty directory to a green generated test suite: how long it takes.

    python -m bench.time_to_green [--cold] [--json FILE]

The steps a user takes (docs/controllers.md), timed one by one: the library's wheel built
from this checkout (a user downloads it instead), a virtualenv with the library installed,
``python -m controller_runtime init`` and ``create api``, then the project's ``make test``
(its own virtualenv, the project installed, the manifests checked, its tests on a local
control plane). Installs take packages from a wheel cache only (``--no-index``); ``--cold``
fills a fresh one from the package index first, with pip's own cache off, as on a machine
that never installed them. The control-plane binaries are taken as built (once per machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Sequence
from pathlib import Path

from controller_runtime.envtest import cache_root

ROOT = Path(__file__).resolve().parents[1]


def _run(command: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.time_to_green")
    parser.add_argument("--cold", action="store_true", help="fill a fresh wheel cache first")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    steps: list[tuple[str, float]] = []

    def step(name: str, started: float) -> None:
        steps.append((name, time.monotonic() - started))
        print(f"  {name}: {steps[-1][1]:.1f}s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started = time.monotonic()
        dist = work / "dist"
        pip = [sys.executable, "-m", "pip"]
        _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, ROOT], cwd=ROOT)
        (wheel,) = dist.glob("controller_runtime_py-*.whl")
        step("build the library's wheel", started)

        if args.cold:
            wheels = work / "wheels"
            started = time.monotonic()
            requirement = f"controller-runtime-py[testing]=={wheel.name.split('-')[1]}"
            _run(
                [
                    *pip,
                    "download",
                    "-q",
                    "--only-binary=:all:",
                    "-d",
                    wheels,
                    "--find-links",
                    dist,
                    requirement,
                    "setuptools>=77",
                    "wheel",
                ],
                cwd=work,
                env={"PIP_NO_CACHE_DIR": "1"},
            )
            step("download the dependencies (cold: no wheel cache, no pip cache)", started)
        else:
            complete = sorted(cache_root().glob("wheels/*/.complete"))
            if not complete:
                raise SystemExit("no wheel cache yet: run the packaging tests, or --cold")
            wheels = complete[-1].parent
        offline = {
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": f"{dist} {wheels}",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        }

        started = time.monotonic()
        venv.create(work / "tools", with_pip=True)
        python = work / "tools" / "bin" / "python"
        _run([python, "-m", "pip", "install", "-q", "controller-runtime-py"], cwd=work, env=offline)
        step("a virtualenv with the library", started)

        project = work / "my-operator"
        project.mkdir()
        started = time.monotonic()
        cli: list[str | Path] = [python, "-m", "controller_runtime"]
        _run([*cli, "init", "--domain", "example.com", "--name", "my-operator"], cwd=project)
        _run(
            [*cli, "create", "api", "--group", "shop", "--version", "v1", "--kind", "Widget"],
            cwd=project,
        )
        step("init and create api", started)

        started = time.monotonic()
        _run(["make", "test"], cwd=project, env={**offline, "PYTHON": sys.executable})
        step("make test (the project's virtualenv, its manifests, its 3 tests)", started)

    total = sum(seconds for _, seconds in steps)
    print(f"  total: {total:.1f}s")
    if args.json:
        args.json.write_text(json.dumps({"cold": args.cold, "steps": steps, "total": total}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
