"""The reflector's core as a sans-IO state machine.

The machine decides *what* to do; a driver does it. Every input is a method that takes the
driver's clock value ``now`` (seconds, monotonic) and returns a list of effects: the next request
to make, the store changes to apply, the delay to wait, and metric/log hooks. Nothing here opens a
connection, sleeps, decodes bytes, reads a clock or touches a store, so the same core runs under
asyncio, in the benchmark, and under hypothesis with a simulated API server.

The driver loop, in short::

    effects = machine.start(now())
    while True:
        for effect in effects:            # apply in order; at most one "next step" effect
            ...                           # ListRequest / WatchRequest / Sleep come last
        effects = <feed what happened>    # list_page, list_failed, watch_started, watch_event,
                                          # watch_ended, watch_failed, idle_timeout, sleep_done

States (see :class:`State`) follow kube-rs's watcher in spirit; every transition is named
(:class:`Transition`, readable as :attr:`ReflectorMachine.last_transition`)::

    from            input (effects)                             transition          to
    EMPTY           start, streaming usable                     START_STREAM        STREAMING_LIST
    EMPTY           start, otherwise                            START_LIST          LISTING
    LISTING         page with a continue token                  NEXT_PAGE           LISTING
    LISTING         last page (ReplaceStore, WatchRequest)      LIST_DONE           WATCHING
    LISTING         410 on page >= 2, or on page 1 at an RV     LIST_RESTART        LISTING
    LISTING         any other failure                           LIST_RETRY_LATER    BACKOFF
    STREAMING_LIST  events, plain bookmarks (buffered)          -                   STREAMING_LIST
    STREAMING_LIST  initial-events-end bookmark (ReplaceStore)  STREAM_SYNCED       WATCHING
    STREAMING_LIST  422/400 (remembered for good)               STREAM_UNSUPPORTED  LISTING
    STREAMING_LIST  clean end without the bookmark              STREAM_FALLBACK     LISTING
    STREAMING_LIST  any other failure, idle timeout             STREAM_RETRY_LATER  BACKOFF
    WATCHING        events, bookmarks (ApplyEvent, Bookmark)    -                   WATCHING
    WATCHING        clean end after >= 1 s or >= 1 event        WATCH_TIMEOUT       WATCHING
    WATCHING        cut, idle, 429, refused, 5xx+Retry-After    REWATCH_LATER       BACKOFF
    WATCHING        410, 504 too large, very short, malformed   RELIST_LATER        BACKOFF
    BACKOFF         sleep_done: relist, streaming usable        RESUME_STREAM       STREAMING_LIST
    BACKOFF         sleep_done: relist, or retry a page         RESUME_LIST         LISTING
    BACKOFF         sleep_done: re-watch                        RESUME_WATCH        WATCHING
    any             stop (CloseWatch if open)                   STOP                STOPPED

Wire semantics implemented here (numbers from client-go ``tools/cache/reflector.go``, the pager,
and the apiserver; docs/design.md, "Wire semantics are handled on purpose"):

- Paginated LIST (``limit=500``, ``continue``); pages may be empty with a token, only an empty
  token ends the list, the list RV is taken from the first page. A 410 on a continue page means
  the token expired: the list restarts from page 1 (never with the inconsistent token); a second
  expiry in the same list falls back to one unpaged list, like client-go's ``FullListIfExpired``.
- LIST ``resourceVersion``: ``"0"`` for the first list (any, from the watch cache), the last synced
  RV with ``resourceVersionMatch=NotOlderThan`` for later relists, and unset (``""``, a consistent
  read) after a 410/Expired or a 504 ResourceVersionTooLarge on a list or a 504 in a watch. A
  continue request carries neither ``resourceVersion`` nor ``resourceVersionMatch`` (the server
  rejects them).
- Streaming list (KEP-3157, option ``streaming_list``, default on): ``sendInitialEvents=true``,
  ``resourceVersionMatch=NotOlderThan``, ``allowWatchBookmarks=true``. Initial ADDEDs (in any
  order) and MODIFIED/DELETED arriving before the ``k8s.io/initial-events-end`` bookmark go into a
  private pending snapshot that is swapped in as one :class:`ReplaceStore` at that bookmark.
- Watch: ``resourceVersion`` = last synced RV, ``allowWatchBookmarks``, ``timeoutSeconds`` random
  in [300, 600). Every event with an RV (bookmarks included) advances the last synced RV.
- Watch endings: a clean EOF after >= 1 s or after any event re-watches at once, without relist;
  a clean EOF in < 1 s with 0 events backs off and relists (client-go ``VeryShortWatchError``); a
  cut connection or an idle timeout backs off and re-watches from the last RV; ERROR 410 backs
  off and relists; ERROR 504 ResourceVersionTooLarge waits ``retryAfterSeconds`` (default 1 s)
  and relists at ``""``; a 429 or a refused connection backs off (or honours ``Retry-After``) and
  re-watches **without** relisting; anything else (401/403/404/500 ...) is logged, backs off and
  relists. A malformed event (:meth:`~ReflectorMachine.watch_event_malformed`: not JSON, not an
  object, a ``type`` or ``object`` of the wrong shape) closes the watch, backs off and relists,
  as client-go does with an undecodable event; an ERROR event whose object is not a Status reads
  as a 500 (relist), a BOOKMARK without a usable resourceVersion is logged and ignored. Nothing
  raises on server behaviour.
- A 5xx on the watch request with ``Retry-After`` waits that long and re-watches (what
  client-go's request retry does); without it, backoff and relist.
- Logs: a 429 is expected for a moment (a fresh API server answers "storage is
  (re)initializing" until its watch cache is ready; flow control sheds bursts), so the first
  :data:`QUIET_THROTTLES` (2) in a row, without a LIST page or a watch's 200 in between, log at
  DEBUG; from the third on the throttling persists and logs at its usual level, with the count.
- Backoff: 0.8 s, x2, capped at 30 s, each sleep jittered into [d, 2d) like client-go's
  ``Jitter(d, 1.0)``. A positive ``Retry-After`` is honoured exactly (capped at
  ``max_retry_after``) instead of the backoff delay, and still counts as a failure. The schedule
  resets when a failure comes after >= 2 min of continuous health (a LIST page or a watch's 200
  received, no failure since). This differs from client-go's ``DelayWithReset``, which resets
  after 2 min without a backoff call even if nothing succeeded in between.

Caveats:

- The machine keeps the last synced RV as an opaque string and never compares RVs: a server is
  trusted to send events in order after the RV asked for. Guarding a store against regressions
  (duplicate or stale events) is the store's job, via the resource-version helper.
- Inputs that make no sense in the current state (a ``list_page`` while watching, a
  ``watch_event`` after the machine emitted :class:`CloseWatch`) are driver bugs and raise
  :class:`ReflectorProtocolError`. Two exceptions, because timers race: ``idle_timeout`` without
  an open watch is ignored, and every input after :meth:`ReflectorMachine.stop` returns ``[]``.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgspec

__all__ = [
    "INITIAL_EVENTS_END_ANNOTATION",
    "QUIET_THROTTLES",
    "ApplyEvent",
    "Bookmark",
    "CloseWatch",
    "Effect",
    "ListRequest",
    "Log",
    "ReflectorMachine",
    "ReflectorOptions",
    "ReflectorProtocolError",
    "Relisting",
    "ReplaceStore",
    "Sleep",
    "State",
    "StatusInfo",
    "Synced",
    "Transition",
    "WatchRequest",
    "WatchRestarted",
    "parse_status",
]

QUIET_THROTTLES: Final = 2
"""429 answers in a row (no LIST page or watch 200 in between) logged at DEBUG before the
throttling counts as persisting and logs at its usual level (see ``_throttled_log``)."""

INITIAL_EVENTS_END_ANNOTATION: Final = "k8s.io/initial-events-end"
"""Annotation (value ``"true"``) on the one bookmark that ends a streaming list's initial events."""

_CAUSE_TOO_LARGE: Final = "ResourceVersionTooLarge"


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReflectorOptions:
    """Tunables of one reflector; the defaults are client-go's and kube-rs's numbers.

    Attributes:
        page_size: ``limit`` of each LIST page (default 500, client-go's pager and kube-rs).
            ``0`` lists unpaged.
        streaming_list: try a streaming list (watch with ``sendInitialEvents=true``) for every
            full sync (default True, as client-go from 1.35). A 422/400 answer disables it for
            the lifetime of the machine; other failures fall back to LIST for that sync only.
        allow_bookmarks: send ``allowWatchBookmarks=true`` on plain watches (default True).
            Streaming lists always ask for bookmarks: the end-of-initial-events bookmark needs it.
        watch_timeout_min: lower bound (inclusive) of the random ``timeoutSeconds`` (300).
        watch_timeout_max: upper bound (exclusive) of the random ``timeoutSeconds`` (600).
        idle_margin: the idle window is the requested ``timeoutSeconds`` plus this (10 s): with no
            bytes for that long the connection is presumed half-open (HTTP/1.1 has no pings).
        backoff_initial: first backoff delay before jitter (0.8 s).
        backoff_factor: growth per consecutive failure (2).
        backoff_cap: cap of the delay before jitter (30 s, so sleeps land in [30, 60)).
        backoff_jitter: each sleep is ``d * (1 + jitter * U[0, 1))`` (1.0, client-go's value).
        backoff_reset_after: after this long continuously healthy (a request succeeded and no
            failure since), the next failure starts again from ``backoff_initial`` (120 s).
        very_short_watch: a watch that ends cleanly sooner than this (1 s) with no event at all
            is treated as a failure: backoff, then relist.
        too_large_retry_after: wait after a 504 ResourceVersionTooLarge without
            ``retryAfterSeconds`` (1 s, the server's usual value).
        max_retry_after: cap on an honoured ``Retry-After`` (60 s; APF sends at most 32).
    """

    page_size: int = 500
    streaming_list: bool = True
    allow_bookmarks: bool = True
    watch_timeout_min: int = 300
    watch_timeout_max: int = 600
    idle_margin: float = 10.0
    backoff_initial: float = 0.8
    backoff_factor: float = 2.0
    backoff_cap: float = 30.0
    backoff_jitter: float = 1.0
    backoff_reset_after: float = 120.0
    very_short_watch: float = 1.0
    too_large_retry_after: float = 1.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.page_size < 0:
            raise ValueError("page_size must be >= 0")
        if not 1 <= self.watch_timeout_min < self.watch_timeout_max:
            raise ValueError("need 1 <= watch_timeout_min < watch_timeout_max")
        if self.idle_margin <= 0:
            raise ValueError("idle_margin must be > 0")
        if not 0 < self.backoff_initial <= self.backoff_cap:
            raise ValueError("need 0 < backoff_initial <= backoff_cap")
        if self.backoff_factor < 1 or self.backoff_jitter < 0:
            raise ValueError("need backoff_factor >= 1 and backoff_jitter >= 0")
        if self.too_large_retry_after <= 0 or self.max_retry_after <= 0:
            raise ValueError("retry-after values must be > 0")

    def backoff_base(self, step: int) -> float:
        """The un-jittered delay of the ``step``-th consecutive failure (0-based)."""
        # min() before the power would overflow for absurd step counts; the step is clamped by
        # the machine anyway, this keeps the function total.
        return min(self.backoff_initial * self.backoff_factor ** min(step, 64), self.backoff_cap)


# --------------------------------------------------------------------------------------------
# Effects (outputs)
# --------------------------------------------------------------------------------------------
# Effects and the records below are frozen msgspec structs rather than dataclasses: the same
# immutable records (keyword or positional construction, equality within one type, repr,
# match), made at import about 20x faster (0.03 against 0.5 ms a class), which is part of a
# small operator's start-up (docs/benchmarks.md, "Start-up").


class ListRequest(msgspec.Struct, frozen=True):
    """Make one LIST request with these query parameters (to add to any selectors).

    Answer with :meth:`ReflectorMachine.list_page` or :meth:`ReflectorMachine.list_failed`
    (status 0 for a connection error or a request timeout). ``page`` is 1-based.
    """

    params: dict[str, str]
    page: int


class WatchRequest(msgspec.Struct, frozen=True):
    """Open a watch with these query parameters (to add to any selectors).

    Answer with :meth:`~ReflectorMachine.watch_started` on HTTP 200 (or
    :meth:`~ReflectorMachine.watch_failed`), then one :meth:`~ReflectorMachine.watch_event` per
    decoded line and :meth:`~ReflectorMachine.watch_ended` at the end of the body. Arm an idle
    timer of ``idle_timeout_seconds``, restarted on every byte received, and call
    :meth:`~ReflectorMachine.idle_timeout` when it fires. ``streaming`` is True for a streaming
    list: the initial state arrives on this stream.
    """

    params: dict[str, str]
    timeout_seconds: int
    idle_timeout_seconds: float
    streaming: bool


class Sleep(msgspec.Struct, frozen=True):
    """Wait ``seconds``, then call :meth:`ReflectorMachine.sleep_done`.

    ``retry_after`` is True when the delay is the server's ``Retry-After`` rather than backoff.
    """

    seconds: float
    reason: str
    retry_after: bool = False


class ReplaceStore(msgspec.Struct, frozen=True):
    """Swap the store's whole content for ``items`` atomically, at ``resource_version``.

    Keys present in the store and absent here must be reported as deletions (docs/design.md,
    "Relists replace the store at once").
    """

    items: list[Any]
    resource_version: str


class ApplyEvent(msgspec.Struct, frozen=True):
    """Apply one watch event (``ADDED``, ``MODIFIED`` or ``DELETED``) to the store."""

    event_type: str
    obj: Any


class Bookmark(msgspec.Struct, frozen=True):
    """The server vouches that everything up to ``resource_version`` was delivered.

    No store content changes; the store may record it as its observed RV.
    """

    resource_version: str


class Synced(msgspec.Struct, frozen=True):
    """The store holds a complete state for the first time (emitted once, after a ReplaceStore)."""


class CloseWatch(msgspec.Struct, frozen=True):
    """Abandon the open watch (or pending watch request) and feed nothing more from it."""

    reason: str


class Relisting(msgspec.Struct, frozen=True):
    """Metric hook: a full resync (LIST or streaming list) was decided, for ``reason``."""

    reason: str


class WatchRestarted(msgspec.Struct, frozen=True):
    """Metric hook: the watch is re-established from the last RV without a relist."""

    reason: str


class Log(msgspec.Struct, frozen=True):
    """Something a human should be able to read; ``level`` is a :mod:`logging` level."""

    level: int
    message: str


Effect: TypeAlias = (
    ListRequest
    | WatchRequest
    | Sleep
    | ReplaceStore
    | ApplyEvent
    | Bookmark
    | Synced
    | CloseWatch
    | Relisting
    | WatchRestarted
    | Log
)
"""Everything an input can return. Requests and :class:`Sleep` are always the last effect."""


# --------------------------------------------------------------------------------------------
# States and transitions
# --------------------------------------------------------------------------------------------


class State(enum.Enum):
    """Where the machine is. Each value's docstring says what holds in it."""

    EMPTY = "empty"
    """Not started. The store is empty; :meth:`ReflectorMachine.start` is the only valid input."""

    LISTING = "listing"
    """A paginated LIST is in flight (one :class:`ListRequest` outstanding).

    Pages accumulate privately; the store is untouched until the last page, which produces one
    :class:`ReplaceStore` and a :class:`WatchRequest` from the list's RV. Used when streaming
    lists are off, unsupported, or failed for the current sync.
    """

    STREAMING_LIST = "streaming-list"
    """A streaming list (watch with ``sendInitialEvents``) is open, before its end bookmark.

    Events accumulate in a private pending snapshot; the store is untouched. The annotated
    bookmark swaps the snapshot in (:class:`ReplaceStore`) and moves to WATCHING on the same
    connection. Any failure before it falls back to LIST; a 422/400 disables streaming for good.
    """

    WATCHING = "watching"
    """The store is complete at :attr:`ReflectorMachine.resource_version`; a watch is open (or its
    request is outstanding) and each event becomes an :class:`ApplyEvent`/:class:`Bookmark`."""

    BACKOFF = "backoff"
    """Waiting out a :class:`Sleep`; :meth:`ReflectorMachine.sleep_done` resumes with a relist,
    a re-watch or a retry of the same LIST page. No connection is open."""

    STOPPED = "stopped"
    """Terminal; every input returns ``[]``."""


class Transition(enum.Enum):
    """Named transitions, available as :attr:`ReflectorMachine.last_transition`."""

    START_LIST = "start-list"  # EMPTY -> LISTING
    START_STREAM = "start-stream"  # EMPTY -> STREAMING_LIST
    NEXT_PAGE = "next-page"  # LISTING -> LISTING (continue token)
    LIST_RESTART = "list-restart"  # LISTING -> LISTING (410 continue / RV expired)
    LIST_DONE = "list-done"  # LISTING -> WATCHING (ReplaceStore, WatchRequest)
    LIST_RETRY_LATER = "list-retry-later"  # LISTING -> BACKOFF
    STREAM_SYNCED = "stream-synced"  # STREAMING_LIST -> WATCHING (ReplaceStore at bookmark)
    STREAM_UNSUPPORTED = "stream-unsupported"  # STREAMING_LIST -> LISTING (422/400)
    STREAM_FALLBACK = "stream-fallback"  # STREAMING_LIST -> LISTING (ended without bookmark)
    STREAM_RETRY_LATER = "stream-retry-later"  # STREAMING_LIST -> BACKOFF (then LIST)
    WATCH_TIMEOUT = "watch-timeout"  # WATCHING -> WATCHING (clean EOF, new WatchRequest)
    REWATCH_LATER = "rewatch-later"  # WATCHING -> BACKOFF (then re-watch from last RV)
    RELIST_LATER = "relist-later"  # WATCHING -> BACKOFF (then full resync)
    RESUME_LIST = "resume-list"  # BACKOFF -> LISTING
    RESUME_STREAM = "resume-stream"  # BACKOFF -> STREAMING_LIST
    RESUME_WATCH = "resume-watch"  # BACKOFF -> WATCHING
    STOP = "stop"  # any -> STOPPED


class _Resume(enum.Enum):
    """What :meth:`ReflectorMachine.sleep_done` does."""

    FULL_SYNC = "full-sync"  # streaming list if usable, else LIST from page 1
    LIST_PAGE = "list-page"  # repeat the failed LIST request (same page, same token)
    REWATCH = "rewatch"  # plain watch from the last synced RV


class ReflectorProtocolError(RuntimeError):
    """The driver fed an input that is not valid in the machine's current state."""


# --------------------------------------------------------------------------------------------
# metav1.Status
# --------------------------------------------------------------------------------------------


class StatusInfo(msgspec.Struct, frozen=True):
    """The parts of a ``metav1.Status`` (or an HTTP error) the machine acts on.

    ``code`` 0 means a connection error (no HTTP status at all).
    """

    code: int
    reason: str = ""
    message: str = ""
    retry_after: float | None = None
    causes: tuple[str, ...] = ()

    @property
    def expired(self) -> bool:
        """410, reason ``Expired`` (``Gone`` before 1.18): the RV or continue token is too old."""
        return self.code == 410 or self.reason in ("Expired", "Gone")

    @property
    def too_large(self) -> bool:
        """504 with cause ``ResourceVersionTooLarge``: the server has not reached the RV yet."""
        if _CAUSE_TOO_LARGE in self.causes or self.reason == _CAUSE_TOO_LARGE:
            return True
        # Servers before the cause existed only said so in the message.
        return self.code == 504 and "too large resource version" in self.message.lower()

    def describe(self) -> str:
        text = f"{self.code or 'connection error'}"
        if self.reason:
            text += f" {self.reason}"
        if self.message:
            text += f": {self.message}"
        return text


def parse_status(obj: Any) -> StatusInfo:
    """Read a ``metav1.Status`` dict (an ERROR event's object or a JSON error body).

    Tolerant of missing or mistyped fields: a Status without a numeric ``code`` reads as 500,
    so it is handled as a generic server error, and anything that is not a JSON object at all
    (``null``, a string, a list) reads as a 500 ``BadStatus``. Drivers can use it on HTTP error
    bodies to fill ``reason``/``retry_after``/``message`` of ``list_failed``/``watch_failed``
    (pass the ``ResourceVersionTooLarge`` cause as ``reason`` when :attr:`StatusInfo.too_large`).
    """
    if not isinstance(obj, Mapping):
        return StatusInfo(500, "BadStatus", f"the Status is a {type(obj).__name__}, not an object")
    code = obj.get("code")
    details = obj.get("details")
    retry_after: float | None = None
    causes: list[str] = []
    if isinstance(details, Mapping):
        ra = details.get("retryAfterSeconds")
        if isinstance(ra, int | float) and not isinstance(ra, bool) and ra > 0:
            retry_after = float(ra)
        raw_causes = details.get("causes")
        if isinstance(raw_causes, list):
            for cause in raw_causes:
                if isinstance(cause, Mapping) and isinstance(cause.get("reason"), str):
                    causes.append(cause["reason"])
    reason = obj.get("reason")
    message = obj.get("message")
    return StatusInfo(
        code=code if isinstance(code, int) and not isinstance(code, bool) else 500,
        reason=reason if isinstance(reason, str) else "",
        message=message if isinstance(message, str) else "",
        retry_after=retry_after,
        causes=tuple(causes),
    )


def _metadata(obj: Any) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def _object_rv(obj: Any) -> str:
    rv = _metadata(obj).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


class _FailurePlan(msgspec.Struct, frozen=True):
    """What a failed plain watch leads to: its log line, metric hook, and how to resume."""

    level: int
    message: str
    hook: Relisting | WatchRestarted
    resume: _Resume
    transition: Transition
    reason: str
    too_large: bool = False


def _plan_watch_failure(info: StatusInfo, what: str) -> _FailurePlan:
    """The rows WATCHING -> BACKOFF of the transition table, for an HTTP error or an ERROR
    event (``what`` describes it)."""
    if info.expired:
        # client-go: backoff, then relist at the last RV (NotOlderThan, so no 410 again).
        return _FailurePlan(
            logging.INFO,
            f"watch expired ({what}); relisting",
            Relisting("watch expired"),
            _Resume.FULL_SYNC,
            Transition.RELIST_LATER,
            "watch expired",
        )
    if info.too_large:
        return _FailurePlan(
            logging.INFO,
            f"{what}; relisting at the latest resourceVersion",
            Relisting("watch resourceVersion too large"),
            _Resume.FULL_SYNC,
            Transition.RELIST_LATER,
            "resourceVersion too large",
            too_large=True,
        )
    if info.code in (0, 429) or (info.code >= 500 and info.retry_after is not None):
        # Throttled or unreachable: the RV is still good, so no relist
        # (client-go TestNoRelistOnTooManyRequests).
        return _FailurePlan(
            logging.INFO,
            f"watch refused ({what}); re-watching after a delay",
            WatchRestarted(f"watch refused ({info.code})"),
            _Resume.REWATCH,
            Transition.REWATCH_LATER,
            f"watch refused ({info.code})",
        )
    # 401/403/404/500/unknown: client-go ends ListAndWatch and relists after backoff. A 404 can
    # mean the CRD was recreated, which only a relist repairs.
    return _FailurePlan(
        logging.ERROR if info.code in (401, 403, 404) else logging.WARNING,
        f"watch failed ({what}); relisting after a delay",
        Relisting(f"watch failed ({info.code})"),
        _Resume.FULL_SYNC,
        Transition.RELIST_LATER,
        f"watch failed ({info.code})",
    )


def _object_key(obj: Any) -> str | None:
    """``namespace/name`` (or ``name`` when cluster-scoped), like client-go's key function."""
    meta = _metadata(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _is_initial_events_end(obj: Any) -> bool:
    annotations = _metadata(obj).get("annotations")
    return (
        isinstance(annotations, Mapping)
        and annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true"
    )


# --------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------


class ReflectorMachine:
    """One resource's list+watch bookkeeping, as pure transitions.

    Guarantees (for any sequence of server behaviour fed faithfully by the driver):

    - The store built only from :class:`ReplaceStore` and :class:`ApplyEvent` effects is, after
      each of them, the server's state at some RV: a relist is one atomic swap and is never
      built from a continue token after it expired, a streaming list is swapped in only at its
      end bookmark, and a watch is only resumed from the RV of the last complete event.
    - Each input returns at most one "next step" effect (:class:`ListRequest`,
      :class:`WatchRequest` or :class:`Sleep`), always last; while a watch is open and healthy,
      inputs return none and the driver keeps reading.
    - :class:`Synced` is emitted exactly once, right after the first :class:`ReplaceStore`.
    - Every backoff :class:`Sleep` is within ``[d, d * (1 + jitter))`` for the current step's
      ``d``; a ``Retry-After`` sleep is exactly the server's value (capped).

    Args:
        options: tunables, see :class:`ReflectorOptions`.
        rng: source of the watch-timeout and jitter randomness (inject a seeded one in tests).
        key_of, rv_of: read the key (``namespace/name``, or None when unnamed) and the
            resourceVersion of a listed or watched object. Objects are opaque to the machine
            otherwise, so a driver may hand it a compact form (the store's pre-encoded entries)
            instead of decoded dicts; the defaults read dicts. Bookmarks and ERROR objects are
            always dicts.
    """

    def __init__(
        self,
        options: ReflectorOptions | None = None,
        *,
        rng: random.Random | None = None,
        key_of: Callable[[Any], str | None] | None = None,
        rv_of: Callable[[Any], str] | None = None,
    ) -> None:
        self._key_of = key_of if key_of is not None else _object_key
        self._rv_of = rv_of if rv_of is not None else _object_rv
        self._opts = options if options is not None else ReflectorOptions()
        self._rng = rng if rng is not None else random.Random()
        self._state = State.EMPTY
        self._last_transition: Transition | None = None

        # Sync bookkeeping.
        self._last_sync_rv = ""
        # client-go's isLastSyncResourceVersionUnavailable: the next full sync asks for "".
        self._rv_unavailable = False
        self._synced = False
        self._streaming_supported = self._opts.streaming_list
        # Set when a streaming list failed: the current full sync finishes by LIST.
        self._stream_fallback = False

        # LISTING.
        self._list_rv_param = ""
        self._list_rv = ""
        self._list_items: list[Any] = []
        self._continue = ""
        self._page = 1
        self._unpaged = False
        self._continue_expiries = 0

        # STREAMING_LIST: the snapshot being built, by key.
        self._pending: dict[str, Any] = {}

        # The current watch (plain or streaming).
        self._watch_open = False
        self._watch_established = False
        self._watch_started_at = 0.0
        self._watch_events = 0
        self._idle_timeout = float(self._opts.watch_timeout_max) + self._opts.idle_margin

        # BACKOFF.
        self._resume = _Resume.FULL_SYNC
        self._backoff_step = 0
        self._healthy_since: float | None = None
        self._throttled = 0  # 429s in a row, since the last LIST page or watch 200

    # ---- read-only view -------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The current :class:`State`."""
        return self._state

    @property
    def last_transition(self) -> Transition | None:
        """The most recent named transition (``None`` before :meth:`start`)."""
        return self._last_transition

    @property
    def synced(self) -> bool:
        """True once the store has held a complete state (it stays True across relists)."""
        return self._synced

    @property
    def resource_version(self) -> str:
        """The last synced RV: of the last relist, or of the last event/bookmark after it."""
        return self._last_sync_rv

    @property
    def streaming_supported(self) -> bool:
        """False when streaming lists are off or the server refused one (422/400)."""
        return self._streaming_supported

    @property
    def watch_open(self) -> bool:
        """True while a watch request or stream belongs to the machine."""
        return self._watch_open

    @property
    def idle_timeout_seconds(self) -> float:
        """The idle window for the current (or next) watch: ``timeoutSeconds + idle_margin``."""
        return self._idle_timeout

    @property
    def backoff_step(self) -> int:
        """Consecutive failures counted by the backoff (0 after a reset)."""
        return self._backoff_step

    # ---- inputs -----------------------------------------------------------------------------

    def start(self, now: float) -> list[Effect]:
        """Begin the first sync: a streaming list if enabled, else a LIST at ``RV="0"``."""
        if self._state is State.STOPPED:
            return []
        self._expect(State.EMPTY, "start")
        return self._begin_full_sync(now, resumed=False)

    def stop(self, now: float) -> list[Effect]:
        """Stop for good: closes an open watch; later inputs return ``[]``."""
        del now  # part of the uniform input signature
        effects: list[Effect] = []
        if self._watch_open:
            effects.append(CloseWatch("reflector stopped"))
            self._watch_open = False
        self._pending = {}
        self._list_items = []
        self._goto(State.STOPPED, Transition.STOP)
        return effects

    def list_page(
        self,
        now: float,
        items: list[Any],
        resource_version: str,
        continue_token: str,
    ) -> list[Effect]:
        """One LIST page arrived (HTTP 200). ``continue_token`` is ``""`` on the last page."""
        if self._state is State.STOPPED:
            return []
        self._expect(State.LISTING, "list_page")
        self._note_healthy(now)
        effects: list[Effect] = []
        if self._page == 1:
            # The list RV is constant across pages; only the first page's is authoritative.
            self._list_rv = resource_version
            if not resource_version:
                effects.append(Log(logging.WARNING, "LIST returned no resourceVersion"))
        self._list_items.extend(items)
        if continue_token:
            # Even an empty page with a token means "more to come".
            self._continue = continue_token
            self._page += 1
            self._last_transition = Transition.NEXT_PAGE
            effects.append(ListRequest(self._list_params(), self._page))
            return effects
        items_all, self._list_items = self._list_items, []
        effects += self._complete_sync(items_all, self._list_rv)
        effects.append(self._watch_request(now, streaming=False))
        self._goto(State.WATCHING, Transition.LIST_DONE)
        return effects

    def list_failed(
        self,
        now: float,
        status: int,
        *,
        reason: str = "",
        retry_after: float | None = None,
        message: str = "",
    ) -> list[Effect]:
        """The outstanding LIST failed: HTTP ``status``, or 0 for a connection error/timeout.

        ``reason`` is the Status reason (or the ``ResourceVersionTooLarge`` cause), and
        ``retry_after`` the ``Retry-After`` header or ``retryAfterSeconds``, in seconds.
        """
        if self._state is State.STOPPED:
            return []
        self._expect(State.LISTING, "list_failed")
        info = StatusInfo(status, reason, message, retry_after)
        what = f"LIST page {self._page} failed: {info.describe()}"
        if info.expired and self._page > 1:
            # The continue token expired. A 410 may carry a token that continues
            # inconsistently; a cache must never use it: restart from page 1.
            self._continue_expiries += 1
            unpaged = self._continue_expiries >= 2
            tail = "; listing unpaged" if unpaged else "; restarting from page 1"
            effects: list[Effect] = [
                Log(logging.INFO, what + tail),
                Relisting("continue token expired"),
            ]
            effects += self._begin_list(unpaged=unpaged, transition=Transition.LIST_RESTART)
            return effects
        if info.expired and self._list_rv_param:
            # client-go: the RV asked for is gone; retry at once with a consistent read.
            self._rv_unavailable = True
            effects = [Log(logging.INFO, what + "; relisting at the latest resourceVersion")]
            effects.append(Relisting("list resourceVersion expired"))
            effects += self._begin_list(unpaged=False, transition=Transition.LIST_RESTART)
            return effects
        if info.too_large:
            self._rv_unavailable = True
            effects = [
                Log(logging.INFO, what + "; relisting at the latest resourceVersion"),
                Relisting("list resourceVersion too large"),
            ]
            return self._later(
                now,
                effects,
                _Resume.FULL_SYNC,
                Transition.LIST_RETRY_LATER,
                "resourceVersion too large",
                retry_after=info.retry_after,
                too_large=True,
            )
        transient = info.code in (0, 429) or info.code >= 500
        level = logging.WARNING if transient else logging.ERROR
        # Repeat the same request when it is still valid (a live continue token is reusable; if
        # it expires meanwhile, the 410 branch above restarts). A 4xx on a continue page (e.g.
        # 400 for a token the server cannot parse) starts over instead.
        resume = _Resume.LIST_PAGE if transient or self._page == 1 else _Resume.FULL_SYNC
        return self._later(
            now,
            [self._throttled_log(info, level, what + "; retrying after a delay")],
            resume,
            Transition.LIST_RETRY_LATER,
            f"list failed ({info.code})",
            retry_after=info.retry_after,
        )

    def watch_started(self, now: float) -> list[Effect]:
        """The watch request got HTTP 200; events follow."""
        if self._state is State.STOPPED:
            return []
        self._expect_watch("watch_started")
        if not self._watch_established:
            self._watch_established = True
            self._watch_started_at = now
            self._note_healthy(now)
        return []

    def watch_event(self, now: float, event_type: str, obj: Any) -> list[Effect]:
        """One complete, decoded watch event: ``{"type": event_type, "object": obj}``.

        Implies :meth:`watch_started` if the driver did not report the 200 separately.
        """
        if self._state is State.STOPPED:
            return []
        self._expect_watch("watch_event")
        if not self._watch_established:
            self.watch_started(now)
        self._watch_events += 1
        if event_type == "ERROR":
            info = parse_status(obj)
            return self._watch_failure(now, info, close=True, in_stream=True)
        if self._state is State.STREAMING_LIST:
            return self._stream_event(now, event_type, obj)
        return self._plain_event(event_type, obj)

    @property
    def takes_applied_events(self) -> bool:
        """Whether the driver may apply plain watch events itself and report them in bulk
        with :meth:`watch_events_applied` instead of feeding each to :meth:`watch_event`.

        True only while WATCHING on an open watch whose 200 was reported: then an ``ADDED``,
        ``MODIFIED`` or ``DELETED`` event with a resourceVersion has exactly one outcome
        (:class:`ApplyEvent` and the last synced RV moves to the event's), so the driver can
        skip building effects for it. Nothing else changes this property but an input that is
        not :meth:`watch_events_applied`.
        """
        return self._state is State.WATCHING and self._watch_open and self._watch_established

    def watch_events_applied(self, count: int, last_rv: str) -> None:
        """``count`` plain events (``ADDED``/``MODIFIED``/``DELETED``) were applied by the driver
        while :attr:`takes_applied_events` was true: the same as feeding each to
        :meth:`watch_event` and carrying out its :class:`ApplyEvent`. ``last_rv`` is the
        resourceVersion of the last of them that had one, or ``""`` if none had (the last
        synced RV then stays where it was; the driver logs such events itself).

        Raises :class:`ReflectorProtocolError` when :attr:`takes_applied_events` is false.
        """
        if not self.takes_applied_events:
            raise ReflectorProtocolError(
                f"watch_events_applied() without an established watch (state {self._state.value})"
            )
        self._watch_events += count
        if last_rv:
            self._last_sync_rv = last_rv

    def watch_event_malformed(self, now: float, problem: str) -> list[Effect]:
        """A complete line of the watch body is not a usable event: not JSON, not a JSON
        object, no ``type`` or ``object``, a ``type`` that is not a string, or an object the
        driver could not take apart (``metadata`` not an object, ...). ``problem`` says which.

        Handled like client-go, which turns an undecodable event into a watch error: the watch
        is closed and, after backoff, the machine relists (a streaming list falls back to LIST
        for this sync). Re-watching from the last good resourceVersion is not enough: a server
        that produced the line would send the same line again, for ever; a relist decodes every
        object through the list path instead and converges.
        """
        if self._state is State.STOPPED:
            return []
        self._expect_watch("watch_event_malformed")
        self._watch_open = False
        effects: list[Effect] = [
            CloseWatch("malformed event"),
            Log(logging.ERROR, f"malformed watch event ({problem}); relisting after a delay"),
            Relisting("malformed watch event"),
        ]
        if self._state is State.STREAMING_LIST:
            self._pending = {}
            self._stream_fallback = True
            return self._later(
                now,
                effects,
                _Resume.FULL_SYNC,
                Transition.STREAM_RETRY_LATER,
                "malformed watch event",
            )
        return self._later(
            now, effects, _Resume.FULL_SYNC, Transition.RELIST_LATER, "malformed watch event"
        )

    # A transition table: one return per case of the table in the module docs.
    def watch_ended(self, now: float, *, clean: bool) -> list[Effect]:  # noqa: PLR0911
        """The watch body ended: ``clean`` for EOF at an event boundary, False for a cut.

        A body cut mid-object is not clean (the partial line is dropped, never decoded).
        """
        if self._state is State.STOPPED:
            return []
        self._expect_watch("watch_ended")
        if not self._watch_established:
            # The connection died before any status line: same as a refused connection.
            return self.watch_failed(now, 0, reason="closed before response")
        self._watch_open = False
        very_short = (
            now - self._watch_started_at < self._opts.very_short_watch and self._watch_events == 0
        )
        if self._state is State.STREAMING_LIST:
            self._pending = {}
            self._stream_fallback = True
            what = "streaming list ended before its initial-events-end bookmark"
            if clean and not very_short:
                # Probably a server that never sends the bookmark; list now, try again at the
                # next full sync (a missing bookmark means retry, not a permanent verdict).
                effects: list[Effect] = [Log(logging.WARNING, what + "; falling back to LIST")]
                effects += self._begin_list(unpaged=False, transition=Transition.STREAM_FALLBACK)
                return effects
            return self._later(
                now,
                [Log(logging.WARNING, what + ("" if clean else " (connection lost)"))],
                _Resume.FULL_SYNC,
                Transition.STREAM_RETRY_LATER,
                "streaming list ended early",
            )
        # WATCHING
        if clean and not very_short:
            # The server's timeoutSeconds elapsed (or it shed the watch): resume at once.
            self._last_transition = Transition.WATCH_TIMEOUT
            return [
                Log(logging.DEBUG, "watch closed by the server; re-watching"),
                WatchRestarted("server closed the watch"),
                self._watch_request(now, streaming=False),
            ]
        if clean:
            effects = [
                Log(logging.WARNING, "very short watch: closed in under 1 s with no events"),
                Relisting("very short watch"),
            ]
            return self._later(
                now, effects, _Resume.FULL_SYNC, Transition.RELIST_LATER, "very short watch"
            )
        effects = [
            Log(logging.INFO, "watch connection lost; re-watching from the last resourceVersion"),
            WatchRestarted("connection lost"),
        ]
        return self._later(
            now, effects, _Resume.REWATCH, Transition.REWATCH_LATER, "watch connection lost"
        )

    def watch_failed(
        self,
        now: float,
        status: int,
        *,
        reason: str = "",
        retry_after: float | None = None,
        message: str = "",
    ) -> list[Effect]:
        """The watch request got no 200: HTTP ``status``, or 0 when the connection failed.

        Arguments as for :meth:`list_failed`. 422/400 on a streaming list means the server does
        not support it (remembered); 429 and 0 re-watch without relist.
        """
        if self._state is State.STOPPED:
            return []
        self._expect_watch("watch_failed")
        self._watch_open = False
        info = StatusInfo(status, reason, message, retry_after)
        return self._watch_failure(now, info, close=False, in_stream=False)

    def idle_timeout(self, now: float) -> list[Effect]:
        """No byte arrived for :attr:`idle_timeout_seconds`: the connection is presumed dead.

        Ignored (returns ``[]``) when no watch is open, since the timer may race the stream's end.
        """
        if self._state not in (State.STREAMING_LIST, State.WATCHING) or not self._watch_open:
            return []
        self._watch_open = False
        effects: list[Effect] = [CloseWatch("idle timeout")]
        what = f"no data on the watch for {self._idle_timeout:g} s"
        if self._state is State.STREAMING_LIST:
            self._pending = {}
            self._stream_fallback = True
            effects.append(
                Log(logging.WARNING, what + " during a streaming list; falling back to LIST")
            )
            return self._later(
                now, effects, _Resume.FULL_SYNC, Transition.STREAM_RETRY_LATER, "idle timeout"
            )
        effects += [Log(logging.WARNING, what + "; reconnecting"), WatchRestarted("idle timeout")]
        return self._later(now, effects, _Resume.REWATCH, Transition.REWATCH_LATER, "idle timeout")

    def sleep_done(self, now: float) -> list[Effect]:
        """The last :class:`Sleep` elapsed."""
        if self._state is State.STOPPED:
            return []
        self._expect(State.BACKOFF, "sleep_done")
        match self._resume:
            case _Resume.FULL_SYNC:
                return self._begin_full_sync(now, resumed=True)
            case _Resume.LIST_PAGE:
                self._goto(State.LISTING, Transition.RESUME_LIST)
                return [ListRequest(self._list_params(), self._page)]
            case _Resume.REWATCH:
                request = self._watch_request(now, streaming=False)
                self._goto(State.WATCHING, Transition.RESUME_WATCH)
                return [request]

    # ---- watch internals -------------------------------------------------------------------

    def _stream_event(self, now: float, event_type: str, obj: Any) -> list[Effect]:
        if event_type == "BOOKMARK":
            if not _is_initial_events_end(obj):
                return []  # progress inside the snapshot; only the end bookmark matters
            rv = _object_rv(obj)
            if not rv:
                info = StatusInfo(500, "BadBookmark", "initial-events-end bookmark without RV")
                return self._watch_failure(now, info, close=True, in_stream=True)
            items = list(self._pending.values())
            self._pending = {}
            effects = self._complete_sync(items, rv)
            self._goto(State.WATCHING, Transition.STREAM_SYNCED)
            return effects
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return [Log(logging.WARNING, f"ignoring watch event of unknown type {event_type!r}")]
        key = self._key_of(obj)
        if key is None:
            return [Log(logging.WARNING, f"ignoring {event_type} event without metadata.name")]
        # ADDEDs come in any order and may be followed by MODIFIED/DELETED for the same key:
        # last writer wins, which is the server's order of changes.
        if event_type == "DELETED":
            self._pending.pop(key, None)
        else:
            self._pending[key] = obj
        return []

    def _plain_event(self, event_type: str, obj: Any) -> list[Effect]:
        if event_type == "BOOKMARK":
            rv = _object_rv(obj)
            if not rv:
                return [Log(logging.WARNING, "ignoring bookmark without resourceVersion")]
            self._last_sync_rv = rv
            return [Bookmark(rv)]
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return [Log(logging.WARNING, f"ignoring watch event of unknown type {event_type!r}")]
        effects: list[Effect] = [ApplyEvent(event_type, obj)]
        rv = self._rv_of(obj)
        if rv:
            self._last_sync_rv = rv
        else:
            effects.append(Log(logging.WARNING, f"{event_type} event without resourceVersion"))
        return effects

    def _watch_failure(
        self, now: float, info: StatusInfo, *, close: bool, in_stream: bool
    ) -> list[Effect]:
        """Any way a watch can fail except an end of body: an HTTP error or an ERROR event."""
        effects: list[Effect] = []
        where = "in the watch stream" if in_stream else "on the watch request"
        what = f"{info.describe()} {where}"
        if close:
            effects.append(CloseWatch(f"error: {info.reason or info.code}"))
        self._watch_open = False
        if self._state is State.STREAMING_LIST:
            return self._streaming_list_failed(now, info, what, effects)
        return self._watching_failed(now, info, what, effects)

    def _streaming_list_failed(
        self, now: float, info: StatusInfo, what: str, effects: list[Effect]
    ) -> list[Effect]:
        """A streaming list failed before its end bookmark: a 422/400 turns streaming off
        for good and lists now; anything else falls back to LIST for this sync, later."""
        self._pending = {}
        if info.code in (400, 422):
            # The WatchList gate is off (422) or the server predates the options (400).
            self._streaming_supported = False
            effects.append(
                Log(logging.WARNING, f"streaming list not supported ({what}); using LIST")
            )
            effects += self._begin_list(unpaged=False, transition=Transition.STREAM_UNSUPPORTED)
            return effects
        self._stream_fallback = True
        if info.too_large:
            self._rv_unavailable = True
        message = f"streaming list failed ({what}); falling back to LIST"
        effects.append(self._throttled_log(info, logging.WARNING, message))
        return self._later(
            now,
            effects,
            _Resume.FULL_SYNC,
            Transition.STREAM_RETRY_LATER,
            "streaming list failed",
            retry_after=info.retry_after,
            too_large=info.too_large,
        )

    def _watching_failed(
        self, now: float, info: StatusInfo, what: str, effects: list[Effect]
    ) -> list[Effect]:
        """A plain watch failed: back off, then re-watch or relist (:func:`_plan_watch_failure`
        says which, one case per row of the table in the module docs)."""
        plan = _plan_watch_failure(info, what)
        if plan.too_large:
            # The server lags our RV; what we hold is fine but the RV cannot be resumed from.
            self._rv_unavailable = True
        effects += [self._throttled_log(info, plan.level, plan.message), plan.hook]
        return self._later(
            now,
            effects,
            plan.resume,
            plan.transition,
            plan.reason,
            retry_after=info.retry_after,
            too_large=plan.too_large,
        )

    def _throttled_log(self, info: StatusInfo, level: int, message: str) -> Log:
        """The :class:`Log` of a failed request, quiet while 429s are fresh.

        A 429 is counted; the first :data:`QUIET_THROTTLES` in a row (without a LIST page or a
        watch's 200 in between) log at DEBUG: a fresh API server answers 429 "storage is
        (re)initializing" for a moment, and flow control sheds bursts. From the next one on,
        the throttling persists and logs at ``level``, with the count.
        """
        if info.code != 429:
            return Log(level, message)
        self._throttled += 1
        if self._throttled <= QUIET_THROTTLES:
            return Log(logging.DEBUG, message)
        return Log(level, f"{message} ({self._throttled} answers 429 in a row)")

    # ---- helpers -------------------------------------------------------------------------

    def _begin_full_sync(self, now: float, *, resumed: bool) -> list[Effect]:
        """Start a full sync: a streaming list when usable, else a LIST from page 1."""
        self._continue_expiries = 0
        if self._streaming_supported and not self._stream_fallback:
            request = self._watch_request(now, streaming=True)
            self._pending = {}
            transition = Transition.RESUME_STREAM if resumed else Transition.START_STREAM
            self._goto(State.STREAMING_LIST, transition)
            return [request]
        transition = Transition.RESUME_LIST if resumed else Transition.START_LIST
        return self._begin_list(unpaged=False, transition=transition)

    def _begin_list(self, *, unpaged: bool, transition: Transition) -> list[Effect]:
        """Start a LIST from page 1 at the RV the current situation calls for."""
        if self._rv_unavailable:
            self._list_rv_param = ""  # consistent read; the last RV is gone or unreachable
        else:
            self._list_rv_param = self._last_sync_rv or "0"  # "0" = any, for the first list
        self._list_items = []
        self._list_rv = ""
        self._continue = ""
        self._page = 1
        self._unpaged = unpaged
        self._goto(State.LISTING, transition)
        return [ListRequest(self._list_params(), 1)]

    def _list_params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self._opts.page_size > 0 and not self._unpaged:
            params["limit"] = str(self._opts.page_size)
        if self._continue:
            # The server rejects resourceVersion/resourceVersionMatch next to continue.
            params["continue"] = self._continue
        elif self._list_rv_param:
            params["resourceVersion"] = self._list_rv_param
            # NotOlderThan with "0" means "any"; with N it stops limit from turning the
            # request into an Exact read that can 410.
            params["resourceVersionMatch"] = "NotOlderThan"
        return params

    def _watch_request(self, now: float, *, streaming: bool) -> WatchRequest:
        del now  # the watch clock starts at watch_started, when the server answered
        timeout = self._rng.randrange(self._opts.watch_timeout_min, self._opts.watch_timeout_max)
        params = {"watch": "1"}
        if streaming or self._opts.allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        if streaming:
            params["sendInitialEvents"] = "true"
            params["resourceVersionMatch"] = "NotOlderThan"
            rv = "" if self._rv_unavailable else self._last_sync_rv
        else:
            rv = self._last_sync_rv
        if rv:
            # Unset means "most recent"; a plain watch at "" only happens if a LIST returned
            # no RV, and then the server sends the current state as ADDEDs (upserts).
            params["resourceVersion"] = rv
        params["timeoutSeconds"] = str(timeout)
        self._watch_open = True
        self._watch_established = False
        self._watch_events = 0
        self._idle_timeout = timeout + self._opts.idle_margin
        return WatchRequest(params, timeout, self._idle_timeout, streaming)

    def _complete_sync(self, items: list[Any], rv: str) -> list[Effect]:
        effects: list[Effect] = [ReplaceStore(items, rv)]
        self._last_sync_rv = rv
        self._rv_unavailable = False
        self._stream_fallback = False
        self._continue_expiries = 0
        if not self._synced:
            self._synced = True
            effects.append(Synced())
        return effects

    def _note_healthy(self, now: float) -> None:
        self._throttled = 0
        if self._healthy_since is None:
            self._healthy_since = now

    def _sleep(
        self, now: float, reason: str, retry_after: float | None, *, too_large: bool = False
    ) -> Sleep:
        """Count a failure and choose the delay: ``Retry-After`` if given, else backoff."""
        if (
            self._healthy_since is not None
            and now - self._healthy_since >= self._opts.backoff_reset_after
        ):
            self._backoff_step = 0
        self._healthy_since = None
        base = self._opts.backoff_base(self._backoff_step)
        if base < self._opts.backoff_cap:
            self._backoff_step += 1  # stop counting at the cap: the delay no longer grows
        if too_large and (retry_after is None or retry_after <= 0):
            retry_after = self._opts.too_large_retry_after
        if retry_after is not None and retry_after > 0:
            return Sleep(min(retry_after, self._opts.max_retry_after), reason, retry_after=True)
        jitter = self._opts.backoff_jitter * self._rng.random()
        return Sleep(base * (1.0 + jitter), reason)

    def _later(
        self,
        now: float,
        effects: list[Effect],
        resume: _Resume,
        transition: Transition,
        reason: str,
        *,
        retry_after: float | None = None,
        too_large: bool = False,
    ) -> list[Effect]:
        """Count a failure, append its :class:`Sleep` and enter BACKOFF to ``resume`` after."""
        effects.append(self._sleep(now, reason, retry_after, too_large=too_large))
        self._resume = resume
        self._goto(State.BACKOFF, transition)
        return effects

    def _goto(self, state: State, transition: Transition) -> None:
        self._state = state
        self._last_transition = transition

    def _expect(self, state: State, what: str) -> None:
        if self._state is not state:
            raise ReflectorProtocolError(f"{what}() in state {self._state.value}")

    def _expect_watch(self, what: str) -> None:
        if self._state not in (State.STREAMING_LIST, State.WATCHING) or not self._watch_open:
            raise ReflectorProtocolError(
                f"{what}() without an open watch (state {self._state.value})"
            )
