"""What a typed resource costs against a dict: decode time and memory per object.

    python -m bench.typed_decode [--objects 100000] [--json FILE]

The input is the core benchmark's recorded Task (``bench/data/task-watch-event.json``), as
the cache stores it (managedFields stripped), replicated with distinct names, UIDs and
resourceVersions. Each variant runs in a fresh interpreter, so its RSS figures are its own:

- ``dict``: ``orjson.loads``, what the cache returns today;
- ``msgspec``: the :mod:`controller_runtime.resource` class (``Task.from_json``: the struct,
  plus the encoded source kept for unknown fields);
- ``dataclass``: the same shape as ``slots=True`` dataclasses, decoded by msgspec (the fastest
  way to fill dataclasses; ``dacite`` and friends are slower);
- ``pydantic``: the same shape as pydantic v2 models (``extra="allow"``, which is how pydantic
  would keep unknown fields), ``model_validate_json``.

Reported per variant: decode time per object (the median of 5 passes over every object),
RSS growth per object while all are held, and a cache-read loop: ``N`` reads of an
object from a real :class:`~informers.store.Store` (what a reconcile's ``client.get`` does).
``pydantic`` is part of the ``bench`` group; without it that variant is left out and said so.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import orjson

from controllers.api import Task
from informers.reflector import strip_managed_fields
from informers.store import Store

TEMPLATE = Path(__file__).with_name("data") / "task-watch-event.json"
VARIANTS = ("dict", "msgspec", "dataclass", "pydantic")


def rss_bytes() -> int:
    """This process's resident set size (as the core benchmark measures it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def objects(n: int) -> list[bytes]:
    """N encoded Tasks as the cache holds them."""
    obj = orjson.loads(TEMPLATE.read_bytes())["object"]
    strip_managed_fields(obj)
    out = []
    for i in range(n):
        meta = obj["metadata"]
        meta["name"] = f"task-{i:07d}"
        meta["namespace"] = f"team-{i % 50:02d}"
        meta["uid"] = f"00000000-0000-4000-8000-{i:012d}"
        meta["resourceVersion"] = str(1000 + i)
        out.append(orjson.dumps(obj))
    return out


# -- the same shape as dataclasses (decoded by msgspec) -------------------------------------


@dataclasses.dataclass(slots=True)
class DCondition:
    type: str
    status: str
    lastTransitionTime: datetime  # noqa: N815 (wire names: no rename support here)
    observedGeneration: int | None = None  # noqa: N815
    reason: str = ""
    message: str = ""


@dataclasses.dataclass(slots=True)
class DSpec:
    priority: int
    details: str | None = None
    deadline: datetime | None = None
    taskState: str = "Pending"  # noqa: N815


@dataclasses.dataclass(slots=True)
class DStatus:
    state: str | None = None
    observedGeneration: int | None = None  # noqa: N815
    conditions: list[DCondition] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class DMeta:
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # noqa: N815
    generation: int = 0
    creationTimestamp: datetime | None = None  # noqa: N815
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class DTask:
    spec: DSpec
    apiVersion: str = ""  # noqa: N815
    kind: str = ""
    metadata: DMeta = dataclasses.field(default_factory=DMeta)
    status: DStatus = dataclasses.field(default_factory=DStatus)


def _pydantic_decoder() -> Callable[[bytes], Any] | None:
    try:
        import pydantic  # noqa: PLC0415 (optional: the bench group)
    except ImportError:
        return None

    allow = pydantic.ConfigDict(extra="allow", populate_by_name=True)

    class PCondition(pydantic.BaseModel):
        model_config = allow
        type: str
        status: str
        lastTransitionTime: datetime  # noqa: N815
        observedGeneration: int | None = None  # noqa: N815
        reason: str = ""
        message: str = ""

    class PSpec(pydantic.BaseModel):
        model_config = allow
        priority: int
        details: str | None = None
        deadline: datetime | None = None
        taskState: str = "Pending"  # noqa: N815

    class PStatus(pydantic.BaseModel):
        model_config = allow
        state: str | None = None
        observedGeneration: int | None = None  # noqa: N815
        conditions: list[PCondition] = []

    class PMeta(pydantic.BaseModel):
        model_config = allow
        name: str = ""
        namespace: str = ""
        uid: str = ""
        resourceVersion: str = ""  # noqa: N815
        generation: int = 0
        creationTimestamp: datetime | None = None  # noqa: N815
        labels: dict[str, str] = {}

    class PTask(pydantic.BaseModel):
        model_config = allow
        spec: PSpec
        metadata: PMeta = PMeta()
        status: PStatus = PStatus()

    return PTask.model_validate_json


def decoder(variant: str) -> Callable[[bytes], Any] | None:
    if variant == "dict":
        return orjson.loads
    if variant == "msgspec":
        return Task.from_json
    if variant == "dataclass":
        return msgspec.json.Decoder(DTask).decode
    if variant == "pydantic":
        return _pydantic_decoder()
    raise ValueError(variant)


def run_variant(variant: str, n: int) -> dict[str, Any]:
    """One variant, measured in this process (a fresh one: see :func:`main`)."""
    decode = decoder(variant)
    if decode is None:
        return {"variant": variant, "skipped": "pydantic is not installed (the bench group)"}
    raws = objects(n)
    for raw in raws[:1000]:
        decode(raw)  # warm up caches, type info, code paths
    passes = []
    for _ in range(5):
        started = time.perf_counter()
        for raw in raws:
            decode(raw)
        passes.append(time.perf_counter() - started)
    gc.collect()
    before = rss_bytes()
    held = [decode(raw) for raw in raws]
    gc.collect()
    grown = rss_bytes() - before
    del held
    gc.collect()
    store = Store()
    for raw in raws:
        store.apply("ADDED", orjson.loads(raw))
    keys = store.keys()

    def typed_read(key: str) -> Any:
        raw = store.get_raw(key)
        assert raw is not None
        return decode(raw)

    # The dict read is what the cache does today; the others decode the same stored bytes.
    reader: Callable[[str], Any] = store.get if variant == "dict" else typed_read
    started = time.perf_counter()
    for key in keys:
        reader(key)
    read = time.perf_counter() - started
    return {
        "variant": variant,
        "objects": n,
        "json_bytes": sum(len(r) for r in raws) // n,
        "decode_us": statistics.median(passes) / n * 1e6,
        "rss_per_object": grown / n,
        "cache_read_us": read / len(keys) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.typed_decode")
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of every variant, interleaved (median)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_variant(args.child, args.objects)))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):  # interleaved, so that a loaded moment hits every variant
        for variant in VARIANTS:
            command = [sys.executable, "-m", "bench.typed_decode", "--child", variant]
            command += ["--objects", str(args.objects)]
            child = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[variant].append(json.loads(child.stdout.splitlines()[-1]))
    results = []
    for variant in VARIANTS:
        result = dict(runs[variant][0])
        if "skipped" not in result:
            for metric in ("decode_us", "rss_per_object", "cache_read_us"):
                result[metric] = statistics.median(r[metric] for r in runs[variant])
            result["rounds"] = len(runs[variant])
        results.append(result)
        if "skipped" in result:
            print(f"  {variant:10} skipped: {result['skipped']}")
            continue
        print(
            f"  {variant:10} decode {result['decode_us']:6.2f} us/object   "
            f"RSS {result['rss_per_object'] / 1024:5.2f} KiB/object   "
            f"cache read {result['cache_read_us']:6.2f} us   "
            f"({result['json_bytes']} B of JSON, {result['objects']} objects)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
