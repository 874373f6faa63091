"""A byte budget for the bodies a cache keeps: the most recently used bodies stay, the others
are reduced to their metadata.

A :class:`BodyBudget` is shared by the stores it governs (one kind's, or every kind's without a
budget of its own). It counts the encoded bytes of the full bodies they hold and remembers the
order in which those bodies were last written or read. When a write takes the total over
:attr:`BodyBudget.limit`, the least recently used bodies are *evicted*: the store keeps, for
such an object, its ``apiVersion``, ``kind`` and whole ``metadata`` (a *stub*, encoded
compactly by :class:`MetadataStubs`), its resourceVersion and its index values, so keys,
indexes, label selection, resourceVersion and UID checks, and deltas' ``old`` metadata keep
working, and only the body is gone. A read of an
evicted body raises :class:`EvictedBodyError`, which says what the cache holds of it (the
resourceVersion); the client then fetches it live, no older than that (see
:mod:`controller_runtime.cache`).

Below the limit nothing is evicted and a store behaves exactly as one without a budget. Counted:
bodies only; metadata stubs, keys and index entries are the fixed cost of every object held
(``docs/informers.md`` has the figures). Single event loop, like the stores.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

if TYPE_CHECKING:
    from informers.store import Store

__all__ = ["STUBS", "BodyBudget", "EvictedBodyError", "MetadataStubs", "metadata_stub", "stub_of"]

_KEEP: Final = ("apiVersion", "kind", "metadata")
_MAX_PAIRS: Final = 256  # a compact stub names its (apiVersion, kind) in one byte
_FROM_KEY: Final = frozenset(("name", "namespace"))  # what a compact stub's key gives back
_CLOSE: Final = ord("}")


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


class MetadataStubs:
    """Stubs (an evicted object's ``apiVersion``, ``kind`` and ``metadata``), encoded compactly.

    As JSON, every stub of a kind would repeat the same ``apiVersion`` and ``kind``, and the
    name and namespace its store key already holds: about 100 of a Task's 290 bytes. So
    :meth:`encode` writes a stub without them, after two bytes: a NUL (no JSON text starts
    with one, so a stub is never taken for a body) and the number this table gave the
    object's (``apiVersion``, ``kind``). :meth:`json` puts them back: the JSON it returns
    decodes to exactly what the stub was made of (the key order aside). An object they cannot
    be restored for exactly (no ``apiVersion`` or ``kind``, a name or namespace its key does not
    give back, a 257th pair in one table) gets a plain JSON stub, as :func:`stub_of` makes.

    One table (:data:`STUBS`) serves every store of the process, so a delta can decode a stub
    with its key alone; it grows by one entry per kind, never shrinks, and is safe to use from
    several threads.
    """

    __slots__ = ("_heads", "_lock", "_pairs")

    def __init__(self) -> None:
        self._pairs: dict[tuple[str, str], bytes] = {}  # pair -> the stub's first two bytes
        # By pair number: b'{"apiVersion":...,"kind":...,"metadata":{' (what a stub lacks).
        self._heads: list[bytes] = []
        self._lock = threading.Lock()

    def encode(self, key: str, obj: Mapping[str, Any]) -> bytes:
        """The stub of ``obj``, stored at ``key`` (exact size)."""
        api_version, kind, meta = obj.get("apiVersion"), obj.get("kind"), obj.get("metadata")
        if type(api_version) is not str or type(kind) is not str or type(meta) is not dict:
            return stub_of(obj)
        namespace, _, name = key.rpartition("/")
        if meta.get("name") != name or meta.get("namespace", "") != namespace:
            return stub_of(obj)  # e.g. a name with "/" in it, which no API server accepts
        if not namespace and "namespace" in meta:
            return stub_of(obj)  # "namespace": "" would not come back
        prefix = self._pairs.get((api_version, kind))
        if prefix is None:
            prefix = self._add_pair(api_version, kind)
            if prefix is None:
                return stub_of(obj)
        rest = {k: v for k, v in meta.items() if k not in _FROM_KEY}
        # The metadata's JSON without its opening brace.
        return prefix + memoryview(orjson.dumps(rest))[1:]

    def json(self, key: str, held: bytes) -> bytes:
        """The JSON of what a store holds at ``key``: ``held`` itself for a body or a plain
        stub, the restored JSON for a compact stub."""
        if held[0]:
            return held
        namespace, _, name = key.rpartition("/")
        parts: list[bytes | memoryview] = [self._heads[held[1]], b'"name":', orjson.dumps(name)]
        if namespace:
            parts += (b',"namespace":', orjson.dumps(namespace))
        rest = memoryview(held)[2:]
        if rest[0] != _CLOSE:  # other metadata fields follow
            parts.append(b",")
        parts += (rest, b"}")
        return b"".join(parts)

    def _add_pair(self, api_version: str, kind: str) -> bytes | None:
        with self._lock:
            prefix = self._pairs.get((api_version, kind))
            if prefix is None and len(self._heads) < _MAX_PAIRS:
                self._heads.append(
                    b'{"apiVersion":%b,"kind":%b,"metadata":{'
                    % (orjson.dumps(api_version), orjson.dumps(kind))
                )
                prefix = self._pairs[api_version, kind] = bytes((0, len(self._heads) - 1))
            return prefix


STUBS: Final = MetadataStubs()
"""The process's stub table, used by every store and delta (see :class:`MetadataStubs`)."""


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
