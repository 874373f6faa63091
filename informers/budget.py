"""A byte budget for the bodies a cache keeps: the most recently used bodies stay, the others
are reduced to their metadata.

A :class:`BodyBudget` is shared by the stores it governs (one kind's, or every kind's without a
budget of its own). It counts the encoded bytes of the full bodies they hold and remembers the
order in which those bodies were last written or read. When a write takes the total over
:attr:`BodyBudget.limit`, the least recently used bodies are *evicted*: the store keeps, for
such an object, its ``apiVersion``, ``kind`` and whole ``metadata`` (re-encoded), its
resourceVersion and its index values, so keys, indexes, label selection, resourceVersion and
UID checks, and deltas' ``old`` metadata keep working, and only the body is gone. A read of an
evicted body raises :class:`EvictedBodyError`, which says what the cache holds of it (the
resourceVersion); the client then fetches it live, no older than that (see
:mod:`controller_runtime.cache`).

Below the limit nothing is evicted and a store behaves exactly as one without a budget. Counted:
bodies only; metadata stubs, keys and index entries are the fixed cost of every object held
(``docs/informers.md`` has the figures). Single event loop, like the stores.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from informers.store import Store

__all__ = ["BodyBudget", "EvictedBodyError", "metadata_stub"]

_KEEP: Final = ("apiVersion", "kind", "metadata")


class EvictedBodyError(LookupError):
    """The cache holds this object's metadata at ``resource_version`` but not its body (a
    memory budget evicted it). Read it through the client, which fetches it live."""

    def __init__(self, key: str, resource_version: str) -> None:
        super().__init__(
            f"the cache holds only the metadata of {key} (resourceVersion {resource_version}): "
            "its body was evicted by the cache's memory budget; read it with `await "
            "client.get(...)`, which fetches it from the API server"
        )
        self.key = key
        self.resource_version = resource_version


def metadata_stub(raw: bytes) -> bytes:
    """The encoding of ``raw``'s ``apiVersion``, ``kind`` and ``metadata`` only (exact size)."""
    obj: Any = orjson.loads(raw)
    kept = {k: obj[k] for k in _KEEP if k in obj}
    return memoryview(orjson.dumps(kept)).tobytes()


class BodyBudget:
    """At most ``limit`` bytes of full bodies across the stores that share it (module docs).

    ``evictions`` counts bodies evicted since creation. ``used`` is what the bodies held cost
    now (their encoded sizes).
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a memory limit is a number of bytes >= 0, got {limit}")
        self.limit = limit
        self.used = 0
        self.evictions = 0
        # (store id, key) -> (store, size), least recently used first.
        self._lru: OrderedDict[tuple[int, str], tuple[Store, int]] = OrderedDict()

    def __len__(self) -> int:
        """Bodies held."""
        return len(self._lru)

    def admit(self, store: Store, key: str, size: int) -> None:
        """A body of ``size`` bytes is now held for ``key`` (replacing any before it); evict
        the least recently used bodies (possibly this one) while over the limit."""
        lru = self._lru
        slot = (id(store), key)
        before = lru.pop(slot, None)
        if before is not None:
            self.used -= before[1]
        lru[slot] = (store, size)
        self.used += size
        while self.used > self.limit and lru:
            (_, victim_key), (victim_store, victim_size) = lru.popitem(last=False)
            self.used -= victim_size
            self.evictions += 1
            victim_store._evict(victim_key)

    def touch(self, store: Store, key: str) -> None:
        """``key``'s body was read: it becomes the most recently used."""
        slot = (id(store), key)
        if slot in self._lru:
            self._lru.move_to_end(slot)

    def forget(self, store: Store, key: str) -> None:
        """``key`` left ``store`` (deleted, or its body evicted by the store itself)."""
        before = self._lru.pop((id(store), key), None)
        if before is not None:
            self.used -= before[1]

    def forget_store(self, store: Store) -> None:
        """Every body of ``store`` (its informer stopped): O(bodies held) once."""
        sid = id(store)
        for slot in [s for s in self._lru if s[0] == sid]:
            self.used -= self._lru.pop(slot)[1]
