"""Finalizers without a server: the in-place helpers and the JSON patches they send."""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.patches import add_finalizer_patch, merge_patch, remove_finalizer_patch
from controller_runtime.util import (
    add_finalizer,
    contains_finalizer,
    is_being_deleted,
    remove_finalizer,
)

OURS = "crpy.io/cleanup"


def obj(finalizers: list[str] | None = None, rv: str = "7", uid: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "a", "namespace": "ns", "resourceVersion": rv}
    if uid:
        meta["uid"] = uid
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"apiVersion": "tasks.crpy.io/v1", "kind": "Task", "metadata": meta}


def test_add_contains_remove_in_place() -> None:
    task = obj()
    assert not contains_finalizer(task, OURS)
    assert add_finalizer(task, OURS)
    assert not add_finalizer(task, OURS)
    assert task["metadata"]["finalizers"] == [OURS]
    add_finalizer(task, "other/x")
    assert remove_finalizer(task, OURS)
    assert not remove_finalizer(task, OURS)
    assert task["metadata"]["finalizers"] == ["other/x"]
    assert not contains_finalizer({}, OURS)


def test_remove_drops_duplicates_and_keeps_the_order_of_others() -> None:
    task = obj(["b", OURS, "a", OURS])
    remove_finalizer(task, OURS)
    assert task["metadata"]["finalizers"] == ["b", "a"]


def test_add_patch_pins_the_existing_list() -> None:
    assert add_finalizer_patch(obj(["other/x"]), OURS) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["other/x"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": OURS},
    ]
    assert add_finalizer_patch(obj(["other/x", OURS]), OURS) is None


@pytest.mark.parametrize("finalizers", [None, []])
def test_add_patch_without_a_list_pins_the_resource_version(finalizers: list[str] | None) -> None:
    assert add_finalizer_patch(obj(finalizers, rv="42"), OURS) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/metadata/finalizers", "value": [OURS]},
    ]
    with pytest.raises(ValueError, match="resourceVersion"):
        add_finalizer_patch(obj(finalizers, rv=""), OURS)


def test_remove_patch_tests_the_whole_list_and_replaces_only_ours() -> None:
    assert remove_finalizer_patch(obj(["a", OURS, "b"]), OURS) == [
        {"op": "test", "path": "/metadata/finalizers", "value": ["a", OURS, "b"]},
        {"op": "replace", "path": "/metadata/finalizers", "value": ["a", "b"]},
    ]
    assert remove_finalizer_patch(obj(["a"]), OURS) is None
    assert remove_finalizer_patch(obj(), OURS) is None


def test_patches_pin_the_uid_when_known() -> None:
    pin = {"op": "test", "path": "/metadata/uid", "value": "u-1"}
    added = add_finalizer_patch(obj(["x"], uid="u-1"), OURS)
    created = add_finalizer_patch(obj(uid="u-1"), OURS)
    removed = remove_finalizer_patch(obj([OURS], uid="u-1"), OURS)
    assert added is not None and created is not None and removed is not None
    assert added[0] == created[0] == removed[0] == pin
    assert len(added) == len(created) == len(removed) == 3


def test_is_being_deleted() -> None:
    task = obj()
    assert not is_being_deleted(task)
    task["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert is_being_deleted(task)


def test_merge_patch_diff() -> None:
    before = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2], "gone": True}
    after = {"a": 1, "b": {"c": 2, "d": 4, "n": None}, "e": [1], "new": {"x": 1}}
    assert merge_patch(before, after) == {
        "b": {"d": 4, "n": None},
        "e": [1],
        "gone": None,
        "new": {"x": 1},
    }
    assert merge_patch(before, before) == {}
