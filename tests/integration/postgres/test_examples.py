"""The example manifests (manifests/examples/) pass the CRDs' schemas and CEL rules (a
server-side dry-run apply of each, in the test's namespace), and the CEL rules refuse what
they promise to refuse, with their messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controller_runtime.client import Client
from controllers.postgres.api import API_VERSION
from kubeclient.errors import InvalidError

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


async def test_every_example_is_valid(kube: Client, namespace: str) -> None:
    docs = documents()
    assert {d["kind"] for d in docs} >= {
        "PostgresVersionPolicy",
        "PostgresInstance",
        "ServiceBinding",
        "PostgresUser",
        "Backup",
        "BackupPlan",
    }
    for doc in docs:
        if doc["metadata"].get("namespace"):
            doc["metadata"]["namespace"] = namespace
        else:
            doc["metadata"].pop("namespace", None)
        # Apply (not create): the cluster-scoped policy may exist already.
        await kube.apply(doc, dry_run=True, force=True)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "an instance needs spec.version, or spec.external"),
        (
            {"external": {"host": "h", "adminSecretRef": {"name": "s"}}, "replicas": 3},
            "replicas, tls and restore apply to in-cluster instances",
        ),
        ({"version": "sixteen"}, "spec.version"),
    ],
)
async def test_instances_are_validated_with_readable_messages(
    kube: Client, namespace: str, spec: dict[str, Any], message: str
) -> None:
    obj = {
        "apiVersion": API_VERSION,
        "kind": "PostgresInstance",
        "metadata": {"name": "bad", "namespace": namespace},
        "spec": spec,
    }
    with pytest.raises(InvalidError, match=message):
        await kube.create(obj, dry_run=True)


async def test_the_policy_is_a_singleton_and_role_names_are_checked(
    kube: Client, namespace: str
) -> None:
    with pytest.raises(InvalidError, match="singleton"):
        await kube.create(
            {
                "apiVersion": API_VERSION,
                "kind": "PostgresVersionPolicy",
                "metadata": {"name": "other"},
                "spec": {},
            },
            dry_run=True,
        )
    with pytest.raises(InvalidError, match="roleName"):
        await kube.create(
            {
                "apiVersion": API_VERSION,
                "kind": "PostgresUser",
                "metadata": {"name": "u", "namespace": namespace},
                "spec": {
                    "instanceRef": {"name": "db"},
                    "roleName": 'x"; drop',
                    "database": "d",
                    "passwordSecretRef": {"name": "s"},
                },
            },
            dry_run=True,
        )
