"""The event loop the operator runs on: asyncio's unless CRPY_EVENT_LOOP=uvloop (uvloop was
seen to abort the process during API-server restarts; docs/reliability.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import uvloop

from controller_runtime.manager import EVENT_LOOP_ENV, install_event_loop


@pytest.fixture
def restore_policy() -> Iterator[None]:
    policy = asyncio.get_event_loop_policy()
    yield
    asyncio.set_event_loop_policy(policy)


def _loop_type() -> type:
    loop = asyncio.get_event_loop_policy().new_event_loop()
    try:
        return type(loop)
    finally:
        loop.close()


@pytest.mark.usefixtures("restore_policy")
def test_the_default_is_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # set before: replaced
    assert install_event_loop() == "asyncio"
    assert not issubclass(_loop_type(), uvloop.Loop)


@pytest.mark.usefixtures("restore_policy")
@pytest.mark.parametrize("value", ["uvloop", " UVLoop "])
def test_uvloop_when_asked_for(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, value)
    assert install_event_loop() == "uvloop"
    assert issubclass(_loop_type(), uvloop.Loop)


@pytest.mark.usefixtures("restore_policy")
def test_an_unknown_loop_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ValueError, match=r"CRPY_EVENT_LOOP must be 'asyncio' or 'uvloop'"):
        install_event_loop()
    assert install_event_loop("asyncio") == "asyncio"
