"""The reconcile contract: requests, results, terminal errors, and the context a reconcile
runs in.

A reconciler is an async callable ``reconcile(request) -> Result | None`` (or an object with
such a ``reconcile`` method). It is handed only the key of the object; it reads the current
state itself (from the cache, through the client) and drives the world towards the desired
state. Returning ``None`` or ``Result()`` means done; ``Result(requeue_after=s)`` asks to run
again after ``s`` seconds; raising an exception means a rate-limited retry, except
:class:`TerminalError`, which is recorded and not retried.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast, runtime_checkable

from controller_runtime.workqueue import ItemKeys
from kubeclient.discovery import ResourceInfo

if TYPE_CHECKING:  # fencing reads the current reconcile's fence from this module
    from controller_runtime.fencing import Fence

__all__ = [
    "REQUEST_KEYS",
    "ConsistencyGuard",
    "ReconcileContext",
    "ReconcileFunc",
    "Reconciler",
    "Request",
    "Result",
    "TerminalError",
    "current_reconcile",
]


class Request(NamedTuple):
    """The key of the object to reconcile. ``namespace`` is ``""`` for cluster-scoped ones."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def request_key(request: Request) -> str | Request:
    """The informer store key of the object ``request`` names (``"namespace/name"``, or
    ``"name"`` if cluster-scoped), which is how a controller's queue holds it.

    A request that a store key cannot name (its name contains ``/``, which no API server
    accepts) is its own key, so that the mapping stays one-to-one: keys are equal for equal
    requests only, and :func:`request_from_key` gives the request back.
    """
    namespace, name = request
    if type(name) is not str or type(namespace) is not str or "/" in name:
        return request
    return f"{namespace}/{name}" if namespace else name


def request_from_key(key: str | Request) -> Request:
    """The request :func:`request_key` made ``key`` of: the inverse of :func:`request_key`."""
    if type(key) is str:
        namespace, _, name = key.rpartition("/")
        return Request(namespace, name)
    return cast("Request", key)


REQUEST_KEYS: ItemKeys[Request] = ItemKeys(key_of=request_key, item_of=request_from_key)
"""How a controller's queue holds its requests: as their store keys (a queued request costs
no object of its own when its key comes from an informer's store, and about 60 B less
otherwise). Every store key the informers make, ``"namespace/name"`` or ``"name"`` of an
object whose name has no ``/``, is the key of its object's request."""


@dataclass(frozen=True, slots=True)
class Result:
    """What to do after a successful reconcile.

    ``requeue_after``: run again after this many seconds (the key is first forgotten by the
    rate limiter, as in controller-runtime). ``None`` (default): do not requeue.
    """

    requeue_after: float | None = None


class TerminalError(Exception):
    """A reconcile error that retrying cannot fix (bad user input, say): counted in
    ``controller_runtime_terminal_reconcile_errors_total``, logged, and not requeued."""


ReconcileFunc = Callable[[Request], Awaitable[Result | None]]


@runtime_checkable
class Reconciler(Protocol):
    """A class-based reconciler."""

    async def reconcile(self, request: Request) -> Result | None: ...


class ConsistencyGuard(Protocol):
    """Read-your-own-writes bookkeeping of one controller (implemented in
    :mod:`controller_runtime.consistency`).

    The client calls ``record_write``/``record_delete`` for every write made while a reconcile
    of ``request`` runs; the controller calls ``check`` before each reconcile.
    """

    def record_write(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        """The server answered a write of ``obj`` (its returned state, with the new RV)."""
        ...

    def record_delete(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        """A delete of ``obj`` (namespace, name and UID are used) was accepted."""
        ...

    def check(self, request: Request) -> float | None:
        """``None`` when the cache has observed every write recorded for ``request`` (run the
        reconcile now); otherwise the delay after which to try again."""
        ...


EchoTicket = tuple[str, str]
"""A conditioned write of a reconcile's own object, in flight: (the object's store key, the
resourceVersion the write required)."""


class OwnWriteRecorder(Protocol):
    """Where the client reports the conditioned writes of a reconcile (implemented by
    :class:`~controller_runtime.consistency.OwnWriteEchoes`)."""

    def expect(
        self,
        request: Request,
        resource: ResourceInfo,
        namespace: str | None,
        name: str,
        precondition: str,
    ) -> EchoTicket | None:
        """A write of ``namespace/name`` conditioned on ``precondition`` (the resourceVersion
        it requires) is about to be sent; a ticket if it is to be followed, else ``None``."""
        ...

    def answered(self, ticket: EchoTicket, obj: Mapping[str, Any]) -> None:
        """The write of ``ticket`` was answered with ``obj``."""
        ...

    def failed(self, ticket: EchoTicket) -> None:
        """The write of ``ticket`` failed, or its outcome is unknown."""
        ...


@dataclass(frozen=True, slots=True)
class ReconcileContext:
    """Where the current coroutine is: which controller reconciles which request.

    Set by the controller around each reconcile (a :mod:`contextvars` variable, so it follows
    the reconcile into every coroutine it awaits and tasks it creates). The client reads it to
    record its writes with the controller's :class:`ConsistencyGuard` and, when the controller
    skips the echoes of its own writes, with its :class:`OwnWriteRecorder`; and checks the
    controller's :class:`~controller_runtime.fencing.Fence` before each write it sends.
    """

    controller: str
    request: Request
    reconcile_id: str
    guard: ConsistencyGuard | None = None
    echoes: OwnWriteRecorder | None = None
    fence: Fence | None = None


CURRENT_RECONCILE: contextvars.ContextVar[ReconcileContext | None] = contextvars.ContextVar(
    "controller_runtime_current_reconcile", default=None
)


def current_reconcile() -> ReconcileContext | None:
    """The reconcile the calling coroutine belongs to, if any."""
    return CURRENT_RECONCILE.get()
