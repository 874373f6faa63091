"""Small helpers for integration tests: await a condition through a real watch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from informers._framing import LineFramer
from informers.transport import Transport

Event = Mapping[str, Any]


async def watch_until(
    transport: Transport,
    path: str,
    condition: Callable[[Event], bool],
    *,
    params: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> Event:
    """Watch ``path`` (from the current state) until an event satisfies ``condition``."""

    async def run() -> Event:
        query = {"watch": "1", **(params or {})}
        async with transport.stream(path, query) as response:
            framer = LineFramer()
            async for chunk in response.content.iter_any():
                for line in framer.feed(chunk):
                    event = orjson.loads(line)
                    if condition(event):
                        return event  # type: ignore[no-any-return]
        raise AssertionError(f"the watch on {path} ended before the condition held")

    return await asyncio.wait_for(run(), timeout)


def condition_true(obj: Mapping[str, Any], condition_type: str) -> bool:
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c.get("type") == condition_type and c.get("status") == "True" for c in conditions)
