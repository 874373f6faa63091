"""A runnable that does one pass of work now and then, until stopped (the certificate rotator,
the reloader, the caBundle reader)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger("controller_runtime.webhook")


class Loop:
    """Runs :meth:`_once` at start, then again after the delay it returns; :meth:`poke` runs
    it at once. A pass that raises is logged and retried with backoff (0.5 s doubling to
    30 s): the loop itself never dies of it."""

    name = "loop"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()

    def poke(self) -> None:
        self._poked.set()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self, drain_timeout: float | None) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                delay = await self._once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:
                failures += 1
                delay = min(0.5 * 2 ** (failures - 1), 30.0)
                log.warning(
                    "%s failed (%s: %s); again in %.1fs", self.name, type(err).__name__, err, delay
                )
            self._poked.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(delay, 0.0)):
                    await self._poked.wait()

    async def _once(self) -> float:
        """One pass; returns the seconds until the next one."""
        raise NotImplementedError
