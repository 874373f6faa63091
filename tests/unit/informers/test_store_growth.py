"""Memory under growth: 1M objects added to and deleted from the store leave nothing behind.

Not a timing: what is checked is that no per-key structure outlives its key. The objects are
small (under pymalloc's 512 B limit), so ``sys.getallocatedblocks()`` counts every object the
store makes per key (bytes, strings, entries, index buckets); the hash tables of the store's
dicts are large allocations outside pymalloc, so their sizes are checked directly.
"""

from __future__ import annotations

import gc
import sys

import orjson

from informers._partial import decode_watch_line
from informers.store import ADDED, DELETED, Store

N = 1_000_000


def _event(i: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"cm-{i:07d}",
            "namespace": f"ns-{i % 1000:03d}",
            "resourceVersion": str(10 + i),
            "ownerReferences": [{"uid": f"owner-{i:07d}"}],
        },
    }


def _table_bytes(store: Store) -> int:
    """Bytes of the store's own hash tables: the items and every index's buckets."""
    tables = [store._items, store._ns_index.buckets]
    tables += [index.buckets for index in store._indexes]
    return sum(sys.getsizeof(t) for t in tables)


def test_a_million_objects_added_and_deleted_leave_no_per_key_residue() -> None:
    store = Store()
    gc.collect()
    blocks_before = sys.getallocatedblocks()
    tables_before = _table_bytes(store)
    for i in range(N):
        store.apply(ADDED, _event(i))
    assert len(store) == N
    peak_tables = _table_bytes(store)
    assert peak_tables > 50 * 2**20  # the tables really grew: the check below means something
    for i in range(N):
        obj = _event(i)
        obj["metadata"]["resourceVersion"] = str(10 + N + i)  # type: ignore[index]
        store.apply(DELETED, obj)
    assert len(store) == 0
    assert store.by_index("namespace", "ns-000") == []
    gc.collect()
    # Per-key objects: all gone (a few hundred blocks of slack for interpreter caches).
    assert sys.getallocatedblocks() - blocks_before < 1000
    # Hash tables: back near their empty size, not holding a slot per deleted key. What may
    # remain is bounded whatever the peak: tables of up to 4 * SHRINK_ABOVE slots each.
    assert _table_bytes(store) < tables_before + 256 * 1024, (
        f"the store's tables keep {_table_bytes(store) / 2**20:.1f} MiB after every key left "
        f"(peak {peak_tables / 2**20:.1f} MiB)"
    )


def _watch_line(event_type: str, i: int, rv: int) -> bytes:
    """An object without owners, as a watch sends it: the informer's most common event."""
    meta = {"name": f"cm-{i:07d}", "namespace": f"ns-{i % 1000:03d}", "resourceVersion": str(rv)}
    return orjson.dumps({"type": event_type, "object": {"kind": "ConfigMap", "metadata": meta}})


def test_the_watch_path_of_objects_without_owners_leaves_no_per_key_residue() -> None:
    """The same through :meth:`Store.apply_raw`, which takes a path of its own for a new key
    filed under no index (every event of a sync): the tables shrink after it too."""
    n = N // 4
    store = Store()
    # Built before the first add (it is built on first read): the adds must keep it.
    assert store.by_index("namespace", "ns-000") == []
    gc.collect()
    blocks_before = sys.getallocatedblocks()
    tables_before = _table_bytes(store)
    for i in range(n):
        decoded = decode_watch_line(_watch_line(ADDED, i, 10 + i))
        assert decoded is not None
        store.apply_raw(*decoded)
    assert len(store) == n
    assert len(store.by_index("namespace", "ns-000")) == n // 1000
    peak_tables = _table_bytes(store)
    assert peak_tables > 6 * 2**20  # the tables really grew
    for i in range(n):
        decoded = decode_watch_line(_watch_line(DELETED, i, 10 + n + i))
        assert decoded is not None
        store.apply_raw(*decoded)
    assert len(store) == 0
    assert store.by_index("namespace", "ns-000") == []
    del decoded
    gc.collect()
    assert sys.getallocatedblocks() - blocks_before < 1000
    assert _table_bytes(store) < tables_before + 256 * 1024, (
        f"the store's tables keep {_table_bytes(store) / 2**20:.1f} MiB after every key left "
        f"(peak {peak_tables / 2**20:.1f} MiB)"
    )
