"""Typed resources: decoding, encoding, and unknown fields surviving a read-modify-write."""

from __future__ import annotations

import copy
import typing
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.resource import (
    Conditions,
    Enum,
    ListType,
    Resource,
    ResourceDecodeError,
    Schema,
    crd,
    field,
    guess_plural,
    is_resource_class,
    registered,
    resource_info,
    split_target,
)
from controllers.api import Task, TaskSpec, TaskStatus

# -- strategies: Task objects as the API server returns them, plus fields no class knows ----

KNOWN = {
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "creationTimestamp",
    "deletionTimestamp",
    "generateName",
    "deletionGracePeriodSeconds",
    "priority",
    "details",
    "deadline",
    "taskState",
    "state",
    "observedGeneration",
    "conditions",
    "type",
    "lastTransitionTime",
    "reason",
    "message",
}
names = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
unknown_keys = names.map(lambda s: f"x{s}").filter(lambda k: k not in KNOWN)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
extras = st.dictionaries(unknown_keys, json_values, max_size=3)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(lambda t: t.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ"))


@st.composite
def task_dicts(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": draw(st.integers(1, 5))}
    if draw(st.booleans()):
        spec["details"] = draw(st.text(min_size=1, max_size=20))
    if draw(st.booleans()):
        spec["deadline"] = draw(times)
    spec["taskState"] = draw(st.sampled_from(["Pending", "InProgress", "Done", "Cancelled"]))
    spec.update(draw(extras))
    types = draw(st.lists(names, unique=True, max_size=3))
    conditions = [
        {
            "type": t,
            "status": draw(st.sampled_from(["True", "False", "Unknown"])),
            "lastTransitionTime": draw(times),
            "reason": "Because",
            **draw(extras),
        }
        for t in types
    ]
    status: dict[str, Any] = {"state": "Pending", "observedGeneration": draw(st.integers(1, 9))}
    if conditions:
        status["conditions"] = conditions
    status.update(draw(extras))
    metadata = {
        "name": draw(names),
        "namespace": draw(names),
        "uid": "u-1",
        "resourceVersion": str(draw(st.integers(1, 10**6))),
        "generation": draw(st.integers(1, 9)),
        "creationTimestamp": draw(times),
        "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        **draw(extras),
    }
    labels = draw(st.dictionaries(names, names, max_size=2))
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": metadata,
        "spec": spec,
        "status": status,
        **draw(extras),
    }


@given(task_dicts())
def test_a_read_then_write_sends_back_exactly_what_was_read(task: dict[str, Any]) -> None:
    # Unknown fields at every level (top, metadata, spec, status, each condition) included.
    assert Task.from_dict(task).to_dict() == task
    assert Task.from_json(orjson.dumps(task)).to_dict() == task


@given(task_dicts(), st.integers(1, 5))
def test_a_change_to_a_known_field_keeps_every_unknown_one(task: dict[str, Any], p: int) -> None:
    typed = Task.from_dict(task)
    typed.spec.priority = p
    typed.spec.details = None  # a known field set to None is removed
    written = typed.to_dict()
    expected = copy.deepcopy(task)
    expected["spec"]["priority"] = p
    expected["spec"].pop("details", None)
    assert written == expected


@given(task_dicts())
def test_conditions_keep_their_unknown_fields_by_type_when_reordered(task: dict[str, Any]) -> None:
    typed = Task.from_dict(task)
    typed.status.conditions.reverse()
    written = typed.to_dict()
    before = {c["type"]: c for c in task["status"].get("conditions", [])}
    after = {c["type"]: c for c in written["status"].get("conditions", [])}
    assert after == before


def test_decoded_values_are_typed() -> None:
    task = Task.from_dict(
        {
            "metadata": {"name": "a", "namespace": "ns", "generation": 2},
            "spec": {"priority": 4, "deadline": "2030-01-01T00:00:00Z"},
        }
    )
    assert task.spec.deadline == datetime(2030, 1, 1, tzinfo=UTC)
    assert task.spec.task_state == "Pending"  # the default
    assert task.status == TaskStatus()
    assert (task.name, task.namespace, task.metadata.generation) == ("a", "ns", 2)
    assert Task.api_version == "tasks.crpy.io/v1" and Task.kind == "Task"


def test_a_new_object_encodes_its_api_version_and_kind_first() -> None:
    task = Task(spec=TaskSpec(priority=2))
    task.metadata.name, task.metadata.namespace = "a", "ns"
    body = task.to_dict()
    assert list(body)[:2] == ["apiVersion", "kind"]
    assert body["apiVersion"] == "tasks.crpy.io/v1" and body["kind"] == "Task"
    assert body["metadata"] == {"name": "a", "namespace": "ns"}
    assert body["spec"] == {"priority": 2}


def test_an_enum_value_a_newer_crd_added_still_decodes() -> None:
    # Markers describe the CRD; they are not re-checked on the client.
    task = Task.from_dict({"spec": {"priority": 9, "taskState": "Blocked"}})
    assert (task.spec.priority, task.spec.task_state) == (9, "Blocked")


def test_a_field_of_the_wrong_type_names_the_object_and_the_field() -> None:
    data = {"metadata": {"name": "a", "namespace": "ns"}, "spec": {"priority": "high"}}
    with pytest.raises(ResourceDecodeError, match=r"Task ns/a .*\$\.spec\.priority"):
        Task.from_dict(data)
    with pytest.raises(ResourceDecodeError, match=r"Task ns/a"):
        Task.from_json(orjson.dumps(data))


def test_copies_carry_the_unknown_fields() -> None:
    data = {"metadata": {"name": "a", "x": 1}, "spec": {"priority": 1, "future": True}}
    task = Task.from_dict(data)
    for clone in (copy.copy(task), copy.deepcopy(task)):
        assert clone == task
        assert clone.to_dict()["spec"]["future"] is True
        assert clone.to_dict()["metadata"]["x"] == 1
    deep = copy.deepcopy(task)
    deep.spec.priority = 5
    assert task.spec.priority == 1


def test_from_dict_does_not_alias_the_input() -> None:
    data: dict[str, Any] = {"spec": {"priority": 1, "future": {"a": 1}}}
    task = Task.from_dict(data)
    data["spec"]["future"]["a"] = 2
    assert task.to_dict()["spec"]["future"] == {"a": 1}
    written = task.to_dict()
    written["spec"]["future"]["a"] = 3
    assert task.to_dict()["spec"]["future"] == {"a": 1}


# -- declaring --------------------------------------------------------------------------------


class GadgetPart(Schema):
    name: str
    extra: int = 0


class GadgetSpec(Schema):
    parts: Annotated[list[GadgetPart], ListType("map", keys=("name",))] = field(
        default_factory=list
    )
    by_name: dict[str, GadgetPart] = field(default_factory=dict)
    color: Annotated[str, Enum("red")] = "red"


@crd(group="example.com", version="v1", scope="Cluster")
class Gadget(Resource):
    spec: GadgetSpec = field(default_factory=GadgetSpec)


def test_crd_fills_in_names_and_registers_the_class() -> None:
    info = resource_info(Gadget)
    assert (info.plural, info.singular, info.list_kind) == ("gadgets", "gadget", "GadgetList")
    assert info.scope == "Cluster" and not info.status_subresource
    assert resource_info(Task).status_subresource
    assert registered("example.com/v1", "Gadget") is Gadget
    assert is_resource_class(Gadget) and not is_resource_class(GadgetSpec)
    with pytest.raises(TypeError, match="not declared with @crd"):
        resource_info(Resource)


def test_maps_of_objects_keep_unknown_fields_by_key() -> None:
    data = {
        "spec": {
            "parts": [{"name": "a", "keep": 1}, {"name": "b", "keep": 2}],
            "byName": {"x": {"name": "x", "keep": 3}},
        }
    }
    gadget = Gadget.from_dict(data)
    gadget.spec.parts = [gadget.spec.parts[1], GadgetPart(name="c")]
    written = gadget.to_dict()["spec"]
    assert written["parts"] == [{"name": "b", "keep": 2}, {"name": "c"}]
    assert written["byName"] == {"x": {"name": "x", "keep": 3}}


@pytest.mark.parametrize(
    ("kind", "plural"),
    [
        ("Task", "tasks"),
        ("PostgresVersionPolicy", "postgresversionpolicies"),
        ("Ingress", "ingresses"),
        ("Gateway", "gateways"),
        ("Box", "boxes"),
        ("Batch", "batches"),
    ],
)
def test_guess_plural(kind: str, plural: str) -> None:
    assert guess_plural(kind) == plural


def test_split_target_takes_strings_or_a_class_and_refuses_mixtures() -> None:
    assert split_target("v1", "ConfigMap", None, method="m") == (None, "v1", "ConfigMap", None)
    assert split_target(Task, "key", None, method="m") == (Task, Task.api_version, "Task", "key")
    with pytest.raises(TypeError, match="pass the key once"):
        split_target(Task, "key", "again", method="m")
    with pytest.raises(TypeError, match="comes the kind as a string"):
        split_target("v1", None, None, method="m")
    with pytest.raises(TypeError, match="declared with @crd"):
        split_target(TaskSpec, None, None, method="m")


def test_list_type_map_needs_keys() -> None:
    with pytest.raises(ValueError, match="needs keys"):
        ListType("map")
    with pytest.raises(ValueError, match="only a map list"):
        ListType("set", keys=("a",))


def test_conditions_alias_is_a_map_list_by_type() -> None:
    assert ListType("map", keys=("type",)) in typing.get_args(Conditions)[1:]
