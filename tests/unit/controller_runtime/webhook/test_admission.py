"""AdmissionReview parsing and answers, and the defaulting and validating handlers' contract
(what each operation calls, copies, denials, warnings, the patch)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, cast

import jsonpatch
import orjson
import pytest

from controller_runtime.client import Client
from controller_runtime.webhook import (
    AdmissionRequest,
    AdmissionResult,
    Denied,
    MalformedReviewError,
    defaulting_handler,
    validating_handler,
)
from controller_runtime.webhook.admission import parse_admission_review, review_response

CLIENT = cast(Client, object())  # the handlers hand it over untouched


def review(**request: Any) -> bytes:
    base: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "shop.example.com", "version": "v1", "kind": "Widget"},
        "resource": {"group": "shop.example.com", "version": "v1", "resource": "widgets"},
        "name": "w",
        "namespace": "ns",
        "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["devs"]},
        "object": {"apiVersion": "shop.example.com/v1", "kind": "Widget", "spec": {"size": 1}},
        "oldObject": None,
        "dryRun": False,
    }
    base.update(request)
    return orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}
    )


def test_a_review_is_parsed_into_the_request() -> None:
    request = parse_admission_review(review(dryRun=True, subResource="status"))
    assert request.uid == "u-1"
    assert request.operation == "CREATE"
    assert request.user_info["username"] == "alice"
    assert request.dry_run is True
    assert request.sub_resource == "status"
    assert request.kind["kind"] == "Widget"
    assert request.object is not None and request.object["spec"] == {"size": 1}
    assert request.old_object is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "must be an object"),
        (
            orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}),
            "admissionReviewVersions",
        ),
        (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "request"),
        (review(uid=""), "uid"),
        (review(operation="PATCH"), "operation"),
        (review(object=[1]), "request.object"),
    ],
)
def test_a_malformed_review_says_what_is_wrong(body: bytes, message: str) -> None:
    with pytest.raises(MalformedReviewError, match=message):
        parse_admission_review(body)


def test_a_denial_carries_its_code_message_and_field() -> None:
    result = AdmissionResult.denied(Denied("too big", field="spec.size", code=422))
    answer = orjson.loads(review_response("u-9", result))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    response = answer["response"]
    assert response["uid"] == "u-9"
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["message"] == "too big"
    assert response["status"]["reason"] == "Invalid"
    assert response["status"]["details"]["causes"][0]["field"] == "spec.size"


class Recorder:
    """A defaulter and validator that records its calls."""

    def __init__(self, deny: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []
        self.deny = deny

    async def default(self, request: AdmissionRequest, client: Client, obj: dict[str, Any]) -> None:
        assert client is CLIENT
        self.calls.append(("default", obj, None))
        if self.deny:
            raise Denied(self.deny)
        obj["spec"]["size"] = 3
        obj["spec"].setdefault("color", "blue")
        obj["spec"].pop("legacy", None)

    async def validate_create(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        self.calls.append(("create", obj, None))
        obj["spec"] = "mangled"  # a copy: the review is untouched
        if self.deny:
            raise Denied(self.deny, field="spec")
        return ["careful"]

    async def validate_update(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any], old: dict[str, Any]
    ) -> Sequence[str]:
        self.calls.append(("update", obj, old))
        return []

    async def validate_delete(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        self.calls.append(("delete", obj, None))
        return ()


async def test_the_defaulter_answers_with_the_patch_of_its_changes() -> None:
    obj = {"apiVersion": "v1", "kind": "K", "spec": {"size": 1, "legacy": True, "keep": [1]}}
    recorder = Recorder()
    request = parse_admission_review(review(object=obj))
    result = await defaulting_handler(recorder, CLIENT)(request)
    assert result.allowed and result.patch
    wire = orjson.loads(review_response(request.uid, result))["response"]
    assert wire["patchType"] == "JSONPatch"
    patch = orjson.loads(base64.b64decode(wire["patch"]))
    assert jsonpatch.apply_patch(obj, patch) == {
        "apiVersion": "v1",
        "kind": "K",
        "spec": {"size": 3, "keep": [1], "color": "blue"},
    }
    assert request.object == obj, "the handler worked on a copy"


async def test_a_defaulter_that_changes_nothing_sends_no_patch() -> None:
    class Nothing:
        async def default(self, request: AdmissionRequest, client: Client, obj: Any) -> None:
            return None

    result = await defaulting_handler(Nothing(), CLIENT)(parse_admission_review(review()))
    answer = orjson.loads(review_response("u", result))["response"]
    assert answer["allowed"] is True
    assert "patch" not in answer and "patchType" not in answer


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
async def test_the_defaulter_is_not_called_on(operation: str) -> None:
    recorder = Recorder()
    request = parse_admission_review(review(operation=operation, object=None, oldObject={"a": 1}))
    result = await defaulting_handler(recorder, CLIENT)(request)
    assert result.allowed and result.patch is None
    assert recorder.calls == []


async def test_a_defaulter_may_deny() -> None:
    result = await defaulting_handler(Recorder(deny="no"), CLIENT)(parse_admission_review(review()))
    assert not result.allowed and result.message == "no" and result.code == 403


async def test_each_operation_calls_its_validation() -> None:
    recorder = Recorder()
    handler = validating_handler(recorder, CLIENT)
    new, old = {"spec": {"v": 2}}, {"spec": {"v": 1}}
    created = await handler(parse_admission_review(review(object=new)))
    assert created.allowed and created.warnings == ("careful",)
    await handler(parse_admission_review(review(operation="UPDATE", object=new, oldObject=old)))
    await handler(parse_admission_review(review(operation="DELETE", object=None, oldObject=old)))
    connect = await handler(parse_admission_review(review(operation="CONNECT", object=None)))
    assert connect.allowed
    assert [(c[0], c[1], c[2]) for c in recorder.calls] == [
        ("create", {"spec": "mangled"}, None),
        ("update", new, old),
        ("delete", old, None),
    ]


async def test_a_validator_denial_reaches_the_review() -> None:
    handler = validating_handler(Recorder(deny="size must be even"), CLIENT)
    request = parse_admission_review(review())
    answer = orjson.loads(review_response(request.uid, await handler(request)))["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"] == "size must be even"
    assert answer["status"]["details"]["causes"][0]["field"] == "spec"
    assert request.object is not None and request.object["spec"] == {"size": 1}
