"""Fences: what a controller's work depends on holding (a leader Lease, a shard ring's slot),
checked on this process's monotonic clock at the moments that matter.

A process can be paused at any instant (a garbage-collection pause, a starved or frozen
container, SIGSTOP) and resume long after its lease expired and another process took over.
When it resumes, every timer that fell due during the pause fires at once, in no useful order:
a requeue may run before the renewal that would notice the loss. So the work does not rely on
being told: before a worker takes a request off its queue's hands to reconcile it, and before
the client sends each write on behalf of a reconcile, the fence is asked whether the deadline
(the last renewal that succeeded, counted from when it was *sent*, plus the renew deadline)
still lies ahead. If not, nothing is sent: the reconcile does not start (the request is put
back) and the write raises :class:`FencedError` before any byte leaves.

What this guarantees: no reconcile starts and no write is sent, for work whose lease this
process no longer provably holds, *after* the deadline on this process's monotonic clock. What
it cannot: a request sent just before a pause may still reach the server after the pause
(the request was already on its way); the server's preconditions (resourceVersion, UID) are
the answer to that, as everywhere.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Fence", "FencedError", "check_fence"]


class FencedError(RuntimeError):
    """A write was refused before it was sent: the lease the work depends on (leadership, or
    the slot of a sharded controller) is no longer provably held (its renew deadline passed,
    on this process's monotonic clock). The controller stops the work soon; nothing to do."""


@runtime_checkable
class Fence(Protocol):
    """Something work depends on holding."""

    def holds(self) -> bool:
        """True while the work may go on: the lease is held and its renew deadline (monotonic
        clock) lies ahead. Cheap (no I/O), called before each reconcile and write."""
        ...

    def describe(self) -> str:
        """What is held, for error messages (``"leadership of ns/name"``, ``"slot 3 of ring
        r"``)."""
        ...


def check_fence(fence: Fence | None) -> None:
    """Raise :class:`FencedError` when ``fence`` no longer holds (nothing when ``None``)."""
    if fence is not None and not fence.holds():
        raise FencedError(
            f"not sent: {fence.describe()} is no longer held (its renew deadline passed); "
            "the work stops and is taken over by the holder"
        )
