"""The two writers of a PostgresInstance's status: what counts as the other writer's change,
and how a change is rebased onto the live status."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controllers.postgres.shared_status import (
    moved_only_theirs,
    owned_by_failover,
    owned_by_instance,
    rebase_status,
)

Obj = dict[str, Any]


def cond(kind: str, status: str = "True", reason: str = "R") -> Obj:
    return {"type": kind, "status": status, "reason": reason, "lastTransitionTime": "t"}


READ: Obj = {
    "readyReplicas": 1,
    "currentPrimary": "db-0",
    "ha": {"phase": "Bootstrap"},
    "conditions": [cond("Ready", "False"), cond("PrimaryAvailable", "False")],
}


def test_ownership_splits_fields_and_condition_types() -> None:
    assert owned_by_failover("ha") and owned_by_failover("PrimaryAvailable")
    assert owned_by_instance("readyReplicas") and owned_by_instance("Ready")
    assert not owned_by_instance("currentPrimary") and not owned_by_failover("version")


def test_the_failover_controllers_write_is_theirs_for_the_instance_controller() -> None:
    live = {
        **READ,
        "currentPrimary": "db-1",
        "ha": {"phase": "Healthy"},
        "conditions": [cond("Ready", "False"), cond("PrimaryAvailable", "True")],
    }
    assert moved_only_theirs(READ, live, owned_by_instance)
    assert not moved_only_theirs(READ, live, owned_by_failover)


def test_a_moved_field_of_its_own_is_a_stale_read() -> None:
    assert not moved_only_theirs(READ, {**READ, "readyReplicas": 3}, owned_by_instance)
    ready = {**READ, "conditions": [cond("Ready"), cond("PrimaryAvailable", "False")]}
    assert not moved_only_theirs(READ, ready, owned_by_instance)
    assert not moved_only_theirs(READ, {**READ, "version": "16"}, owned_by_instance)


def test_the_rebase_keeps_the_other_writers_fields_and_conditions() -> None:
    wanted = {
        **READ,
        "readyReplicas": 3,
        "version": "16",
        "conditions": [cond("Ready"), cond("PrimaryAvailable", "False")],
    }
    live = {
        **READ,
        "currentPrimary": "db-1",
        "ha": {"phase": "Healthy"},
        "conditions": [cond("PrimaryAvailable", "True"), cond("Ready", "False")],
    }
    rebased = rebase_status(READ, wanted, live)
    assert rebased["readyReplicas"] == 3 and rebased["version"] == "16"
    assert rebased["currentPrimary"] == "db-1" and rebased["ha"] == {"phase": "Healthy"}
    by_type = {c["type"]: c for c in rebased["conditions"]}
    assert by_type == {"Ready": cond("Ready"), "PrimaryAvailable": cond("PrimaryAvailable")}


def test_a_field_or_condition_removed_by_the_writer_is_removed() -> None:
    wanted = {k: v for k, v in READ.items() if k != "readyReplicas"}
    wanted["conditions"] = [cond("PrimaryAvailable", "False")]
    rebased = rebase_status(READ, wanted, READ)
    assert "readyReplicas" not in rebased
    assert [c["type"] for c in rebased["conditions"]] == ["PrimaryAvailable"]


scalars = st.one_of(st.integers(0, 3), st.sampled_from(["a", "b"]))
statuses = st.fixed_dictionaries(
    {},
    optional={
        "readyReplicas": scalars,
        "version": scalars,
        "currentPrimary": scalars,
        "ha": st.dictionaries(st.sampled_from(["phase", "timeline"]), scalars, max_size=2),
        "conditions": st.lists(
            st.builds(
                cond,
                st.sampled_from(["Ready", "Progressing", "PrimaryAvailable"]),
                st.sampled_from(["True", "False"]),
            ),
            unique_by=lambda c: c["type"],
            max_size=3,
        ),
    },
)


def _normal(status: Obj) -> Obj:
    out = dict(status)
    if "conditions" in out:
        out["conditions"] = sorted(out["conditions"], key=lambda c: c["type"])
        if not out["conditions"]:
            del out["conditions"]
    return out


@given(statuses, statuses)
def test_with_nothing_moved_the_rebase_is_the_wanted_status(read: Obj, wanted: Obj) -> None:
    assert _normal(rebase_status(read, wanted, read)) == _normal(wanted)


@given(statuses, statuses)
def test_with_nothing_to_change_the_rebase_is_the_live_status(read: Obj, live: Obj) -> None:
    assert _normal(rebase_status(read, read, live)) == _normal(live)


@given(statuses, statuses, statuses)
def test_the_rebase_has_every_change_of_the_writer(read: Obj, wanted: Obj, live: Obj) -> None:
    rebased = rebase_status(read, wanted, live)
    for key in set(read) | set(wanted):
        if key != "conditions" and read.get(key) != wanted.get(key):
            assert rebased.get(key) == wanted.get(key)
    wanted_c = {c["type"]: c for c in wanted.get("conditions", [])}
    read_c = {c["type"]: c for c in read.get("conditions", [])}
    got = {c["type"]: c for c in rebased.get("conditions", [])}
    for kind in set(read_c) | set(wanted_c):
        if read_c.get(kind) != wanted_c.get(kind):
            assert got.get(kind) == wanted_c.get(kind)
