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


class Delivered:
    """The handler a held delta goes to when it was not our echo."""

    def __init__(self) -> None:
        self.deltas: list[StoreDelta] = []

    def __call__(self, delta: StoreDelta, initial: bool) -> None:
        assert not initial
        self.deltas.append(delta)


def holding() -> tuple[OwnWriteEchoes, Delivered]:
    echoes = OwnWriteEchoes(TASKS)
    delivered = Delivered()
    echoes.deliver_to(delivered)
    return echoes, delivered


def expect(echoes: OwnWriteEchoes, precondition: int) -> tuple[str, str]:
    ticket = echoes.expect(REQUEST, TASKS, "team-a", "report", str(precondition))
    assert ticket is not None
    return ticket


def test_an_echo_that_outruns_its_answer_is_held_then_dropped() -> None:
    echoes, delivered = holding()
    ticket = expect(echoes, 10)
    assert echoes(modified(10, 11)) is False
    assert echoes.deltas_held == 1
    echoes.answered(ticket, task(11))
    assert (echoes.skipped, echoes.skipped_before_answer) == (1, 1)
    assert delivered.deltas == []
    assert (echoes.deltas_held, echoes.writes_in_flight, len(echoes)) == (0, 0, 0)


def test_what_a_failed_write_held_is_delivered() -> None:
    echoes, delivered = holding()
    ticket = expect(echoes, 10)
    someone_elses = modified(10, 11)  # it came first: our write will be refused (409)
    assert echoes(someone_elses) is False
    echoes.failed(ticket)
    assert delivered.deltas == [someone_elses]
    assert echoes.skipped == 0
    assert (echoes.deltas_held, echoes.writes_in_flight) == (0, 0)


def test_what_a_write_that_changed_nothing_held_is_delivered() -> None:
    echoes, delivered = holding()
    ticket = expect(echoes, 10)
    someone_elses = modified(10, 11)
    assert echoes(someone_elses) is False
    echoes.answered(ticket, task(10))  # a no-op patch answers the version it found
    assert delivered.deltas == [someone_elses]
    assert echoes.skipped == 0


def test_a_held_delta_waits_for_every_write_on_its_precondition() -> None:
    echoes, delivered = holding()
    first, second = expect(echoes, 10), expect(echoes, 10)
    assert echoes(modified(10, 11)) is False
    echoes.failed(first)  # the other one may still have made it
    assert delivered.deltas == []
    echoes.answered(second, task(11))
    assert delivered.deltas == []
    assert echoes.skipped_before_answer == 1


def test_nothing_is_held_without_a_handler_to_deliver_to() -> None:
    echoes = OwnWriteEchoes(TASKS)
    ticket = expect(echoes, 10)
    assert echoes(modified(10, 11)) is True
    echoes.answered(ticket, task(11))
    assert echoes.skipped == 0


def test_only_a_change_from_a_precondition_in_flight_is_held() -> None:
    echoes, delivered = holding()
    ticket = expect(echoes, 10)
    assert echoes(modified(9, 10)) is True  # older history, still arriving
    assert echoes(StoreDelta("DELETED", task(10), key="team-a/report")) is True
    assert echoes(modified(10, 11, name="other")) is True
    echoes.answered(ticket, task(11))
    assert delivered.deltas == []
    assert echoes.writes_in_flight == 0


def test_writes_of_other_objects_are_not_followed() -> None:
    echoes, _ = holding()
    assert echoes.expect(REQUEST, TASKS, "team-a", "other", "10") is None
    assert echoes.expect(REQUEST, CONFIGMAPS, "team-a", "report", "10") is None
    assert echoes.expect(REQUEST, TASKS, "team-b", "report", "10") is None
    assert echoes.expect(REQUEST, TASKS, "team-a", "report", "") is None
    assert echoes.writes_in_flight == 0


# (action, flag): "ours" sends a write (flag: conditioned), "theirs" writes, "answer" answers
# the oldest write in flight, "watch" delivers every change in order (flag: else one relist
# jump over them).
Action = tuple[str, bool]
actions = st.lists(
    st.tuples(st.sampled_from(["ours", "theirs", "answer", "watch"]), st.booleans()),
    max_size=50,
)


@settings(max_examples=500, deadline=None)
@given(actions)
def test_held_or_not_no_change_of_anyone_else_is_lost(schedule: list[Action]) -> None:
    """Writes announced before they are sent, answered in order at any later point: every
    change that is not exactly one successful conditioned write of ours reaches the handler
    (at once, or when its write is answered), and every one that is (the watch's echo, or a
    relist that jumped over that write alone) is dropped, before or after the answer."""
    echoes, delivered = holding()
    server = cached = 100
    # Changes not yet delivered: (old, new, made by a conditioned write of ours).
    undelivered: list[tuple[int, int, bool]] = []
    # Writes in flight, oldest first: (ticket, the version it wrote or None if refused).
    in_flight: list[tuple[tuple[str, str], int | None]] = []
    passed: list[tuple[int, int]] = []
    must_reach: set[tuple[int, int]] = set()
    echoes_alone: set[tuple[int, int]] = set()  # echoes delivered as a change of their own

    def deliver(old: int, new: int, ours: bool) -> None:
        if ours:
            echoes_alone.add((old, new))
        else:
            must_reach.add((old, new))
        if echoes(modified(old, new)):
            passed.append((old, new))

    for action, flag in schedule + [("answer", False)] * 50 + [("watch", True)]:
        if action == "ours" and not flag:  # unconditioned: nobody follows it
            server += 1
            undelivered.append((server - 1, server, False))
        elif action == "ours":
            ticket = expect(echoes, cached)  # a reconcile reads the cache, writes on it
            if server == cached:
                server += 1
                undelivered.append((server - 1, server, True))
                in_flight.append((ticket, server))
            else:
                in_flight.append((ticket, None))  # 409 Conflict
        elif action == "theirs":
            server += 1
            undelivered.append((server - 1, server, False))
        elif action == "answer" and in_flight:
            ticket, written = in_flight.pop(0)
            if written is None:
                echoes.failed(ticket)
            else:
                echoes.answered(ticket, task(written))
        elif action == "watch" and undelivered:
            if flag:
                for old, new, ours in undelivered:
                    deliver(old, new, ours)
            else:
                ours = len(undelivered) == 1 and undelivered[0][2]
                deliver(undelivered[0][0], undelivered[-1][1], ours)
            cached = server
            undelivered.clear()
    reached = set(passed)
    for d in delivered.deltas:
        assert d.old is not None
        reached.add(
            (int(d.old["metadata"]["resourceVersion"]), int(d.obj["metadata"]["resourceVersion"]))
        )
    assert must_reach <= reached, f"changes of someone else lost: {must_reach - reached}"
    assert not (echoes_alone & reached), f"echoes reconciled: {echoes_alone & reached}"
    assert echoes.skipped == len(echoes_alone)
    assert (echoes.writes_in_flight, echoes.deltas_held) == (0, 0)
