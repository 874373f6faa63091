"""The controller: a work queue of :class:`~controller_runtime.reconcile.Request` keys and N
workers that reconcile them.

Guarantees:

* **One reconcile per key at a time.** The queue never hands a key to a second worker before
  the first is done with it; changes that arrive meanwhile are coalesced into one more
  reconcile afterwards. Different keys are reconciled concurrently, up to
  ``max_concurrent_reconciles``.
* **A worker never dies of a reconcile.** Whatever the reconciler raises (an ``Exception``,
  or a ``CancelledError`` that is not the controller stopping) is counted, logged and turned
  into a requeue; the worker takes the next key. (``KeyboardInterrupt``/``SystemExit`` are
  not caught: they stop the loop, as they should.)
* **Nor of anything else.** An unexpected exception in the worker's own path (the rate
  limiter, the guard's requeue, a metric or log handler) is logged with its traceback,
  counted in ``controller_runtime_task_failures_total{task="controller-worker"}``, the key is
  marked done and requeued with backoff where possible, and the worker goes on after a short
  pause (0.1 s, doubling to 10 s while failures repeat): never a controller that silently
  stops reconciling.
* **Outcomes as in controller-runtime** (``reconcileHandler``), keeping the priority the key
  was queued with on every requeue:

  ===================================  ===========================================  =============
  reconcile                            queue                                        ``result``
  ===================================  ===========================================  =============
  returns ``None`` or ``Result()``     ``forget`` (reset its backoff)               success
  returns ``Result(requeue_after=s)``  ``forget`` + ``add_after(s)``                requeue_after
  raises ``TerminalError``             nothing: not retried until the next event    error
  raises anything else                 ``add_rate_limited`` (5 ms → 1000 s backoff) error
  ===================================  ===========================================  =============

Error metrics (the panic mapping): Go separates returned errors from panics; Python raises
both. Here ``controller_runtime_reconcile_errors_total`` counts every failed reconcile (as
controller-runtime, terminal ones included); ``controller_runtime_terminal_reconcile_errors_total``
the :class:`~controller_runtime.reconcile.TerminalError` ones; and
``controller_runtime_reconcile_panics_total`` those whose exception type means a bug in the
reconciler rather than a failure of the world it talks to, what would be a panic in Go: the
types in :data:`PANIC_TYPES` (``KeyError``, ``AttributeError``, ``TypeError``, ... and
``NotCachedError``, a ``LookupError``), a stray ``CancelledError``, or a return value that is
not a ``Result``. API errors, ``OSError`` (so timeouts and connection errors), ``ValueError``,
``RuntimeError`` and your own exception classes (unless they subclass one of those types) are
plain errors. A panic is otherwise handled like any error (requeued with backoff), as
controller-runtime does with ``RecoverPanic``. A reconcile that outlives
``reconcile_timeout`` is cancelled and fails with :class:`ReconcileTimeoutError` (also counted
in ``controller_runtime_reconcile_timeouts_total``).

Logging: records carry ``controller``, ``namespace``, ``object_name`` and ``reconcile_id`` as
``extra`` fields (``name`` is taken by :class:`logging.LogRecord`); :class:`ReconcileLogFilter`
adds them to every record logged inside a reconcile, by any logger.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller_runtime import metrics as _metrics
from controller_runtime.cache import CacheSyncTimeoutError, KindInformers
from controller_runtime.fencing import Fence
from controller_runtime.handlers import EventHandler
from controller_runtime.predicates import PredicateLike
from controller_runtime.ratelimiter import RateLimiter, default_controller_rate_limiter
from controller_runtime.reconcile import (
    CURRENT_RECONCILE,
    REQUEST_KEYS,
    ConsistencyGuard,
    OwnWriteRecorder,
    ReconcileContext,
    ReconcileFunc,
    Reconciler,
    Request,
    Result,
    TerminalError,
)
from controller_runtime.workqueue import QueueShutDownError, WorkQueue
from informers.shared import Registration, SharedInformer

__all__ = [
    "DEFAULT_CACHE_SYNC_TIMEOUT",
    "DEFAULT_DRAIN_TIMEOUT",
    "PANIC_TYPES",
    "Controller",
    "ControllerOptions",
    "ReconcileLogFilter",
    "ReconcileTimeoutError",
    "check_name",
    "check_reconciler",
    "reconcile_logger",
]

log = logging.getLogger(__name__)

DEFAULT_CACHE_SYNC_TIMEOUT = 120.0
"""Seconds :meth:`Controller.start` waits for its sources' initial lists (controller-runtime's
``CacheSyncTimeout``, 2 minutes)."""

DEFAULT_DRAIN_TIMEOUT = 30.0
"""Seconds :meth:`Controller.stop` lets in-flight reconciles finish (controller-runtime's
``GracefulShutdownTimeout``)."""

PANIC_TYPES: tuple[type[BaseException], ...] = (
    ArithmeticError,
    AssertionError,
    AttributeError,
    ImportError,
    LookupError,
    NameError,
    NotImplementedError,
    RecursionError,
    TypeError,
)
"""Exception types counted in ``controller_runtime_reconcile_panics_total``: Python's
programming-error types (see the module docs)."""

_PANICS = (*PANIC_TYPES, asyncio.CancelledError)  # a CancelledError that reached us is a stray one
_WORKER_PAUSE = 0.1  # a worker's pause after a failure outside the reconcile, doubling...
_WORKER_PAUSE_CAP = 10.0  # ...up to this while failures repeat
_FENCED_RETRY = 1.0  # the delay of a request not reconciled because the fence was down
_WORKER_RETRY = 1.0  # the delay of the requeue of a key whose processing failed that way
_DEBUG = logging.DEBUG

# Controller names in use in this process: names label the metrics, so two controllers with
# one name would silently share series (controller-runtime refuses them for the same reason).
# A name is taken when its controller is created and released when it stops.
_NAMES: dict[str, Controller] = {}


def check_name(name: str) -> None:
    """Raise ``ValueError`` if a controller of this process that has not been stopped has
    this name (the builder checks before it watches anything; :class:`Controller` takes the
    name when created, and :meth:`Controller.stop` releases it)."""
    if name in _NAMES:
        raise ValueError(
            f"a controller named {name!r} already runs in this process: controller names "
            "label metrics and logs and must be unique; choose another with named(...), stop "
            "the other one first, or set skip_name_validation=True (tests)"
        )


class ReconcileTimeoutError(TimeoutError):
    """A reconcile ran longer than ``ControllerOptions.reconcile_timeout`` and was cancelled.
    Counted in ``controller_runtime_reconcile_timeouts_total``, then handled as an error."""


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """How a controller runs. Every field has controller-runtime's default.

    Attributes:
        max_concurrent_reconciles: worker tasks, i.e. keys reconciled at once (default 1).
        reconcile_timeout: seconds after which a reconcile is cancelled and counts as an
            error (default ``None``: no limit). Cancellation is cooperative: code that
            blocks the event loop cannot be interrupted (run blocking calls with
            ``asyncio.to_thread``).
        rate_limiter: the queue's backoff for failed reconciles. ``None`` (default):
            :func:`~controller_runtime.ratelimiter.default_controller_rate_limiter`, the max of
            per-key exponential 5 ms → 1000 s and a 10 qps / burst 100 bucket (capped at
            60 s). A limiter is stateful: give each controller its own.
        cache_sync_timeout: seconds :meth:`Controller.start` waits for the initial lists of
            the controller's sources (default 120).
        skip_name_validation: allow a name already used in this process (default ``False``;
            for tests that build the same controller repeatedly).
        skip_own_write_echoes: do not reconcile an object again when its only change is this
            controller's own write of it, conditioned on a resourceVersion (default
            ``False``; the builder's ``for_`` kind only; see
            :class:`~controller_runtime.consistency.OwnWriteEchoes`). For reconcilers that
            converge in one pass: one that writes a first step and returns, counting on the
            update event to run again, must requeue explicitly with this on.
    """

    max_concurrent_reconciles: int = 1
    reconcile_timeout: float | None = None
    rate_limiter: RateLimiter[Request] | None = None
    cache_sync_timeout: float = DEFAULT_CACHE_SYNC_TIMEOUT
    skip_name_validation: bool = False
    skip_own_write_echoes: bool = False

    def __post_init__(self) -> None:
        if self.max_concurrent_reconciles < 1:
            raise ValueError("max_concurrent_reconciles must be >= 1")
        if self.reconcile_timeout is not None and not self.reconcile_timeout > 0:
            raise ValueError("reconcile_timeout must be > 0 or None")


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` counts as a panic (see the module docs); for an exception group,
    whether any exception in it does."""
    if isinstance(exc, BaseExceptionGroup):
        leaves = exc.subgroup(lambda e: not isinstance(e, BaseExceptionGroup) and is_panic(e))
        return leaves is not None
    return isinstance(exc, _PANICS)


def _is_terminal(exc: BaseException) -> bool:
    # Like errors.Is(err, TerminalError): a group holding one is terminal too.
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(TerminalError) is not None
    return isinstance(exc, TerminalError)


def _log_fields(controller: str, request: Request, reconcile_id: str) -> dict[str, str]:
    return {
        "controller": controller,
        "namespace": request.namespace,
        "object_name": request.name,
        "reconcile_id": reconcile_id,
    }


class ReconcileLogFilter(logging.Filter):
    """Adds ``controller``, ``namespace``, ``object_name`` and ``reconcile_id`` to every record
    logged inside a reconcile (from :data:`~controller_runtime.reconcile.CURRENT_RECONCILE`),
    whatever logger emits it. Attach it to a handler: ``handler.addFilter(ReconcileLogFilter())``.
    Fields already on the record (from ``extra``) win. Never filters anything out."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = CURRENT_RECONCILE.get()
        if ctx is not None:
            fields = _log_fields(ctx.controller, ctx.request, ctx.reconcile_id)
            for key, value in fields.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        return True


class _ContextAdapter(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        extra = kwargs.get("extra")
        kwargs["extra"] = {**(self.extra or {}), **extra} if extra else self.extra
        return msg, kwargs


def reconcile_logger(logger: logging.Logger | str | None = None) -> logging.LoggerAdapter[Any]:
    """A logger whose records carry the current reconcile's fields (``controller``,
    ``namespace``, ``object_name``, ``reconcile_id``); outside a reconcile, no fields.

    ``logger`` is a logger or its name (default: this module's). Like controller-runtime's
    ``log.FromContext(ctx)``; call it inside the reconcile.
    """
    if not isinstance(logger, logging.Logger):
        logger = logging.getLogger(logger or __name__)
    ctx = CURRENT_RECONCILE.get()
    fields: Mapping[str, object] = (
        _log_fields(ctx.controller, ctx.request, ctx.reconcile_id) if ctx is not None else {}
    )
    return _ContextAdapter(logger, fields)


class Controller:
    """Reconciles the requests put on its queue with ``max_concurrent_reconciles`` workers.

    Args:
        name: unique in the process (it labels the metrics and the logs); ``ValueError`` if
            taken, unless ``options.skip_name_validation``.
        reconciler: ``async def reconcile(request) -> Result | None``, or an object with such
            a ``reconcile`` method (:class:`~controller_runtime.reconcile.Reconciler`).
        options: :class:`ControllerOptions` (defaults: 1 worker, no timeout, the default
            controller rate limiter, 120 s cache-sync timeout).
        guard: a :class:`~controller_runtime.reconcile.ConsistencyGuard` (default ``None``).
            Before each reconcile, ``guard.check(request)`` may return a delay: the key is
            then re-added after that delay (same priority), counted in
            ``controller_runtime_stale_skips_total``, and the worker moves on; nothing waits.
            A guard that raises fails open (the reconcile runs; the error is logged).
        echoes: where the client reports the conditioned writes of each reconcile, when the
            controller skips the echoes of its own writes (the builder makes it, with
            ``options.skip_own_write_echoes``; default ``None``).

    Usually built by :class:`~controller_runtime.builder.ControllerBuilder`, which also
    connects informers to it (:meth:`watch`). Lifecycle: :meth:`start` (waits for the sources'
    initial lists, then starts the workers), :meth:`stop`; or ``async with controller:``. A
    stopped controller cannot be restarted.
    """

    def __init__(
        self,
        name: str,
        reconciler: ReconcileFunc | Reconciler,
        *,
        options: ControllerOptions | None = None,
        guard: ConsistencyGuard | None = None,
        echoes: OwnWriteRecorder | None = None,
        fence: Fence | None = None,
    ) -> None:
        if not name:
            raise ValueError("a controller needs a name")
        self.options = options = options or ControllerOptions()
        self._reconcile = check_reconciler(reconciler)
        if not options.skip_name_validation:
            check_name(name)
            _NAMES[name] = self
        self.name = name
        self.guard = guard
        self.echoes = echoes
        self.fence = fence
        """What the work depends on holding (set by the manager under leader election, by a
        sharded controller per slot): checked before each reconcile starts and, by the client,
        before each write of a reconcile (:mod:`controller_runtime.fencing`)."""
        self.queue: WorkQueue[Request] = WorkQueue(
            name,
            controller=name,
            rate_limiter=(
                options.rate_limiter
                if options.rate_limiter is not None
                else default_controller_rate_limiter()
            ),
            keys=REQUEST_KEYS,
        )
        self._registrations: list[Registration] = []
        self._read_only: list[SharedInformer] = []  # cached for reads; they queue nothing
        self._on_stop: list[Callable[[], Awaitable[object] | None]] = []
        self._workers: list[asyncio.Task[None]] = []
        self._started = False
        self._stopped = False
        self._active = 0
        self._ids = itertools.count(1)
        # Reconcile ids: unique in the process (a counter per controller), and across restarts
        # with near certainty (a random prefix), without a uuid4 per reconcile.
        self._id_prefix = os.urandom(4).hex() + "-"
        self._m = _metrics.controller_metrics(
            name,
            active_workers=lambda: self._active,
            max_concurrent_reconciles=options.max_concurrent_reconciles,
        )

    # --- sources ----------------------------------------------------------------------------

    def watch(
        self,
        source: KindInformers | SharedInformer,
        handler: EventHandler,
        predicates: Sequence[PredicateLike] = (),
    ) -> None:
        """Feed this controller's queue from ``source``'s changes, through ``handler``, for
        the deltas every predicate passes. :meth:`start` waits for these registrations to
        have delivered their initial lists; :meth:`stop` removes them."""
        fn = handler.bind(self.queue, predicates)
        if isinstance(source, SharedInformer):
            self._registrations.append(source.add_handler(fn))
        else:
            self._registrations.extend(source.add_handler(fn))

    def wait_for(self, source: KindInformers | SharedInformer) -> None:
        """Make :meth:`start` also wait for ``source``'s initial list, without feeding the
        queue from it: for a kind the reconciler only reads from the cache (the builder's
        :meth:`~controller_runtime.builder.ControllerBuilder.caches`)."""
        if isinstance(source, SharedInformer):
            self._read_only.append(source)
        else:
            self._read_only.extend(source.informers.values())

    def on_stop(self, callback: Callable[[], Awaitable[object] | None]) -> None:
        """Call ``callback`` (a function, or one returning an awaitable) once :meth:`stop` has
        detached the sources and drained the workers, in the order added; one that raises is
        logged and the next still runs. The builder releases the controller's kinds from the
        cache this way, and a manager forgets the controller."""
        self._on_stop.append(callback)

    def enqueue(self, request: Request, *, priority: int = 0, after: float | None = None) -> None:
        """Queue ``request`` (deduplicated; ignored once stopped), after ``after`` seconds if
        given. Higher ``priority`` first; 0 for fresh changes, ``LOW_PRIORITY`` for backlog."""
        if after is None:
            self.queue.add(request, priority=priority)
        else:
            self.queue.add_after(request, after, priority=priority)

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    @property
    def active_workers(self) -> int:
        """Reconciles running right now."""
        return self._active

    async def start(self) -> None:
        """Wait until every source delivered its initial list (at most
        ``options.cache_sync_timeout``; :class:`~controller_runtime.cache.CacheSyncTimeoutError`
        names the laggards), then start the workers and return. Requests queued before are
        kept and served first by priority."""
        if self._stopped:
            raise RuntimeError(f"controller {self.name!r} was stopped; build a new one")
        if self._started:
            raise RuntimeError(f"controller {self.name!r} is already started")
        self._started = True
        pending = [r for r in self._registrations if not r.has_synced]
        read_only = [i for i in self._read_only if not i.has_synced]
        if pending or read_only:
            log.info("Waiting for caches to sync", extra={"controller": self.name})
            try:
                async with asyncio.timeout(self.options.cache_sync_timeout):
                    await asyncio.gather(
                        *(r.wait_synced() for r in pending),
                        *(i.wait_for_sync() for i in read_only),
                    )
            except TimeoutError:
                self._started = False
                late = sorted(
                    {r.informer.description for r in pending if not r.has_synced}
                    | {i.description for i in read_only if not i.has_synced}
                )
                raise CacheSyncTimeoutError(
                    f"controller {self.name!r}: sources did not sync within "
                    f"{self.options.cache_sync_timeout}s: {', '.join(late)}; check RBAC "
                    "(list/watch) and that the CRDs are installed"
                ) from None
            if self._stopped:  # stop() was called while we waited
                return
        n = self.options.max_concurrent_reconciles
        log.info("Starting workers", extra={"controller": self.name, "worker_count": n})
        loop = asyncio.get_running_loop()
        self._workers = [
            loop.create_task(self._work(), name=f"controller-{self.name}-worker-{i}")
            for i in range(n)
        ]

    async def stop(self, drain_timeout: float | None = DEFAULT_DRAIN_TIMEOUT) -> bool:
        """Stop: detach from the sources, take no new work, let in-flight reconciles finish
        for up to ``drain_timeout`` seconds (``None``: wait forever), then cancel what is
        still running, then run the :meth:`on_stop` callbacks (a controller from the builder
        releases its kinds: informers no one else holds stop watching and free their stores).
        Queued keys are dropped (a new controller's initial lists bring them back). Returns
        ``True`` if every in-flight reconcile finished in time. Idempotent."""
        if self._stopped:
            return True
        self._stopped = True
        if _NAMES.get(self.name) is self:
            del _NAMES[self.name]
        for registration in self._registrations:
            registration.remove()
        # Nothing of ours keeps an informer (or its store) alive once it is released.
        self._registrations = []
        self._read_only = []
        log.info("Stopping workers", extra={"controller": self.name})
        if self._workers:
            drained = await self.queue.shutdown_with_drain(drain_timeout)
        else:  # never started: nothing of ours is in flight
            self.queue.shutdown()
            drained = True
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        if not drained:
            log.warning(
                "Reconciles still running after %ss were cancelled",
                drain_timeout,
                extra={"controller": self.name},
            )
        callbacks, self._on_stop = self._on_stop, []
        for callback in callbacks:
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("an on_stop callback failed", extra={"controller": self.name})
        return drained

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- workers ----------------------------------------------------------------------------

    async def _work(self) -> None:
        get = self.queue.get_with_priority
        process = self._process
        failures = 0
        while True:
            try:
                request, priority = await get()
            except QueueShutDownError:
                return
            try:
                await process(request, priority)
            except Exception as exc:
                failures += 1
                await self._worker_failed(request, priority, exc, failures)
            else:
                failures = 0

    async def _worker_failed(
        self, request: Request, priority: int, exc: Exception, failures: int
    ) -> None:
        """Recover a worker from an exception outside the reconcile (see the module docs)."""
        _metrics.TASK_FAILURES.labels("controller-worker").inc()
        log.error(
            "Worker failed outside the reconcile; it goes on",
            exc_info=exc,
            extra=_log_fields(self.name, request, ""),
        )
        queue = self.queue
        queue.done(request)  # idempotent: the key must never stay "in flight"
        try:
            queue.add_after(request, _WORKER_RETRY, priority=priority)
        except Exception:
            log.exception("Could not requeue %s", request, extra={"controller": self.name})
        await asyncio.sleep(min(_WORKER_PAUSE * 2 ** (failures - 1), _WORKER_PAUSE_CAP))

    # One reconcile's life (guard, timeout, each result and error kind, metrics, queue bookkeeping)
    # in one place, in order, as the table in the module docs lists it.
    async def _process(self, request: Request, priority: int) -> None:  # noqa: PLR0912,PLR0915
        queue = self.queue
        fence = self.fence
        if fence is not None and not fence.holds():
            # Resumed after a pause past the deadline (or about to be stopped): no reconcile
            # starts; the request stays queued for whoever holds the work, if it is us again.
            log.debug(
                "not reconciling: %s is no longer held",
                fence.describe(),
                extra=_log_fields(self.name, request, ""),
            )
            queue.add_after(request, _FENCED_RETRY, priority=priority)
            queue.done(request)
            return
        guard = self.guard
        if guard is not None:
            try:
                delay = guard.check(request)
            except Exception:
                log.exception(
                    "Consistency guard failed; reconciling anyway",
                    extra=_log_fields(self.name, request, ""),
                )
                delay = None
            if delay is not None:
                queue.add_after(request, delay, priority=priority)
                queue.done(request)
                self._m.stale_skips()
                return

        m = self._m
        reconcile_id = f"{self._id_prefix}{next(self._ids):x}"
        token = CURRENT_RECONCILE.set(
            ReconcileContext(self.name, request, reconcile_id, guard, self.echoes, fence)
        )
        self._active += 1
        start = time.perf_counter()
        try:
            try:
                if self.options.reconcile_timeout is None:
                    result = await self._reconcile(request)
                else:
                    result = await self._reconcile_with_timeout(request)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the controller is stopping: not an outcome of the reconcile
                self._failed(request, priority, exc, reconcile_id)
            except Exception as exc:
                self._failed(request, priority, exc, reconcile_id)
            else:
                if result is None:
                    queue.forget(request)
                    m.success()
                elif isinstance(result, Result):
                    after = result.requeue_after
                    if after is not None and after > 0:
                        queue.forget(request)
                        queue.add_after(request, after, priority=priority)
                        m.requeue_after()
                    else:
                        queue.forget(request)
                        m.success()
                else:
                    self._failed(
                        request,
                        priority,
                        TypeError(
                            f"the reconciler returned {type(result).__name__}; expected a "
                            "Result or None"
                        ),
                        reconcile_id,
                    )
                if log.isEnabledFor(_DEBUG):
                    log.debug(
                        "Reconcile done: %r",
                        result,
                        extra=_log_fields(self.name, request, reconcile_id),
                    )
        finally:
            elapsed = time.perf_counter() - start
            self._active -= 1
            CURRENT_RECONCILE.reset(token)
            m.reconcile_time(elapsed)
            queue.done(request)

    async def _reconcile_with_timeout(self, request: Request) -> Result | None:
        timeout = self.options.reconcile_timeout
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._reconcile(request)
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # the reconciler's own TimeoutError
            self._m.timeouts()
            raise ReconcileTimeoutError(
                f"reconcile of {request} did not finish within {timeout}s and was cancelled"
            ) from exc

    def _failed(
        self, request: Request, priority: int, exc: BaseException, reconcile_id: str
    ) -> None:
        m = self._m
        m.errors()
        m.error()
        panic = is_panic(exc)
        if panic:
            m.panics()
        fields = _log_fields(self.name, request, reconcile_id)
        if _is_terminal(exc):
            m.terminal_errors()
            log.error("Terminal reconciler error; not requeued", exc_info=exc, extra=fields)
            return
        self.queue.add_rate_limited(request, priority=priority)
        log.error(
            "Reconciler panic; requeued with backoff"
            if panic
            else "Reconciler error; requeued with backoff",
            exc_info=exc,
            extra=fields,
        )

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "started" if self._started else "new"
        return f"<Controller {self.name!r} {state}, {len(self._workers)} workers>"


def check_reconciler(reconciler: object) -> ReconcileFunc:
    """The coroutine function to call for ``reconciler`` (a coroutine function taking the
    :class:`~controller_runtime.reconcile.Request`, or an object whose ``reconcile`` method is
    one). Anything else raises ``TypeError`` with one line naming the fix: a class instead of
    an instance, a plain ``def``, a coroutine (the function called instead of passed), a
    function that does not take exactly one argument."""
    if inspect.isclass(reconciler):
        name = reconciler.__name__
        if callable(getattr(reconciler, "reconcile", None)):
            raise TypeError(f"the reconciler {name} is a class; pass an instance: {name}(...)")
        raise TypeError(f"{name} is a class, not a reconciler: pass an async function")
    if inspect.iscoroutine(reconciler):
        reconciler.close()  # never awaited: close it, or Python warns about it later
        raise TypeError(
            f"got a coroutine ({reconciler.__qualname__}(...) was called): pass the function "
            f"itself, complete({reconciler.__qualname__})"
        )
    if isinstance(reconciler, Reconciler):
        fn: ReconcileFunc = reconciler.reconcile
    elif callable(reconciler):
        fn = reconciler
    else:
        raise TypeError(
            f"a reconciler is an async function or has an async reconcile method: {reconciler!r}"
        )
    name = getattr(fn, "__qualname__", None) or repr(fn)
    # Catch the common slip (``def`` instead of ``async def``) early; a lambda may well return
    # a coroutine, so it is let through (a non-awaitable result then fails each reconcile).
    plain = inspect.isfunction(fn) or inspect.ismethod(fn)
    if plain and fn.__name__ != "<lambda>" and not inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"the reconciler {name} must be a coroutine function (async def); run blocking "
            "code inside it with asyncio.to_thread"
        )
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise TypeError(
            f"the reconciler {name} must take one argument, the Request: "
            "async def reconcile(request) -> Result | None"
        ) from None
    except ValueError:
        pass  # no signature to inspect (some builtins and C callables): let it through
    return fn
