"""The defaulter's JSON patch: applied (by an independent RFC 6902 implementation) to the
object as sent, it gives exactly the object the handler left, and fields the handler did not
touch survive whatever they are."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_runtime.webhook.jsonpatch import diff, escape

KEYS = st.sampled_from(["a", "b", "spec", "x/y", "m~n", "~1", "", "0", "metadata", "ü"])
SCALARS = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=20,
)


def apply(document: Any, operations: list[dict[str, Any]]) -> Any:
    # Through the wire form, as the API server receives it.
    wire = orjson.loads(orjson.dumps(operations))
    return jsonpatch.apply_patch(copy.deepcopy(document), wire)


def same_json(a: Any, b: Any) -> bool:
    return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        b, option=orjson.OPT_SORT_KEYS
    )


@settings(max_examples=200)
@given(JSON, JSON)
def test_applying_the_diff_of_any_two_documents_gives_the_second(before: Any, after: Any) -> None:
    snapshot = copy.deepcopy((before, after))
    operations = diff(before, after)
    assert same_json(apply(before, operations), after)
    assert (before, after) == snapshot, "diff modified its arguments"


@st.composite
def edited(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """An object with fields a handler does not know, and what a handler that sets and
    removes only its own fields under ``spec`` makes of it."""
    unknown = draw(st.dictionaries(st.sampled_from(["u1", "u/2", "u~3"]), JSON, max_size=3))
    spec = draw(st.dictionaries(st.sampled_from(["k1", "k2", "k3"]), JSON, max_size=3))
    before: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "K",
        "metadata": {"name": "n"},
        "spec": {**spec},
    }
    before["spec"].update({f"unknown-{k}": v for k, v in unknown.items()})
    before.update(unknown)
    after = copy.deepcopy(before)
    for key in draw(st.lists(st.sampled_from(["k1", "k2", "k3"]), max_size=3)):
        if draw(st.booleans()):
            after["spec"][key] = draw(JSON)
        else:
            after["spec"].pop(key, None)
    return before, after, set(unknown)


@given(edited())
def test_fields_the_handler_does_not_know_survive(
    case: tuple[dict[str, Any], dict[str, Any], set[str]],
) -> None:
    before, after, unknown = case
    operations = diff(before, after)
    patched = apply(before, operations)
    assert same_json(patched, after)
    for key in unknown:
        assert same_json(patched[key], before[key])
        assert same_json(patched["spec"][f"unknown-{key}"], before["spec"][f"unknown-{key}"])
    touched = {op["path"] for op in operations}
    assert all(p.startswith("/spec/k") for p in touched), touched


def test_equal_documents_give_no_operation() -> None:
    doc = {"a": [1, {"b": None}], "c": "d"}
    assert diff(doc, copy.deepcopy(doc)) == []


def test_json_types_are_told_apart() -> None:
    # 1 == 1.0 == True in Python, not in JSON.
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff({"a": 1}, {"a": 1.0}) == [{"op": "replace", "path": "/a", "value": 1.0}]
    assert diff([0], [False]) == [{"op": "replace", "path": "/0", "value": False}]


def test_keys_are_escaped() -> None:
    assert escape("a/b~c") == "a~1b~0c"
    assert diff({}, {"a/b": 1}) == [{"op": "add", "path": "/a~1b", "value": 1}]
