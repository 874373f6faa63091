"""The example manifests offer a version that exists: every in-cluster PostgresInstance of
manifests/examples/ (and of docs/postgres.md's instance examples) asks for a version that the
example version policy enables, and the image the policy gives it is the one the local node
builds (Debian's PostgreSQL 15, docs/e2e.md), so the examples run on ``make e2e``'s node."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from controller_runtime.envtest.node.images import POSTGRES_IMAGE
from controllers.postgres.policy import evaluate

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = ROOT / "manifests" / "examples"


def _examples(kind: str) -> list[dict[str, Any]]:
    docs = [
        d
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if isinstance(d, dict)
    ]
    return [d for d in docs if d.get("kind") == kind]


def _short(image: str) -> str:
    """``docker.io/library/postgres:15`` → ``postgres:15`` (how a Pod names it)."""
    return image.removeprefix("docker.io/").removeprefix("library/")


def test_every_example_instance_runs_on_the_local_node() -> None:
    (policy,) = _examples("PostgresVersionPolicy")
    instances = [i for i in _examples("PostgresInstance") if "external" not in i["spec"]]
    assert len(instances) >= 2, "the in-cluster and the restored instance examples"
    for instance in instances:
        name = instance["metadata"]["name"]
        verdict = evaluate(policy, str(instance["spec"]["version"]), None)
        assert verdict.accepted, f"example postgresinstance {name}: {verdict.message}"
        assert verdict.image == _short(POSTGRES_IMAGE), (
            f"example postgresinstance {name} would run {verdict.image}; the local node has "
            f"{POSTGRES_IMAGE}"
        )


def test_the_instance_examples_in_the_docs_ask_for_the_same_version() -> None:
    text = (ROOT / "docs" / "postgres.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    versions = {
        str(doc["spec"]["version"])
        for block in blocks
        for doc in yaml.safe_load_all(block)
        if isinstance(doc, dict)
        and doc.get("kind") == "PostgresInstance"
        and "version" in (doc.get("spec") or {})
    }
    assert versions == {"15"}, f"docs/postgres.md's PostgresInstance examples ask for {versions}"
