"""The store keeps most objects as bare bytes and reads their resourceVersion back from them.

Attacks the one assumption that makes that safe: the first ``"resourceVersion":"..."`` in the
stored bytes is the object's own. Objects where it is not (an annotation or a spec field of
that name ahead of it, a value with characters JSON escapes) must keep their exact
resourceVersion, and with it the store's never-regress rule.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import orjson

from informers.store import Store


def thing(rv: str, *, first: dict[str, Any] | None = None, name: str = "a") -> dict[str, Any]:
    meta: dict[str, Any] = dict(first or {})
    meta.update({"name": name, "namespace": "ns", "uid": "u-1", "resourceVersion": rv})
    return {"apiVersion": "v1", "kind": "Thing", "metadata": meta, "spec": {"x": 1}}


def test_a_decoy_resource_version_ahead_of_the_real_one_is_not_read_back() -> None:
    store = Store()
    decoy = {"annotations": {"resourceVersion": "999"}}
    store.apply("ADDED", thing("5", first=decoy))
    assert store.resource_version_of("ns/a") == "5"
    assert store.apply("MODIFIED", thing("6", first=decoy)) is not None  # 6 > 5, not < 999
    assert store.resource_version_of("ns/a") == "6"
    assert store.apply("MODIFIED", thing("4", first=decoy)) is None  # stale: ignored
    assert store.get("ns/a")["metadata"]["resourceVersion"] == "6"  # type: ignore[index]


def test_a_decoy_in_the_spec_before_the_metadata_is_not_read_back() -> None:
    store = Store()
    obj = {"spec": {"resourceVersion": "1"}, **thing("50")}
    store.apply("ADDED", obj)
    assert store.resource_version_of("ns/a") == "50"
    assert store.apply("DELETED", thing("49")) is None  # older than the cached 50: kept
    assert "ns/a" in store


def test_opaque_resource_versions_with_escaped_characters_round_trip() -> None:
    store = Store()
    for rv in ('a"b', "back\\slash", "ünï", "x\ny"):
        store.apply("ADDED", thing(rv, name=f"n{len(rv)}-{rv.isascii()}"))
        assert store.resource_version_of(f"ns/n{len(rv)}-{rv.isascii()}") == rv


def test_relist_compares_the_read_back_resource_versions() -> None:
    store = Store()
    store.apply("ADDED", thing("10", name="kept"))
    store.apply("ADDED", thing("30", name="newer"))  # newer than the list: the list missed it
    deltas = store.replace([thing("10", name="kept")], "20")
    assert deltas == []
    assert sorted(store.keys()) == ["ns/kept", "ns/newer"]
    deltas = store.replace([], "40")
    assert sorted(d.key for d in deltas) == ["ns/kept", "ns/newer"]


def test_per_object_overhead_beyond_the_json_bytes() -> None:
    """Key, table slots and namespace index only: ~110 B measured; ~220 B with an entry
    object and a resourceVersion string per object (the layout before bare bytes)."""
    lines = [orjson.dumps(thing(str(1000 + i), name=f"thing-{i:06d}")) for i in range(20000)]
    gc.collect()
    tracemalloc.start()
    try:
        store = Store()
        for line in lines:
            store.apply("ADDED", orjson.loads(line))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    keys = store.keys()
    json_bytes = sum(len(store.get_raw(k) or b"") + 33 for k in keys)  # + the bytes header
    assert (traced - json_bytes) / len(lines) < 160


def test_the_namespace_index_is_built_on_first_read_and_kept_up_to_date() -> None:
    store = Store()
    for i in range(6):
        obj = thing(str(10 + i), name=f"o{i}")
        obj["metadata"]["namespace"] = f"ns{i % 2}"
        store.apply("ADDED", obj)
    assert store._ns_lazy is None  # nobody asked: no index kept
    assert [o["metadata"]["name"] for o in store.list(namespace="ns1")] == ["o1", "o3", "o5"]
    added = thing("20", name="o6")
    added["metadata"]["namespace"] = "ns1"
    store.apply("ADDED", added)
    gone = thing("21", name="o1")
    gone["metadata"]["namespace"] = "ns1"
    store.apply("DELETED", gone)
    assert store.index_keys("namespace", "ns1") == ["ns1/o3", "ns1/o5", "ns1/o6"]
    assert sorted(store.index_values("namespace")) == ["ns0", "ns1"]
    store.replace([], "30")
    assert store.index_values("namespace") == []
