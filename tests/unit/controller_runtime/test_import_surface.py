"""The public surface is curated, and docs/reference.md is its contract.

``controller_runtime`` exports exactly the names reference.md lists under "What
``controller_runtime`` exports" (what a controller author writes every day); everything else
is in the submodules reference.md lists under "Everything else", each with an ``__all__`` of
exactly the names listed there. The operator
(``controllers/``) and every Python example in ``docs/`` import the runtime only from those:
never from ``kubeclient`` or ``informers``, nor from a module reference.md does not name.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import controller_runtime

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = (ROOT / "docs" / "reference.md").read_text()
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
ROW = re.compile(r"^\| (?P<first>[^|]+) \| (?P<second>[^|]+) \|(?: (?P<third>[^|]+) \|)?$", re.M)
NAME = re.compile(r"`([A-Za-z_][\w.]*)`")


def section(title: str) -> str:
    start = REFERENCE.index(f"{title}\n")
    following = re.search(r"^#{2,3} ", REFERENCE[start + len(title) :], re.M)
    end = start + len(title) + following.start() if following else len(REFERENCE)
    return REFERENCE[start:end]


def documented_top_level() -> list[str]:
    names: list[str] = []
    for row in ROW.finditer(section("## What `controller_runtime` exports")):
        if row.group("third") is None and row.group("first") not in ("for", "---"):
            names += NAME.findall(row.group("second"))
    return names


def documented_submodules() -> dict[str, list[str]]:
    """Module -> the names reference.md says it exports (rows naming two modules split their
    names with ``;``)."""
    out: dict[str, list[str]] = {}
    for row in ROW.finditer(section("### Everything else: the submodules")):
        third = row.group("third")
        if third is None or row.group("first") in ("module", "---"):
            continue
        modules = NAME.findall(row.group("first"))
        groups = third.split(";")
        assert len(groups) in (1, len(modules)), f"row {modules}: one name group per module"
        for index, module in enumerate(modules):
            out[module] = NAME.findall(groups[min(index, len(groups) - 1)])
    return out


TOP_LEVEL = documented_top_level()
SUBMODULES = documented_submodules()
FAMILIES = (
    "controller_runtime.errors",
    "controller_runtime.handlers",
    "controller_runtime.predicates",
    "controller_runtime.util",
)
"""Re-exported whole by the top level (reference.md says so): importable from either."""


def test_the_reference_tables_were_found() -> None:
    # Guards the parsing: if the tables' shape changed, the tests below would pass vacuously.
    assert {"Manager", "ControllerBuilder", "Client", "NotFoundError", "StoreDelta"} <= set(
        TOP_LEVEL
    )
    assert {"controller_runtime.cache", "controller_runtime.patches"} <= set(SUBMODULES)
    assert "ADDED" in SUBMODULES["controller_runtime.cache"]


def test_the_top_level_exports_exactly_what_reference_md_lists() -> None:
    exported = controller_runtime.__all__
    assert len(set(exported)) == len(exported), "a name is exported twice"
    assert len(set(TOP_LEVEL)) == len(TOP_LEVEL), "reference.md lists a name twice"
    undocumented = sorted(set(exported) - set(TOP_LEVEL))
    assert not undocumented, f"exported but not in reference.md's list: {undocumented}"
    missing = sorted(set(TOP_LEVEL) - set(exported))
    assert not missing, f"in reference.md's list but not exported: {missing}"
    for name in exported:
        assert hasattr(controller_runtime, name), name


@pytest.mark.parametrize("module", FAMILIES)
def test_each_family_is_exported_whole(module: str) -> None:
    names = importlib.import_module(module).__all__
    missing = sorted(set(names) - set(controller_runtime.__all__))
    assert not missing, f"{module} exports {missing}, the top level does not"


@pytest.mark.parametrize("module", sorted(SUBMODULES))
def test_each_submodule_exports_exactly_what_reference_md_lists(module: str) -> None:
    imported = importlib.import_module(module)
    public = getattr(imported, "__all__", None)
    assert public is not None, f"{module} has no __all__: curate what it exports"
    documented = SUBMODULES[module]
    assert len(set(documented)) == len(documented), f"reference.md lists a name of {module} twice"
    for name in documented:
        assert hasattr(imported, name), f"{module} has no {name}"
    missing = sorted(set(documented) - set(public))
    assert not missing, f"{module}: documented but not in its __all__: {missing}"
    undocumented = sorted(set(public) - set(documented))
    assert not undocumented, f"{module}: exported but not in reference.md: {undocumented}"


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("ADDED", "controller_runtime.cache"),
        ("InformerFactory", "controller_runtime.cache"),
        ("LabelSelector", "controller_runtime.cache"),
        ("Transport", "controller_runtime.client"),
        ("ClusterConfig", "controller_runtime.config"),
        ("merge_patch", "controller_runtime.patches"),
        ("add_finalizer_patch", "controller_runtime.patches"),
        ("WorkQueue", "controller_runtime.workqueue"),
        ("ShardRingConfig", "controller_runtime.sharding"),
        ("current_reconcile", "controller_runtime.reconcile"),
    ],
)
def test_low_level_names_live_in_their_submodule_only(name: str, module: str) -> None:
    assert name not in controller_runtime.__all__
    assert name in SUBMODULES[module]


@pytest.mark.parametrize(
    "name",
    [
        "Manager",
        "ManagerOptions",
        "run_until_signalled",
        "Client",
        "load_config",
        "Request",
        "Result",
        "ControllerBuilder",
        "GenerationChanged",
        "EnqueueRequestsFromMapFunc",
        "ByObject",
        "set_controller_reference",
        "NotFoundError",
        "ConflictError",
        "AlreadyExistsError",
        "ignore_not_found",
        "configure_logging",
        "StoreDelta",
        "EventRecorder",
    ],
)
def test_what_a_controller_author_needs_is_exported(name: str) -> None:
    assert name in controller_runtime.__all__


# -- what the operator and the docs import ---------------------------------------------------


def python_blocks(markdown: str) -> Iterator[tuple[int, str]]:
    """``(line, code)`` of each fenced python block, its indentation removed."""
    for match in FENCE.finditer(markdown):
        indent = match.group("indent")
        body = match.group("body")
        lines = [line.removeprefix(indent) for line in body.splitlines()]
        yield markdown[: match.start()].count("\n") + 2, "\n".join(lines) + "\n"


def imports(tree: ast.AST) -> Iterator[tuple[int, str, list[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


def forbidden(module: str) -> bool:
    top = module.split(".", maxsplit=1)[0]
    if top in ("kubeclient", "informers"):
        return True
    if top != "controller_runtime" or module == "controller_runtime":
        return False
    if module in FAMILIES:
        return False  # but not the modules behind them (controller_runtime.util.finalizers)
    return not any(module == m or module.startswith(f"{m}.") for m in SUBMODULES)


def sources() -> Iterator[tuple[str, ast.AST]]:
    for path in sorted((ROOT / "controllers").rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text())
    for path in sorted((ROOT / "docs").glob("*.md")):
        for line, code in python_blocks(path.read_text()):
            # Snippets may use top-level await (as in an asyncio REPL).
            flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            tree = compile(code, f"{path.name}:{line}", "exec", flags)
            yield f"{path.relative_to(ROOT)}:{line}", tree


SOURCES = list(sources())


def test_the_docs_have_python_examples_to_check() -> None:
    # Guards the extraction itself: if the fence pattern broke, the tests below would pass
    # vacuously.
    documented = {name.split(":")[0] for name, _ in SOURCES if name.startswith("docs/")}
    assert {"docs/controllers.md", "docs/helpers.md", "docs/manager.md"} <= documented


@pytest.mark.parametrize(("where", "tree"), SOURCES, ids=[name for name, _ in SOURCES])
def test_imports_come_only_from_the_documented_surface(where: str, tree: ast.AST) -> None:
    wrong = [f"line {line}: {module}" for line, module, _ in imports(tree) if forbidden(module)]
    assert not wrong, f"{where} imports below the public surface: {wrong}"
    exported = set(controller_runtime.__all__)
    for line, module, names in imports(tree):
        if module == "controller_runtime":
            missing = sorted(set(names) - exported)
            assert not missing, f"{where} line {line}: controller_runtime does not export {missing}"
        elif module in SUBMODULES or module in FAMILIES:
            public = getattr(importlib.import_module(module), "__all__", None)
            hidden = sorted(set(names) - set(public)) if public is not None else []
            assert not hidden, f"{where} line {line}: {module} does not export {hidden}"
    # ``import controller_runtime as ctrl``: every ``ctrl.X`` must be exported too.
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "controller_runtime"
    }
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
    }
    assert used <= exported, f"{where}: controller_runtime does not export {used - exported}"
