"""OwnWriteEchoes: the echo of a conditioned write of our own is dropped, nothing else is.

The property test models one object on a server: our reconciles read the cached version and
write, conditioned on it (the server refuses a stale one) or not; someone else writes too; the
watch delivers each change in order, or a relist delivers one jump over several, and our
client reports a write before or after its echo arrives. Whatever the schedule, a dropped
delta is exactly one conditioned write of ours, and every echo recorded in time is dropped.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_runtime.consistency import OwnWriteEchoes, is_own_echo
from controller_runtime.reconcile import Request
from informers.store import StoreDelta
from kubeclient.discovery import ResourceInfo

TASKS = ResourceInfo("tasks.crpy.io", "v1", "Task", "tasks", namespaced=True)
CONFIGMAPS = ResourceInfo("", "v1", "ConfigMap", "configmaps", namespaced=True)
REQUEST = Request("team-a", "report")


def task(rv: int | str, name: str = "report") -> dict[str, Any]:
    return {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": {"namespace": "team-a", "name": name, "resourceVersion": str(rv)},
    }


def modified(old: int, new: int, name: str = "report") -> StoreDelta:
    return StoreDelta(
        "MODIFIED", task(new, name), orjson.dumps(task(old, name)), key=f"team-a/{name}"
    )


def test_is_own_echo_needs_both_ends() -> None:
    chain = {"10": "11"}
    assert is_own_echo(chain, "10", "11")
    assert not is_own_echo(chain, "9", "11")  # a relist that jumped over someone's change
    assert not is_own_echo(chain, "10", "12")
    assert not is_own_echo(chain, None, "11")


def test_the_echo_of_a_conditioned_write_is_dropped_once() -> None:
    echoes = OwnWriteEchoes(TASKS)
    echoes.record(REQUEST, TASKS, "10", task(11))
    assert echoes(modified(10, 11)) is False
    assert echoes.skipped == 1
    assert len(echoes) == 0
    # Seen again (it cannot be, but a later change from there must pass).
    assert echoes(modified(10, 11)) is True


def test_other_objects_kinds_and_requests_are_not_recorded() -> None:
    echoes = OwnWriteEchoes(TASKS)
    echoes.record(REQUEST, CONFIGMAPS, "10", task(11))  # another kind
    echoes.record(REQUEST, TASKS, "10", task(11, name="other"))  # another object
    echoes.record(Request("team-a", "other"), TASKS, "10", task(11))  # another reconcile's
    echoes.record(REQUEST, TASKS, "", task(11))  # unconditioned
    assert len(echoes) == 0
    assert echoes(modified(10, 11)) is True


def test_a_chain_of_writes_in_one_reconcile_is_dropped_step_by_step() -> None:
    echoes = OwnWriteEchoes(TASKS)
    echoes.record(REQUEST, TASKS, "10", task(11))
    echoes.record(REQUEST, TASKS, "11", task(12))
    assert echoes(modified(10, 11)) is False
    assert echoes(modified(11, 12)) is False
    assert len(echoes) == 0


def test_any_other_change_forgets_the_object() -> None:
    echoes = OwnWriteEchoes(TASKS)
    echoes.record(REQUEST, TASKS, "10", task(11))
    assert echoes(modified(10, 12)) is True
    assert len(echoes) == 0
    deleted = StoreDelta("DELETED", task(11), key="team-a/report")
    echoes.record(REQUEST, TASKS, "11", task(12))
    assert echoes(deleted) is True
    assert len(echoes) == 0


def test_records_are_bounded() -> None:
    echoes = OwnWriteEchoes(TASKS, max_records=3)
    for i in range(10):
        name = f"t{i}"
        echoes.record(Request("team-a", name), TASKS, "10", task(11, name))
    assert len(echoes) == 3
    assert echoes(modified(10, 11, "t9")) is False
    assert echoes(modified(10, 11, "t0")) is True  # dropped first: only a skip is lost


# (author, conditioned, record before the echo, delivery: 0 none, 1 watch, 2 relist)
Step = tuple[str, bool, bool, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["ours", "theirs"]),
        st.booleans(),
        st.booleans(),
        st.sampled_from([0, 1, 2]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_no_change_of_anyone_else_is_ever_dropped(schedule: list[Step]) -> None:
    echoes = OwnWriteEchoes(TASKS)
    server = cached = 100
    # Undelivered changes in order: (old, new, is ours and conditioned).
    undelivered: list[tuple[int, int, bool]] = []
    late_records: list[tuple[str, int]] = []
    expected_drops = 0
    for author, conditioned, record_early, delivery in schedule:
        if author == "ours":
            base = cached  # a reconcile reads the cache
            if conditioned and server != base:
                pass  # 409 Conflict: the server refuses a write on a stale version
            else:
                server += 1
                undelivered.append((server - 1, server, conditioned))
                if conditioned:
                    if record_early:
                        echoes.record(REQUEST, TASKS, str(base), task(server))
                    else:
                        late_records.append((str(base), server))
        else:
            server += 1
            undelivered.append((server - 1, server, False))
        if delivery == 1:  # the watch: every change, in order
            for old, new, ours in undelivered:
                recorded = ours and not any(r == (str(old), new) for r in late_records)
                dropped = not echoes(modified(old, new))
                assert not dropped or ours, f"a change {old}->{new} of someone else was dropped"
                if recorded and ours:
                    expected_drops += 1
                    assert dropped, f"the echo {old}->{new} of a recorded write passed"
            cached = server
            undelivered.clear()
        elif delivery == 2 and undelivered:  # a relist: one jump
            old, new = undelivered[0][0], undelivered[-1][1]
            dropped = not echoes(modified(old, new))
            if dropped:
                assert len(undelivered) == 1 and undelivered[0][2]
                expected_drops += 1
            cached = server
            undelivered.clear()
        for base_rv, written in late_records:
            echoes.record(REQUEST, TASKS, base_rv, task(written))
        late_records.clear()
    assert echoes.skipped == expected_drops
