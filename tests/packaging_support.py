"""The library as a user gets it: its wheel built from this checkout, a wheel cache of its
dependencies, and fresh virtualenvs that install from those two directories only.

The wheel cache (``<cache>/wheels/<key>``) is filled from the package index the first time
(``pip download``: the cold case, about a minute) and reused afterwards, keyed by the
library's requirements and the Python version, so every later install is offline
(``--no-index``). Timings of each step are printed (``-s`` shows them).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from controller_runtime.envtest import cache_root

ROOT = Path(__file__).resolve().parents[1]
EXTRA_WHEELS = ("setuptools>=77", "wheel")
"""Built by pip when it installs a project (the scaffolded one) from source."""

OUTER_MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
"""What a ``make`` running this suite exports to its children besides the variables set on its
command line (:func:`outer_make_overrides`)."""


def outer_make_overrides(makeflags: str) -> set[str]:
    """Names of the variables set on an outer make's command line, read from its
    ``MAKEFLAGS`` (``s -- TESTS=x\\ y PYTEST_ARGS=-rs``: after ``--``, one ``NAME=value`` per
    word, spaces in a value escaped with a backslash)."""
    _, separator, assignments = makeflags.partition("-- ")
    if not separator:
        return set()
    names = set()
    for word in re.split(r"(?<!\\) ", assignments):
        name, equals, _ = word.partition("=")
        if equals and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            names.add(name)
    return names


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, plus ``extra``, without what a ``make`` running this suite
    handed down: a project's own ``make`` must not inherit the suite's command-line variables
    (GNU make exports them; ``make test PYTEST_ARGS=--timeout=300`` would hand ``--timeout``
    to the scaffolded project's pytest, which has no such option)."""
    dropped = {*OUTER_MAKE_VARIABLES, *outer_make_overrides(os.environ.get("MAKEFLAGS", ""))}
    kept = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**kept, **(extra or {})}


def run(
    command: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
    what: str = "",
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; fail with its output when it fails. Prints how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    took = time.monotonic() - started
    print(f"[packaging] {what or ' '.join(map(str, command[:4]))}: {took:.1f}s")
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, command))} failed ({result.returncode}) in {cwd}:\n"
            f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        )
    return result


def build_wheel(out: Path) -> Path:
    """The library's wheel, built from this checkout (no isolated build environment: the
    dev environment's setuptools)."""
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            out,
            ROOT,
        ],
        what="build the library's wheel",
    )
    (wheel,) = out.glob("controller_runtime_py-*.whl")
    return wheel


def wheel_requirements(wheel: Path) -> list[str]:
    """``Requires-Dist`` of the wheel's metadata."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def wheel_cache(wheel: Path) -> Path:
    """Wheels of everything ``controller-runtime-py[testing]`` needs (and of what pip needs
    to build a project), downloaded once per set of requirements."""
    requirements = sorted(wheel_requirements(wheel))
    key_text = "\n".join([sys.version.split()[0], *requirements, *EXTRA_WHEELS])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:12]
    directory = cache_root() / "wheels" / key
    if (directory / ".complete").is_file():
        return directory
    partial = directory.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            partial,
            "--find-links",
            wheel.parent,
            f"controller-runtime-py[testing]=={wheel.name.split('-')[1]}",
            *EXTRA_WHEELS,
        ],
        what="download the dependencies' wheels (cold cache)",
    )
    for own in partial.glob("controller_runtime_py-*.whl"):
        own.unlink()
    (partial / ".complete").write_text(key_text)
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    return directory


def offline_pip_env(*find_links: Path) -> dict[str, str]:
    """pip settings that install from these directories only."""
    return {
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": " ".join(str(d) for d in find_links),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def fresh_venv(directory: Path) -> Path:
    """A new virtualenv (with pip, nothing else); its python."""
    started = time.monotonic()
    venv.create(directory, with_pip=True, clear=True)
    print(f"[packaging] create a virtualenv: {time.monotonic() - started:.1f}s")
    return directory / "bin" / "python"
