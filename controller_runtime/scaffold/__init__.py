"""Project scaffolding: ``init``, ``create api`` and ``create webhook``, kubebuilder's workflow.

``init`` writes a project that runs (``make run``) and tests itself on a local control plane
(``make test``) before a single line is added: ``pyproject.toml`` depending on this library,
a ``Makefile``, the manager's entry point, ``config/`` for kustomize (CRDs, RBAC, the
Deployment under Pod Security "restricted", a metrics Service), a ``Dockerfile``, a README and
tests. ``create api`` adds a typed resource, its controller (wired into ``setup``), a test that
sees a new object reconciled, and regenerates the CRD and the RBAC.

Guarantees: nothing existing is overwritten (a file in the way fails the command before
anything is written, naming it); generated code passes ``ruff`` and ``mypy --strict``; the
same arguments give the same files. Code is added to existing files only at the
``# +scaffold:`` markers, which must stay where ``init`` put them.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import keyword
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controller_runtime.resource import guess_plural

__all__ = [
    "ScaffoldError",
    "create_api",
    "create_webhook",
    "init",
    "library_requirement",
]

TEMPLATES = Path(__file__).with_name("templates")
_VARIABLE = re.compile(r"\{\{(\w+)\}\}")
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_VERSION = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
_GROUP = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ScaffoldError(ValueError):
    """The command cannot do what was asked; the message says why and what to do."""


def library_requirement(extra: str = "") -> str:
    """This library as a project's dependency: ``controller-runtime-py>=<this version>``."""
    try:
        version = importlib.metadata.version("controller-runtime-py")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (always installed)
        version = "0.2.0"
    name = f"controller-runtime-py[{extra}]" if extra else "controller-runtime-py"
    return f"{name}>={version}"


def render(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every ``{{name}}`` replaced; an unknown name is a bug here."""

    def replace(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return _VARIABLE.sub(replace, template)


def _write_all(root: Path, files: Mapping[str, str]) -> list[Path]:
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


def _templates(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): path.read_text()
        for path in sorted(directory.rglob("*.tmpl"))
    }


# ----------------------------------------------------------------------------------- init


def init(root: Path, *, domain: str, name: str, library: str | None = None) -> list[Path]:
    """Write a new project named ``name`` (``my-operator``; its package is ``my_operator``)
    whose API groups end in ``domain``, into ``root`` (created if needed)."""
    if not _NAME.match(name):
        raise ScaffoldError(f"--name {name!r}: use lowercase letters, digits and '-'")
    if not _DOMAIN.match(domain):
        raise ScaffoldError(f"--domain {domain!r}: use a DNS domain such as example.com")
    package = name.replace("-", "_")
    if keyword.iskeyword(package) or package in sys.stdlib_module_names:
        raise ScaffoldError(f"--name {name!r}: its package {package!r} shadows a Python module")
    values = {
        "name": name,
        "package": package,
        "domain": domain,
        "library": library or library_requirement(),
        "library_testing": _with_extra(library, "testing") or library_requirement("testing"),
    }
    renames = {"dockerignore": ".dockerignore", "gitignore": ".gitignore"}
    files: dict[str, str] = {}
    for template, text in _templates(TEMPLATES / "project").items():
        target = template.removesuffix(".tmpl")
        target = renames.get(target, target)
        if target.startswith("package/"):
            target = f"{package}/{target.removeprefix('package/')}"
        files[target] = render(text, values)
    files["PROJECT.toml"] = f'domain = "{domain}"\nname = "{name}"\npackage = "{package}"\n'
    written = _write_all(root, files)
    _regenerate(root)
    return written


def _with_extra(requirement: str | None, extra: str) -> str | None:
    if not requirement:
        return None
    match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)$", requirement)
    if match is None:
        return None
    return f"{match.group(1)}[{extra}]{match.group(3)}"


# ------------------------------------------------------------------------------ projects


@dataclass(frozen=True)
class _Project:
    root: Path
    domain: str
    name: str
    package: str


def _project(root: Path) -> _Project:
    path = root / "PROJECT.toml"
    try:
        import tomllib  # noqa: PLC0415 (only here)

        data = tomllib.loads(path.read_text())
        return _Project(root, data["domain"], data["name"], data["package"])
    except (OSError, KeyError) as err:
        raise ScaffoldError(
            f"{root} is not a project made by `python -m controller_runtime init` "
            f"({path.name}: {err}); run init first, or pass --dir"
        ) from None


def _from_import(module: str, names: Sequence[str], limit: int = 88) -> list[str]:
    """``from module import names`` as isort (and ruff) format it: on one line when it fits
    in ``limit`` columns, else one name per line in parentheses."""
    one = f"from {module} import {', '.join(names)}"
    if len(one) <= limit:
        return [one]
    return [f"from {module} import (", *(f"    {n}," for n in names), ")"]


def _marker_block(
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


def _add_import(path: Path, marker: str, module: str, name: str) -> None:
    """Add ``from module import name`` to the imports under the marker, merged and sorted as
    isort would write them."""
    lines = path.read_text().splitlines()
    start, end, _ = _marker_block(lines, marker, path, closing="")
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
        for line in _from_import(key, sorted(imported[key], key=_isort_key))
    ]
    lines[start:end] = block
    path.write_text("\n".join(lines) + "\n")


def _isort_key(name: str) -> tuple[int, str]:
    # isort's default order within an import: CONSTANTS, Classes, functions.
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return (kind, name)


def _insert(path: Path, marker: str, line: str) -> None:
    """Add ``line`` to the block under ``# +scaffold:<marker>`` (indented like the marker),
    keeping the block sorted, once."""
    lines = path.read_text().splitlines()
    start, end, indent = _marker_block(lines, marker, path)
    entry = f"{indent}{line}"
    if entry not in lines[start:end]:
        lines[start:end] = sorted([*lines[start:end], entry])
        path.write_text("\n".join(lines) + "\n")


def _regenerate(root: Path) -> None:
    """Regenerate the manifests in a fresh interpreter (the project's modules just changed)."""
    result = subprocess.run(
        [sys.executable, "-m", "controller_runtime", "manifests", "--dir", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ScaffoldError(f"generating the manifests failed:\n{result.stderr.strip()}")


# ---------------------------------------------------------------------------- create api


def create_api(
    root: Path, *, group: str, version: str, kind: str, namespaced: bool = True
) -> list[Path]:
    """Add the typed resource ``kind`` of ``<group>.<domain>/<version>``, its controller, its
    test; list its CRD in ``config/crd``; regenerate the manifests."""
    project = _project(root)
    if not _GROUP.match(group):
        raise ScaffoldError(f"--group {group!r}: use lowercase letters, digits and '-'")
    if not _VERSION.match(version):
        raise ScaffoldError(f"--version {version!r}: use v1, v2beta1, v1alpha1, ...")
    if not _KIND.match(kind):
        raise ScaffoldError(f"--kind {kind!r}: use CamelCase, starting with a capital")
    full_group = f"{group}.{project.domain}"
    var = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
    module = f"{var}_{version}"
    package_dir = root / project.package
    siblings = sorted((package_dir / "api").glob(f"{var}_v*.py"))
    class_name = kind if not siblings else f"{kind}{version.capitalize()}"
    values = {
        "package": project.package,
        "test_imports": "\n".join(
            _from_import(f"{project.package}.api", [class_name, f"{class_name}Spec"])
        ),
        "kind": kind,
        "class_name": class_name,
        "var": var,
        "version": version,
        "full_group": full_group,
        "api_version": f"{full_group}/{version}",
        "kind_line": "" if class_name == kind else f'\n    kind="{kind}",',
        "scope_line": "" if namespaced else '\n    scope="Cluster",',
        # A second version of a kind is served beside the first, which stays the storage
        # version; make the newer one the storage version when its data is converted.
        "storage_line": "" if not siblings else "\n    storage=False,",
        # Cluster-scoped objects outlive the test's namespace: named after it, to be unique.
        "name_line": (
            f'{var}.metadata.name, {var}.metadata.namespace = "sample", namespace'
            if namespaced
            else f'{var}.metadata.name = f"sample-{{namespace}}"'
        ),
        "namespace_arg": "\n        namespace=namespace," if namespaced else "",
    }
    templates = TEMPLATES / "api"
    files = {
        f"{project.package}/api/{module}.py": render(
            (templates / "resource.py.tmpl").read_text(), values
        ),
        f"tests/test_{module}.py": render((templates / "test.py.tmpl").read_text(), values),
    }
    if not siblings:
        files[f"{project.package}/controllers/{var}.py"] = render(
            (templates / "controller.py.tmpl").read_text(), values
        )
    written = _write_all(root, files)
    api = package_dir / "api" / "__init__.py"
    names = (class_name, f"{class_name}Spec", f"{class_name}Status")
    for exported in names:
        _add_import(api, "imports", f"{project.package}.api.{module}", exported)
        _insert(api, "exports", f'"{exported}",')
    if not siblings:
        controllers = package_dir / "controllers" / "__init__.py"
        _add_import(controllers, "imports", f"{project.package}.controllers.{var}", f"setup_{var}")
        _insert(controllers, "setups", f"await setup_{var}(manager)")
    crd_file = f"{full_group}_{guess_plural(kind)}.yaml"
    _list_crd(root / "config" / "crd" / "kustomization.yaml", crd_file)
    _regenerate(root)
    return [*written, root / "config" / "crd" / crd_file]


def _list_crd(kustomization: Path, file_name: str) -> None:
    text = kustomization.read_text()
    if f"  - {file_name}\n" in text:
        return
    if "resources: []\n" in text:
        text = text.replace("resources: []\n", f"resources:\n  - {file_name}\n")
    else:
        text = text.rstrip("\n") + f"\n  - {file_name}\n"
    kustomization.write_text(text)


# ------------------------------------------------------------------------ create webhook


def create_webhook(
    root: Path,
    *,
    group: str,
    version: str,
    kind: str,
    defaulting: bool = False,
    validation: bool = False,
    conversion: bool = False,
) -> list[Path]:
    """Add defaulting, validating and/or conversion webhook stubs for ``kind``.

    Needs the library's webhook server (``controller_runtime.webhook``); a version of the
    library without it refuses, saying so, and writes nothing.
    """
    _project(root)
    if not (defaulting or validation or conversion):
        raise ScaffoldError("say which webhooks: --defaulting, --validation and/or --conversion")
    if importlib.util.find_spec("controller_runtime.webhook") is None:
        raise ScaffoldError(
            "this version of controller-runtime-py has no webhook server "
            "(controller_runtime.webhook) yet, so there is nothing to wire webhooks to; "
            "nothing was written. Validate with CEL rules (Rule markers) and default with "
            "field defaults meanwhile: both run in the API server, without a webhook"
        )
    raise ScaffoldError(
        "create webhook does not write webhook stubs yet, so nothing was written: register "
        "the handlers with controller_runtime.webhook.WebhookBuilder by hand (docs/"
        "controllers.md, section Webhooks, has a complete example)"
    )
