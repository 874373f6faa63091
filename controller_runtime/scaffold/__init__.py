"""Project scaffolding: ``init``, ``create api`` and ``create webhook``, kubebuilder's workflow.

``init`` writes a project that runs (``make run``) and tests itself on a local control plane
(``make test``) before a single line is added: ``pyproject.toml`` depending on this library,
a ``Makefile``, the manager's entry point, ``config/`` for kustomize (CRDs, RBAC, the
Deployment under Pod Security "restricted", a metrics Service), a ``Dockerfile``, a README and
tests. ``create api`` adds a typed resource, its controller (wired into ``setup``), a test that
sees a new object reconciled, and regenerates the CRD and the RBAC. ``create webhook``
(:mod:`.webhooks`) adds a kind's defaulter, validator and converter, their wiring, their
kustomize configuration with self-managed certificates, and a test of each through the local
control plane's API server.

Guarantees: nothing existing is overwritten (a file in the way fails the command before
anything is written, naming it); generated code passes ``ruff check``, ``ruff format`` (for
kind names of ordinary length: a long one makes some lines that ``ruff format`` rewraps) and
``mypy --strict``; the same arguments give the same files. Code is added to existing files
only at the ``# +scaffold:`` markers, which must stay where ``init`` put them.
"""

from __future__ import annotations

import importlib.metadata
import keyword
import re
import sys
from pathlib import Path

from controller_runtime.resource import guess_plural
from controller_runtime.scaffold._project import (
    DOMAIN,
    GROUP,
    KIND,
    NAME,
    TEMPLATES,
    VERSION,
    ScaffoldError,
    add_import,
    from_import,
    insert_line,
    project_at,
    regenerate,
    render,
    templates_in,
    write_all,
)
from controller_runtime.scaffold.webhooks import create_webhook

__all__ = [
    "ScaffoldError",
    "create_api",
    "create_webhook",
    "init",
    "library_requirement",
]


def library_requirement(extra: str = "") -> str:
    """This library as a project's dependency: ``controller-runtime-py>=<this version>``."""
    try:
        version = importlib.metadata.version("controller-runtime-py")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (always installed)
        version = "0.2.0"
    name = f"controller-runtime-py[{extra}]" if extra else "controller-runtime-py"
    return f"{name}>={version}"


# ----------------------------------------------------------------------------------- init


def init(root: Path, *, domain: str, name: str, library: str | None = None) -> list[Path]:
    """Write a new project named ``name`` (``my-operator``; its package is ``my_operator``)
    whose API groups end in ``domain``, into ``root`` (created if needed)."""
    if not NAME.match(name):
        raise ScaffoldError(f"--name {name!r}: use lowercase letters, digits and '-'")
    if not DOMAIN.match(domain):
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
    for template, text in templates_in(TEMPLATES / "project").items():
        target = template.removesuffix(".tmpl")
        target = renames.get(target, target)
        if target.startswith("package/"):
            target = f"{package}/{target.removeprefix('package/')}"
        files[target] = render(text, values)
    files["PROJECT.toml"] = f'domain = "{domain}"\nname = "{name}"\npackage = "{package}"\n'
    written = write_all(root, files)
    regenerate(root)
    return written


def _with_extra(requirement: str | None, extra: str) -> str | None:
    if not requirement:
        return None
    match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)$", requirement)
    if match is None:
        return None
    return f"{match.group(1)}[{extra}]{match.group(3)}"


# ---------------------------------------------------------------------------- create api


def create_api(
    root: Path, *, group: str, version: str, kind: str, namespaced: bool = True
) -> list[Path]:
    """Add the typed resource ``kind`` of ``<group>.<domain>/<version>``, its controller, its
    test; list its CRD in ``config/crd``; regenerate the manifests."""
    project = project_at(root)
    if not GROUP.match(group):
        raise ScaffoldError(f"--group {group!r}: use lowercase letters, digits and '-'")
    if not VERSION.match(version):
        raise ScaffoldError(f"--version {version!r}: use v1, v2beta1, v1alpha1, ...")
    if not KIND.match(kind):
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
            from_import(f"{project.package}.api", [class_name, f"{class_name}Spec"])
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
    written = write_all(root, files)
    api = package_dir / "api" / "__init__.py"
    names = (class_name, f"{class_name}Spec", f"{class_name}Status")
    for exported in names:
        add_import(api, "imports", f"{project.package}.api.{module}", exported)
        insert_line(api, "exports", f'"{exported}",')
    if not siblings:
        controllers = package_dir / "controllers" / "__init__.py"
        add_import(controllers, "imports", f"{project.package}.controllers.{var}", f"setup_{var}")
        insert_line(controllers, "setups", f"await setup_{var}(manager)")
    crd_file = f"{full_group}_{guess_plural(kind)}.yaml"
    _list_crd(root / "config" / "crd" / "kustomization.yaml", crd_file)
    regenerate(root)
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
