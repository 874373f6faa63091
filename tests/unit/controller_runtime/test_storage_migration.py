"""The storage-version migration's plan (pure): which CRDs need their objects rewritten."""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.storage_migration import plan_migration


def crd(stored: list[str] | None, *versions: tuple[str, bool]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {"name": "widgets.example.com", "resourceVersion": "42"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": n, "served": True, "storage": s} for n, s in versions],
        },
    }
    if stored is not None:
        out["status"] = {"storedVersions": stored}
    return out


def test_objects_stored_in_an_old_version_are_planned_for_a_rewrite() -> None:
    plan = plan_migration(crd(["v1alpha1", "v1beta1"], ("v1beta1", True), ("v1alpha1", False)))
    assert plan is not None
    assert (plan.api_version, plan.kind, plan.storage_version) == (
        "example.com/v1beta1",
        "Widget",
        "v1beta1",
    )
    assert plan.stored_versions == ("v1alpha1", "v1beta1")
    assert plan.resource_version == "42"


def test_a_storage_version_that_changed_but_not_yet_written_counts_too() -> None:
    plan = plan_migration(crd(["v1alpha1"], ("v1beta1", True), ("v1alpha1", False)))
    assert plan is not None and plan.storage_version == "v1beta1"


@pytest.mark.parametrize(
    "document",
    [
        crd(["v1beta1"], ("v1beta1", True), ("v1alpha1", False)),  # done
        crd(None, ("v1beta1", True)),  # no status yet: nothing stored
        crd(["v1alpha1"], ("v1beta1", False), ("v1alpha1", False)),  # no storage version
        {"metadata": {}, "spec": None},
        {},
    ],
)
def test_nothing_to_do(document: dict[str, Any]) -> None:
    assert plan_migration(document) is None
