"""Hub-and-spoke conversion: every pair of versions goes through the hub, round trips are
lossless for a lossless pair of functions, metadata but labels and annotations is kept, and
a failure fails the review with a message."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.webhook import ConversionError, HubConverter, MalformedReviewError, Spoke
from controller_runtime.webhook.conversion import convert_review, parse_conversion_review

G = "shop.example.com"


# v1: spec.replicas (int) and spec.mode ("sync"/"async"); v2 (hub): spec.replication {count,
# synchronous}; v3: spec.replicaCount and spec.synchronous, plus a v3-only field kept in an
# annotation on the way down.
def v1_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.pop("spec")
    obj["spec"] = {
        "replication": {"count": spec["replicas"], "synchronous": spec["mode"] == "sync"},
        "name": spec["name"],
    }
    return obj


def v2_to_v1(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.pop("spec")
    replication = spec["replication"]
    obj["spec"] = {
        "replicas": replication["count"],
        "mode": "sync" if replication["synchronous"] else "async",
        "name": spec["name"],
    }
    return obj


def v3_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    obj["spec"] = {
        "replication": {"count": spec["replicaCount"], "synchronous": spec["synchronous"]},
        "name": spec["name"],
    }
    return obj


def v2_to_v3(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    obj["spec"] = {
        "replicaCount": spec["replication"]["count"],
        "synchronous": spec["replication"]["synchronous"],
        "name": spec["name"],
    }
    return obj


CONVERTER = HubConverter(
    hub=f"{G}/v2",
    spokes={f"{G}/v1": Spoke(v1_to_v2, v2_to_v1), f"{G}/v3": Spoke(v3_to_v2, v2_to_v3)},
)
VERSIONS = [f"{G}/v1", f"{G}/v2", f"{G}/v3"]


@st.composite
def widgets(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": draw(st.text("abc", min_size=1, max_size=5)),
        "namespace": "ns",
        "uid": "11111111-2222",
        "resourceVersion": str(draw(st.integers(1, 10**6))),
        "generation": 3,
    }
    labels = draw(st.dictionaries(st.sampled_from(["a", "b"]), st.text("xy", max_size=2)))
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": f"{G}/v1",
        "kind": "Widget",
        "metadata": metadata,
        "spec": {
            "replicas": draw(st.integers(0, 9)),
            "mode": draw(st.sampled_from(["sync", "async"])),
            "name": draw(st.text(max_size=4)),
        },
        "status": {"ready": draw(st.booleans())},
    }


@given(widgets(), st.lists(st.sampled_from(VERSIONS), min_size=1, max_size=5))
def test_any_path_through_the_versions_comes_back_unchanged(
    widget: dict[str, Any], path: list[str]
) -> None:
    original = orjson.loads(orjson.dumps(widget))
    current = widget
    for version in path:
        current = CONVERTER.convert(current, version)
        assert current["apiVersion"] == version
        assert current["kind"] == "Widget"
        assert current["metadata"] == original["metadata"]
    back = CONVERTER.convert(current, f"{G}/v1")
    assert back["spec"] == original["spec"]
    assert widget == original, "convert modified its input"


def test_spoke_to_spoke_goes_through_the_hub() -> None:
    seen: list[str] = []

    def tracing(name: str, function: Any) -> Any:
        def run(obj: dict[str, Any]) -> dict[str, Any]:
            seen.append(name)
            return function(obj)  # type: ignore[no-any-return]

        return run

    converter = HubConverter(
        hub=f"{G}/v2",
        spokes={
            f"{G}/v1": Spoke(tracing("v1->hub", v1_to_v2), tracing("hub->v1", v2_to_v1)),
            f"{G}/v3": Spoke(tracing("v3->hub", v3_to_v2), tracing("hub->v3", v2_to_v3)),
        },
    )
    widget = {"apiVersion": f"{G}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    widget["spec"] = {"replicas": 2, "mode": "sync", "name": "n"}
    v3 = converter.convert(widget, f"{G}/v3")
    assert seen == ["v1->hub", "hub->v3"]
    assert v3["spec"] == {"replicaCount": 2, "synchronous": True, "name": "n"}


def test_only_labels_and_annotations_of_metadata_may_change() -> None:
    def rename(obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"] = {"name": "other", "annotations": {"kept": "yes"}}
        return obj

    converter = HubConverter(hub=f"{G}/v2", spokes={f"{G}/v1": Spoke(rename, rename)})
    widget = {"apiVersion": f"{G}/v1", "kind": "Widget", "metadata": {"name": "w", "uid": "1"}}
    converted = converter.convert(widget, f"{G}/v2")
    assert converted["metadata"] == {"name": "w", "uid": "1", "annotations": {"kept": "yes"}}


def test_an_unknown_version_is_refused_with_the_known_ones() -> None:
    widget = {"apiVersion": f"{G}/v9", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(ConversionError, match=r"v9 is neither the hub .* nor a spoke"):
        CONVERTER.convert(widget, f"{G}/v2")


def test_versions_must_share_the_hubs_group() -> None:
    with pytest.raises(ValueError, match="group"):
        HubConverter(hub=f"{G}/v2", spokes={"other.io/v1": Spoke(v1_to_v2, v2_to_v1)})
    with pytest.raises(ValueError, match="group/version"):
        HubConverter(hub="v2")


def conversion_review(objects: list[dict[str, Any]], desired: str) -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "c-1", "desiredAPIVersion": desired, "objects": objects},
        }
    )


def test_a_review_converts_every_object() -> None:
    widget = {"apiVersion": f"{G}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    widget["spec"] = {"replicas": 1, "mode": "async", "name": "n"}
    request = parse_conversion_review(conversion_review([widget, widget], f"{G}/v2"))
    answer = orjson.loads(convert_review(request, {(G, "Widget"): CONVERTER}))
    assert answer["kind"] == "ConversionReview"
    response = answer["response"]
    assert response["uid"] == "c-1"
    assert response["result"] == {"status": "Success"}
    assert [o["apiVersion"] for o in response["convertedObjects"]] == [f"{G}/v2"] * 2


def test_a_failing_conversion_fails_the_review_with_its_reason() -> None:
    broken = {"apiVersion": f"{G}/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    request = parse_conversion_review(conversion_review([broken], f"{G}/v2"))
    response = orjson.loads(convert_review(request, {(G, "Widget"): CONVERTER}))["response"]
    assert response["result"]["status"] == "Failure"
    assert "KeyError" in response["result"]["message"] and "'w'" in response["result"]["message"]
    assert response["convertedObjects"] == []
    other = parse_conversion_review(conversion_review([{**broken, "kind": "Gadget"}], f"{G}/v2"))
    response = orjson.loads(convert_review(other, {(G, "Widget"): CONVERTER}))["response"]
    assert "no conversion is registered for Gadget" in response["result"]["message"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"nope", "not JSON"),
        (orjson.dumps({"apiVersion": "apiextensions.k8s.io/v1beta1"}), "conversionReviewVersions"),
        (conversion_review([], "v2"), "desiredAPIVersion"),
    ],
)
def test_a_malformed_conversion_review_says_what_is_wrong(body: bytes, message: str) -> None:
    with pytest.raises(MalformedReviewError, match=message):
        parse_conversion_review(body)
