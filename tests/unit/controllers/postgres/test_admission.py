"""The admission rules of the PostgreSQL API (controllers.postgres.admission), pure: the
version policy at admission, no major downgrade, no storage shrink, one role per name and
instance, and the policy's default version."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.postgres.admission import (
    binding_role_conflict,
    defaulted_version,
    instance_refusals,
    parse_quantity,
    role_name,
)
from controllers.postgres.api import API_VERSION, LABEL_BINDING

POLICY: dict[str, Any] = {
    "apiVersion": API_VERSION,
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {
        "defaultVersion": "16",
        "versions": [
            {"version": "15"},
            {"version": "16"},
            {"version": "14", "enabled": False},
        ],
    },
}


def instance(version: str | None = "16", size: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = dict(spec)
    if version is not None:
        body["version"] = version
    if size is not None:
        body["storage"] = {"size": size}
    return {
        "apiVersion": API_VERSION,
        "kind": "PostgresInstance",
        "metadata": {"name": "db", "namespace": "apps"},
        "spec": body,
    }


def fields(refusals: list[Any]) -> list[str]:
    return [r.field for r in refusals]


def test_a_version_the_policy_enables_is_accepted() -> None:
    assert instance_refusals(instance("16"), None, POLICY) == []
    assert instance_refusals(instance("15.4"), None, POLICY) == []


def test_a_version_the_policy_does_not_enable_is_refused_with_its_verdict() -> None:
    (refusal,) = instance_refusals(instance("14"), None, POLICY)
    assert refusal.field == "spec.version"
    assert refusal.message == "version 14 is disabled by the version policy (enabled: 15, 16)"
    (refusal,) = instance_refusals(instance("13"), None, POLICY)
    assert refusal.message == "version 13 is not enabled in the version policy (enabled: 15, 16)"


def test_without_a_policy_the_instance_is_accepted_and_waits() -> None:
    assert instance_refusals(instance("13"), None, None) == []


def test_a_disabled_version_that_already_runs_keeps_running() -> None:
    old = instance("14")
    new = instance("14", parameters={"work_mem": "8MB"})
    assert instance_refusals(new, old, POLICY) == []


def test_a_major_upgrade_needs_its_flag() -> None:
    old = instance("15")
    (refusal,) = instance_refusals(instance("16"), old, POLICY)
    assert "allowMajorVersionUpgrade" in refusal.message
    assert instance_refusals(instance("16", allowMajorVersionUpgrade=True), old, POLICY) == []


@pytest.mark.parametrize("allow", [False, True])
def test_a_major_downgrade_is_refused_whatever_the_flag(allow: bool) -> None:
    old = instance("16")
    old["status"] = {"version": "16.2"}
    refusals = instance_refusals(instance("15", allowMajorVersionUpgrade=allow), old, POLICY)
    assert "spec.version" in fields(refusals)
    assert any("downgrade (16 to 15)" in r.message for r in refusals)


def test_a_minor_downgrade_is_accepted() -> None:
    assert instance_refusals(instance("16.1"), instance("16.2"), POLICY) == []


def test_the_running_version_counts_when_the_spec_moved_ahead_of_it() -> None:
    old = instance("16", allowMajorVersionUpgrade=True)
    old["status"] = {"version": "15.6"}  # the upgrade to 16 has not happened yet
    assert instance_refusals(instance("15", allowMajorVersionUpgrade=True), old, POLICY) == []


@pytest.mark.parametrize(
    ("before", "after", "refused"),
    [
        ("20Gi", "10Gi", True),
        ("20Gi", "20Gi", False),
        ("20Gi", "21474836480", False),  # the same size, written in bytes
        ("1Gi", "1G", True),  # 10^9 < 2^30
        ("1G", "1Gi", False),
        (None, "512Mi", True),  # the default is 1Gi
        ("1.5Gi", "1536Mi", False),
    ],
)
def test_storage_may_grow_but_not_shrink(before: str | None, after: str, refused: bool) -> None:
    refusals = instance_refusals(instance("16", after), instance("16", before), POLICY)
    assert ("spec.storage.size" in fields(refusals)) is refused


_UNITS = ["", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"]


@given(
    st.integers(0, 10**6), st.sampled_from(_UNITS), st.integers(0, 10**6), st.sampled_from(_UNITS)
)
def test_quantities_compare_as_the_bytes_they_are(a: int, ua: str, b: int, ub: str) -> None:
    factors = {"": 1, "k": 1000, "M": 10**6, "G": 10**9, "T": 10**12}
    factors |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    qa, qb = parse_quantity(f"{a}{ua}"), parse_quantity(f"{b}{ub}")
    assert qa == Decimal(a * factors[ua]) and qb == Decimal(b * factors[ub])
    assert (qa < qb) == (a * factors[ua] < b * factors[ub])


@pytest.mark.parametrize("text", ["", "Gi", "1.Gi", "-1Gi", "1gi", "1 Gi", "1e3"])
def test_a_quantity_the_pattern_refuses_is_none(text: str) -> None:
    assert parse_quantity(text) is None


def test_an_in_cluster_instance_without_a_version_gets_the_policy_default() -> None:
    assert defaulted_version(instance(None), POLICY) == "16"
    assert defaulted_version(instance("15"), POLICY) is None
    assert defaulted_version(instance(None, external={"host": "db"}), POLICY) is None
    assert defaulted_version(instance(None), None) is None


@pytest.mark.parametrize("default", ["14", "17", "x", None])
def test_a_default_the_policy_does_not_enable_is_not_applied(default: str | None) -> None:
    policy = {**POLICY, "spec": {**POLICY["spec"], "defaultVersion": default}}
    assert defaulted_version(instance(None), policy) is None


def binding(name: str, instance_name: str = "db", role: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"instanceRef": {"name": instance_name}}
    if role is not None:
        spec["roleName"] = role
    return {"metadata": {"name": name, "namespace": "apps"}, "spec": spec}


def user(
    name: str, role: str, instance_name: str = "db", owner: str | None = None
) -> dict[str, Any]:
    labels = {LABEL_BINDING: owner} if owner else {}
    return {
        "metadata": {"name": name, "namespace": "apps", "labels": labels},
        "spec": {"instanceRef": {"name": instance_name}, "roleName": role},
    }


def test_two_bindings_with_one_role_on_one_instance_conflict() -> None:
    new = binding("shop", role="shop_app")
    refusal = binding_role_conflict(new, [binding("orders", role="shop_app"), new], [])
    assert refusal is not None and refusal.field == "spec.roleName"
    assert "ServiceBinding orders" in refusal.message


def test_a_derived_role_counts_as_the_role() -> None:
    new = binding("shop")
    derived = role_name(new)
    assert derived == "apps_shop"
    assert binding_role_conflict(new, [binding("other", role=derived)], []) is not None


def test_the_same_role_on_another_instance_does_not_conflict() -> None:
    new = binding("shop", role="app")
    assert binding_role_conflict(new, [binding("other", "db2", role="app")], []) is None


def test_a_postgres_user_with_the_role_conflicts_unless_it_is_the_bindings_own() -> None:
    new = binding("shop", role="app")
    assert binding_role_conflict(new, [], [user("shop", "app", owner="shop")]) is None
    refusal = binding_role_conflict(new, [], [user("manual", "app")])
    assert refusal is not None and "PostgresUser manual" in refusal.message


def test_an_update_of_a_binding_does_not_conflict_with_itself() -> None:
    new = binding("shop", role="app")
    assert binding_role_conflict(new, [binding("shop", role="app")], []) is None


@given(
    st.dictionaries(
        st.sampled_from(["spec", "metadata", "status"]),
        st.one_of(st.none(), st.text(), st.integers(), st.dictionaries(st.text(), st.text())),
    )
)
def test_malformed_objects_never_raise(obj: dict[str, Any]) -> None:
    instance_refusals(obj, obj, POLICY)
    defaulted_version(obj, POLICY)
    binding_role_conflict(obj, [obj], [obj])
