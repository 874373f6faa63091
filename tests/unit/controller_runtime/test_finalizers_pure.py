"""Finalizers without a server: the in-place helpers and the JSON patches they send."""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.cache import ByObject
from controller_runtime.patches import add_finalizer_patch, merge_patch, remove_finalizer_patch
from controller_runtime.reconcile import TerminalError
from controller_runtime.util import (
    FinalizerSelectionError,
    add_finalizer,
    contains_finalizer,
    ensure_finalizer,
    handle_finalization,
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


class _SelectedClient:
    """A client whose cache selects Tasks; any request would be a failure of the test."""

    def __init__(self, by_object: dict[tuple[str, str], ByObject]) -> None:
        self.cache = type("C", (), {"by_object": by_object})()

    @property
    def live(self) -> Any:
        raise AssertionError("no request may be sent")

    async def patch(self, obj: Any, patch: Any, *, patch_type: str = "merge") -> Any:
        raise AssertionError("no request may be sent")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (ByObject(label_selector="team=a"), "label selector 'team=a'"),
        (ByObject(field_selector="metadata.name=a"), "field selector 'metadata.name=a'"),
    ],
)
async def test_no_finalizer_is_added_to_a_kind_the_cache_selects(
    options: ByObject, named: str
) -> None:
    """Relabelled out of the selection, the object would leave the cache and its finalizer
    would never be removed: refused before any request, as a terminal error."""
    client = _SelectedClient({("tasks.crpy.io/v1", "Task"): options})

    async def cleanup(_: dict[str, Any]) -> None:
        raise AssertionError("no cleanup")

    with pytest.raises(FinalizerSelectionError, match=named) as refused:
        await handle_finalization(client, obj(uid="u1"), OURS, cleanup)
    assert isinstance(refused.value, TerminalError)
    # Already carrying it (added before the selector): nothing to add, nothing refused.
    already = obj([OURS], uid="u1")
    assert (await ensure_finalizer(client, already, OURS)) is already
    # Another kind, or a namespace-only scope: allowed (the patch would be sent).
    other = _SelectedClient({("tasks.crpy.io/v1", "Task"): ByObject(namespaces=("ns",))})
    with pytest.raises(AssertionError, match="no request"):
        await ensure_finalizer(other, obj(uid="u1"), OURS)
