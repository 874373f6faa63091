"""The library's distribution, as a user installs it: the wheel built from this checkout holds
the library only (controller_runtime, informers, kubeclient; no operator, no harness, no
PostgreSQL driver), installs offline into a clean virtualenv, and the mirror controller of
docs/controllers.md passes its documented test there, with the library's pytest plugin, on
the local control plane."""

from __future__ import annotations

import ast
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.integration.test_docs_examples import documented_programs
from tests.packaging_support import run, wheel_requirements

pytestmark = pytest.mark.integration

LIBRARY_PACKAGES = {"controller_runtime", "informers", "kubeclient"}


def test_the_wheel_holds_the_library_only(library_wheel: Path) -> None:
    with zipfile.ZipFile(library_wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/", 1)[0] for name in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == LIBRARY_PACKAGES
    assert "controller_runtime/testing/__init__.py" in names  # the pytest plugin
    assert "controller_runtime/py.typed" in names
    assert any(n.startswith("controller_runtime/scaffold/templates/project/") for n in names)
    assert any(n.startswith("controller_runtime/envtest/gomod/kube/") for n in names)
    requirements = wheel_requirements(library_wheel)
    assert not [r for r in requirements if re.match(r"(psycopg|kopf|matplotlib|mypy|ruff)", r)]
    base = [r for r in requirements if "extra ==" not in r]
    assert not [r for r in base if r.startswith(("cryptography", "pytest"))], base


def test_no_module_of_the_wheel_imports_the_operator_the_harness_or_a_driver(
    library_wheel: Path,
) -> None:
    """Not even lazily, inside a function: a path of the library that needs them would fail
    from the install (the local control plane's kine-postgres storage once did)."""
    forbidden = {"controllers", "bench", "tests", "psycopg", "psycopg2", "asyncpg", "kopf"}
    found = []
    with zipfile.ZipFile(library_wheel) as archive:
        for name in archive.namelist():
            if not name.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(archive.read(name), name)):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                found += [
                    f"{name}:{node.lineno} {m}" for m in modules if m.split(".")[0] in forbidden
                ]
    assert not found, found


def test_a_clean_install_has_no_operator_and_no_harness(library_venv: Path) -> None:
    installed = library_venv
    listed = run([installed, "-m", "pip", "list", "--format=freeze"], what="pip list").stdout
    installed_names = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert "controller-runtime-py" in installed_names
    assert not installed_names & {"psycopg", "psycopg-binary", "kopf", "matplotlib"}
    for module in ("controllers", "bench", "tests"):
        probe = subprocess.run(
            [installed, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
        )
        assert probe.returncode != 0, f"{module} is importable from the library's install"
    run([installed, "-c", "import controller_runtime, controller_runtime.testing"], cwd=Path("/"))


def test_the_documented_mirror_test_passes_from_the_install(
    library_venv: Path, tmp_path: Path
) -> None:
    programs = documented_programs()
    for name in ("mirror.py", "test_mirror.py"):
        (tmp_path / name).write_text(programs[name])
    result = run(
        [library_venv, "-m", "pytest", "-p", "controller_runtime.testing", "-q", "test_mirror.py"],
        cwd=tmp_path,
        what="pytest -p controller_runtime.testing test_mirror.py (the docs' test)",
    )
    assert re.search(r"\b1 passed\b", result.stdout), result.stdout
