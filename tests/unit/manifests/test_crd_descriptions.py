"""``kubectl explain`` shows a description for every field of the CRDs in manifests/crds, and
the descriptions state the rules the API server enforces (CEL validations)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

CRDS = Path(__file__).resolve().parents[3] / "manifests" / "crds"

Schema = Mapping[str, Any]


def crd_schemas() -> Iterator[tuple[str, Schema]]:
    for path in sorted(CRDS.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                for version in doc["spec"]["versions"]:
                    yield f"{path.name} {version['name']}", version["schema"]["openAPIV3Schema"]


def properties(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every property below ``schema`` (through arrays and maps too), with its path."""
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from properties(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from properties(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from properties(schema["additionalProperties"], f"{path}{{}}")


SCHEMAS = list(crd_schemas())


def test_there_are_crds_to_check() -> None:
    assert len(SCHEMAS) >= 7


@pytest.mark.parametrize(("where", "schema"), SCHEMAS, ids=[w for w, _ in SCHEMAS])
def test_every_property_has_a_description(where: str, schema: Schema) -> None:
    undescribed = [
        path for path, sub in properties(schema) if not str(sub.get("description") or "").strip()
    ]
    assert not undescribed, f"{where}: no description for {undescribed}"


def test_the_walk_finds_an_undescribed_property() -> None:
    schema = {"properties": {"spec": {"description": "x", "items": {"properties": {"a": {}}}}}}
    assert [p for p, s in properties(schema) if "description" not in s] == [".spec[].a"]


def _task_spec() -> Schema:
    (schema,) = (s for w, s in SCHEMAS if w.startswith("tasks.crpy.io"))
    spec: Schema = schema["properties"]["spec"]
    return spec


def test_the_task_descriptions_state_the_rules() -> None:
    spec = _task_spec()
    assert "4 and 5 need spec.deadline" in spec["properties"]["priority"]["description"]
    assert "priority 4 or 5 needs a deadline" in spec["description"]
    assert "cannot change" in spec["properties"]["taskState"]["description"]


@pytest.mark.parametrize(("where", "schema"), SCHEMAS, ids=[w for w, _ in SCHEMAS])
def test_a_field_with_rules_says_so_in_its_description(where: str, schema: Schema) -> None:
    """Where a rule forbids a change (``self == oldSelf``), the field's description says it
    cannot change, or its parent's lists it among the rules."""
    unstated = []
    for path, sub in [("", schema), *properties(schema)]:
        for rule in sub.get("x-kubernetes-validations") or []:
            if rule["rule"] == "self == oldSelf":
                text = str(sub.get("description", "")).lower()
                if "cannot change" not in text and "one-shot" not in text:
                    unstated.append(path)
    assert not unstated, f"{where}: no 'cannot change' in the description of {unstated}"
