"""Fences (controller_runtime.fencing): a controller whose fence is down starts no reconcile
and keeps the request; a client write on behalf of such a reconcile is refused before it is
sent; a leader elector's fence counts its deadline from when the renewal was *sent*, so a pause
between the server's write and the answer never stretches it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from controller_runtime.client import _request
from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.fencing import FencedError, check_fence
from controller_runtime.leaderelection import LeaderElectionConfig, LeaderElector
from controller_runtime.ratelimiter import ItemExponentialFailureRateLimiter
from controller_runtime.reconcile import CURRENT_RECONCILE, ReconcileContext, Request

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
    """A transport that records what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
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

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
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
