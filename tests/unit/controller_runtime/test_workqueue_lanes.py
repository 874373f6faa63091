"""WorkQueue at scale against a brute-force model, and a queue holding items as keys.

The state machine in ``test_workqueue.py`` drives three keys and checks the queue's state
after every step (which also promotes every due item). Here long random runs over many keys
check every hand-out against the same specification, without promoting anything between
steps (so an add can meet an item whose delay has passed but that the queue has not moved
yet), with stale slots compacted after almost every step (``_COMPACT_SLACK`` set to 0 or 1):
out-of-order promotions, raised priorities, parked re-adds and compaction all meet.

Then: a queue with :data:`~controller_runtime.reconcile.REQUEST_KEYS` hands out exactly what
a queue holding the requests themselves does, whatever the requests (names with ``/``,
empty strings), and a controller's handler queues the store's own key string.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from controller_runtime import workqueue
from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.handlers import EnqueueRequestForObject
from controller_runtime.ratelimiter import ItemFastSlowRateLimiter
from controller_runtime.reconcile import REQUEST_KEYS, Request, request_from_key, request_key
from controller_runtime.workqueue import LOW_PRIORITY, WorkQueue
from informers.store import ADDED, StoreDelta

_names = itertools.count()


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Pending:
    priority: int
    ready_at: float
    seq: int
    rank: tuple[float, int] | None = None  # set by a priority raise while ready


class Model:
    """The specification (as in ``test_workqueue.WorkQueueMachine``): a hand-out is the
    eligible item (queued, not in flight, ready time passed) with the highest priority, then
    the earliest rank -- its ready time and add order, or the time of a raise while it was
    eligible -- except every n-th hand-out, which takes the eligible item with the earliest
    ready time."""

    def __init__(self, clock: FakeClock, every: int | None) -> None:
        self.clock = clock
        self.every = every
        self.pending: dict[str, Pending] = {}
        self.in_flight: set[str] = set()
        self.seq = itertools.count()
        self.handouts = 0

    def add(self, key: str, ready_at: float, priority: int) -> None:
        p = self.pending.get(key)
        if p is None:
            self.pending[key] = Pending(priority, ready_at, next(self.seq))
            return
        now = self.clock.now
        if priority > p.priority and key not in self.in_flight and p.ready_at <= now:
            p.rank = (now, next(self.seq))
        p.priority = max(p.priority, priority)
        p.ready_at = min(p.ready_at, ready_at)

    def eligible(self) -> dict[str, Pending]:
        now = self.clock.now
        return {
            k: p for k, p in self.pending.items() if k not in self.in_flight and p.ready_at <= now
        }

    def get(self) -> str | None:
        eligible = self.eligible()
        if not eligible:
            return None
        self.handouts += 1
        if self.every and self.handouts % self.every == 0:
            got = min(eligible, key=lambda k: (eligible[k].ready_at, eligible[k].seq))
        else:
            got = min(
                eligible,
                key=lambda k: (
                    -eligible[k].priority,
                    *(eligible[k].rank or (eligible[k].ready_at, eligible[k].seq)),
                ),
            )
        del self.pending[got]
        self.in_flight.add(got)
        return got


KEYS = st.integers(min_value=0, max_value=39)  # taken modulo the run's number of keys
OPS = st.one_of(
    st.tuples(st.just("add"), KEYS, st.sampled_from([LOW_PRIORITY, 0, 3, 7])),
    st.tuples(
        st.just("add_after"),
        KEYS,
        st.sampled_from([LOW_PRIORITY, 0, 3]),
        st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0, 2.5, 7.0]),
    ),
    st.tuples(st.just("advance"), st.sampled_from([0.25, 0.5, 1.0, 3.0])),
    st.tuples(st.just("get")),
    st.tuples(st.just("done"), st.integers(min_value=0, max_value=100)),
)


@settings(max_examples=300, deadline=None)
@given(
    every=st.sampled_from([None, 1, 2, 3, 10]),
    slack=st.sampled_from([0, 1]),
    n_keys=st.sampled_from([2, 6, 40]),
    ops=st.lists(OPS, min_size=10, max_size=300),
)
def test_many_keys_match_the_model_with_constant_compaction(
    every: int | None, slack: int, n_keys: int, ops: list[tuple[object, ...]]
) -> None:
    clock = FakeClock()
    model = Model(clock, every)
    with mock.patch.object(workqueue, "_COMPACT_SLACK", slack):
        q: WorkQueue[str] = WorkQueue(
            f"wq-lanes-{next(_names)}", oldest_every=every, clock=clock, metrics=False
        )
        for op in ops:
            match op:
                case ("add", int(index), int(priority)):
                    key = f"k{index % n_keys}"
                    model.add(key, clock.now, priority)
                    q.add(key, priority=priority)
                case ("add_after", int(index), int(priority), float(delay)):
                    key = f"k{index % n_keys}"
                    model.add(key, clock.now + delay if delay > 0 else clock.now, priority)
                    q.add_after(key, delay, priority=priority)
                case ("advance", float(dt)):
                    clock.now += dt
                case ("get",):
                    expected = model.get()
                    try:
                        got: str | None = q.get_nowait()
                    except asyncio.QueueEmpty:
                        got = None
                    assert got == expected
                case ("done", int(index)):
                    if model.in_flight:
                        key = sorted(model.in_flight)[index % len(model.in_flight)]
                        model.in_flight.discard(key)
                        q.done(key)
            entries = q._entries
            assert set(entries) == set(model.pending)
            for key, p in model.pending.items():
                assert (entries[key].priority, entries[key].ready_at) == (p.priority, p.ready_at)
            # Stale slots stay within the compaction bound (one step's slack).
            assert len(q._ready) <= 2 * (q._n_ready + slack) + 2
            assert len(q._fifo) <= 2 * (q._n_ready + slack) + 2
            assert len(q._waiting) <= 2 * (q._waiting.live + slack) + 2
        # No lost adds: once every delay has passed, everything queued comes out, in order.
        for key in sorted(model.in_flight):
            model.in_flight.discard(key)
            q.done(key)
        clock.now += 100.0
        while (expected := model.get()) is not None:
            assert q.get_nowait() == expected
            q.done(expected)
            model.in_flight.discard(expected)
        assert len(q) == 0
        assert len(q._ready) == len(q._fifo) == 0


# --- items held as keys ------------------------------------------------------------------

TEXT = st.text(alphabet="ab/", max_size=4)
REQUESTS = st.builds(Request, TEXT, TEXT)


@given(a=REQUESTS, b=REQUESTS)
def test_request_keys_are_one_to_one(a: Request, b: Request) -> None:
    assert request_from_key(request_key(a)) == a
    assert (request_key(a) == request_key(b)) == (a == b)


@given(namespace=st.text(alphabet="ab-", max_size=4), name=st.text(alphabet="ab-", min_size=1))
def test_a_store_key_is_the_key_of_its_request(namespace: str, name: str) -> None:
    store_key = f"{namespace}/{name}" if namespace else name  # informers.store.object_key
    assert request_key(Request(namespace, name)) == store_key
    assert request_from_key(store_key) == Request(namespace, name)


KEYED_OPS = st.one_of(
    st.tuples(st.just("add"), REQUESTS, st.sampled_from([LOW_PRIORITY, 0, 3])),
    st.tuples(st.just("add_key"), REQUESTS, st.sampled_from([LOW_PRIORITY, 0, 3])),
    st.tuples(st.just("add_after"), REQUESTS, st.sampled_from([0.0, 0.5, 2.0])),
    st.tuples(st.just("add_rate_limited"), REQUESTS),
    st.tuples(st.just("forget"), REQUESTS),
    st.tuples(st.just("advance"), st.sampled_from([0.25, 1.0])),
    st.tuples(st.just("get")),
    st.tuples(st.just("done"), REQUESTS),
    st.tuples(st.just("done_handed_out"), st.integers(min_value=0, max_value=50)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(KEYED_OPS, max_size=120))
def test_a_queue_of_request_keys_hands_out_what_a_queue_of_requests_does(
    ops: list[tuple[object, ...]],
) -> None:
    clock = FakeClock()

    def queue(keys: workqueue.ItemKeys[Request] | None) -> WorkQueue[Request]:
        return WorkQueue(
            f"wq-keys-{next(_names)}",
            clock=clock,
            metrics=False,
            keys=keys,
            rate_limiter=ItemFastSlowRateLimiter(0.5, 3.0, 2),
        )

    keyed, plain = queue(REQUEST_KEYS), queue(None)
    handed_out: list[Request] = []
    for op in ops:
        match op:
            case ("add", Request() as r, int(priority)):
                keyed.add(r, priority=priority)
                plain.add(r, priority=priority)
            case ("add_key", Request() as r, int(priority)):
                keyed.add_key(request_key(r), priority=priority)
                plain.add(r, priority=priority)
            case ("add_after", Request() as r, float(delay)):
                keyed.add_after(r, delay)
                plain.add_after(r, delay)
            case ("add_rate_limited", Request() as r):
                keyed.add_rate_limited(r)
                plain.add_rate_limited(r)
                assert keyed.num_requeues(r) == plain.num_requeues(r)
            case ("forget", Request() as r):
                keyed.forget(r)
                plain.forget(r)
            case ("advance", float(dt)):
                clock.now += dt
            case ("get",):
                got = plain._take()  # get_with_priority without awaiting
                assert keyed._take() == got
                if got is not None:
                    assert type(got[0]) is Request
                    handed_out.append(got[0])
            case ("done", Request() as r):
                keyed.done(r)
                plain.done(r)
            case ("done_handed_out", int(index)):
                if handed_out:
                    r = handed_out.pop(index % len(handed_out))
                    keyed.done(r)
                    plain.done(r)
        assert len(keyed) == len(plain)
        assert len(keyed._processing) == len(plain._processing)
        assert len(keyed._entries) == len(plain._entries)


def test_a_controller_queue_holds_the_store_key_of_an_initial_list_delta() -> None:
    async def reconcile(request: Request) -> None:
        return None

    controller = Controller(
        f"lanes-{next(_names)}", reconcile, options=ControllerOptions(skip_name_validation=True)
    )
    queue = controller.queue
    handle = EnqueueRequestForObject().bind(queue)
    key = "".join(["team-a/", "task-1"])  # a string of its own, as the store's key is
    handle(StoreDelta(ADDED, None, raw=b"{}", key=key), True)
    handle(StoreDelta(ADDED, None, raw=b"{}", key="cluster-wide"), False)
    held, _ = queue._entries
    assert held is key  # the store's own string: no object of the queue's for the request
    controller.enqueue(Request("team-a", "task-1"), priority=5)  # the same item: raised
    assert len(queue) == 2
    assert queue.get_nowait() == Request("team-a", "task-1")
    assert queue.get_nowait() == Request("", "cluster-wide")
    handle(StoreDelta(ADDED, None, raw=b"{}", key=key), False)  # while processing: parked
    queue.done(Request("team-a", "task-1"))
    assert queue.get_nowait() == Request("team-a", "task-1")
