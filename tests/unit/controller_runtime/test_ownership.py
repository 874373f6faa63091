"""Owner and controller references: the shape they get and the validations."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller_runtime.util import (
    AlreadyOwnedError,
    ClusterScopedDependentError,
    CrossNamespaceOwnerError,
    OwnerReferenceError,
    get_controller_of,
    has_controller_reference,
    is_controlled_by,
    remove_owner_reference,
    set_controller_reference,
    set_owner_reference,
)

NS = {"owner_namespaced": True, "obj_namespaced": True}


def obj(
    kind: str = "ConfigMap",
    name: str = "child",
    namespace: str | None = "ns",
    api_version: str = "v1",
    uid: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if uid:
        meta["uid"] = uid
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def task(name: str = "owner", uid: str = "uid-1", namespace: str | None = "ns") -> dict[str, Any]:
    return obj("Task", name, namespace, "tasks.crpy.io/v1", uid)


def test_controller_reference_has_both_flags_and_the_owner_identity() -> None:
    child = obj()
    assert set_controller_reference(task(), child, **NS)
    assert child["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "tasks.crpy.io/v1",
            "kind": "Task",
            "name": "owner",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert get_controller_of(child) == child["metadata"]["ownerReferences"][0]
    assert has_controller_reference(child)
    assert is_controlled_by(child, task())
    assert not is_controlled_by(child, task(uid="uid-other"))


def test_setting_it_again_is_a_no_op_and_a_recreated_owner_refreshes_the_uid() -> None:
    child = obj()
    set_controller_reference(task(), child, **NS)
    assert not set_controller_reference(task(), child, **NS)
    # The same owner at another version is the same owner (group, kind and name count).
    assert set_controller_reference(task(uid="uid-2"), child, **NS)
    refs = child["metadata"]["ownerReferences"]
    assert len(refs) == 1 and refs[0]["uid"] == "uid-2"


def test_block_owner_deletion_can_be_turned_off() -> None:
    child = obj()
    set_controller_reference(task(), child, **NS, block_owner_deletion=False)
    assert child["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is False


def test_a_second_controller_is_refused_with_a_helpful_message_and_nothing_changes() -> None:
    child = obj()
    set_controller_reference(task("first"), child, **NS)
    before = copy.deepcopy(child)
    with pytest.raises(AlreadyOwnedError) as caught:
        set_controller_reference(task("second", uid="uid-2"), child, **NS)
    message = str(caught.value)
    assert "ConfigMap ns/child" in message and "'first'" in message
    assert "set_owner_reference" in message
    assert caught.value.existing["name"] == "first"
    assert child == before


def test_plain_owner_references_accumulate_and_keep_a_controller_flag() -> None:
    child = obj()
    set_controller_reference(task("a"), child, **NS)
    assert set_owner_reference(task("b", uid="uid-b"), child, **NS)
    assert not set_owner_reference(task("a"), child, **NS)  # keeps controller=True
    refs = {r["name"]: r for r in child["metadata"]["ownerReferences"]}
    assert refs["a"]["controller"] is True and refs["a"]["blockOwnerDeletion"] is True
    assert "controller" not in refs["b"] and "blockOwnerDeletion" not in refs["b"]
    assert get_controller_of(child) == refs["a"]


def test_cross_namespace_owner_is_refused() -> None:
    child = obj(namespace="other")
    with pytest.raises(CrossNamespaceOwnerError, match="cross-namespace"):
        set_controller_reference(task(), child, **NS)
    with pytest.raises(CrossNamespaceOwnerError):
        set_owner_reference(task(), child, **NS)
    assert "ownerReferences" not in child["metadata"]


def test_dependent_without_namespace_cannot_be_checked() -> None:
    with pytest.raises(CrossNamespaceOwnerError, match=r"set metadata\.namespace"):
        set_controller_reference(task(), obj(namespace=None), **NS)


def test_namespaced_owner_of_a_cluster_scoped_object_is_refused() -> None:
    cluster_role = obj("ClusterRole", "r", None, "rbac.authorization.k8s.io/v1")
    with pytest.raises(ClusterScopedDependentError, match="cluster-scoped"):
        set_controller_reference(task(), cluster_role, owner_namespaced=True, obj_namespaced=False)


def test_cluster_scoped_owner_may_own_anything() -> None:
    namespace_owner = obj("Namespace", "ns", None, uid="uid-ns")
    child = obj()
    set_controller_reference(namespace_owner, child, owner_namespaced=False, obj_namespaced=True)
    other = obj("ClusterRole", "r", None, "rbac.authorization.k8s.io/v1")
    set_owner_reference(namespace_owner, other, owner_namespaced=False, obj_namespaced=False)
    assert child["metadata"]["ownerReferences"][0]["kind"] == "Namespace"
    assert other["metadata"]["ownerReferences"][0]["uid"] == "uid-ns"


def test_an_owner_without_uid_is_refused() -> None:
    with pytest.raises(OwnerReferenceError, match=r"metadata\.uid"):
        set_controller_reference(obj("Task", "owner", "ns", "tasks.crpy.io/v1"), obj(), **NS)


def test_remove_owner_reference() -> None:
    child = obj()
    set_controller_reference(task("a"), child, **NS)
    set_owner_reference(task("b", uid="uid-b"), child, **NS)
    assert remove_owner_reference(task("a"), child)
    assert not has_controller_reference(child)
    assert not remove_owner_reference(task("a"), child)
    assert remove_owner_reference(task("b"), child)
    assert "ownerReferences" not in child["metadata"]
