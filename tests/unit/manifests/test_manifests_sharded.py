"""The sharded variant in ``manifests/sharded/``: valid objects, the same Deployment as the
base but for the replicas and ``--shard-ring``, and the Lease rights the ring uses."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from controller_runtime.envtest.binaries import KUBERNETES_VERSION
from controllers.__main__ import settings_from

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"
SHARDED = MANIFESTS / "sharded"
SCHEMA_VERSION = ".".join(KUBERNETES_VERSION.split(".")[:2])

Doc = dict[str, Any]


def load(path: Path) -> Doc:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return doc


def sharded_documents() -> list[tuple[str, Doc]]:
    kustomization = load(SHARDED / "kustomization.yaml")
    return [(entry, load(SHARDED / entry)) for entry in kustomization["resources"]]


def test_the_kustomization_lists_every_file_of_the_variant() -> None:
    listed = {entry for entry, _ in sharded_documents()}
    present = {p.name for p in SHARDED.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize(("where", "doc"), sharded_documents())
def test_every_object_validates_against_the_kubernetes_schemas(where: str, doc: Doc) -> None:
    try:
        kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{where}: {'.'.join(str(p) for p in err.path)}: {err.message}")


def test_the_deployment_is_the_base_one_but_for_replicas_and_the_ring() -> None:
    base = load(MANIFESTS / "deployment.yaml")
    sharded = load(SHARDED / "deployment.yaml")
    assert sharded["spec"]["replicas"] == 3
    args = sharded["spec"]["template"]["spec"]["containers"][0]["args"]
    expected = copy.deepcopy(base)
    expected["spec"]["replicas"] = 3
    base_args = expected["spec"]["template"]["spec"]["containers"][0]["args"]
    base_args.insert(base_args.index("--leader-elect") + 1, "--shard-ring=tasks")
    assert sharded == expected, "manifests/sharded/deployment.yaml drifted from the base"
    settings = settings_from(args)
    assert settings.shard_ring == "tasks"
    assert settings.leader_elect  # the unsharded controllers keep leader election


def test_the_ring_may_do_what_it_does_with_leases_and_nothing_more() -> None:
    docs = dict(sharded_documents())
    role = docs["shard-ring-role.yaml"]
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    # ShardRing: POST its Lease, PATCH (renew, claims), LIST by label, DELETE on leaving.
    assert sorted(rule["verbs"]) == ["create", "delete", "list", "patch"]
    binding = docs["shard-ring-role-binding.yaml"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    deployment = docs["deployment.yaml"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]
    assert role["metadata"]["namespace"] == namespace  # the ring's Leases live beside the Pods
