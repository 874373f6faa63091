"""What the scaffolding commands share: a project's identity (``PROJECT.toml``), templates,
writing files without overwriting any, and editing code at the ``# +scaffold:`` markers."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
_VARIABLE = re.compile(r"\{\{(\w+)\}\}")
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
VERSION = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
GROUP = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ScaffoldError(ValueError):
    """The command cannot do what was asked; the message says why and what to do."""


def render(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every ``{{name}}`` replaced; an unknown name is a bug here."""

    def replace(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return _VARIABLE.sub(replace, template)


def write_all(root: Path, files: Mapping[str, str]) -> list[Path]:
    in_the_way = sorted(name for name in files if (root / name).exists())
    if in_the_way:
        raise ScaffoldError(f"{root}: would overwrite {', '.join(in_the_way)}; nothing was written")
    written = []
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def templates_in(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): path.read_text()
        for path in sorted(directory.rglob("*.tmpl"))
    }


@dataclass(frozen=True)
class Project:
    root: Path
    domain: str
    name: str
    package: str


def project_at(root: Path) -> Project:
    path = root / "PROJECT.toml"
    try:
        import tomllib  # noqa: PLC0415 (only here)

        data = tomllib.loads(path.read_text())
        return Project(root, data["domain"], data["name"], data["package"])
    except (OSError, KeyError) as err:
        raise ScaffoldError(
            f"{root} is not a project made by `python -m controller_runtime init` "
            f"({path.name}: {err}); run init first, or pass --dir"
        ) from None


def from_import(module: str, names: Sequence[str], limit: int = 88) -> list[str]:
    """``from module import names`` as isort (and ruff) format it: on one line when it fits
    in ``limit`` columns, else one name per line in parentheses."""
    one = f"from {module} import {', '.join(names)}"
    if len(one) <= limit:
        return [one]
    return [f"from {module} import (", *(f"    {n}," for n in names), ")"]


def marker_block(
    lines: list[str], marker: str, path: Path, *, closing: str = "])"
) -> tuple[int, int, str]:
    """``(first line after the marker, end of its block, indent)``: the block is the lines
    under ``# +scaffold:<marker>`` up to a blank line or a line starting with one of
    ``closing``."""
    mark = re.compile(rf"^(?P<indent>[ \t]*)# \+scaffold:{marker}$")
    for at, text in enumerate(lines):
        found = mark.match(text)
        if found is not None:
            end = at + 1
            while end < len(lines) and lines[end].strip() and lines[end].strip()[0] not in closing:
                end += 1
            return at + 1, end, found.group("indent")
    raise ScaffoldError(f"{path}: the '# +scaffold:{marker}' line is gone; put it back")


def add_import(path: Path, marker: str, module: str, name: str) -> None:
    """Add ``from module import name`` to the imports under the marker, merged and sorted as
    isort would write them."""
    lines = path.read_text().splitlines()
    start, end, _ = marker_block(lines, marker, path, closing="")
    imported: dict[str, list[str]] = {}
    for node in ast.parse("\n".join(lines[start:end])).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.setdefault(node.module, []).extend(a.name for a in node.names)
    names = imported.setdefault(module, [])
    if name not in names:
        names.append(name)
    block = [
        line
        for key in sorted(imported)
        for line in from_import(key, sorted(imported[key], key=isort_key))
    ]
    lines[start:end] = block
    path.write_text("\n".join(lines) + "\n")


def isort_key(name: str) -> tuple[int, str]:
    # isort's default order within an import: CONSTANTS, Classes, functions.
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return (kind, name)


def insert_line(path: Path, marker: str, line: str) -> None:
    """Add ``line`` to the block under ``# +scaffold:<marker>`` (indented like the marker),
    keeping the block sorted, once."""
    lines = path.read_text().splitlines()
    start, end, indent = marker_block(lines, marker, path)
    entry = f"{indent}{line}"
    if entry not in lines[start:end]:
        lines[start:end] = sorted([*lines[start:end], entry])
        path.write_text("\n".join(lines) + "\n")


def regenerate(root: Path) -> None:
    """Regenerate the manifests in a fresh interpreter (the project's modules just changed)."""
    result = subprocess.run(
        [sys.executable, "-m", "controller_runtime", "manifests", "--dir", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ScaffoldError(f"generating the manifests failed:\n{result.stderr.strip()}")
