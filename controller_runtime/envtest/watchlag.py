"""A transport that controls what informers see and when: the stale-cache fuzzer's lever.

:class:`WatchScheduleTransport` is a :class:`~kubeclient.transport.Transport` for informers
(give it to an :class:`~informers.shared.InformerFactory`, or set it as a manager's
``factory.transport`` before any controller is set up). Lists pass through untouched; every
watch stream is re-timed per resource (the last path segment: ``tasks``, ``secrets``, ...):

* :meth:`set_lag` delays every event of a resource by a number of seconds, and
  :meth:`set_delete_lag` adds more to its ``DELETED`` events. Events of one resource stay in
  the order the server sent them (a late event holds back the ones after it, as a slow
  connection would); events of different resources are delivered independently, so two kinds
  with different lags are reordered relative to each other.
* :meth:`cut` ends the resource's open watches cleanly, losing the events still held back:
  the reflector re-watches from the last resourceVersion it was given, as after a dropped
  connection.
* :meth:`expire` sends an ``ERROR`` event with code 410 (what the server sends when the
  resourceVersion was compacted) on the open watches: the reflector relists.
* :meth:`replay_older` makes the next reconnect of the resource's watch ask the server for an
  older resourceVersion than the reflector asked for (one it was given earlier), so events it
  already applied arrive again, older versions after newer ones: what a watch served by a
  lagging API server replica may do.

Why here, and not in a proxy or the store: the whole informer stack under test (framing,
reflector state machine, store, fan-out, the guard's view of observed resourceVersions) runs
unchanged on real server streams, and the lever sees decoded events (kinds, types,
resourceVersions) without re-encoding TLS. A byte-level proxy (the FaultProxy) cannot tell a
Secret from a Task; a wrapped store would skip the reflector's own handling of cuts and 410s.

Caveats: the re-timing adds no bytes, so a lag longer than the reflector's idle timeout (the
longest server watch timeout plus a margin: minutes) would look like a half-open connection.
Watches that start with a streaming list (``sendInitialEvents``) are lagged like any other,
but never replayed older.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import orjson

from informers._framing import LineFramer
from kubeclient.transport import Transport

__all__ = ["LagStats", "WatchScheduleTransport", "resource_of"]

EXPIRED_EVENT = orjson.dumps(
    {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
            "message": "too old resource version (injected by the watch schedule)",
        },
    }
)
HISTORY = 64
"""Delivered resourceVersions remembered per resource, for :meth:`replay_older`."""


def resource_of(path: str) -> str:
    """The resource a list/watch path is for: its last segment (``.../namespaces/a/tasks``
    → ``tasks``)."""
    return path.rstrip("/").rsplit("/", 1)[-1]


@dataclass
class LagStats:
    """What the schedule did, for reports: counts per resource."""

    delivered: collections.Counter[str] = field(default_factory=collections.Counter)
    delayed: collections.Counter[str] = field(default_factory=collections.Counter)
    cuts: collections.Counter[str] = field(default_factory=collections.Counter)
    expiries: collections.Counter[str] = field(default_factory=collections.Counter)
    replays: collections.Counter[str] = field(default_factory=collections.Counter)
    watches: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass
class _Plan:
    lag: float = 0.0
    delete_lag: float = 0.0
    replay_depth: int = 0
    history: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=HISTORY)
    )
    streams: set[_LaggedContent] = field(default_factory=set)
    opened: asyncio.Event = field(default_factory=asyncio.Event)


class _LaggedContent:
    """The re-timed body of one watch: ``readany()`` returns one event line at a time when its
    release time comes, ``b""`` at the end."""

    def __init__(
        self, source: aiohttp.StreamReader, plan: _Plan, resource: str, stats: LagStats
    ) -> None:
        self._source = source
        self._plan = plan
        self._resource = resource
        self._stats = stats
        self._loop = asyncio.get_running_loop()
        self._items: collections.deque[tuple[float, bytes, str | None]] = collections.deque()
        self._control: collections.deque[bytes] = collections.deque()
        self._changed = asyncio.Event()
        self._eof = False
        self._last_release = 0.0
        self._pump = self._loop.create_task(self._read(), name=f"watch-lag-{resource}")

    async def _read(self) -> None:
        framer = LineFramer()
        try:
            while True:
                chunk = await self._source.readany()
                if not chunk:
                    break
                now = self._loop.time()
                for line in framer.feed(chunk):
                    event_type, rv = _peek(line)
                    lag = self._plan.lag + (
                        self._plan.delete_lag if event_type == "DELETED" else 0.0
                    )
                    release = max(self._last_release, now + lag)
                    self._last_release = release
                    if release > now:
                        self._stats.delayed[self._resource] += 1
                    self._items.append((release, line + b"\n", rv))
                    self._changed.set()
        except (aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the connection ended: deliver what arrived, then end the stream
        finally:
            self._eof = True
            self._changed.set()

    def cut(self) -> None:
        self._control.append(b"")
        self._changed.set()

    def expire(self) -> None:
        self._control.append(EXPIRED_EVENT + b"\n")
        self._changed.set()

    async def readany(self) -> bytes:
        while True:
            self._changed.clear()
            if self._control:
                return self._control.popleft()
            if self._items:
                release, line, rv = self._items[0]
                delay = release - self._loop.time()
                if delay <= 0:
                    self._items.popleft()
                    if rv is not None:
                        self._plan.history.append(rv)
                    self._stats.delivered[self._resource] += 1
                    return line
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)
                continue
            if self._eof:
                return b""
            await self._changed.wait()

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk

    async def close(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump


class _LaggedResponse:
    """Just enough of :class:`aiohttp.ClientResponse` for a watch reader: ``content``."""

    def __init__(self, response: aiohttp.ClientResponse, content: _LaggedContent) -> None:
        self.status = response.status
        self.headers = response.headers
        self.content = content


def _peek(line: bytes) -> tuple[str | None, str | None]:
    """The event type and the object's resourceVersion of one watch line (``None`` when the
    line is not a decodable event: the reflector handles it as it comes)."""
    try:
        event = orjson.loads(line)
        obj = event.get("object") or {}
        return event.get("type"), (obj.get("metadata") or {}).get("resourceVersion")
    except (orjson.JSONDecodeError, AttributeError):
        return None, None


class WatchScheduleTransport(Transport):
    """A transport whose watch streams follow a schedule set per resource (module docs).

    Everything starts with no lag; the setters take effect for events arriving from then on
    (events already held back keep their release time). Not thread-safe: one event loop.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: dict[str, _Plan] = collections.defaultdict(_Plan)
        self.stats = LagStats()

    def set_lag(self, resource: str, seconds: float) -> None:
        """Delay every later event of ``resource`` by ``seconds`` (0 stops the lag)."""
        self._plans[resource].lag = max(0.0, seconds)

    def set_delete_lag(self, resource: str, seconds: float) -> None:
        """Delay later ``DELETED`` events of ``resource`` by ``seconds`` more."""
        self._plans[resource].delete_lag = max(0.0, seconds)

    def clear(self) -> None:
        """No lag anywhere from now on, and no replay pending."""
        for plan in self._plans.values():
            plan.lag = plan.delete_lag = 0.0
            plan.replay_depth = 0

    def cut(self, resource: str) -> int:
        """End the open watches of ``resource`` (held-back events are lost); returns how many."""
        streams = list(self._plans[resource].streams)
        for stream in streams:
            stream.cut()
        self.stats.cuts[resource] += len(streams)
        return len(streams)

    def expire(self, resource: str) -> int:
        """Send a 410 ``Expired`` error on the open watches of ``resource``: they relist."""
        streams = list(self._plans[resource].streams)
        for stream in streams:
            stream.expire()
        self.stats.expiries[resource] += len(streams)
        return len(streams)

    def replay_older(self, resource: str, depth: int = 8) -> None:
        """The next reconnect of ``resource``'s watch resumes ``depth`` delivered events
        earlier than asked (as far back as the history goes)."""
        self._plans[resource].replay_depth = max(1, depth)

    async def reconnected(self, resource: str, timeout: float = 30.0) -> bool:
        """Wait until a watch of ``resource`` opens from now on (e.g. after :meth:`cut`);
        False if none did within ``timeout`` seconds."""
        plan = self._plans[resource]
        plan.opened.clear()
        try:
            await asyncio.wait_for(plan.opened.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def pending(self) -> int:
        """Events received but not yet delivered, over all open watches."""
        return sum(len(s._items) for p in self._plans.values() for s in p.streams)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        resource = resource_of(path)
        plan = self._plans[resource]
        query = dict(params or {})
        resuming = bool(query.get("resourceVersion")) and "sendInitialEvents" not in query
        if plan.replay_depth and resuming and plan.history:
            history = list(plan.history)
            asked = query["resourceVersion"]
            index = history.index(asked) if asked in history else len(history) - 1
            query["resourceVersion"] = history[max(0, index - plan.replay_depth)]
            plan.replay_depth = 0
            self.stats.replays[resource] += 1
        self.stats.watches[resource] += 1
        async with super().stream(path, query, headers=headers) as response:
            content = _LaggedContent(response.content, plan, resource, self.stats)
            plan.streams.add(content)
            plan.opened.set()
            try:
                yield cast(aiohttp.ClientResponse, _LaggedResponse(response, content))
            finally:
                plan.streams.discard(content)
                await content.close()
