"""The body budget (informers.budget): below the limit a store is unchanged; above it the
least recently used bodies are reduced to their metadata, and reads say so instead of
answering with a partial object."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from informers.budget import BodyBudget, EvictedBodyError, MetadataStubs, stub_of
from informers.labels import LabelSelector
from informers.store import Store, object_key


def obj(
    name: str, rv: str, *, size: int = 100, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Task",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": rv,
            "uid": f"uid-{name}",
            "labels": labels or {"app": "demo"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "O", "name": "o", "uid": "owner"}],
        },
        "spec": {"payload": "x" * size},
    }


def body_size(o: dict[str, Any]) -> int:
    return len(orjson.dumps(o))


def test_below_the_limit_nothing_is_evicted() -> None:
    budget = BodyBudget(10_000)
    store = Store(budget=budget)
    objects = [obj(f"t{i}", str(10 + i)) for i in range(5)]
    for o in objects:
        store.apply("ADDED", o)
    assert budget.evictions == 0
    assert budget.used == sum(body_size(o) for o in objects)
    assert [store.get(f"ns/t{i}") for i in range(5)] == objects
    assert store.list() == objects


def test_above_the_limit_the_least_recently_used_bodies_go_and_their_metadata_stays() -> None:
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(3 * size)
    store = Store(budget=budget, label_index=True)
    for i in range(5):
        store.apply("ADDED", obj(f"t{i}", str(10 + i)))
    assert budget.used <= budget.limit and len(budget) == 3
    assert [store.evicted(f"ns/t{i}") for i in range(5)] == [True, True, False, False, False]
    with pytest.raises(EvictedBodyError) as err:
        store.get("ns/t0")
    assert err.value.key == "ns/t0" and err.value.resource_version == "10"
    assert "client.get" in str(err.value)
    # Everything but the body is still there: keys, versions, UIDs, indexes, label selection.
    assert len(store) == 5 and "ns/t0" in store
    assert store.resource_version_of("ns/t0") == "10"
    assert store.uid_of("ns/t0") == "uid-t0"
    assert store.index_keys("owner_uid", "owner") == [f"ns/t{i}" for i in range(5)]
    bodies, evicted = store.list_held(selector=LabelSelector.parse("app=demo"))
    assert [b["metadata"]["name"] for b in bodies] == ["t2", "t3", "t4"]
    assert evicted == [("ns/t0", "10"), ("ns/t1", "11")]
    assert store.held_raw("ns/t0") is not None and b"payload" not in store.held_raw("ns/t0")  # type: ignore[operator]
    with pytest.raises(EvictedBodyError):
        store.list()


def test_a_read_makes_a_body_the_most_recently_used() -> None:
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(2 * size)
    store = Store(budget=budget)
    store.apply("ADDED", obj("a", "10"))
    store.apply("ADDED", obj("b", "11"))
    assert store.get("ns/a") is not None  # a is now the most recently used
    store.apply("ADDED", obj("c", "12"))
    assert not store.evicted("ns/a") and store.evicted("ns/b")


def test_a_new_version_brings_the_body_back_and_a_delete_frees_it() -> None:
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(size)
    store = Store(budget=budget)
    store.apply("ADDED", obj("a", "10"))
    store.apply("ADDED", obj("b", "11"))
    assert store.evicted("ns/a")
    delta = store.apply("MODIFIED", obj("a", "12"))
    assert delta is not None and delta.obj["spec"] and delta.old is not None
    assert "spec" not in delta.old  # the old state of an evicted body: its metadata
    assert store.get("ns/a") == obj("a", "12") and store.evicted("ns/b")
    store.apply("DELETED", obj("a", "13"))
    assert budget.used == 0 and len(budget) == 0


def test_a_fetched_body_is_taken_back_only_at_the_version_held() -> None:
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(size)
    store = Store(budget=budget)
    store.apply("ADDED", obj("a", "10"))
    store.apply("ADDED", obj("b", "11"))
    assert not store.readmit("ns/a", orjson.dumps(obj("a", "9")))
    assert not store.readmit("ns/a", orjson.dumps(obj("a", "15")))
    assert store.evicted("ns/a")
    assert store.readmit("ns/a", orjson.dumps(obj("a", "10")))
    assert store.get("ns/a") == obj("a", "10") and store.evicted("ns/b")


def test_one_budget_spans_the_stores_that_share_it() -> None:
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(2 * size)
    first, second = Store(budget=budget), Store(budget=budget)
    first.apply("ADDED", obj("a", "10"))
    second.apply("ADDED", obj("b", "11"))
    second.apply("ADDED", obj("c", "12"))
    assert first.evicted("ns/a") and not second.evicted("ns/b")
    budget.forget_store(second)
    assert budget.used == 0


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="bytes >= 0"):
        BodyBudget(-1)


events = st.lists(
    st.tuples(
        st.sampled_from(["ADDED", "MODIFIED", "DELETED", "GET"]),
        st.integers(0, 5),
        st.integers(0, 300),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(0, 2000))
def test_a_budgeted_store_follows_the_same_events_as_an_unbounded_one(
    script: list[tuple[str, int, int]], limit: int
) -> None:
    """Same deltas, same keys and versions; a read returns the same object or says it holds
    only the metadata at the same version; the budget is never exceeded and counts exactly
    the bodies held."""
    budget = BodyBudget(limit)
    bounded, unbounded = Store(budget=budget), Store()
    rv = 10
    for step, (action, n, size) in enumerate(script):
        key = f"ns/t{n}"
        if action == "GET":
            expected = unbounded.get(key)
            try:
                assert bounded.get(key) == expected
            except EvictedBodyError as err:
                assert err.resource_version == unbounded.resource_version_of(key)
            continue
        rv += 1
        o = obj(f"t{n}", str(rv), size=size + step)
        d1, d2 = bounded.apply(action, o), unbounded.apply(action, o)  # type: ignore[arg-type]
        assert (d1 is None) == (d2 is None)
        if d1 is not None and d2 is not None:
            assert (d1.type, d1.key, d1.obj) == (d2.type, d2.key, d2.obj)
        keys = bounded.keys()
        assert keys == unbounded.keys()
        versions = [bounded.resource_version_of(k) for k in keys]
        assert versions == [unbounded.resource_version_of(k) for k in keys]
        assert budget.used <= limit
        held = [k for k in keys if not bounded.evicted(k)]
        assert budget.used == sum(len(bounded.held_raw(k) or b"") for k in held)


def test_a_sync_evicts_only_once_its_list_was_handed_over() -> None:
    """During a replace the list's bytes are the store's entries: evicting then would add
    the metadata on top of the list at the peak. The reflector enforces after the handlers."""
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(2 * size)
    store = Store(budget=budget)
    deltas = store.replace([obj(f"t{i}", str(10 + i)) for i in range(5)], "20")
    assert len(deltas) == 5 and budget.evictions == 0 and budget.used == 5 * size
    store.enforce_budget()
    assert budget.used <= budget.limit and len(budget) == 2
    assert [store.evicted(f"ns/t{i}") for i in range(5)] == [True, True, True, False, False]
    store.apply("ADDED", obj("t9", "30"))  # outside a sync: evicts at once again
    assert budget.used <= budget.limit and store.evicted("ns/t3")


def test_a_buffered_list_keeps_bodies_only_while_they_fit_the_budget() -> None:
    """A list is prepared item by item before the swap: with a budget, only the first
    bodies that fit are encoded whole; the rest arrive as metadata, so the buffer (and the
    store after the swap) never holds more bodies than the budget."""
    size = body_size(obj("t0", "10"))
    budget = BodyBudget(2 * size)
    store = Store(budget=budget, label_index=True)
    store.start_list()
    prepared = [store.prepare(obj(f"t{i}", str(10 + i)), buffered=True) for i in range(5)]
    assert [p.stub for p in prepared] == [False, False, True, True, True]
    assert all(b"payload" not in p.raw for p in prepared[2:])
    deltas = store.replace_prepared([p.drop_object() for p in prepared], "20")
    # Handlers get every object; those past the budget as their metadata only.
    assert [d.key for d in deltas] == [f"ns/t{i}" for i in range(5)]
    assert ["spec" in d.obj for d in deltas] == [True, True, False, False, False]
    assert all(d.obj["metadata"]["resourceVersion"] == str(10 + i) for i, d in enumerate(deltas))
    assert [store.evicted(f"ns/t{i}") for i in range(5)] == [False, False, True, True, True]
    assert budget.used == 2 * size and len(budget) == 2 and budget.evictions == 0
    store.enforce_budget()
    assert budget.evictions == 0  # nothing was over: no stub made after the swap
    # Keys, versions, UIDs, indexes and label selection hold for all of them.
    assert store.uid_of("ns/t4") == "uid-t4" and store.resource_version_of("ns/t4") == "14"
    assert store.index_keys("owner_uid", "owner") == [f"ns/t{i}" for i in range(5)]
    bodies, evicted = store.list_held(selector=LabelSelector.parse("app=demo"))
    assert len(bodies) == 2 and [k for k, _ in evicted] == ["ns/t2", "ns/t3", "ns/t4"]
    with pytest.raises(EvictedBodyError):
        store.get("ns/t2")
    # A watch event brings a body back; the budget then evicts the least recently used.
    store.apply("MODIFIED", obj("t3", "30"))
    assert not store.evicted("ns/t3") and store.evicted("ns/t0")
    assert budget.used <= budget.limit


def test_a_list_started_again_gets_the_whole_allowance_again() -> None:
    size = body_size(obj("t0", "10"))
    store = Store(budget=BodyBudget(size))
    store.start_list()
    assert [store.prepare(obj(f"t{i}", "10"), buffered=True).stub for i in range(3)] == [
        False,
        True,
        True,
    ]
    store.start_list()  # the list failed and starts over from its first page
    assert not store.prepare(obj("t0", "10"), buffered=True).stub
    # Without a budget, and for events (not buffered), bodies are always whole.
    assert not Store().prepare(obj("t9", "10"), buffered=True).stub
    assert not store.prepare(obj("t8", "10")).stub


def test_a_uid_change_is_seen_for_an_object_prepared_before_its_key_was_held() -> None:
    """A buffered object whose key the store did not hold keeps no UID string (memory);
    should the key be held by the time it is stored, the UID is read back from its bytes,
    and a different object under the same key is still a DELETED then an ADDED."""
    for budget in (None, BodyBudget(0)):
        store = Store(budget=budget)
        prepared = store.prepare(obj("a", "20"), buffered=True)
        assert prepared.uid == ""
        other = obj("a", "10")
        other["metadata"]["uid"] = "uid-other"
        store.apply("ADDED", other)
        deltas = store.replace_prepared([prepared.drop_object()], "20")
        assert [(d.type, d.obj["metadata"]["uid"]) for d in deltas] == [
            ("DELETED", "uid-other"),
            ("ADDED", "uid-a"),
        ]
        again = store.prepare(obj("a", "30"), buffered=True)
        assert again.uid == "uid-a"  # the key is held: kept, no decoding later
        assert [d.type for d in store.replace_prepared([again], "30")] == ["MODIFIED"]


def test_eviction_takes_the_least_recently_used_body_of_all_the_stores() -> None:
    size = body_size(obj("a", "10"))  # every body here has a one-letter name
    budget = BodyBudget(3 * size)
    first, second = Store(budget=budget), Store(budget=budget)
    first.apply("ADDED", obj("a", "10"))
    second.apply("ADDED", obj("b", "11"))
    first.apply("ADDED", obj("c", "12"))
    assert second.get("ns/b") is not None
    assert first.get("ns/a") is not None  # order of use: c, b, a
    second.apply("ADDED", obj("d", "13"))
    assert first.evicted("ns/c") and not second.evicted("ns/b") and not first.evicted("ns/a")
    first.apply("ADDED", obj("e", "14"))
    assert second.evicted("ns/b")
    assert budget.used == 3 * size and len(budget) == 3 and budget.evictions == 2


def test_a_cleared_store_holds_nothing_and_its_budget_forgets_it() -> None:
    budget = BodyBudget(10_000)
    store = Store(budget=budget, label_index=True)
    store.replace([obj(f"t{i}", str(10 + i)) for i in range(3)], "20")
    store.mark_synced()
    store.clear()
    assert len(store) == 0 and store.keys() == [] and not store.has_synced
    assert store.index_keys("owner_uid", "owner") == [] and store.list() == []
    assert budget.used == 0 and len(budget) == 0
    assert store.last_observed_resource_version == "20"


lists = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 300), st.booleans()),
    max_size=10,
    unique_by=lambda t: t[0],
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            lists,
            st.tuples(
                st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
                st.integers(0, 6),
                st.integers(0, 300),
            ),
        ),
        max_size=12,
    ),
    st.integers(0, 2000),
)
def test_buffered_relists_into_a_budgeted_store_match_an_unbounded_one(
    steps: list[Any], limit: int
) -> None:
    """Lists (buffered, so bodies past the budget arrive as metadata) and events in any
    order: the same keys, versions and deltas (objects compared by their metadata, since a
    delta past the budget carries only that); the budget never exceeded and exact."""
    budget = BodyBudget(limit)
    bounded, unbounded = Store(budget=budget), Store()
    rv = 10
    for step in steps:
        rv += 1
        if isinstance(step, list):
            objects = [obj(f"t{n}", str(rv), size=size) for n, size, _ in step]
            bounded.start_list()
            d1 = bounded.replace_prepared(
                [bounded.prepare(o, buffered=True).drop_object() for o in objects], str(rv)
            )
            bounded.enforce_budget()
            d2 = unbounded.replace([dict(o) for o in objects], str(rv))
        else:
            action, n, size = step
            o = obj(f"t{n}", str(rv), size=size)
            one, two = bounded.apply(action, o), unbounded.apply(action, o)
            d1, d2 = [one] if one else [], [two] if two else []
        assert [(d.type, d.key, d.obj["metadata"]) for d in d1] == [
            (d.type, d.key, d.obj["metadata"]) for d in d2
        ]
        keys = bounded.keys()
        assert keys == unbounded.keys()
        assert [bounded.resource_version_of(k) for k in keys] == [
            unbounded.resource_version_of(k) for k in keys
        ]
        assert [bounded.uid_of(k) for k in keys] == [unbounded.uid_of(k) for k in keys]
        assert budget.used <= limit
        held = [k for k in keys if not bounded.evicted(k)]
        assert budget.used == sum(len(bounded.held_raw(k) or b"") for k in held)
        assert len(budget) == len(held)
        for k in held:
            assert bounded.get(k) == unbounded.get(k)


# --- the metadata kept of an evicted object ------------------------------------------------

NAMES = st.text(alphabet="ab/-", min_size=1, max_size=4)
STUBBED = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": NAMES},
            optional={
                "namespace": st.one_of(st.text(alphabet="ab/-", max_size=3), st.none()),
                "uid": st.text(max_size=3),
                "labels": st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
                "generation": st.integers(0, 3),
            },
        ),
        "spec": st.just({"payload": "x"}),
    },
    optional={
        "apiVersion": st.one_of(st.sampled_from(["v1", "example.com/v1", 'odd"\\']), st.none()),
        "kind": st.one_of(st.sampled_from(["Task", "Node"]), st.integers(0, 1)),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STUBBED, min_size=1, max_size=8), st.sampled_from([0, 1, 255, 256, 300]))
def test_a_compact_stub_gives_back_what_it_was_made_of(
    objects: list[dict[str, Any]], kinds: int
) -> None:
    """Whatever the object (names with "/", no namespace or an empty one, no apiVersion,
    a kind that is not a string, more (apiVersion, kind) pairs than a compact stub can name),
    the JSON of its stub decodes to its apiVersion, kind and metadata, and the stub is never
    larger than that JSON."""
    stubs = MetadataStubs()
    for i in range(kinds):  # fill the store's pairs, up to past what the first byte can name
        stubs.encode("ns/x", {"apiVersion": "v1", "kind": f"K{i}", "metadata": {"name": "x"}})
    for o in objects:
        try:
            key = object_key(o)
        except ValueError:
            continue
        stub = stubs.encode(key, o)
        assert orjson.loads(stubs.json(key, stub)) == orjson.loads(stub_of(o))
        assert len(stub) <= len(stub_of(o))


@settings(max_examples=200, deadline=None)
@given(events, st.integers(0, 1500), st.sampled_from(["ns", ""]))
def test_an_evicted_object_is_handed_out_with_its_whole_metadata(
    script: list[tuple[str, int, int]], limit: int, namespace: str
) -> None:
    """Deltas' ``old`` (and a delete's object), what a late handler is given (``held_raw``)
    and the UID: for an evicted object, its apiVersion, kind and whole metadata, exactly;
    for a held one, the object. Namespaced and cluster-scoped."""
    bounded, unbounded = Store(budget=BodyBudget(limit)), Store()

    def kept(o: dict[str, Any] | None, evicted: bool) -> dict[str, Any] | None:
        if o is None or not evicted:
            return o
        return {k: o[k] for k in ("apiVersion", "kind", "metadata")}

    rv = 10
    for step, (action, n, size) in enumerate(script):
        if action == "GET":
            continue
        rv += 1
        o = obj(f"t{n}", str(rv), size=size + step, labels={"n": str(n)})
        if namespace:
            o["metadata"]["namespace"] = namespace
        else:
            del o["metadata"]["namespace"]
        key = object_key(o)
        was_evicted = bounded.evicted(key)
        d1, d2 = bounded.apply(action, o), unbounded.apply(action, o)  # type: ignore[arg-type]
        assert (d1 is None) == (d2 is None)
        if d1 is not None and d2 is not None:
            assert d1.old == kept(d2.old, was_evicted)
            if action == "DELETED":
                assert d1.obj == d2.obj
        keys = unbounded.keys()
        for k in keys:
            evicted = bounded.evicted(k)
            held = bounded.held_raw(k)
            assert held is not None
            assert orjson.loads(held) == kept(unbounded.get(k), evicted)
            assert bounded.uid_of(k) == unbounded.uid_of(k)
    # A relist that drops every key: each delete carries what the store held.
    gone1, gone2 = bounded.replace([], str(rv + 1)), unbounded.replace([], str(rv + 1))
    assert [d.key for d in gone1] == [d.key for d in gone2]
    for one, two in zip(gone1, gone2, strict=True):
        assert one.obj["metadata"] == two.obj["metadata"]
        assert one.obj["apiVersion"] == two.obj["apiVersion"]


def test_a_stub_leaves_out_what_its_key_and_its_store_already_hold() -> None:
    stubs = MetadataStubs()
    o = obj("t0", "10")
    stub = stubs.encode("ns/t0", o)
    plain = stub_of(o)
    head = b'{"apiVersion":"example.com/v1","kind":"Task","metadata":{"name":"t0","namespace":"ns",'
    assert plain.startswith(head)
    assert stub == b"\x00\x00" + plain[len(head) : -1]  # a NUL, then the pair's number: 0
    store = Store(budget=BodyBudget(0))
    store.apply("ADDED", o)
    assert store.evicted("ns/t0") and store.held_bytes() == len(stub)
