"""Reading an implementation's Prometheus endpoint from outside: the restart scenario's "done".

Both this runtime and controller-runtime (Go) serve ``controller_runtime_reconcile_total``
(labels ``controller``, ``result``) and ``workqueue_depth`` (labels ``name``, ``controller``,
and ``priority`` in ours), so one parser of the text exposition format serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass

import aiohttp

_SAMPLE = re.compile(
    rb"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)",
    re.MULTILINE,
)
_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Progress:
    """What one scrape says about the controller ``controller``."""

    reconciles: float
    """``controller_runtime_reconcile_total{controller=...}`` summed over ``result``."""
    depth: float
    """``workqueue_depth`` of that controller's queue, summed over its series (priorities);
    0 when there is no series (ours exposes none for an empty queue, Go a 0)."""
    started: bool
    """Whether the controller's reconcile counters exist yet (both runtimes create them, at 0,
    when the controller is built)."""
    errors: float = 0.0
    """Of ``reconciles``, those counted with ``result="error"`` (reconcile correctness)."""
    fetches: float = 0.0
    """``cache_fetch_on_miss_total`` summed over kinds: cached reads answered by a live GET
    because a memory budget had evicted the body (ours only)."""

    def done(self, n: int) -> bool:
        """N reconciles counted and nothing left in the queue."""
        return self.started and self.reconciles >= n and self.depth == 0


def parse(text: bytes, controller: str) -> Progress:
    """Sum the two series of ``controller`` in a Prometheus text exposition. Series of other
    controllers are ignored; a sample whose value does not parse as a float raises
    ``ValueError`` (an exposition is never partial, so that is a broken endpoint)."""
    reconciles = 0.0
    errors = 0.0
    fetches = 0.0
    depth = 0.0
    seen_reconciles = False
    wanted = controller.encode()
    for match in _SAMPLE.finditer(text):
        name = match["name"]
        if name == b"cache_fetch_on_miss_total":
            fetches += float(match["value"])
            continue
        if name not in (b"controller_runtime_reconcile_total", b"workqueue_depth"):
            continue
        labels = dict(_LABEL.findall(match["labels"] or b""))
        value = float(match["value"])
        if name == b"workqueue_depth":
            if labels.get(b"name", labels.get(b"controller")) == wanted:
                depth += value
        elif labels.get(b"controller") == wanted:
            reconciles += value
            seen_reconciles = True
            if labels.get(b"result") == b"error":
                errors += value
    return Progress(reconciles, depth, seen_reconciles, errors, fetches)


async def scrape(session: aiohttp.ClientSession, url: str, controller: str) -> Progress | None:
    """One scrape of ``url``; ``None`` while the endpoint does not answer yet."""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as answer:
            if answer.status == 200:
                return parse(await answer.read(), controller)
    return None
