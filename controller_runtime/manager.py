"""The manager: one process's cache, client, controllers, leader election, metrics and health
endpoints, and graceful shutdown.

Creating a :class:`Manager` opens nothing (no connection, no task, no socket): the first
request opens the connection pool (usually the builder's discovery of a kind), and
:meth:`Manager.run` the servers. Everything is closed on every path: at the end of
:meth:`Manager.run`, however it ends, and by :meth:`Manager.close` (or leaving
``async with Manager(...) as manager:``) when ``run`` is never reached, e.g. because building
a controller failed. Use ``async with``: a program that fails before ``run`` then leaves no
"Unclosed client session" behind.

Lifecycle of :meth:`Manager.run`:

1. Serve ``/metrics`` and ``/healthz``/``/readyz`` (each on its own address; ``None`` or
   ``"0"`` turns one off; port 0 picks a free one, see :attr:`Manager.metrics_url`), and log
   the addresses actually bound in one line. The informers the controllers' builders started
   send their first requests first (the servers start once those are written, at most 0.1 s
   later), so that the API server answers while the servers start.
2. Wait for every watched kind's informers to sync (``cache_sync_timeout``, 120 s default;
   the error names the kinds that did not). ``/readyz`` turns ready then. Followers keep
   their caches warm too, so a takeover does not wait for a full sync. From then on the
   ``informers-healthy`` readiness check fails while any started informer is not
   :attr:`~informers.shared.SharedInformer.healthy` (its reflector crashed and has not relisted
   yet, or a kind added later has not synced). Readiness, not liveness: the informer restarts
   its reflector itself, and a Pod restart would only throw away every other cache (and the
   Lease) to repair what the process already repairs.
3. With leader election: campaign for the Lease, then start the controllers; without it,
   start them at once.
4. On :meth:`request_stop` (SIGTERM/SIGINT with :func:`run_until_signalled`): stop taking
   new work, let in-flight reconciles finish for up to ``graceful_shutdown_timeout`` (30 s),
   flush the event recorders (:meth:`Manager.event_recorder`), release the Lease, stop the
   informers, close the connections. A second signal exits at once (exit status 1).

While the API server cannot be reached at start, building a controller waits for it, logging
the first failure at once (the server's address and the reason) and each retry after, for at
most ``ManagerOptions.start_timeout`` (120 s), then raises
:class:`~kubeclient.discovery.ServerUnreachableError`.

Losing leadership stops the controllers at once (in-flight reconciles are cancelled, no
graceful drain) and :meth:`run` raises
:class:`~controller_runtime.leaderelection.LeaderElectionLostError`; the entry point exits
non-zero so that the Pod restarts as a follower, as controller-runtime does.

Supervision (no background task dies silently; docs/manager.md has the table): an unexpected
exception in a long-running task is logged with its traceback and counted in
``controller_runtime_task_failures_total{task}``, then

* the metrics and health servers are restarted on the same address with backoff (0.5 s,
  doubling to 30 s; ``controller_runtime_task_restarts_total{task}``); while the metrics
  server is down, ``/healthz`` fails its ``metrics-server`` check, so a server that cannot
  come back ends in a restart by the kubelet;
* a leader-election attempt that fails that way counts as a failed attempt (the renew
  deadline alone decides loss), and a controller worker goes on with the next key (see
  :mod:`~controller_runtime.controller`);
* anything that still escapes the leader-election task or the controllers' start ends
  :meth:`run` with that exception, after a logged shutdown: the entry point exits non-zero;
* an exception that reaches the event loop's handler (raised in a callback or a listener, or
  a task's exception nobody retrieved) is counted as ``task="event-loop"`` from the first
  :meth:`run` on that loop on, and logged by the handler that was installed before
  (asyncio's by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from controller_runtime import metrics as cr_metrics
from controller_runtime.builder import GuardFactory
from controller_runtime.cache import ByObject, Cache, CacheSyncTimeoutError, KindKey
from controller_runtime.client import Client
from controller_runtime.consistency import ReadYourWritesGuard
from controller_runtime.controller import Controller
from controller_runtime.fencing import fenced_by
from controller_runtime.leaderelection import (
    LeaderElectionConfig,
    LeaderElectionLostError,
    LeaderElector,
)
from controller_runtime.metrics import TASK_FAILURES, TASK_RESTARTS
from controller_runtime.util.events import EventRecorder, EventRecorderOptions
from informers import metrics as informer_metrics
from informers.reflector_machine import ReflectorOptions
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport

if TYPE_CHECKING:
    # Imported where they are used, only by a manager that uses them: the HTTP server (metrics,
    # probes), the Prometheus exposition, the shard ring, the webhook server. An operator with
    # none of them configured starts without loading them.
    from aiohttp import web

    from controller_runtime.sharding import ShardRing, ShardRingConfig
    from controller_runtime.webhook.server import WebhookServer

__all__ = [
    "EVENT_LOOP_ENV",
    "Manager",
    "ManagerOptions",
    "Runnable",
    "install_event_loop",
    "install_uvloop",
    "run_until_signalled",
]

log = logging.getLogger(__name__)

Check = Callable[[], bool | Awaitable[bool]]
"""A health or readiness check: true when healthy."""

METRICS_SERVER = "metrics-server"
"""The metrics server's task name (metrics label) and ``/healthz`` check name."""
HEALTH_SERVER = "health-server"
"""The health-probe server's task name (metrics label)."""
EVENT_LOOP = "event-loop"
"""The task name (metrics label) of exceptions that reach the event loop's handler."""
LISTENER_CHECK_PERIOD = 1.0
"""Seconds between two checks that a server's listener still serves."""
FIRST_WATCHES_WAIT = 0.1
"""At most this many seconds between :meth:`Manager.run` and starting the HTTP servers, while
the informers' first requests go out (:meth:`Manager._let_first_watches_leave`)."""


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
    the unsharded controllers. ``watch_timeout_seconds``: every informer asks the server to
    end each watch after a random time in ``[N, 2N)`` seconds (client-go's rule, N = 300 s)
    and presumes the connection dead after no byte for that time plus 10 s (a frozen
    connection, a silent partition): it then re-watches, or relists if needed. Lower it to
    notice a frozen connection sooner, at the cost of re-opening every watch that often.
    ``start_timeout``: seconds to wait for an API server that cannot be reached (connection
    failures, 429, 5xx) while starting, i.e. while a controller is built and its kinds are
    discovered; then :class:`~kubeclient.discovery.ServerUnreachableError` (120 s; ``None``:
    wait until cancelled). The first failure is logged at once with the server's address.
    ``cache_memory_limit``: bytes of full bodies the cache may hold across every kind without
    a ``ByObject.memory_limit`` of its own (``None``, the default: unbounded); above it the
    least recently used bodies are evicted, their metadata kept, and the client fetches
    them live on a read (see :mod:`controller_runtime.cache`).
    ``webhook_server``: the admission and conversion webhook server
    (:class:`~controller_runtime.webhook.WebhookServer`), run on every replica; ``None``: one
    with its defaults (port 9443), created when :attr:`Manager.webhook_server` is first used
    (a manager that registers no webhook serves none).
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
    watch_timeout_seconds: int = 300
    start_timeout: float | None = 120.0
    cache_memory_limit: int | None = None
    webhook_server: WebhookServer | None = None


def _split_address(address: str | None) -> tuple[str, int] | None:
    if not address or address == "0":
        return None
    host, _, port = address.rpartition(":")
    # An address without a host (":8080") means every interface, as in controller-runtime.
    return (host or "0.0.0.0"), int(port)


class Manager:
    """Runs controllers against one cluster. See the module docstring for the lifecycle.

    Creating one opens nothing; :meth:`run` closes everything when it ends, and
    :meth:`close` (``async with Manager(...) as manager:``) when ``run`` is never reached.
    """

    def __init__(self, config: ClusterConfig, options: ManagerOptions | None = None) -> None:
        self.config = config
        self.options = options = options or ManagerOptions()
        timeout = options.watch_timeout_seconds
        if timeout < 1:
            raise ValueError(f"watch_timeout_seconds must be >= 1, got {timeout}")
        if options.start_timeout is not None and not options.start_timeout > 0:
            raise ValueError(f"start_timeout must be > 0 or None, got {options.start_timeout}")
        # Lazy: the transport opens its connection pool at the first request.
        self.transport = Transport(config, observer=informer_metrics.rest_observer(config.server))
        self.factory = InformerFactory(
            self.transport,
            options=ReflectorOptions(watch_timeout_min=timeout, watch_timeout_max=2 * timeout),
        )
        self.cache = Cache(
            self.factory,
            namespaces=options.namespaces,
            by_object=options.by_object,
            start_timeout=options.start_timeout,
            memory_limit=options.cache_memory_limit,
        )
        self.client = Client(self.transport, self.cache, field_manager=options.field_manager)
        self.controllers: list[Controller] = []
        self.runnables: list[Runnable] = []
        self.elector: LeaderElector | None = (
            LeaderElector(self.transport, options.leader_election)
            if options.leader_election is not None
            else None
        )
        self._healthz: dict[str, Check] = {"ping": lambda: True}
        self._readyz: dict[str, Check] = {
            "informers-synced": lambda: self._synced,
            "informers-healthy": lambda: not self.factory.unhealthy(),
        }
        self.shard_ring: ShardRing | None = None
        if options.shard_ring is not None:
            from controller_runtime.sharding import ShardRing  # noqa: PLC0415

            self.shard_ring = ShardRing(self.transport, options.shard_ring)
            self.runnables.append(self.shard_ring)
            self._readyz["shards-synced"] = lambda: (
                self.shard_ring is None or (self.shard_ring.has_synced)
            )
        self._synced = False
        self._stop = asyncio.Event()
        self._runners: list[web.AppRunner] = []
        # The listening servers by task name, and the tasks that keep them serving.
        self._listeners: dict[str, asyncio.Server] = {}
        self._server_tasks: list[asyncio.Task[None]] = []
        self.metrics_url: str | None = None
        self.health_url: str | None = None
        self.is_leader = False
        self._recorders: dict[str, EventRecorder] = {}
        self._closed = False
        self._running = False
        self._leading = False  # controllers are started (add_controller starts its own)
        self._webhook_server: WebhookServer | None = None
        if options.webhook_server is not None:
            self._adopt_webhook_server(options.webhook_server)

    @property
    def webhook_server(self) -> WebhookServer:
        """The webhook server (controller-runtime's ``GetWebhookServer``): the one in
        ``ManagerOptions.webhook_server``, else one with the defaults, created now. It runs
        on every replica, leader or not, from before the caches sync; its ``webhook-server``
        readiness check fails until it answers a TLS handshake with a trusted certificate."""
        if self._webhook_server is None:
            from controller_runtime.webhook.server import WebhookServer  # noqa: PLC0415

            self._adopt_webhook_server(WebhookServer())
        assert self._webhook_server is not None
        return self._webhook_server

    def _adopt_webhook_server(self, server: WebhookServer) -> None:
        self._webhook_server = server
        self.add(server)
        self._readyz["webhook-server"] = server.ready

    async def __aenter__(self) -> Manager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close everything the manager opened (controllers, event recorders, informers,
        connections), for when :meth:`run` is never reached or to be sure after it;
        idempotent. ``async with Manager(...)`` calls it on the way out. A closed manager
        cannot run."""
        if self._closed or self._running:
            return  # run() closes what it opened itself when it ends
        self._closed = True
        await self._shutdown()

    def event_recorder(
        self, name: str, *, options: EventRecorderOptions | None = None
    ) -> EventRecorder:
        """The event recorder reporting as ``name`` (controller-runtime's
        ``GetEventRecorderFor``): Events' ``reportingController``, a qualified name such as
        ``example.com/my-controller``. ``reportingInstance`` is this host's name (the Pod's
        name in a cluster).

        The same name returns the same recorder. It writes through :attr:`client`, from its
        first record on (:class:`~controller_runtime.util.EventRecorder`: series, rate limits,
        never blocks a reconcile); the manager flushes and closes it when it stops (after the
        controllers, so what they record while draining is written too).
        """
        recorder = self._recorders.get(name)
        if recorder is None:
            recorder = EventRecorder(
                self.client,
                reporting_controller=name,
                reporting_instance=(socket.gethostname() or "controller-runtime-py")[:128],
                options=options,
            )
            self._recorders[name] = recorder
        elif options is not None and options != recorder.options:
            raise ValueError(
                f"the event recorder {name!r} exists with other options: {recorder.options}"
            )
        return recorder

    # -- the ControllerHost seam (used by ControllerBuilder) --------------------------------

    @property
    def guard_factory(self) -> GuardFactory | None:
        if not self.options.read_your_writes:
            return None
        return lambda name: ReadYourWritesGuard(name, self.cache)

    def add(self, runnable: Controller | Runnable) -> None:
        """Run ``runnable`` with the manager (controllers only while leading). Adding the
        same object twice has no effect. A controller added while the manager leads is
        started by :meth:`add_controller`; a stopped controller is forgotten."""
        if isinstance(runnable, Controller):
            if runnable not in self.controllers:
                self.controllers.append(runnable)
                runnable.on_stop(lambda: self._forget(runnable))
        elif runnable not in self.runnables:
            self.runnables.append(runnable)

    async def add_controller(self, controller: Controller) -> None:
        """Run ``controller`` with the manager, also after :meth:`run` began: while this
        replica leads, it is started now (this returns once its sources synced, at most
        its ``cache_sync_timeout``; :class:`~controller_runtime.cache.CacheSyncTimeoutError`
        otherwise, the controller then stays added, unstarted, and :meth:`remove_controller`
        lets go of it); otherwise when leadership is won. The builder's ``complete`` (with
        ``ControllerBuilder(manager)``) adds it already: then this only starts it.
        ``RuntimeError`` once the manager stops."""
        if self.stopping or (self._closed and not self._running):
            raise RuntimeError("the manager is stopping or closed; it takes no new controllers")
        self.add(controller)
        if self._leading and not controller.started:
            self._fence(controller)
            await controller.start()

    def _fence(self, controller: Controller) -> None:
        """A leader-elected controller checks the elector's deadline before each write."""
        if self.elector is not None and controller.fence is None:
            controller.fence = self.elector

    async def remove_controller(
        self, controller: Controller, drain_timeout: float | None = None
    ) -> bool:
        """Stop ``controller`` and forget it; the manager runs on. Its handlers leave the
        shared informers, in-flight reconciles get ``drain_timeout`` seconds (default: the
        manager's ``graceful_shutdown_timeout``), and the kinds no other controller or reader
        holds stop being watched (see :mod:`controller_runtime.cache`), and its metric
        series (``controller_runtime_*{controller}``, ``workqueue_*{name}``) are removed.
        The same as ``controller.stop()``. Returns whether every in-flight reconcile
        finished in time."""
        timeout = self.options.graceful_shutdown_timeout if drain_timeout is None else drain_timeout
        return await controller.stop(timeout)

    def _forget(self, controller: Controller) -> None:
        if controller in self.controllers:
            self.controllers.remove(controller)
        if not self.stopping:  # stopped at run time: its metric series go with it
            cr_metrics.remove_controller_series(controller.name, controller.queue)

    def add_healthz_check(self, name: str, check: Check) -> None:
        self._healthz[name] = check

    def add_readyz_check(self, name: str, check: Check) -> None:
        self._readyz[name] = check

    def request_stop(self) -> None:
        """Begin a graceful shutdown (what SIGTERM does). The webhook server, if any, stops
        being ready at once but keeps serving for its ``shutdown_delay``
        (:meth:`~controller_runtime.webhook.WebhookServer.begin_shutdown`)."""
        self._stop.set()
        if self._webhook_server is not None:
            self._webhook_server.begin_shutdown()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- run --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until :meth:`request_stop`; see the module docstring. Everything is closed
        when it returns or raises; a manager runs once."""
        if self._closed or self._running:
            raise RuntimeError("this manager already ran or was closed; create a new one")
        self._running = True
        _count_loop_exceptions(asyncio.get_running_loop())
        await self._run()

    async def _run(self) -> None:
        try:
            await self._let_first_watches_leave()
            # A failure to bind an endpoint (OSError, e.g. EADDRINUSE) is raised unlogged: the
            # caller knows which option names the address and says so in one line.
            await self._serve()
            await self._start_and_lead()
        finally:
            self._closed = True
            await self._shutdown()

    async def _let_first_watches_leave(self) -> None:
        """Before the HTTP servers start (importing aiohttp's server half and setting it up
        hold the event loop for 15-20 ms): one turn of the loop for the informers started
        while the controllers were built, then a wait of at most ``FIRST_WATCHES_WAIT`` until
        their first requests are written. The API server then prepares its answers while the
        servers start, instead of after (docs/benchmarks.md, "Start-up")."""
        await asyncio.sleep(0)
        await self.transport.watches_sent(FIRST_WATCHES_WAIT)

    async def _start_and_lead(self) -> None:
        try:
            for runnable in self.runnables:
                if not runnable.need_leader_election:
                    await runnable.start()
            await self._wait_for_caches()
            if self.elector is None:
                await self._lead()
            else:
                await self._campaign(self.elector)
        except (LeaderElectionLostError, CacheSyncTimeoutError, asyncio.CancelledError):
            raise  # expected ends, each with a message of its own
        except Exception as err:
            log.error(
                "the manager failed (%s); shutting down so that the process exits non-zero",
                type(err).__name__,
                exc_info=err,
            )
            raise

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
                error = acquiring.exception()
                if error is not None and not isinstance(error, LeaderElectionLostError):
                    TASK_FAILURES.labels("leader-election").inc()
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
        try:
            # Leader-only runnables write (through the client) only while leadership
            # provably holds: the tasks they start inherit this fence.
            with fenced_by(self.elector):
                for runnable in runnables:
                    await runnable.start()
            # From here on add_controller starts what it is given itself.
            self._leading = True
            for controller in list(self.controllers):
                if not controller.started:
                    self._fence(controller)
                    await controller.start()
            await self._stop.wait()
            log.info(
                "stopping controllers (up to %.0fs for in-flight reconciles)",
                self.options.graceful_shutdown_timeout,
            )
            timeout = self.options.graceful_shutdown_timeout
            await asyncio.gather(*(c.stop(timeout) for c in self._started_controllers()))
            await asyncio.gather(*(r.stop(timeout) for r in runnables))
        except asyncio.CancelledError:
            started = self._started_controllers()
            await asyncio.gather(*(c.stop(0) for c in started), return_exceptions=True)
            await asyncio.gather(*(r.stop(0) for r in runnables), return_exceptions=True)
            raise
        finally:
            self._leading = False
            self.is_leader = False

    def _started_controllers(self) -> list[Controller]:
        return [c for c in self.controllers if c.started]

    async def _shutdown(self) -> None:
        """Stop everything; a step that fails is logged (with its traceback) and the next
        step still runs."""
        for controller in list(self.controllers):
            await _logged(f"stopping controller {controller.name!r}", controller.stop(0))
        # A graceful stop lets runnables that run without leadership (a shard ring) drain.
        drain = self.options.graceful_shutdown_timeout if self.stopping else 0
        for runnable in self.runnables:
            timeout = 0 if runnable.need_leader_election else drain
            await _logged(f"stopping runnable {runnable!r}", runnable.stop(timeout))
        for name, recorder in self._recorders.items():
            await _logged(f"flushing the event recorder {name!r}", recorder.close())
        await _logged("stopping the informers", self.cache.stop())
        for task in self._server_tasks:
            task.cancel()
        for task in self._server_tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await _logged("stopping a server's supervisor", task)
        self._server_tasks = []
        for listener in self._listeners.values():
            listener.close()  # no new connections
        for runner in self._runners:  # closes the open ones
            await _logged("cleaning up an HTTP server", runner.cleanup())
        self._runners = []
        for name, listener in self._listeners.items():
            await _logged(f"closing the {name}", listener.wait_closed())
        self._listeners = {}
        await _logged("closing the API server connections", self.transport.close())

    # -- HTTP endpoints ---------------------------------------------------------------------

    async def _serve(self) -> None:
        metrics_at = _split_address(self.options.metrics_bind_address)
        health_at = _split_address(self.options.health_probe_bind_address)
        if metrics_at is not None or health_at is not None:
            from aiohttp import web  # noqa: PLC0415 (aiohttp's server half: only to serve)
        if metrics_at is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._metrics)
            self.metrics_url = await self._start_server(METRICS_SERVER, app, metrics_at)
            self._healthz.setdefault(METRICS_SERVER, lambda: self._serving(METRICS_SERVER))
        if health_at is not None:
            app = web.Application()
            app.router.add_get("/healthz", self._health_handler(self._healthz))
            app.router.add_get("/readyz", self._health_handler(self._readyz))
            self.health_url = await self._start_server(HEALTH_SERVER, app, health_at)
        # The addresses actually bound (a port 0 picked a free one): where to point a scraper.
        metrics = f"{self.metrics_url}/metrics" if self.metrics_url else "off"
        health = self.health_url
        probes = f"{health}/healthz and {health}/readyz" if health else "off"
        log.info("serving metrics at %s, probes at %s", metrics, probes)

    def _serving(self, name: str) -> bool:
        listener = self._listeners.get(name)
        return listener is not None and listener.is_serving()

    async def _start_server(self, name: str, app: web.Application, at: tuple[str, int]) -> str:
        """Serve ``app`` on ``at`` (a failure to bind raises: the process cannot start), and
        keep it serving from a supervisor task. Returns the URL (the port, if 0 was asked
        for, is kept across restarts)."""
        from aiohttp import web  # noqa: PLC0415

        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        listener = await self._listen(name, runner, at)
        host, port = listener.sockets[0].getsockname()[:2]
        self._server_tasks.append(
            asyncio.create_task(
                self._keep_serving(name, runner, (at[0], port)), name=f"manager-{name}"
            )
        )
        return f"http://{host}:{port}"

    async def _listen(
        self, name: str, runner: web.AppRunner, at: tuple[str, int]
    ) -> asyncio.Server:
        assert runner.server is not None  # set up
        loop = asyncio.get_running_loop()
        listener = await loop.create_server(runner.server, at[0], at[1], reuse_address=True)
        self._listeners[name] = listener
        return listener

    async def _keep_serving(self, name: str, runner: web.AppRunner, at: tuple[str, int]) -> None:
        """Supervise one server: when its listener stops for any reason but our own stop,
        log and count it, and listen again on the same address with backoff."""
        failures = 0
        while True:
            listener = self._listeners.get(name)
            error: BaseException | None = None
            try:
                if listener is None:
                    listener = await self._listen(name, runner, at)
                    TASK_RESTARTS.labels(name).inc()
                    log.warning("the %s listens again on %s:%d", name, *at)
                    failures = 0
                # Polled: no event announces a listener closed elsewhere, and serve_forever()
                # closes the server and waits for its connections when cancelled, which a
                # scraper's keep-alive connection could hold up at shutdown.
                while listener.is_serving():  # noqa: ASYNC110 (see above)
                    await asyncio.sleep(LISTENER_CHECK_PERIOD)
            except Exception as err:
                error = err
            failures += 1
            self._listeners.pop(name, None)
            if listener is not None:
                listener.close()
            TASK_FAILURES.labels(name).inc()
            delay = min(0.5 * 2 ** (failures - 1), 30.0)
            log.error(
                "the %s on %s:%d stopped (%s); listening again in %.1fs",
                name,
                *at,
                type(error).__name__ if error is not None else "closed",
                delay,
                exc_info=error,
            )
            await asyncio.sleep(delay)

    async def _metrics(self, request: web.Request) -> web.Response:
        import prometheus_client  # noqa: PLC0415 (only a scraped manager pays for it)
        from aiohttp import web  # noqa: PLC0415
        from prometheus_client.exposition import generate_latest  # noqa: PLC0415

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
        from aiohttp import web  # noqa: PLC0415

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


LoopExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class _CountingExceptionHandler:
    """An event-loop exception handler that counts what reaches it (an exception raised in a
    callback or a listener, a task's exception nobody retrieved) as
    ``controller_runtime_task_failures_total{task="event-loop"}``, then hands it to
    ``previous`` (by default asyncio's, which logs it with its traceback)."""

    def __init__(self, previous: LoopExceptionHandler | None) -> None:
        self.previous = previous

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        TASK_FAILURES.labels(EVENT_LOOP).inc()
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)


def _count_loop_exceptions(loop: asyncio.AbstractEventLoop) -> None:
    """Install the counting handler on ``loop`` once, wrapping the handler in place. It stays
    for the loop's lifetime: several managers may share a loop and stop in any order, so
    none of them can safely put the previous handler back."""
    if not isinstance(loop.get_exception_handler(), _CountingExceptionHandler):
        loop.set_exception_handler(_CountingExceptionHandler(loop.get_exception_handler()))


async def _logged(what: str, step: Awaitable[object]) -> None:
    """Await one shutdown step; log (with its traceback) instead of raising if it fails."""
    try:
        await step
    except Exception as err:
        log.warning("shutdown: %s failed (%s); going on", what, type(err).__name__, exc_info=err)


EVENT_LOOP_ENV = "CRPY_EVENT_LOOP"
"""The environment variable that picks the event loop: ``asyncio`` (default) or ``uvloop``."""


def install_event_loop(choice: str | None = None) -> str:
    """Pick the event loop for :func:`asyncio.run`: ``choice``, else ``$CRPY_EVENT_LOOP``,
    else ``"asyncio"`` (the standard library's). Returns the loop in use.

    The standard loop is the default because uvloop (0.23.0, libuv 1.52.1) aborts the process
    (``Fatal Python error: Aborted``, in ``uv__epoll_ctl_flush``) when a descriptor it watches
    was closed behind its back, which API-server restarts with many requests in flight were
    seen to cause, where asyncio's loop raises ``OSError`` (docs/reliability.md, "The event
    loop"); ``uvloop`` opts back in.
    It buys no speed here: on the core and restart benchmarks asyncio's loop used 7-14 % less
    CPU than uvloop for the same work (docs/benchmarks.md, "asyncio's event loop beside
    uvloop"). ``uvloop`` when it is not installed falls back to ``asyncio`` with a warning; any
    other value is a ``ValueError``.
    """
    wanted = (choice if choice is not None else os.environ.get(EVENT_LOOP_ENV, "")).strip()
    wanted = wanted.lower() or "asyncio"
    if wanted == "asyncio":
        asyncio.set_event_loop_policy(None)
        return "asyncio"
    if wanted == "uvloop":
        if install_uvloop():
            return "uvloop"
        log.warning("%s=uvloop, but uvloop is not installed: using asyncio's loop", EVENT_LOOP_ENV)
        return "asyncio"
    raise ValueError(f"{EVENT_LOOP_ENV} must be 'asyncio' or 'uvloop', got {wanted!r}")


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when it is installed. True if it is in use (see
    :func:`install_event_loop` for why it is not the default)."""
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
