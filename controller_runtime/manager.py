"""The manager: one process's cache, client, controllers, leader election, metrics and health
endpoints, and graceful shutdown.

Lifecycle of :meth:`Manager.run`:

1. Serve ``/metrics`` and ``/healthz``/``/readyz`` (each on its own address; ``None`` or
   ``"0"`` turns one off; port 0 picks a free one, see :attr:`Manager.metrics_url`).
2. Wait for every watched kind's informers to sync (``cache_sync_timeout``, 120 s default;
   the error names the kinds that did not). ``/readyz`` turns ready then. Followers keep
   their caches warm too, so a takeover does not wait for a full sync.
3. With leader election: campaign for the Lease, then start the controllers; without it,
   start them at once.
4. On :meth:`request_stop` (SIGTERM/SIGINT with :func:`run_until_signalled`): stop taking
   new work, let in-flight reconciles finish for up to ``graceful_shutdown_timeout`` (30 s),
   release the Lease, stop the informers, close the connections. A second signal exits at
   once (exit status 1).

Losing leadership stops the controllers at once (in-flight reconciles are cancelled, no
graceful drain) and :meth:`run` raises
:class:`~controller_runtime.leaderelection.LeaderElectionLostError`; the entry point exits
non-zero so that the Pod restarts as a follower, as controller-runtime does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import prometheus_client
from aiohttp import web
from prometheus_client.exposition import generate_latest

from controller_runtime import metrics as cr_metrics
from controller_runtime.builder import GuardFactory
from controller_runtime.cache import ByObject, Cache, KindKey
from controller_runtime.client import Client
from controller_runtime.consistency import ReadYourWritesGuard
from controller_runtime.controller import Controller
from controller_runtime.leaderelection import (
    LeaderElectionConfig,
    LeaderElectionLostError,
    LeaderElector,
)
from controller_runtime.sharding import ShardRing, ShardRingConfig
from informers import metrics as informer_metrics
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport

log = logging.getLogger(__name__)

Check = Callable[[], bool | Awaitable[bool]]
"""A health or readiness check: true when healthy."""


class Runnable(Protocol):
    """Anything the manager starts and stops beside controllers."""

    need_leader_election: bool

    async def start(self) -> None: ...

    async def stop(self, drain_timeout: float | None) -> object: ...


@dataclass(frozen=True)
class ManagerOptions:
    """Manager settings; every field has the default controller-runtime uses.

    ``namespaces``: restrict namespaced kinds to these (``None``: all namespaces).
    ``by_object``: per-kind cache scope and selectors. ``leader_election``: ``None`` to run
    without. ``read_your_writes``: the per-controller consistency guard (on by default).
    ``shard_ring``: join this ring of replicas, for controllers built with
    ``complete_sharded`` (``None``: no sharding); leader election may be on beside it for
    the unsharded controllers.
    """

    namespaces: Sequence[str] | None = None
    by_object: dict[KindKey, ByObject] = field(default_factory=dict)
    leader_election: LeaderElectionConfig | None = None
    shard_ring: ShardRingConfig | None = None
    metrics_bind_address: str | None = "127.0.0.1:8080"
    health_probe_bind_address: str | None = "127.0.0.1:8081"
    graceful_shutdown_timeout: float = 30.0
    cache_sync_timeout: float = 120.0
    read_your_writes: bool = True
    field_manager: str = "controller-runtime-py"


def _split_address(address: str | None) -> tuple[str, int] | None:
    if not address or address == "0":
        return None
    host, _, port = address.rpartition(":")
    # An address without a host (":8080") means every interface, as in controller-runtime.
    return (host or "0.0.0.0"), int(port)


class Manager:
    """Runs controllers against one cluster. See the module docstring for the lifecycle."""

    def __init__(self, config: ClusterConfig, options: ManagerOptions | None = None) -> None:
        self.config = config
        self.options = options = options or ManagerOptions()
        self.transport = Transport(config, observer=informer_metrics.rest_observer(config.server))
        self.factory = InformerFactory(self.transport)
        self.cache = Cache(self.factory, namespaces=options.namespaces, by_object=options.by_object)
        self.client = Client(self.transport, self.cache, field_manager=options.field_manager)
        self.controllers: list[Controller] = []
        self.runnables: list[Runnable] = []
        self.elector: LeaderElector | None = (
            LeaderElector(self.transport, options.leader_election)
            if options.leader_election is not None
            else None
        )
        self._healthz: dict[str, Check] = {"ping": lambda: True}
        self._readyz: dict[str, Check] = {"informers-synced": lambda: self._synced}
        self.shard_ring: ShardRing | None = None
        if options.shard_ring is not None:
            self.shard_ring = ShardRing(self.transport, options.shard_ring)
            self.runnables.append(self.shard_ring)
            self._readyz["shards-synced"] = lambda: (
                self.shard_ring is None or (self.shard_ring.has_synced)
            )
        self._synced = False
        self._stop = asyncio.Event()
        self._runners: list[web.AppRunner] = []
        self.metrics_url: str | None = None
        self.health_url: str | None = None
        self.is_leader = False

    # -- the ControllerHost seam (used by ControllerBuilder) --------------------------------

    @property
    def guard_factory(self) -> GuardFactory | None:
        if not self.options.read_your_writes:
            return None
        return lambda name: ReadYourWritesGuard(name, self.cache)

    def add(self, runnable: Controller | Runnable) -> None:
        """Run ``runnable`` with the manager (controllers only while leading). Adding the
        same object twice has no effect."""
        if isinstance(runnable, Controller):
            if runnable not in self.controllers:
                self.controllers.append(runnable)
        elif runnable not in self.runnables:
            self.runnables.append(runnable)

    def add_healthz_check(self, name: str, check: Check) -> None:
        self._healthz[name] = check

    def add_readyz_check(self, name: str, check: Check) -> None:
        self._readyz[name] = check

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- run --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until :meth:`request_stop`; see the module docstring."""
        try:
            await self._serve()
            for runnable in self.runnables:
                if not runnable.need_leader_election:
                    await runnable.start()
            await self._wait_for_caches()
            if self.elector is None:
                await self._lead()
            else:
                await self._campaign(self.elector)
        finally:
            await self._shutdown()

    async def _wait_for_caches(self) -> None:
        waiting = asyncio.create_task(self.cache.wait_for_sync(self.options.cache_sync_timeout))
        stopping = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if waiting not in done:
            waiting.cancel()
            return
        waiting.result()  # raises CacheSyncTimeoutError naming the kinds
        self._synced = True
        log.info("caches synced: %d kinds", len(self.cache.kinds()))

    async def _campaign(self, elector: LeaderElector) -> None:
        acquiring = asyncio.create_task(elector.run(self._lead), name="leader-election")
        stopping = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if acquiring in done:
                acquiring.result()  # LeaderElectionLostError propagates: exit non-zero
                return
            # Stop requested: if leading, _lead drains and returns, and run() releases.
            if elector.is_leader:
                await acquiring
            else:
                acquiring.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acquiring
        except LeaderElectionLostError:
            log.error("leader election lost; stopping at once")
            raise
        finally:
            stopping.cancel()
            self.is_leader = False

    async def _lead(self) -> None:
        """Start the controllers and leader-only runnables; stop them on request.

        Cancelled (leadership lost): stop everything at once, without a graceful drain.
        """
        self.is_leader = True
        runnables = [r for r in self.runnables if r.need_leader_election]
        started: list[Controller] = []
        try:
            for runnable in runnables:
                await runnable.start()
            for controller in self.controllers:
                await controller.start()
                started.append(controller)
            await self._stop.wait()
            log.info(
                "stopping controllers (up to %.0fs for in-flight reconciles)",
                self.options.graceful_shutdown_timeout,
            )
            timeout = self.options.graceful_shutdown_timeout
            await asyncio.gather(*(c.stop(timeout) for c in started))
            await asyncio.gather(*(r.stop(timeout) for r in runnables))
        except asyncio.CancelledError:
            await asyncio.gather(*(c.stop(0) for c in started), return_exceptions=True)
            await asyncio.gather(*(r.stop(0) for r in runnables), return_exceptions=True)
            raise
        finally:
            self.is_leader = False

    async def _shutdown(self) -> None:
        for controller in self.controllers:
            with contextlib.suppress(Exception):
                await controller.stop(0)
        # A graceful stop lets runnables that run without leadership (a shard ring) drain.
        drain = self.options.graceful_shutdown_timeout if self.stopping else 0
        for runnable in self.runnables:
            with contextlib.suppress(Exception):
                await runnable.stop(0 if runnable.need_leader_election else drain)
        await self.cache.stop()
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
        await self.transport.close()

    # -- HTTP endpoints ---------------------------------------------------------------------

    async def _serve(self) -> None:
        metrics_at = _split_address(self.options.metrics_bind_address)
        health_at = _split_address(self.options.health_probe_bind_address)
        if metrics_at is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._metrics)
            self.metrics_url = await self._start_site(app, metrics_at)
        if health_at is not None:
            app = web.Application()
            app.router.add_get("/healthz", self._health_handler(self._healthz))
            app.router.add_get("/readyz", self._health_handler(self._readyz))
            self.health_url = await self._start_site(app, health_at)

    async def _start_site(self, app: web.Application, at: tuple[str, int]) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, at[0], at[1])
        await site.start()
        self._runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def _metrics(self, request: web.Request) -> web.Response:
        body = b"".join(
            generate_latest(registry)
            for registry in (
                cr_metrics.REGISTRY,
                informer_metrics.REGISTRY,
                prometheus_client.REGISTRY,
            )
        )
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    def _health_handler(
        self, checks: dict[str, Check]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            lines, healthy = [], True
            for name, check in checks.items():
                try:
                    result = check()
                    ok = await result if not isinstance(result, bool) else result
                except Exception as err:  # a broken check is a failing check
                    log.warning("health check %s raised: %s", name, err)
                    ok = False
                healthy = healthy and ok
                lines.append(f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed'}")
            verbose = "verbose" in request.query or not healthy
            text = "\n".join(lines) + "\n" if verbose else "ok"
            return web.Response(status=200 if healthy else 503, text=text)

        return handle


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when it is installed. True if it is in use."""
    try:
        import uvloop  # noqa: PLC0415 (optional)
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def run_until_signalled(manager: Manager) -> None:
    """Run ``manager``; the first SIGTERM/SIGINT stops it gracefully, a second exits at once."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(signum: int) -> None:
        if manager.stopping:
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("received %s: shutting down", signal.Signals(signum).name)
        manager.request_stop()

    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await manager.run()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
