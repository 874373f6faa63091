"""The shard hash, selectors and the client-side filter; the division of slots over members."""

from __future__ import annotations

import itertools
import logging
import statistics
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_runtime.sharding import ShardRingConfig, assign_slots, slot_selector
from informers.sharding import (
    HASH_SPACE,
    HashRange,
    ShardField,
    ShardFilter,
    ShardSelector,
    fnv1a64,
    split_hash_space,
)


def test_fnv1a64_matches_the_published_test_vectors() -> None:
    # From the FNV reference (Fowler/Noll/Vo) test suite.
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


def test_wire_form_is_what_the_api_server_accepts() -> None:
    # 16 hex digits for every bound; the end 2**64 needs a 17th, which the server accepts.
    selector = ShardSelector(
        ShardField.UID, [HashRange(0, 1 << 63), HashRange(3 << 62, HASH_SPACE)]
    )
    assert selector.wire == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || "
        "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
    )


def test_touching_and_overlapping_ranges_merge() -> None:
    selector = ShardSelector(
        ShardField.NAMESPACE, [HashRange(10, 20), HashRange(0, 10), HashRange(15, 30)]
    )
    assert selector.ranges == (HashRange(0, 30),)


@pytest.mark.parametrize(("start", "end"), [(5, 5), (6, 5), (-1, 3), (0, HASH_SPACE + 1)])
def test_empty_or_out_of_space_ranges_are_refused(start: int, end: int) -> None:
    with pytest.raises(ValueError, match="0 <= start < end <= 2\\*\\*64"):
        HashRange(start, end)


def test_parse_refuses_mixed_fields_and_garbage() -> None:
    uid = HashRange(0, 8).term(ShardField.UID)
    ns = HashRange(8, 16).term(ShardField.NAMESPACE)
    with pytest.raises(ValueError, match="one field"):
        ShardSelector.parse(f"{uid} || {ns}")
    with pytest.raises(ValueError, match="not a shardRange term"):
        ShardSelector.parse("shardRange(object.metadata.name, '0x0', '0x1')")


bounds = st.integers(min_value=0, max_value=HASH_SPACE)
ranges = (
    st.tuples(bounds, bounds)
    .filter(lambda t: t[0] != t[1])
    .map(lambda t: HashRange(min(t), max(t)))
)


@given(st.lists(ranges, min_size=1, max_size=6), st.sampled_from(list(ShardField)))
def test_parse_inverts_wire(items: list[HashRange], field: ShardField) -> None:
    selector = ShardSelector(field, items)
    assert ShardSelector.parse(selector.wire) == selector


@given(st.lists(ranges, min_size=1, max_size=6), st.uuids())
def test_matches_is_membership_of_the_hash_in_some_range(
    items: list[HashRange], uid: uuid.UUID
) -> None:
    selector = ShardSelector(ShardField.UID, items)
    obj = {"metadata": {"uid": str(uid)}}
    h = fnv1a64(str(uid).encode())
    assert selector.matches(obj) == any(r.start <= h < r.end for r in items)


@given(st.integers(min_value=1, max_value=300))
def test_split_hash_space_tiles_the_space(parts: int) -> None:
    pieces = split_hash_space(parts)
    assert len(pieces) == parts
    assert pieces[0].start == 0 and pieces[-1].end == HASH_SPACE
    assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
    sizes = {p.size for p in pieces}
    assert max(sizes) - min(sizes) <= 1


def test_every_object_falls_in_exactly_one_slot() -> None:
    selectors = [slot_selector(s, 16) for s in range(16)]
    for _ in range(500):
        obj = {"metadata": {"uid": str(uuid.uuid4())}}
        assert sum(sel.matches(obj) for sel in selectors) == 1


def test_cluster_scoped_objects_hash_as_the_empty_namespace() -> None:
    selector = ShardSelector(ShardField.NAMESPACE, [HashRange(0xCBF29CE484222325, HASH_SPACE)])
    assert selector.matches({"metadata": {"name": "a-namespace"}})
    assert not ShardSelector(ShardField.NAMESPACE, [HashRange(0, 1 << 63)]).matches(
        {"metadata": {"name": "a-namespace"}}
    )


def test_filter_notices_a_server_that_ignored_the_selector(
    caplog: pytest.LogCaptureFixture,
) -> None:
    selector = ShardSelector(ShardField.UID, [HashRange(0, 1 << 63)])
    flt = ShardFilter(selector, "tasks.example.io")
    inside = next(
        u for u in (str(uuid.uuid4()) for _ in range(100)) if fnv1a64(u.encode()) < 1 << 63
    )
    outside = next(
        u for u in (str(uuid.uuid4()) for _ in range(100)) if fnv1a64(u.encode()) >= 1 << 63
    )
    assert flt.accept({"metadata": {"uid": inside}})
    assert flt.server_filtering and flt.dropped == 0
    with caplog.at_level(logging.WARNING, logger="informers.sharding"):
        assert not flt.accept({"metadata": {"uid": outside}})
        assert not flt.accept({"metadata": {"uid": outside}})
    assert not flt.server_filtering
    assert flt.dropped == 2
    warnings = [r for r in caplog.records if "ignored shardSelector" in r.getMessage()]
    assert len(warnings) == 1  # logged once, counted every time
    assert "tasks.example.io" in warnings[0].getMessage()


# -- division of slots --------------------------------------------------------------------------

members_st = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=9, unique=True)


@settings(max_examples=200)
@given(members_st, st.integers(min_value=1, max_value=64))
def test_every_slot_has_one_owner_and_loads_differ_by_at_most_one(
    members: list[str], slots: int
) -> None:
    assignment = assign_slots(members, slots)
    assert set(assignment) == set(members)
    owned = [s for held in assignment.values() for s in held]
    assert sorted(owned) == list(range(slots))
    loads = [len(held) for held in assignment.values()]
    assert max(loads) - min(loads) <= 1


@given(members_st, st.randoms(use_true_random=False))
def test_division_depends_only_on_the_set_of_members(members: list[str], rnd: object) -> None:
    shuffled = list(members)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert assign_slots(members, 16) == assign_slots(shuffled + members[:1], 16)


def test_a_join_moves_few_slots_beyond_those_that_must_move() -> None:
    # 3 -> 4 members over 16 slots: at least 4 slots must move to the newcomer. Equal
    # contiguous ranges over sorted members would move 9; rendezvous moves ~5 on average.
    moved: list[int] = []
    for trial in range(100):
        names = [f"replica-{trial}-{i}" for i in range(4)]
        before = {s: m for m, held in assign_slots(names[:3], 16).items() for s in held}
        after = {s: m for m, held in assign_slots(names, 16).items() for s in held}
        moved.append(sum(before[s] != after[s] for s in range(16)))
    assert min(moved) >= 4
    assert statistics.mean(moved) <= 6.0
    assert max(moved) <= 8


def test_ring_config_validates_like_leader_election() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        ShardRingConfig("tasks", "ns", lease_duration=5, renew_deadline=10)
    with pytest.raises(ValueError, match="slots"):
        ShardRingConfig("tasks", "ns", slots=0)
    a = ShardRingConfig("tasks", "ns", identity="pod-a_1")
    assert a.timings.name.startswith("tasks-") and a.timings.name != (
        ShardRingConfig("tasks", "ns", identity="pod-b_1").timings.name
    )
