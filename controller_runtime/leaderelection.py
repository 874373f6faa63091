"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's algorithm.

Defaults are client-go's and controller-runtime's: lease duration 15 s, renew deadline 10 s,
retry period 2 s (validated: lease duration > renew deadline > 1.2 x retry period); identity
``<hostname>_<uuid>``.

How it decides:

* **Acquire**: every retry period (x1.2 jitter), GET the Lease; create it if missing; if
  another holder's record is still valid, wait. Validity is judged by the *local* time at
  which this process last saw the record change, plus the lease duration — never by the
  holder's ``renewTime`` (so clocks may be skewed; their *rate* must roughly agree).
  Otherwise take it over with a PUT carrying the Lease's resourceVersion (a 409 means someone
  else won this round).
* **Renew**: every retry period; a renewal that has not succeeded for ``renew_deadline`` (counted
  from when the last successful attempt was *sent*) means leadership is lost. The deadline is hard,
  as in client-go: an attempt still in flight when it passes is cancelled (each attempt is also
  capped at ``max(renew_deadline / 2, 1 s)``, client-go's request timeout), so the loss is declared
  at the deadline, never later (up to event-loop latency), however the API server or the network
  misbehaves. Losing it is final for this elector: the manager stops reconciling at once and the
  process exits non-zero (as controller-runtime does).
* **Failures** of an attempt — an error answer, a connection failure, or any unexpected
  exception (logged with its traceback and counted in
  ``controller_runtime_task_failures_total{task="leader-election"}``) — count as a failed
  attempt: the next one follows after the retry period, and only the deadline decides loss.
* **Release** on a clean stop: the Lease is written with no holder and a 1 s duration, so a
  follower takes over at its next retry instead of waiting for the lease to expire.

* **Pauses**: a leader whose process was paused past its deadline (a GC pause, SIGSTOP, a
  frozen container) may find timers of its controllers due before its renewal loop runs; so
  the controllers check :meth:`LeaderElector.holds` before each reconcile, and the transport
  right before each send of a write of a reconcile, of a leader-only runnable, of an Event
  they recorded, and of the renewal itself (:mod:`controller_runtime.fencing`): nothing is
  sent after the deadline, and the renewal loop then steps down.

Caveat (as client-go says): this is not fencing. A leader that is cut off may act for up to
the renew deadline before it notices, and a request sent just before a pause may arrive after
it; make writes conditional and effects idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import random
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NoReturn

from controller_runtime.fencing import FencedError, before_send
from controller_runtime.metrics import TASK_FAILURES
from kubeclient.errors import ApiError, ConflictError, NotFoundError
from kubeclient.transport import Transport

__all__ = [
    "LeaderElectionConfig",
    "LeaderElectionLostError",
    "LeaderElector",
]

log = logging.getLogger(__name__)

JITTER = 1.2


def default_identity() -> str:
    """``<hostname>_<uuid>``, unique per process even with equal hostnames."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


class LeaderElectionLostError(RuntimeError):
    """Leadership was lost (renewal failed past the deadline, or the lease was taken)."""


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the Lease lives and the timings (seconds)."""

    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.namespace or not self.name:
            raise ValueError("leader election needs a lease namespace and name")
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if self.retry_period <= 0:
            raise ValueError(f"retry period must be > 0 (got {self.retry_period})")
        if self.renew_deadline <= JITTER * self.retry_period:
            raise ValueError(
                f"renew deadline ({self.renew_deadline}s) must exceed {JITTER} x retry period "
                f"({self.retry_period}s)"
            )
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(
                f"lease duration ({self.lease_duration}s) must exceed the renew deadline "
                f"({self.renew_deadline}s)"
            )


def _micro_time(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease and keeps it while it can."""

    def __init__(
        self,
        transport: Transport,
        config: LeaderElectionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.transport = transport
        self.config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._path = (
            f"/apis/coordination.k8s.io/v1/namespaces/{config.namespace}/leases/{config.name}"
        )
        self._observed: dict[str, Any] | None = None  # the Lease's spec as last seen
        self._observed_at = 0.0
        self._lease_rv = ""
        self._last_renew = 0.0
        self.is_leader = False
        self.became_leader = asyncio.Event()
        self.transitions_seen = 0

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def renewed_at(self) -> float:
        """When (``clock`` seconds) the Lease was last acquired or renewed by this elector."""
        return self._last_renew

    def holds(self) -> bool:
        """Whether this process provably still leads: leader, and the renew deadline
        (``renewed_at + renew_deadline``, monotonic clock) lies ahead. The manager's
        controllers check it before each reconcile and write
        (:mod:`controller_runtime.fencing`), so a leader resumed after a pause past its
        deadline sends nothing before it steps down."""
        return self.is_leader and self._clock() < self._last_renew + self.config.renew_deadline

    def describe(self) -> str:
        return f"leadership of {self.config.namespace}/{self.config.name}"

    @property
    def attempt_timeout(self) -> float:
        """The cap on one acquire or renew attempt: ``max(renew_deadline / 2, 1 s)``."""
        return max(self.config.renew_deadline / 2, 1.0)

    @property
    def holder(self) -> str:
        """The holder as last observed ("" if none)."""
        return str((self._observed or {}).get("holderIdentity") or "")

    async def acquire(self) -> None:
        """Return once this process holds the Lease."""
        while True:
            sent = self._clock()
            if await self._attempt(self.attempt_timeout):
                self.is_leader = True
                self._last_renew = sent
                self.became_leader.set()
                log.info(
                    "became leader of %s/%s as %s",
                    self.config.namespace,
                    self.config.name,
                    self.identity,
                )
                return
            await asyncio.sleep(self.config.retry_period * (1 + self._rng.random() * (JITTER - 1)))

    async def keep(self) -> None:
        """Renew until leadership is lost; then raise :class:`LeaderElectionLostError`.

        Raises at ``renewed_at + renew_deadline`` at the latest (see the module docs)."""
        config = self.config
        while True:
            await asyncio.sleep(config.retry_period)
            deadline = self._last_renew + config.renew_deadline
            while True:
                remaining = deadline - self._clock()
                if remaining <= 0 or not self.is_leader:
                    self._lost()
                sent = self._clock()
                if await self._attempt(min(self.attempt_timeout, remaining)):
                    # Counted from when the attempt was sent, not when its answer came: the
                    # server wrote the Lease somewhere in between, and a pause before the
                    # answer was read must not stretch the deadline past the others' view.
                    self._last_renew = sent
                    break
                remaining = deadline - self._clock()
                if remaining > 0:
                    await asyncio.sleep(min(config.retry_period, remaining))

    def _lost(self) -> NoReturn:
        config = self.config
        self.is_leader = False
        raise LeaderElectionLostError(
            f"leader election lost: {config.namespace}/{config.name} not renewed for "
            f"{self._clock() - self._last_renew:.1f}s (renew deadline {config.renew_deadline}s; "
            f"holder now {self.holder or 'nobody'})"
        )

    async def _attempt(self, timeout: float) -> bool:
        """One acquire-or-renew, cancelled after ``timeout`` seconds. False on any failure."""
        try:
            async with asyncio.timeout(timeout):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            log.warning(
                "leader election: no answer about %s within %.1fs; attempt cancelled",
                self._path,
                timeout,
            )
            return False
        except FencedError as err:
            log.warning("leader election: renewal of %s not sent: %s", self._path, err)
            return False
        except Exception as err:
            # Not an error answer (those are handled below): a bug or a failure of the stack
            # under us. Leadership is decided by the deadline, so the attempt just failed.
            TASK_FAILURES.labels("leader-election").inc()
            log.error(
                "leader election: unexpected %s while updating %s; counted as a failed attempt",
                type(err).__name__,
                self._path,
                exc_info=err,
            )
            return False

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Acquire, then run ``lead()`` while renewing. Returns when ``lead`` returns (and
        releases the Lease); raises :class:`LeaderElectionLostError` on loss (``lead`` is
        cancelled first)."""
        await self.acquire()
        leading = asyncio.create_task(lead(), name="leader-work")
        keeping = asyncio.create_task(self.keep(), name="leader-renew")
        try:
            done, _ = await asyncio.wait({leading, keeping}, return_when=asyncio.FIRST_COMPLETED)
            if keeping in done:
                leading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await leading
                keeping.result()  # raises LeaderElectionLostError
            leading.result()
        finally:
            for task in (leading, keeping):
                task.cancel()
            for task in (leading, keeping):
                with contextlib.suppress(asyncio.CancelledError, LeaderElectionLostError):
                    await task
            if self.is_leader and self.config.release_on_cancel:
                await self.release()

    async def release(self) -> bool:
        """Give the Lease up (no holder, 1 s duration). True when released."""
        if not self.is_leader or self._observed is None:
            return False
        self.is_leader = False
        now = _micro_time()
        spec: dict[str, Any] = {
            **self._observed,
            "holderIdentity": None,
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
        }
        try:
            async with asyncio.timeout(self.attempt_timeout):
                try:
                    await self._put(spec)
                except ConflictError:
                    # A renewal cancelled in flight may have landed after all, moving the
                    # Lease's resourceVersion on: read it again, and release it with the new
                    # one if it is still ours (never someone else's).
                    lease = await self.transport.get_json(self._path)
                    if (lease.get("spec") or {}).get("holderIdentity") != self.config.identity:
                        raise
                    self._lease_rv = lease["metadata"]["resourceVersion"]
                    await self._put({**lease["spec"], **_released(spec)})
        except TimeoutError:
            log.warning(
                "could not release the lease %s: no answer within %.1fs; the follower takes "
                "over when it expires",
                self._path,
                self.attempt_timeout,
            )
            return False
        except Exception as err:
            log.warning(
                "could not release the lease %s (%s: %s); the follower takes over when it expires",
                self._path,
                type(err).__name__,
                err,
            )
            return False
        log.info("released the lease %s/%s", self.config.namespace, self.config.name)
        return True

    # -- the algorithm ------------------------------------------------------------------------

    async def _try_acquire_or_renew(self) -> bool:
        config = self.config
        now_wall = _micro_time()
        desired = {
            "holderIdentity": config.identity,
            "leaseDurationSeconds": int(config.lease_duration),
            "acquireTime": now_wall,
            "renewTime": now_wall,
            "leaseTransitions": 0,
        }
        try:
            lease = await self.transport.get_json(self._path)
        except NotFoundError:
            return await self._create(desired)
        except ApiError as err:
            log.warning("leader election: reading %s failed: %s", self._path, err)
            return False
        spec = lease.get("spec") or {}
        self._lease_rv = lease["metadata"]["resourceVersion"]
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._clock()
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or config.lease_duration)
        valid = self._clock() < self._observed_at + duration
        if holder and holder != config.identity and valid:
            return False  # someone else holds it
        if holder == config.identity:
            desired["acquireTime"] = spec.get("acquireTime") or now_wall
            desired["leaseTransitions"] = spec.get("leaseTransitions") or 0
        else:
            desired["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            answer = await self._put(desired)
        except ConflictError:
            return False
        except ApiError as err:
            log.warning("leader election: updating %s failed: %s", self._path, err)
            return False
        self._observed = dict(answer.get("spec") or desired)
        self._observed_at = self._clock()
        self.transitions_seen = int(self._observed.get("leaseTransitions") or 0)
        return True

    async def _create(self, spec: dict[str, Any]) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.config.name, "namespace": self.config.namespace},
            "spec": spec,
        }
        collection = self._path.rsplit("/", 1)[0]
        try:
            answer = (await self.transport.request("POST", collection, body=body)).json()
        except ApiError as err:
            if not isinstance(err, ConflictError):
                log.warning("leader election: creating %s failed: %s", self._path, err)
            return False
        self._lease_rv = answer["metadata"]["resourceVersion"]
        self._observed = dict(answer.get("spec") or spec)
        self._observed_at = self._clock()
        return True

    async def _put(self, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.config.name,
                "namespace": self.config.namespace,
                "resourceVersion": self._lease_rv,
            },
            "spec": spec,
        }
        # A renewal is sent only while the deadline lies ahead (checked right before each
        # send): a leader resumed after a pause steps down instead of renewing late.
        check = before_send(self) if self.is_leader else None
        answer: dict[str, Any] = (
            await self.transport.request("PUT", self._path, body=body, before_send=check)
        ).json()
        self._lease_rv = answer["metadata"]["resourceVersion"]
        return answer


def _released(spec: dict[str, Any]) -> dict[str, Any]:
    """The fields a release sets: no holder, a 1 s duration, the times of the release."""
    keys = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime")
    return {key: spec[key] for key in keys}
