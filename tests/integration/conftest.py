"""Fixtures of the packaging and scaffolding tests: the library's wheel, built once per
session, and a clean virtualenv with it installed offline (see tests/packaging_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packaging_support import build_wheel, fresh_venv, offline_pip_env, run, wheel_cache


@pytest.fixture(scope="session")
def library_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library's wheel, built from this checkout."""
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def library_wheels(library_wheel: Path) -> list[Path]:
    """Where pip finds the library and every dependency, offline."""
    return [library_wheel.parent, wheel_cache(library_wheel)]


@pytest.fixture(scope="session")
def library_venv(
    library_wheel: Path, library_wheels: list[Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A clean virtualenv with ``controller-runtime-py[testing]`` installed from the wheel;
    its python."""
    python = fresh_venv(tmp_path_factory.mktemp("venv") / "venv")
    run(
        [python, "-m", "pip", "install", "--quiet", f"{library_wheel}[testing]"],
        env=offline_pip_env(*library_wheels),
        what="install the library's wheel offline",
    )
    return python
