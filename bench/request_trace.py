"""Client-side request timings of a benchmark process, for comparing two implementations.

Set ``BENCH_REQUEST_TRACE=DIR`` (an existing directory) in the environment of ``python -m
bench`` (its children inherit it) and ``bench.runners.ours`` and ``bench.runners.limit`` call
:func:`install_from_env` before they open any session: every ``aiohttp.ClientSession`` made
afterwards in the process gets a trace that records, per request, its start and end
(``time.monotonic()``), method, path, a path class, status, request and response body sizes, and
whether it opened a new TCP connection. The records are written to
``DIR/<runner>-<pid>.jsonl`` as JSON lines when the process exits (normally, or on SIGTERM
through the runner's own shutdown); ``python -m bench.request_trace FILE...`` summarises them
(requests by kind, latency percentiles, requests in flight over time, connections opened).

Watch streams are recorded only as their start (their end is the stream's end). The trace costs a
few microseconds per request; it is a diagnostic, off unless the variable is set.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

ENV = "BENCH_REQUEST_TRACE"

_records: list[dict[str, Any]] = []


def _kind(method: str, path: str, query: str) -> str:
    if "watch=" in query:
        return "WATCH"
    if path.endswith("/status"):
        return f"{method} status"
    return method


def install(path: Path, *, stream: bool = False) -> None:
    """Trace every aiohttp session created from now on; dump the records to ``path`` at exit,
    or with ``stream`` write each one as its request ends (a process that is killed keeps its
    trace)."""
    import aiohttp  # noqa: PLC0415

    streamed = path.open("ab", buffering=0) if stream else None

    def keep(record: dict[str, Any]) -> None:
        if streamed is not None:
            streamed.write(orjson.dumps(record) + b"\n")
        else:
            _records.append(record)

    trace = aiohttp.TraceConfig()

    async def on_start(
        _session: Any, ctx: SimpleNamespace, params: aiohttp.TraceRequestStartParams
    ) -> None:
        ctx.record = {
            "start": time.monotonic(),
            "method": params.method,
            "path": params.url.path,
            "kind": _kind(params.method, params.url.path, params.url.query_string),
            "new_connection": False,
            "sent": 0,
        }

    async def on_chunk_sent(
        _session: Any, ctx: SimpleNamespace, params: aiohttp.TraceRequestChunkSentParams
    ) -> None:
        if hasattr(ctx, "record"):
            ctx.record["sent"] += len(params.chunk)

    async def on_connection(_session: Any, ctx: SimpleNamespace, _params: Any) -> None:
        if hasattr(ctx, "record"):
            ctx.record["new_connection"] = True

    async def on_headers(
        _session: Any, ctx: SimpleNamespace, params: aiohttp.TraceRequestHeadersSentParams
    ) -> None:
        if hasattr(ctx, "record"):
            ctx.record["headers_sent"] = time.monotonic()

    async def on_end(
        _session: Any, ctx: SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        record = ctx.record
        record["status"] = params.response.status
        record["answered"] = time.monotonic()
        length = params.response.content_length
        record["received"] = length if length is not None else -1
        if record["kind"] == "WATCH":
            record["end"] = record["answered"]
        keep(record)

    trace.on_request_start.append(on_start)
    trace.on_request_chunk_sent.append(on_chunk_sent)
    trace.on_connection_create_end.append(on_connection)
    trace.on_request_headers_sent.append(on_headers)
    trace.on_request_end.append(on_end)

    original = aiohttp.ClientSession.__init__

    def traced_init(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or []), trace]
        original(self, *args, **kwargs)

    aiohttp.ClientSession.__init__ = traced_init  # type: ignore[method-assign]
    if streamed is None:
        atexit.register(_dump, path)


def _dump(path: Path) -> None:
    with path.open("wb") as out:
        for record in _records:
            out.write(orjson.dumps(record) + b"\n")


def install_from_env(runner: str) -> None:
    """:func:`install` into ``$BENCH_REQUEST_TRACE/<runner>-<pid>.jsonl`` when the variable
    is set, else nothing."""
    target = os.environ.get(ENV)
    if target:
        install(Path(target) / f"{runner}-{os.getpid()}.jsonl")


# ---------------------------------------------------------------------------- the summary


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True)
class InFlight:
    """Requests in flight over ``window`` (first start to last answer): the time-weighted
    ``mean``, and ``histogram``: microseconds spent at each count."""

    window: float
    mean: float
    histogram: Counter[int]


def in_flight(records: Sequence[dict[str, Any]]) -> InFlight:
    """Requests in flight between the first ``start`` and the last ``answered`` of
    ``records`` (a sweep over their start and end times)."""
    first = min(r["start"] for r in records)
    last = max(r["answered"] for r in records)
    events = sorted([(r["start"], 1) for r in records] + [(r["answered"], -1) for r in records])
    count = 0
    weighted = 0.0
    histogram: Counter[int] = Counter()
    previous = first
    for at, step in events:
        histogram[count] += round((at - previous) * 1e6)
        weighted += count * (at - previous)
        count += step
        previous = at
    window = last - first
    return InFlight(window, weighted / window if window > 0 else 0.0, histogram)


def summarise(path: Path) -> str:
    """A text summary of one trace file."""
    records = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    kinds = Counter(r["kind"] for r in records)
    statuses = Counter((r["kind"], r["status"]) for r in records)
    lines = [f"{path.name}: {len(records)} requests"]
    lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    lines.append(
        "  by status: " + ", ".join(f"{k}={s} {n}" for (k, s), n in statuses.most_common())
    )
    lines.append(f"  new connections: {sum(r['new_connection'] for r in records)}")
    writes = [r for r in records if r["kind"] == "PATCH status"]
    if not writes:
        return "\n".join(lines)
    latency = [(r["answered"] - r["start"]) * 1000 for r in writes]
    lines.append(
        "  PATCH status ms: "
        + ", ".join(f"p{q} {_percentile(latency, q):.1f}" for q in (10, 50, 90, 99))
        + f", mean {sum(latency) / len(latency):.1f}"
    )
    sent = [r["sent"] for r in writes]
    received = [r["received"] for r in writes]
    lines.append(
        f"  PATCH status bytes: sent mean {sum(sent) / len(sent):.0f}, "
        f"received mean {sum(received) / len(received):.0f}"
    )
    stats = in_flight(writes)
    lines.append(
        f"  writes {len(writes)} in {stats.window:.2f}s from the first PATCH sent to the last "
        f"answered: {len(writes) / stats.window:.0f}/s"
    )
    lines.append(f"  PATCHes in flight, time-weighted mean: {stats.mean:.1f}")
    histogram = stats.histogram
    total = sum(histogram.values()) or 1
    buckets = [(0, 0), (1, 8), (9, 16), (17, 31), (32, 32), (33, 63), (64, 10**9)]
    parts = []
    for low, high in buckets:
        share = sum(v for k, v in histogram.items() if low <= k <= high) / total
        if share >= 0.005:
            parts.append(f"{low}-{high if high < 10**9 else 'up'}: {share:.0%}")
    lines.append("  time share by in-flight count: " + ", ".join(parts))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_trace", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.files:
        print(summarise(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
