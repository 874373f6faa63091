"""An asyncio work queue with client-go's guarantees and controller-runtime's priorities.

Guarantees of :class:`WorkQueue`:

- **Per-key serialisation.** An item handed out by :meth:`WorkQueue.get` is not handed out
  again until :meth:`WorkQueue.done` is called for it, so no two workers ever process the same
  key at once.
- **Deduplication.** An item is queued at most once. Adding a queued item again keeps the
  higher priority and the earlier ready time (controller-runtime's priority queue). Raising
  the priority of a ready item places it at the end of its new priority level, behind the
  items already there (as controller-runtime's priority queue does since v0.23).
- **No lost adds.** An item added while it is being processed is remembered (with its priority
  and ready time) and queued again by ``done``.
- **Delays.** An item added with a delay is never handed out before its ready time; a waiting
  getter gets it about a millisecond after it at most (one loop timer for the whole queue,
  never armed for less than 1 ms).
- **Priorities.** Higher priority first; within a priority, first ready first out. An item's
  ready time is when it was added, or its delay's end; ties go to the item added first. A
  re-add made during processing keeps the time it was made (as controller-runtime does). A
  ready item whose priority is raised counts, within its new level, as ready at the raise.
- **No starvation.** Every ``oldest_every``-th hand-out (default 10) takes the item with the
  earliest ready time, whatever its priority. So while an item is the oldest ready item, at
  most ``oldest_every - 1`` other items are handed out before it, and an item with k items
  ahead of it by ready time is handed out within ``oldest_every * (k + 1)`` hand-outs however
  many higher-priority items keep arriving. Within a priority the order stays FIFO, since the
  oldest ready item is also the oldest of its level. This was chosen over ageing priorities
  by waiting time: ageing eventually puts a whole initial-list backlog ahead of every fresh
  change, defeating the point of the low priority, while a fixed share keeps fresh changes
  first (9 hand-outs in 10 by default) and still drains the backlog at a known minimum rate.

- **No memory of the past.** Once an item has been handed out and marked done (and, if it
  was rate limited, forgotten), the queue holds no reference to it: memory is proportional
  to the items queued or in flight now, never to the number of distinct keys ever seen.
  (Stale lane slots may outlive their item for a while, but they no longer point at it.)

Metrics count as controller-runtime's priority queue does: ``workqueue_adds_total`` counts an
add when the item becomes ready, or at once when it is added while being processed;
``workqueue_retries_total`` counts every add with a positive delay (:meth:`WorkQueue.add_after`
and :meth:`WorkQueue.add_rate_limited`). client-go also counts ``AddAfter`` with a zero delay.

Costs: items are kept in *lanes* (one per priority level in use, one by age for the fairness
turns, one for delayed items), each a deque of entries in order plus a heap for the entries
that arrive out of order. An add at the current time is in order, so an add, and a hand-out
of the head of the highest non-empty level, is O(1) (plus O(levels) to find that level); an
item that becomes ready with a ready time in the past (a delay or a parked re-add whose time
has come), a raised priority, and a delay shorter than those queued before it cost O(log n).
Deletion is lazy: stale slots are compacted away once they outnumber live ones by 2048, and
dropped at once whenever no item is ready. ``done`` is O(1) unless it re-queues the item.
Memory: about 190 B per queued key besides the key itself (an entry of six slots, its
ready time and add order, a slot in the queue's table and two deque slots), whether ready
or delayed; a controller's queue holds its requests as their store keys (:class:`ItemKeys`),
so a request queued from an informer costs nothing more (``python -m bench.queue_memory``).
The rate limiter holds nothing for an item until it fails.

Caveats: a queue belongs to one event loop and is not thread-safe; from another thread, use
``loop.call_soon_threadsafe(queue.add, item)``. Items must be hashable and should be small
immutable keys (controller-runtime's ``Request``), not objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from controller_runtime import metrics as _metrics
from controller_runtime.ratelimiter import RateLimiter, default_controller_rate_limiter

__all__ = [
    "DEFAULT_OLDEST_EVERY",
    "LOW_PRIORITY",
    "ItemKeys",
    "QueueShutDownError",
    "WorkQueue",
]

T = TypeVar("T", bound=Hashable)

LOW_PRIORITY = -100
"""Priority for items from an initial list or a resync (controller-runtime's
``handler.LowPriority``); fresh changes use 0."""

DEFAULT_OLDEST_EVERY = 10
"""Default of ``WorkQueue(oldest_every=...)``: one hand-out in ten is the oldest ready item."""

# How many stale heap entries are tolerated before a heap is compacted, on top of half its
# size: keeps compaction O(1) amortised and never triggers it on small queues.
_COMPACT_SLACK = 1024

# uvloop rounds timer delays to whole milliseconds, so a timer for a shorter remainder fires
# early, finds nothing due, and would be re-armed in a busy loop until the time comes.
_MIN_TIMER_DELAY = 0.001

# Entry states. An entry lives from the first add of an item until it is handed out.
_WAITING = 0  # in the waiting lane until its ready time
_READY = 1  # in the lane of its priority (and the FIFO lane)
_PARKED = 2  # added while being processed; queued again by done()
_GONE = 3  # handed out, replaced, or dropped by shutdown


class QueueShutDownError(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down: the worker should exit."""


@dataclass(frozen=True, slots=True)
class ItemKeys(Generic[T]):
    """How a queue keys its items: it holds ``key_of(item)`` and hands out ``item_of(key)``.

    For items with a more compact equivalent than themselves: a controller's
    :class:`~controller_runtime.reconcile.Request` (a tuple of two strings) is held as its
    informer store key (``"namespace/name"``), see
    :data:`~controller_runtime.reconcile.REQUEST_KEYS`; a caller that already holds such a key
    (an event handler, from the store) queues it with :meth:`WorkQueue.add_key`, and the
    queued item then costs no object of its own. Items are deduplicated, serialised and rate
    limited exactly as if they were held as themselves, provided that ``key_of`` maps equal
    items, and only those, to equal keys, and ``item_of(key_of(item)) == item``. The rate
    limiter still sees the items.
    """

    key_of: Callable[[T], Hashable]
    item_of: Callable[[Any], T]


class _Entry:
    __slots__ = ("counted", "key", "priority", "ready_at", "seq", "state")

    def __init__(self, key: Hashable, priority: int, ready_at: float, seq: int, state: int) -> None:
        # The key is dropped (None) once the entry is handed out, so that stale lane slots
        # pointing at the entry never keep the item alive.
        self.key: Hashable | None = key
        self.priority = priority
        self.ready_at = ready_at
        self.seq = seq
        self.state = state
        self.counted = False  # counted in workqueue_adds_total


class _Lane:
    """Entries in order of rank, smallest first: the ready items of one priority, the ready
    items by age (the fairness turn), or the waiting items.

    An entry's rank is its ``(ready_at, seq)``, or one given at the push (a raised priority).
    Entries pushed in rank order, each ranking after the last one pushed, are appended to
    ``inorder``: an add at the current time always does, so the common case costs one slot
    of a deque and no tuple. The others (an item whose delay or parking ended in the past,
    a raised priority) go to ``late``, a heap of ``(rank_at, rank_seq, entry)``. The smallest
    live entry is at the head of one of the two.

    Deletion is lazy: a slot is live while its entry is in the lane's ``state`` (and, for the
    lane of a priority, still has that ``priority``); ``live`` counts the live slots. An entry
    never changes its rank while it has a live slot (a waiting item given an earlier ready
    time gets a new entry), and it has at most one live slot per lane.
    """

    __slots__ = ("inorder", "last_at", "last_seq", "late", "live", "priority", "state")

    def __init__(self, state: int, priority: int | None = None) -> None:
        self.inorder: deque[_Entry] = deque()
        self.late: list[tuple[float, int, _Entry]] = []
        self.last_at = 0.0  # rank of the last entry appended to ``inorder``
        self.last_seq = -1
        self.live = 0
        self.state = state
        self.priority = priority

    def __len__(self) -> int:
        """Slots held, live or stale."""
        return len(self.inorder) + len(self.late)

    def push(self, entry: _Entry) -> None:
        """Add ``entry`` at its own rank."""
        at = entry.ready_at
        seq = entry.seq
        inorder = self.inorder
        if not inorder or at > self.last_at or (at == self.last_at and seq > self.last_seq):
            inorder.append(entry)
            self.last_at = at
            self.last_seq = seq
        else:
            heapq.heappush(self.late, (at, seq, entry))
        self.live += 1

    def push_ranked(self, entry: _Entry, at: float, seq: int) -> None:
        """Add ``entry`` at the rank ``(at, seq)`` rather than its own."""
        heapq.heappush(self.late, (at, seq, entry))
        self.live += 1

    def first_at(self) -> float:
        """The rank time of the smallest live entry (there must be one)."""
        self.drop_stale_heads()
        inorder, late = self.inorder, self.late
        if inorder:
            at = inorder[0].ready_at
            return min(at, late[0][0]) if late else at
        return late[0][0]

    def pop(self) -> _Entry:
        """Remove and return the smallest live entry (there must be one)."""
        state, priority = self.state, self.priority
        inorder, late = self.inorder, self.late
        while inorder:
            entry = inorder[0]
            if entry.state == state and (priority is None or entry.priority == priority):
                break
            inorder.popleft()
        while late:
            entry = late[0][2]
            if entry.state == state and (priority is None or entry.priority == priority):
                break
            heapq.heappop(late)
        self.live -= 1
        if inorder:
            if late:
                entry = inorder[0]
                t = late[0]
                if t[0] < entry.ready_at or (t[0] == entry.ready_at and t[1] < entry.seq):
                    return heapq.heappop(late)[2]
            return inorder.popleft()
        return heapq.heappop(late)[2]

    def drop_stale_heads(self) -> None:
        """Drop the stale slots at the heads of ``inorder`` and ``late``."""
        state, priority = self.state, self.priority
        inorder = self.inorder
        while inorder:
            entry = inorder[0]
            if entry.state == state and (priority is None or entry.priority == priority):
                break
            inorder.popleft()
        late = self.late
        while late:
            entry = late[0][2]
            if entry.state == state and (priority is None or entry.priority == priority):
                break
            heapq.heappop(late)

    def compact(self) -> None:
        """Drop every stale slot."""
        state, priority = self.state, self.priority
        self.inorder = deque(
            e for e in self.inorder if e.state == state and priority in (None, e.priority)
        )
        self.late = [
            t for t in self.late if t[2].state == state and priority in (None, t[2].priority)
        ]
        heapq.heapify(self.late)

    def clear(self) -> None:
        """Drop every slot (the caller has made them all stale)."""
        self.inorder.clear()
        self.late.clear()
        self.live = 0


class _Levels:
    """The ready entries by priority: a :class:`_Lane` per priority ever used, in ``order``
    from the highest priority down. ``len()`` is the slots they hold, live or stale."""

    __slots__ = ("lanes", "order")

    def __init__(self) -> None:
        self.lanes: dict[int, _Lane] = {}
        self.order: list[_Lane] = []

    def __len__(self) -> int:
        return sum(len(lane.inorder) + len(lane.late) for lane in self.order)

    def lane(self, priority: int) -> _Lane:
        lane = self.lanes.get(priority)
        if lane is None:
            lane = self.lanes[priority] = _Lane(_READY, priority)
            self.order.append(lane)
            self.order.sort(key=lambda lane: -cast("int", lane.priority))
        return lane

    def compact(self) -> None:
        for lane in self.order:
            lane.compact()

    def clear(self) -> None:
        for lane in self.order:
            lane.clear()


class WorkQueue(Generic[T]):
    """A deduplicating, delaying, rate-limiting priority work queue (see the module docs).

    Args:
        name: the queue's name, the ``name`` label of its metrics.
        controller: the ``controller`` label of its metrics; defaults to ``name``.
        rate_limiter: used by :meth:`add_rate_limited`; defaults to
            :func:`~controller_runtime.ratelimiter.default_controller_rate_limiter` on ``clock``
            (per-item 5 ms → 1000 s, and a 10 qps / burst 100 bucket capped at 60 s).
        oldest_every: every n-th hand-out takes the oldest ready item regardless of priority
            (default 10); ``None`` gives strict priorities, which can starve low priorities.
        metrics: update the ``workqueue_*`` metrics in
            :data:`controller_runtime.metrics.REGISTRY` (default ``True``).
        clock: monotonic seconds, for ready times and metrics (default ``time.monotonic``).
            Timers are scheduled on the running loop for ``ready_at - clock()`` seconds.
        keys: hold items as compact keys (:class:`ItemKeys`); ``None`` (default) holds the
            items themselves.

    Shutdown differs from client-go's and follows controller-runtime's priority queue: after
    :meth:`shutdown`, ``get`` raises at once (queued items are dropped, not handed out), adds
    are ignored, and items already handed out may still be marked ``done``. As in client-go,
    :meth:`shutdown` called while :meth:`shutdown_with_drain` waits makes the drain stop
    waiting.
    """

    def __init__(
        self,
        name: str,
        *,
        controller: str | None = None,
        rate_limiter: RateLimiter[T] | None = None,
        oldest_every: int | None = DEFAULT_OLDEST_EVERY,
        metrics: bool = True,
        clock: Callable[[], float] = time.monotonic,
        keys: ItemKeys[T] | None = None,
    ) -> None:
        if oldest_every is not None and oldest_every < 1:
            raise ValueError("oldest_every must be >= 1 or None")
        self.name = name
        self.controller = name if controller is None else controller
        self.rate_limiter: RateLimiter[T] = (
            default_controller_rate_limiter(clock=clock) if rate_limiter is None else rate_limiter
        )
        self.keys = keys
        self._key_of = None if keys is None else keys.key_of
        self._item_of = None if keys is None else keys.item_of
        self._oldest_every = oldest_every or 0
        self._clock = clock

        # Keyed by an item's key: the item itself without ``keys`` (hence Any).
        self._entries: dict[Any, _Entry] = {}  # queued items: waiting, ready or parked
        self._processing: dict[Any, float] = {}  # handed out, not done: key -> time handed out
        self._ready = _Levels()  # ready entries by priority
        self._fifo = _Lane(_READY)  # ready entries by age, for the fairness turn
        self._waiting = _Lane(_WAITING)  # waiting entries by ready time
        # Upper bounds on the stale slots of each (see _compact_ready).
        self._ready_stale = self._fifo_stale = self._waiting_stale = 0
        self._n_ready = 0
        self._seq = itertools.count()
        self._handouts = 0

        self._getters: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._shutting_down = False
        self._drained: asyncio.Future[None] | None = None

        self._m_adds: Callable[[], None] | None = None
        self._m_queue_duration: Callable[[float], None] | None = None
        self._m_work_duration: Callable[[float], None] | None = None
        self._m_retries: Callable[[], None] | None = None
        if metrics:
            labels = {"name": self.name, "controller": self.controller}
            self._m_adds = _metrics.WORKQUEUE_ADDS.labels(**labels).inc
            self._m_retries = _metrics.WORKQUEUE_RETRIES.labels(**labels).inc
            self._m_queue_duration = _metrics.WORKQUEUE_QUEUE_DURATION.labels(**labels).observe
            self._m_work_duration = _metrics.WORKQUEUE_WORK_DURATION.labels(**labels).observe
            _metrics.WORKQUEUE_GAUGES.track(self)

    # --- adding -----------------------------------------------------------------------------

    def add(self, item: T, *, priority: int = 0) -> None:
        """Queue ``item`` now (ignored after shutdown).

        If it is already queued, it keeps the higher of the two priorities and becomes ready
        now if it was waiting. If it is being processed, it is queued again on ``done``.
        """
        key_of = self._key_of
        self.add_key(item if key_of is None else key_of(item), priority=priority)

    def add_key(self, key: Hashable, *, priority: int = 0) -> None:
        """:meth:`add` of the item whose key is ``key`` (``keys.key_of(item)``; the item
        itself for a queue without :class:`ItemKeys`), for a caller that holds the key."""
        if self._shutting_down:
            return
        entry = self._entries.get(key)
        if entry is None:
            now = self._clock()
            if key in self._processing:
                parked = _Entry(key, priority, now, next(self._seq), _PARKED)
                self._entries[key] = parked
                self._count_add(parked)
            else:
                entry = _Entry(key, priority, now, next(self._seq), _READY)
                self._entries[key] = entry
                self._push_ready(entry)
            return
        state = entry.state
        if state == _WAITING:
            now = self._clock()
            if entry.ready_at <= now:  # ready, though the timer has not moved it yet
                self._promote(now)
                state = _READY
        if state == _READY:
            if priority > entry.priority:
                self._raise_ready_priority(entry, priority)
            return
        entry.priority = max(entry.priority, priority)
        if state == _WAITING:
            self._waiting.live -= 1  # its slot there is stale from now on
            self._waiting_stale += 1
            entry.ready_at = now
            self._push_ready(entry)
        else:  # parked: ready as soon as done() is called
            entry.ready_at = min(entry.ready_at, self._clock())
            self._count_add(entry)

    def add_after(self, item: T, delay: float, *, priority: int = 0) -> None:
        """Queue ``item`` once ``delay`` seconds have passed (ignored after shutdown).

        A delay <= 0 is :meth:`add`. If the item is already queued, the earlier ready time and
        the higher priority win; a later, longer delay never postpones it.
        """
        key_of = self._key_of
        key = item if key_of is None else key_of(item)
        if not delay > 0:  # also catches NaN
            self.add_key(key, priority=priority)
            return
        if self._shutting_down:
            return
        if self._m_retries is not None:
            self._m_retries()
        now = self._clock()
        ready_at = now + delay
        entry = self._entries.get(key)
        if entry is None:
            entry = _Entry(key, priority, ready_at, next(self._seq), _WAITING)
            self._entries[key] = entry
            if key in self._processing:
                entry.state = _PARKED
            else:
                self._push_waiting(entry, now)
            return
        self._merge_delayed(entry, ready_at, priority, now)

    def add_rate_limited(self, item: T, *, priority: int = 0) -> None:
        """Queue ``item`` after the delay its rate limiter gives (a retry if it is positive).

        Pass the priority the item was handed out with (:meth:`get_with_priority`) to keep it
        across retries, as controller-runtime does.
        """
        if self._shutting_down:
            return
        self.add_after(item, self.rate_limiter.when(item), priority=priority)

    def forget(self, item: T) -> None:
        """Reset the rate limiter's memory of ``item`` (call it when processing succeeded)."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How many rate-limited requeues of ``item`` the rate limiter remembers."""
        return self.rate_limiter.num_requeues(item)

    # --- taking -----------------------------------------------------------------------------

    async def get(self) -> T:
        """Wait for the next item and hand it out; call :meth:`done` when finished with it.

        Raises :class:`QueueShutDownError` once the queue is shut down (also while waiting).
        """
        return (await self.get_with_priority())[0]

    async def get_with_priority(self) -> tuple[T, int]:
        """Like :meth:`get`, also returning the priority the item was queued with."""
        while True:
            taken = self._take()
            if taken is not None:
                return taken
            if self._waiting.live and self._timer is None:
                # Delayed adds made outside a running loop could not arm the timer.
                self._arm_timer(self._clock())
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if not waiter.cancelled():
                    # We were woken for an item but will not take it: pass the wake-up on.
                    self._wake_one()
                else:
                    self._discard_getter(waiter)
                raise

    def get_nowait(self) -> T:
        """Hand out the next ready item without waiting.

        Raises :class:`QueueShutDownError` once shut down, :class:`asyncio.QueueEmpty` if no
        item is ready.
        """
        taken = self._take()
        if taken is None:
            raise asyncio.QueueEmpty
        return taken[0]

    def done(self, item: T) -> None:
        """Mark ``item`` as processed: it may be handed out again.

        If it was added while being processed, it is queued now (ready, or waiting for the
        earliest delay asked for). Calling ``done`` for an item that is not being processed
        does nothing.
        """
        key_of = self._key_of
        key = item if key_of is None else key_of(item)
        start = self._processing.pop(key, None)
        if start is None:
            return
        now = self._clock()
        if self._m_work_duration is not None:
            self._m_work_duration(now - start)
        entry = self._entries.get(key)
        if entry is not None:
            # A re-add keeps the ready time it was made with (as in controller-runtime's
            # priority queue): it is served in order of when it was added, not of this done().
            if entry.ready_at <= now:
                self._push_ready(entry)
            else:
                self._push_waiting(entry, now)
        drained = self._drained
        if drained is not None and not self._processing and not drained.done():
            drained.set_result(None)

    # --- state ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of items ready to be handed out (not waiting, not being processed)."""
        if self._waiting.live:
            # Count items whose delay has passed even if the timer has not fired yet.
            now = self._clock()
            if self._waiting.first_at() <= now:
                self._promote(now)
        return self._n_ready

    @property
    def shutting_down(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._shutting_down

    def metric_gauges(self) -> _metrics.WorkqueueGauges:
        """Current gauge values, for :class:`controller_runtime.metrics.WorkqueueGaugeCollector`.

        O(priority levels + items in flight). Safe to call from another thread on CPython.
        """
        depth = {cast("int", lane.priority): lane.live for lane in tuple(self._ready.order)}
        starts = tuple(self._processing.values())
        now = self._clock()
        return _metrics.WorkqueueGauges(
            name=self.name,
            controller=self.controller,
            depth=depth,
            unfinished_work_seconds=sum(now - s for s in starts),
            longest_running_processor_seconds=max((now - s for s in starts), default=0.0),
        )

    # --- shutting down ----------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the queue: drop queued items, ignore new adds, make every ``get`` raise.

        Items being processed are unaffected; their ``done`` is still accepted. Idempotent,
        except that a call while :meth:`shutdown_with_drain` waits makes that drain return
        ``False`` at once (client-go's "force ShutDownWithDrain to stop waiting").
        """
        drained = self._drained
        if drained is not None and not drained.done():
            self._drained = None
            drained.set_result(None)
        if self._shutting_down:
            return
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for entry in self._entries.values():
            entry.state = _GONE
            entry.key = None
        self._entries.clear()
        self._ready.clear()
        self._fifo.clear()
        self._waiting.clear()
        self._ready_stale = self._fifo_stale = self._waiting_stale = self._n_ready = 0
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """:meth:`shutdown`, then wait until every handed-out item is ``done``.

        Returns ``True`` once drained, ``False`` if ``timeout`` seconds passed first (``None``,
        the default, waits forever) or if :meth:`shutdown` was called meanwhile to stop the
        wait. Cancelling the caller does not affect the queue.
        """
        self.shutdown()
        if not self._processing:
            return True
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._drained)
        except TimeoutError:
            return False
        return not self._processing

    # --- internals --------------------------------------------------------------------------

    def _count_add(self, entry: _Entry) -> None:
        if not entry.counted:
            entry.counted = True
            if self._m_adds is not None:
                self._m_adds()

    def _merge_delayed(self, entry: _Entry, ready_at: float, priority: int, now: float) -> None:
        """A delayed add of a queued item: the higher priority and the earlier ready time win."""
        if entry.state == _WAITING and entry.ready_at <= now:
            self._promote(now)  # ready, though the timer has not moved it yet
        if priority > entry.priority:
            if entry.state == _READY:
                self._raise_ready_priority(entry, priority)
            else:
                entry.priority = priority
        if ready_at < entry.ready_at:
            if entry.state == _WAITING:
                # Its slot keeps the later rank: a new entry takes its place (and its seq).
                earlier = _Entry(entry.key, entry.priority, ready_at, entry.seq, _WAITING)
                entry.state = _GONE
                entry.key = None
                self._entries[earlier.key] = earlier
                self._waiting.live -= 1
                self._waiting_stale += 1
                self._push_waiting(earlier, now)
            elif entry.state == _PARKED:
                entry.ready_at = ready_at

    def _push_ready(self, entry: _Entry) -> None:
        entry.state = _READY
        lane = self._ready.lanes.get(entry.priority)
        if lane is None:
            lane = self._ready.lane(entry.priority)
        lane.push(entry)
        if self._oldest_every:
            self._fifo.push(entry)
        self._n_ready += 1
        if not entry.counted:
            self._count_add(entry)
        if self._getters:
            self._wake_one()

    def _raise_ready_priority(self, entry: _Entry, priority: int) -> None:
        """Move a ready entry to the end of a higher priority level. Its ready time (for
        fairness turns and the queue-duration metric) is unchanged."""
        levels = self._ready
        levels.lanes[entry.priority].live -= 1  # its slot there is stale from now on
        self._ready_stale += 1
        entry.priority = priority
        ranked_at = max(self._clock(), entry.ready_at)
        levels.lane(priority).push_ranked(entry, ranked_at, next(self._seq))
        self._compact_ready()

    def _push_waiting(self, entry: _Entry, now: float) -> None:
        entry.state = _WAITING
        waiting = self._waiting
        waiting.push(entry)
        if self._timer is None or entry.ready_at < self._timer_at:
            self._arm_timer(now)
        if self._waiting_stale > waiting.live + 2 * _COMPACT_SLACK:
            stale = len(waiting) - waiting.live
            if stale > waiting.live + 2 * _COMPACT_SLACK:
                waiting.compact()
                stale = 0
            self._waiting_stale = stale

    def _arm_timer(self, now: float) -> None:
        """Point the single timer at the earliest live waiting item (or disarm it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting = self._waiting
        if not waiting.live:
            waiting.clear()
            self._waiting_stale = 0
            return
        at = waiting.first_at()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: get() arms the timer before it blocks
        self._timer_at = at
        self._timer = loop.call_later(max(at - now, _MIN_TIMER_DELAY), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self._clock()
        self._promote(now)
        self._arm_timer(now)

    def _promote(self, now: float) -> None:
        """Move every waiting item whose ready time has come to the ready lanes."""
        waiting = self._waiting
        while waiting.live and waiting.first_at() <= now:
            self._push_ready(waiting.pop())

    # The hand-out path of every reconcile, kept in one function on purpose (few calls).
    def _take(self) -> tuple[T, int] | None:
        if self._shutting_down:
            raise QueueShutDownError(f"work queue {self.name!r} is shut down")
        now = self._clock()
        waiting = self._waiting
        if waiting.live and waiting.first_at() <= now:
            self._promote(now)
        if not self._n_ready:
            return None
        self._handouts += 1
        if self._oldest_every and self._handouts % self._oldest_every == 0:
            entry = self._fifo.pop()
            self._ready.lanes[entry.priority].live -= 1  # its slot there is stale from now on
            self._ready_stale += 1
        else:
            for lane in self._ready.order:  # the highest priority with an item ready
                if lane.live:
                    break
            entry = lane.pop()
            if self._oldest_every:
                self._fifo.live -= 1  # its slot there is stale from now on
                self._fifo_stale += 1
        key = entry.key
        entry.state = _GONE
        entry.key = None
        del self._entries[key]
        n_ready = self._n_ready = self._n_ready - 1
        self._processing[key] = now
        if self._m_queue_duration is not None:
            self._m_queue_duration(now - entry.ready_at)
        if not n_ready:  # every slot left in the ready lanes is stale: drop them all
            self._ready.clear()
            self._fifo.clear()
            self._ready_stale = self._fifo_stale = 0
        elif (
            self._ready_stale > n_ready + 2 * _COMPACT_SLACK
            or self._fifo_stale > n_ready + 2 * _COMPACT_SLACK
        ):
            self._compact_ready()
        item_of = self._item_of
        return (cast("T", key) if item_of is None else item_of(key)), entry.priority

    def _compact_ready(self) -> None:
        """Compact the ready lanes, or the FIFO lane, if their stale slots outnumber their
        live ones by more than ``2 * _COMPACT_SLACK`` (O(1) amortised: the ``*_stale``
        counters bound the stale slots from above, so the exact count is rarely needed)."""
        limit = self._n_ready + 2 * _COMPACT_SLACK
        if self._ready_stale > limit:
            stale = len(self._ready) - self._n_ready
            if stale > limit:
                self._ready.compact()
                stale = 0
            self._ready_stale = stale
        if self._fifo_stale > limit:
            stale = len(self._fifo) - self._n_ready
            if stale > limit:
                self._fifo.compact()
                stale = 0
            self._fifo_stale = stale

    def _wake_one(self) -> None:
        getters = self._getters
        while getters:
            waiter = getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _discard_getter(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._getters.remove(waiter)
