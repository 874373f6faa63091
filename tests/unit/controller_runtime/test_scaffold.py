"""Scaffolding's refusals and its text editing (the whole flow, from an empty directory to a
green generated test suite, is tests/integration/test_scaffold.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller_runtime.scaffold import (
    ScaffoldError,
    create_api,
    create_webhook,
    init,
    library_requirement,
)
from controller_runtime.scaffold._project import add_import, from_import, insert_line


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


def test_create_webhook_says_what_is_missing(tmp_path: Path) -> None:
    init(tmp_path, domain="example.com", name="my-operator")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(ScaffoldError, match="--defaulting, --programmatic-validation and/or"):
        create_webhook(tmp_path, group="shop", version="v1", kind="Widget")
    with pytest.raises(ScaffoldError, match=r"no Widget v1: run .*create api .*first"):
        create_webhook(tmp_path, group="shop", version="v1", kind="Widget", validation=True)
    create_api(tmp_path, group="shop", version="v1", kind="Widget")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(ScaffoldError, match=r"Widget has one \(v1\): add another .*--version"):
        create_webhook(tmp_path, group="shop", version="v1", kind="Widget", conversion=True)
    with pytest.raises(ScaffoldError, match=r"in the group shop\.example\.com, not toys"):
        create_webhook(tmp_path, group="toys", version="v1", kind="Widget", defaulting=True)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, "a refusal wrote something"


def test_create_webhook_writes_the_stubs_the_wiring_and_the_configuration(
    tmp_path: Path,
) -> None:
    init(tmp_path, domain="example.com", name="my-operator")
    create_api(tmp_path, group="shop", version="v1", kind="Widget")
    create_api(tmp_path, group="shop", version="v2", kind="Widget")
    written = create_webhook(
        tmp_path,
        group="shop",
        version="v1",
        kind="Widget",
        defaulting=True,
        validation=True,
        conversion=True,
    )
    names = {str(p.relative_to(tmp_path)) for p in written}
    assert {
        "my_operator/webhooks/widget_v1.py",
        "my_operator/webhooks/widget_conversion.py",
        "tests/test_widget_v1_webhook.py",
        "tests/test_widget_conversion.py",
        "config/webhook/manifests.yaml",
        "config/webhook/conversion_widgets.yaml",
    } <= names
    wiring = (tmp_path / "my_operator" / "webhooks" / "__init__.py").read_text()
    assert "        setup_widget_v1_webhook(manager),\n" in wiring
    assert "        setup_widget_conversion(manager),\n" in wiring
    assert "    Widget,\n" in wiring  # CONVERTED: its CRD gets the CA
    converter = (tmp_path / "my_operator" / "webhooks" / "widget_conversion.py").read_text()
    assert "hub=Widget.api_version" in converter
    assert "WidgetV2.api_version: Spoke(to_hub=v2_to_v1, from_hub=v1_to_v2)," in converter
    assert '"controller-runtime-py[webhook]>=' in (tmp_path / "pyproject.toml").read_text()

    webhook = tmp_path / "config" / "webhook"
    mutating, validating = yaml.safe_load_all((webhook / "manifests.yaml").read_text())
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    (hook,) = mutating["webhooks"]
    assert hook["clientConfig"]["service"] == {
        "name": "my-operator-webhook-service",
        "namespace": "my-operator-system",
        "path": "/mutate-shop-example-com-v1-widget",
    }
    assert hook["rules"][0]["resources"] == ["widgets"]
    assert validating["webhooks"][0]["clientConfig"]["service"]["path"] == (
        "/validate-shop-example-com-v1-widget"
    )
    crd = yaml.safe_load((webhook / "conversion_widgets.yaml").read_text())
    assert crd["metadata"]["name"] == "widgets.shop.example.com"
    assert crd["spec"]["conversion"]["strategy"] == "Webhook"
    roles = list(yaml.safe_load_all((webhook / "role.yaml").read_text()))
    named = {n for r in roles for rule in r["rules"] for n in rule.get("resourceNames", [])}
    assert named == {
        "my-operator-webhook-certs",
        mutating["metadata"]["name"],
        validating["metadata"]["name"],
        "widgets.shop.example.com",
    }
    component = yaml.safe_load((webhook / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert "components:\n  - webhook\n" in (tmp_path / "config" / "kustomization.yaml").read_text()

    # Nothing is written twice: the stubs are the user's now.
    with pytest.raises(ScaffoldError, match=r"would overwrite .*widget_v1\.py"):
        create_webhook(tmp_path, group="shop", version="v1", kind="Widget", defaulting=True)


def test_imports_are_added_as_isort_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("# +scaffold:imports\n\nx = 1\n")
    add_import(path, "imports", "pkg.b", "B")
    add_import(path, "imports", "pkg.a", "Alpha")
    add_import(path, "imports", "pkg.a", "func")
    add_import(path, "imports", "pkg.a", "CONST")
    add_import(path, "imports", "pkg.a", "Alpha")
    assert path.read_text() == (
        "# +scaffold:imports\nfrom pkg.a import CONST, Alpha, func\nfrom pkg.b import B\n\nx = 1\n"
    )
    assert from_import("m", ["A" * 50, "B" * 50]) == [
        "from m import (",
        f"    {'A' * 50},",
        f"    {'B' * 50},",
        ")",
    ]


def test_insert_keeps_the_block_sorted_and_needs_its_marker(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    # +scaffold:setups\n    pass\n")
    insert_line(path, "setups", "b()")
    insert_line(path, "setups", "a()")
    insert_line(path, "setups", "a()")
    assert path.read_text() == "def f():\n    # +scaffold:setups\n    a()\n    b()\n    pass\n"
    with pytest.raises(ScaffoldError, match="'# \\+scaffold:imports' line is gone"):
        insert_line(path, "imports", "x")
