"""An event recorder writing ``events.k8s.io/v1`` Events, with series and a rate limit.

:meth:`EventRecorder.record` never blocks and never raises: it notes the occurrence in memory
and returns; a background task writes. Repeats of the same event (same regarding object,
related object, type, reason, action and note) within ``series_window`` of the previous one are
counted into the existing Event's ``series`` (``count``, ``lastObservedTime``) with a merge
patch, as client-go's event broadcaster does, instead of creating one Event per occurrence.
Occurrences that arrive while a write is pending are coalesced into that write.

Protection of the API server: every write (create or series patch) takes a token from a
bucket per regarding object (default: 25 at once, then one per 5 s), so a hot loop on one
object produces a bounded number of requests while its counts keep adding up; at most
``max_pending`` distinct events wait for writing (further ones are dropped and counted in
:attr:`EventRecorder.dropped`); recent events and buckets live in bounded LRU caches. One
write is in flight at a time. A write that fails is logged and dropped.

Fences (:mod:`controller_runtime.fencing`): an occurrence recorded by a reconcile (or by work
started inside ``fenced_by``) is written only while that fence holds, checked right before
each send; once it no longer holds (leadership or the slot lost, a pause past the renew
deadline) the pending write is dropped and counted in :attr:`EventRecorder.dropped`, so a
process that lost its lease sends no Event either.

Secrets: an Event's ``note`` is stored in plain text and readable by anyone allowed to list
events in the namespace, and Events are often shipped to log systems. Never put credentials,
tokens, connection strings or personal data in a note; name the object or the field instead.
The recorder adds nothing of the regarding object but its reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from cachetools import LRUCache

from controller_runtime.client import PatchType
from controller_runtime.fencing import (
    Fence,
    FencedError,
    before_send,
    check_fence,
    current_fence,
    fenced_by,
)
from kubeclient.errors import AlreadyExistsError, NotFoundError
from kubeclient.transport import Transport

log = logging.getLogger(__name__)

EVENTS_API_VERSION = "events.k8s.io/v1"
NOTE_LIMIT = 1024  # bytes; the server rejects longer notes
FIELD_LIMIT = 128  # reason, action, reportingInstance
_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")


class EventClient(Protocol):
    """What the recorder needs of :class:`controller_runtime.client.Client`."""

    async def create(self, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]: ...

    async def patch(
        self, obj: dict[str, Any], patch: Any, *, patch_type: PatchType = "merge"
    ) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class EventRecorderOptions:
    """Tuning of :class:`EventRecorder`; the defaults suit a controller.

    ``series_window``: seconds after the last occurrence within which a repeat joins the
    series (client-go: 6 minutes). ``burst``/``refill_seconds``: the per-object token bucket
    for writes. ``max_events``: size of the LRU of recent events (and of buckets).
    ``max_pending``: distinct events waiting to be written before new ones are dropped.
    """

    series_window: float = 360.0
    burst: int = 25
    refill_seconds: float = 5.0
    max_events: int = 4096
    max_pending: int = 1024


@dataclass
class _Bucket:
    tokens: float
    stamp: float

    def wait(self, now: float, burst: int, refill: float) -> float:
        """Seconds until a token is available (0: available now)."""
        self.tokens = min(float(burst), self.tokens + (now - self.stamp) / refill)
        self.stamp = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) * refill


@dataclass(eq=False)
class _Entry:
    """One Event as the recorder knows it (hashed by identity)."""

    body: dict[str, Any]
    object_key: tuple[str, ...]
    count: int = 1
    written: int = 0  # the count the server holds; 0: not created
    last_seen: float = field(default_factory=time.monotonic)
    fence: Fence | None = None  # of the last occurrence's work: written only while it holds


def _micro_time(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _truncate(text: str, limit: int) -> str:
    encoded = text.encode()
    return text if len(encoded) <= limit else encoded[:limit].decode("utf-8", "ignore")


def _reference(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
    }
    if not (ref["apiVersion"] and ref["kind"] and ref["name"]):
        raise ValueError("an event needs an object with apiVersion, kind and metadata.name")
    return {k: v for k, v in ref.items() if v}


def _event_name(regarding_name: str) -> str:
    # client-go: "<name>.<unix nanoseconds in hex>"; kept a valid DNS subdomain.
    base = _NOT_DNS.sub("-", regarding_name.lower()).strip(".-")[:236] or "event"
    return f"{base}.{time.time_ns():x}"


class EventRecorder:
    """Records ``events.k8s.io/v1`` Events about objects; see the module docs.

    ``sink`` is a :class:`controller_runtime.client.Client` (or anything with its ``create``
    and ``patch``) or a bare :class:`~kubeclient.transport.Transport`.
    ``reporting_controller`` is a qualified name such as ``crpy.io/task-controller``;
    ``reporting_instance`` identifies this process (e.g. the pod name; at most 128 chars).

    The writer task starts with the first record on the running event loop. Call
    :meth:`flush` to wait until everything recorded is written (ignoring the rate limit), and
    :meth:`close` at shutdown.
    """

    def __init__(
        self,
        sink: EventClient | Transport,
        *,
        reporting_controller: str,
        reporting_instance: str,
        options: EventRecorderOptions | None = None,
    ) -> None:
        if not _QUALIFIED_NAME.match(reporting_controller):
            raise ValueError(
                f"reporting_controller {reporting_controller!r} must be a qualified name, "
                "e.g. 'example.com/my-controller'"
            )
        if not reporting_instance or len(reporting_instance) > FIELD_LIMIT:
            raise ValueError("reporting_instance must have 1 to 128 characters")
        self._sink = sink
        self.reporting_controller = reporting_controller
        self.reporting_instance = reporting_instance
        self.options = options or EventRecorderOptions()
        self._recent: LRUCache[tuple[Any, ...], _Entry] = LRUCache(self.options.max_events)
        self._buckets: LRUCache[tuple[str, ...], _Bucket] = LRUCache(self.options.max_events)
        self._dirty: OrderedDict[_Entry, None] = OrderedDict()  # insertion order: FIFO
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writing = False
        self._flushing = 0
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        """Occurrences dropped: too many pending, bad input, or failed writes."""

    @property
    def pending(self) -> int:
        """Events with occurrences not yet written."""
        return len(self._dirty)

    def record(
        self,
        regarding: Mapping[str, Any],
        type: str,
        reason: str,
        note: str,
        action: str,
        *,
        related: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one occurrence of an event about ``regarding``; never raises.

        ``type`` is ``"Normal"`` or ``"Warning"``; ``reason`` (why, CamelCase, e.g.
        ``"BackupFailed"``) and ``action`` (what was done or tried, e.g. ``"Backup"``) are
        required and cut at 128 characters; ``note`` (human readable, no secrets) is cut at
        1 KiB. ``related`` is an optional second object.
        """
        try:
            self._record(regarding, type, reason, note, action, related=related)
        except Exception as err:
            self.dropped += 1
            log.warning("dropping event %s about %s: %s", reason, _safe_name(regarding), err)

    def _record(
        self,
        regarding: Mapping[str, Any],
        event_type: str,
        reason: str,
        note: str,
        action: str,
        *,
        related: Mapping[str, Any] | None,
    ) -> None:
        if event_type not in ("Normal", "Warning"):
            raise ValueError(f"type must be 'Normal' or 'Warning', not {event_type!r}")
        if not reason or not action:
            raise ValueError("reason and action are required")
        ref = _reference(regarding)
        related_ref = _reference(related) if related is not None else None
        reason, action = reason[:FIELD_LIMIT], action[:FIELD_LIMIT]
        note = _truncate(note, NOTE_LIMIT)
        object_key = tuple(str(ref.get(k, "")) for k in ("apiVersion", "kind", "namespace", "name"))
        key = (
            object_key,
            ref.get("uid"),
            tuple(sorted(related_ref.items())) if related_ref else None,
            event_type,
            reason,
            action,
            note,
        )
        now = time.monotonic()
        entry = self._recent.get(key)
        if entry is not None and now - entry.last_seen <= self.options.series_window:
            entry.count += 1
            entry.last_seen = now
            entry.body["series"] = {"count": entry.count, "lastObservedTime": _micro_time()}
        else:
            body: dict[str, Any] = {
                "apiVersion": EVENTS_API_VERSION,
                "kind": "Event",
                "metadata": {
                    "name": _event_name(ref["name"]),
                    # Events about cluster-scoped objects go to "default", as client-go does.
                    "namespace": ref.get("namespace") or "default",
                },
                "eventTime": _micro_time(),
                "reportingController": self.reporting_controller,
                "reportingInstance": self.reporting_instance,
                "action": action,
                "reason": reason,
                "note": note,
                "type": event_type,
                "regarding": ref,
            }
            if related_ref:
                body["related"] = related_ref
            entry = _Entry(body=body, object_key=object_key, last_seen=now)
            self._recent[key] = entry
        entry.fence = current_fence()
        if entry not in self._dirty:
            if len(self._dirty) >= self.options.max_pending:
                raise RuntimeError(f"{len(self._dirty)} events are already waiting to be written")
            self._dirty[entry] = None
        self._idle.clear()
        self._wake.set()
        self._ensure_writer()

    def _ensure_writer(self) -> None:
        if self._task is None or self._task.done():
            # A fresh context: the writer must not inherit the reconcile context of whoever
            # recorded first (the client would attribute every event write to that reconcile).
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="event-recorder", context=contextvars.Context()
            )

    async def flush(self) -> None:
        """Wait until every occurrence recorded so far is written (or dropped), ignoring the
        rate limit."""
        self._flushing += 1
        try:
            while self._dirty or self._writing:
                self._ensure_writer()
                self._idle.clear()
                self._wake.set()
                await self._idle.wait()
        finally:
            self._flushing -= 1

    async def wait_idle(self) -> None:
        """Wait until the writer has written everything the rate limit allows now."""
        await self._idle.wait()

    async def close(self, timeout: float = 5.0) -> None:
        """Flush (for at most ``timeout`` seconds), then stop the writer. A recorder that
        never recorded anything closes at once, without yielding to the event loop."""
        if self._task is None and not self._dirty:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- the writer --------------------------------------------------------------------------

    def _next_ready(self) -> tuple[_Entry | None, float | None]:
        """The first pending entry whose object has a token (taking it), else the delay until
        one will."""
        now = time.monotonic()
        delay: float | None = None
        for entry in self._dirty:
            if self._flushing:
                del self._dirty[entry]
                return entry, None
            bucket = self._buckets.get(entry.object_key)
            if bucket is None:
                bucket = self._buckets[entry.object_key] = _Bucket(self.options.burst, now)
            wait = bucket.wait(now, self.options.burst, self.options.refill_seconds)
            if wait == 0.0:
                bucket.tokens -= 1.0
                del self._dirty[entry]
                return entry, None
            delay = wait if delay is None else min(delay, wait)
        return None, delay

    async def _run(self) -> None:
        while True:
            entry, delay = self._next_ready()
            if entry is None:
                self._idle.set()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            self._writing = True
            try:
                with fenced_by(entry.fence):
                    await self._write(entry)
            except FencedError as err:
                self.dropped += 1
                log.debug("not writing event %s: %s", entry.body["reason"], err)
            except Exception as err:
                self.dropped += 1
                log.warning(
                    "could not write event %s about %s: %s",
                    entry.body["reason"],
                    entry.body["regarding"].get("name"),
                    err,
                )
            finally:
                self._writing = False

    async def _write(self, entry: _Entry) -> None:
        count = entry.count
        if count == entry.written:
            return
        if entry.written:
            try:
                await self._patch(entry.body, {"series": entry.body["series"]})
                entry.written = count
                return
            except NotFoundError:
                # The Event expired (the server keeps them an hour) or was deleted: start anew.
                entry.body["metadata"]["name"] = _event_name(entry.body["regarding"]["name"])
        try:
            await self._create(entry.body)
        except AlreadyExistsError:
            entry.body["metadata"]["name"] = _event_name(entry.body["regarding"]["name"])
            await self._create(entry.body)
        entry.written = count

    async def _create(self, body: dict[str, Any]) -> None:
        if isinstance(self._sink, Transport):
            path = f"/apis/{EVENTS_API_VERSION}/namespaces/{body['metadata']['namespace']}/events"
            fence = current_fence()
            check_fence(fence)
            await self._sink.request("POST", path, body=body, before_send=before_send(fence))
        else:
            await self._sink.create(body)

    async def _patch(self, body: dict[str, Any], patch: dict[str, Any]) -> None:
        if isinstance(self._sink, Transport):
            meta = body["metadata"]
            path = (
                f"/apis/{EVENTS_API_VERSION}/namespaces/{meta['namespace']}/events/{meta['name']}"
            )
            fence = current_fence()
            check_fence(fence)
            await self._sink.request(
                "PATCH",
                path,
                body=patch,
                content_type="application/merge-patch+json",
                before_send=before_send(fence),
            )
        else:
            await self._sink.patch(body, patch, patch_type="merge")


def _safe_name(obj: Any) -> str:
    try:
        meta = obj.get("metadata") or {}
        return f"{obj.get('kind')} {meta.get('namespace') or ''}/{meta.get('name')}"
    except Exception:
        return "<unknown object>"
