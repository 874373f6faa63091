"""The body budget (informers.budget): below the limit a store is unchanged; above it the
least recently used bodies are reduced to their metadata, and reads say so instead of
answering with a partial object."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from informers.budget import BodyBudget, EvictedBodyError
from informers.labels import LabelSelector
from informers.store import Store


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
