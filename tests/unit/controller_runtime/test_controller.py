"""Controller: result handling, requeues, terminal errors, panics, timeouts, priorities, the
consistency-guard skip path, logging context, lifecycle, and per-key serialisation under a
flood, all in-process (the queue is fed directly, as an informer's handlers would)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import pytest

from controller_runtime import metrics
from controller_runtime.builder import ControllerBuilder, GuardFactory
from controller_runtime.cache import Cache, CacheSyncTimeoutError, NotCachedError
from controller_runtime.controller import (
    Controller,
    ControllerOptions,
    ReconcileLogFilter,
    ReconcileTimeoutError,
    is_panic,
    reconcile_logger,
)
from controller_runtime.handlers import EnqueueRequestsFromMapFunc
from controller_runtime.predicates import GenerationChanged
from controller_runtime.ratelimiter import ItemExponentialFailureRateLimiter
from controller_runtime.reconcile import (
    CURRENT_RECONCILE,
    ReconcileContext,
    Request,
    Result,
    TerminalError,
    current_reconcile,
)
from controller_runtime.workqueue import LOW_PRIORITY
from informers.store import ADDED, MODIFIED, Store, StoreDelta
from kubeclient.discovery import ResourceInfo
from kubeclient.errors import ApiError, NotFoundError

_names = itertools.count()

A = Request("ns", "a")
B = Request("ns", "b")


def cname() -> str:
    """A fresh controller name, so metric series never mix between tests."""
    return f"ctrl-test-{next(_names)}"


def fast_limiter(
    base: float = 0.001, cap: float = 0.05
) -> ItemExponentialFailureRateLimiter[Request]:
    return ItemExponentialFailureRateLimiter(base, cap)


def sample(metric: str, controller: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(metric, {"controller": controller, **labels})
    return value or 0.0


def total(controller: str, result: str) -> float:
    return sample("controller_runtime_reconcile_total", controller, result=result)


class Calls:
    """Records reconcile calls and lets a test await the n-th one."""

    def __init__(self) -> None:
        self.calls: list[tuple[Request, float, ReconcileContext | None]] = []
        self._changed = asyncio.Event()

    def record(self, request: Request) -> int:
        self.calls.append((request, time.monotonic(), current_reconcile()))
        self._changed.set()
        return sum(1 for r, _, _ in self.calls if r == request)

    def of(self, request: Request) -> list[float]:
        return [t for r, t, _ in self.calls if r == request]

    async def wait(self, n: int, request: Request | None = None, timeout: float = 30.0) -> None:
        async def until() -> None:
            while True:
                count = len(self.calls) if request is None else len(self.of(request))
                if count >= n:
                    return
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(until(), timeout)


def make(
    reconcile: Callable[[Request], Awaitable[Result | None]],
    *,
    name: str | None = None,
    workers: int = 1,
    timeout: float | None = None,
    guard: Any = None,
    limiter: ItemExponentialFailureRateLimiter[Request] | None = None,
) -> Controller:
    return Controller(
        name or cname(),
        reconcile,
        options=ControllerOptions(
            max_concurrent_reconciles=workers,
            reconcile_timeout=timeout,
            rate_limiter=limiter or fast_limiter(),
        ),
        guard=guard,
    )


async def test_success_forgets_the_backoff_and_counts() -> None:
    calls = Calls()

    async def reconcile(request: Request) -> Result | None:
        n = calls.record(request)
        if n == 1:
            raise RuntimeError("transient")
        return None if n == 2 else Result()

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    await calls.wait(2)
    ctrl.enqueue(A)
    await calls.wait(3)
    await ctrl.stop()
    assert ctrl.queue.num_requeues(A) == 0  # forgotten after the success
    assert total(ctrl.name, "success") == 2
    assert total(ctrl.name, "error") == 1
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 1
    assert sample("controller_runtime_reconcile_time_seconds_count", ctrl.name) == 3


async def test_requeue_after_forgets_then_requeues_after_the_delay() -> None:
    calls = Calls()
    requeues_seen: list[int] = []

    async def reconcile(request: Request) -> Result | None:
        n = calls.record(request)
        requeues_seen.append(ctrl.queue.num_requeues(request))
        if n == 1:
            raise RuntimeError("fail once")
        if n == 2:
            return Result(requeue_after=0.1)
        return None

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    await calls.wait(3)
    await ctrl.stop()
    t = calls.of(A)
    assert t[2] - t[1] >= 0.1
    # the failure was remembered for the 2nd run and forgotten by requeue_after
    assert requeues_seen == [0, 1, 0]
    assert total(ctrl.name, "requeue_after") == 1
    assert total(ctrl.name, "success") == 1
    assert total(ctrl.name, "requeue") == 0


async def test_zero_requeue_after_is_a_plain_success() -> None:
    calls = Calls()

    async def reconcile(request: Request) -> Result:
        calls.record(request)
        return Result(requeue_after=0)

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    ctrl.enqueue(B)
    await calls.wait(2)
    await ctrl.stop()
    assert total(ctrl.name, "success") == 2 and total(ctrl.name, "requeue_after") == 0


async def test_errors_requeue_with_growing_backoff_and_the_worker_survives() -> None:
    calls = Calls()

    async def reconcile(request: Request) -> None:
        if calls.record(request) <= 3 and request == A:
            raise RuntimeError("boom")

    ctrl = make(reconcile, limiter=fast_limiter(0.02, 1.0))
    await ctrl.start()
    ctrl.enqueue(A)
    ctrl.enqueue(B)
    await calls.wait(4, A)
    await calls.wait(1, B)
    await ctrl.stop()
    t = calls.of(A)
    gaps = [b - a for a, b in itertools.pairwise(t)]
    # 20 ms, 40 ms, 80 ms (the loop timer may fire up to ~1 ms early on some loops)
    for gap, want in zip(gaps, (0.02, 0.04, 0.08), strict=True):
        assert gap >= want - 0.002
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 3
    assert total(ctrl.name, "error") == 3 and total(ctrl.name, "success") == 2
    assert sample("controller_runtime_reconcile_panics_total", ctrl.name) == 0
    assert sample("workqueue_retries_total", ctrl.name, name=ctrl.name) == 3


@pytest.mark.parametrize(
    "error",
    [TerminalError("bad spec"), ExceptionGroup("group", [ValueError("x"), TerminalError("y")])],
    ids=["terminal", "group-with-terminal"],
)
async def test_terminal_errors_are_counted_and_not_requeued(error: Exception) -> None:
    calls = Calls()

    async def reconcile(request: Request) -> None:
        calls.record(request)
        if request == A:
            raise error

    ctrl = make(reconcile)
    requeued: list[Request] = []
    ctrl.queue.add_rate_limited = lambda item, **kw: requeued.append(item)  # type: ignore[method-assign]
    ctrl.queue.add_after = lambda item, delay, **kw: requeued.append(item)  # type: ignore[method-assign]
    await ctrl.start()
    ctrl.enqueue(A)
    ctrl.enqueue(B)
    # One worker: B's reconcile starts only after A's was entirely handled.
    await calls.wait(1, B)
    await ctrl.stop()
    assert requeued == []
    assert len(calls.of(A)) == 1
    assert sample("controller_runtime_terminal_reconcile_errors_total", ctrl.name) == 1
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 1
    assert total(ctrl.name, "error") == 1


@pytest.mark.parametrize(
    ("error", "panic"),
    [
        (KeyError("spec"), True),
        (AttributeError("'NoneType' object has no attribute 'get'"), True),
        (TypeError("unsupported operand"), True),
        (NotCachedError("Secret is not in the cache"), True),
        (ExceptionGroup("g", [OSError("x"), IndexError("y")]), True),
        (RuntimeError("not ready"), False),
        (ValueError("bad value"), False),
        (ApiError(500, "InternalError", "etcd"), False),
        (NotFoundError(404, "NotFound", "gone"), False),
        (ConnectionResetError(), False),
        (TimeoutError(), False),
    ],
)
async def test_panic_mapping(error: Exception, panic: bool) -> None:
    assert is_panic(error) is panic
    calls = Calls()

    async def reconcile(request: Request) -> None:
        if calls.record(request) == 1:
            raise error

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    await calls.wait(2)  # requeued either way
    await ctrl.stop()
    assert sample("controller_runtime_reconcile_panics_total", ctrl.name) == int(panic)
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 1


async def test_a_wrong_return_type_is_a_panic() -> None:
    calls = Calls()

    async def reconcile(request: Request) -> Any:
        return True if calls.record(request) == 1 else None

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    await calls.wait(2)
    await ctrl.stop()
    assert sample("controller_runtime_reconcile_panics_total", ctrl.name) == 1
    assert total(ctrl.name, "error") == 1 and total(ctrl.name, "success") == 1


async def test_a_stray_cancelled_error_does_not_kill_the_worker() -> None:
    calls = Calls()

    async def reconcile(request: Request) -> None:
        if calls.record(request) == 1 and request == A:
            raise asyncio.CancelledError

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    await calls.wait(2)
    ctrl.enqueue(B)
    await calls.wait(1, B)
    await ctrl.stop()
    assert sample("controller_runtime_reconcile_panics_total", ctrl.name) == 1
    assert total(ctrl.name, "success") == 2


async def test_reconcile_timeout_cancels_counts_and_requeues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = Calls()
    cancelled = asyncio.Event()

    async def reconcile(request: Request) -> None:
        n = calls.record(request)
        if n == 1:
            try:
                await asyncio.Event().wait()  # never set: only the timeout ends this
            except asyncio.CancelledError:
                cancelled.set()
                raise
        if n == 2:
            raise TimeoutError("the reconciler's own timeout, not the controller's")

    ctrl = make(reconcile, timeout=0.05)
    with caplog.at_level(logging.ERROR, logger="controller_runtime.controller"):
        await ctrl.start()
        ctrl.enqueue(A)
        await calls.wait(3)
        await ctrl.stop()
    assert cancelled.is_set()
    assert sample("controller_runtime_reconcile_timeouts_total", ctrl.name) == 1
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 2
    assert total(ctrl.name, "success") == 1
    errors = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert isinstance(errors[0], ReconcileTimeoutError)
    assert not isinstance(errors[1], ReconcileTimeoutError)


async def test_the_priority_is_kept_on_every_requeue() -> None:
    calls = Calls()

    async def reconcile(request: Request) -> Result | None:
        n = calls.record(request)
        if n == 1:
            raise RuntimeError("retry")
        if n == 2:
            return Result(requeue_after=0.01)
        return None

    ctrl = make(reconcile)
    handed_out: list[tuple[Request, int]] = []
    get = ctrl.queue.get_with_priority

    async def recording_get() -> tuple[Request, int]:
        item = await get()
        handed_out.append(item)
        return item

    ctrl.queue.get_with_priority = recording_get  # type: ignore[method-assign]
    await ctrl.start()
    ctrl.enqueue(A, priority=LOW_PRIORITY)
    await calls.wait(3)
    await ctrl.stop()
    assert handed_out == [(A, LOW_PRIORITY)] * 3


class FakeGuard:
    """Defers ``deferrals[request]`` checks by ``delay``, then lets the reconcile run."""

    def __init__(self, deferrals: dict[Request, int], delay: float, fail: bool = False) -> None:
        self.deferrals = dict(deferrals)
        self.delay = delay
        self.fail = fail
        self.checks: list[Request] = []

    def check(self, request: Request) -> float | None:
        self.checks.append(request)
        if self.fail:
            raise RuntimeError("guard bug")
        if self.deferrals.get(request, 0) > 0:
            self.deferrals[request] -= 1
            return self.delay
        return None

    def record_write(self, request: Request, resource: Any, obj: Any) -> None:
        pass

    def record_delete(self, request: Request, resource: Any, obj: Any) -> None:
        pass


async def test_guard_defers_the_key_without_blocking_the_worker() -> None:
    calls = Calls()
    guard = FakeGuard({A: 2}, delay=0.05)

    async def reconcile(request: Request) -> None:
        calls.record(request)

    ctrl = make(reconcile, guard=guard)
    handed_out: list[tuple[Request, int]] = []
    get = ctrl.queue.get_with_priority

    async def recording_get() -> tuple[Request, int]:
        item = await get()
        handed_out.append(item)
        return item

    ctrl.queue.get_with_priority = recording_get  # type: ignore[method-assign]
    await ctrl.start()
    started = time.monotonic()
    ctrl.enqueue(A, priority=LOW_PRIORITY)
    ctrl.enqueue(B, priority=LOW_PRIORITY)
    await calls.wait(1, A)
    await ctrl.stop()
    # one worker, yet B ran while A was deferred; A ran after two deferrals of 50 ms
    assert [r for r, _, _ in calls.calls] == [B, A]
    assert calls.of(A)[0] - started >= 0.1 - 0.002
    assert guard.checks == [A, B, A, A]
    assert all(p == LOW_PRIORITY for _, p in handed_out)
    assert sample("controller_runtime_stale_skips_total", ctrl.name) == 2
    assert total(ctrl.name, "success") == 2  # skips are not reconciles
    ctx = calls.calls[1][2]
    assert ctx is not None and ctx.guard is guard


async def test_a_failing_guard_fails_open() -> None:
    calls = Calls()
    ctrl = make(lambda r: _record(calls, r), guard=FakeGuard({}, 1.0, fail=True))
    await ctrl.start()
    ctrl.enqueue(A)
    await calls.wait(1)
    await ctrl.stop()
    assert sample("controller_runtime_stale_skips_total", ctrl.name) == 0


async def _record(calls: Calls, request: Request) -> None:
    calls.record(request)


async def test_reconcile_context_and_structured_logs(caplog: pytest.LogCaptureFixture) -> None:
    calls = Calls()
    user_log = logging.getLogger("tests.reconciler")

    async def reconcile(request: Request) -> None:
        calls.record(request)
        reconcile_logger(user_log).info("from the adapter")
        user_log.info("from a plain logger")
        raise TerminalError("for the log")

    ctrl = make(reconcile)
    log_filter = ReconcileLogFilter()
    caplog.handler.addFilter(log_filter)
    try:
        with caplog.at_level(logging.INFO):
            await ctrl.start()
            ctrl.enqueue(A)
            ctrl.enqueue(B)
            await calls.wait(2)
            await ctrl.stop()
    finally:
        caplog.handler.removeFilter(log_filter)
    contexts = [ctx for _, _, ctx in calls.calls]
    assert all(ctx is not None and ctx.controller == ctrl.name for ctx in contexts)
    assert [ctx.request for ctx in contexts if ctx] == [A, B]
    ids = [ctx.reconcile_id for ctx in contexts if ctx]
    assert len(set(ids)) == 2 and all(ids)
    assert CURRENT_RECONCILE.get() is None
    for message in ("from the adapter", "from a plain logger", "Terminal reconciler error"):
        records = [r for r in caplog.records if r.getMessage().startswith(message)]
        assert len(records) == 2, message
        for record, request, rid in zip(records, (A, B), ids, strict=True):
            assert record.__dict__["controller"] == ctrl.name
            assert record.__dict__["namespace"] == request.namespace
            assert record.__dict__["object_name"] == request.name
            assert record.__dict__["reconcile_id"] == rid
    # outside a reconcile the adapter adds nothing
    assert reconcile_logger().extra == {}


async def test_no_key_is_reconciled_concurrently_under_a_flood() -> None:
    """A fake source floods 8 workers with adds of 5 keys; the reconciler checks, per key,
    that no other reconcile of it is in flight."""
    keys = [Request("ns", f"k{i}") for i in range(5)]
    version = dict.fromkeys(keys, 0)  # bumped by the source before each add
    seen = dict.fromkeys(keys, -1)  # the version each key's latest reconcile started at
    in_flight: set[Request] = set()
    violations: list[Request] = []
    max_parallel = 0
    reconciles = 0
    source_done = False
    all_seen = asyncio.Event()
    rng = random.Random(7)

    async def reconcile(request: Request) -> None:
        nonlocal max_parallel, reconciles
        reconciles += 1
        if request in in_flight:
            violations.append(request)
        in_flight.add(request)
        max_parallel = max(max_parallel, len(in_flight))
        seen[request] = version[request]
        try:
            for _ in range(rng.randrange(4)):
                await asyncio.sleep(0)
        finally:
            in_flight.discard(request)
        if source_done and seen == version:
            all_seen.set()

    ctrl = make(reconcile, workers=8)
    await ctrl.start()
    adds = 20_000
    for i in range(adds):
        key = keys[rng.randrange(len(keys))]
        version[key] += 1
        ctrl.enqueue(key)
        if i % 7 == 0:
            await asyncio.sleep(0)
    source_done = True
    # a key re-added while in flight is reconciled once more after it: wait for all to catch up
    await asyncio.wait_for(all_seen.wait(), 10)
    await ctrl.stop()
    assert violations == []
    assert max_parallel > 1  # workers did run different keys concurrently
    assert reconciles < adds  # adds to a queued or in-flight key were coalesced


async def test_stop_drains_in_flight_reconciles() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    finished: list[Request] = []

    async def reconcile(request: Request) -> None:
        entered.set()
        await release.wait()
        finished.append(request)

    ctrl = make(reconcile)
    await ctrl.start()
    ctrl.enqueue(A)
    await entered.wait()
    ctrl.enqueue(B)  # queued behind A: dropped by stop
    stopping = asyncio.create_task(ctrl.stop(drain_timeout=5))
    await asyncio.sleep(0)
    assert not stopping.done()
    release.set()
    assert await stopping is True
    assert finished == [A]
    ctrl.enqueue(B)  # ignored once stopped
    assert len(ctrl.queue) == 0
    assert ctrl.active_workers == 0
    assert await ctrl.stop() is True  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        await ctrl.start()


async def test_stop_cancels_reconciles_that_outlive_the_drain_timeout() -> None:
    entered = asyncio.Event()
    cancelled: list[Request] = []

    async def reconcile(request: Request) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(request)
            raise

    ctrl = make(reconcile, workers=2)
    await ctrl.start()
    ctrl.enqueue(A)
    await entered.wait()
    assert await ctrl.stop(drain_timeout=0.05) is False
    assert cancelled == [A]
    assert ctrl.active_workers == 0
    assert sample("controller_runtime_active_workers", ctrl.name) == 0
    # a cancellation by stop is not a reconcile outcome
    assert sample("controller_runtime_reconcile_errors_total", ctrl.name) == 0


async def test_metrics_gauges() -> None:
    inside: list[float] = []
    done = asyncio.Event()
    name = cname()

    async def reconcile(request: Request) -> None:
        inside.append(sample("controller_runtime_active_workers", name))
        done.set()

    ctrl = make(reconcile, name=name, workers=3)
    assert sample("controller_runtime_max_concurrent_reconciles", name) == 3
    # every result series exists at 0 before the first reconcile
    for result in ("success", "error", "requeue", "requeue_after"):
        value = metrics.REGISTRY.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": name, "result": result}
        )
        assert value == 0.0
    await ctrl.start()
    ctrl.enqueue(A)
    await done.wait()
    await ctrl.stop()
    assert inside == [1.0]
    assert sample("controller_runtime_active_workers", name) == 0


def test_controller_names_are_unique_per_process() -> None:
    async def reconcile(request: Request) -> None:
        return None

    name = cname()
    Controller(name, reconcile)
    with pytest.raises(ValueError, match="already runs"):
        Controller(name, reconcile)
    Controller(name, reconcile, options=ControllerOptions(skip_name_validation=True))
    with pytest.raises(ValueError):
        Controller("", reconcile)


def test_reconciler_shapes() -> None:
    class TaskReconciler:
        async def reconcile(self, request: Request) -> Result | None:
            return None

    Controller(cname(), TaskReconciler())

    def blocking(request: Request) -> None:
        return None

    with pytest.raises(TypeError, match="async def"):
        Controller(cname(), blocking)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Controller(cname(), 42)  # type: ignore[arg-type]


def test_options_validation() -> None:
    with pytest.raises(ValueError):
        ControllerOptions(max_concurrent_reconciles=0)
    with pytest.raises(ValueError):
        ControllerOptions(reconcile_timeout=0)


async def test_a_class_based_reconciler_runs() -> None:
    calls = Calls()

    class TaskReconciler:
        async def reconcile(self, request: Request) -> Result | None:
            calls.record(request)
            return None

    ctrl = Controller(cname(), TaskReconciler())
    async with ctrl:
        ctrl.enqueue(A, after=0.01)
        await calls.wait(1)
    assert total(ctrl.name, "success") == 1


class _NeverSynced:
    """Stands in for an informer registration whose initial list never arrives."""

    has_synced = False

    class informer:  # noqa: N801 - mimics the attribute of a Registration
        description = "tasks.crpy.io/v1 in ns"

    async def wait_synced(self) -> None:
        await asyncio.Event().wait()

    def remove(self) -> None:
        pass


async def test_start_times_out_when_sources_do_not_sync() -> None:
    async def reconcile(request: Request) -> None:
        return None

    ctrl = Controller(cname(), reconcile, options=ControllerOptions(cache_sync_timeout=0.05))
    ctrl._registrations.append(_NeverSynced())  # type: ignore[arg-type]
    with pytest.raises(CacheSyncTimeoutError, match=r"tasks\.crpy\.io/v1 in ns"):
        await ctrl.start()
    assert not ctrl.started
    await ctrl.stop()


# --- builder (over a fake informer factory; the integration tests use the real one) ---------


class _FakeRegistration:
    has_synced = True

    async def wait_synced(self) -> None:
        return None

    def remove(self) -> None:
        pass


class _FakeInformer:
    def __init__(self, resource: ResourceInfo) -> None:
        self.resource = resource
        self.handlers: list[Callable[[StoreDelta, bool], None]] = []
        self.synced = asyncio.Event()
        self.synced.set()
        self.description = f"{resource.kind} ({resource.api_version})"
        self.store = Store()  # what cache_bytes{kind} reads at a scrape

    @property
    def has_synced(self) -> bool:
        return self.synced.is_set()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        await self.synced.wait()
        return True

    def add_handler(self, fn: Callable[[StoreDelta, bool], None]) -> _FakeRegistration:
        self.handlers.append(fn)
        return _FakeRegistration()


class _FakeDiscovery:
    KINDS: dict[tuple[str, str], ResourceInfo] = {
        ("tasks.crpy.io/v1", "Task"): ResourceInfo("tasks.crpy.io", "v1", "Task", "tasks", True),
        ("v1", "ConfigMap"): ResourceInfo("", "v1", "ConfigMap", "configmaps", True),
        ("v1", "Secret"): ResourceInfo("", "v1", "Secret", "secrets", True),
        ("v1", "Node"): ResourceInfo("", "v1", "Node", "nodes", False),
        ("v1", "Pod"): ResourceInfo("", "v1", "Pod", "pods", True),
    }

    async def resolve(
        self,
        api_version: str,
        kind: str,
        *,
        wait_for_server: bool = False,
        wait_timeout: float | None = None,
    ) -> ResourceInfo:
        try:
            return self.KINDS[(api_version, kind)]
        except KeyError:
            raise NotFoundError(404, "NotFound", f"{kind} {api_version}") from None


class _FakeFactory:
    def __init__(self) -> None:
        self.discovery = _FakeDiscovery()
        self.informers: dict[str, _FakeInformer] = {}

    async def informer(self, api_version: str, kind: str, **_: Any) -> _FakeInformer:
        resource = await self.discovery.resolve(api_version, kind)
        return self.informers.setdefault(kind, _FakeInformer(resource))


class _Host:
    def __init__(self, cache: Cache, guard_factory: GuardFactory | None) -> None:
        self.cache = cache
        self.guard_factory = guard_factory
        self.added: list[Controller] = []

    def add(self, controller: Controller) -> None:
        self.added.append(controller)


def _fake_cache() -> tuple[Cache, _FakeFactory]:
    factory = _FakeFactory()
    return Cache(factory), factory  # type: ignore[arg-type]


async def _noop(request: Request) -> None:
    return None


def _owned(name: str, owner: str, *, controller: bool = True, ns: str = "ns") -> dict[str, Any]:
    ref = {"apiVersion": "tasks.crpy.io/v1", "kind": "Task", "name": owner, "uid": "u"}
    ref["controller"] = controller  # type: ignore[assignment]
    return {"metadata": {"name": name, "namespace": ns, "ownerReferences": [ref]}}


async def test_builder_wires_for_owns_watches_and_filters() -> None:
    cache, factory = _fake_cache()

    def secret_to_tasks(obj: Mapping[str, Any]) -> list[Request]:
        return [
            Request("ns", t) for t in obj["metadata"].get("labels", {}).get("tasks", "").split()
        ]

    name = cname()
    ctrl = await (
        ControllerBuilder(cache)
        .named(name)
        .for_("tasks.crpy.io/v1", "Task", predicates=[GenerationChanged()])
        .owns("v1", "ConfigMap")
        .watches("v1", "Secret", EnqueueRequestsFromMapFunc(secret_to_tasks))
        .with_event_filter(lambda d: d.obj["metadata"].get("labels", {}).get("skip") != "1")
        .with_options(max_concurrent_reconciles=3)
        .complete(_noop)
    )
    assert ctrl.name == name and ctrl.options.max_concurrent_reconciles == 3
    assert ctrl.guard is None and not ctrl.started
    task, cm, secret = (factory.informers[k].handlers for k in ("Task", "ConfigMap", "Secret"))
    assert len(task) == len(cm) == len(secret) == 1

    task[0](StoreDelta(ADDED, {"metadata": {"name": "t1", "namespace": "ns"}}), True)
    old = orjson.dumps({"metadata": {"name": "t2", "namespace": "ns", "generation": 1}})
    task[0](
        StoreDelta(MODIFIED, {"metadata": {"name": "t2", "namespace": "ns", "generation": 1}}, old),
        False,
    )
    cm[0](StoreDelta(ADDED, _owned("cm1", "t3")), False)
    cm[0](StoreDelta(ADDED, _owned("cm2", "t4", controller=False)), False)  # not the controller
    secret[0](
        StoreDelta(
            ADDED, {"metadata": {"name": "s", "namespace": "ns", "labels": {"tasks": "t5 t6"}}}
        ),
        False,
    )
    skipped = {"metadata": {"name": "t7", "namespace": "ns", "labels": {"skip": "1"}}}
    task[0](StoreDelta(ADDED, skipped), False)  # the global event filter

    queued = []
    while True:
        try:
            queued.append(ctrl.queue.get_nowait())
        except asyncio.QueueEmpty:
            break
    # fresh changes (priority 0) first, the initial-list t1 last
    assert queued == [Request("ns", n) for n in ("t3", "t5", "t6", "t1")]
    await ctrl.stop()


async def test_builder_caches_a_kind_for_reads_and_start_waits_for_it() -> None:
    cache, factory = _fake_cache()
    ctrl = await (
        ControllerBuilder(cache)
        .named(cname())
        .for_("tasks.crpy.io/v1", "Task")
        .caches("v1", "Secret")
        .complete(_noop)
    )
    secrets = factory.informers["Secret"]
    assert cache.watched("v1", "Secret") is not None  # cached: the reconciler can read it
    assert secrets.handlers == []  # and nothing of it is mapped to requests
    secrets.synced.clear()  # its initial list has not arrived yet
    starting = asyncio.create_task(ctrl.start())
    for _ in range(5):  # let start() reach its wait; it must not start the workers yet
        await asyncio.sleep(0)
    assert not starting.done() and not ctrl._workers
    secrets.synced.set()
    await asyncio.wait_for(starting, 5)
    assert ctrl._workers
    await ctrl.stop()


async def test_a_cached_kind_that_never_syncs_is_named_by_the_start_timeout() -> None:
    cache, factory = _fake_cache()
    ctrl = await (
        ControllerBuilder(cache)
        .named(cname())
        .for_("tasks.crpy.io/v1", "Task")
        .caches("v1", "Secret")
        .with_options(cache_sync_timeout=0.05)
        .complete(_noop)
    )
    factory.informers["Secret"].synced.clear()
    with pytest.raises(CacheSyncTimeoutError, match=r"Secret \(v1\)"):
        await ctrl.start()
    await ctrl.stop()


async def test_builder_with_a_host_uses_its_guard_factory_and_hands_over_the_controller() -> None:
    cache, factory = _fake_cache()
    made: list[str] = []

    def guard_factory(controller_name: str) -> FakeGuard:
        made.append(controller_name)
        return FakeGuard({}, 0.0)

    host = _Host(cache, guard_factory)
    ctrl = await (
        ControllerBuilder(host)
        .for_("v1", "Node")
        .owns("v1", "Pod", only_controller=False)
        .with_options(ControllerOptions(skip_name_validation=True), reconcile_timeout=5.0)
        .complete(_noop)
    )
    assert host.added == [ctrl]
    assert ctrl.name == "node" and made == ["node"] and isinstance(ctrl.guard, FakeGuard)
    assert ctrl.options.reconcile_timeout == 5.0 and ctrl.options.skip_name_validation
    # Nodes are cluster-scoped: the owner request has no namespace
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}],
        }
    }
    factory.informers["Pod"].handlers[0](StoreDelta(ADDED, pod), False)
    assert ctrl.queue.get_nowait() == Request("", "n1")
    await ctrl.stop()


async def test_builder_rejects_incomplete_or_conflicting_configurations() -> None:
    cache, factory = _fake_cache()
    with pytest.raises(ValueError, match="for_"):
        await ControllerBuilder(cache).complete(_noop)
    with pytest.raises(ValueError, match="owns"):
        await ControllerBuilder(cache).named(cname()).owns("v1", "Pod").complete(_noop)
    with pytest.raises(ValueError, match="already"):
        ControllerBuilder(cache).for_("v1", "Pod").for_("v1", "Secret")
    with pytest.raises(TypeError, match="EnqueueRequestsFromMapFunc"):
        ControllerBuilder(cache).watches("v1", "Pod", lambda o: [])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ControllerBuilder(cache).named("")
    name = cname()
    await ControllerBuilder(cache).named(name).for_("v1", "Pod").complete(_noop)
    registered = len(factory.informers["Secret"].handlers) if "Secret" in factory.informers else 0
    with pytest.raises(ValueError, match="already runs"):
        await ControllerBuilder(cache).named(name).for_("v1", "Secret").complete(_noop)
    # the name was checked before anything was watched or registered
    assert (
        "Secret" not in factory.informers or len(factory.informers["Secret"].handlers) == registered
    )
    # an unknown kind fails the build before the name is taken or a handler registered
    other = cname()
    with pytest.raises(NotFoundError):
        await (
            ControllerBuilder(cache)
            .named(other)
            .for_("v1", "Pod")
            .owns("v9", "Nope")
            .complete(_noop)
        )
    await ControllerBuilder(cache).named(other).for_("v1", "Pod").complete(_noop)
    builder = ControllerBuilder(cache).named(cname()).for_("v1", "Pod")
    await builder.complete(_noop)
    with pytest.raises(RuntimeError, match="already built"):
        await builder.complete(_noop)


class _LimiterThatFailsOnce(ItemExponentialFailureRateLimiter[Request]):
    """A rate limiter whose first ``when`` raises: a failure in the worker's own path, outside
    the reconcile."""

    def __init__(self) -> None:
        super().__init__(0.001, 0.05)
        self.raised = False

    def when(self, item: Request) -> float:
        if not self.raised:
            self.raised = True
            raise ValueError("injected: the rate limiter broke")
        return super().when(item)


async def test_a_worker_survives_an_exception_outside_the_reconcile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = Calls()

    async def reconcile(request: Request) -> None:
        if calls.record(request) == 1 and request == A:
            raise RuntimeError("fails once, so the rate limiter is asked for a delay")

    failures = "controller_runtime_task_failures_total"
    before = metrics.REGISTRY.get_sample_value(failures, {"task": "controller-worker"}) or 0.0
    limiter = _LimiterThatFailsOnce()
    ctrl = make(reconcile, workers=1, limiter=limiter)
    await ctrl.start()
    try:
        with caplog.at_level(logging.ERROR, logger="controller_runtime.controller"):
            ctrl.enqueue(A)
            await calls.wait(1, A)
            ctrl.enqueue(B)
            # The only worker is still alive: B is reconciled, and A is retried.
            await calls.wait(1, B, timeout=30)
            await calls.wait(2, A, timeout=30)
    finally:
        await ctrl.stop()
    assert limiter.raised
    after = metrics.REGISTRY.get_sample_value(failures, {"task": "controller-worker"})
    assert after == before + 1
    failed = [r for r in caplog.records if "outside the reconcile" in r.getMessage()]
    assert failed and failed[0].exc_info is not None
    assert "the rate limiter broke" in str(failed[0].exc_info[1])
