"""429s are expected for a moment (a fresh API server's "storage is (re)initializing", flow
control shedding a burst): the reflector logs them at DEBUG until they persist, i.e. until
the third 429 in a row without a LIST page or a watch's 200 in between."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from informers.reflector_machine import (
    QUIET_THROTTLES,
    Effect,
    ListRequest,
    Log,
    ReflectorMachine,
    ReflectorOptions,
    State,
    WatchRequest,
)

INITIALIZING = "storage is (re)initializing"


def logs(effects: list[Effect]) -> list[Log]:
    return [e for e in effects if isinstance(e, Log)]


def test_a_fresh_servers_429_on_the_streaming_list_logs_at_debug() -> None:
    # What every fresh `make run` did: the streaming list is refused once, LIST then works.
    m = ReflectorMachine()
    assert isinstance(m.start(0.0)[-1], WatchRequest)
    effects = m.watch_failed(
        0.1, 429, reason="TooManyRequests", message=INITIALIZING, retry_after=1
    )
    [log] = logs(effects)
    assert log.level == logging.DEBUG
    assert "streaming list failed (429 TooManyRequests: storage is (re)initializing" in log.message
    assert isinstance(m.sleep_done(1.1)[-1], ListRequest)
    effects = m.list_page(1.2, [], "10", "")
    assert not [log for log in logs(effects) if log.level >= logging.INFO]


def test_the_third_429_in_a_row_logs_at_the_usual_level_with_the_count() -> None:
    m = ReflectorMachine()
    m.start(0.0)
    first = logs(m.watch_failed(0.1, 429, message=INITIALIZING, retry_after=1))
    m.sleep_done(1.1)  # the fallback LIST
    second = logs(m.list_failed(1.2, 429, message=INITIALIZING, retry_after=1))
    m.sleep_done(2.2)
    third = logs(m.list_failed(2.3, 429, message=INITIALIZING, retry_after=1))
    assert [log.level for log in first + second] == [logging.DEBUG, logging.DEBUG]
    [log] = third
    assert log.level == logging.WARNING and "(3 answers 429 in a row)" in log.message


def test_a_429_on_an_established_watch_is_quiet_then_at_info() -> None:
    m = ReflectorMachine(ReflectorOptions(streaming_list=False))
    m.start(0.0)
    m.list_page(0.1, [], "10", "")  # synced, watching
    levels = []
    for i in range(4):
        levels += [log.level for log in logs(m.watch_failed(1.0 + i, 429, retry_after=1))]
        assert isinstance(m.sleep_done(1.5 + i)[-1], WatchRequest)
    assert levels == [logging.DEBUG, logging.DEBUG, logging.INFO, logging.INFO]


def test_other_failures_keep_their_level_and_do_not_count() -> None:
    m = ReflectorMachine(ReflectorOptions(streaming_list=False))
    m.start(0.0)
    for i in range(5):
        [log] = logs(m.list_failed(float(i), 503))
        assert log.level == logging.WARNING
        m.sleep_done(i + 0.5)
    [log] = logs(m.list_failed(9.0, 429))
    assert log.level == logging.DEBUG  # the first 429, however many 503s came before


@given(outcomes=st.lists(st.booleans(), max_size=40))
def test_a_429_is_quiet_exactly_when_few_came_since_the_last_success(outcomes: list[bool]) -> None:
    # Drive a paginated LIST: True answers a page (with a continue token, so it goes on
    # listing), False answers 429. Each 429 logs at DEBUG iff it is among the first
    # QUIET_THROTTLES since the last page.
    m = ReflectorMachine(ReflectorOptions(streaming_list=False))
    now = 0.0
    m.start(now)
    in_a_row = 0
    for page_arrives in outcomes:
        now += 1.0
        assert m.state is State.LISTING
        if page_arrives:
            m.list_page(now, [], "10", "more")
            in_a_row = 0
            continue
        in_a_row += 1
        [log] = logs(m.list_failed(now, 429, retry_after=1))
        assert (log.level == logging.DEBUG) == (in_a_row <= QUIET_THROTTLES)
        if in_a_row > QUIET_THROTTLES:
            assert log.level == logging.WARNING and f"({in_a_row} answers 429" in log.message
        now += 1.0
        m.sleep_done(now)
