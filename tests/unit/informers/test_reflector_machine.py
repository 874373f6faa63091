"""Tests of the sans-IO reflector machine: client-go's reflector cases, then a simulated server.

The example tests mirror client-go's ``reflector_test.go``/``reflector_watchlist_test.go`` and the
wire cases listed in ``informers/reflector_machine.py``. The property test drives the
machine against an in-memory API server (event history, compaction, pagination, streaming lists,
cuts, timeouts, throttling) and checks that the store built only from the machine's effects is
the server's state at every step and at the end.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from informers.reflector_machine import (
    INITIAL_EVENTS_END_ANNOTATION,
    ApplyEvent,
    Bookmark,
    CloseWatch,
    Effect,
    ListRequest,
    Log,
    ReflectorMachine,
    ReflectorOptions,
    ReflectorProtocolError,
    Relisting,
    ReplaceStore,
    Sleep,
    State,
    Synced,
    Transition,
    WatchRequest,
    WatchRestarted,
    parse_status,
)

E = TypeVar("E")

NEXT_STEP = (ListRequest, WatchRequest, Sleep)


# ---- helpers --------------------------------------------------------------------------------


def obj(name: str, rv: int | str, ns: str = "default", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": str(rv)}, **extra}


def bookmark(rv: int | str, *, end: bool = False, value: str = "true") -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if end:
        meta["annotations"] = {INITIAL_EVENTS_END_ANNOTATION: value}
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta}


def status(code: int, reason: str, message: str = "", **details: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        out["details"] = details
    return out


def too_large_status(retry_after: int | None = 1) -> dict[str, Any]:
    details: dict[str, Any] = {"causes": [{"reason": "ResourceVersionTooLarge"}]}
    if retry_after is not None:
        details["retryAfterSeconds"] = retry_after
    return status(504, "Timeout", "Too large resource version: 20, current: 12", **details)


def of(effects: list[Effect], kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: list[Effect], kind: type[E]) -> E:
    found = of(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {effects}"
    return found[0]


def next_step(effects: list[Effect]) -> ListRequest | WatchRequest | Sleep:
    steps = [e for e in effects if isinstance(e, NEXT_STEP)]
    assert len(steps) == 1, f"expected one next step in {effects}"
    assert effects[-1] is steps[0], "the next step must be the last effect"
    return steps[0]


def state(m: ReflectorMachine) -> State:
    """Read the state through a call, so mypy does not narrow it across inputs."""
    return m.state


def machine(**options: Any) -> ReflectorMachine:
    options.setdefault("streaming_list", False)
    return ReflectorMachine(ReflectorOptions(**options), rng=random.Random(1234))


def synced_watching(
    m: ReflectorMachine, now: float = 0.0, rv: str = "10"
) -> tuple[list[Effect], WatchRequest]:
    """LIST in one page at ``rv`` and get to WATCHING (streaming must be off)."""
    m.start(now)
    effects = m.list_page(now, [obj("a", 5)], rv, "")
    request = next_step(effects)
    assert isinstance(request, WatchRequest)
    m.watch_started(now)
    return effects, request


# ---- LIST -----------------------------------------------------------------------------------


def test_first_list_is_paginated_at_rv_0_and_takes_the_first_pages_rv() -> None:
    m = machine()
    assert state(m) is State.EMPTY
    first = next_step(m.start(0.0))
    assert isinstance(first, ListRequest)
    assert first.page == 1
    assert first.params == {
        "limit": "500",
        "resourceVersion": "0",
        "resourceVersionMatch": "NotOlderThan",
    }
    assert state(m) is State.LISTING and m.last_transition is Transition.START_LIST

    # A continue request carries no RV and no match (the server answers 400 otherwise).
    second = next_step(m.list_page(0.1, [obj("a", 3), obj("b", 4)], "10", "tok1"))
    assert isinstance(second, ListRequest)
    assert second.params == {"limit": "500", "continue": "tok1"}
    assert second.page == 2
    # An empty page with a token is not the end.
    third = next_step(m.list_page(0.2, [], "10", "tok2"))
    assert isinstance(third, ListRequest) and third.params["continue"] == "tok2"
    assert not m.synced

    effects = m.list_page(0.3, [obj("c", 9)], "11", "")
    replace = one(effects, ReplaceStore)
    assert [o["metadata"]["name"] for o in replace.items] == ["a", "b", "c"]
    assert replace.resource_version == "10"  # the first page's RV, not the last one's
    assert effects.index(one(effects, Synced)) == effects.index(replace) + 1
    watch = next_step(effects)
    assert isinstance(watch, WatchRequest)
    assert not watch.streaming
    timeout = int(watch.params.pop("timeoutSeconds"))
    assert watch.params == {"watch": "1", "allowWatchBookmarks": "true", "resourceVersion": "10"}
    assert 300 <= timeout < 600 and watch.timeout_seconds == timeout
    assert watch.idle_timeout_seconds == m.idle_timeout_seconds == timeout + 10.0
    assert state(m) is State.WATCHING and m.synced and m.resource_version == "10"


def test_page_size_option_and_unpaged_lists() -> None:
    m = machine(page_size=0)
    request = next_step(m.start(0.0))
    assert isinstance(request, ListRequest) and "limit" not in request.params
    m2 = machine(page_size=50)
    request = next_step(m2.start(0.0))
    assert isinstance(request, ListRequest) and request.params["limit"] == "50"


def test_expired_continue_token_restarts_the_list_never_continuing() -> None:
    """client-go TestReflectorFullListIfExpired: 410 on page >= 2 means a full relist."""
    m = machine()
    m.start(0.0)
    m.list_page(0.0, [obj("a", 3)], "10", "tok1")
    effects = m.list_failed(
        1.0, 410, reason="Expired", message="The provided continue parameter is too old"
    )
    assert one(effects, Relisting).reason == "continue token expired"
    restart = next_step(effects)
    assert isinstance(restart, ListRequest)
    assert restart.page == 1
    assert "continue" not in restart.params
    assert restart.params["resourceVersion"] == "0" and restart.params["limit"] == "500"
    assert m.last_transition is Transition.LIST_RESTART

    # A second expiry in the same list: one unpaged list, like client-go's pager.
    m.list_page(2.0, [obj("a", 3)], "12", "tok2")
    unpaged = next_step(m.list_failed(3.0, 410, reason="Expired"))
    assert isinstance(unpaged, ListRequest)
    assert "limit" not in unpaged.params and "continue" not in unpaged.params

    effects = m.list_page(4.0, [obj("a", 3), obj("b", 12)], "12", "")
    replace = one(effects, ReplaceStore)
    # Nothing from the abandoned attempts leaks into the swap.
    assert [o["metadata"]["name"] for o in replace.items] == ["a", "b"]
    assert replace.resource_version == "12"
    assert not of(effects, Sleep)


def test_list_429_on_a_continue_page_retries_the_same_page_after_retry_after() -> None:
    m = machine()
    m.start(0.0)
    m.list_page(0.0, [obj("a", 3)], "10", "tok1")
    effects = m.list_failed(1.0, 429, retry_after=5)
    sleep = next_step(effects)
    assert sleep == Sleep(5, "list failed (429)", retry_after=True)
    assert state(m) is State.BACKOFF
    again = next_step(m.sleep_done(6.0))
    assert again == ListRequest({"limit": "500", "continue": "tok1"}, 2)


def test_list_errors_back_off_and_retry_without_crashing() -> None:
    m = machine()
    m.start(0.0)
    for code in (0, 401, 403, 404, 500, 503):
        effects = m.list_failed(0.0, code, reason="Forbidden" if code == 403 else "")
        sleep = next_step(effects)
        assert isinstance(sleep, Sleep) and not sleep.retry_after
        if code in (401, 403, 404):
            assert one(effects, Log).level == logging.ERROR
        request = next_step(m.sleep_done(0.0))
        assert isinstance(request, ListRequest)
        assert request.params["resourceVersion"] == "0"


def test_4xx_on_a_continue_page_starts_over() -> None:
    m = machine()
    m.start(0.0)
    m.list_page(0.0, [obj("a", 3)], "10", "garbage")
    next_step(m.list_failed(0.0, 400, reason="BadRequest"))
    request = next_step(m.sleep_done(1.0))
    assert isinstance(request, ListRequest) and request.page == 1
    assert "continue" not in request.params


def test_list_504_too_large_waits_retry_after_then_lists_at_empty_rv() -> None:
    """client-go TestReflectorFullListIfTooLarge."""
    m = machine()
    synced_watching(m, rv="10")
    m.watch_event(1.0, "MODIFIED", obj("a", 12))
    m.watch_event(2.0, "ERROR", status(410, "Expired", "too old resource version: 12 (30)"))
    relist = next_step(m.sleep_done(3.0))
    assert isinstance(relist, ListRequest) and relist.params["resourceVersion"] == "12"
    effects = m.list_failed(
        3.0, 504, reason="ResourceVersionTooLarge", message="Too large resource version"
    )
    assert next_step(effects) == Sleep(1.0, "resourceVersion too large", retry_after=True)
    at_latest = next_step(m.sleep_done(4.0))
    assert isinstance(at_latest, ListRequest)
    assert at_latest.params == {"limit": "500"}  # RV unset: a consistent read
    effects = m.list_page(5.0, [obj("a", 31)], "31", "")
    assert one(effects, ReplaceStore).resource_version == "31"
    # Once synced again, later relists use the last RV again.
    m.watch_started(5.0)
    m.watch_event(6.0, "ERROR", status(410, "Expired"))
    relist = next_step(m.sleep_done(7.0))
    assert isinstance(relist, ListRequest) and relist.params["resourceVersion"] == "31"


def test_list_504_detected_from_message_alone() -> None:
    m = machine()
    synced_watching(m)
    m.watch_event(1.0, "ERROR", status(410, "Gone"))
    m.sleep_done(2.0)
    effects = m.list_failed(2.0, 504, reason="Timeout", message="Too large resource version: 9")
    assert next_step(effects) == Sleep(1.0, "resourceVersion too large", retry_after=True)


# ---- watch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["Expired", "Gone"])
def test_watch_410_backs_off_then_relists_at_last_rv_then_at_empty(reason: str) -> None:
    """client-go TestReflectorExpiredExactResourceVersion / TestReflectorFullListIfExpired."""
    m = machine()
    synced_watching(m, rv="10")
    assert one(m.watch_event(1.0, "ADDED", obj("b", 11)), ApplyEvent).obj["metadata"]["name"]
    m.watch_event(2.0, "MODIFIED", obj("b", 12))
    effects = m.watch_event(
        3.0, "ERROR", status(410, reason, "too old resource version: 12 (3171407)")
    )
    assert effects[0] == CloseWatch(f"error: {reason}")
    assert one(effects, Relisting).reason == "watch expired"
    sleep = next_step(effects)
    assert isinstance(sleep, Sleep) and 0.8 <= sleep.seconds < 1.6 and not sleep.retry_after
    assert state(m) is State.BACKOFF and m.last_transition is Transition.RELIST_LATER
    assert not m.watch_open

    relist = next_step(m.sleep_done(4.0))
    assert relist == ListRequest(
        {"limit": "500", "resourceVersion": "12", "resourceVersionMatch": "NotOlderThan"}, 1
    )
    latest = next_step(m.list_failed(4.5, 410, reason=reason))
    assert latest == ListRequest({"limit": "500"}, 1)  # at once, RV unset
    effects = m.list_page(5.0, [obj("b", 40)], "40", "")
    assert one(effects, ReplaceStore) == ReplaceStore([obj("b", 40)], "40")
    assert not of(effects, Synced)  # only the first sync emits Synced
    watch = next_step(effects)
    assert isinstance(watch, WatchRequest) and watch.params["resourceVersion"] == "40"


@pytest.mark.parametrize("retry_after", [1, 3, None])
def test_watch_504_too_large_waits_retry_after_then_relists_at_empty(
    retry_after: int | None,
) -> None:
    m = machine()
    synced_watching(m, rv="10")
    effects = m.watch_event(1.0, "ERROR", too_large_status(retry_after))
    assert one(effects, CloseWatch)
    assert one(effects, Relisting).reason == "watch resourceVersion too large"
    sleep = next_step(effects)
    assert sleep == Sleep(float(retry_after or 1), "resourceVersion too large", retry_after=True)
    relist = next_step(m.sleep_done(2.0))
    assert relist == ListRequest({"limit": "500"}, 1)


def test_no_relist_on_too_many_requests() -> None:
    """client-go TestNoRelistOnTooManyRequests: 1 list, N watches; Retry-After honoured."""
    m = machine()
    _, first = synced_watching(m, rv="10")
    lists, watches = 1, 1
    now = 1.0
    for retry_after in (1, 5, 32, None):
        effects = m.watch_failed(now, 429, reason="TooManyRequests", retry_after=retry_after)
        assert not of(effects, Relisting) and not of(effects, CloseWatch)
        assert of(effects, WatchRestarted)
        sleep = next_step(effects)
        assert isinstance(sleep, Sleep)
        if retry_after is None:
            assert not sleep.retry_after
        else:
            assert sleep == Sleep(float(retry_after), "watch refused (429)", retry_after=True)
        now += sleep.seconds
        request = next_step(m.sleep_done(now))
        assert isinstance(request, WatchRequest) and request.params["resourceVersion"] == "10"
        watches += 1
    # A refused connection is handled the same way.
    sleep = next_step(m.watch_failed(now, 0, reason="connection refused"))
    assert isinstance(sleep, Sleep)
    assert isinstance(next_step(m.sleep_done(now + 60)), WatchRequest)
    watches += 1
    assert (lists, watches) == (1, 6)
    assert first.params["resourceVersion"] == "10"


def test_backoff_on_too_many_requests_grows() -> None:
    """client-go TestBackoffOnTooManyRequests: 429s without Retry-After back off."""
    m = machine(backoff_jitter=0.0)
    synced_watching(m)
    sleeps = []
    for i in range(4):
        sleep = next_step(m.watch_failed(float(i), 429))
        assert isinstance(sleep, Sleep)
        sleeps.append(sleep.seconds)
        m.sleep_done(float(i))
    assert sleeps == pytest.approx([0.8, 1.6, 3.2, 6.4])


def test_5xx_on_the_watch_request() -> None:
    m = machine()
    synced_watching(m)
    # With Retry-After: honoured, then re-watch (what client-go's request retry does).
    effects = m.watch_failed(1.0, 503, retry_after=2)
    assert next_step(effects) == Sleep(2.0, "watch refused (503)", retry_after=True)
    assert isinstance(next_step(m.sleep_done(3.0)), WatchRequest)
    # Without: back off and relist, like client-go.
    effects = m.watch_failed(4.0, 500)
    assert of(effects, Relisting)
    assert isinstance(next_step(m.sleep_done(5.0)), ListRequest)


def test_internal_error_in_the_stream_backs_off_and_relists() -> None:
    """client-go TestRetryInternalError with MaxInternalErrorRetryDuration=0 (the default)."""
    m = machine()
    synced_watching(m)
    effects = m.watch_event(1.0, "ERROR", status(500, "InternalError", "etcd timeout"))
    assert one(effects, CloseWatch) and one(effects, Relisting)
    assert isinstance(next_step(effects), Sleep)
    assert isinstance(next_step(m.sleep_done(2.0)), ListRequest)


@pytest.mark.parametrize("code", [401, 403, 404])
def test_auth_and_not_found_back_off_and_relist_loudly(code: int) -> None:
    m = machine()
    synced_watching(m)
    effects = m.watch_failed(1.0, code, reason="Forbidden", message="pods is forbidden")
    assert any(e.level == logging.ERROR for e in of(effects, Log))
    assert isinstance(next_step(effects), Sleep)
    assert isinstance(next_step(m.sleep_done(2.0)), ListRequest)


def test_clean_server_timeout_rewatches_immediately_without_relist() -> None:
    """client-go: a normal EOF re-watches at once from the last RV."""
    m = machine()
    _, first = synced_watching(m, now=0.0, rv="10")
    assert one(m.watch_event(5.0, "MODIFIED", obj("a", 11)), ApplyEvent)
    effects = m.watch_ended(float(first.timeout_seconds), clean=True)
    assert not of(effects, Sleep) and not of(effects, Relisting) and not of(effects, CloseWatch)
    assert one(effects, WatchRestarted).reason == "server closed the watch"
    request = next_step(effects)
    assert isinstance(request, WatchRequest) and request.params["resourceVersion"] == "11"
    assert m.last_transition is Transition.WATCH_TIMEOUT

    # Also immediate after >= 1 s without any event (a quiet resource).
    m.watch_started(400.0)
    effects = m.watch_ended(401.5, clean=True)
    assert isinstance(next_step(effects), WatchRequest)


def test_very_short_watch_backs_off_then_relists() -> None:
    """client-go VeryShortWatchError: EOF in < 1 s with 0 events."""
    m = machine()
    synced_watching(m, now=10.0, rv="10")
    effects = m.watch_ended(10.5, clean=True)
    assert one(effects, Relisting).reason == "very short watch"
    sleep = next_step(effects)
    assert isinstance(sleep, Sleep) and 0.8 <= sleep.seconds < 1.6
    relist = next_step(m.sleep_done(12.0))
    assert isinstance(relist, ListRequest) and relist.params["resourceVersion"] == "10"


def test_short_watch_with_events_is_a_normal_timeout() -> None:
    m = machine()
    synced_watching(m, now=10.0)
    m.watch_event(10.1, "BOOKMARK", bookmark(15))
    effects = m.watch_ended(10.2, clean=True)
    request = next_step(effects)
    assert isinstance(request, WatchRequest) and request.params["resourceVersion"] == "15"


def test_cut_connection_rewatches_from_the_last_complete_event() -> None:
    m = machine()
    synced_watching(m, rv="10")
    m.watch_event(1.0, "ADDED", obj("b", 11))
    m.watch_event(2.0, "DELETED", obj("a", 12))
    # The driver dropped a partial third object and reports an unclean end.
    effects = m.watch_ended(3.0, clean=False)
    assert not of(effects, Relisting) and not of(effects, CloseWatch)
    assert one(effects, WatchRestarted).reason == "connection lost"
    sleep = next_step(effects)
    assert isinstance(sleep, Sleep) and not sleep.retry_after
    request = next_step(m.sleep_done(4.0))
    assert isinstance(request, WatchRequest) and request.params["resourceVersion"] == "12"
    assert m.last_transition is Transition.RESUME_WATCH


def test_idle_timeout_closes_and_rewatches() -> None:
    """kube-rs idle_timeout_returns_none_on_dead_connection: a half-open socket is noticed."""
    m = machine()
    _, request = synced_watching(m, rv="10")
    m.watch_event(1.0, "MODIFIED", obj("a", 11))
    effects = m.idle_timeout(1.0 + request.idle_timeout_seconds)
    assert effects[0] == CloseWatch("idle timeout")
    assert one(effects, WatchRestarted).reason == "idle timeout"
    assert isinstance(next_step(effects), Sleep)
    # The timer may fire again before the driver cancels it: ignored.
    assert m.idle_timeout(700.0) == []
    again = next_step(m.sleep_done(700.0))
    assert isinstance(again, WatchRequest) and again.params["resourceVersion"] == "11"


def test_idle_timeout_before_the_response_also_reconnects() -> None:
    m = machine()
    m.start(0.0)
    m.list_page(0.0, [], "10", "")
    effects = m.idle_timeout(700.0)  # request sent, no status line ever arrived
    assert one(effects, CloseWatch)
    assert isinstance(next_step(effects), Sleep)


def test_hours_of_bookmarks_advance_the_rv_without_store_changes() -> None:
    m = machine()
    _, request = synced_watching(m, rv="10")
    now, rv, watch_started, relists = 0.0, 10, 0.0, 0
    while now < 3 * 3600:
        if now + 60 >= watch_started + request.timeout_seconds:
            # The server's timeoutSeconds elapses before the next bookmark: clean EOF.
            now = watch_started + request.timeout_seconds
            effects = m.watch_ended(now, clean=True)
            relists += len(of(effects, Relisting))
            step = next_step(effects)
            assert isinstance(step, WatchRequest) and step.params["resourceVersion"] == str(rv)
            request, watch_started = step, now
            m.watch_started(now)
        now += 60  # one bookmark a minute: the idle timer (reset per byte) never fires
        assert request.idle_timeout_seconds > 60
        rv += 7
        assert m.watch_event(now, "BOOKMARK", bookmark(rv)) == [Bookmark(str(rv))]
    assert m.resource_version == str(rv) and relists == 0


def test_no_bookmarks_option_and_servers_that_send_none() -> None:
    m = machine(allow_bookmarks=False)
    _, request = synced_watching(m)
    assert "allowWatchBookmarks" not in request.params
    assert one(m.watch_event(1.0, "ADDED", obj("x", 11)), ApplyEvent)
    assert isinstance(next_step(m.watch_ended(400.0, clean=True)), WatchRequest)


def test_events_without_rv_and_unknown_types_are_logged_not_fatal() -> None:
    m = machine()
    synced_watching(m, rv="10")
    effects = m.watch_event(1.0, "MODIFIED", {"metadata": {"name": "a"}})
    assert one(effects, ApplyEvent) and one(effects, Log)
    assert m.resource_version == "10"
    assert of(m.watch_event(1.0, "WHATEVER", obj("a", 11)), Log)
    assert of(m.watch_event(1.0, "BOOKMARK", {"metadata": {}}), Log)
    assert m.resource_version == "10" and state(m) is State.WATCHING


def test_an_annotated_bookmark_on_a_plain_watch_is_just_a_bookmark() -> None:
    # A 1.34+ server defaults a plain watch at RV ""/"0" to a streaming one; harmless here.
    m = machine()
    synced_watching(m, rv="10")
    assert m.watch_event(1.0, "BOOKMARK", bookmark(12, end=True)) == [Bookmark("12")]


def test_watch_timeout_is_random_in_range_and_sets_the_idle_window() -> None:
    timeouts = set()
    for seed in range(200):
        m = ReflectorMachine(ReflectorOptions(streaming_list=True), rng=random.Random(seed))
        request = next_step(m.start(0.0))
        assert isinstance(request, WatchRequest)
        assert 300 <= request.timeout_seconds < 600
        assert request.params["timeoutSeconds"] == str(request.timeout_seconds)
        assert m.idle_timeout_seconds == request.timeout_seconds + 10.0
        timeouts.add(request.timeout_seconds)
    assert len(timeouts) > 50


# ---- streaming lists ------------------------------------------------------------------------


def test_streaming_list_buffers_until_the_annotated_bookmark() -> None:
    m = ReflectorMachine(rng=random.Random(7))  # streaming is on by default
    request = next_step(m.start(0.0))
    assert isinstance(request, WatchRequest) and request.streaming
    params = dict(request.params)
    del params["timeoutSeconds"]
    assert params == {
        "watch": "1",
        "allowWatchBookmarks": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
    }  # RV unset: a consistent snapshot
    assert state(m) is State.STREAMING_LIST
    assert m.watch_started(0.1) == []
    # Out-of-order ADDEDs, then changes before the bookmark: nothing reaches the store.
    stream = [
        ("ADDED", obj("b", 8467)),
        ("ADDED", obj("a", 5726)),
        ("ADDED", obj("c", 6000, ns="other")),
        ("MODIFIED", obj("a", 9000, spec=2)),
        ("DELETED", obj("b", 9001)),
        ("ADDED", obj("d", 9002)),
        ("BOOKMARK", bookmark(9002)),  # not the end: ignored
        ("BOOKMARK", bookmark(9002, end=True, value="false")),  # wrong value: ignored
    ]
    for event_type, o in stream:
        assert m.watch_event(0.2, event_type, o) == []
        assert not m.synced and m.resource_version == ""
    effects = m.watch_event(0.3, "BOOKMARK", bookmark(9003, end=True))
    replace = one(effects, ReplaceStore)
    assert replace.resource_version == "9003"
    assert sorted(
        (o["metadata"]["namespace"], o["metadata"]["name"], o["metadata"]["resourceVersion"])
        for o in replace.items
    ) == [("default", "a", "9000"), ("default", "d", "9002"), ("other", "c", "6000")]
    assert effects == [replace, Synced()]  # same connection: no new request
    assert state(m) is State.WATCHING and m.last_transition is Transition.STREAM_SYNCED
    assert m.synced and m.resource_version == "9003"
    # The stream goes on as a normal watch.
    assert m.watch_event(0.4, "MODIFIED", obj("d", 9004)) == [
        ApplyEvent("MODIFIED", obj("d", 9004))
    ]
    assert m.resource_version == "9004"


def test_streaming_list_unsupported_falls_back_to_list_and_remembers() -> None:
    m = ReflectorMachine(rng=random.Random(7))
    m.start(0.0)
    effects = m.watch_failed(0.1, 422, reason="Invalid", message="sendInitialEvents forbidden")
    request = next_step(effects)  # no sleep: the server answered, it just can't stream
    assert isinstance(request, ListRequest) and request.params["resourceVersion"] == "0"
    assert m.last_transition is Transition.STREAM_UNSUPPORTED and not m.streaming_supported
    m.list_page(0.2, [obj("a", 3)], "10", "")
    m.watch_started(0.3)
    m.watch_event(1.0, "ERROR", status(410, "Expired"))
    relist = next_step(m.sleep_done(2.0))
    assert isinstance(relist, ListRequest)  # remembered: no second streaming attempt


def test_streaming_422_as_an_error_event_also_falls_back() -> None:
    m = ReflectorMachine(rng=random.Random(7))
    m.start(0.0)
    effects = m.watch_event(0.1, "ERROR", status(400, "BadRequest"))
    assert one(effects, CloseWatch)
    assert isinstance(next_step(effects), ListRequest)
    assert not m.streaming_supported


@pytest.mark.parametrize(
    "failure",
    ["cut", "idle", "error-500", "429", "refused"],
)
def test_streaming_failure_before_the_bookmark_falls_back_to_list_once(failure: str) -> None:
    m = ReflectorMachine(rng=random.Random(7))
    m.start(0.0)
    if failure == "cut":
        m.watch_started(0.1)
        m.watch_event(0.2, "ADDED", obj("a", 5))
        effects = m.watch_ended(0.3, clean=False)
    elif failure == "idle":
        effects = m.idle_timeout(700.0)
        assert one(effects, CloseWatch)
    elif failure == "error-500":
        effects = m.watch_event(0.2, "ERROR", status(500, "InternalError"))
    elif failure == "429":
        effects = m.watch_failed(0.1, 429, retry_after=5)
        assert next_step(effects) == Sleep(5.0, "streaming list failed", retry_after=True)
    else:
        effects = m.watch_failed(0.1, 0)
    assert not of(effects, ReplaceStore)
    assert isinstance(next_step(effects), Sleep)
    assert m.streaming_supported  # a transient failure is not a verdict
    fallback = next_step(m.sleep_done(10.0))
    assert isinstance(fallback, ListRequest) and fallback.params["resourceVersion"] == "0"
    effects = m.list_page(11.0, [obj("a", 5)], "10", "")
    assert one(effects, ReplaceStore).resource_version == "10" and one(effects, Synced)
    m.watch_started(11.0)
    # The next full sync tries streaming again, from the last RV.
    m.watch_event(12.0, "ERROR", status(410, "Expired"))
    request = next_step(m.sleep_done(13.0))
    assert isinstance(request, WatchRequest) and request.streaming
    assert request.params["resourceVersion"] == "10"
    assert request.params["resourceVersionMatch"] == "NotOlderThan"


def test_streaming_list_without_bookmark_then_clean_end_lists_at_once() -> None:
    """A missing bookmark means retry: the stream times out and the sync finishes by LIST."""
    m = ReflectorMachine(rng=random.Random(7))
    request = next_step(m.start(0.0))
    assert isinstance(request, WatchRequest)
    m.watch_started(0.1)
    m.watch_event(0.2, "ADDED", obj("a", 5))
    effects = m.watch_ended(float(request.timeout_seconds), clean=True)
    assert not of(effects, Sleep)
    assert isinstance(next_step(effects), ListRequest)
    assert m.last_transition is Transition.STREAM_FALLBACK


def test_streaming_504_too_large_falls_back_to_list_at_empty_rv() -> None:
    m = ReflectorMachine(rng=random.Random(7))
    m.start(0.0)
    effects = m.watch_event(0.1, "ERROR", too_large_status(None))
    assert next_step(effects) == Sleep(1.0, "streaming list failed", retry_after=True)
    request = next_step(m.sleep_done(1.1))
    assert request == ListRequest({"limit": "500"}, 1)


def test_stop_before_and_after_sync() -> None:
    m = ReflectorMachine(rng=random.Random(7))
    m.start(0.0)
    m.watch_event(0.1, "ADDED", obj("a", 5))
    assert m.stop(0.2) == [CloseWatch("reflector stopped")]
    assert state(m) is State.STOPPED and not m.synced
    # Late inputs from a driver that is tearing down are ignored.
    assert m.watch_event(0.3, "BOOKMARK", bookmark(6, end=True)) == []
    assert m.sleep_done(0.4) == [] and m.idle_timeout(0.5) == []

    m2 = machine()
    synced_watching(m2)
    m2.watch_event(1.0, "ERROR", status(410, "Expired"))
    assert m2.stop(1.1) == []  # sleeping: nothing open


# ---- backoff --------------------------------------------------------------------------------


def test_backoff_schedule_is_jittered_in_d_to_2d_and_capped() -> None:
    m = machine()
    synced_watching(m)
    expected = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]
    now = 0.0
    for base in expected:
        sleep = next_step(m.watch_failed(now, 0))
        assert isinstance(sleep, Sleep) and not sleep.retry_after
        assert base <= sleep.seconds < 2 * base
        now += sleep.seconds
        m.sleep_done(now)


def test_backoff_resets_after_two_minutes_healthy_only() -> None:
    m = machine(backoff_jitter=0.0)
    synced_watching(m, now=0.0)
    now = 0.0
    for _ in range(5):
        sleep = next_step(m.watch_failed(now, 0))
        assert isinstance(sleep, Sleep)
        now += sleep.seconds
        m.sleep_done(now)
    assert m.backoff_step == 5
    # Healthy for only 60 s: the schedule continues (0.8, 1.6, 3.2, 6.4, 12.8, then 25.6).
    m.watch_started(now)
    sleep = next_step(m.watch_ended(now + 60, clean=False))
    assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(25.6)
    now += 60 + sleep.seconds
    m.sleep_done(now)
    # Healthy for 2 minutes: back to the start.
    m.watch_started(now)
    sleep = next_step(m.watch_ended(now + 121, clean=False))
    assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(0.8)
    assert m.backoff_step == 1


def test_failures_far_apart_without_success_do_not_reset() -> None:
    # Differs from client-go's DelayWithReset on purpose: only health resets the backoff.
    m = machine(backoff_jitter=0.0)
    m.start(0.0)
    now = 0.0
    for expected in (0.8, 1.6, 3.2):
        sleep = next_step(m.list_failed(now, 0))
        assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(expected)
        now += 500.0
        m.sleep_done(now)


def test_retry_after_is_capped_and_still_counts_as_a_failure() -> None:
    m = machine(backoff_jitter=0.0)
    synced_watching(m)
    assert next_step(m.watch_failed(0.0, 429, retry_after=3600)) == Sleep(
        60.0, "watch refused (429)", retry_after=True
    )
    m.sleep_done(60.0)
    sleep = next_step(m.watch_failed(60.0, 0))
    assert isinstance(sleep, Sleep) and sleep.seconds == pytest.approx(1.6)


# ---- misc -----------------------------------------------------------------------------------


def test_protocol_errors_are_loud() -> None:
    m = machine()
    with pytest.raises(ReflectorProtocolError):
        m.list_page(0.0, [], "1", "")
    m.start(0.0)
    with pytest.raises(ReflectorProtocolError):
        m.start(0.0)
    with pytest.raises(ReflectorProtocolError):
        m.watch_event(0.0, "ADDED", obj("a", 1))
    with pytest.raises(ReflectorProtocolError):
        m.sleep_done(0.0)
    m.list_page(0.0, [], "1", "")
    m.watch_event(0.0, "ERROR", status(410, "Expired"))
    with pytest.raises(ReflectorProtocolError):  # after CloseWatch nothing more from it
        m.watch_event(0.0, "ADDED", obj("a", 2))


def test_watch_ended_before_response_is_a_connection_failure() -> None:
    m = machine()
    m.start(0.0)
    m.list_page(0.0, [], "1", "")
    effects = m.watch_ended(0.1, clean=True)
    assert of(effects, WatchRestarted) and isinstance(next_step(effects), Sleep)


def test_parse_status() -> None:
    info = parse_status(too_large_status(2))
    assert info.code == 504 and info.too_large and info.retry_after == 2.0
    assert not info.expired
    gone = parse_status({"reason": "Gone", "code": 410})
    assert gone.expired and not gone.too_large
    junk = parse_status({"code": "x", "details": {"retryAfterSeconds": True, "causes": [1]}})
    assert junk.code == 500 and junk.retry_after is None and junk.causes == ()


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="watch_timeout"):
        ReflectorOptions(watch_timeout_min=600, watch_timeout_max=300)
    with pytest.raises(ValueError, match="backoff_initial"):
        ReflectorOptions(backoff_initial=0)
    with pytest.raises(ValueError, match="page_size"):
        ReflectorOptions(page_size=-1)
    assert ReflectorOptions().backoff_base(100) == 30.0


# ---- property test: a simulated API server --------------------------------------------------

KEYS = ("a", "b", "c", "d", "e", "f")
PAGE = 3
RETRY_AFTERS = (1, 5, 32)


@dataclass
class Stream:
    """One open watch on the simulated server."""

    queue: deque[tuple[str, dict[str, Any], int | None]]
    pos: int  # every event up to this RV has been delivered
    streaming: bool
    started_at: float
    timeout: int
    idle: float
    initial_left: int = 0
    end_sent: bool = True
    expired: bool = False


@dataclass
class Server:
    """An in-memory API server whose every decision comes from a hypothesis-drawn script."""

    script: list[int]
    streaming: bool
    rv: int = 100
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    states: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    compacted: int = 0
    expired_tokens: set[str] = field(default_factory=set)
    stream: Stream | None = None
    now: float = 0.0

    @property
    def quiescing(self) -> bool:
        return not self.script

    def choose(self, n: int) -> int:
        """The next decision in [0, n); 0 (benign) once the script is used up."""
        return self.script.pop() % n if self.script else 0

    def write(self) -> None:
        key = KEYS[self.choose(len(KEYS))]
        self.rv += 1
        new = obj(key, self.rv, data=self.rv)
        if key in self.objects and self.choose(3) == 0:
            event_type = "DELETED"
            gone = self.objects.pop(key)
            new = {**gone, "metadata": {**gone["metadata"], "resourceVersion": str(self.rv)}}
        else:
            event_type = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = new
        self.states[self.rv] = dict(self.objects)
        if self.stream is not None:
            self.stream.queue.append((event_type, new, self.rv))

    def state_at(self, rv: int) -> dict[str, dict[str, Any]]:
        return self.states[rv]

    # -- LIST

    def serve_list(self, m: ReflectorMachine, request: ListRequest) -> list[Effect]:
        params = request.params
        if "continue" in params:
            assert "resourceVersion" not in params and "resourceVersionMatch" not in params
            assert params["continue"] not in self.expired_tokens, "reused an expired token"
        if "resourceVersionMatch" in params:
            assert params["resourceVersionMatch"] == "NotOlderThan"
            assert params.get("resourceVersion")
        assert params.get("limit", str(PAGE)) == str(PAGE)
        rv_param = params.get("resourceVersion", "")
        numeric = rv_param not in ("", "0")
        if numeric:
            assert int(rv_param) <= self.rv, "asked for an RV the server never served"
        match self.choose(10):
            case 1:
                return m.list_failed(self.now, 429, retry_after=RETRY_AFTERS[self.choose(3)])
            case 2:
                return m.list_failed(self.now, 500, reason="InternalError")
            case 3:
                return m.list_failed(self.now, 0, reason="connection reset")
            case 4 if numeric and request.page == 1:
                return m.list_failed(self.now, 410, reason="Expired")
            case 5 if numeric and request.page == 1:
                return m.list_failed(self.now, 504, reason="ResourceVersionTooLarge")
            case 6:
                for _ in range(1 + self.choose(3)):
                    self.write()
            case 7:
                # Changes, then compaction: tokens of older snapshots now answer 410.
                self.write()
                self.compacted = self.rv
            case 8:
                return m.list_failed(self.now, 403, reason="Forbidden")
            case _:
                pass
        if "continue" in params:
            snapshot, offset = (int(part) for part in params["continue"].split(":"))
            if snapshot < self.compacted:
                self.expired_tokens.add(params["continue"])
                return m.list_failed(self.now, 410, reason="Expired")
        else:
            snapshot, offset = self.rv, 0
        items = [v for _, v in sorted(self.state_at(snapshot).items())]
        if "limit" in params:
            count = PAGE - self.choose(PAGE + 1)  # pages may be short, even empty
            page, rest = items[offset : offset + count], items[offset + count :]
        else:
            page, rest = items[offset:], []
        token = f"{snapshot}:{offset + len(page)}" if rest else ""
        self.now += 0.05
        return m.list_page(self.now, page, str(snapshot), token)

    # -- WATCH

    def open_watch(self, m: ReflectorMachine, request: WatchRequest) -> list[Effect]:
        params = request.params
        assert params["watch"] == "1"
        assert params["timeoutSeconds"] == str(request.timeout_seconds)
        assert 300 <= request.timeout_seconds < 600
        assert params["allowWatchBookmarks"] == "true"
        assert "limit" not in params and "continue" not in params
        assert self.stream is None
        if request.streaming:
            assert params["sendInitialEvents"] == "true"
            assert params["resourceVersionMatch"] == "NotOlderThan"
            if not self.streaming:
                return m.watch_failed(self.now, 422, reason="Invalid")
        else:
            assert "sendInitialEvents" not in params and "resourceVersionMatch" not in params
            assert params["resourceVersion"]
        match self.choose(8):
            case 1:
                return m.watch_failed(self.now, 429, retry_after=RETRY_AFTERS[self.choose(3)])
            case 2:
                return m.watch_failed(self.now, 0, reason="connection refused")
            case 3:
                return m.watch_failed(self.now, 500, reason="InternalError")
            case 4:
                return m.watch_failed(self.now, 503, retry_after=1)
            case 5:
                return m.watch_failed(self.now, 403, reason="Forbidden")
            case _:
                pass
        stream = Stream(
            queue=deque(),
            pos=self.rv,
            streaming=request.streaming,
            started_at=self.now,
            timeout=request.timeout_seconds,
            idle=request.idle_timeout_seconds,
        )
        if request.streaming:
            rv_param = params.get("resourceVersion", "")
            assert not rv_param or int(rv_param) <= self.rv
            initial = list(self.objects.values())
            random.Random(self.choose(256)).shuffle(initial)  # not in RV order
            stream.queue.extend(("ADDED", o, None) for o in initial)
            stream.initial_left = len(initial)
            stream.end_sent = False
        else:
            start = int(params["resourceVersion"])
            stream.pos = start
            stream.expired = start < self.compacted
            for rv in range(start + 1, self.rv + 1):
                stream.queue.append(self.history_event(rv))
        self.stream = stream
        return m.watch_started(self.now)

    def history_event(self, rv: int) -> tuple[str, dict[str, Any], int]:
        before, after = self.states[rv - 1], self.states[rv]
        (key,) = {k for k in before.keys() | after.keys() if before.get(k) is not after.get(k)}
        if key not in after:
            gone = before[key]
            return (
                "DELETED",
                {**gone, "metadata": {**gone["metadata"], "resourceVersion": str(rv)}},
                rv,
            )
        return ("MODIFIED" if key in before else "ADDED"), after[key], rv

    def pull(self, m: ReflectorMachine) -> list[Effect] | None:
        """Let the open stream do one thing; None once quiesced (nothing left to say)."""
        s = self.stream
        assert s is not None
        if s.expired:
            self.stream = None
            return m.watch_event(self.now, "ERROR", status(410, "Expired", "too old"))
        choice = self.choose(20)  # 0 and 13..19 are benign: let some syncs finish
        if choice == 1:
            self.write()
            return []
        if choice == 2 and (not s.streaming or s.end_sent or s.initial_left == 0):
            return self.send_bookmark(m)
        if choice == 3:
            self.now = max(self.now, s.started_at + s.timeout)
            return self.end(m, clean=True)
        if choice == 4:
            return self.end(m, clean=False)
        if choice == 5:
            self.now += s.idle
            self.stream = None
            return m.idle_timeout(self.now)
        if choice in (6, 7):
            # Changes this stream has not delivered yet, then compaction: resuming from the
            # stream's position is impossible from now on (410 on the next watch).
            self.write()
            self.compacted = self.rv
            if choice == 6:
                return []
        if 7 <= choice <= 10:
            self.stream = None
            payload = {
                7: status(410, "Expired", "too old resource version"),
                8: status(500, "InternalError"),
                9: too_large_status(None if self.choose(2) else 1),
                10: status(429, "TooManyRequests", retryAfterSeconds=RETRY_AFTERS[self.choose(3)]),
            }[choice]
            return m.watch_event(self.now, "ERROR", payload)
        if choice == 11:
            self.now += 50.0
            return []
        if choice == 12:
            self.now += 0.2
            return self.end(m, clean=True)
        # Benign: deliver what is queued; with nothing queued, end the initial events or,
        # unless quiescing, make a change.
        if s.queue:
            event_type, o, rv = s.queue.popleft()
            if rv is None:
                s.initial_left -= 1
            else:
                s.pos = rv
            self.now += 0.01
            return m.watch_event(self.now, event_type, o)
        if s.streaming and not s.end_sent:
            return self.send_bookmark(m)
        if self.quiescing:
            return None
        self.write()
        return []

    def send_bookmark(self, m: ReflectorMachine) -> list[Effect]:
        s = self.stream
        assert s is not None
        end = s.streaming and not s.end_sent
        s.end_sent = True
        self.now += 0.01
        return m.watch_event(self.now, "BOOKMARK", bookmark(s.pos, end=end))

    def end(self, m: ReflectorMachine, *, clean: bool) -> list[Effect]:
        self.stream = None
        return m.watch_ended(self.now, clean=clean)


@dataclass
class Client:
    """What a driver builds from the effects alone, plus the checks on every effect."""

    server: Server
    store: dict[str, dict[str, Any]] = field(default_factory=dict)
    store_rv: int = 0
    replaced: bool = False
    synced_count: int = 0
    lists: int = 0

    def apply(self, effects: list[Effect]) -> ListRequest | WatchRequest | Sleep | None:
        steps = [e for e in effects if isinstance(e, NEXT_STEP)]
        assert len(steps) <= 1 and (not steps or effects[-1] is steps[0]), effects
        for i, effect in enumerate(effects):
            match effect:
                case ReplaceStore(items, list_rv):
                    assert int(list_rv) >= self.store_rv, "relist regressed"
                    self.store = {o["metadata"]["name"]: o for o in items}
                    self.store_rv = int(list_rv)
                    assert self.store == self.server.state_at(self.store_rv)
                    if not self.replaced:
                        assert isinstance(effects[i + 1], Synced)
                    self.replaced = True
                case ApplyEvent(event_type, o):
                    rv = int(o["metadata"]["resourceVersion"])
                    assert rv > self.store_rv, "event regressed"
                    if event_type == "DELETED":
                        self.store.pop(o["metadata"]["name"])
                    else:
                        self.store[o["metadata"]["name"]] = o
                    self.store_rv = rv
                    assert self.store == self.server.state_at(rv)
                case Bookmark(bookmark_rv):
                    assert int(bookmark_rv) >= self.store_rv
                    self.store_rv = int(bookmark_rv)
                case Synced():
                    self.synced_count += 1
                    assert self.synced_count == 1
                case CloseWatch():
                    self.server.stream = None  # the driver drops the connection
                case Sleep(seconds, _, retry_after):
                    if retry_after:
                        assert seconds in (1.0, 5.0, 32.0)
                    else:
                        assert 0.8 <= seconds < 60.0
                case _:
                    pass
        return steps[0] if steps else None


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    script=st.lists(st.integers(0, 255), max_size=250),
    server_streams=st.booleans(),
    client_streams=st.booleans(),
    initial=st.integers(0, len(KEYS)),
    seed=st.integers(0, 2**32 - 1),
)
def test_store_follows_the_server_through_any_behaviour(
    script: list[int], server_streams: bool, client_streams: bool, initial: int, seed: int
) -> None:
    server = Server(script=list(reversed(script)), streaming=server_streams)
    server.states[server.rv] = {}
    for key in KEYS[:initial]:
        server.rv += 1
        server.objects[key] = obj(key, server.rv)
        server.states[server.rv] = dict(server.objects)
    m = ReflectorMachine(
        ReflectorOptions(page_size=PAGE, streaming_list=client_streams), rng=random.Random(seed)
    )
    client = Client(server)
    effects = m.start(server.now)
    for _ in range(3_000):
        step = client.apply(effects)
        if isinstance(step, Sleep):
            server.now += step.seconds
            effects = m.sleep_done(server.now)
        elif isinstance(step, ListRequest):
            client.lists += 1
            effects = server.serve_list(m, step)
        elif isinstance(step, WatchRequest):
            effects = server.open_watch(m, step)
        else:
            assert m.watch_open and server.stream is not None, m.state
            pulled = server.pull(m)
            if pulled is None:
                break
            effects = pulled
    else:
        pytest.fail("the simulation did not quiesce")

    assert state(m) is State.WATCHING and m.synced
    assert client.store == server.objects
    assert client.store_rv == server.rv
    assert m.resource_version == str(server.rv)


# ---- issue 12: inputs of any shape ------------------------------------------------------------


def test_a_malformed_event_closes_the_watch_backs_off_and_relists() -> None:
    m = machine()
    synced_watching(m)
    effects = m.watch_event_malformed(1.0, "TypeError: the ADDED object is a NoneType")
    assert one(effects, CloseWatch)
    assert one(effects, Relisting).reason == "malformed watch event"
    assert any(e.level == logging.ERROR and "NoneType" in e.message for e in of(effects, Log))
    assert isinstance(next_step(effects), Sleep)
    assert not m.watch_open
    request = next_step(m.sleep_done(2.0))
    assert isinstance(request, ListRequest)
    # The relist asks for the last synced RV, not an RV the bad line may have carried.
    assert request.params["resourceVersion"] == "10"


def test_a_malformed_event_during_a_streaming_list_falls_back_to_list_for_this_sync() -> None:
    m = ReflectorMachine(rng=random.Random(7))
    m.start(0.0)
    m.watch_event(0.1, "ADDED", obj("a", 5))
    effects = m.watch_event_malformed(0.2, "not JSON")
    assert one(effects, CloseWatch)
    assert isinstance(next_step(effects), Sleep)
    assert isinstance(next_step(m.sleep_done(2.0)), ListRequest)
    assert m.streaming_supported  # only this sync falls back


@pytest.mark.parametrize("value", [None, "text", 7, [1, 2], {"metadata": "text"}, True])
@pytest.mark.parametrize("streaming", [False, True])
def test_bookmark_and_error_objects_of_any_shape_are_inputs(value: Any, streaming: bool) -> None:
    for event_type in ("BOOKMARK", "ERROR"):
        m = ReflectorMachine(ReflectorOptions(streaming_list=streaming), rng=random.Random(3))
        if streaming:
            m.start(0.0)
        else:
            synced_watching(m)
        effects = m.watch_event(1.0, event_type, value)
        if event_type == "ERROR":
            assert one(effects, CloseWatch)  # read as a 500: the watch ends, never the machine
            assert isinstance(next_step(effects), Sleep | ListRequest)
        else:
            assert not of(effects, CloseWatch) and m.watch_open


def test_parse_status_of_something_that_is_not_an_object_is_a_500() -> None:
    values: list[Any] = [None, "x", 3, [], 2.5]
    for value in values:
        info = parse_status(value)
        assert info.code == 500 and info.reason == "BadStatus"
