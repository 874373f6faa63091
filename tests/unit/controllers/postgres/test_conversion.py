"""PostgresInstance conversion between v1alpha1 and v1beta1 (controllers.api.postgres.conversion):
over objects generated from each version's schema as the CRD states it, every field survives
a round trip through the other version, each result holds only fields its version knows (the
API server would prune any other), and malformed input never raises."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.crdgen import crd_documents
from controllers.api.postgres import PostgresInstance, PostgresInstanceV1alpha1
from controllers.api.postgres.conversion import (
    SYNCHRONOUS_ANNOTATION,
    V1ALPHA1_API_VERSION,
    V1BETA1_API_VERSION,
    instance_to_v1alpha1,
    instance_to_v1beta1,
)
from tests.schema_objects import resources, unknown_fields

ROOT = Path(__file__).resolve().parents[4]

((_, CRD, _),) = crd_documents([PostgresInstance, PostgresInstanceV1alpha1])
SCHEMAS = {v["name"]: v["schema"]["openAPIV3Schema"] for v in CRD["spec"]["versions"]}
ALPHA = resources(V1ALPHA1_API_VERSION, "PostgresInstance", SCHEMAS["v1alpha1"])
BETA = resources(V1BETA1_API_VERSION, "PostgresInstance", SCHEMAS["v1beta1"])


def _without_reserved(obj: dict[str, Any]) -> dict[str, Any]:
    """The conversion owns its annotation: objects a user writes do not carry it. An empty
    annotations map is no map (the API server stores neither), as the conversion treats it."""
    metadata = obj["metadata"]
    metadata.get("annotations", {}).pop(SYNCHRONOUS_ANNOTATION, None)
    if metadata.get("annotations") == {}:
        del metadata["annotations"]
    return obj


def test_the_crd_serves_both_stores_v1beta1_and_converts_through_the_webhook() -> None:
    versions = {v["name"]: (v["served"], v["storage"]) for v in CRD["spec"]["versions"]}
    assert versions == {"v1beta1": (True, True), "v1alpha1": (True, False)}
    assert CRD["spec"]["conversion"]["strategy"] == "Webhook"


@given(ALPHA.map(_without_reserved))
def test_every_v1alpha1_field_survives_a_trip_through_v1beta1(alpha: dict[str, Any]) -> None:
    before = copy.deepcopy(alpha)
    beta = instance_to_v1beta1(alpha)
    assert alpha == before, "the input is not modified"
    assert beta["apiVersion"] == V1BETA1_API_VERSION
    assert unknown_fields(SCHEMAS["v1beta1"], _body(beta)) == []
    assert instance_to_v1alpha1(beta) == alpha


@given(BETA.map(_without_reserved))
def test_every_v1beta1_field_survives_a_trip_through_v1alpha1(beta: dict[str, Any]) -> None:
    before = copy.deepcopy(beta)
    alpha = instance_to_v1alpha1(beta)
    assert beta == before, "the input is not modified"
    assert alpha["apiVersion"] == V1ALPHA1_API_VERSION
    assert unknown_fields(SCHEMAS["v1alpha1"], _body(alpha)) == []
    assert instance_to_v1beta1(alpha) == beta


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in {"apiVersion", "kind", "metadata"}}


def _instance(api_version: str, replication: dict[str, Any] | None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"version": "16", "replicas": 3}
    if replication is not None:
        spec["replication"] = replication
    return {
        "apiVersion": api_version,
        "kind": "PostgresInstance",
        "metadata": {"name": "db", "namespace": "apps", **meta},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("alpha", "beta"),
    [
        ({"mode": "async"}, {}),
        ({"mode": "sync"}, {"synchronous": {"number": 1, "method": "First"}}),
        (None, None),
    ],
)
def test_what_v1alpha1_says_maps_to_its_meaning_in_v1beta1(
    alpha: dict[str, Any] | None, beta: dict[str, Any] | None
) -> None:
    assert instance_to_v1beta1(_instance(V1ALPHA1_API_VERSION, alpha)) == _instance(
        V1BETA1_API_VERSION, beta
    )
    assert instance_to_v1alpha1(_instance(V1BETA1_API_VERSION, beta)) == _instance(
        V1ALPHA1_API_VERSION, alpha
    )


def test_a_setting_v1alpha1_cannot_say_reads_as_sync_and_is_kept_in_an_annotation() -> None:
    beta = _instance(V1BETA1_API_VERSION, {"synchronous": {"number": 2, "method": "Any"}})
    alpha = instance_to_v1alpha1(beta)
    assert alpha["spec"]["replication"] == {"mode": "sync"}
    saved = json.loads(alpha["metadata"]["annotations"][SYNCHRONOUS_ANNOTATION])
    assert saved == {"number": 2, "method": "Any"}
    assert instance_to_v1beta1(alpha) == beta


def test_a_v1alpha1_client_that_turns_synchronous_off_drops_the_saved_setting() -> None:
    beta = _instance(V1BETA1_API_VERSION, {"synchronous": {"number": 2, "method": "Any"}})
    alpha = instance_to_v1alpha1(beta)
    alpha["spec"]["replication"]["mode"] = "async"
    assert instance_to_v1beta1(alpha) == _instance(V1BETA1_API_VERSION, {})


@given(st.one_of(st.text(max_size=40), st.just("[]"), st.just("{}"), st.just("null")))
def test_a_saved_setting_edited_by_hand_is_ignored_never_raised(text: str) -> None:
    alpha = _instance(
        V1ALPHA1_API_VERSION, {"mode": "sync"}, annotations={SYNCHRONOUS_ANNOTATION: text}
    )
    beta = instance_to_v1beta1(alpha)
    assert "annotations" not in beta["metadata"]
    synchronous = beta["spec"]["replication"]["synchronous"]
    assert isinstance(synchronous, dict) and synchronous


@pytest.mark.parametrize(
    "obj",
    [
        {"apiVersion": V1ALPHA1_API_VERSION, "kind": "PostgresInstance"},
        {"metadata": None, "spec": None},
        {"metadata": {"annotations": None}, "spec": {"replication": None}},
        {"metadata": {"annotations": {SYNCHRONOUS_ANNOTATION: 3}}, "spec": {"replication": "x"}},
    ],
)
def test_objects_without_the_expected_shape_pass_through(obj: dict[str, Any]) -> None:
    for convert in (instance_to_v1beta1, instance_to_v1alpha1):
        out = convert(obj)
        assert {k: v for k, v in out.items() if k != "apiVersion"}.keys() <= obj.keys()


def test_every_example_instance_round_trips() -> None:
    examples = [
        d
        for path in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if isinstance(d, dict) and d.get("kind") == "PostgresInstance"
    ]
    assert examples
    for example in examples:
        if example["apiVersion"] == V1BETA1_API_VERSION:
            assert instance_to_v1beta1(instance_to_v1alpha1(example)) == example
        else:
            assert instance_to_v1alpha1(instance_to_v1beta1(example)) == example
