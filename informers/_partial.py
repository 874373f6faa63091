"""Decode only what the store needs from a watch line, and cut managedFields out of its bytes.

The store keeps, per object, its JSON bytes (without ``metadata.managedFields`` under the
default transform) plus a few metadata fields: the key, the resourceVersion, the UID, and the
values of its built-in indexes (owner UIDs, labels). :func:`decode_watch_line` gets exactly that
from one line of a watch, ``{"type":"ADDED","object":{...}}``, without building the object:

1. msgspec decodes the line into a typed struct of the event type and those metadata fields,
   managedFields as a raw slice; everything else is skipped in C (validated, not built).
2. The object's bytes are the line between ``{"type":"T","object":`` and the final ``}``;
   managedFields (the member ``"managedFields":[...]``, with the comma that joins it to its
   neighbours) is cut out of them where the first literal ``"managedFields"`` key stands,
   provided its value there is byte for byte the one decoded.
3. The line is checked to be valid UTF-8, and the bytes kept are decoded again (skipping
   everything, ~0.5 us) as one JSON object whose ``metadata`` has no managedFields.

**Guarantee:** when it returns bytes, :func:`orjson.loads` of them equals the line's object
with ``metadata.managedFields`` removed (nothing else changed, key order kept), and the
metadata it returns is that object's. Step 3 is what makes this hold for any input, not only
for what an API server sends: a second ``"managedFields"`` elsewhere, an escaped key
(``"managed\\u0046ields"``), duplicate keys, keys after ``object``: whatever the cut removed, the
bytes kept either decode to one object whose metadata lost exactly its managedFields, or the
line is refused.

**Refused** (``None``: the caller takes the full path, orjson, with the behaviour it always had):
any event type but ``ADDED``/``MODIFIED``/``DELETED``, a line that does not start exactly
``{"type":"<T>","object":`` or end in ``}`` (whitespace between tokens: a Kubernetes API server
writes none), JSON that msgspec rejects, metadata whose fields have other types than the
store accepts (name, namespace, resourceVersion, uid strings; ownerReferences objects with a
string uid), an empty name or resourceVersion, invalid UTF-8,
and any line where the cut cannot be proven right.

**Caveat (where the two decoders differ):** a skipping parser checks the syntax of numbers but
not their range, so an object holding a number beyond the double range (``1e400``; orjson
refuses it) is taken here, and decoding it later raises (``orjson.JSONDecodeError``). No
Kubernetes API server can serve such an object: its own JSON decoder refuses them on write.
"""

from __future__ import annotations

import sys
from typing import Final, Literal

import msgspec
import orjson

__all__ = [
    "Metadata",
    "OwnerReference",
    "cut_managed_fields",
    "decode_watch_line",
    "label_values",
    "owner_uids",
]


class OwnerReference(msgspec.Struct, gc=False):
    """The one field of an owner reference the store indexes."""

    uid: str | None = None


class Metadata(msgspec.Struct, gc=False):
    """The metadata fields the store needs (the rest is skipped while decoding)."""

    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""  # noqa: N815 (the wire name)
    uid: str = ""
    # Kept raw: only a label index reads them (decoded then, as the dict path does).
    labels: msgspec.Raw = msgspec.Raw()
    ownerReferences: list[OwnerReference] | None = None  # noqa: N815
    # Absent: the empty Raw. A present value (even null) is cut, as the dict transform pops it.
    managedFields: msgspec.Raw = msgspec.Raw()  # noqa: N815


class _Object(msgspec.Struct, gc=False):
    metadata: Metadata


class _Event(msgspec.Struct, gc=False):
    type: str
    object: _Object


class _CheckedMetadata(msgspec.Struct, gc=False):
    managedFields: msgspec.Raw = msgspec.Raw()  # noqa: N815


class _Checked(msgspec.Struct, gc=False):
    metadata: _CheckedMetadata


_decode_event = msgspec.json.Decoder(_Event).decode
_decode_checked = msgspec.json.Decoder(_Checked).decode

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_TYPES: Final[tuple[EventType, ...]] = ("ADDED", "MODIFIED", "DELETED")
# The event type and the exact start of its line, by type.
_PREFIXES: Final[dict[str, tuple[EventType, bytes]]] = {
    t: (t, b'{"type":"' + t.encode() + b'","object":') for t in _TYPES
}
_KEY: Final = b'"managedFields"'
_WHITESPACE: Final = frozenset(b" \t\r\n")
_COLON: Final = ord(":")
_COMMA: Final = ord(",")
_CLOSE: Final = ord("}")


# One return per way a line is refused, each said in the module docs.
def decode_watch_line(  # noqa: PLR0911
    line: bytes, cut: bool = True
) -> tuple[EventType, Metadata, bytes] | None:
    """``(event type, metadata, object bytes)`` of one watch line, or ``None`` (module docs).

    ``cut``: remove ``metadata.managedFields`` from the bytes (the default transform's work);
    ``False`` keeps the object's bytes whole.
    """
    try:
        event = _decode_event(line)
    except Exception:  # msgspec's errors, RecursionError: the full path decides
        return None
    known = _PREFIXES.get(event.type)
    if known is None:
        return None
    event_type, prefix = known
    if not line.startswith(prefix) or line[-1] != _CLOSE:
        return None
    meta = event.object.metadata
    if not meta.name or not meta.resourceVersion:
        return None
    start, stop = len(prefix), len(line) - 1
    managed = meta.managedFields
    if cut and len(managed):
        raw = cut_managed_fields(line, start, stop, managed)
        if raw is None:
            return None
    else:
        raw = line[start:stop]
    if not line.isascii():  # the whole line, as orjson checks it (the cut part included)
        try:
            line.decode()
        except UnicodeDecodeError:
            return None
    try:
        checked = _decode_checked(raw)
    except Exception:  # not exactly one JSON object (keys after "object", ...)
        return None
    if cut and len(checked.metadata.managedFields):
        return None  # the cut did not remove the metadata's own managedFields
    return event_type, meta, raw


def cut_managed_fields(data: bytes, start: int, stop: int, value: msgspec.Raw) -> bytes | None:
    """``data[start:stop]`` without the member ``"managedFields":<value>`` at the first
    literal ``"managedFields"`` key in that span, and the comma that joined it to a neighbour;
    ``None`` when that key is not followed by exactly ``value``. Whitespace around the colon
    and the commas is allowed. The caller proves that the member cut is the right one (see
    :func:`decode_watch_line`)."""
    k = data.find(_KEY, start, stop)
    if k < 0:
        return None
    # Compact JSON (what an API server writes) in one step: "managedFields":<value>, after a
    # comma (a member before it) or before one (the first member).
    v = k + len(_KEY) + 1
    if data[v - 1] == _COLON and data.startswith(memoryview(value), v):
        end = v + len(value)
        if data[k - 1] == _COMMA and end <= stop:
            return data[start : k - 1] + data[end:stop]
        if end < stop and data[end] == _COMMA:
            return data[start:k] + data[end + 1 : stop]
    return _cut_spaced(data, start, stop, value, k)


def _cut_spaced(data: bytes, start: int, stop: int, value: msgspec.Raw, k: int) -> bytes | None:
    """:func:`cut_managed_fields` for the key at ``k``, whitespace anywhere."""
    v = k + len(_KEY)
    while v < stop and data[v] in _WHITESPACE:
        v += 1
    if v >= stop or data[v] != _COLON:
        return None
    v += 1
    while v < stop and data[v] in _WHITESPACE:
        v += 1
    if not data.startswith(memoryview(value), v):
        return None
    end = v + len(value)
    if end > stop:
        return None
    before = k - 1
    while before > start and data[before] in _WHITESPACE:
        before -= 1
    if data[before] == _COMMA:  # a member before it: cut from that comma
        return data[start:before] + data[end:stop]
    after = end
    while after < stop and data[after] in _WHITESPACE:
        after += 1
    if after < stop and data[after] == _COMMA:  # the first member: cut up to the next comma
        return data[start:k] + data[after + 1 : stop]
    return data[start:k] + data[end:stop]  # the only member


def owner_uids(meta: Metadata) -> tuple[str, ...]:
    """The owner UIDs the store's ``owner_uid`` index files ``meta`` under (interned)."""
    refs = meta.ownerReferences
    if not refs:
        return ()
    return tuple(sys.intern(ref.uid) for ref in refs if ref.uid)


def label_values(meta: Metadata) -> tuple[str, ...]:
    """The ``k=v`` values the store's ``label`` index files ``meta`` under (interned), exactly
    as the store's index of decoded objects computes them (orjson, any value type)."""
    if not len(meta.labels):
        return ()
    labels = orjson.loads(memoryview(meta.labels))
    if not labels:
        return ()
    return tuple(sys.intern(f"{k}={v}") for k, v in labels.items())
