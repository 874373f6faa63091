"""The controller half of ``bench.core``'s ``controller`` stage: informer deltas -> the real
handler -> work queue -> workers -> a no-op reconcile per object."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from controller_runtime import Controller, ControllerOptions, EnqueueRequestForObject, Request
from informers.store import StoreDelta

Sink = Callable[[Sequence[StoreDelta], bool], Awaitable[None]]


async def controller_sink(
    n: int, done: asyncio.Event, workers: int = 1
) -> tuple[Sink, Callable[[], Awaitable[object]]]:
    """A delta sink feeding a started Controller; ``done`` is set after ``n`` reconciles."""
    reconciled = 0

    async def reconcile(request: Request) -> None:
        nonlocal reconciled
        reconciled += 1
        if reconciled >= n:
            done.set()

    controller = Controller(
        "bench-core",
        reconcile,
        options=ControllerOptions(max_concurrent_reconciles=workers, skip_name_validation=True),
    )
    handle = EnqueueRequestForObject().bind(controller.queue)
    await controller.start()

    async def sink(deltas: Sequence[StoreDelta], initial: bool) -> None:
        for delta in deltas:
            handle(delta, initial)

    return sink, controller.stop
