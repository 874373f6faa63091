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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from informers.store import Store

__all__ = ["BodyBudget", "EvictedBodyError", "metadata_stub", "stub_of"]

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
    return stub_of(orjson.loads(raw))


def stub_of(obj: Mapping[str, Any]) -> bytes:
    """:func:`metadata_stub` of an object already decoded."""
    kept = {k: obj[k] for k in _KEEP if k in obj}
    return memoryview(orjson.dumps(kept)).tobytes()


class BodyBudget:
    """At most ``limit`` bytes of full bodies across the stores that share it (module docs).

    ``evictions`` counts bodies evicted since creation. ``used`` is what the bodies held cost
    now (their encoded sizes).

    Bookkeeping: about 120 B per body held (one ordered-dict entry per body, keyed by the
    store's own key string, and one int), not counted in ``limit``. Each store's bodies are
    kept in least-recently-used order; across stores, a use counter decides, so an eviction
    costs O(stores sharing the budget).
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a memory limit is a number of bytes >= 0, got {limit}")
        self.limit = limit
        self.used = 0
        self.evictions = 0
        # Per store: key -> (use << _SIZE_BITS) | size, least recently used first. One int
        # per body rather than a tuple of two: the bookkeeping is per body held.
        self._held: dict[Store, OrderedDict[str, int]] = {}
        self._uses = 0

    def __len__(self) -> int:
        """Bodies held."""
        return sum(len(held) for held in self._held.values())

    def admit(self, store: Store, key: str, size: int, *, enforce: bool = True) -> None:
        """A body of ``size`` bytes is now held for ``key`` (replacing any before it); evict
        the least recently used bodies (possibly this one) while over the limit, unless
        ``enforce`` is false (a sync in progress: see :meth:`enforce`)."""
        held = self._held.get(store)
        if held is None:
            held = self._held[store] = OrderedDict()
        before = held.pop(key, None)
        if before is not None:
            self.used -= before & _SIZE_MASK
        self._uses += 1
        held[key] = (self._uses << _SIZE_BITS) | size
        self.used += size
        if enforce:
            self.enforce()

    def enforce(self) -> None:
        """Evict the least recently used bodies while over the limit. A store's sync defers
        this until its list has been handed to the handlers: the list's bytes are alive until
        then anyway (they are the store's entries), so evicting during the swap would only add
        the metadata stubs on top of the list at the peak."""
        while self.used > self.limit:
            victim: tuple[Store, OrderedDict[str, int]] | None = None
            oldest = 0
            for store, held in self._held.items():
                if held:
                    use = next(iter(held.values())) >> _SIZE_BITS
                    if victim is None or use < oldest:
                        victim, oldest = (store, held), use
            if victim is None:
                return
            victim_store, victim_held = victim
            victim_key, value = victim_held.popitem(last=False)
            self.used -= value & _SIZE_MASK
            self.evictions += 1
            victim_store._evict(victim_key)

    def touch(self, store: Store, key: str) -> None:
        """``key``'s body was read: it becomes the most recently used."""
        held = self._held.get(store)
        if held is not None:
            value = held.get(key)
            if value is not None:
                self._uses += 1
                held[key] = (self._uses << _SIZE_BITS) | (value & _SIZE_MASK)
                held.move_to_end(key)

    def forget(self, store: Store, key: str) -> None:
        """``key`` left ``store`` (deleted, or its body evicted by the store itself)."""
        held = self._held.get(store)
        if held is not None:
            before = held.pop(key, None)
            if before is not None:
                self.used -= before & _SIZE_MASK

    def forget_store(self, store: Store) -> None:
        """Every body of ``store`` (its informer stopped)."""
        held = self._held.pop(store, None)
        if held is not None:
            self.used -= sum(value & _SIZE_MASK for value in held.values())


_SIZE_BITS: Final = 32  # a body's size fits: the API server refuses objects of 3 MiB or more
_SIZE_MASK: Final = (1 << _SIZE_BITS) - 1
