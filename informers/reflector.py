"""The asyncio driver of :class:`~informers.reflector_machine.ReflectorMachine`.

The machine decides (which request, how long to wait, what to put in the store); this module
does the I/O: LIST pages and watch streams through :class:`~kubeclient.transport.Transport`,
our own line framing, decoding (watch events only as far as the store needs, see
:mod:`informers._partial`; orjson for the rest), the transform hook, the store, and hand-off of
every store change to a sink (the shared informer's fan-out).

Guarantees:

* Never raises out of :meth:`Reflector.run` on anything the wire can do, only
  ``CancelledError``: every failure of the wire becomes an input of the machine, which backs
  off and recovers. That includes connection errors that are not ``aiohttp.ClientError`` (an
  ``OSError``, or uvloop's ``RuntimeError: File descriptor N is used by transport``) raised
  while opening or reading a LIST or a watch. A bug of ours that still escapes ends
  :meth:`~Reflector.run`; the shared informer restarts it (see :mod:`informers.shared`).
* A line cut mid-object is never decoded: the framing only yields complete lines, and a
  stream that ends with a partial line is reported as a cut (re-watch from the last complete
  event's resourceVersion).
* One bad line never stops the informer. A line that is not a usable event (not JSON, not a
  JSON object, ``type`` not a string, ``object`` not an object for ADDED/MODIFIED/DELETED, or
  any shape that makes taking it apart raise) is fed to the machine as
  :meth:`~informers.reflector_machine.ReflectorMachine.watch_event_malformed`: the watch is
  closed, and after backoff the informer relists (like client-go). Logged with the resource
  and counted in ``informer_malformed_events_total{what="event"}``. An event or listed item
  whose object the store cannot take (no name, an index function that raises, a transform
  that raises) is ignored, logged and counted (``what="object"``). BOOKMARK and ERROR events
  of any shape are inputs of the machine (see its docstring).
* Backpressure: the sink is awaited for every batch of changes, so a slow consumer slows the
  reading of the socket instead of growing memory. The idle timer of a watch measures only
  the server's silence: it is suspended while the reflector waits on the sink, so a slow
  handler is never mistaken for a dead connection.
* Resume point: the resourceVersion a watch resumes from (or a relist starts at) never runs
  ahead of what the sink has been given. An event's change reaches the sink before the next
  line is read, and nothing but cancellation can interrupt the hand-off (the idle timer is
  off during it). Caveat: if the reflector itself crashes during a hand-off (a bug), the
  restarted reflector relists, and the relist only reports what differs from the store.
* A watch that gets no response (connecting, TLS, the status line and headers) within
  :data:`WATCH_HANDSHAKE_TIMEOUT` counts as failed, so a stalled handshake never hangs an
  informer. A streaming list gets the watch's whole idle window instead (its
  ``timeoutSeconds`` plus the idle margin): the API server computes the initial events
  before it answers, which for hundreds of thousands of objects on a busy server takes
  longer than the plain watch's bound, and giving up there means a paginated LIST instead,
  slower and held whole in memory. Caveat: a streaming list whose connection stalls for good
  before the answer (half-open) is given up only at the end of that window, 310-610 s with
  the default options, against 30 s for a plain watch.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson

from informers import metrics
from informers._framing import LineFramer, LineTooLongError
from informers._partial import Metadata, decode_watch_line
from informers.reflector_machine import (
    ApplyEvent,
    Bookmark,
    CloseWatch,
    Effect,
    ListRequest,
    Log,
    ReflectorMachine,
    ReflectorOptions,
    ReflectorProtocolError,
    Relisting,
    ReplaceStore,
    Sleep,
    State,
    Synced,
    WatchRequest,
    WatchRestarted,
)
from informers.sharding import ShardFilter, ShardSelector
from informers.store import ADDED, EventType, Prepared, Store, StoreDelta, split_uid_change
from kubeclient.discovery import ResourceInfo
from kubeclient.errors import ApiError
from kubeclient.transport import Transport

log = logging.getLogger(__name__)

Transform = Callable[[dict[str, Any]], dict[str, Any]]
"""Rewrites each object before it is stored (and before handlers see it)."""

DeltaSink = Callable[[Sequence[StoreDelta], bool], Awaitable[None]]
"""Receives each batch of store changes, and whether it comes from the initial list."""

METADATA_LIST_ACCEPT = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"

WATCH_HANDSHAKE_TIMEOUT = 30.0
"""Seconds a plain watch request may take to be answered (connection, TLS, headers)."""


def handshake_timeout(params: dict[str, str], idle_timeout_seconds: float) -> float:
    """How long a watch with query ``params`` may take to be answered: a streaming list
    (``sendInitialEvents``) its whole idle window, any other watch at most
    :data:`WATCH_HANDSHAKE_TIMEOUT` (module docs)."""
    if "sendInitialEvents" in params:
        return idle_timeout_seconds
    return min(idle_timeout_seconds, WATCH_HANDSHAKE_TIMEOUT)


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError, RuntimeError)
"""What a LIST or a watch may raise when the connection fails. ``OSError`` covers
``ConnectionError`` and socket errors; ``RuntimeError`` covers uvloop's
``File descriptor N is used by transport`` (MagicStack/uvloop#653) and its like, except
:data:`BUGS`."""

BUGS: tuple[type[BaseException], ...] = (
    ReflectorProtocolError,
    RecursionError,
    NotImplementedError,
)
"""``RuntimeError`` subclasses that never mean a connection failed: re-raised (the informer's
supervisor restarts the reflector), never retried as a connection failure."""


def strip_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The default transform: drop ``metadata.managedFields`` (often half an object's size,
    and of no use to a controller reading from its cache)."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj


async def _discard(deltas: Sequence[StoreDelta], initial: bool) -> None:
    return None


class Reflector:
    """Keeps one :class:`~informers.store.Store` in step with one resource on the server.

    ``namespace=None`` watches all namespaces (or a cluster-scoped resource).
    ``label_selector`` and ``field_selector`` are the wire forms (``"app=x"``,
    ``"spec.priority=3"``; CRD ``selectableFields`` work as field selectors). ``transform``
    defaults to :func:`strip_managed_fields`; pass ``None`` to keep objects whole.
    ``metadata_only`` asks the server for PartialObjectMetadata (no spec, no status).
    ``shard_selector`` adds ``shardSelector`` to every list and watch and drops, on the client,
    any object outside it (see :mod:`informers.sharding`): the store holds only the shard
    whether or not the server filtered.
    """

    def __init__(
        self,
        transport: Transport,
        resource: ResourceInfo,
        store: Store,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Transform | None = strip_managed_fields,
        metadata_only: bool = False,
        options: ReflectorOptions | None = None,
        sink: DeltaSink | None = None,
        on_synced: Callable[[], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        shard_selector: ShardSelector | None = None,
    ) -> None:
        self.transport = transport
        self.resource = resource
        self.store = store
        self.namespace = namespace
        self.transform = transform
        self.metadata_only = metadata_only
        self.sink: DeltaSink = sink or _discard
        self.on_synced = on_synced
        self._options = options or ReflectorOptions()
        self._rng = rng
        self.machine = self._new_machine()
        self.synced = asyncio.Event()
        self._path = resource.path(namespace)
        self._selectors = selector_params(label_selector, field_selector)
        self.shard_filter: ShardFilter | None = None
        if shard_selector is not None:
            self._selectors["shardSelector"] = shard_selector.wire
            self.shard_filter = ShardFilter(shard_selector, resource.group_resource)
        if metadata_only:
            self._item_api_version, self._item_kind = "meta.k8s.io/v1", "PartialObjectMetadata"
        else:
            self._item_api_version, self._item_kind = resource.api_version, resource.kind
        label = resource.group_resource
        self._events = {
            t: metrics.EVENTS.labels(label, t)
            for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")
        }
        self._malformed_events = metrics.MALFORMED_EVENTS.labels(label, "event")
        self._malformed_objects = metrics.MALFORMED_EVENTS.labels(label, "object")
        # Read at scrape time: nothing to update per event.
        metrics.track_store(label, store)
        self._watches_open = metrics.WATCHES_OPEN.labels(label)
        self._label = label
        self._loop_time: Callable[[], float] = lambda: 0.0
        # Watch lines are decoded partially (informers._partial) when the transform is the
        # default one (cut managedFields from the bytes) or none (keep the bytes whole); a
        # custom transform needs the object, so it takes the full decode.
        self._cut: bool | None = (
            True if transform is strip_managed_fields else False if transform is None else None
        )

    @property
    def description(self) -> str:
        scope = f" in {self.namespace}" if self.namespace else ""
        return f"{self.resource.group_resource}{scope}"

    def _new_machine(self) -> ReflectorMachine:
        return ReflectorMachine(
            self._options, rng=self._rng, key_of=_prepared_key, rv_of=_prepared_rv
        )

    async def run(self) -> None:
        """Run until cancelled. Stops the machine (and closes any watch) on the way out.

        May be called again after it ended (the informer's supervisor does, after a crash):
        a fresh machine then starts with a full sync, whose relist reports what changed
        against the store as it was left.
        """
        loop = asyncio.get_running_loop()
        self._loop_time = loop.time
        if self.machine.state is not State.EMPTY:
            self.machine = self._new_machine()
        effects = self.machine.start(loop.time())
        try:
            while True:
                request = await self._apply_effects(effects)
                if request is None:
                    return
                effects = await self._perform(request)
        finally:
            self.machine.stop(loop.time())

    # -- effects without I/O -------------------------------------------------------------------

    async def _apply_effects(
        self, effects: Sequence[Effect]
    ) -> ListRequest | WatchRequest | Sleep | None:
        """Carry out store/metric/log effects; return the I/O effect (always last), if any."""
        for effect in effects:
            # The common case first: one event to apply, per line of a watch.
            if type(effect) is ApplyEvent:
                await self._apply(effect.event_type, effect.obj)
            elif isinstance(effect, (ListRequest, WatchRequest, Sleep)):
                return effect
            elif isinstance(effect, ReplaceStore):
                await self._replace(effect.items, effect.resource_version)
            elif isinstance(effect, Bookmark):
                self.store.observe_bookmark(effect.resource_version)
            elif isinstance(effect, Synced):
                self.store.mark_synced()
                self.synced.set()
                if self.on_synced is not None:
                    await self.on_synced()
                log.debug("%s synced: %d objects", self.description, len(self.store))
            elif isinstance(effect, Relisting):
                metrics.RELISTS.labels(self._label, effect.reason).inc()
            elif isinstance(effect, WatchRestarted):
                metrics.WATCH_RESTARTS.labels(self._label, effect.reason).inc()
            elif isinstance(effect, Log):
                log.log(effect.level, "%s: %s", self.description, effect.message)
            elif isinstance(effect, CloseWatch):
                pass  # the watch loop stops reading once the machine asks for another request
        return None

    def _prepare(self, obj: dict[str, Any], *, keep_object: bool) -> Prepared | None:
        """Transform, validate and encode one object as soon as it arrives.

        Objects buffered for an atomic swap (list pages, a streaming list) keep only their
        bytes; ``keep_object`` keeps the dict for a live event, whose handlers read it anyway.
        An object outside the shard selector is dropped here (``None``).
        """
        try:
            if self.shard_filter is not None and not self.shard_filter.accept(obj):
                return None
            if self.transform is not None:
                obj = self.transform(obj)
            prepared = self.store.prepare(obj, buffered=not keep_object)
        except Exception as err:  # a shape the store or the transform cannot take
            self._object_rejected(err)
            return None
        return prepared if keep_object else prepared.drop_object()

    async def _apply(self, event_type: str, prepared: Prepared) -> None:
        delta = self.store.apply_prepared(_event_type(event_type), prepared)
        if delta is not None:
            if delta.type == ADDED and delta.has_old:
                # The key now holds another object (its UID changed): a delete, then an add.
                await self.sink(split_uid_change(delta), False)
                return
            await self.sink((delta,), False)

    async def _replace(self, items: list[Prepared], resource_version: str) -> None:
        initial = not self.store.has_synced
        deltas = self.store.replace_prepared(items, resource_version)
        # The machine's buffer (its effect holds the list too): empty it before handlers
        # run, so its prepared objects (~150 B each beside what the store keeps) are freed.
        items.clear()
        if deltas:
            await self.sink(deltas, initial)
        del deltas
        # With a memory budget, evict only now: until the handlers had the list, its bodies
        # were alive anyway (see informers.budget).
        self.store.enforce_budget()

    # -- I/O -------------------------------------------------------------------------------

    async def _perform(self, request: ListRequest | WatchRequest | Sleep) -> list[Effect]:
        if isinstance(request, Sleep):
            await asyncio.sleep(request.seconds)
            return self.machine.sleep_done(self._loop_time())
        if isinstance(request, ListRequest):
            return await self._list(request)
        return await self._watch(request)

    async def _list(self, request: ListRequest) -> list[Effect]:
        headers = {"Accept": METADATA_LIST_ACCEPT} if self.metadata_only else None
        if "continue" not in request.params:
            self.store.start_list()  # a list from its first page: the budget's allowance too
        try:
            answer = await self.transport.request(
                "GET", self._path, params={**self._selectors, **request.params}, headers=headers
            )
            body = orjson.loads(answer.body)
        except ApiError as err:
            return self.machine.list_failed(
                self._loop_time(),
                err.status,
                reason=err.reason,
                retry_after=err.retry_after,
                message=err.message,
            )
        except orjson.JSONDecodeError as err:
            return self.machine.list_failed(self._loop_time(), 0, message=f"bad JSON: {err}")
        except BUGS:
            raise
        except CONNECTION_ERRORS as err:
            log.info("%s: LIST connection failed (%r)", self.description, err)
            return self.machine.list_failed(
                self._loop_time(), 0, reason="ConnectionError", message=repr(err)
            )
        try:
            meta = body.get("metadata") or {}
            resource_version = meta.get("resourceVersion") or ""
            continue_token = meta.get("continue") or ""
            raw_items = body.get("items") or ()
            if not isinstance(resource_version, str) or not isinstance(continue_token, str):
                raise TypeError("metadata.resourceVersion and metadata.continue must be strings")
        except (AttributeError, TypeError) as err:
            return self.machine.list_failed(
                self._loop_time(), 500, reason="BadList", message=f"malformed list: {err}"
            )
        # List items omit apiVersion and kind; cached objects should carry them.
        api_version, kind = self._item_api_version, self._item_kind
        items: list[Prepared] = []
        for item in raw_items:
            if type(item) is not dict:
                self._malformed_objects.inc()
                log.error("%s: ignoring a list item that is not an object", self.description)
                continue
            item["apiVersion"] = api_version
            item["kind"] = kind
            prepared = self._prepare(item, keep_object=False)
            if prepared is not None:
                items.append(prepared)
        del body, raw_items
        return self.machine.list_page(self._loop_time(), items, resource_version, continue_token)

    # One return per way a watch ends, each handed to the machine as its own input.
    async def _watch(self, request: WatchRequest) -> list[Effect]:  # noqa: PLR0911,PLR0912
        machine = self.machine
        headers = {"Accept": METADATA_ACCEPT} if self.metadata_only else None
        params = {**self._selectors, **request.params}
        if "sendInitialEvents" in params:
            self.store.start_list()  # a streaming list is buffered from its first event
        loop = asyncio.get_running_loop()
        framer = LineFramer()
        started = False
        try:
            # One timer covers the whole stream: connecting and the response headers first
            # (a stalled handshake must not hang forever), then every read, re-armed on each
            # chunk (HTTP/1.1 has no pings; silence this long means a half-open connection).
            handshake = handshake_timeout(params, request.idle_timeout_seconds)
            async with asyncio.timeout(handshake) as idle:
                async with self.transport.stream(self._path, params, headers=headers) as response:
                    started = True
                    self._watches_open.inc()
                    effects = machine.watch_started(loop.time())
                    pending = await self._apply_effects(effects)
                    if pending is not None:
                        return [pending]
                    reader = response.content
                    while True:
                        idle.reschedule(loop.time() + request.idle_timeout_seconds)
                        try:
                            chunk = await reader.readany()
                        except BUGS:
                            raise
                        except RuntimeError as err:  # uvloop's fd reuse and its like
                            raise ConnectionError(f"reading the watch failed: {err!r}") from err
                        # The idle timer measures the server's silence, not the time handlers
                        # take: off while this chunk's events are handed over.
                        idle.reschedule(None)
                        if not chunk:
                            break
                        lines = framer.feed(chunk)
                        if lines:
                            pending = await self._lines(lines)
                            if pending is not None:
                                return [pending]
        except ApiError as err:
            return machine.watch_failed(
                loop.time(),
                err.status,
                reason=err.reason,
                retry_after=err.retry_after,
                message=err.message,
            )
        except TimeoutError:
            if not started:
                return machine.watch_failed(
                    loop.time(), 0, reason="Timeout", message="no response to the watch request"
                )
            log.info(
                "%s: no bytes for %.0fs; reconnecting",
                self.description,
                request.idle_timeout_seconds,
            )
            return machine.idle_timeout(loop.time())
        except LineTooLongError as err:
            log.error("%s: %s; reconnecting", self.description, err)
            return machine.watch_ended(loop.time(), clean=False)
        except (aiohttp.ClientError, OSError) as err:
            log.info("%s: watch connection lost (%r)", self.description, err)
            if not started:
                return machine.watch_failed(
                    loop.time(), 0, reason="ConnectionError", message=repr(err)
                )
            return machine.watch_ended(loop.time(), clean=False)
        finally:
            if started:
                self._watches_open.dec()
        return machine.watch_ended(loop.time(), clean=framer.buffered_bytes == 0)

    # One flat function on purpose: it runs per event, and each call saved is measurable.
    async def _lines(  # noqa: PLR0912,PLR0915
        self, lines: list[bytes]
    ) -> ListRequest | WatchRequest | Sleep | None:
        """Handle the complete lines of one chunk, in order; the I/O effect that ends the
        watch, if one does.

        While the machine :attr:`~ReflectorMachine.takes_applied_events`, plain ``ADDED``/
        ``MODIFIED``/``DELETED`` events take a flattened path: decode, shard filter, transform,
        :meth:`Store.apply`, and the deltas of the whole chunk handed to the sink in one call,
        the machine told once (count and last resourceVersion) just before. Any other line
        (bookmark, error, malformed, no resourceVersion) first flushes what is batched, then
        goes through :meth:`_event` and the machine one by one, so the order of changes, of
        sink calls and of machine inputs is that of the lines. The resume point stays behind
        the sink: the machine hears of a batch only when the batch is handed over, and no
        line is read before that hand-over completes.
        """
        machine = self.machine
        deltas: list[StoreDelta] = []
        count = 0
        last_rv = ""
        fast = machine.takes_applied_events
        transform = self.transform
        shard_filter = self.shard_filter
        apply = self.store.apply
        apply_raw = self.store.apply_raw
        counters = self._events
        loads = orjson.loads
        cut = self._cut
        for line in lines:
            if fast:
                partial = None if cut is None else decode_watch_line(line, cut)
                if partial is not None:
                    event_type, raw_meta, raw = partial
                    usable = True
                else:
                    try:
                        event = loads(line)
                        event_type = event["type"]
                        obj = event["object"]
                        meta = obj["metadata"]
                        usable = (
                            type(obj) is dict
                            and type(meta) is dict
                            and event_type in ("ADDED", "MODIFIED", "DELETED")
                            and bool(meta.get("resourceVersion"))
                        )
                    except Exception:  # any bad shape: the general path decides what it is
                        usable = False
                if usable:
                    counters[event_type].inc()
                    try:
                        if partial is not None:
                            if shard_filter is not None and not shard_filter.accept(
                                _shard_view(raw_meta)
                            ):
                                continue
                            rv = raw_meta.resourceVersion
                            delta = apply_raw(event_type, raw_meta, raw)
                        else:
                            if shard_filter is not None and not shard_filter.accept(obj):
                                continue
                            if transform is not None:
                                obj = transform(obj)
                            rv = obj["metadata"].get("resourceVersion")
                            delta = apply(event_type, obj)
                    except Exception as err:  # a shape the store or the transform cannot take
                        self._object_rejected(err)
                        continue
                    count += 1
                    if rv:
                        last_rv = rv
                    else:  # the transform dropped it: applied, but no resume point to take
                        log.warning(
                            "%s: %s event without resourceVersion", self.description, event_type
                        )
                    if delta is not None:
                        if delta.type == ADDED and delta.has_old:
                            # The key now holds another object (its UID changed).
                            deltas.extend(split_uid_change(delta))
                        else:
                            deltas.append(delta)
                    continue
            if count:
                machine.watch_events_applied(count, last_rv)
                count = 0
            if deltas:
                await self.sink(deltas, False)
                deltas = []
            effects = self._event(line)
            if effects:  # a streaming list's events have none: no coroutine for them
                pending = await self._apply_effects(effects)
                if pending is not None:
                    return pending
            fast = machine.takes_applied_events
        if count:
            machine.watch_events_applied(count, last_rv)
        if deltas:
            await self.sink(deltas, False)
        return None

    def _object_rejected(self, err: Exception) -> None:
        self._malformed_objects.inc()
        log.error(
            "%s: ignoring an object the store cannot take (%s: %s)",
            self.description,
            type(err).__name__,
            err,
        )

    def _partial_event(self, line: bytes, cut: bool) -> list[Effect] | None:
        """:meth:`_event` for a line :func:`~informers._partial.decode_watch_line` takes
        (``None`` when it refuses it)."""
        partial = decode_watch_line(line, cut)
        if partial is None:
            return None
        event_type, meta, raw = partial
        self._events[event_type].inc()
        if self.shard_filter is not None and not self.shard_filter.accept(_shard_view(meta)):
            return []
        buffered = self.machine.state is State.STREAMING_LIST
        try:
            prepared = self.store.prepare_raw(meta, raw, buffered=buffered)
        except Exception as err:  # a custom index function that raises
            self._object_rejected(err)
            return []
        return self.machine.watch_event(self._loop_time(), event_type, prepared)

    def _event(self, line: bytes) -> list[Effect]:
        """Decode one line and feed it to the machine, as an event or as a malformed one.

        No field is validated up front: the happy path pays only for the ``try``; a shape that
        makes the decoding below raise is reported to the machine instead. A plain event is
        first decoded partially (:mod:`informers._partial`); anything it refuses takes the
        full decode.
        """
        if self._cut is not None:
            effects = self._partial_event(line, self._cut)
            if effects is not None:
                return effects
        try:
            event = orjson.loads(line)
            event_type = event["type"]
            obj = event["object"]
            if type(event_type) is not str:
                raise TypeError(f"type is a {type(event_type).__name__}, not a string")
            counter = self._events.get(event_type)
            if counter is not None:
                counter.inc()
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                if type(obj) is not dict:
                    raise TypeError(f"the {event_type} object is a {type(obj).__name__}")
                buffered = self.machine.state is State.STREAMING_LIST
                prepared = self._prepare(obj, keep_object=not buffered)
                if prepared is None:
                    return []
                return self.machine.watch_event(self._loop_time(), event_type, prepared)
            return self.machine.watch_event(self._loop_time(), event_type, obj)
        except ReflectorProtocolError:
            raise
        except Exception as err:  # any shape of bad line: an input of the machine
            self._malformed_events.inc()
            problem = f"{type(err).__name__}: {err}"[:300]
            log.error(
                "%s: malformed watch line (%d bytes): %s", self.description, len(line), problem
            )
            return self.machine.watch_event_malformed(self._loop_time(), problem)


def _shard_view(meta: Metadata) -> dict[str, Any]:
    """What a shard filter reads of an object (its UID and namespace), from its metadata."""
    return {"metadata": {"uid": meta.uid, "namespace": meta.namespace}}


def _prepared_key(item: Prepared) -> str:
    return item.key


def _prepared_rv(item: Prepared) -> str:
    return item.rv


def _event_type(value: str) -> EventType:
    if value == "ADDED":
        return "ADDED"
    if value == "MODIFIED":
        return "MODIFIED"
    if value == "DELETED":
        return "DELETED"
    raise ValueError(f"not a store event type: {value!r}")


def selector_params(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """Query parameters for the two selectors (omitting empty ones)."""
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params
