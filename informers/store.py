"""The local cache of one watched resource: objects by key, indexes, observed resourceVersion.

Objects are held as exact-size JSON ``bytes`` (orjson's encoding, or for a watch event the
bytes of the wire without managedFields, see :meth:`Store.apply_raw`) plus the few fields the
indexes need, and decoded on every read. A read therefore returns a fresh ``dict`` the caller
owns (mutating it never touches the cache), and the cache costs about what the JSON costs (see
docs/design.md, "The cache"): ``python -m bench.store_memory`` measured ~960 B of RSS per
object for 644 B of JSON, against ~2.8 KB for a dict of decoded objects.

The store is written by one reflector and read by many, all on **one event loop**; it is not
thread-safe. Every method is synchronous except :meth:`Store.wait_for_resource_version`, so each
write (including a whole :meth:`Store.replace`) is atomic with respect to other coroutines.
"""

from __future__ import annotations

import asyncio
import builtins
import heapq
import itertools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, Final, Literal

import orjson

from ._partial import Metadata, label_values, owner_uids
from .budget import STUBS, BodyBudget, EvictedBodyError
from .labels import LabelSelector, Operator
from .resource_version import compare_resource_versions, is_comparable, is_newer, sort_key

__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "EventType",
    "IndexFunc",
    "Prepared",
    "Store",
    "StoreDelta",
    "object_key",
    "split_uid_change",
]

logger = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"

IndexFunc = Callable[[Mapping[str, Any]], Iterable[str]]
"""Maps an object to the index values it is filed under (any number, possibly none)."""
_TupleIndexFunc = Callable[[Mapping[str, Any]], tuple[str, ...]]

NAMESPACE_INDEX: Final = "namespace"
OWNER_UID_INDEX: Final = "owner_uid"
LABEL_INDEX: Final = "label"


def object_key(obj: Mapping[str, Any]) -> str:
    """``"namespace/name"``, or ``"name"`` for a cluster-scoped object (no namespace).

    Raises ``ValueError`` when ``metadata.name`` is missing or empty.
    """
    meta = obj.get("metadata")
    name = meta.get("name") if meta else None
    if not name or not isinstance(name, str):
        raise ValueError(f"object has no metadata.name: {_describe(obj)}")
    namespace = meta.get("namespace") if meta else None
    return f"{namespace}/{name}" if namespace else name


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """``(key, resourceVersion, uid)`` of an object the store takes: the one check of
    :meth:`Store.prepare` and :meth:`Store.apply`. Raises ``ValueError`` for an object without
    ``metadata.name``, or a resourceVersion or UID that is not a string."""
    key = object_key(obj)
    meta = obj["metadata"]
    rv = meta.get("resourceVersion") or ""
    uid = meta.get("uid") or None
    if type(rv) is not str or (uid is not None and type(uid) is not str):
        raise ValueError(f"metadata.resourceVersion and metadata.uid must be strings: {key}")
    return key, rv, uid


def _meta_identity(meta: Metadata) -> tuple[str, str, str | None]:
    """:func:`_identity` of decoded metadata (its fields are strings already)."""
    name = meta.name
    if not name:
        raise ValueError(f"object has no metadata.name: metadata={meta!r}"[:200])
    namespace = meta.namespace
    return f"{namespace}/{name}" if namespace else name, meta.resourceVersion, meta.uid or None


def _describe(obj: Mapping[str, Any]) -> str:
    return f"kind={obj.get('kind')!r} metadata={obj.get('metadata')!r}"[:200]


def _encode(obj: Mapping[str, Any]) -> bytes:
    # orjson.dumps over-allocates its result (RSS per object ~4x the JSON size when kept);
    # copying through a memoryview yields an exact-size bytes object.
    return memoryview(orjson.dumps(obj)).tobytes()


_NO_VALUES: tuple[str, ...] = ()


class _Entry:
    """What the store keeps per object that files under an index or whose resourceVersion
    cannot be read back from its bytes. Every other object is kept as its bare ``bytes``
    (see :meth:`Store._compact`): no entry object and no resourceVersion string, ~120 B less.
    """

    # Deliberately small: a slot costs 8 B per object, a string field ~50-90 B. The UID is not
    # kept (uid_of decodes); the resourceVersion is, because every write compares it.
    __slots__ = ("ivals", "raw", "rv")

    def __init__(self, raw: bytes, rv: str, ivals: tuple[tuple[str, ...], ...]) -> None:
        self.raw = raw
        self.rv = rv
        # Index values per non-namespace index, in Store._index_names order; kept so that an
        # update or delete can unfile the old values without decoding the old object.
        self.ivals = ivals


_RV_FIELD: Final = b'"resourceVersion":"'


def _rv_reads_back(raw: bytes, rv: str) -> bool:
    """Whether :func:`_rv_in` of ``raw`` is ``rv``, without decoding: the first
    ``"resourceVersion":"`` is followed by ``rv`` and its closing quote."""
    at = raw.find(_RV_FIELD)
    return at >= 0 and raw.startswith(rv.encode() + b'"', at + len(_RV_FIELD))


def _rv_in(raw: bytes) -> str | None:
    """The value of the first ``"resourceVersion":"..."`` in ``raw``, or ``None``."""
    i = raw.find(_RV_FIELD)
    if i < 0:
        return None
    i += len(_RV_FIELD)
    j = raw.find(b'"', i)
    return raw[i:j].decode() if j >= 0 else None


def _raw_of(stored: bytes | _Entry) -> bytes:
    return stored if type(stored) is bytes else stored.raw  # type: ignore[union-attr]


def _rv_of(stored: bytes | _Entry) -> str:
    if type(stored) is bytes:
        return _rv_in(stored) or ""
    return stored.rv  # type: ignore[union-attr]


class StoreDelta:
    """One change the store made, handed to event handlers.

    ``type`` is what happened to the *cache* (an ``ADDED`` event for a key already cached yields
    ``MODIFIED``). ``key`` is the store key (``namespace/name``). ``obj`` is the new state, or
    for ``DELETED`` the last known state (the event's object, or the cached one for a deletion
    synthesised by a relist). ``obj`` is not a copy of anything the cache holds, but it may be
    shared by every handler of one delta: treat it as read-only. Deltas of a relist or an
    initial list carry only the encoded bytes and decode ``obj`` on first access, so handlers
    that need only the key (enqueueing it) never pay for decoding. ``old`` is the previously
    cached state (``None`` for ``ADDED``), decoded from the cached bytes on first access only.

    One exception, from :meth:`Store.apply` and :meth:`Store.apply_prepared` (one write path):
    an ``ADDED`` delta with ``old`` set means the key was taken over by another object (its UID
    changed: deleted and re-created with the same name while we did not see it).
    :func:`split_uid_change` turns it into the ``DELETED`` of the old object and the ``ADDED``
    of the new one, which is what the reflector hands to handlers;
    :meth:`Store.replace_prepared` returns the two deltas itself.
    """

    __slots__ = ("_obj", "_old", "_old_raw", "_raw", "key", "type")

    def __init__(
        self,
        type: EventType,
        obj: dict[str, Any] | None,
        old_raw: bytes | None = None,
        *,
        raw: bytes | None = None,
        key: str | None = None,
    ) -> None:
        if obj is None and raw is None:
            raise ValueError("a StoreDelta needs obj or raw")
        self.type: EventType = type
        self._obj = obj
        self._raw = raw
        self._old_raw = old_raw
        self._old: dict[str, Any] | None = None
        self.key: str = key if key is not None else object_key(self.obj)

    @property
    def obj(self) -> dict[str, Any]:
        """The object (decoded lazily, once, when the delta carries only bytes)."""
        obj = self._obj
        if obj is None:
            raw: bytes = self._raw  # type: ignore[assignment]
            # A compact metadata stub (an evicted object's) starts with a NUL: see STUBS.
            obj = self._obj = orjson.loads(raw if raw[0] else STUBS.json(self.key, raw))
            self._raw = None
        return obj

    @property
    def has_old(self) -> bool:
        """Whether the delta carries a previous state (without decoding it)."""
        return self._old_raw is not None or self._old is not None

    @property
    def old(self) -> dict[str, Any] | None:
        """The previously cached state, or ``None`` for ``ADDED`` (decoded lazily, once)."""
        old_raw = self._old_raw
        if self._old is None and old_raw is not None:
            self._old = orjson.loads(old_raw if old_raw[0] else STUBS.json(self.key, old_raw))
            self._old_raw = None
        return self._old

    def __repr__(self) -> str:
        return f"StoreDelta({self.type}, {self.key})"


_new_object = object.__new__


def _delta(
    type: EventType, obj: dict[str, Any] | None, old_raw: bytes | None, raw: bytes, key: str
) -> StoreDelta:
    """``StoreDelta(type, obj, old_raw, raw=raw, key=key)`` for the store's own writes, which
    always have the bytes and the key: half the cost of the keyword call, once per event."""
    delta: StoreDelta = _new_object(StoreDelta)
    delta.type = type
    delta._obj = obj
    delta._raw = raw
    delta._old_raw = old_raw
    delta._old = None
    delta.key = key
    return delta


def split_uid_change(delta: StoreDelta) -> tuple[StoreDelta, StoreDelta]:
    """The ``DELETED`` of the old object and the ``ADDED`` of the new one, for an ``ADDED``
    delta that replaced another object under the same key (see :class:`StoreDelta`)."""
    old_raw = delta._old_raw
    if old_raw is None and delta._old is not None:
        old_raw = _encode(delta._old)
    if delta.type != ADDED or old_raw is None:
        raise ValueError(f"{delta!r} is not a UID change")
    return (
        StoreDelta(DELETED, None, old_raw, raw=old_raw, key=delta.key),
        StoreDelta(ADDED, delta._obj, raw=delta._raw, key=delta.key),
    )


def _uid_in(raw: bytes) -> str | None:
    """``metadata.uid`` of an encoded object or stub (decodes it: for the rare case only)."""
    if raw[0]:
        uid = (orjson.loads(raw).get("metadata") or {}).get("uid")
    else:  # a compact stub (see STUBS): two bytes, then its metadata's JSON but the "{"
        uid = orjson.loads(b"{" + raw[2:]).get("uid")
    return uid if isinstance(uid, str) and uid else None


def _uid_changed(uid: str, old_raw: bytes) -> bool:
    """Whether an object with metadata.uid ``uid`` is not the one encoded in ``old_raw``.

    The old UID is not kept (see :class:`_Entry`), so this first asks whether ``old_raw``
    contains ``"uid":"<uid>"`` (the compact encoding of orjson and of the API server): it does
    when the UIDs are equal. Only when it does not (another UID, or bytes written otherwise:
    whitespace, escapes) is the old UID decoded. It could only miss a change if the old object
    named its successor's UID in a field called ``uid``, which an object deleted before its
    successor existed cannot do.
    """
    if (b'"uid":"' + uid.encode() + b'"') in old_raw:
        return False
    try:
        return _uid_in(old_raw) != uid  # a body or a stub (see STUBS)
    except (orjson.JSONDecodeError, AttributeError):
        return True


_UID_NOT_KEPT: Final = ""
"""``Prepared.uid`` of an object whose key the store did not hold when it was prepared: the
UID is only compared when the key is held, so it is read back from the encoding in the rare
case that the key is held by the time the object is stored (a real UID is never empty)."""


class Prepared(_Entry):
    """An object made ready for the store: key, resourceVersion, exact-size encoded bytes and
    index values, plus the decoded dict for as long as the caller keeps it.

    The reflector prepares each listed object as it arrives and drops the dict
    (:meth:`drop_object`), so a list of 100k objects is buffered as bytes, not as dicts: the
    peak memory of a sync, and the heap fragmentation it leaves behind, stay close to the
    store's own size. It is its own entry (no second object per buffered item), and keeps the
    UID only when the store held the key (a UID string is ~85 B per buffered object).

    ``stub``: ``raw`` is the object's metadata only (:class:`~informers.budget.MetadataStubs`),
    prepared so by a store whose memory budget the list being buffered has filled
    (:meth:`Store.prepare`); it is stored with its body evicted.
    """

    __slots__ = ("key", "obj", "stub", "uid")

    def __init__(  # noqa: PLR0917 (an entry's three fields, then its own four)
        self,
        key: str,
        raw: bytes,
        rv: str,
        ivals: tuple[tuple[str, ...], ...],
        obj: dict[str, Any] | None,
        uid: str | None = None,
        *,
        stub: bool = False,
    ) -> None:
        super().__init__(raw, rv, ivals)
        self.key = key
        self.obj = obj
        self.uid = uid
        self.stub = stub

    @property
    def entry(self) -> _Entry:
        """The entry to store (this object itself)."""
        return self

    @property
    def resource_version(self) -> str:
        return self.rv

    def drop_object(self) -> Prepared:
        self.obj = None
        return self


class _Index:
    """value -> keys. A value filed under one key holds the bare key (most owner UIDs have a
    single child, and a dict per value would cost ~200 B); larger buckets are insertion-ordered
    dicts, so results come back in a stable order."""

    __slots__ = ("buckets", "peak")

    def __init__(self) -> None:
        self.buckets: dict[str, str | dict[str, None]] = {}
        self.peak = 0

    def add(self, value: str, key: str) -> None:
        b = self.buckets.get(value)
        if b is None:
            self.buckets[value] = key
            self.peak = max(self.peak, len(self.buckets))
        elif type(b) is str:
            if b != key:
                self.buckets[value] = {b: None, key: None}
        else:
            b[key] = None  # type: ignore[index]

    def discard(self, value: str, key: str) -> None:
        b = self.buckets.get(value)
        if b is None:
            return
        if type(b) is str:
            if b == key:
                del self.buckets[value]
                self._maybe_shrink()
            return
        assert isinstance(b, dict)
        b.pop(key, None)
        if len(b) == 1:
            self.buckets[value] = next(iter(b))
        elif not b:
            del self.buckets[value]
            self._maybe_shrink()

    def _maybe_shrink(self) -> None:
        if shrunk(self.buckets, self.peak):
            self.buckets = dict(self.buckets)
            self.peak = len(self.buckets)

    def keys(self, value: str) -> list[str]:
        b = self.buckets.get(value)
        if b is None:
            return []
        if type(b) is str:
            return [b]
        return list(b)


SHRINK_ABOVE: Final = 1024
"""A dict that once held more entries than this is copied to a right-sized one when it falls
below a quarter of its peak: CPython never shrinks a dict's table on deletion, so without this
a store that once held 1M objects keeps ~60 MiB of empty slots after they are all deleted."""


def shrunk(table: Sized, peak: int) -> bool:
    """Whether ``table`` (which once held ``peak`` entries) should be copied to a smaller one.
    Copying costs O(len) once per 3/4 * peak deletions: O(1) amortised per deletion."""
    return peak > SHRINK_ABOVE and len(table) * 4 < peak


def _owner_uids(obj: Mapping[str, Any]) -> tuple[str, ...]:
    refs = (obj.get("metadata") or {}).get("ownerReferences")
    if not refs:
        return _NO_VALUES
    # Interned: siblings share their owner's UID string with each other and the index.
    return tuple(sys.intern(uid) for ref in refs if (uid := ref.get("uid")))


def _interning(func: IndexFunc) -> _TupleIndexFunc:
    def wrapper(obj: Mapping[str, Any]) -> tuple[str, ...]:
        values = func(obj)
        if isinstance(values, str):  # would silently index every character
            raise TypeError(f"index function {func!r} returned a str; return an iterable of str")
        return tuple(dict.fromkeys(sys.intern(v) for v in values))

    return wrapper


def _label_values(obj: Mapping[str, Any]) -> tuple[str, ...]:
    labels = (obj.get("metadata") or {}).get("labels")
    if not labels:
        return _NO_VALUES
    # Interned: label pairs repeat across objects, and each entry keeps its own tuple of them.
    return tuple(sys.intern(f"{k}={v}") for k, v in labels.items())


class Store:
    """The cache of one resource (one group/resource, possibly scoped by namespace or selector).

    **Keys** are ``"namespace/name"``, or ``"name"`` for cluster-scoped objects
    (:func:`object_key`).

    **Indexes.** ``"namespace"`` (cluster-scoped objects are not filed under it) and
    ``"owner_uid"`` (UIDs from ``metadata.ownerReferences``) are always on. The namespace
    index is built from the keys the first time it is read (a :meth:`list` by namespace, or
    the index by name), O(objects) once, and kept up to date from then on: a store never
    read by namespace does not pay its ~40-50 B per object. ``"label"`` (values
    ``"k=v"``) is on when ``label_index=True`` (default off: with three labels it adds ~240 B per
    object to ~960 B); it also lets :meth:`list` narrow and match by label without decoding.
    ``indexers``
    adds custom indexes by name; an index function is called once per stored write of an object
    and must be pure.

    **Reads** (:meth:`get`, :meth:`list`, :meth:`by_index`) decode the stored bytes and return
    fresh dicts the caller owns. Result order is stable (insertion order) but not meaningful.

    **Writes** come from the reflector. They never regress an object: an event or relist item
    whose resourceVersion is provably older than the cached one for that key is ignored (a stale
    ``DELETED`` too), an identical resourceVersion is a no-op, and a resourceVersion that cannot
    be compared is applied (fail open; see :mod:`informers.resource_version`).

    **Nor do they bring back an object seen deleted.** Once synced (:meth:`mark_synced`), the
    store holds the complete state as of :attr:`last_observed_resource_version`, so an
    ``ADDED``/``MODIFIED`` event for a key it does not hold, at a version provably older than
    that, describes an object that no longer existed at that point (deleted, or gone from the
    watch's selector): a replay of events the store has been past, as a watch resumed from an
    older resourceVersion (a lagging API server replica) delivers. It is ignored. The same holds
    for the items of a relist taken at a version older than the one observed. A relist at the
    observed version or newer is trusted whole: it is how a store that missed something heals.
    Before the first sync (nothing complete to judge against) and for versions that cannot be
    compared, such writes are applied.

    **resourceVersion tracking.** :attr:`last_observed_resource_version` is the newest
    resourceVersion seen in events (including ignored ones), relists and bookmarks; it never
    moves backwards. During a streaming list the initial ``ADDED`` events are not in RV order, so
    it is only a staleness bound once the initial list is complete (:attr:`has_synced`).

    **Memory under churn.** Nothing per key outlives the key: deleting every object leaves the
    store at about its empty size, hash tables included (they are right-sized once they fall
    below a quarter of their peak, see :data:`SHRINK_ABOVE`; what stays is bounded by a few
    tables of at most ``4 * SHRINK_ABOVE`` slots, ~100 KiB each, whatever the peak was).
    Caveat: a multi-key index bucket (e.g. one namespace's keys) keeps its table until it
    empties or falls to one key.

    Single event loop, not thread-safe.
    """

    def __init__(
        self,
        *,
        indexers: Mapping[str, IndexFunc] | None = None,
        label_index: bool = False,
        budget: BodyBudget | None = None,
    ) -> None:
        funcs: dict[str, _TupleIndexFunc] = {OWNER_UID_INDEX: _owner_uids}
        if label_index:
            funcs[LABEL_INDEX] = _label_values
        for name, func in (indexers or {}).items():
            if name in funcs or name in (NAMESPACE_INDEX, OWNER_UID_INDEX, LABEL_INDEX):
                raise ValueError(f"index name {name!r} is reserved or already defined")
            funcs[name] = _interning(func)
        self._index_names: tuple[str, ...] = tuple(funcs)
        self._owner_index_only = self._index_names == (OWNER_UID_INDEX,)
        self._index_funcs = tuple(funcs.values())
        # The same built-in indexes computed from decoded metadata (apply_raw); None when a
        # custom index function needs the object itself.
        meta_funcs: dict[str, Callable[[Metadata], tuple[str, ...]]] = {
            OWNER_UID_INDEX: owner_uids,
            LABEL_INDEX: label_values,
        }
        self._meta_index_funcs: tuple[Callable[[Metadata], tuple[str, ...]], ...] | None = (
            tuple(meta_funcs[name] for name in funcs) if indexers is None or not indexers else None
        )
        self._indexes: tuple[_Index, ...] = tuple(_Index() for _ in funcs)
        self._label_pos: int | None = self._index_names.index(LABEL_INDEX) if label_index else None
        # Built on first use (see the class docs), then kept up to date.
        self._ns_lazy: _Index | None = None
        self._no_ivals: tuple[tuple[str, ...], ...] = (_NO_VALUES,) * len(funcs)
        self._items: dict[str, bytes | _Entry] = {}
        self._items_peak = 0  # the most keys held since the table was last right-sized
        self._last_rv: str | None = None
        self._last_key: tuple[int, str] | None = None  # sort_key(_last_rv), compared per event
        self._synced = False
        self._warned_incomparable = False
        # Waiters for wait_for_resource_version: a heap of (sort key, seq, future).
        self._waiters: list[tuple[tuple[int, str], int, asyncio.Future[None]]] = []
        self._dead_waiters = 0
        self._seq = itertools.count()
        self._budget = budget
        self._syncing = False  # a replace in progress defers evictions (enforce_budget)
        # With a budget: the keys held as metadata only (their bodies evicted), and the body
        # bytes the list being buffered has prepared (see prepare).
        self._stubbed: set[str] = set()
        self._stubbed_peak = 0
        self._listed_bytes = 0

    # ----------------------------------------------------------------------------------- reads

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def keys(self) -> list[str]:
        """All keys, as a new list."""
        return list(self._items)

    def get(self, key: str) -> dict[str, Any] | None:
        """A fresh copy of the object at ``key``, or ``None``. With a budget, raises
        :class:`~informers.budget.EvictedBodyError` for an object whose body was evicted."""
        stored = self._items.get(key)
        if stored is None:
            return None
        if self._budget is not None:
            return orjson.loads(self._body(key, stored))  # type: ignore[no-any-return]
        return orjson.loads(_raw_of(stored))  # type: ignore[no-any-return]

    def get_raw(self, key: str) -> bytes | None:
        """The stored JSON encoding of the object at ``key`` (immutable), or ``None``; raises
        :class:`~informers.budget.EvictedBodyError` as :meth:`get` does."""
        stored = self._items.get(key)
        if stored is None:
            return None
        if self._budget is not None:
            return self._body(key, stored)
        return _raw_of(stored)

    def held_raw(self, key: str) -> bytes | None:
        """The JSON of what the store holds for ``key``: its body, or with a budget possibly
        only its metadata stub (:mod:`informers.budget`); ``None`` when absent. Never raises;
        does not count as a use of the body."""
        stored = self._items.get(key)
        return None if stored is None else STUBS.json(key, _raw_of(stored))

    def evicted(self, key: str) -> bool:
        """Whether ``key`` is held with its metadata only (its body evicted by the budget)."""
        return key in self._stubbed

    @property
    def budget(self) -> BodyBudget | None:
        """The budget governing this store's bodies (``None``: unbounded)."""
        return self._budget

    def held_bytes(self) -> int:
        """Encoded bytes held (bodies and metadata stubs), O(objects): for metrics."""
        return sum(len(_raw_of(v)) for v in list(self._items.values()))

    def readmit(self, key: str, raw: bytes) -> bool:
        """Hold ``raw`` (a body fetched live) as the body of ``key`` again, when ``key`` is
        held evicted at exactly the resourceVersion in ``raw`` (else nothing changes: the
        fetch saw another version than the store, and the store keeps following its watch).
        Returns whether it was taken."""
        if key not in self._stubbed or self._budget is None:
            return False
        held = self._entry(self._items[key])
        if _rv_in(raw) != held.rv:
            return False
        self._items[key] = self._compact(_Entry(memoryview(raw).tobytes(), held.rv, held.ivals))
        self._unstub(key)
        self._budget.admit(self, key, len(raw))
        return True

    def _body(self, key: str, stored: bytes | _Entry) -> bytes:
        if key in self._stubbed:
            raise EvictedBodyError(key, _rv_of(stored))
        assert self._budget is not None
        self._budget.touch(self, key)
        return _raw_of(stored)

    def _evict(self, key: str) -> None:
        """Keep only ``key``'s metadata (called by the budget, which forgot the body)."""
        stored = self._items.get(key)
        if stored is None or key in self._stubbed:
            return
        entry = self._entry(stored)
        stub = STUBS.encode(key, orjson.loads(entry.raw))
        self._items[key] = self._compact(_Entry(stub, entry.rv, entry.ivals))
        self._stub(key)

    def _stub(self, key: str) -> None:
        self._stubbed.add(key)
        self._stubbed_peak = max(self._stubbed_peak, len(self._stubbed))

    def _unstub(self, key: str) -> None:
        stubbed = self._stubbed
        if key in stubbed:
            stubbed.discard(key)
            if shrunk(stubbed, self._stubbed_peak):  # sets keep their table too
                self._stubbed = set(stubbed)
                self._stubbed_peak = len(stubbed)

    def list_held(
        self, *, namespace: str | None = None, selector: LabelSelector | None = None
    ) -> tuple[builtins.list[dict[str, Any]], builtins.list[tuple[str, str]]]:
        """:meth:`list`, split: fresh copies of the matching objects whose bodies are held,
        and ``(key, resourceVersion)`` of the matching ones held as metadata only (selectors
        match on the metadata kept). Without a budget the second list is empty."""
        if self._budget is None:
            return self.list(namespace=namespace, selector=selector), []
        keys: Iterable[str] = self._ns_index.keys(namespace) if namespace else list(self._items)
        bodies: builtins.list[dict[str, Any]] = []
        evicted: builtins.list[tuple[str, str]] = []
        items = self._items
        for k in keys:
            stored = items[k]
            obj = orjson.loads(STUBS.json(k, _raw_of(stored)))
            if selector is not None and not selector.empty and not selector.matches_object(obj):
                continue
            if k in self._stubbed:
                evicted.append((k, _rv_of(stored)))
            else:
                self._budget.touch(self, k)
                bodies.append(obj)
        return bodies, evicted

    def resource_version_of(self, key: str) -> str | None:
        """The cached object's ``metadata.resourceVersion`` (no decoding), or ``None``."""
        stored = self._items.get(key)
        return None if stored is None else _rv_of(stored)

    def uid_of(self, key: str) -> str | None:
        """The cached object's ``metadata.uid``, or ``None``.

        Decodes the object (a few microseconds for a typical one): keeping UIDs would cost
        ~90 B per cached object, and they are read far less often than objects are written.
        """
        stored = self._items.get(key)
        if stored is None:
            return None
        uid = orjson.loads(STUBS.json(key, _raw_of(stored))).get("metadata", {}).get("uid")
        return uid if isinstance(uid, str) else None

    def list(
        self, *, namespace: str | None = None, selector: LabelSelector | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Fresh copies of the objects in ``namespace`` (``None`` or ``""``: all) that match
        ``selector`` (``None``: all). With a budget, raises
        :class:`~informers.budget.EvictedBodyError` if one of them is held as metadata only
        (:meth:`list_held` returns both parts)."""
        if self._budget is not None:
            bodies, evicted = self.list_held(namespace=namespace, selector=selector)
            if evicted:
                raise EvictedBodyError(*evicted[0])
            return bodies
        keys: Iterable[str] = self._ns_index.keys(namespace) if namespace else self._items
        if selector is None or selector.empty:
            items = self._items
            return [orjson.loads(_raw_of(items[k])) for k in keys]
        if self._label_pos is None:
            decoded = (orjson.loads(_raw_of(self._items[k])) for k in keys)
            return [o for o in decoded if selector.matches_object(o)]
        narrowed = self._label_candidates(selector)
        if narrowed is not None:
            if namespace:
                prefix = f"{namespace}/"
                narrowed = [k for k in narrowed if k.startswith(prefix)]
            keys = narrowed
        return [orjson.loads(e.raw) for e in self._label_matches(keys, selector)]

    def by_index(self, name: str, value: str) -> builtins.list[dict[str, Any]]:
        """Fresh copies of the objects filed under ``value`` in index ``name``.

        Raises ``KeyError`` for an unknown index name (and, with a budget,
        :class:`~informers.budget.EvictedBodyError` as :meth:`get` does).
        """
        items = self._items
        if self._budget is not None:
            return [orjson.loads(self._body(k, items[k])) for k in self.index_keys(name, value)]
        return [orjson.loads(_raw_of(items[k])) for k in self.index_keys(name, value)]

    def index_keys(self, name: str, value: str) -> builtins.list[str]:
        """Keys of the objects filed under ``value`` in index ``name``.

        Raises ``KeyError`` for an unknown index name.
        """
        return self._index(name).keys(value)

    def index_values(self, name: str) -> builtins.list[str]:
        """The values that currently have objects in index ``name``."""
        return list(self._index(name).buckets)

    @property
    def index_names(self) -> tuple[str, ...]:
        """Names of all indexes, built-in and custom."""
        return (NAMESPACE_INDEX, *self._index_names)

    @property
    def _ns_index(self) -> _Index:
        """The namespace index, built from the keys on first use."""
        index = self._ns_lazy
        if index is None:
            index = self._ns_lazy = _Index()
            for key in self._items:
                namespace, slash, _ = key.partition("/")
                if slash:
                    index.add(namespace, key)
        return index

    def _index(self, name: str) -> _Index:
        if name == NAMESPACE_INDEX:
            return self._ns_index
        try:
            return self._indexes[self._index_names.index(name)]
        except ValueError:
            raise KeyError(f"no index named {name!r}; have {self.index_names}") from None

    def _label_candidates(self, selector: LabelSelector) -> builtins.list[str] | None:
        """Keys that satisfy the first positive requirement, via the label index."""
        assert self._label_pos is not None
        index = self._indexes[self._label_pos]
        for req in selector.requirements:
            if req.operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN):
                keys: builtins.list[str] = []
                for v in req.values:
                    keys.extend(index.keys(f"{req.key}={v}"))
                return keys
        return None

    def _label_matches(self, keys: Iterable[str], selector: LabelSelector) -> Iterator[_Entry]:
        assert self._label_pos is not None
        pos = self._label_pos
        items = self._items
        for k in keys:
            entry = self._entry(items[k])
            # A label key cannot contain "=", so the first "=" splits key from value.
            labels = dict(kv.split("=", 1) for kv in entry.ivals[pos])
            if selector.matches(labels):
                yield entry

    # ---------------------------------------------------------------------------------- writes

    def prepare(self, obj: dict[str, Any], *, buffered: bool = False) -> Prepared:
        """Validate, index and encode ``obj`` for a later :meth:`apply_prepared` or
        :meth:`replace_prepared`. Raises ``ValueError`` for an object without a name.

        ``buffered`` (default off): ``obj`` is an item of a list being buffered for
        :meth:`replace_prepared`. With a memory budget, such a list keeps full bodies only
        while the bodies it prepared since :meth:`start_list` fit within the budget's limit;
        from the first that does not, every item is prepared as its metadata only
        (``Prepared.stub``) and stored with its body evicted. So a list never buffers more
        bodies than the budget holds, and the bodies kept are the first listed.
        """
        key, rv, uid = _identity(obj)
        if not buffered:
            return Prepared(key, _encode(obj), rv, self._index_values(obj), obj, uid)
        if uid is not None and key not in self._items:
            uid = _UID_NOT_KEPT  # only compared with a held object's (see _UID_NOT_KEPT)
        budget = self._budget
        if budget is not None:
            if self._listed_bytes > budget.limit:
                stub = STUBS.encode(key, obj)
                return Prepared(key, stub, rv, self._index_values(obj), obj, uid, stub=True)
            raw = _encode(obj)
            self._listed_bytes += len(raw)
            if self._listed_bytes > budget.limit:
                stub = STUBS.encode(key, obj)
                return Prepared(key, stub, rv, self._index_values(obj), obj, uid, stub=True)
            return Prepared(key, raw, rv, self._index_values(obj), obj, uid)
        return Prepared(key, _encode(obj), rv, self._index_values(obj), obj, uid)

    def clear(self) -> None:
        """Forget every object at once, without deltas: for a store nothing reads any more
        (its informer was released, see :meth:`InformerFactory.release
        <informers.shared.InformerFactory.release>`). Its tables are replaced by empty ones,
        so they are freed with the objects, whoever still references the store; its budget
        forgets its bodies. Afterwards it reads as empty and not synced; the newest
        resourceVersion observed is kept."""
        if self._budget is not None:
            self._budget.forget_store(self)
        self._items = {}
        self._items_peak = 0
        self._ns_lazy = None
        self._indexes = tuple(_Index() for _ in self._index_funcs)
        self._stubbed = set()
        self._stubbed_peak = 0
        self._listed_bytes = 0
        self._synced = False

    def start_list(self) -> None:
        """A list is about to be buffered from its first item (again): the body allowance
        of :meth:`prepare` starts over. :meth:`replace_prepared` also resets it."""
        self._listed_bytes = 0

    def apply(self, event_type: EventType, obj: dict[str, Any]) -> StoreDelta | None:
        """Apply one watch event; return the change made, or ``None`` when it was ignored.

        ``ADDED``/``MODIFIED`` store ``obj`` unless the cached copy is at the same or a newer
        resourceVersion, or (once synced) no copy is cached and ``obj`` is older than the newest
        resourceVersion observed (a replay of an object seen deleted; class docs); when the
        cached copy has another UID the change is an ``ADDED`` delta with ``old`` set (see
        :func:`split_uid_change`). ``DELETED`` removes the key unless the
        cached copy is newer than the event's object (a delete at an equal resourceVersion is
        applied). The event's resourceVersion is observed either way. Raises ``ValueError`` for
        an unknown event type, an object without ``metadata.name``, or a resourceVersion or UID
        that is not a string; the store is unchanged then (also when an index function raises).
        A stale or repeated ``ADDED``/``MODIFIED`` is neither encoded nor indexed.
        """
        # Everything that can raise runs before the first change (in _apply, the encoding).
        key, rv, uid = _identity(obj)
        return self._apply(event_type, key, rv, uid, obj, None)

    def prepare_raw(self, meta: Metadata, raw: bytes, *, buffered: bool = False) -> Prepared:
        """:meth:`prepare` for an object already encoded: ``raw`` is its JSON (kept as is,
        not re-encoded: it must be exact-size and decode to the object) and ``meta`` its
        metadata, as :func:`informers._partial.decode_watch_line` returns them; ``buffered``
        as for :meth:`prepare` (past the budget, the item is its metadata stub). Raises
        ``ValueError`` for an empty name (and whatever a custom index function raises)."""
        key, rv, uid = _meta_identity(meta)
        ivals = self._raw_ivals(raw, meta)
        if not buffered:
            return Prepared(key, raw, rv, ivals, None, uid)
        if uid is not None and key not in self._items:
            uid = _UID_NOT_KEPT  # only compared with a held object's (see _UID_NOT_KEPT)
        budget = self._budget
        if budget is not None:
            if self._listed_bytes <= budget.limit:
                self._listed_bytes += len(raw)
            if self._listed_bytes > budget.limit:
                # orjson decodes a whole Task faster than msgspec skips to its metadata.
                stub = STUBS.encode(key, orjson.loads(raw))
                return Prepared(key, stub, rv, ivals, None, uid, stub=True)
        return Prepared(key, raw, rv, ivals, None, uid)

    def apply_raw(self, event_type: EventType, meta: Metadata, raw: bytes) -> StoreDelta | None:
        """:meth:`apply` for an object already encoded (see :meth:`prepare_raw`): the same
        checks and outcomes, without decoding or encoding the object. The delta carries only
        the bytes; its ``obj`` is decoded on first access."""
        # _meta_identity, inlined: this is the watch path's call per event.
        name = meta.name
        if not name:
            raise ValueError(f"object has no metadata.name: metadata={meta!r}"[:200])
        namespace = meta.namespace
        key = f"{namespace}/{name}" if namespace else name
        rv = meta.resourceVersion
        last_key = self._last_key
        if (
            last_key is not None
            and event_type in (ADDED, MODIFIED)
            and (len(rv) > last_key[0] or (len(rv) == last_key[0] and rv > last_key[1]))
            and rv.isdigit()
            and rv.isascii()
            and rv[0] != "0"
            and self._owner_index_only
            and not meta.ownerReferences
            and self._budget is None
            and key not in self._items
            and _rv_reads_back(raw, rv)  # kept as bare bytes, as _compact decides
        ):
            # What _apply does for a new key at a version newer than any observed, filed
            # under no index, without a budget (every event of a sync or a create), without
            # its calls to make an entry, put and compact it: two thirds of its cost.
            self._items[key] = raw
            self._filed_new_key(key)
            self._advance(rv, (len(rv), rv))
            return _delta(ADDED, None, None, raw, key)
        return self._apply(event_type, key, rv, meta.uid or None, None, None, raw, meta)

    def _new_entry(
        self, obj: dict[str, Any] | None, rv: str, raw: bytes | None, meta: Metadata | None
    ) -> _Entry:
        if raw is None:
            return self._make_entry(obj, rv)  # type: ignore[arg-type]
        if self._owner_index_only and not meta.ownerReferences:  # type: ignore[union-attr]
            return _Entry(raw, rv, self._no_ivals)  # the default store, an object without owners
        return _Entry(raw, rv, self._raw_ivals(raw, meta))  # type: ignore[arg-type]

    def _raw_ivals(self, raw: bytes, meta: Metadata) -> tuple[tuple[str, ...], ...]:
        funcs = self._meta_index_funcs
        if funcs is None:  # a custom index function takes the object: decode it (once)
            return self._index_values(orjson.loads(raw))
        if len(funcs) == 1:
            values = funcs[0](meta)
            return (values,) if values else self._no_ivals
        ivals = tuple([f(meta) for f in funcs])
        return ivals if any(ivals) else self._no_ivals

    def apply_prepared(self, event_type: EventType, prepared: Prepared) -> StoreDelta | None:
        """:meth:`apply` for an object already :meth:`prepare`-d."""
        p = prepared
        return self._apply(event_type, p.key, p.rv, p.uid, p.obj, p)

    # Positional and flat on purpose: the reflector's per-event path (see the docstring).
    def _apply(  # noqa: PLR0912, PLR0917
        self,
        event_type: EventType,
        key: str,
        rv: str,
        uid: str | None,
        obj: dict[str, Any] | None,
        entry: _Entry | None,
        raw: bytes | None = None,
        meta: Metadata | None = None,
    ) -> StoreDelta | None:
        """The write path of :meth:`apply`, :meth:`apply_raw` and :meth:`apply_prepared`
        (:meth:`apply_raw` writes a new key filed under no index on a path of its own, with
        the outcome this one would have).
        ``entry`` is the prepared encoding, or ``None`` to make it only once the event is known
        to be stored: from ``obj`` (encoded), or from ``raw`` and ``meta`` (index values only),
        whichever is given. The reflector calls this per event: the two
        comparisons against the newest observed version are written out (see the comments)
        rather than called, which is most of what a flattened copy of this path used to save.
        """
        stored = self._items.get(key)
        cur = None if stored is None else self._entry(stored)
        delta: StoreDelta | None = None
        if event_type in (MODIFIED, ADDED):
            if cur is None:
                last_key = self._last_key
                if (
                    last_key is not None
                    # _predates_observed, inlined: false at once for the in-order event of a
                    # create (longer, or as long and greater, than the newest observed)
                    and (len(rv) < last_key[0] or (len(rv) == last_key[0] and rv < last_key[1]))
                    and self._synced
                    and self._predates_observed(rv)
                ):
                    pass  # a replay of an object the store has seen deleted (class docs)
                else:
                    if entry is None:
                        entry = self._new_entry(obj, rv, raw, meta)
                    delta = self._put(key, entry, obj, None, uid)
            elif is_newer(rv, cur.rv):  # stale or repeated events are not encoded at all
                if entry is None:
                    entry = self._new_entry(obj, rv, raw, meta)
                delta = self._put(key, entry, obj, cur, uid)
        elif event_type == DELETED:
            # A delete needs no encoding: nothing is stored.
            if cur is not None and (rv == cur.rv or is_newer(rv, cur.rv)):
                self._remove(key, cur)
                if raw is None:
                    raw = cur.raw if entry is None else entry.raw
                delta = _delta(DELETED, obj, cur.raw, raw, key)
        else:
            raise ValueError(f"unknown event type {event_type!r} (want ADDED, MODIFIED, DELETED)")
        if rv:
            last_key = self._last_key
            if last_key is not None and rv.isdigit() and rv.isascii() and rv[0] != "0":
                # _observe for the common case (both comparable), without building the key
                # of an older version.
                if len(rv) > last_key[0] or (len(rv) == last_key[0] and rv > last_key[1]):
                    self._advance(rv, (len(rv), rv))
            else:
                self._observe(rv)
        return delta

    def replace(
        self, objs: Iterable[dict[str, Any]], resource_version: str
    ) -> builtins.list[StoreDelta]:
        """Replace the contents with a complete list taken at ``resource_version``.

        Atomic: every object is validated and encoded before anything changes, so an error
        leaves the store as it was. Returns the changes: ``ADDED`` for new keys, ``MODIFIED``
        for keys whose resourceVersion changed (never to an older one), ``DELETED`` of the old
        and ``ADDED`` of the new object for keys whose UID changed, then synthetic
        ``DELETED`` for cached keys absent from the list, except those cached at a version newer
        than ``resource_version`` (the list could not have seen them). Unchanged objects yield
        nothing. Once synced, a list taken at a version older than the newest observed adds no
        key the store does not hold (class docs). ``resource_version`` is observed.
        """
        return self.replace_prepared([self.prepare(obj) for obj in objs], resource_version)

    def replace_prepared(
        self, prepared: Iterable[Prepared], resource_version: str
    ) -> builtins.list[StoreDelta]:
        """:meth:`replace` for objects already :meth:`prepare`-d (validated and encoded, so
        the swap itself cannot fail half-way). With a budget, evictions wait for
        :meth:`enforce_budget` (the reflector calls it once the deltas are handed over)."""
        self._syncing = self._budget is not None
        try:
            return self._replace_prepared(prepared, resource_version)
        finally:
            self._syncing = False
            self._listed_bytes = 0

    def enforce_budget(self) -> None:
        """Evict what a :meth:`replace_prepared` left over the budget (no-op without one)."""
        if self._budget is not None:
            self._budget.enforce()

    def _replace_prepared(
        self, prepared: Iterable[Prepared], resource_version: str
    ) -> builtins.list[StoreDelta]:
        items = self._items
        plan: dict[str, Prepared] = {}
        for p in prepared:
            key, rv = p.key, p.rv
            planned = plan.get(key)
            if planned is not None:  # a key listed twice: the newer copy wins
                if is_newer(rv, planned.rv):
                    plan[key] = p
                continue
            plan[key] = p
        # A list older than what the store has observed adds no key the store does not hold:
        # those objects were deleted by the time the store's own state was taken (class docs).
        list_is_behind = self._synced and self._predates_observed(resource_version)
        deltas: builtins.list[StoreDelta] = []
        for key, p in plan.items():
            cur = self._entry_at(key)
            if cur is None and list_is_behind and self._predates_observed(p.rv):
                continue
            if cur is None or is_newer(p.rv, cur.rv):
                delta = self._put(key, p, p.obj, cur, p.uid)
                if cur is not None and delta.type == ADDED:
                    deltas.extend(split_uid_change(delta))
                else:
                    deltas.append(delta)
        vanished = [
            (k, self._entry(e))
            for k, e in items.items()
            if k not in plan and compare_resource_versions(_rv_of(e), resource_version) != 1
        ]
        for k, e in vanished:
            self._remove(k, e)
            deltas.append(StoreDelta(DELETED, None, e.raw, raw=e.raw, key=k))
        if resource_version:
            self._observe(resource_version)
        return deltas

    def observe_bookmark(self, resource_version: str) -> None:
        """Record the resourceVersion of a ``BOOKMARK`` event (or any known-reached version)."""
        if resource_version:
            self._observe(resource_version)

    @property
    def has_synced(self) -> bool:
        """True once the reflector has completed the initial list (:meth:`mark_synced`)."""
        return self._synced

    def mark_synced(self) -> None:
        """Called by the reflector when the initial list is in the store. Idempotent."""
        self._synced = True

    def _compact(self, entry: _Entry) -> bytes | _Entry:
        """What to keep for ``entry``: its bare bytes when nothing is lost (no index values,
        and the first ``"resourceVersion"`` in the bytes is the entry's, which :func:`_rv_in`
        then reads back), else the entry itself."""
        rv = entry.rv
        if entry.ivals is self._no_ivals and rv and _rv_reads_back(entry.raw, rv):
            return entry.raw
        # A Prepared is its own entry: keep a plain one (not its key, dict and UID).
        return entry if type(entry) is _Entry else _Entry(entry.raw, rv, entry.ivals)

    def _entry(self, stored: bytes | _Entry) -> _Entry:
        """The entry view of what is kept for a key (a temporary one for bare bytes)."""
        if type(stored) is bytes:
            return _Entry(stored, _rv_in(stored) or "", self._no_ivals)
        return stored  # type: ignore[return-value]

    def _entry_at(self, key: str) -> _Entry | None:
        stored = self._items.get(key)
        return None if stored is None else self._entry(stored)

    def _make_entry(self, obj: dict[str, Any], rv: str) -> _Entry:
        return _Entry(_encode(obj), rv, self._index_values(obj))

    def _index_values(self, obj: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
        # No generator expression: on this path it costs more than the index functions.
        funcs = self._index_funcs
        if len(funcs) == 1:
            values = funcs[0](obj)
            return (values,) if values else self._no_ivals
        ivals = tuple([f(obj) for f in funcs])
        if not any(ivals):
            return self._no_ivals  # one shared instance: most objects file under nothing
        return ivals

    def _filed_new_key(self, key: str) -> None:
        """The bookkeeping of a key just added to the items: their peak size (for the table's
        right-sizing) and the namespace index, when it has been built."""
        items = self._items
        if len(items) > self._items_peak:  # noqa: PLR1730 (max() is a call)
            self._items_peak = len(items)
        if self._ns_lazy is not None:
            namespace, slash, _ = key.partition("/")
            if slash:
                self._ns_lazy.add(namespace, key)

    def _put(  # noqa: PLR0912 (the new-key branch is every event of a sync: kept flat)
        self,
        key: str,
        entry: _Entry,
        obj: dict[str, Any] | None,
        cur: _Entry | None,
        uid: str | None = None,
    ) -> StoreDelta:
        """Store ``entry``; the delta is ``ADDED``, ``MODIFIED``, or ``ADDED`` with ``old`` when
        ``uid`` shows that another object took over the key."""
        items = self._items
        items[key] = self._compact(entry)
        if cur is None:  # a new key: every event of a sync takes this branch
            self._filed_new_key(key)
            if entry.ivals is not self._no_ivals:
                for index, values in zip(self._indexes, entry.ivals, strict=True):
                    for v in values:
                        index.add(v, key)
            if self._budget is not None:
                self._hold(key, entry)
            return _delta(ADDED, obj, None, entry.raw, key)
        if cur.ivals is not entry.ivals and cur.ivals != entry.ivals:
            for index, old, new in zip(self._indexes, cur.ivals, entry.ivals, strict=True):
                if old != new:
                    for v in old:
                        if v not in new:
                            index.discard(v, key)
                    for v in new:
                        index.add(v, key)
        if self._budget is not None:
            self._hold(key, entry)
        if uid == _UID_NOT_KEPT:
            uid = _uid_in(entry.raw)
        if uid is not None and _uid_changed(uid, cur.raw):
            return _delta(ADDED, obj, cur.raw, entry.raw, key)
        return _delta(MODIFIED, obj, cur.raw, entry.raw, key)

    def _hold(self, key: str, entry: _Entry) -> None:
        """The budget's part of storing ``entry`` at ``key``: a body is admitted (and the key
        no longer stubbed), a metadata stub (``Prepared.stub``) is not (and a body held
        before it is forgotten)."""
        budget = self._budget
        assert budget is not None
        if isinstance(entry, Prepared) and entry.stub:
            budget.forget(self, key)
            self._stub(key)
            return
        self._unstub(key)
        budget.admit(self, key, len(entry.raw), enforce=not self._syncing)

    def _remove(self, key: str, entry: _Entry) -> None:
        del self._items[key]
        if self._budget is not None:
            self._budget.forget(self, key)
            self._unstub(key)
        if shrunk(self._items, self._items_peak):
            self._items = dict(self._items)
            self._items_peak = len(self._items)
        if self._ns_lazy is not None:
            namespace, slash, _ = key.partition("/")
            if slash:
                self._ns_lazy.discard(namespace, key)
        for index, values in zip(self._indexes, entry.ivals, strict=True):
            for v in values:
                index.discard(v, key)

    # ----------------------------------------------------------------- resourceVersion tracking

    @property
    def last_observed_resource_version(self) -> str | None:
        """The newest resourceVersion observed, or ``None`` before the first one."""
        return self._last_rv

    def _predates_observed(self, rv: str) -> bool:
        """Whether ``rv`` is provably older than the newest resourceVersion observed (``False``
        when either cannot be compared, or nothing was observed yet)."""
        last_key = self._last_key
        if last_key is None or not rv:
            return False
        key = sort_key(rv)
        return key is not None and key < last_key

    def has_observed(self, resource_version: str) -> bool:
        """Whether the store has observed ``resource_version`` or a newer one.

        Fails open: ``True`` when the versions are not comparable (logged once per store).
        ``False`` before anything was observed.
        """
        if not is_comparable(resource_version):
            self._warn_incomparable(resource_version)
            return True
        last = self._last_rv
        if last is None:
            return False
        c = compare_resource_versions(last, resource_version)
        if c is None:
            self._warn_incomparable(last)
            return True
        return c >= 0

    async def wait_for_resource_version(
        self,
        resource_version: str,
        timeout: float | None = None,
    ) -> bool:
        """Wait until :meth:`has_observed` is true for ``resource_version``.

        Returns ``True`` once observed (at once if already), ``False`` after ``timeout`` seconds
        (``None``: no limit). Waiters sit in a heap and are woken by the write that advances the
        observed version; nothing polls. A timed-out or cancelled waiter is forgotten.
        """
        if self.has_observed(resource_version):
            return True
        key = sort_key(resource_version)
        assert key is not None  # has_observed returned True for anything not comparable
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (key, next(self._seq), fut))
        try:
            async with asyncio.timeout(timeout):
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            if fut.cancelled():
                self._forget_waiter()

    @property
    def pending_waiters(self) -> int:
        """How many :meth:`wait_for_resource_version` calls are waiting (for metrics/tests)."""
        return len(self._waiters) - self._dead_waiters

    def _forget_waiter(self) -> None:
        # Lazy removal: cancelled entries stay in the heap until they outnumber live ones.
        self._dead_waiters += 1
        if self._dead_waiters * 2 > len(self._waiters):
            self._waiters = [w for w in self._waiters if not w[2].done()]
            heapq.heapify(self._waiters)
            self._dead_waiters = 0

    def _observe(self, rv: str) -> None:
        key = sort_key(rv)
        last_key = self._last_key
        if key is not None and last_key is not None:
            if key <= last_key:
                return
        elif self._last_rv is not None and rv != self._last_rv:
            self._warn_incomparable(rv if key is None else self._last_rv)
            # Never let an opaque version displace a comparable one; among opaque versions
            # arrival order is the only order there is.
            if last_key is not None:
                return
        self._advance(rv, key)

    def _advance(self, rv: str, key: tuple[int, str] | None) -> None:
        """Make ``rv`` (whose :func:`sort_key` is ``key``) the newest observed version, and
        wake the waiters it satisfies. The caller has checked that it is newer."""
        self._last_rv = rv
        self._last_key = key
        waiters = self._waiters
        while waiters and (key is None or waiters[0][0] <= key):
            fut = heapq.heappop(waiters)[2]
            if fut.done():
                self._dead_waiters = max(0, self._dead_waiters - 1)
            else:
                fut.set_result(None)

    def _warn_incomparable(self, rv: str) -> None:
        if not self._warned_incomparable:
            self._warned_incomparable = True
            logger.warning(
                "resourceVersion %r is not comparable (want [1-9][0-9]*); staleness checks on "
                "this store fail open from now on",
                rv,
            )
