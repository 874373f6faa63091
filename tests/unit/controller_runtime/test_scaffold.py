"""Scaffolding's refusals and its text editing (the whole flow, from an empty directory to a
green generated test suite, is tests/integration/test_scaffold.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller_runtime.scaffold import (
    ScaffoldError,
    _add_import,
    _from_import,
    _insert,
    create_api,
    create_webhook,
    init,
    library_requirement,
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    init(root, domain="example.com", name="my-operator")
    return root


def test_init_writes_a_project_and_refuses_to_overwrite_it(project: Path) -> None:
    for name in (
        "pyproject.toml",
        "Makefile",
        "Dockerfile",
        "README.md",
        "my_operator/__main__.py",
    ):
        assert (project / name).is_file(), name
    assert library_requirement() in (project / "pyproject.toml").read_text()
    with pytest.raises(ScaffoldError, match=r"would overwrite .*nothing was written"):
        init(project, domain="example.com", name="my-operator")


@pytest.mark.parametrize(
    ("domain", "name", "message"),
    [
        ("example.com", "My_Operator", "--name"),
        ("localhost", "my-operator", "--domain"),
        ("example.com", "json", "shadows a Python module"),
    ],
)
def test_init_refuses_bad_names(tmp_path: Path, domain: str, name: str, message: str) -> None:
    with pytest.raises(ScaffoldError, match=message):
        init(tmp_path, domain=domain, name=name)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("group", "version", "kind", "message"),
    [
        ("Shop", "v1", "Widget", "--group"),
        ("shop", "1", "Widget", "--version"),
        ("shop", "v1", "widget", "--kind"),
    ],
)
def test_create_api_refuses_bad_names(
    project: Path, group: str, version: str, kind: str, message: str
) -> None:
    with pytest.raises(ScaffoldError, match=message):
        create_api(project, group=group, version=version, kind=kind)


def test_create_api_needs_a_project(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="run init first"):
        create_api(tmp_path, group="shop", version="v1", kind="Widget")


def test_create_webhook_says_what_is_missing(project: Path) -> None:
    with pytest.raises(ScaffoldError, match="--defaulting, --validation and/or --conversion"):
        create_webhook(project, group="shop", version="v1", kind="Widget")
    with pytest.raises(ScaffoldError, match=r"nothing was written: register .*WebhookBuilder"):
        create_webhook(project, group="shop", version="v1", kind="Widget", validation=True)


def test_imports_are_added_as_isort_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("# +scaffold:imports\n\nx = 1\n")
    _add_import(path, "imports", "pkg.b", "B")
    _add_import(path, "imports", "pkg.a", "Alpha")
    _add_import(path, "imports", "pkg.a", "func")
    _add_import(path, "imports", "pkg.a", "CONST")
    _add_import(path, "imports", "pkg.a", "Alpha")
    assert path.read_text() == (
        "# +scaffold:imports\nfrom pkg.a import CONST, Alpha, func\nfrom pkg.b import B\n\nx = 1\n"
    )
    assert _from_import("m", ["A" * 50, "B" * 50]) == [
        "from m import (",
        f"    {'A' * 50},",
        f"    {'B' * 50},",
        ")",
    ]


def test_insert_keeps_the_block_sorted_and_needs_its_marker(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    # +scaffold:setups\n    pass\n")
    _insert(path, "setups", "b()")
    _insert(path, "setups", "a()")
    _insert(path, "setups", "a()")
    assert path.read_text() == "def f():\n    # +scaffold:setups\n    a()\n    b()\n    pass\n"
    with pytest.raises(ScaffoldError, match="'# \\+scaffold:imports' line is gone"):
        _insert(path, "imports", "x")
