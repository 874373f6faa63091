"""Shard selectors for list and watch (KEP-5866, ``ShardedListAndWatch``), and the same filter
on the client.

A shard selector asks the API server for only the objects whose 64-bit FNV-1a hash of
``metadata.uid`` (or ``metadata.namespace``) falls into one or more half-open ranges
``[start, end)`` of ``[0, 2**64)``. On the wire it is the ``shardSelector`` query parameter::

    shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')
    || shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')

Wire rules, as a 1.36 API server checks them: bounds are ``0x``-prefixed 16-digit hex
(the end ``2**64`` is written ``0x10000000000000000``), ``start < end``, the field is one of
the two above. A server without the feature gate ignores the parameter and sends everything;
a cluster-scoped object has no namespace and hashes as the empty string.

Whether the server honoured a selector is judged per object, never from
``metadata.shardInfo`` alone (a 1.36 server echoes ``shardInfo`` for built-in kinds but not
for custom resources, which it filters all the same): :class:`ShardFilter` hashes every object
received and drops those outside the ranges. The first object dropped means the server ignored
the selector; that is logged once per filter and counted in
``informer_shard_client_filtered_total``. The cache is then correct either way; only the
bytes on the wire differ.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from informers.fastmetrics import Counter, Gauge
from informers.metrics import REGISTRY

__all__ = [
    "HASH_SPACE",
    "HashRange",
    "ShardField",
    "ShardFilter",
    "ShardSelector",
    "fnv1a64",
    "split_hash_space",
]

log = logging.getLogger(__name__)

HASH_SPACE: Final = 1 << 64
"""Size of the hash space: ranges live in ``[0, HASH_SPACE)``."""

_FNV_OFFSET: Final = 0xCBF29CE484222325
_FNV_PRIME: Final = 0x100000001B3
_MASK: Final = HASH_SPACE - 1

CLIENT_FILTERED = Counter(
    "informer_shard_client_filtered_total",
    "Objects dropped on the client because they lie outside the informer's shard selector "
    "(non-zero: the server ignored shardSelector; is ShardedListAndWatch on?).",
    ("resource",),
    registry=REGISTRY,
)
SERVER_FILTERING = Gauge(
    "informer_shard_server_filtering",
    "1 while every object received for a sharded informer was inside its ranges (the server "
    "filters), 0 once one was not (filtering on the client).",
    ("resource",),
    registry=REGISTRY,
)


def fnv1a64(data: bytes) -> int:
    """The 64-bit FNV-1a hash of ``data``, the API server's shard hash."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


class ShardField(enum.Enum):
    """What an object is hashed by. ``UID`` spreads objects evenly; ``NAMESPACE`` keeps a
    namespace's objects on one shard (cluster-scoped objects all hash as ``""``)."""

    UID = "object.metadata.uid"
    NAMESPACE = "object.metadata.namespace"

    def value_of(self, obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        key = "uid" if self is ShardField.UID else "namespace"
        return str(meta.get(key) or "")


def _hex(value: int) -> str:
    return f"0x{value:016x}"


@dataclass(frozen=True, order=True, slots=True)
class HashRange:
    """The half-open range ``[start, end)`` of hashes, ``0 <= start < end <= 2**64``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= HASH_SPACE:
            raise ValueError(
                f"a hash range needs 0 <= start < end <= 2**64, got [{self.start:#x}, "
                f"{self.end:#x})"
            )

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.start <= value < self.end

    @property
    def size(self) -> int:
        return self.end - self.start

    def term(self, field: ShardField) -> str:
        """The ``shardRange(...)`` term of the wire selector."""
        return f"shardRange({field.value}, '{_hex(self.start)}', '{_hex(self.end)}')"


def split_hash_space(parts: int) -> list[HashRange]:
    """``parts`` contiguous ranges of (nearly) equal size covering ``[0, 2**64)``."""
    if parts < 1:
        raise ValueError(f"need at least one part, got {parts}")
    bounds = [HASH_SPACE * i // parts for i in range(parts + 1)]
    return [HashRange(bounds[i], bounds[i + 1]) for i in range(parts)]


def _merge(ranges: Iterable[HashRange]) -> tuple[HashRange, ...]:
    merged: list[HashRange] = []
    for r in sorted(ranges):
        if merged and r.start <= merged[-1].end:
            last = merged.pop()
            merged.append(HashRange(last.start, max(last.end, r.end)))
        else:
            merged.append(r)
    return tuple(merged)


_TERM = re.compile(
    r"\s*shardRange\(\s*(object\.metadata\.(?:uid|namespace))\s*,\s*'(0x[0-9a-fA-F]+)'\s*,"
    r"\s*'(0x[0-9a-fA-F]+)'\s*\)\s*"
)


@dataclass(frozen=True, slots=True)
class ShardSelector:
    """Objects whose hash of ``field`` lies in any of ``ranges``.

    Ranges are normalised on construction (sorted, overlapping or touching ones merged), so
    two selectors for the same set of hashes compare equal and have one wire form.
    """

    field: ShardField
    ranges: tuple[HashRange, ...]

    def __init__(self, field: ShardField, ranges: Iterable[HashRange]) -> None:
        merged = _merge(ranges)
        if not merged:
            raise ValueError("a shard selector needs at least one range")
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "ranges", merged)

    @property
    def wire(self) -> str:
        """The ``shardSelector`` query parameter."""
        return " || ".join(r.term(self.field) for r in self.ranges)

    @classmethod
    def parse(cls, text: str) -> ShardSelector:
        """The selector of a wire form (terms joined with ``||``, one field for all)."""
        fields: set[ShardField] = set()
        ranges: list[HashRange] = []
        for term in text.split("||"):
            match = _TERM.fullmatch(term)
            if match is None:
                raise ValueError(
                    f"not a shardRange term: {term.strip()!r}; expected "
                    "shardRange(object.metadata.uid|namespace, '0x<16 hex>', '0x<16 hex>')"
                )
            fields.add(ShardField(match[1]))
            ranges.append(HashRange(int(match[2], 16), int(match[3], 16)))
        if len(fields) != 1:
            raise ValueError("a shard selector must hash one field in all its terms")
        return cls(fields.pop(), ranges)

    def hash_of(self, obj: Mapping[str, Any]) -> int:
        return fnv1a64(self.field.value_of(obj).encode())

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """True if ``obj`` hashes into one of the ranges."""
        h = self.hash_of(obj)
        return any(h in r for r in self.ranges)

    @property
    def fraction(self) -> float:
        """The share of the hash space selected (``0 < fraction <= 1``)."""
        return sum(r.size for r in self.ranges) / HASH_SPACE


class ShardFilter:
    """Checks every object an informer receives against its selector and drops strays.

    :meth:`accept` is called once per object (list items and watch events alike). While the
    server filters, it only hashes; the first stray switches :attr:`server_filtering` off for
    good, logs a warning naming the resource, and every stray is counted in
    ``informer_shard_client_filtered_total``.
    """

    def __init__(self, selector: ShardSelector, resource: str) -> None:
        self.selector = selector
        self.resource = resource
        self.server_filtering = True
        self.received = 0
        self.dropped = 0
        self._counter = CLIENT_FILTERED.labels(resource)
        self._gauge = SERVER_FILTERING.labels(resource)
        self._gauge.set(1)

    def accept(self, obj: Mapping[str, Any]) -> bool:
        """True if ``obj`` is in the shard; counts it in :attr:`received` either way."""
        self.received += 1
        if self.selector.matches(obj):
            return True
        self.dropped += 1
        self._counter.inc()
        if self.server_filtering:
            self.server_filtering = False
            self._gauge.set(0)
            log.warning(
                "%s: the API server ignored shardSelector (an object outside %s arrived); "
                "filtering on the client instead. Every object is still sent: enable the "
                "ShardedListAndWatch feature gate (Kubernetes >= 1.36) to save the bandwidth",
                self.resource,
                self.selector.wire,
            )
        return False
