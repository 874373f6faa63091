"""The manifests in ``manifests/``, offline: every object validates against the Kubernetes
OpenAPI schemas (kubernetes-validate, strict: unknown fields fail) of the Kubernetes release
the local control plane runs, the kustomization lists every file, and the Deployment, its
Service, PDB, NetworkPolicy and RBAC say what the operator needs and no more. Also the RBAC
model of ``tests/rbac_usage.py`` that the integration test relies on.

What needs an API server (CRDs accepted, the whole kustomization applied, Pod Security
admission, the operator running under its RBAC) is in ``tests/integration/test_manifests.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from controller_runtime.envtest.binaries import KUBERNETES_VERSION
from controllers.__main__ import settings_from
from tests.rbac_usage import (
    Access,
    Grant,
    blocking_owner_accesses,
    classify,
    grants_for,
    rbac_problems,
    ungranted_accesses,
    unused_grants,
)

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "manifests"
NOT_INSTALLED = ("examples", "monitoring", "sharded", "upgrade", "cert-manager")
"""Directories of manifests/ that the kustomization does not install (sharded/ is a variant
applied on top, checked in test_manifests_sharded.py; upgrade/ is the one-off storage
migration Job; cert-manager/ a kustomize Component, checked in test_manifests_webhooks.py;
monitoring/ needs the Prometheus Operator, checked in test_prometheus_rule.py)."""
THIRD_PARTY_GROUPS = frozenset({"monitoring.coreos.com"})
"""Kinds of other projects' CRDs (no schema here): checked by their own tests."""
SCHEMA_VERSION = ".".join(KUBERNETES_VERSION.split(".")[:2])

Doc = dict[str, Any]


def load_documents(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


COMPONENTS = ("cert-manager",)
"""kustomize Components: patches and cert-manager's objects, not whole Kubernetes objects;
rendered and checked in test_manifests_webhooks.py."""


def manifest_files() -> list[Path]:
    return sorted(
        p
        for p in MANIFESTS.rglob("*")
        if p.suffix in (".yaml", ".yml")
        and p.name != "kustomization.yaml"
        and p.relative_to(MANIFESTS).parts[0] not in COMPONENTS
    )


def custom_groups() -> set[str]:
    """API groups that the CRDs in manifests/crds define."""
    return {
        doc["spec"]["group"]
        for path in sorted((MANIFESTS / "crds").glob("*.y*ml"))
        for doc in load_documents(path)
        if doc.get("kind") == "CustomResourceDefinition"
    }


def group_of(doc: Mapping[str, Any]) -> str:
    api_version = str(doc.get("apiVersion", ""))
    return api_version.split("/", maxsplit=1)[0] if "/" in api_version else ""


def built_in_documents() -> Iterator[tuple[str, Doc]]:
    groups = custom_groups()
    for path in manifest_files():
        for index, doc in enumerate(load_documents(path)):
            if group_of(doc) in groups | THIRD_PARTY_GROUPS:
                continue  # a custom resource: the API server validates it against its CRD
            name = doc.get("metadata", {}).get("name", "?")
            yield f"{path.relative_to(MANIFESTS)}#{index}:{doc.get('kind')}/{name}", doc


def kustomization() -> Doc:
    docs = load_documents(MANIFESTS / "kustomization.yaml")
    assert len(docs) == 1
    return docs[0]


def installed() -> list[Doc]:
    """Every object the kustomization installs (before kustomize's transformations)."""
    return [
        doc for entry in kustomization()["resources"] for doc in load_documents(MANIFESTS / entry)
    ]


def only(kind: str, docs: list[Doc] | None = None) -> Doc:
    found = [d for d in (docs if docs is not None else installed()) if d["kind"] == kind]
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def pod_spec() -> Doc:
    spec: Doc = only("Deployment")["spec"]["template"]["spec"]
    return spec


def container() -> Doc:
    containers = pod_spec()["containers"]
    assert len(containers) == 1
    first: Doc = containers[0]
    return first


def container_port(name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    return int(ports[name])


# -- schemas -------------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "doc"), list(built_in_documents()))
def test_every_manifest_validates_against_the_kubernetes_schemas(where: str, doc: Doc) -> None:
    try:
        kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        path = ".".join(str(p) for p in err.path)
        pytest.fail(f"{where}: {path}: {err.message}")
    except kubernetes_validate.SchemaNotFoundError as err:
        pytest.fail(f"{where}: {err.message} (a typo in apiVersion or kind?)")


def test_schema_validation_catches_a_misspelt_field() -> None:
    deployment = only("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "readOnlyRootFilesytem"
    ] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFilesytem"):
        kubernetes_validate.validate(deployment, SCHEMA_VERSION, strict=True)


def test_every_custom_resource_in_the_manifests_has_its_crd() -> None:
    groups = custom_groups()
    for path in manifest_files():
        for doc in load_documents(path):
            group = group_of(doc)
            known = group in groups or group in THIRD_PARTY_GROUPS
            if "." in group and not group.endswith(".k8s.io") and not known:
                pytest.fail(f"{path.relative_to(MANIFESTS)}: no CRD in manifests/crds for {group}")


# -- the kustomization ---------------------------------------------------------------------


def test_the_kustomization_lists_every_manifest_and_only_existing_files() -> None:
    listed = kustomization()["resources"]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    missing_files = [entry for entry in listed if not (MANIFESTS / entry).is_file()]
    assert not missing_files, f"listed in kustomization.yaml but absent: {missing_files}"
    expected = {
        str(p.relative_to(MANIFESTS))
        for p in manifest_files()
        if p.relative_to(MANIFESTS).parts[0] not in NOT_INSTALLED
    }
    unlisted = sorted(expected - set(listed))
    assert not unlisted, (
        f"add these to manifests/kustomization.yaml (resources), kustomize takes no globs: "
        f"{unlisted}"
    )


def test_every_crd_file_is_installed() -> None:
    crds = sorted(str(p.relative_to(MANIFESTS)) for p in (MANIFESTS / "crds").glob("*.y*ml"))
    assert crds, "no CRDs in manifests/crds"
    missing = [crd for crd in crds if crd not in kustomization()["resources"]]
    assert not missing, f"CRDs missing from manifests/kustomization.yaml: {missing}"


def test_the_image_is_set_in_one_place() -> None:
    image = container()["image"]
    name, _, tag = image.rpartition(":")
    overrides = {i["name"]: i for i in kustomization().get("images", [])}
    assert name == "controller-runtime-py/operator"
    assert overrides[name]["newTag"] == tag, "the kustomization's images: tag differs"
    project_version = re.search(
        r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert project_version is not None
    assert tag == project_version.group(1), "the image tag should be the project's version"


def test_everything_but_cluster_scoped_objects_lives_in_the_operator_namespace() -> None:
    namespace = only("Namespace")["metadata"]["name"]
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
    for doc in installed():
        meta = doc["metadata"]
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in meta, f"{doc['kind']} {meta['name']} is cluster-scoped"
        else:
            assert meta.get("namespace") == namespace, f"{doc['kind']} {meta['name']}"


# -- the Deployment --------------------------------------------------------------------------


def test_the_operator_namespace_enforces_pod_security_restricted() -> None:
    labels = only("Namespace")["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_the_pods_run_restricted_with_a_read_only_root() -> None:
    """Pod Security Standards "restricted", field by field (admission checks it for real in
    the integration test), plus a read-only root filesystem."""
    spec = pod_spec()
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] != 0
    assert pod["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for volume in spec.get("volumes", []):
        assert set(volume) - {"name"} <= {
            "emptyDir",
            "configMap",
            "secret",
            "projected",
            "downwardAPI",
            "persistentVolumeClaim",
            "ephemeral",
            "csi",
        }, f"volume {volume['name']} has a type Pod Security restricted forbids"
    for c in spec["containers"] + spec.get("initContainers", []):
        ctx = c["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert not ctx["capabilities"].get("add")
        assert not ctx.get("privileged")
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx.get("runAsUser", pod["runAsUser"]) != 0
        assert "ports" not in c or all("hostPort" not in p for p in c["ports"])
    assert spec["automountServiceAccountToken"] is True, "the operator needs its token"
    service_account = only("ServiceAccount")
    assert spec["serviceAccountName"] == service_account["metadata"]["name"]
    assert service_account["automountServiceAccountToken"] is False


def test_the_image_user_is_the_pods_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", dockerfile, re.M)
    assert users, "the Dockerfile must switch to a numeric non-root USER"
    user, group = users[-1]
    pod = pod_spec()["securityContext"]
    assert int(user) == pod["runAsUser"] != 0
    assert not group or int(group) == pod["runAsGroup"]
    stages = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert len(stages) == 2 and len(set(stages)) == 1, "builder and final stage: the same base"
    assert re.search(r'^ENTRYPOINT \["python", "-m", "controllers"\]$', dockerfile, re.M)


def test_the_image_gets_the_operators_packages_and_nothing_else() -> None:
    packages = {"kubeclient", "informers", "controller_runtime", "controllers"}
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", dockerfile, re.M))
    assert copied == packages
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "*" in ignore, ".dockerignore should ignore everything but what it names"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == packages | {"pyproject.toml", "README.md"}


def test_the_deployment_args_are_the_operators_own_flags() -> None:
    c = container()
    assert "command" not in c, "the image's ENTRYPOINT runs python -m controllers"
    settings = settings_from(c["args"])  # exits (SystemExit) on an unknown flag
    assert settings.leader_elect
    assert settings.log_format == "json"
    assert settings.metrics_bind_address == f":{container_port('metrics')}"
    assert settings.health_probe_bind_address == f":{container_port('health')}"


def test_probes_hit_the_managers_health_endpoints() -> None:
    c = container()
    paths = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for probe, path in paths.items():
        http = c[probe]["httpGet"]
        assert http["path"] == path, probe
        assert http["port"] in ("health", container_port("health")), probe


def test_requests_and_limits_are_set() -> None:
    resources = container()["resources"]
    for key in ("cpu", "memory"):
        assert key in resources["requests"]
        assert key in resources["limits"]


def test_graceful_shutdown_fits_in_the_termination_grace_period() -> None:
    settings = settings_from(container()["args"])
    grace = pod_spec()["terminationGracePeriodSeconds"]
    # Draining reconciles, then releasing the Lease and closing connections: a few seconds.
    assert grace >= settings.graceful_shutdown_timeout + 5


def test_rollouts_and_disruptions_keep_a_warm_replica() -> None:
    deployment = only("Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert settings_from(container()["args"]).leader_elect
    rolling = spec["strategy"]["rollingUpdate"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert (rolling["maxUnavailable"], rolling["maxSurge"]) == (0, 1)
    selector = spec["selector"]["matchLabels"]
    template_labels = spec["template"]["metadata"]["labels"]
    assert selector.items() <= template_labels.items()
    pdb = only("PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"]["matchLabels"] == selector
    spread = pod_spec()["topologySpreadConstraints"]
    assert any(t["topologyKey"] == "kubernetes.io/hostname" for t in spread)
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"] == selector


def service(name: str) -> Doc:
    (found,) = [d for d in installed() if d["kind"] == "Service" and d["metadata"]["name"] == name]
    spec: Doc = found["spec"]
    return spec


def test_the_metrics_service_targets_the_metrics_port() -> None:
    metrics = service("crpy-operator-metrics")
    selector = only("Deployment")["spec"]["selector"]["matchLabels"]
    assert metrics["selector"] == selector
    (port,) = metrics["ports"]
    assert port["targetPort"] in ("metrics", container_port("metrics"))


def test_the_webhook_services_target_the_webhook_port_only_conversion_unready_too() -> None:
    selector = only("Deployment")["spec"]["selector"]["matchLabels"]
    admission, conversion = service("crpy-operator-webhook"), service("crpy-operator-conversion")
    for spec in (admission, conversion):
        assert spec["selector"] == selector
        (port,) = spec["ports"]
        assert port["port"] == 443 and port["targetPort"] == "webhook"
    assert container_port("webhook") == 9443
    assert not admission.get("publishNotReadyAddresses"), "admission: ready replicas only"
    assert conversion["publishNotReadyAddresses"] is True, "conversion: the first replica too"
    crd = load_documents(MANIFESTS / "crds" / "postgres.crpy.io_postgresinstances.yaml")[0]
    target = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
    assert (target["name"], target["namespace"]) == ("crpy-operator-conversion", "crpy-system")


# -- the NetworkPolicy ---------------------------------------------------------------------


def _ports(rule: Mapping[str, Any]) -> set[tuple[object, str]]:
    return {(p["port"], p.get("protocol", "TCP")) for p in rule.get("ports", [])}


def test_the_network_policy_denies_by_default_and_allows_only_what_is_needed() -> None:
    policy = only("NetworkPolicy")["spec"]
    selector = only("Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["podSelector"]["matchLabels"] == selector
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]

    ingress, webhook = policy["ingress"]
    assert _ports(webhook) == {("webhook", "TCP")}, "the API server calls the webhooks"
    assert "from" not in webhook, "the API server runs outside the Pod network"
    assert _ports(ingress) in ({("metrics", "TCP")}, {(container_port("metrics"), "TCP")})
    (source,) = ingress["from"]
    assert set(source) == {"namespaceSelector"}, "only from labelled monitoring namespaces"
    assert source["namespaceSelector"]["matchLabels"] == {"crpy.io/metrics-scraper": "true"}

    egress = policy["egress"]
    by_ports = {frozenset(_ports(rule)): rule for rule in egress}
    dns = by_ports[frozenset({(53, "UDP"), (53, "TCP")})]
    (resolver,) = dns["to"]
    assert resolver["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert resolver["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }
    assert frozenset({(443, "TCP"), (6443, "TCP")}) in by_ports, "the API server, both ports"
    assert frozenset({(5432, "TCP")}) in by_ports, "PostgreSQL"
    assert frozenset({(8008, "TCP")}) in by_ports, "the PostgreSQL Pods' agents"
    assert len(egress) == 4, "nothing else leaves the operator's Pods"


# -- RBAC ----------------------------------------------------------------------------------


def test_rbac_follows_good_practice() -> None:
    assert rbac_problems(installed()) == []


def test_rbac_lint_finds_what_good_practice_forbids() -> None:
    bad = {
        "kind": "ClusterRole",
        "metadata": {"name": "bad"},
        "rules": [
            {"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["patch"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["bind"]},
            {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": ["x"],
                "verbs": ["list"],
            },
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
            # Webhook configurations and CRDs: only by name, only get and update.
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations"],
                "verbs": ["get"],
            },
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": ["mine"],
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": ["apiextensions.k8s.io"],
                "resources": ["customresourcedefinitions"],
                "resourceNames": ["things.example.com"],
                "verbs": ["delete"],
            },
        ],
    }
    problems = rbac_problems([bad])
    assert len(problems) == 10, problems
    assert any("validatingwebhookconfigurations on any object" in p for p in problems)
    assert any("['patch'] on mutatingwebhookconfigurations" in p for p in problems)
    assert any("['delete'] on customresourcedefinitions" in p for p in problems)
    fine = {
        "kind": "ClusterRole",
        "metadata": {"name": "fine"},
        "rules": [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                "resourceNames": ["mine"],
                "verbs": ["get", "update"],
            }
        ],
    }
    assert rbac_problems([fine]) == []


def test_every_binding_names_the_operator_and_an_existing_role() -> None:
    docs = installed()
    account = only("ServiceAccount", docs)["metadata"]
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
    grants = grants_for(docs, account["namespace"], account["name"])  # raises on a lost role
    assert grants


def test_leases_are_granted_only_in_the_operator_namespace() -> None:
    docs = installed()
    account = only("ServiceAccount", docs)["metadata"]
    leases = [
        g for g in grants_for(docs, account["namespace"], account["name"]) if g.resource == "leases"
    ]
    assert {g.verb for g in leases} == {"get", "create", "update"}
    assert {g.namespace for g in leases} == {account["namespace"]}


# -- the RBAC model (tests/rbac_usage.py) ------------------------------------------------------


NS = "/apis/g.io/v1/namespaces/ns"


@pytest.mark.parametrize(
    ("request_line", "status", "expected"),
    [
        ("GET /apis/g.io/v1/things?watch=1", 200, ["watch g.io things - -"]),
        ("GET /apis/g.io/v1/things?watch=false", 200, ["list g.io things - -"]),
        ("GET /apis/g.io/v1/things?limit=500", 200, ["list g.io things - -"]),
        (
            f"GET {NS}/things?watch=true&fieldSelector=metadata.name=a",
            200,
            ["watch g.io things ns a"],
        ),
        (f"GET {NS}/things/a", 404, ["get g.io things ns a"]),
        (f"POST {NS}/things", 201, ["create g.io things ns -"]),
        (f"PUT {NS}/things/a/status", 200, ["update g.io things/status ns a"]),
        (f"PATCH {NS}/things/a", 200, ["patch g.io things ns a"]),
        (
            f"PATCH {NS}/things/a?fieldManager=m",
            201,
            ["patch g.io things ns a", "create g.io things ns a"],
        ),
        ("DELETE /api/v1/namespaces/ns/secrets/s", 200, ["delete - secrets ns s"]),
        ("DELETE /api/v1/namespaces/ns/secrets", 200, ["deletecollection - secrets ns -"]),
        ("GET /api/v1/namespaces/ns", 200, ["get - namespaces ns ns"]),
        ("PUT /api/v1/namespaces/ns/finalize", 200, ["update - namespaces/finalize ns ns"]),
        ("GET /api/v1/nodes/n1", 200, ["get - nodes - n1"]),
        ("GET /apis/g.io/v1", 200, []),
        ("GET /api", 200, []),
        ("GET /healthz", 200, []),
    ],
)
def test_requests_map_to_the_verbs_the_api_server_authorises(
    request_line: str, status: int, expected: list[str]
) -> None:
    method, _, target = request_line.partition(" ")
    path, _, query = target.partition("?")
    params = dict(term.split("=", 1) for term in query.split("&")) if query else None
    got = classify(method, path, params, status)
    assert [
        " ".join(v or "-" for v in (a.verb, a.group, a.resource, a.namespace, a.name)) for a in got
    ] == expected


def _rbac_docs() -> list[Doc]:
    return [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "cr"},
            "rules": [
                {"apiGroups": ["g.io"], "resources": ["things"], "verbs": ["list", "watch"]},
                {"apiGroups": ["g.io"], "resources": ["things/status"], "verbs": ["patch"]},
            ],
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "crb"},
            "roleRef": {"kind": "ClusterRole", "name": "cr"},
            "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "sys"}],
        },
        {
            "kind": "Role",
            "metadata": {"name": "r", "namespace": "sys"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "rb", "namespace": "sys"},
            "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "sys"}],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "someone-else", "namespace": "sys"},
            "roleRef": {"kind": "ClusterRole", "name": "cr"},
            "subjects": [{"kind": "ServiceAccount", "name": "other", "namespace": "sys"}],
        },
    ]


def test_grants_expand_bindings_into_scoped_atoms() -> None:
    grants = grants_for(_rbac_docs(), "sys", "op")
    assert [(g.group, g.resource, g.verb, g.namespace) for g in grants] == [
        ("", "configmaps", "get", "sys"),
        ("g.io", "things", "list", ""),
        ("g.io", "things", "watch", ""),
        ("g.io", "things/status", "patch", ""),
    ]
    assert grants_for(_rbac_docs(), "sys", "nobody") == []
    without_role = [d for d in _rbac_docs() if d["kind"] != "Role"]
    with pytest.raises(LookupError, match="missing Role"):
        grants_for(without_role, "sys", "op")


def test_unused_and_ungranted_are_found() -> None:
    grants = grants_for(_rbac_docs(), "sys", "op")
    accesses = [
        Access("watch", "g.io", "things"),
        Access("patch", "g.io", "things/status", "ns", "a"),
        Access("get", "", "configmaps", "elsewhere", "c"),  # not in the Role's namespace
        Access("list", "g.io", "things", status=403),  # denied: not a use
        Access("list", "g.io", "things", status=429),  # flow control answers before RBAC
    ]
    assert [(g.resource, g.verb) for g in unused_grants(grants, accesses)] == [
        ("configmaps", "get"),
        ("things", "list"),
    ]
    assert ungranted_accesses(grants, accesses) == [
        Access("get", "", "configmaps", "elsewhere", "c")
    ]
    assert Grant("g.io", "*/status", "patch").allows(Access("patch", "g.io", "x/status"))
    assert not Grant("g.io", "things", "get", "", "a").allows(
        Access("get", "g.io", "things", "", "b")
    )


def test_blocking_owner_references_need_update_on_the_owners_finalizers() -> None:
    child = {
        "metadata": {
            "namespace": "ns",
            "ownerReferences": [
                {"apiVersion": "g.io/v1", "kind": "Thing", "name": "t", "blockOwnerDeletion": True},
                {"apiVersion": "g.io/v1", "kind": "Thing", "name": "u"},
            ],
        }
    }
    accesses = blocking_owner_accesses([child], lambda api_version, kind: ("g.io", "things"))
    assert accesses == [Access("update", "g.io", "things/finalizers", "ns", "t")]
