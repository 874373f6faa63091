"""How long a watch may take to be answered: a plain watch is bounded, a streaming list gets
its whole idle window (informers/reflector.py, module docs)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from informers.reflector import WATCH_HANDSHAKE_TIMEOUT, handshake_timeout

idle = st.floats(min_value=1.0, max_value=3600.0, allow_nan=False)


@given(idle=idle)
def test_a_plain_watch_is_answered_within_the_bound_or_its_idle_window(idle: float) -> None:
    got = handshake_timeout({"watch": "1", "timeoutSeconds": "300"}, idle)
    assert got == min(idle, WATCH_HANDSHAKE_TIMEOUT)
    assert got <= WATCH_HANDSHAKE_TIMEOUT


@given(idle=idle)
def test_a_streaming_list_waits_its_whole_idle_window(idle: float) -> None:
    params = {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
    assert handshake_timeout(params, idle) == idle


def test_the_bound_of_a_plain_watch_is_thirty_seconds() -> None:
    assert WATCH_HANDSHAKE_TIMEOUT == 30.0
    assert handshake_timeout({"watch": "1"}, 610.0) == 30.0
    assert handshake_timeout({"watch": "1", "sendInitialEvents": "true"}, 610.0) == 610.0
