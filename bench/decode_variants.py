"""What it costs to turn a watch line into what the store keeps, decoded whole or in part.

    python -m bench.decode_variants [--objects 100000] [--rounds 5] [--json FILE]

The input is the core scenario's (:mod:`bench.core`): the recorded Task event (1.4 kB with
managedFields) replayed N times with distinct names, UIDs and resourceVersions, already split
into lines. Each variant turns every line into what the store needs: the key, resourceVersion,
UID and owner UIDs, and the object's JSON bytes without ``metadata.managedFields``
(exact-size ``bytes``). The variants:

- ``orjson-loads``: ``orjson.loads`` of the line and nothing else (the core scenario's
  ``decode`` stage: the limit for Python).
- ``orjson-strip-dumps``: decode the line, pop managedFields, read the fields, re-encode the
  object (what the informer did before the partial decoder).
- ``msgspec-rejoin``: the top-level members and the metadata members as raw JSON slices
  (``dict[str, msgspec.Raw]``), the metadata re-joined without managedFields.
- ``msgspec-keep``: the event as ``{type, object: Raw}``, then the object's metadata as a typed
  struct; the bytes kept whole, managedFields included (a lower bound: no cut).
- ``msgspec-raw-cut``: the same, and managedFields cut out of the object's bytes.
- ``partial-unchecked``: one typed decode of the line (the event type and the metadata, with
  managedFields as a raw slice), the object's bytes sliced from the line and managedFields cut
  out, without the check that proves the cut right.
- ``partial``: :func:`informers._partial.decode_watch_line` as the informer runs it: the same,
  with that check (UTF-8, and the kept bytes decoded again as one object without
  managedFields).

Two more rows time the whole per-event write, in process, without the transport:
``store:orjson`` (decode, strip, :meth:`Store.apply`) and ``store:partial``
(:func:`decode_watch_line`, :meth:`Store.apply_raw`), each into a fresh store.

Every variant is first checked against ``orjson-strip-dumps`` on the first 1000 lines (same
fields; bytes that decode to the same object). The rounds alternate the variants; CPU seconds
per 100k events (``time.process_time``), median of the rounds, and the bytes kept per object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

from bench.core import _lines
from informers._partial import Metadata, cut_managed_fields, decode_watch_line
from informers.store import Store

Kept = tuple[str, str, str, tuple[str, ...], bytes]
"""key, resourceVersion, UID, owner UIDs, the object's bytes without managedFields."""


def _key(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def orjson_loads(line: bytes) -> Any:
    return orjson.loads(line)


def orjson_strip_dumps(line: bytes) -> Kept:
    obj = orjson.loads(line)["object"]
    meta = obj["metadata"]
    meta.pop("managedFields", None)
    refs = meta.get("ownerReferences")
    owners = tuple(r["uid"] for r in refs) if refs else ()
    raw = memoryview(orjson.dumps(obj)).tobytes()
    return (
        _key(meta.get("namespace"), meta["name"]),
        meta["resourceVersion"],
        meta["uid"],
        owners,
        raw,
    )


class _RawEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _MetaOnly(msgspec.Struct):
    metadata: Metadata


_decode_raw_event = msgspec.json.Decoder(_RawEvent).decode
_decode_meta_only = msgspec.json.Decoder(_MetaOnly).decode
_decode_members = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_decode_str = msgspec.json.Decoder(str).decode


def msgspec_rejoin(line: bytes) -> Kept:
    members = _decode_members(bytes(_decode_raw_event(line).object))
    meta = _decode_members(bytes(members["metadata"]))
    meta.pop("managedFields", None)
    members["metadata"] = msgspec.Raw(msgspec.json.encode(meta))
    raw = msgspec.json.encode(members)
    name = _decode_str(bytes(meta["name"]))
    namespace = _decode_str(bytes(meta["namespace"])) if "namespace" in meta else None
    rv = _decode_str(bytes(meta["resourceVersion"]))
    uid = _decode_str(bytes(meta["uid"]))
    owners: tuple[str, ...] = ()
    if "ownerReferences" in meta:
        refs = msgspec.json.decode(bytes(meta["ownerReferences"]))
        owners = tuple(r["uid"] for r in refs)
    return _key(namespace, name), rv, uid, owners, raw


def _owners(meta: Metadata) -> tuple[str, ...]:
    refs = meta.ownerReferences
    return tuple(r.uid for r in refs if r.uid) if refs else ()


def msgspec_keep(line: bytes) -> Kept:
    raw = bytes(_decode_raw_event(line).object)
    meta = _decode_meta_only(raw).metadata
    return _key(meta.namespace, meta.name), meta.resourceVersion, meta.uid, _owners(meta), raw


def msgspec_raw_cut(line: bytes) -> Kept:
    raw = bytes(_decode_raw_event(line).object)
    meta = _decode_meta_only(raw).metadata
    if len(meta.managedFields):
        cut = cut_managed_fields(raw, 0, len(raw), meta.managedFields)
        assert cut is not None
        raw = cut
    return _key(meta.namespace, meta.name), meta.resourceVersion, meta.uid, _owners(meta), raw


class _Object(msgspec.Struct):
    metadata: Metadata


class _Event(msgspec.Struct):
    type: str
    object: _Object


_decode_event = msgspec.json.Decoder(_Event).decode


def partial_unchecked(line: bytes) -> Kept:
    meta = _decode_event(line).object.metadata
    start = line.index(b'"object":') + 9
    raw = cut_managed_fields(line, start, len(line) - 1, meta.managedFields)
    assert raw is not None
    return _key(meta.namespace, meta.name), meta.resourceVersion, meta.uid, _owners(meta), raw


def partial(line: bytes) -> Kept:
    decoded = decode_watch_line(line)
    assert decoded is not None
    _, meta, raw = decoded
    return _key(meta.namespace, meta.name), meta.resourceVersion, meta.uid, _owners(meta), raw


VARIANTS: dict[str, Callable[[bytes], Any]] = {
    "orjson-loads": orjson_loads,
    "orjson-strip-dumps": orjson_strip_dumps,
    "msgspec-rejoin": msgspec_rejoin,
    "msgspec-keep": msgspec_keep,
    "msgspec-raw-cut": msgspec_raw_cut,
    "partial-unchecked": partial_unchecked,
    "partial": partial,
}


def store_orjson(lines: Sequence[bytes]) -> Store:
    store = Store()
    for line in lines:
        event = orjson.loads(line)
        obj = event["object"]
        obj["metadata"].pop("managedFields", None)
        store.apply(event["type"], obj)
    return store


def store_partial(lines: Sequence[bytes]) -> Store:
    store = Store()
    for line in lines:
        decoded = decode_watch_line(line)
        assert decoded is not None
        store.apply_raw(*decoded)
    return store


STORE_VARIANTS: dict[str, Callable[[Sequence[bytes]], Store]] = {
    "store:orjson": store_orjson,
    "store:partial": store_partial,
}


def check(lines: Sequence[bytes]) -> None:
    """Every variant keeps what ``orjson-strip-dumps`` keeps (the bytes may differ, their
    decoding may not)."""
    for line in lines[:1000]:
        want = orjson_strip_dumps(line)
        for name, variant in VARIANTS.items():
            if name in ("orjson-loads", "orjson-strip-dumps"):
                continue
            got = variant(line)
            keep_managed = name == "msgspec-keep"
            if got[:4] != want[:4] or (
                not keep_managed and orjson.loads(got[4]) != orjson.loads(want[4])
            ):
                raise AssertionError(f"{name} differs from orjson-strip-dumps on {line[:80]!r}")
    expected = store_orjson(lines[:1000])
    for name, fill in STORE_VARIANTS.items():
        got_store = fill(lines[:1000])
        got_keys, expected_keys = got_store.keys(), expected.keys()  # a Store is not iterable
        if {k: got_store.get(k) for k in got_keys} != {k: expected.get(k) for k in expected_keys}:
            raise AssertionError(f"{name} holds other objects than store:orjson")


def measure(n: int, rounds: int) -> list[dict[str, Any]]:
    lines = list(_lines(n))
    check(lines)
    cpu: dict[str, list[float]] = {name: [] for name in [*VARIANTS, *STORE_VARIANTS]}
    kept: dict[str, float] = {}
    for round_ in range(rounds):
        names = list(cpu)
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            if name in STORE_VARIANTS:
                started = time.process_time()
                store = STORE_VARIANTS[name](lines)
                cpu[name].append(time.process_time() - started)
                keys = store.keys()  # a Store is not iterable
                kept[name] = sum(len(store.get_raw(k) or b"") for k in keys) / n
                del store
                continue
            variant = VARIANTS[name]
            started = time.process_time()
            for line in lines:
                variant(line)
            cpu[name].append(time.process_time() - started)
    for name, variant in VARIANTS.items():
        if name != "orjson-loads":
            kept[name] = sum(len(variant(line)[4]) for line in lines[:1000]) / 1000
    per_100k = 100_000 / n
    return [
        {
            "variant": name,
            "objects": n,
            "cpu_seconds_per_100k": statistics.median(runs) * per_100k,
            "cpu_seconds_runs": runs,
            "kept_bytes_per_object": kept.get(name),
        }
        for name, runs in cpu.items()
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_variants", description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = measure(args.objects, args.rounds)
    limit = next(r for r in results if r["variant"] == "orjson-loads")["cpu_seconds_per_100k"]
    print(f"{'variant':20} {'CPU s/100k':>10} {'x limit':>8} {'kept B':>7}  runs")
    for r in results:
        kept = r["kept_bytes_per_object"]
        print(
            f"{r['variant']:20} {r['cpu_seconds_per_100k']:10.3f} "
            f"{r['cpu_seconds_per_100k'] / limit:8.2f} "
            f"{'' if kept is None else f'{kept:.0f}':>7}  "
            + ", ".join(f"{v:.3f}" for v in r["cpu_seconds_runs"]),
            file=sys.stdout,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
