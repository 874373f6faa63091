"""Fences (controller_runtime.fencing): a controller whose fence is down starts no reconcile
and keeps the request; a client write on behalf of such a reconcile is refused before it is
sent, and again before each time the transport sends it; work started inside ``fenced_by``
(leader-only runnables) and Events it records are fenced too; a leader elector's fence counts
its deadline from when the renewal was *sent*, so a pause between the server's write and the
answer never stretches it, and a renewal is not sent past the deadline."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from controller_runtime.client import _request
from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.fencing import FencedError, check_fence, current_fence, fenced_by
from controller_runtime.leaderelection import LeaderElectionConfig, LeaderElector
from controller_runtime.ratelimiter import ItemExponentialFailureRateLimiter
from controller_runtime.reconcile import CURRENT_RECONCILE, ReconcileContext, Request
from controller_runtime.util.events import EventRecorder
from kubeclient.transport import Transport

_names = itertools.count()
A = Request("ns", "a")


class Switch:
    """A fence a test opens and closes; ``asked`` is set whenever it is consulted."""

    def __init__(self, up: bool) -> None:
        self.up = up
        self.asked = asyncio.Event()

    def holds(self) -> bool:
        self.asked.set()
        return self.up

    def describe(self) -> str:
        return "the test's switch"


async def test_a_controller_whose_fence_is_down_starts_no_reconcile_and_keeps_the_request() -> None:
    fence = Switch(up=False)
    reconciled: list[Request] = []
    seen = asyncio.Event()

    async def reconcile(request: Request) -> None:
        reconciled.append(request)
        seen.set()

    ctrl = Controller(
        f"fence-test-{next(_names)}",
        reconcile,
        options=ControllerOptions(rate_limiter=ItemExponentialFailureRateLimiter(0.001, 0.01)),
        fence=fence,
    )
    await ctrl.start()
    try:
        ctrl.enqueue(A)
        await asyncio.wait_for(fence.asked.wait(), 10)
        assert reconciled == [] and not ctrl.active_workers
        fence.up = True  # held again (or by the process that holds it): it is reconciled
        await asyncio.wait_for(seen.wait(), 10)
        assert reconciled == [A]
    finally:
        await ctrl.stop()


class Recording:
    """A transport that records what it was asked to send; like the real one, it calls the
    request's ``before_send`` right before sending (``attempts`` times: retries)."""

    def __init__(self, attempts: int = 1) -> None:
        self.sent: list[str] = []
        self.attempts = attempts
        self.between: list[Any] = []  # called between two attempts (a Retry-After sleep)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        check = kwargs.get("before_send")
        for attempt in range(self.attempts):
            if attempt:
                for step in self.between:
                    step()
            if check is not None:
                check()
            self.sent.append(method)
        return None


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
async def test_a_write_of_a_fenced_reconcile_is_never_sent(method: str) -> None:
    transport = Recording()
    fence = Switch(up=False)
    token = CURRENT_RECONCILE.set(ReconcileContext("c", A, "id", fence=fence))
    try:
        with pytest.raises(FencedError, match="the test's switch is no longer held"):
            await _request(transport, method, "/api/v1/namespaces/ns/configmaps/a")  # type: ignore[arg-type]
        await _request(transport, "GET", "/api/v1/namespaces/ns/configmaps/a")  # type: ignore[arg-type]
        fence.up = True
        await _request(transport, method, "/api/v1/namespaces/ns/configmaps/a")  # type: ignore[arg-type]
    finally:
        CURRENT_RECONCILE.reset(token)
    assert transport.sent == ["GET", method]
    check_fence(None)  # no fence: nothing to check


class PausingTransport:
    """A Lease server in memory whose PUT answer is read only after the process was
    "paused": the clock jumps forward between the server's write and the answer."""

    def __init__(self, clock: list[float], pause: float) -> None:
        self.clock = clock
        self.pause = pause
        self.rv = 0
        self.spec: dict[str, Any] | None = None

    def _lease(self) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": str(self.rv)}, "spec": self.spec}

    async def get_json(self, path: str) -> dict[str, Any]:
        return self._lease()

    checks = False  # call the request's before_send, as the real transport does

    async def request(
        self, method: str, path: str, *, body: Any = None, before_send: Any = None, **_: Any
    ) -> Any:
        if self.checks and before_send is not None:
            before_send()
        self.rv += 1
        self.spec = body["spec"]
        self.clock[0] += self.pause  # written at the old time, answered after the pause
        answer = self._lease()

        class Answer:
            def json(self) -> dict[str, Any]:
                return answer

        return Answer()


async def test_a_leaders_deadline_counts_from_when_its_renewal_was_sent() -> None:
    """The server writes the renewal at t=0; the process is paused for 12 s before it reads
    the answer. Another process sees the Lease change at t=0 and may take it over at t=15;
    so this leader must count its deadline (10 s) from t=0: at t=12 it no longer holds."""
    clock = [0.0]
    transport = PausingTransport(clock, pause=12.0)
    transport.spec = {}
    config = LeaderElectionConfig(namespace="ns", name="lease", identity="me")
    elector = LeaderElector(transport, config, clock=lambda: clock[0])  # type: ignore[arg-type]
    await elector.acquire()
    assert elector.is_leader and clock[0] == 12.0
    assert elector.renewed_at == 0.0
    assert not elector.holds()
    assert elector.describe() == "leadership of ns/lease"
    transport.pause = 0.0
    await elector.acquire()
    assert elector.holds()


async def test_a_write_is_checked_again_before_each_time_the_transport_sends_it() -> None:
    """The transport sends twice (a 429 and its retry); the fence goes down in between: the
    retry is not sent."""
    transport = Recording(attempts=2)
    fence = Switch(up=True)
    transport.between.append(lambda: setattr(fence, "up", False))
    token = CURRENT_RECONCILE.set(ReconcileContext("c", A, "id", fence=fence))
    try:
        with pytest.raises(FencedError):
            await _request(transport, "PATCH", "/api/v1/namespaces/ns/configmaps/a")  # type: ignore[arg-type]
    finally:
        CURRENT_RECONCILE.reset(token)
    assert transport.sent == ["PATCH"]


async def test_work_started_inside_fenced_by_writes_only_while_the_fence_holds() -> None:
    """What a leader-only runnable starts inherits the manager's fence (tasks copy the
    context), and a reconcile's own fence wins over it."""
    transport = Recording()
    ambient = Switch(up=False)
    with fenced_by(ambient):
        task = asyncio.get_running_loop().create_task(
            _request(transport, "POST", "/api/v1/namespaces/ns/configmaps")  # type: ignore[arg-type]
        )
    assert current_fence() is None
    with pytest.raises(FencedError, match="the test's switch"):
        await task
    reconciling = Switch(up=True)
    with fenced_by(ambient):
        token = CURRENT_RECONCILE.set(ReconcileContext("c", A, "id", fence=reconciling))
        try:
            assert current_fence() is reconciling
            await _request(transport, "POST", "/api/v1/namespaces/ns/configmaps")  # type: ignore[arg-type]
        finally:
            CURRENT_RECONCILE.reset(token)
    assert transport.sent == ["POST"]


async def test_an_event_recorded_by_fenced_work_is_written_only_while_its_fence_holds() -> None:
    class RecordingTransport(Transport):
        def __init__(self) -> None:  # no session: nothing is sent
            self.sent: list[str] = []

        async def request(self, method: str, path: str, **kwargs: Any) -> Any:
            kwargs["before_send"]()
            self.sent.append(method)

    transport = RecordingTransport()
    fence = Switch(up=True)
    recorder = EventRecorder(
        transport, reporting_controller="crpy.io/test", reporting_instance="test"
    )
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}}
    with fenced_by(fence):
        recorder.record(obj, "Normal", "Written", "while held", "Test")
    await recorder.flush()
    assert transport.sent == ["POST"] and recorder.dropped == 0
    fence.up = False
    with fenced_by(fence):
        recorder.record(obj, "Normal", "Dropped", "after the lease was lost", "Test")
    await recorder.flush()
    assert transport.sent == ["POST"] and recorder.dropped == 1
    await recorder.close()


async def test_a_leaders_renewal_is_not_sent_past_its_deadline() -> None:
    """A renewal that began before the deadline but would be sent (again) after it, e.g.
    after a pause during a Retry-After sleep, is refused: the leader steps down instead."""
    clock = [0.0]
    transport = PausingTransport(clock, pause=0.0)
    transport.spec = {}
    config = LeaderElectionConfig(namespace="ns", name="lease", identity="me")
    elector = LeaderElector(transport, config, clock=lambda: clock[0])  # type: ignore[arg-type]
    await elector.acquire()
    assert elector.holds()
    sent_before = transport.rv
    transport.checks = True
    clock[0] = config.renew_deadline + 1.0  # paused past the deadline
    assert not await elector._attempt(5.0)
    assert transport.rv == sent_before, "the renewal was sent past the deadline"
