"""The ownership mark of the operator's roles and the sweep's decision (pure): a role is swept
only when it carries this instance's mark and no PostgresUser of the instance claims it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.postgres.api import API_VERSION, USER, USER_FINALIZER
from controllers.postgres.ownership import (
    MARK_PREFIX,
    RoleOwner,
    claims_role,
    owner_of,
    parse_mark,
    unclaimed_roles,
)

NAMES = st.sampled_from(["a", "b", "db", "other"])
ROLES = st.sampled_from(["r1", "r2", "r3", "r4"])


def user(
    namespace: str,
    instance: str,
    role: str,
    *,
    deleting: bool = False,
    finalizer: bool = True,
    name: str = "u",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if finalizer:
        meta["finalizers"] = [USER_FINALIZER]
    return {
        "apiVersion": API_VERSION,
        "kind": USER,
        "metadata": meta,
        "spec": {"instanceRef": {"name": instance}, "roleName": role, "database": "d"},
    }


owners = st.builds(RoleOwner, NAMES, NAMES, st.sampled_from(["u", "v"]), st.just("d"))
users = st.builds(user, NAMES, NAMES, ROLES, deleting=st.booleans(), finalizer=st.booleans())


@given(owners)
def test_a_mark_reads_back_as_written(owner: RoleOwner) -> None:
    assert parse_mark(owner.comment()) == owner


@pytest.mark.parametrize(
    "comment",
    [
        None,
        "",
        "owned by the DBA",
        MARK_PREFIX,
        MARK_PREFIX + "instance=ns/db user=u",
        MARK_PREFIX + "instance=db user=u database=d",
        MARK_PREFIX + "instance=ns/db/x user=u database=d",
        MARK_PREFIX + "instance=ns/db user=u database=d extra=1",
        MARK_PREFIX + "instance=ns/db user=u user=v database=d",
        MARK_PREFIX + "instance=ns/db user= database=d",
        " " + MARK_PREFIX + "instance=ns/db user=u database=d",
    ],
)
def test_anything_but_a_whole_mark_is_not_ours(comment: str | None) -> None:
    assert parse_mark(comment) is None


def test_a_user_is_marked_for_its_namespace_instance_name_and_database() -> None:
    assert owner_of(user("ns", "db", "r1", name="app")) == RoleOwner("ns", "db", "app", "d")
    no_instance = user("ns", "db", "r1")
    no_instance["spec"]["instanceRef"] = {}
    assert owner_of(no_instance) is None


@given(
    st.dictionaries(ROLES, owners, max_size=4),
    NAMES,
    NAMES,
    st.lists(users, max_size=6),
)
def test_the_sweep_drops_exactly_this_instances_unclaimed_roles(
    owned: dict[str, RoleOwner], namespace: str, instance: str, listed: list[dict[str, Any]]
) -> None:
    result = unclaimed_roles(owned, namespace, instance, listed)
    assert result == sorted(result)
    for role, owner in owned.items():
        mine = (owner.namespace, owner.instance) == (namespace, instance)
        claimed = any(claims_role(u, namespace, instance, role) for u in listed)
        assert (role in result) == (mine and not claimed)
    assert set(result) <= set(owned)
    # Never a role a live user of this instance asks for, whatever its other users say.
    for u in listed:
        if not u["metadata"].get("deletionTimestamp"):
            meta_ok = u["metadata"]["namespace"] == namespace
            if meta_ok and u["spec"]["instanceRef"]["name"] == instance:
                assert u["spec"]["roleName"] not in result


def test_a_user_being_deleted_claims_its_role_only_with_the_finalizer() -> None:
    assert claims_role(user("ns", "db", "r1", deleting=True), "ns", "db", "r1")
    assert not claims_role(user("ns", "db", "r1", deleting=True, finalizer=False), "ns", "db", "r1")
    assert claims_role(user("ns", "db", "r1", finalizer=False), "ns", "db", "r1")
    assert not claims_role(user("ns", "other", "r1"), "ns", "db", "r1")
    assert not claims_role(user("other", "db", "r1"), "ns", "db", "r1")
    assert not claims_role(user("ns", "db", "r2"), "ns", "db", "r1")
