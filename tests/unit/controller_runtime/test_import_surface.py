"""One way in: the operator (``controllers/``) and every Python example in ``docs/`` import the
runtime only from ``controller_runtime`` itself, and that package exports what they use.

The layers underneath (``kubeclient``, ``informers``, ``controller_runtime.<module>``) stay
importable, but a controller author should never need them; this test keeps it so.
``controller_runtime.envtest`` (the local control plane, a tool rather than the library) is the
one allowed sub-package, as ``envtest`` is in Go's controller-runtime.
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
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)


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
    return (
        top == "controller_runtime"
        and module != "controller_runtime"
        and not module.startswith("controller_runtime.envtest")
    )


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
def test_imports_come_only_from_the_controller_runtime_package(where: str, tree: ast.AST) -> None:
    wrong = [f"line {line}: {module}" for line, module, _ in imports(tree) if forbidden(module)]
    assert not wrong, f"{where} imports below the public surface: {wrong}"
    exported = set(controller_runtime.__all__)
    for line, module, names in imports(tree):
        if module == "controller_runtime":
            missing = sorted(set(names) - exported)
            assert not missing, f"{where} line {line}: controller_runtime does not export {missing}"
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


@pytest.mark.parametrize("module", ["controller_runtime.util", "controller_runtime.errors"])
def test_every_helper_and_api_error_is_re_exported(module: str) -> None:
    names = set(importlib.import_module(module).__all__)
    missing = sorted(names - set(controller_runtime.__all__))
    assert not missing, f"add {missing} (from {module}) to controller_runtime/__init__.py"


def test_everything_exported_exists() -> None:
    assert len(set(controller_runtime.__all__)) == len(controller_runtime.__all__)
    for name in controller_runtime.__all__:
        assert hasattr(controller_runtime, name), name


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
    ],
)
def test_what_a_controller_author_needs_is_exported(name: str) -> None:
    assert name in controller_runtime.__all__
