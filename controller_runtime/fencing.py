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

The write's check is made by the transport right before *each* time the request is sent
(``before_send``, :mod:`kubeclient.transport`): after a wait for a pooled connection, a
``Retry-After`` sleep or a credential refresh the fence is read again, so a pause during any of
them cannot let a write out late.

Which writes are fenced: those of a reconcile (the controller's fence: the leader elector for a
leader-elected controller, the slot for a sharded one), and every client write made by work
started inside :func:`fenced_by` -- the manager starts leader-only runnables (storage-version
migration, self-managed webhook certificates) inside ``fenced_by(elector)``, so the tasks they
create write only while leadership provably holds. Events recorded by a fenced reconcile or
runnable are written only while that fence holds (dropped otherwise). Not fenced: effects
outside the API server (a database, a cloud API) -- a reconcile already running when the
process was paused finishes its current call to them; check :func:`current_fence` before each
such call where it matters.

What this guarantees: no reconcile starts and no write is sent, for work whose lease this
process no longer provably holds, *after* the deadline on this process's monotonic clock as
read just before sending. What it cannot: a request sent just before a pause may still reach
the server after the pause (the request was already on its way); the server's preconditions
(resourceVersion, UID) are the answer to that, as everywhere.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from controller_runtime.reconcile import CURRENT_RECONCILE

__all__ = [
    "Fence",
    "FencedError",
    "before_send",
    "check_fence",
    "current_fence",
    "fenced_by",
]


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


_AMBIENT: contextvars.ContextVar[Fence | None] = contextvars.ContextVar(
    "controller_runtime_fence", default=None
)


@contextlib.contextmanager
def fenced_by(fence: Fence | None) -> Iterator[None]:
    """Work started in this block -- the coroutines it awaits and every task created in it,
    which copy the context -- writes through the client only while ``fence`` holds
    (``None``: no fence)."""
    token = _AMBIENT.set(fence)
    try:
        yield
    finally:
        _AMBIENT.reset(token)


def current_fence() -> Fence | None:
    """The fence of the calling code's work: its reconcile's, else the one of the enclosing
    :func:`fenced_by`, else ``None``."""
    context = CURRENT_RECONCILE.get()
    if context is not None and context.fence is not None:
        return context.fence
    return _AMBIENT.get()


def before_send(fence: Fence | None) -> Callable[[], None] | None:
    """The transport hook that checks ``fence`` right before each send (``None`` for no
    fence)."""
    return None if fence is None else functools.partial(check_fence, fence)
