"""``create webhook``: defaulting, validating and conversion webhooks for a kind of the project,
as kubebuilder's ``create webhook --defaulting --programmatic-validation --conversion``.

What it writes, for ``--kind Widget --version v1``:

* ``<package>/webhooks/widget_v1.py`` (``--defaulting``, ``--programmatic-validation``): a
  ``WidgetDefaulter`` and a ``WidgetValidator`` with an example each (a label from the size;
  no shrinking), and ``setup_widget_v1_webhook``, which registers them with ``WebhookBuilder``
  at controller-runtime's paths; ``tests/test_widget_v1_webhook.py`` checks through the local
  control plane's API server that a default lands and that a denial reaches the client;
* ``<package>/webhooks/widget_conversion.py`` (``--conversion``, which needs a second version
  of the kind, from ``create api``): a ``HubConverter`` with the storage version as its hub
  and a stub pair of functions per other version; ``tests/test_widget_conversion.py`` reads a
  Widget in another version than it is stored in and sees the webhook answer;
* the wiring: each setup function joins ``setup_webhooks`` in ``<package>/webhooks/__init__.py``
  (which ``python -m <package> --webhooks ...`` and the tests' ``manager`` fixture call), and a
  converted kind joins ``CONVERTED`` there (its CRD gets the CA of the self-managed
  certificates);
* ``config/webhook/``, a kustomize component that ``config/kustomization.yaml`` lists: the
  Mutating and ValidatingWebhookConfiguration, the webhook Service, the CRD's ``Webhook``
  conversion (a patch), a patch giving the Deployment ``--webhooks=self-managed``, the
  webhook port and its container port, and the RBAC of the self-managed certificates (the
  Secret, the configurations, the CRDs, each by name where RBAC allows).

``config/webhook/`` is derived from the ``[[webhook]]`` and ``[[conversion]]`` tables this
command appends to ``PROJECT.toml`` and is written again, whole, by every ``create webhook``
(the Python files are never overwritten: a file in the way fails the command before anything
is written). The project's dependency on the library gains the ``webhook`` extra (the
self-managed certificates need ``cryptography``).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from controller_runtime.rbac import Section, allow, cluster_role, role
from controller_runtime.resource import guess_plural
from controller_runtime.scaffold._project import (
    GROUP,
    KIND,
    TEMPLATES,
    VERSION,
    Project,
    ScaffoldError,
    add_import,
    from_import,
    insert_line,
    project_at,
    render,
    write_all,
)
from controller_runtime.webhook.server import CONVERT_PATH, DEFAULT_PORT, default_paths

__all__ = ["create_webhook"]

_TEMPLATES = TEMPLATES / "webhook"
_HEADER = (
    "# Written by `python -m controller_runtime create webhook` from PROJECT.toml's [[webhook]]\n"
    "# and [[conversion]] tables; every create webhook writes config/webhook/ again, whole.\n"
)


@dataclass(frozen=True)
class _Version:
    """One version of a kind, as its class in ``<package>/api`` declares it."""

    version: str
    class_name: str
    group: str
    storage: bool
    namespaced: bool


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
    """Add defaulting and validating webhooks for ``kind`` in ``version``, and/or its
    conversion between versions; see the module docstring. Refuses, writing nothing, when the
    kind is not in ``<package>/api`` (``create api`` first), when ``conversion`` is asked of a
    kind with one version, or when a file it would write exists."""
    project = project_at(root)
    if not (defaulting or validation or conversion):
        raise ScaffoldError(
            "say which webhooks: --defaulting, --programmatic-validation and/or --conversion"
        )
    if not GROUP.match(group):
        raise ScaffoldError(f"--group {group!r}: use lowercase letters, digits and '-'")
    if not VERSION.match(version):
        raise ScaffoldError(f"--version {version!r}: use v1, v2beta1, v1alpha1, ...")
    if not KIND.match(kind):
        raise ScaffoldError(f"--kind {kind!r}: use CamelCase, starting with a capital")
    webhooks_init = root / project.package / "webhooks" / "__init__.py"
    if not webhooks_init.is_file():
        raise ScaffoldError(
            f"{webhooks_init} is missing: the project was made by an older `init`; copy it "
            f"from a new project (`init` in an empty directory), then run this again"
        )
    full_group = f"{group}.{project.domain}"
    var = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
    versions = _versions(root / project.package / "api", var, kind)
    this = next((v for v in versions if v.version == version), None)
    if this is None:
        raise ScaffoldError(
            f"{project.package}/api has no {kind} {version}: run `python -m controller_runtime "
            f"create api --group {group} --version {version} --kind {kind}` first; nothing "
            f"was written"
        )
    if this.group != full_group:
        raise ScaffoldError(
            f"{kind} {version} is in the group {this.group}, not {full_group}: pass the group "
            f"{this.group.removesuffix('.' + project.domain)}; nothing was written"
        )
    files: dict[str, str] = {}
    if defaulting or validation:
        files.update(
            _admission_files(
                project, this, kind=kind, var=var, defaulting=defaulting, validation=validation
            )
        )
    hub: _Version | None = None
    if conversion:
        hub, spokes = _hub_and_spokes(versions, kind, group, version)
        files.update(_conversion_files(project, hub, spokes, kind, var))
    written = write_all(root, files)

    if defaulting or validation:
        module = f"{project.package}.webhooks.{var}_{version}"
        add_import(webhooks_init, "imports", module, f"setup_{var}_{version}_webhook")
        insert_line(webhooks_init, "webhooks", f"setup_{var}_{version}_webhook(manager),")
    if hub is not None:
        module = f"{project.package}.webhooks.{var}_conversion"
        add_import(webhooks_init, "imports", module, f"setup_{var}_conversion")
        insert_line(webhooks_init, "webhooks", f"setup_{var}_conversion(manager),")
        add_import(webhooks_init, "imports", f"{project.package}.api", hub.class_name)
        insert_line(webhooks_init, "converted", f"{hub.class_name},")
    _record(
        root,
        group=group,
        version=version,
        kind=kind,
        defaulting=defaulting,
        validation=validation,
        hub=hub,
    )
    _require_webhook_extra(root / "pyproject.toml")
    return [*written, *_write_config(root, project)]


# -- the kind's versions, read from its classes -----------------------------------------


def _versions(api: Path, var: str, kind: str) -> list[_Version]:
    """Every version of ``kind`` in ``<package>/api/<var>_v*.py``, from the ``@crd(...)``
    of its class (read, not imported: the project's code may not import in this process)."""
    found: list[_Version] = []
    for path in sorted(api.glob(f"{var}_v*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for decorator in node.decorator_list:
                declared = _crd_keywords(decorator)
                if declared is None or declared.get("kind", node.name) != kind:
                    continue
                found.append(
                    _Version(
                        version=str(declared.get("version", "")),
                        class_name=node.name,
                        group=str(declared.get("group", "")),
                        storage=bool(declared.get("storage", True)),
                        namespaced=declared.get("scope", "Namespaced") == "Namespaced",
                    )
                )
    return found


def _crd_keywords(decorator: ast.expr) -> dict[str, Any] | None:
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)):
        return None
    if decorator.func.id != "crd":
        return None
    values: dict[str, Any] = {}
    for keyword in decorator.keywords:
        if keyword.arg is not None and isinstance(keyword.value, ast.Constant):
            values[keyword.arg] = keyword.value.value
    return values


def _hub_and_spokes(
    versions: list[_Version], kind: str, group: str, version: str
) -> tuple[_Version, list[_Version]]:
    if len(versions) < 2:
        raise ScaffoldError(
            f"--conversion converts between versions, and {kind} has one ({version}): add "
            f"another with `python -m controller_runtime create api --group {group} "
            f"--version <v2> --kind {kind}` (served beside {version}, which stays the storage "
            f"version), then run this again; nothing was written"
        )
    stored = [v for v in versions if v.storage]
    if len(stored) != 1:
        raise ScaffoldError(
            f"{kind}: {len(stored)} versions say storage=True; exactly one must (the hub of "
            f"the conversion); nothing was written"
        )
    return stored[0], [v for v in versions if not v.storage]


# -- the Python files ------------------------------------------------------------------


def _template(name: str, values: dict[str, str]) -> str:
    return render((_TEMPLATES / name).read_text(), values)


def _name_line(var: str, base: str, namespaced: bool) -> str:
    # Cluster-scoped objects outlive the test's namespace: named after it, to be unique.
    if namespaced:
        return f'{var}.metadata.name, {var}.metadata.namespace = "{base}", namespace'
    return f'{var}.metadata.name = f"{base}-{{namespace}}"'


def _admission_files(
    project: Project, this: _Version, *, kind: str, var: str, defaulting: bool, validation: bool
) -> dict[str, str]:
    values = {
        "package": project.package,
        "kind": kind,
        "var": var,
        "version": this.version,
        "class_name": this.class_name,
        "full_group": this.group,
        "api_version": f"{this.group}/{this.version}",
    }
    what = " and ".join(
        w for w, on in (("a defaulter", defaulting), ("a validator", validation)) if on
    )
    webhook_imports = ["AdmissionRequest", *(["Denied"] if validation else []), "WebhookPaths"]
    typing_imports = ["from typing import Any"]
    if validation:
        typing_imports.insert(0, "from collections.abc import Sequence")
    sections = (_template("defaulter.py.tmpl", values) if defaulting else "") + (
        _template("validator.py.tmpl", values) if validation else ""
    )
    with_lines = "".join(
        f"    builder.with_{w}({this.class_name}{w.capitalize()}())\n"
        for w, on in (("defaulter", defaulting), ("validator", validation))
        if on
    )
    module = _template(
        "admission.py.tmpl",
        {
            **values,
            "what": what,
            "typing_imports": "\n" + "\n".join(typing_imports) + "\n",
            "webhook_imports": ", ".join(webhook_imports),
            "sections": sections,
            "with_lines": with_lines,
        },
    )
    test_imports = from_import(
        f"{project.package}.api", [this.class_name, f"{this.class_name}Spec"]
    )
    if defaulting:
        test_imports += from_import(
            f"{project.package}.webhooks.{var}_{this.version}", ["SIZE_CLASS"]
        )
    tests = (_template("test_defaulter.py.tmpl", values) if defaulting else "") + (
        _template("test_validator.py.tmpl", values) if validation else ""
    )
    name_line = (
        f"{var}.metadata.name, {var}.metadata.namespace = name, namespace"
        if this.namespaced
        else f'{var}.metadata.name = f"{{name}}-{{namespace}}"'
    )
    test = _template(
        "test_admission.py.tmpl",
        {
            **values,
            "pytest_import": "\nimport pytest" if validation else "",
            "test_imports": "\n".join(test_imports),
            "name_line": name_line,
            "tests": tests,
        },
    )
    return {
        f"{project.package}/webhooks/{var}_{this.version}.py": module,
        f"tests/test_{var}_{this.version}_webhook.py": test,
    }


def _conversion_files(
    project: Project, hub: _Version, spokes: list[_Version], kind: str, var: str
) -> dict[str, str]:
    values = {
        "package": project.package,
        "kind": kind,
        "var": var,
        "plural": guess_plural(kind),
        "hub_class": hub.class_name,
        "hub_version": hub.version,
    }
    classes = [hub.class_name, *(s.class_name for s in spokes)]
    functions = "".join(
        _template("conversion_functions.py.tmpl", {**values, "spoke_version": s.version})
        for s in spokes
    )
    spoke_lines = "".join(_spoke_line(s, hub) for s in spokes)
    module = _template(
        "conversion.py.tmpl",
        {
            **values,
            "spokes_text": ", ".join(s.version for s in spokes),
            "api_import": "\n".join(from_import(f"{project.package}.api", classes)),
            "functions": functions,
            "spoke_lines": spoke_lines,
        },
    )
    spoke = spokes[0]
    test = _template(
        "test_conversion.py.tmpl",
        {
            **values,
            "spoke_class": spoke.class_name,
            "spoke_version": spoke.version,
            "test_imports": "\n".join(
                from_import(
                    f"{project.package}.api",
                    sorted({hub.class_name, f"{hub.class_name}Spec", spoke.class_name}),
                )
            ),
            "name_line": _name_line(var, "converted", hub.namespaced),
            "namespace_arg": ", namespace=namespace" if hub.namespaced else "",
        },
    )
    return {
        f"{project.package}/webhooks/{var}_conversion.py": module,
        f"tests/test_{var}_conversion.py": test,
    }


def _spoke_line(spoke: _Version, hub: _Version) -> str:
    """One entry of ``spokes={...}``, on one line when it fits (as ruff formats it)."""
    key = f"{spoke.class_name}.api_version"
    functions = (
        f"to_hub={spoke.version}_to_{hub.version}, from_hub={hub.version}_to_{spoke.version}"
    )
    line = f"        {key}: Spoke({functions}),\n"
    if len(line) <= 89:  # 88 columns and the newline
        return line
    return f"        {key}: Spoke(\n            {functions}\n        ),\n"


# -- PROJECT.toml and the library requirement ---------------------------------------------


def _record(
    root: Path,
    *,
    group: str,
    version: str,
    kind: str,
    defaulting: bool,
    validation: bool,
    hub: _Version | None,
) -> None:
    path = root / "PROJECT.toml"
    text = path.read_text().rstrip("\n") + "\n"
    if defaulting or validation:
        text += (
            f'\n[[webhook]]\ngroup = "{group}"\nversion = "{version}"\nkind = "{kind}"\n'
            f"defaulting = {str(defaulting).lower()}\nvalidation = {str(validation).lower()}\n"
        )
    if hub is not None:
        text += f'\n[[conversion]]\ngroup = "{group}"\nkind = "{kind}"\n'
    path.write_text(text)


def _require_webhook_extra(pyproject: Path) -> None:
    """``dependencies = ["controller-runtime-py>=x"]`` gains ``[webhook]`` (init wrote that
    line; an edited one is left alone)."""
    text = pyproject.read_text()
    match = re.search(r'^dependencies = \["([A-Za-z0-9_.-]+)(\[[^\]]*\])?([^"]*)"\]$', text, re.M)
    if match is None or (match.group(2) and "webhook" in match.group(2)):
        return
    extras = [e.strip() for e in (match.group(2) or "[]")[1:-1].split(",") if e.strip()]
    requirement = f"{match.group(1)}[{','.join(sorted({*extras, 'webhook'}))}]{match.group(3)}"
    pyproject.write_text(
        text[: match.start()] + f'dependencies = ["{requirement}"]' + text[match.end() :]
    )


# -- config/webhook -------------------------------------------------------------------------


def _write_config(root: Path, project: Project) -> list[Path]:
    data = tomllib.loads((root / "PROJECT.toml").read_text())
    files = _config_files(project, data.get("webhook", []), data.get("conversion", []))
    written = []
    for name, text in files.items():
        path = root / "config" / "webhook" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    kustomization = root / "config" / "kustomization.yaml"
    text = kustomization.read_text()
    if not re.search(r"^components:", text, re.M):
        kustomization.write_text(text.rstrip("\n") + "\ncomponents:\n  - webhook\n")
    return written


def _dump(*documents: Any) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=None, width=100)


def _config_files(
    project: Project, webhooks: list[dict[str, Any]], conversions: list[dict[str, Any]]
) -> dict[str, str]:
    name, namespace = project.name, f"{project.name}-system"
    service = f"{name}-webhook-service"
    mutating = [w for w in webhooks if w.get("defaulting")]
    validating = [w for w in webhooks if w.get("validation")]
    files: dict[str, str] = {}
    configurations: list[dict[str, Any]] = []
    for kind, entries, letter, path_key in (
        ("Mutating", mutating, "m", "mutate"),
        ("Validating", validating, "v", "validate"),
    ):
        if entries:
            configurations.append(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": f"{kind}WebhookConfiguration",
                    "metadata": {"name": f"{name}-{kind.lower()}-webhook-configuration"},
                    "webhooks": [
                        _admission_entry(
                            project,
                            e,
                            letter=letter,
                            path_key=path_key,
                            service=service,
                            namespace=namespace,
                        )
                        for e in entries
                    ],
                }
            )
    resources: list[str] = []
    if configurations:
        files["manifests.yaml"] = (
            "# The webhook configurations: the API server calls the manager's webhook server\n"
            "# through the Service below; the manager injects its CA (caBundle) itself.\n"
            + _HEADER
            + _dump(*configurations)
        )
        resources.append("manifests.yaml")
    files["service.yaml"] = _HEADER + _dump(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service, "namespace": namespace},
            "spec": {
                "selector": {"app.kubernetes.io/name": name},
                "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook-server"}],
            },
        }
    )
    crds = [f"{guess_plural(c['kind'])}.{c['group']}.{project.domain}" for c in conversions]
    files["role.yaml"] = _HEADER + _certificate_roles(
        project, namespace, [c["metadata"]["name"] for c in configurations], crds
    )
    files["role_binding.yaml"] = _HEADER + _dump(
        *(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": f"{prefix}RoleBinding",
                "metadata": {
                    "name": f"{name}-webhook-certificates",
                    **({"namespace": namespace} if prefix == "" else {}),
                },
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": f"{prefix}Role",
                    "name": f"{name}-webhook-certificates",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": f"{name}-manager", "namespace": namespace}
                ],
            }
            for prefix in ("", "Cluster")
        )
    )
    resources += ["service.yaml", "role.yaml", "role_binding.yaml"]
    patches: list[dict[str, Any]] = [
        {
            "path": "manager_patch.yaml",
            "target": {"kind": "Deployment", "name": f"{name}-manager"},
        }
    ]
    files["manager_patch.yaml"] = (
        "# The manager serves the webhooks, with certificates it manages itself.\n"
        + _HEADER
        + _dump(
            [
                _add_arg("--webhooks=self-managed"),
                _add_arg(f"--webhook-port={DEFAULT_PORT}"),
                {
                    "op": "add",
                    "path": "/spec/template/spec/containers/0/ports/-",
                    "value": {"name": "webhook-server", "containerPort": DEFAULT_PORT},
                },
            ]
        )
    )
    for crd, entry in zip(crds, conversions, strict=True):
        plural = guess_plural(entry["kind"])
        files[f"conversion_{plural}.yaml"] = (
            f"# {entry['kind']} converts between its versions through the manager's webhook.\n"
            + _HEADER
            + _dump(
                {
                    "apiVersion": "apiextensions.k8s.io/v1",
                    "kind": "CustomResourceDefinition",
                    "metadata": {"name": crd},
                    "spec": {
                        "conversion": {
                            "strategy": "Webhook",
                            "webhook": {
                                "conversionReviewVersions": ["v1"],
                                "clientConfig": {
                                    "service": {
                                        "name": service,
                                        "namespace": namespace,
                                        "path": CONVERT_PATH,
                                    }
                                },
                            },
                        }
                    },
                }
            )
        )
        patches.append({"path": f"conversion_{plural}.yaml"})
    files["kustomization.yaml"] = (
        "# The webhooks: a component of config/kustomization.yaml.\n"
        + _HEADER
        + _dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1alpha1",
                "kind": "Component",
                "resources": resources,
                "patches": patches,
            }
        )
    )
    return files


def _admission_entry(
    project: Project,
    entry: dict[str, Any],
    *,
    letter: str,
    path_key: str,
    service: str,
    namespace: str,
) -> dict[str, Any]:
    full_group = f"{entry['group']}.{project.domain}"
    kind, version = entry["kind"], entry["version"]
    path = default_paths(f"{full_group}/{version}", kind)[path_key]
    return {
        "name": f"{letter}{kind.lower()}-{version}.{full_group}",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": service, "namespace": namespace, "path": path}},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 10,
        "rules": [
            {
                "apiGroups": [full_group],
                "apiVersions": [version],
                "resources": [guess_plural(kind)],
                "operations": ["CREATE", "UPDATE"],
                "scope": "*",
            }
        ],
    }


def _add_arg(value: str) -> dict[str, Any]:
    return {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": value}


def _certificate_roles(
    project: Project, namespace: str, configurations: list[str], crds: list[str]
) -> str:
    """What the self-managed certificates do: the Secret (created, then read and updated by
    name), the configurations and the CRDs (read and updated by name, to inject the CA)."""
    role_name = f"{project.name}-webhook-certificates"
    secret = f"{project.name}-webhook-certs"
    secrets = Section(
        "the webhook certificates' Secret",
        (
            allow("secrets", "create", why="created by the leader when missing"),
            allow(
                "secrets",
                "get",
                "update",
                resource_names=[secret],
                why="read by every replica (the serving pair), updated by the leader (rotation)",
            ),
        ),
    )
    injected: list[Any] = []
    for configuration in configurations:
        resource = (
            "mutatingwebhookconfigurations"
            if "-mutating-" in configuration
            else "validatingwebhookconfigurations"
        )
        injected.append(
            allow(
                f"{resource}.admissionregistration.k8s.io",
                "get",
                "update",
                resource_names=[configuration],
                why="the CA injected into caBundle",
            )
        )
    if crds:
        injected.append(
            allow(
                "customresourcedefinitions.apiextensions.k8s.io",
                "get",
                "update",
                resource_names=crds,
                why="the CA injected into the conversion webhook's caBundle",
            )
        )
    namespaced = role(role_name, namespace, [secrets])
    cluster = cluster_role(role_name, [], sections=[Section("the CA, injected", tuple(injected))])
    return namespaced + "---\n" + cluster
