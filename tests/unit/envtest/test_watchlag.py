"""The watch-scheduling transport's re-timing core, without a network: events of one stream
stay in order, none is lost or invented, each waits at least its lag, a cut ends the stream
at once and an expiry sends a 410 first."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import cast

import aiohttp
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_runtime.envtest.watchlag import (
    LagStats,
    _LaggedContent,
    _Plan,
    resource_of,
)


class FakeSource:
    """A watch body arriving in the given chunks, then the end."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        return self.chunks.pop(0) if self.chunks else b""


def _event(kind: str, rv: int) -> bytes:
    obj = {"metadata": {"name": f"o{rv}", "resourceVersion": str(rv)}}
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


async def _drain(content: _LaggedContent) -> list[bytes]:
    out = []
    while chunk := await content.readany():
        out.append(chunk)
    await content.close()
    return out


def test_resource_of_is_the_last_path_segment() -> None:
    assert resource_of("/apis/tasks.crpy.io/v1/namespaces/a/tasks") == "tasks"
    assert resource_of("/api/v1/secrets/") == "secrets"


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
    lag=st.sampled_from([0.0, 0.01, 0.03]),
    delete_lag=st.sampled_from([0.0, 0.02]),
)
def test_events_arrive_in_order_complete_and_not_early(
    kinds: list[str], cuts: list[int], lag: float, delete_lag: float
) -> None:
    lines = [_event(kind, rv) for rv, kind in enumerate(kinds, 1)]

    async def run() -> tuple[list[bytes], float, _Plan, LagStats]:
        plan, stats = _Plan(lag=lag, delete_lag=delete_lag), LagStats()
        source = cast(aiohttp.StreamReader, FakeSource(_split(b"".join(lines), cuts)))
        started = time.monotonic()
        content = _LaggedContent(source, plan, "things", stats)
        out = await _drain(content)
        return out, time.monotonic() - started, plan, stats

    out, took, plan, stats = asyncio.run(run())
    assert out == lines
    assert list(plan.history) == [str(rv) for rv in range(1, len(lines) + 1)]
    assert stats.delivered["things"] == len(lines)
    slowest = lag + (delete_lag if "DELETED" in kinds else 0.0)
    assert took >= slowest * 0.9


def test_a_cut_ends_the_stream_before_held_events_and_an_expiry_sends_410() -> None:
    async def run() -> tuple[bytes, bytes, bytes]:
        body = _event("ADDED", 1) + _event("ADDED", 2)
        plan = _Plan(lag=30.0)  # held back far longer than the test runs
        content = _LaggedContent(
            cast(aiohttp.StreamReader, FakeSource([body])), plan, "things", LagStats()
        )
        await asyncio.sleep(0.01)
        content.expire()
        first = await content.readany()
        content.cut()
        second = await content.readany()
        await content.close()
        return first, second, body

    first, second, _ = asyncio.run(run())
    error = orjson.loads(first)
    assert error["type"] == "ERROR" and error["object"]["code"] == 410
    assert second == b""
