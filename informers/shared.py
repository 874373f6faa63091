"""Shared informers: one watch per (resource, namespace, selectors, mode), fanned out to many
handlers.

A handler is a callable ``handler(delta, initial)`` taking a
:class:`~informers.store.StoreDelta` and whether it comes from the initial list. It may be a
plain function (called inline, in order, for every change: the fast path for controllers whose
handlers only enqueue keys) or a coroutine function (fed through a bounded buffer by a task of
its own; when the buffer is full the informer waits, so a slow handler slows the watch instead
of growing memory without bound).

Guarantees:

* A handler added late first receives the current content of the store as ``ADDED`` deltas
  with ``initial=True``, then every later change, with nothing lost or duplicated in between.
* Each registration reports its own :attr:`Registration.has_synced`: true once the handler has
  been given (and, for coroutine handlers, has processed) the complete initial state.
* An exception in a handler is logged and counted (``informer_handler_errors_total``); it
  never stops the watch or other handlers.
* Deltas are shared between handlers: treat ``delta.obj``/``delta.old`` as read-only.
* An object whose UID changed under the same key (deleted and re-created while the informer
  did not see it: after a relist, or a watch resuming after a gap) reaches handlers as the
  ``DELETED`` of the old object followed by the ``ADDED`` of the new one, never as one
  ``MODIFIED``; so every predicate treats the new object as new.
* Supervision: the reflector never ends on anything the wire does (see
  :mod:`informers.reflector`). If it still ends for any other reason than cancellation (a bug),
  the informer logs the traceback, counts it (``informer_reflector_restarts_total``) and
  restarts it after a backoff (0.8 s doubling to 30 s, jittered into [d, 2d), reset after
  2 minutes of running). The restarted reflector relists. From the crash until that relist
  completes, :attr:`SharedInformer.healthy` is False (:attr:`SharedInformer.has_synced` keeps
  its meaning: the store once held a complete state).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from informers import metrics
from informers.budget import BodyBudget
from informers.memory import release_freed_memory
from informers.reflector import Reflector, Transform, strip_managed_fields
from informers.reflector_machine import ReflectorOptions
from informers.sharding import ShardSelector
from informers.store import ADDED, IndexFunc, Store, StoreDelta
from kubeclient.discovery import Discovery, ResourceInfo
from kubeclient.transport import Transport

log = logging.getLogger(__name__)

EventHandler = Callable[[StoreDelta, bool], Awaitable[None] | None]

DEFAULT_BUFFER = 1024
"""Deltas a coroutine handler may fall behind before the informer waits for it."""

_SYNC_MARK = object()

RESTART_BACKOFF_INITIAL = 0.8
RESTART_BACKOFF_CAP = 30.0
RESTART_BACKOFF_RESET_AFTER = 120.0


class Registration:
    """One handler's subscription to a :class:`SharedInformer`."""

    def __init__(self, informer: SharedInformer, handler: EventHandler, buffer_size: int) -> None:
        self.informer = informer
        self.handler = handler
        self.is_coroutine = inspect.iscoroutinefunction(handler)
        self._synced = asyncio.Event()
        self._queue: asyncio.Queue[Any] | None = (
            asyncio.Queue(buffer_size) if self.is_coroutine else None
        )
        self._task: asyncio.Task[None] | None = None
        self._removed = False

    @property
    def has_synced(self) -> bool:
        """True once this handler has received the complete initial state."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def remove(self) -> None:
        """Stop delivering to this handler."""
        self._removed = True
        self.informer._registrations.discard(self)
        if self._task is not None:
            self._task.cancel()

    # -- delivery -------------------------------------------------------------------------

    def _call(self, delta: StoreDelta, initial: bool) -> None:
        try:
            self.handler(delta, initial)
        except Exception:
            self.informer._handler_failed(delta)

    async def _call_async(self, delta: StoreDelta, initial: bool) -> None:
        try:
            result = self.handler(delta, initial)
            if result is not None:
                await result
        except Exception:
            self.informer._handler_failed(delta)

    async def deliver(self, deltas: Sequence[StoreDelta], initial: bool) -> None:
        if self._removed:
            return
        if self._queue is None:
            for delta in deltas:
                self._call(delta, initial)
        else:
            for delta in deltas:
                await self._queue.put((delta, initial))

    async def mark_synced(self) -> None:
        """The initial state has been delivered (queued, for a coroutine handler)."""
        if self._queue is None:
            self._synced.set()
        elif not self._removed:
            await self._queue.put(_SYNC_MARK)

    def start(self, snapshot: Sequence[tuple[str, bytes]] | None) -> None:
        """Begin delivery; ``snapshot`` (raw objects) is replayed first for late handlers."""
        if self._queue is None:
            if snapshot is not None:
                for delta in _snapshot_deltas(snapshot):
                    self._call(delta, True)
                self._synced.set()
            return
        self._task = asyncio.get_running_loop().create_task(
            self._consume(snapshot), name=f"informer-handler-{self.informer.description}"
        )

    async def _consume(self, snapshot: Sequence[tuple[str, bytes]] | None) -> None:
        assert self._queue is not None
        if snapshot is not None:
            for delta in _snapshot_deltas(snapshot):
                await self._call_async(delta, True)
            self._synced.set()
        while True:
            item = await self._queue.get()
            if item is _SYNC_MARK:
                self._synced.set()
                continue
            delta, initial = item
            await self._call_async(delta, initial)


def _snapshot_deltas(snapshot: Sequence[tuple[str, bytes]]) -> Iterator[StoreDelta]:
    for key, raw in snapshot:
        yield StoreDelta(ADDED, None, raw=raw, key=key)


@dataclass(frozen=True)
class InformerKey:
    """What makes two informers the same: resource, scope, selectors and mode."""

    group_resource: str
    version: str
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    metadata_only: bool = False
    shard_selector: ShardSelector | None = None


@dataclass
class SharedInformer:
    """A store kept in step by one reflector, and the handlers registered on it."""

    transport: Transport
    resource: ResourceInfo
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    metadata_only: bool = False
    transform: Transform | None = strip_managed_fields
    indexers: Mapping[str, IndexFunc] | None = None
    options: ReflectorOptions | None = None
    shard_selector: ShardSelector | None = None
    budget: BodyBudget | None = None
    store: Store = field(init=False)
    reflector: Reflector = field(init=False)
    _registrations: set[Registration] = field(init=False, default_factory=set)
    _task: asyncio.Task[None] | None = field(init=False, default=None)
    _down: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.store = Store(indexers=self.indexers, budget=self.budget)
        self.reflector = Reflector(
            self.transport,
            self.resource,
            self.store,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            transform=self.transform,
            metadata_only=self.metadata_only,
            options=self.options,
            sink=self._dispatch,
            on_synced=self._on_synced,
            shard_selector=self.shard_selector,
        )
        self._errors = metrics.HANDLER_ERRORS.labels(self.resource.group_resource)
        self._restarts = metrics.REFLECTOR_RESTARTS.labels(self.resource.group_resource)

    @property
    def description(self) -> str:
        return self.reflector.description

    @property
    def has_synced(self) -> bool:
        return self.store.has_synced

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def healthy(self) -> bool:
        """True when the cache can be trusted to follow the server: started, synced, and the
        reflector has not crashed since its last complete sync (a crashed reflector makes this
        False until its restart has relisted). Connection trouble the reflector handles itself
        (backoff, re-watch, relist) does not make an informer unhealthy."""
        return self.running and self.store.has_synced and not self._down

    def start(self) -> None:
        """Start the reflector under supervision (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name=f"reflector-{self.description}"
            )

    async def _supervise(self) -> None:
        """Run the reflector; restart it with backoff whenever it ends unexpectedly."""
        loop = asyncio.get_running_loop()
        step = 0
        while True:
            started = loop.time()
            try:
                await self.reflector.run()
                problem: BaseException = RuntimeError("the reflector returned")
            except Exception as err:  # a bug: the wire's failures never get here
                problem = err
            self._down = True
            self._restarts.inc()
            if loop.time() - started >= RESTART_BACKOFF_RESET_AFTER:
                step = 0
            base = min(RESTART_BACKOFF_INITIAL * 2 ** min(step, 16), RESTART_BACKOFF_CAP)
            step += 1
            delay = base * (1.0 + random.random())
            log.error(
                "%s: the reflector stopped unexpectedly; the cache is stale until it is "
                "restarted (in %.1fs) and has relisted. Please report this with the traceback.",
                self.description,
                delay,
                exc_info=problem,
            )
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Stop the reflector (its watch is closed) and every handler task. The store keeps
        its content (a stopped informer can still be read) but leaves
        ``informer_store_objects`` at once."""
        metrics.untrack_store(self.resource.group_resource, self.store)
        if self.budget is not None:
            self.budget.forget_store(self.store)
        tasks = [self._task] if self._task is not None else []
        for registration in list(self._registrations):
            registration.remove()
            if registration._task is not None:
                tasks.append(registration._task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """True once the store holds the complete initial state; False on timeout."""
        try:
            await asyncio.wait_for(self.reflector.synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def add_handler(
        self, handler: EventHandler, *, buffer_size: int = DEFAULT_BUFFER
    ) -> Registration:
        """Register ``handler``; if the informer already synced, it first gets the current
        state as ``ADDED`` deltas (``initial=True``)."""
        registration = Registration(self, handler, buffer_size)
        # No await between the snapshot and the registration: nothing can slip in between.
        snapshot: list[tuple[str, bytes]] | None = None
        if self.store.has_synced:
            keys = self.store.keys()
            # Held bytes: with a budget, an evicted object's metadata (its body is not held).
            snapshot = [(key, raw) for key in keys if (raw := self.store.held_raw(key)) is not None]
        self._registrations.add(registration)
        registration.start(snapshot)
        return registration

    async def _dispatch(self, deltas: Sequence[StoreDelta], initial: bool) -> None:
        for registration in tuple(self._registrations):
            await registration.deliver(deltas, initial)

    async def _on_synced(self) -> None:
        self._down = False
        for registration in tuple(self._registrations):
            if not registration.has_synced:
                await registration.mark_synced()

    def _handler_failed(self, delta: StoreDelta) -> None:
        self._errors.inc()
        log.exception("%s: event handler failed on %r; the watch goes on", self.description, delta)


def kind_of(api_version: str | type, kind: str | None) -> tuple[str, str]:
    """``(api_version, kind)`` from two strings, or from a class that carries both as
    attributes (a typed resource class); ``TypeError`` otherwise."""
    if isinstance(api_version, str):
        if not isinstance(kind, str):
            raise TypeError(f"after the api_version {api_version!r} comes the kind, a string")
        return api_version, kind
    version, name = getattr(api_version, "api_version", None), getattr(api_version, "kind", None)
    if kind is not None or not isinstance(version, str) or not isinstance(name, str):
        raise TypeError(
            "an informer is for api_version and kind strings, or for a class with "
            f"api_version and kind attributes (a typed resource), not {api_version!r}"
        )
    return version, name


PINNED: Final = "pinned"
"""The holder of an informer asked for without one: it is never released, so the informer runs
until :meth:`InformerFactory.discard` or :meth:`InformerFactory.stop`."""


class InformerFactory:
    """Creates and shares informers: one per :class:`InformerKey`.

    ``transform`` (default :func:`strip_managed_fields`) and ``options`` apply to every
    informer the factory creates. Informers are started on creation; :meth:`stop` stops all.

    **Holders.** Each :meth:`informer` call names the holder it is for (any hashable object:
    a controller, a cache, a reader's token; default :data:`PINNED`). :meth:`release` drops
    one holder; when the last one is gone the informer is stopped (its watch closed),
    forgotten and its store emptied, so the objects are freed before :meth:`release`
    returns (handlers' registrations are removed by their owners). An informer with the
    :data:`PINNED` holder is never released: code that never says it is done keeps what it
    started, as before holders existed. Holding twice counts once.
    """

    def __init__(
        self,
        transport: Transport,
        discovery: Discovery | None = None,
        *,
        transform: Transform | None = strip_managed_fields,
        options: ReflectorOptions | None = None,
    ) -> None:
        self.transport = transport
        self.discovery = discovery or Discovery(transport)
        self.transform = transform
        self.options = options
        self._informers: dict[InformerKey, SharedInformer] = {}
        self._holders: dict[InformerKey, set[object]] = {}

    async def informer(
        self,
        api_version: str | type,
        kind: str | None = None,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        indexers: Mapping[str, IndexFunc] | None = None,
        start: bool = True,
        shard_selector: ShardSelector | None = None,
        holder: object = PINNED,
        budget: BodyBudget | None = None,
    ) -> SharedInformer:
        """The shared informer for this kind and scope, created (and started) on first use,
        held for ``holder`` until :meth:`release` (class docs; default :data:`PINNED`: for
        good).

        ``shard_selector`` limits it to one shard of the objects (see
        :mod:`informers.sharding`); informers of different shards are different informers.

        ``budget`` (:mod:`informers.budget`; default ``None``: every body kept) and
        ``indexers`` only take effect for the call that creates the informer; a later call
        asking for an index the existing informer lacks raises ``ValueError``.

        A class with ``api_version`` and ``kind`` attributes (a typed resource) may stand for
        both: ``factory.informer(Task)``.
        """
        api_version, kind = kind_of(api_version, kind)
        resource = await self.discovery.resolve(api_version, kind)
        key = InformerKey(
            resource.group_resource,
            resource.version,
            namespace if resource.namespaced else None,
            label_selector or None,
            field_selector or None,
            metadata_only,
            shard_selector,
        )
        informer = self._informers.get(key)
        if informer is None:
            informer = SharedInformer(
                self.transport,
                resource,
                namespace=key.namespace,
                label_selector=key.label_selector,
                field_selector=key.field_selector,
                metadata_only=metadata_only,
                transform=self.transform,
                indexers=indexers,
                options=self.options,
                shard_selector=shard_selector,
                budget=budget,
            )
            self._informers[key] = informer
        elif indexers:
            missing = set(indexers) - set(informer.store.index_names)
            if missing:
                raise ValueError(
                    f"the informer for {informer.description} was created without the "
                    f"index(es) {sorted(missing)}; register indexes before first use"
                )
        self._holders.setdefault(key, set()).add(holder)
        if start:
            informer.start()
        return informer

    async def release(self, informer: SharedInformer, holder: object) -> bool:
        """Drop ``holder``'s hold on ``informer``; stop and forget the informer when no holder
        is left, and free its store before returning (:meth:`Store.clear
        <informers.store.Store.clear>`: it reads as empty from then on), then give the freed
        memory back to the system where the C library allows (:mod:`informers.memory`).
        Returns ``True`` if it was stopped now. Releasing what ``holder`` does not hold
        (twice, or an informer already discarded) does nothing and returns ``False``."""
        key = self._key_of(informer)
        if key is None:
            return False
        holders = self._holders.get(key, set())
        if holder not in holders:
            return False
        holders.discard(holder)
        if holders:
            return False
        del self._informers[key]
        self._holders.pop(key, None)
        await informer.stop()
        # Freed now, not when the stopped tasks' frames are collected (a cycle): then the C
        # heap's free pages go back to the system (glibc; see informers.memory).
        informer.store.clear()
        release_freed_memory()
        return True

    def holders(self, informer: SharedInformer) -> int:
        """How many holders ``informer`` has (0 once it is released or discarded)."""
        key = self._key_of(informer)
        return len(self._holders.get(key, ())) if key is not None else 0

    def _key_of(self, informer: SharedInformer) -> InformerKey | None:
        for key, known in self._informers.items():
            if known is informer:
                return key
        return None

    def informers(self) -> list[SharedInformer]:
        return list(self._informers.values())

    def find(self, key: InformerKey) -> SharedInformer | None:
        return self._informers.get(key)

    async def discard(self, informer: SharedInformer) -> None:
        """Stop ``informer`` and forget it, whoever holds it (a later :meth:`informer` call
        makes a new one)."""
        for key, known in list(self._informers.items()):
            if known is informer:
                del self._informers[key]
                self._holders.pop(key, None)
        await informer.stop()

    def unhealthy(self) -> list[SharedInformer]:
        """The started informers that are not :attr:`~SharedInformer.healthy` (not synced
        yet, or recovering from a reflector crash). Informers never started are left out."""
        return [i for i in self._informers.values() if i._task is not None and not i.healthy]

    async def wait_for_sync(self, timeout: float | None = None) -> list[SharedInformer]:
        """Wait until every informer synced; returns those that did not within ``timeout``."""
        informers = self.informers()
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for i in informers))
        return [i for i, ok in zip(informers, results, strict=True) if not ok]

    async def stop(self) -> None:
        """Stop every informer, held or not (what they cached stays readable)."""
        for informer in self._informers.values():
            await informer.stop()
