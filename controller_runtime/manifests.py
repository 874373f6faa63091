"""``python -m controller_runtime manifests``: a project's generated manifests, from its code.

What is generated, and from what, is in the project's ``pyproject.toml``::

    [tool.controller-runtime]
    resources = ["my_operator.api"]                 # modules with @crd classes
    crd-dir = "config/crd"                          # one YAML file per CRD
    setup = ["my_operator.controllers:setup"]       # async def setup(manager), each
    role = "config/rbac/role.yaml"                  # the ClusterRole of the controllers
    role-name = "my-operator-manager"
    declarations = "my_operator.permissions"        # optional: DECLARED, SECTIONS, HEADER
    leader-election-role = "config/rbac/leader-election-role.yaml"   # optional
    leader-election-role-name = "my-operator-leader-election"
    namespace = "my-operator-system"
    files = ["my_operator.permissions:other_manifests"]   # optional: more generated files

``files`` names functions (``module:function``, sync or async, no arguments) returning
``{path relative to the project: text}``: manifests the code knows best that are none of the
above (a Role for a shard ring, :func:`~controller_runtime.rbac.shard_ring_role`, ...).
``declarations`` names a module with any of: ``DECLARED`` (controller name → rules it needs
beyond its watches, for reconcilers that do not carry
:func:`~controller_runtime.rbac.permissions` themselves), ``SECTIONS`` (rules of no one
controller) and ``HEADER`` (the role file's comment). Paths are relative to the project.

``--check`` writes nothing and exits 1 naming what is stale: the test a project runs so that
committed manifests and code never disagree.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller_runtime import crdgen, rbac

__all__ = ["Project", "ProjectError", "generate", "load_project", "write"]


class ProjectError(ValueError):
    """The project's configuration is missing or wrong; the message says what to add."""


@dataclass(frozen=True)
class Project:
    """A project's ``[tool.controller-runtime]`` table, paths resolved."""

    root: Path
    resources: tuple[str, ...] = ()
    crd_dir: Path | None = None
    setup: tuple[str, ...] = ()
    role: Path | None = None
    role_name: str = ""
    declarations: str = ""
    leader_election_role: Path | None = None
    leader_election_role_name: str = ""
    namespace: str = ""
    files: tuple[str, ...] = ()


def load_project(root: Path) -> Project:
    """Read ``root/pyproject.toml``'s ``[tool.controller-runtime]``."""
    path = root / "pyproject.toml"
    try:
        table = tomllib.loads(path.read_text())["tool"]["controller-runtime"]
    except (OSError, KeyError) as err:
        raise ProjectError(f"{path} has no [tool.controller-runtime] table ({err})") from None
    known = {f.name.replace("_", "-") for f in dataclasses.fields(Project)} - {"root"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ProjectError(
            f"[tool.controller-runtime]: unknown keys {unknown}; known: {sorted(known)}"
        )

    def path_of(key: str) -> Path | None:
        value = table.get(key)
        return (root / value) if value else None

    project = Project(
        root=root,
        resources=tuple(table.get("resources", ())),
        crd_dir=path_of("crd-dir"),
        setup=tuple(table.get("setup", ())),
        role=path_of("role"),
        role_name=table.get("role-name", ""),
        declarations=table.get("declarations", ""),
        leader_election_role=path_of("leader-election-role"),
        leader_election_role_name=table.get("leader-election-role-name", ""),
        namespace=table.get("namespace", ""),
        files=tuple(table.get("files", ())),
    )
    if project.resources and project.crd_dir is None:
        raise ProjectError("[tool.controller-runtime]: resources needs crd-dir")
    if project.role is not None and not (project.setup and project.role_name):
        raise ProjectError("[tool.controller-runtime]: role needs setup and role-name")
    if project.leader_election_role is not None and not (
        project.leader_election_role_name and project.namespace
    ):
        raise ProjectError(
            "[tool.controller-runtime]: leader-election-role needs leader-election-role-name "
            "and namespace"
        )
    return project


def _reference(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    if not attribute:
        raise ProjectError(f"{reference!r} should be module:function")
    return getattr(importlib.import_module(module), attribute)


async def generate(project: Project) -> tuple[dict[Path, dict[str, str]], dict[Path, str]]:
    """What the project's code gives: ``({crd directory: {file name: text}}, {file: text})``."""
    directories: dict[Path, dict[str, str]] = {}
    files: dict[Path, str] = {}
    if project.resources and project.crd_dir is not None:
        directories[project.crd_dir] = crdgen.render_all(crdgen.discover(project.resources))
    if project.role is not None:
        declarations = (
            importlib.import_module(project.declarations) if project.declarations else None
        )
        declared: Mapping[str, Sequence[rbac.Rule]] = getattr(declarations, "DECLARED", {})
        sections: Sequence[rbac.Section] = getattr(declarations, "SECTIONS", ())
        header: str = getattr(declarations, "HEADER", "")
        recorded = await rbac.record([_reference(r) for r in project.setup])
        names = {c.name for c in recorded}
        unknown = sorted(set(declared) - names)
        if unknown:
            raise ProjectError(
                f"{project.declarations}.DECLARED names controllers that setup does not "
                f"create: {unknown} (created: {sorted(names)})"
            )
        controllers = [
            dataclasses.replace(c, declared=(*c.declared, *declared.get(c.name, ())))
            for c in recorded
        ]
        files[project.role] = rbac.cluster_role(
            project.role_name, controllers, sections=sections, header=header
        )
    if project.leader_election_role is not None:
        files[project.leader_election_role] = rbac.leader_election_role(
            project.leader_election_role_name,
            project.namespace,
            header="Leader election on a coordination.k8s.io Lease in the operator's own "
            "namespace only.\nGenerated by `make manifests`.",
        )
    for reference in project.files:
        produced = _reference(reference)()
        if inspect.isawaitable(produced):
            produced = await produced
        for relative, text in produced.items():
            path = project.root / relative
            if path in files:
                raise ProjectError(f"{reference} generates {relative}, which is generated twice")
            files[path] = text
    return directories, files


def write(
    directories: Mapping[Path, Mapping[str, str]], files: Mapping[Path, str], *, check: bool
) -> list[str]:
    """Bring the files up to date (or, with ``check``, only list what is stale)."""
    stale: list[str] = []
    for directory, texts in directories.items():
        stale += [
            str(directory / n.lstrip("-")) for n in crdgen.sync(texts, directory, check=check)
        ]
    for path, text in files.items():
        if not path.is_file() or path.read_text() != text:
            stale.append(str(path))
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale


async def run(root: Path, *, check: bool) -> int:
    """The command: regenerate (or check) ``root``'s manifests; the exit status."""
    sys.path.insert(0, str(root))
    try:
        project = load_project(root)
        directories, files = await generate(project)
    except (ProjectError, crdgen.CrdError, crdgen.SchemaError, ImportError) as err:
        print(f"manifests: {err}", file=sys.stderr)
        return 2
    stale = write(directories, files, check=check)
    if check and stale:
        print(
            "manifests: out of date, run `python -m controller_runtime manifests`: "
            + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    for path in [] if check else stale:
        print(f"wrote {path}")
    return 0
