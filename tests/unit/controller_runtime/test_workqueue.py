"""WorkQueue: per-key serialisation, dedup, delays, priorities, fairness, shutdown, metrics.

Most tests drive the queue synchronously with a fake clock (``get_nowait``), so that ready
times and metric values are exact. The async tests use the real clock and short delays only
where the loop timer itself is under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import random
import time
import weakref
from dataclasses import dataclass

import psutil
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from controller_runtime.metrics import REGISTRY
from controller_runtime.ratelimiter import ItemFastSlowRateLimiter
from controller_runtime.workqueue import LOW_PRIORITY, QueueShutDownError, WorkQueue

_names = itertools.count()


def qname() -> str:
    """A fresh queue name, so metric series never mix between tests."""
    return f"wq-test-{next(_names)}"


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def drain_nowait(q: WorkQueue[str]) -> list[str]:
    """Hand out every ready item, marking each done right away."""
    out: list[str] = []
    while True:
        try:
            item = q.get_nowait()
        except asyncio.QueueEmpty:
            return out
        out.append(item)
        q.done(item)


# --- per-key serialisation and dedup -------------------------------------------------------


def test_duplicates_collapse() -> None:
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock())
    for item in ["a", "b", "a", "a", "c", "b"]:
        q.add(item)
    assert len(q) == 3
    assert drain_nowait(q) == ["a", "b", "c"]
    assert len(q) == 0


def test_item_is_not_handed_out_twice_and_readd_is_replayed_after_done() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock)
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    q.add("a", priority=5)
    assert len(q) == 0
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()
    clock.advance(1.0)
    q.done("a")
    assert len(q) == 1
    assert q.get_nowait() == "a"
    q.done("a")
    assert len(q) == 0


def test_readd_during_processing_keeps_earliest_delay_and_max_priority() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock)
    q.add("a")
    q.add("b", priority=1)
    assert q.get_nowait() == "b"
    q.add_after("b", 10.0)
    q.add_after("b", 4.0, priority=7)
    q.add_after("b", 8.0)
    q.done("b")
    assert len(q) == 1  # only "a"
    clock.advance(3.9)
    assert len(q) == 1
    clock.advance(0.1)
    assert len(q) == 2
    # "b" kept priority 7 from its re-add and goes before "a".
    assert drain_nowait(q) == ["b", "a"]


def test_immediate_readd_during_processing_overrides_a_delayed_one() -> None:
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock())
    q.add("a")
    assert q.get_nowait() == "a"
    q.add_after("a", 5.0)
    q.add("a")
    q.done("a")
    assert drain_nowait(q) == ["a"]


def test_readd_during_processing_keeps_its_place_by_add_time() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock)
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # at t
    clock.advance(1.0)
    q.add("b")  # at t+1
    clock.advance(1.0)
    q.done("a")  # at t+2: "a" was added before "b", so it goes first
    assert drain_nowait(q) == ["a", "b"]


def test_done_of_unknown_item_is_ignored() -> None:
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock())
    q.add("a")
    q.done("a")  # queued, not handed out: must not un-queue it
    q.done("zzz")
    assert drain_nowait(q) == ["a"]


# --- priorities --------------------------------------------------------------------------


def test_higher_priority_first_and_fifo_within_a_priority() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock, oldest_every=None)
    adds = [("l1", LOW_PRIORITY), ("n1", 0), ("h1", 5), ("l2", LOW_PRIORITY), ("n2", 0)]
    adds += [("h2", 5), ("n3", 0)]
    for item, priority in adds:
        q.add(item, priority=priority)
        clock.advance(0.001)
    assert drain_nowait(q) == ["h1", "h2", "n1", "n2", "n3", "l1", "l2"]


def test_duplicate_add_keeps_max_priority() -> None:
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock(), oldest_every=None)
    q.add("a", priority=LOW_PRIORITY)
    q.add("b")
    q.add("a", priority=3)
    q.add("a", priority=1)  # lower: ignored
    assert q.get_nowait() == "a"
    q.done("a")
    q.add("c", priority=3)
    q.add("c", priority=LOW_PRIORITY)
    assert q.get_nowait() == "c"


async def test_get_with_priority_reports_priority() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    q.add("a", priority=LOW_PRIORITY)
    q.add("a", priority=2)
    assert await q.get_with_priority() == ("a", 2)


def test_low_priority_is_not_starved_by_a_stream_of_fresh_items() -> None:
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock(), oldest_every=10)
    q.add("initial", priority=LOW_PRIORITY)
    served = []
    for i in range(100):
        q.add(f"fresh-{i}")
        q.add(f"fresh-{i}-b")
        item = q.get_nowait()
        q.done(item)
        served.append(item)
    assert "initial" in served
    assert served.index("initial") == 9  # the 10th hand-out takes the oldest ready item


def test_strict_priorities_do_starve() -> None:
    """The counterpart of the test above: without the fairness turn the low item waits."""
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock(), oldest_every=None)
    q.add("initial", priority=LOW_PRIORITY)
    for i in range(100):
        q.add(f"fresh-{i}")
        q.add(f"fresh-{i}-b")
        assert q.get_nowait() != "initial"


def test_fairness_turn_preserves_fifo_within_each_priority() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock, oldest_every=3)
    rng = random.Random(7)
    order: dict[int, list[str]] = {}
    for i in range(300):
        priority = rng.choice([LOW_PRIORITY, 0, 4])
        q.add(f"{priority}/{i}", priority=priority)
        order.setdefault(priority, []).append(f"{priority}/{i}")
        clock.advance(0.001)
    served = drain_nowait(q)
    for priority, expected in order.items():
        assert [s for s in served if s.startswith(f"{priority}/")] == expected


# --- delays ------------------------------------------------------------------------------


def test_delayed_item_is_not_handed_out_before_its_ready_time() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock)
    q.add_after("a", 2.0)
    assert len(q) == 0
    clock.advance(1.999)
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()
    clock.advance(0.001)
    assert q.get_nowait() == "a"


def test_shorter_delay_wins_longer_delay_does_not_postpone_add_makes_ready() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock)
    q.add_after("a", 10.0)
    q.add_after("a", 3.0)
    q.add_after("a", 20.0)
    q.add_after("b", 10.0)
    clock.advance(3.0)
    assert drain_nowait(q) == ["a"]
    q.add("b")  # immediate add of a waiting item: ready now
    assert drain_nowait(q) == ["b"]
    clock.advance(100.0)
    assert drain_nowait(q) == []  # no ghost from the earlier delayed adds


def test_non_positive_delay_is_an_immediate_add() -> None:
    q: WorkQueue[str] = WorkQueue(qname(), clock=FakeClock())
    q.add_after("a", 0.0)
    q.add_after("b", -1.0)
    q.add_after("c", float("nan"))
    assert len(q) == 3


def test_delayed_items_become_ready_in_ready_time_order() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock, oldest_every=None)
    q.add_after("late", 5.0)
    q.add_after("early", 1.0)
    clock.advance(2.0)
    q.add("now")  # ready at t+2, after "early" (t+1) and before "late" (t+5)
    clock.advance(10.0)
    assert drain_nowait(q) == ["early", "now", "late"]


async def test_getter_wakes_when_delayed_item_is_ready() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    start = time.monotonic()
    q.add_after("a", 0.03)
    async with asyncio.timeout(10.0):
        assert await q.get() == "a"
    assert time.monotonic() - start >= 0.03


async def test_earlier_ready_time_reschedules_the_timer() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    q.add_after("a", 60.0)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)  # let the getter block
    start = time.monotonic()
    q.add_after("a", 0.01)
    async with asyncio.timeout(10.0):
        assert await getter == "a"
    # Far below the 60 s it would take had the timer not been re-armed, even on a slow machine.
    assert 0.01 <= time.monotonic() - start < 10.0
    q.done("a")
    q.shutdown()


def test_sub_millisecond_remainder_does_not_spin_on_uvloop() -> None:
    """uvloop rounds timers to whole milliseconds; a 0.4 ms timer fires at once, early."""
    uvloop = pytest.importorskip("uvloop")
    fires = 0

    async def main() -> None:
        nonlocal fires
        q: WorkQueue[str] = WorkQueue(qname(), metrics=False)
        on_timer = q._on_timer

        def counting() -> None:
            nonlocal fires
            fires += 1
            on_timer()

        q._on_timer = counting  # type: ignore[method-assign]
        start = time.monotonic()
        q.add_after("a", 0.0004)
        async with asyncio.timeout(10.0):
            assert await q.get() == "a"
        assert time.monotonic() - start >= 0.0004

    uvloop.run(main())
    assert fires <= 2


async def test_one_loop_timer_for_many_delayed_items() -> None:
    loop = asyncio.get_running_loop()
    scheduled = getattr(loop, "_scheduled", None)
    if scheduled is None:
        pytest.skip("needs asyncio's default loop to count timer handles")

    def live_timers() -> int:
        return sum(not h.cancelled() for h in scheduled)

    before = live_timers()
    q: WorkQueue[int] = WorkQueue(qname())
    rng = random.Random(1)
    for i in range(20_000):
        q.add_after(i, 100.0 + rng.random() * 100.0)
    assert live_timers() == before + 1
    q.shutdown()
    assert live_timers() == before


async def test_delayed_add_outside_a_loop_is_armed_by_get() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    # Simulate an add made with no running loop: no timer could be scheduled.
    await asyncio.get_running_loop().run_in_executor(None, q.add_after, "a", 0.02)
    assert q._timer is None
    async with asyncio.timeout(10.0):
        assert await q.get() == "a"


# --- waiting getters ---------------------------------------------------------------------


async def test_waiting_getters_each_get_a_distinct_item() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    for item in ["a", "b", "c", "a"]:
        q.add(item)
    async with asyncio.timeout(10.0):
        got = await asyncio.gather(*getters)
    assert sorted(got) == ["a", "b", "c"]


async def test_cancelled_woken_getter_passes_the_wakeup_on() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    first = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("a")  # wakes `first`
    first.cancel()  # ... which is cancelled before it runs
    async with asyncio.timeout(10.0):
        assert await second == "a"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_workers_never_process_a_key_concurrently_and_lose_nothing() -> None:
    q: WorkQueue[int] = WorkQueue(qname())
    in_flight: set[int] = set()
    overlaps: list[int] = []
    last_add: dict[int, int] = {}  # key -> tick of its last add
    last_start: dict[int, int] = {}  # key -> tick at which its last processing started
    ticks = itertools.count(1)
    rng = random.Random(3)
    producing = True
    all_processed = asyncio.Event()

    def add(key: int) -> None:
        last_add[key] = next(ticks)
        q.add(key, priority=rng.choice([LOW_PRIORITY, 0, 1]))

    def every_add_was_processed() -> bool:
        return not in_flight and all(last_start.get(k, 0) > n for k, n in last_add.items())

    async def worker() -> None:
        while True:
            try:
                key = await q.get()
            except QueueShutDownError:
                return
            if key in in_flight:
                overlaps.append(key)
            in_flight.add(key)
            last_start[key] = next(ticks)
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)  # simulated work: let other workers run
                if producing and rng.random() < 0.3:
                    add(rng.randrange(50))  # re-adds, often of keys in flight
            in_flight.discard(key)
            q.done(key)
            if not producing and every_add_was_processed():
                all_processed.set()

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for i in range(2000):
        add(i % 50)
        if i % 7 == 0:
            await asyncio.sleep(0)
    producing = False
    if every_add_was_processed():
        all_processed.set()
    async with asyncio.timeout(5.0):
        await all_processed.wait()
    assert await q.shutdown_with_drain(1.0)
    await asyncio.gather(*workers)
    assert overlaps == []
    assert set(last_start) == set(range(50))


# --- rate limiting -----------------------------------------------------------------------


def test_add_rate_limited_uses_the_limiter_and_forget_resets() -> None:
    clock = FakeClock()
    name = qname()
    limiter: ItemFastSlowRateLimiter[str] = ItemFastSlowRateLimiter(1.0, 10.0, 1)
    q: WorkQueue[str] = WorkQueue(name, rate_limiter=limiter, clock=clock)
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 1
    clock.advance(0.999)
    assert drain_nowait(q) == []
    clock.advance(0.001)
    assert drain_nowait(q) == ["a"]
    q.add_rate_limited("a", priority=LOW_PRIORITY)
    clock.advance(9.999)
    assert drain_nowait(q) == []
    clock.advance(0.001)
    assert drain_nowait(q) == ["a"]
    q.forget("a")
    assert q.num_requeues("a") == 0
    labels = {"name": name, "controller": name}
    assert REGISTRY.get_sample_value("workqueue_retries_total", labels) == 2.0


def test_default_rate_limiter_is_the_controller_default() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock)
    q.add_rate_limited("a")
    clock.advance(0.004)
    assert drain_nowait(q) == []
    clock.advance(0.001)
    assert drain_nowait(q) == ["a"]
    q.add_rate_limited("a")  # second failure: 10 ms
    clock.advance(0.0099)
    assert drain_nowait(q) == []
    clock.advance(0.0001)
    assert drain_nowait(q) == ["a"]


# --- shutdown ----------------------------------------------------------------------------


async def test_shutdown_wakes_getters_and_ignores_adds() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.add_after("later", 0.01)
    q.shutdown()
    assert q.shutting_down
    for getter in getters:
        with pytest.raises(QueueShutDownError):
            await getter
    q.add("a")
    q.add_after("b", 0.01)
    q.add_rate_limited("c")
    assert len(q) == 0
    with pytest.raises(QueueShutDownError):
        await q.get()
    with pytest.raises(QueueShutDownError):
        q.get_nowait()
    q.shutdown()  # idempotent


async def test_shutdown_with_drain_waits_for_in_flight_items() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    for item in ["a", "b", "c"]:
        q.add(item)
    a = await q.get()
    b = await q.get()
    drain = asyncio.create_task(q.shutdown_with_drain(None))
    await asyncio.sleep(0)
    assert not drain.done()
    with pytest.raises(QueueShutDownError):
        await q.get()  # "c" was dropped
    q.add(a)  # ignored: no replay after shutdown
    q.done(a)
    await asyncio.sleep(0)
    assert not drain.done()
    q.done(b)
    async with asyncio.timeout(10.0):
        assert await drain is True
    assert await q.shutdown_with_drain(0.0) is True


async def test_shutdown_with_drain_times_out() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    q.add("a")
    await q.get()
    assert await q.shutdown_with_drain(0.01) is False
    q.done("a")
    assert await q.shutdown_with_drain(0.01) is True


async def test_cancelling_a_drain_leaves_the_queue_draining() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    q.add("a")
    await q.get()
    first = asyncio.create_task(q.shutdown_with_drain(None))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(q.shutdown_with_drain(None))
    await asyncio.sleep(0)
    assert not second.done()
    q.done("a")
    async with asyncio.timeout(10.0):
        assert await second is True


# --- metrics -----------------------------------------------------------------------------


def _sample(metric: str, name: str, **extra: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {"name": name, "controller": name, **extra})


def test_metrics_exact_with_fake_clock() -> None:
    clock = FakeClock()
    name = qname()
    q: WorkQueue[str] = WorkQueue(name, clock=clock)
    q.add("a")
    q.add("a")  # duplicate: not an add
    q.add("b", priority=LOW_PRIORITY)
    q.add_after("c", 5.0)
    assert _sample("workqueue_adds_total", name) == 2.0
    assert _sample("workqueue_depth", name, priority="0") == 1.0
    assert _sample("workqueue_depth", name, priority=str(LOW_PRIORITY)) == 1.0

    clock.advance(2.0)
    assert q.get_nowait() == "a"
    assert _sample("workqueue_queue_duration_seconds_count", name) == 1.0
    assert _sample("workqueue_queue_duration_seconds_sum", name) == 2.0
    assert _sample("workqueue_queue_duration_seconds_bucket", name, le="1.0") == 0.0
    assert _sample("workqueue_queue_duration_seconds_bucket", name, le="10.0") == 1.0
    assert _sample("workqueue_depth", name, priority="0") == 0.0

    clock.advance(1.0)
    assert q.get_nowait() == "b"
    clock.advance(3.0)  # a in flight for 4 s, b for 3 s; c became ready 1 s ago
    assert _sample("workqueue_unfinished_work_seconds", name) == 7.0
    assert _sample("workqueue_longest_running_processor_seconds", name) == 4.0
    q.done("a")
    assert _sample("workqueue_work_duration_seconds_sum", name) == 4.0
    assert _sample("workqueue_unfinished_work_seconds", name) == 3.0
    assert q.get_nowait() == "c"
    assert _sample("workqueue_queue_duration_seconds_sum", name) == 2.0 + 3.0 + 1.0
    assert _sample("workqueue_adds_total", name) == 3.0
    q.done("b")
    q.done("c")
    assert _sample("workqueue_unfinished_work_seconds", name) == 0.0
    assert _sample("workqueue_longest_running_processor_seconds", name) == 0.0
    assert _sample("workqueue_work_duration_seconds_count", name) == 3.0


def test_metrics_labels_and_buckets() -> None:
    name = qname()
    q: WorkQueue[str] = WorkQueue(name, controller="my-controller", clock=FakeClock())
    q.add("a")
    labels = {"name": name, "controller": "my-controller"}
    assert REGISTRY.get_sample_value("workqueue_adds_total", labels) == 1.0
    for le in ["1e-08", "1e-07", "1e-06", "0.001", "1.0", "1000.0", "+Inf"]:
        value = REGISTRY.get_sample_value(
            "workqueue_work_duration_seconds_bucket", {**labels, "le": le}
        )
        assert value == 0.0, le
    buckets = {
        s.labels["le"]
        for m in REGISTRY.collect()
        if m.name == "workqueue_work_duration_seconds"
        for s in m.samples
        if s.name.endswith("_bucket") and s.labels["name"] == name
    }
    assert len(buckets) == 13  # 12 exponential buckets and +Inf


def test_metrics_disabled() -> None:
    name = qname()
    q: WorkQueue[str] = WorkQueue(name, metrics=False, clock=FakeClock())
    q.add("a")
    q.get_nowait()
    q.done("a")
    q.add_rate_limited("a")
    for metric in ["workqueue_adds_total", "workqueue_retries_total", "workqueue_depth"]:
        assert _sample(metric, name) is None
    assert _sample("workqueue_depth", name, priority="0") is None


def test_queues_sharing_labels_are_summed_not_duplicated() -> None:
    clock = FakeClock()
    name = qname()
    q1: WorkQueue[str] = WorkQueue(name, clock=clock)
    q2: WorkQueue[str] = WorkQueue(name, clock=clock)
    q1.add("a")
    q2.add("a")
    q2.add("b")
    assert _sample("workqueue_depth", name, priority="0") == 3.0
    series = [
        s
        for m in REGISTRY.collect()
        if m.name == "workqueue_depth"
        for s in m.samples
        if s.labels["name"] == name
    ]
    assert len(series) == 1


# --- scale -------------------------------------------------------------------------------


def test_heaps_stay_bounded_under_a_long_high_priority_stream() -> None:
    """Lazy deletion must not leak: stale heap entries are compacted."""
    clock = FakeClock()
    q: WorkQueue[int] = WorkQueue(qname(), clock=clock, metrics=False)
    for i in range(5_000):
        q.add(i, priority=LOW_PRIORITY)
    for i in range(5_000, 105_000):
        q.add(i)
        q.add(i, priority=1)  # a priority bump leaves a stale entry too
        q.done(q.get_nowait())
        clock.advance(1e-6)
        live = len(q)
        assert len(q._ready) <= 2 * live + 2 * 1024 + 2
        assert len(q._fifo) <= 2 * live + 2 * 1024 + 2
    assert not any(k < 5_000 for k in q._entries)  # fairness turns took every low item


def test_100k_keys_are_cheap() -> None:
    q: WorkQueue[int] = WorkQueue(qname(), metrics=False)
    start = time.perf_counter()
    for i in range(100_000):
        q.add(i, priority=LOW_PRIORITY if i % 2 else 0)
    for i in range(100_000):
        q.add_after(i + 100_000, 1000.0 + (i % 97))
    for _ in range(100_000):
        q.done(q.get_nowait())
    elapsed = time.perf_counter() - start
    assert len(q) == 0
    # ~0.5 s measured idle, ~1.4 s on a loaded 2-core machine: the bound only catches a
    # complexity regression (quadratic behaviour would take minutes), not a slow machine.
    assert elapsed < 15.0
    q.shutdown()


# --- property: a model-checked state machine ---------------------------------------------

KEYS = st.sampled_from(["a", "b", "c"])
PRIORITIES = st.sampled_from([LOW_PRIORITY, 0, 3])
DELAYS = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.5, 7.0])


@dataclass
class Pending:
    priority: int
    ready_at: float
    seq: int
    rank: tuple[float, int] | None = None  # set by a priority raise while ready


class WorkQueueMachine(RuleBasedStateMachine):
    """Drives a queue and a reference model side by side and compares every hand-out.

    The model is the specification: a hand-out is the eligible item (queued, not in flight,
    ready time passed) with the highest priority, then earliest ready time, then first added
    -- except every n-th hand-out, which takes the earliest ready one regardless of priority.
    An eligible item whose priority is raised ranks in its new level as if ready at the raise.
    """

    FAST, SLOW, MAX_FAST = 0.5, 3.0, 2

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.loop = asyncio.new_event_loop()
        self.pending: dict[str, Pending] = {}
        self.in_flight: set[str] = set()
        self.failures: dict[str, int] = {}
        self.seq = itertools.count()
        self.handouts = 0
        self.shut = False
        self.forced = False
        self.drain: asyncio.Task[bool] | None = None
        self.oldest: tuple[str | None, int] = (None, 0)  # (oldest eligible key, skips)
        self.fresh = itertools.count()
        self.every: int | None = None
        self.steps = 0
        self.q: WorkQueue[str] = WorkQueue("unused")

    @initialize(every=st.sampled_from([None, 1, 2, 3, 10]))
    def make_queue(self, every: int | None) -> None:
        self.every = every
        self.q = WorkQueue(
            qname(),
            oldest_every=every,
            clock=self.clock,
            rate_limiter=ItemFastSlowRateLimiter(self.FAST, self.SLOW, self.MAX_FAST),
        )

    def teardown(self) -> None:
        try:
            if not self.shut:
                self.flush()
        finally:
            if self.drain is not None and not self.drain.done():
                self.drain.cancel()  # the run ended with items still in flight
                with contextlib.suppress(asyncio.CancelledError):
                    self.loop.run_until_complete(self.drain)
            self.loop.close()

    # model helpers

    def model_add(self, key: str, ready_at: float, priority: int) -> None:
        if self.shut:
            return
        p = self.pending.get(key)
        if p is None:
            self.pending[key] = Pending(priority, ready_at, next(self.seq))
        else:
            now = self.clock.now
            if priority > p.priority and key not in self.in_flight and p.ready_at <= now:
                p.rank = (now, next(self.seq))  # to the end of its new level
            p.priority = max(p.priority, priority)
            p.ready_at = min(p.ready_at, ready_at)

    def eligible(self) -> dict[str, Pending]:
        now = self.clock.now
        return {
            k: p for k, p in self.pending.items() if k not in self.in_flight and p.ready_at <= now
        }

    def check_get(self) -> str | None:
        if self.shut:
            with pytest.raises(QueueShutDownError):
                self.q.get_nowait()
            return None
        eligible = self.eligible()
        if not eligible:
            with pytest.raises(asyncio.QueueEmpty):
                self.q.get_nowait()
            return None
        got = self.q.get_nowait()
        assert got not in self.in_flight
        self.handouts += 1
        by_age = min(eligible, key=lambda k: (eligible[k].ready_at, eligible[k].seq))
        if self.every and self.handouts % self.every == 0:
            expected = by_age
        else:
            expected = min(
                eligible,
                key=lambda k: (
                    -eligible[k].priority,
                    *(eligible[k].rank or (eligible[k].ready_at, eligible[k].seq)),
                ),
            )
        assert got == expected, (got, expected, eligible)
        # Starvation bound: while an item is the oldest eligible one, fewer than `every`
        # other items are handed out before it.
        key, skips = self.oldest if self.oldest[0] == by_age else (by_age, 0)
        self.oldest = (key, 0) if got == by_age else (key, skips + 1)
        if self.every:
            assert self.oldest[1] < self.every
        del self.pending[got]
        self.in_flight.add(got)
        return got

    def check_done(self, key: str) -> None:
        self.in_flight.discard(key)
        self.q.done(key)
        if self.drain is not None and not self.in_flight:
            drained = self.loop.run_until_complete(asyncio.wait_for(self.drain, 1.0))
            assert drained is not self.forced

    def flush(self) -> None:
        """No lost adds: once every delay has passed, everything queued comes out."""
        for key in sorted(self.in_flight):
            self.check_done(key)
        self.clock.advance(100.0)
        while (got := self.check_get()) is not None:
            self.check_done(got)
        assert not self.pending
        assert len(self.q) == 0

    # rules

    @rule(key=KEYS, priority=PRIORITIES)
    def add(self, key: str, priority: int) -> None:
        self.model_add(key, self.clock.now, priority)
        self.q.add(key, priority=priority)

    @rule(key=KEYS, delay=DELAYS, priority=PRIORITIES)
    def add_after(self, key: str, delay: float, priority: int) -> None:
        ready_at = self.clock.now + delay if delay > 0 else self.clock.now
        self.model_add(key, ready_at, priority)
        self.q.add_after(key, delay, priority=priority)

    @rule(key=KEYS, priority=PRIORITIES)
    def add_rate_limited(self, key: str, priority: int) -> None:
        if not self.shut:
            n = self.failures[key] = self.failures.get(key, 0) + 1
            delay = self.FAST if n <= self.MAX_FAST else self.SLOW
            self.model_add(key, self.clock.now + delay, priority)
        self.q.add_rate_limited(key, priority=priority)
        assert self.q.num_requeues(key) == self.failures.get(key, 0)

    @rule(key=KEYS)
    def forget(self, key: str) -> None:
        self.failures.pop(key, None)
        self.q.forget(key)

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def get(self) -> None:
        self.check_get()

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        self.check_done(data.draw(st.sampled_from(sorted(self.in_flight))))

    @rule(key=KEYS)
    def done_not_in_flight(self, key: str) -> None:
        if key not in self.in_flight:
            before = len(self.q)
            self.q.done(key)
            assert len(self.q) == before

    @precondition(lambda self: not self.shut)
    @rule(n=st.integers(min_value=1, max_value=25))
    def high_priority_stream(self, n: int) -> None:
        """Fresh high-priority items arriving as fast as they are processed."""
        for _ in range(n):
            key = f"hot-{next(self.fresh)}"
            self.model_add(key, self.clock.now, 10)
            self.q.add(key, priority=10)
            got = self.check_get()
            assert got is not None
            self.check_done(got)

    # Only late in a run: a shutdown ends everything interesting, so an early one would waste
    # most runs.
    @precondition(lambda self: not self.shut and self.steps >= 25)
    @rule()
    def shutdown(self) -> None:
        self.shut = True
        self.pending.clear()
        self.drain = self.loop.create_task(self.q.shutdown_with_drain(None))
        self.loop.run_until_complete(asyncio.sleep(0))
        assert self.q.shutting_down
        assert self.drain.done() == (not self.in_flight)

    @precondition(lambda self: self.drain is not None and not self.drain.done())
    @rule()
    def shutdown_forces_the_drain(self) -> None:
        """client-go: ShutDown after ShutDownWithDrain makes the drain stop waiting."""
        assert self.drain is not None
        self.forced = True
        self.q.shutdown()
        self.loop.run_until_complete(asyncio.sleep(0))
        assert self.drain.done()
        assert self.drain.result() is False  # items were still in flight

    @invariant()
    def count_steps(self) -> None:
        self.steps += 1

    @invariant()
    def ready_count_matches_model(self) -> None:
        if not self.shut:
            assert len(self.q) == len(self.eligible())

    @invariant()
    def queued_items_match_model(self) -> None:
        """White-box: every queued item has the model's priority and ready time, so a wrong
        merge is caught at once rather than only if later steps expose it."""
        entries = self.q._entries
        assert set(entries) == set(self.pending)
        for key, p in self.pending.items():
            assert (entries[key].priority, entries[key].ready_at) == (p.priority, p.ready_at)


TestWorkQueueMachine = WorkQueueMachine.TestCase
TestWorkQueueMachine.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- parity with client-go and controller-runtime ----------------------------------------


def test_raising_the_priority_of_a_queued_item_puts_it_at_the_end_of_the_new_level() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock, oldest_every=None)
    q.add("old", priority=LOW_PRIORITY)  # the oldest item of all
    clock.advance(1.0)
    q.add("h1", priority=5)
    clock.advance(1.0)
    q.add("h2", priority=5)
    clock.advance(1.0)
    q.add("old", priority=5)  # raised: behind h1 and h2, not ahead of them by age
    clock.advance(1.0)
    q.add("h3", priority=5)
    assert drain_nowait(q) == ["h1", "h2", "old", "h3"]


def test_a_raised_item_keeps_its_age_for_the_fairness_turn() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(qname(), clock=clock, oldest_every=2)
    q.add("old", priority=LOW_PRIORITY)
    clock.advance(1.0)
    q.add("h1", priority=5)
    q.add("h2", priority=5)
    q.add("old", priority=5)
    # Hand-out 1 by priority (h1), hand-out 2 the oldest ready item ("old", by its add time).
    assert drain_nowait(q) == ["h1", "old", "h2"]


async def test_shutdown_after_shutdown_with_drain_forces_the_drain_to_stop() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    q.add("a")
    assert await q.get() == "a"
    drain = asyncio.create_task(q.shutdown_with_drain(None))
    await asyncio.sleep(0)
    assert not drain.done()
    q.shutdown()
    assert await asyncio.wait_for(drain, 5.0) is False  # stopped waiting, "a" not done
    q.done("a")  # still accepted
    assert await q.shutdown_with_drain(0.0) is True


async def test_a_forced_drain_does_not_affect_a_later_drain() -> None:
    q: WorkQueue[str] = WorkQueue(qname())
    q.add("a")
    assert await q.get() == "a"
    first = asyncio.create_task(q.shutdown_with_drain(None))
    await asyncio.sleep(0)
    q.shutdown()
    assert await asyncio.wait_for(first, 5.0) is False
    second = asyncio.create_task(q.shutdown_with_drain(None))
    await asyncio.sleep(0)
    assert not second.done()  # waits again, for real
    q.done("a")
    assert await asyncio.wait_for(second, 5.0) is True


def test_adds_total_counts_an_add_made_during_processing_at_once() -> None:
    name = qname()
    q: WorkQueue[str] = WorkQueue(name, clock=FakeClock())
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # "a" is being processed: an add all the same
    assert _sample("workqueue_adds_total", name) == 2.0
    q.add("a")  # a duplicate of the parked add: not another
    q.done("a")  # re-queues it without counting it twice
    assert _sample("workqueue_adds_total", name) == 2.0
    assert q.get_nowait() == "a"
    q.done("a")
    assert _sample("workqueue_adds_total", name) == 2.0


def test_a_delayed_add_during_processing_counts_once_when_it_becomes_ready() -> None:
    clock = FakeClock()
    name = qname()
    q: WorkQueue[str] = WorkQueue(name, clock=clock)
    q.add("a")
    assert q.get_nowait() == "a"
    q.add_after("a", 5.0)
    q.done("a")
    assert _sample("workqueue_adds_total", name) == 1.0
    clock.advance(5.0)
    assert drain_nowait(q) == ["a"]
    assert _sample("workqueue_adds_total", name) == 2.0


def test_retries_total_counts_every_delayed_add() -> None:
    clock = FakeClock()
    name = qname()
    q: WorkQueue[str] = WorkQueue(name, clock=clock)
    q.add_after("a", 1.0)
    q.add_after("a", 2.0)  # deduplicated, still a retry asked for
    q.add_after("b", 0.0)  # no delay: an add, not a retry
    q.add_rate_limited("c")
    assert _sample("workqueue_retries_total", name) == 3.0
    q.shutdown()
    q.add_after("d", 1.0)  # ignored after shutdown
    assert _sample("workqueue_retries_total", name) == 3.0


class _Key:
    """A hashable key that can be weakly referenced."""

    def __init__(self, n: int) -> None:
        self.n = n


def test_an_item_done_with_is_no_longer_referenced_by_the_queue() -> None:
    clock = FakeClock()
    q: WorkQueue[_Key] = WorkQueue(qname(), clock=clock, metrics=False)
    keep = [_Key(-1), _Key(-2)]  # live items keep the heaps non-empty
    for k in keep:
        q.add(k, priority=LOW_PRIORITY)
    keys = [_Key(i) for i in range(40)]
    for i, k in enumerate(keys):
        if i % 4 == 0:
            q.add_after(k, 1.0)
            q.add(k)  # made ready: its waiting entry goes stale
        else:
            q.add(k)
        if i % 4 == 1:
            q.add(k, priority=3)  # raised: its first ready entry goes stale
    clock.advance(2.0)
    finished, parked = 0, set()
    while finished < len(keys):
        got = q.get_nowait()
        if got.n % 4 == 2 and got.n not in parked:
            parked.add(got.n)
            q.add(got)  # added while processing: parked, re-queued by done
        elif got.n >= 0:
            finished += 1
        q.done(got)
        if got.n < 0:
            q.add(got, priority=LOW_PRIORITY)  # the live items stay queued
    refs = [weakref.ref(k) for k in keys]
    del keys, got, k
    gc.collect()
    alive = [r().n for r in refs if r() is not None]  # type: ignore[union-attr]
    assert alive == [], f"the queue still references done items {alive}"
    assert len(q) == 2


def test_memory_does_not_grow_with_the_number_of_distinct_keys_ever_seen() -> None:
    """1M distinct keys through the queue, 10k at a time: the process's RSS ends near
    where it was after the first batch. (Holding on to the keys or their entries would cost
    well over 100 MB.)"""
    process = psutil.Process()
    q: WorkQueue[str] = WorkQueue(qname(), metrics=False)
    batch = 10_000

    def one_batch(start: int) -> None:
        for i in range(start, start + batch):
            q.add(f"key-{i}", priority=i % 3)
        while True:
            try:
                item = q.get_nowait()
            except asyncio.QueueEmpty:
                break
            q.done(item)

    one_batch(0)
    gc.collect()
    baseline = process.memory_info().rss
    for start in range(batch, 1_000_000, batch):
        one_batch(start)
    gc.collect()
    grown = process.memory_info().rss - baseline
    assert grown < 20 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 1M distinct keys"
    assert len(q._ready) == len(q._fifo) == 0
