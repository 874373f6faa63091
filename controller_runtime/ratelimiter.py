"""Rate limiters for work-queue requeues, with client-go's semantics.

A rate limiter answers one question: how long should this item wait before it is handed out
again? ``WorkQueue.add_rate_limited`` asks it, ``WorkQueue.forget`` resets it once an item
succeeds.

All limiters here are plain synchronous objects (no tasks, no timers): they only compute
delays, in seconds. They are meant to be used from one event loop and are not thread-safe.
Limiters that depend on time take a ``clock`` (default ``time.monotonic``) so that tests can
drive them with exact numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

__all__ = [
    "DEFAULT_BUCKET_MAX_WAIT",
    "BucketRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "default_controller_rate_limiter",
]

T = TypeVar("T", bound=Hashable)
T_contra = TypeVar("T_contra", bound=Hashable, contravariant=True)

Clock = Callable[[], float]

DEFAULT_BUCKET_MAX_WAIT = 60.0
"""Default cap, in seconds, on the wait returned by :class:`BucketRateLimiter`.

client-go's bucket has no cap: after a mass failure every item queues behind the bucket's
debt, so 10k failing keys at 10 qps wait ~16 minutes for their first retry (k/k#104554).
60 s still spaces out the first ``burst + 60 * qps`` retries (700 with the defaults), which is
what protects the API server, while bounding how stale any key can get because of other keys'
failures to one minute. Per-item backoff (the exponential limiter) is unaffected.
"""


class RateLimiter(Protocol[T_contra]):
    """What a work queue needs from a rate limiter (client-go's ``TypedRateLimiter``)."""

    def when(self, item: T_contra) -> float:
        """Record a failure of ``item`` and return how long (seconds) it should wait."""
        ...

    def forget(self, item: T_contra) -> None:
        """Stop tracking ``item`` (it succeeded): its next failure starts from scratch."""
        ...

    def num_requeues(self, item: T_contra) -> int:
        """How many failures of ``item`` are being tracked."""
        ...


class ItemExponentialFailureRateLimiter(Generic[T]):
    """Per-item exponential backoff: the n-th failure (from 0) waits ``base_delay * 2**n``.

    Defaults: ``base_delay=0.005`` (5 ms), ``max_delay=1000.0`` (1000 s), as in client-go's
    controller default. The delay never exceeds ``max_delay``, however many failures are
    recorded (the computation cannot overflow). Memory: one counter per failing item, freed by
    :meth:`forget`.
    """

    def __init__(self, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        if base_delay < 0 or max_delay < 0:
            raise ValueError("delays must be >= 0")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        try:
            # ldexp is exact (base * 2**exp) and raises instead of returning inf on overflow.
            delay = math.ldexp(self.base_delay, exp)
        except OverflowError:
            return self.max_delay
        return min(delay, self.max_delay)

    def forget(self, item: T) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: T) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter(Generic[T]):
    """A token bucket shared by all items: ``burst`` immediate retries, then ``qps`` per second.

    Defaults: ``qps=10.0``, ``burst=100`` (client-go's controller default), and
    ``max_wait=DEFAULT_BUCKET_MAX_WAIT`` (60 s, see there for why); ``max_wait=None`` removes the
    cap (client-go's behaviour).

    Like ``golang.org/x/time/rate``'s ``Reserve()``, every call takes a token, and the wait is
    how long until the bucket would have refilled to that token. When that wait would exceed
    ``max_wait`` the call returns exactly ``max_wait`` and the bucket's debt is not deepened any
    further, so after a storm the bucket recovers within ``max_wait`` instead of staying in debt
    for ``n / qps`` seconds. The price: items beyond the cap are not spaced out among
    themselves. The bucket does not track items: :meth:`forget` does nothing and
    :meth:`num_requeues` is always 0.
    """

    def __init__(
        self,
        qps: float = 10.0,
        burst: int = 100,
        *,
        max_wait: float | None = DEFAULT_BUCKET_MAX_WAIT,
        clock: Clock = time.monotonic,
    ) -> None:
        if not qps > 0:
            raise ValueError("qps must be > 0")
        if burst < 1:
            raise ValueError("burst must be >= 1")
        if max_wait is not None and max_wait < 0:
            raise ValueError("max_wait must be >= 0 or None")
        self.qps = qps
        self.burst = burst
        self.max_wait = max_wait
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, item: T) -> float:
        now = self._clock()
        tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps) - 1.0
        self._last = now
        if self.max_wait is not None:
            tokens = max(tokens, -self.max_wait * self.qps)
        self._tokens = tokens
        return -tokens / self.qps if tokens < 0 else 0.0

    def forget(self, item: T) -> None:
        pass

    def num_requeues(self, item: T) -> int:
        return 0


class MaxOfRateLimiter(Generic[T]):
    """Combine limiters: the wait is the longest any of them asks for.

    Every limiter is asked on every call (each records the failure); :meth:`forget` forgets in
    all of them; :meth:`num_requeues` is the largest count among them.
    """

    def __init__(self, *limiters: RateLimiter[T]) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters: tuple[RateLimiter[T], ...] = limiters

    def when(self, item: T) -> float:
        return max([limiter.when(item) for limiter in self.limiters])

    def forget(self, item: T) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


class ItemFastSlowRateLimiter(Generic[T]):
    """Per-item: the first ``max_fast_attempts`` failures wait ``fast_delay``, later ones
    ``slow_delay`` (seconds). No defaults, as in client-go. :meth:`forget` starts over."""

    def __init__(self, fast_delay: float, slow_delay: float, max_fast_attempts: int) -> None:
        if fast_delay < 0 or slow_delay < 0 or max_fast_attempts < 0:
            raise ValueError("delays and max_fast_attempts must be >= 0")
        self.fast_delay = fast_delay
        self.slow_delay = slow_delay
        self.max_fast_attempts = max_fast_attempts
        self._attempts: dict[T, int] = {}

    def when(self, item: T) -> float:
        attempts = self._attempts.get(item, 0) + 1
        self._attempts[item] = attempts
        return self.fast_delay if attempts <= self.max_fast_attempts else self.slow_delay

    def forget(self, item: T) -> None:
        self._attempts.pop(item, None)

    def num_requeues(self, item: T) -> int:
        return self._attempts.get(item, 0)


def default_controller_rate_limiter(
    *, clock: Clock = time.monotonic, bucket_max_wait: float | None = DEFAULT_BUCKET_MAX_WAIT
) -> MaxOfRateLimiter[T]:
    """controller-runtime's default: the max of per-item exponential backoff 5 ms → 1000 s and
    a shared 10 qps / burst 100 bucket.

    One deliberate difference: the bucket's wait is capped at ``bucket_max_wait`` (60 s by
    default, see :data:`DEFAULT_BUCKET_MAX_WAIT`); pass ``None`` for client-go's uncapped
    bucket. (controller-runtime's priority queue, its default queue since v0.23, uses the
    exponential limiter alone; use ``ItemExponentialFailureRateLimiter()`` for that.)
    """
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(10.0, 100, max_wait=bucket_max_wait, clock=clock),
    )
