"""Discovery while the API server is unreachable: ``wait_for_server`` retries (and logs) only
failures that say the server could not answer; an answer about the request fails at once."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from kubeclient import discovery
from kubeclient.discovery import Discovery, ServerUnreachableError, server_unreachable
from kubeclient.errors import ApiError, ForbiddenError
from kubeclient.transport import Transport

LISTING = {"resources": [{"name": "tasks", "kind": "Task", "namespaced": True, "verbs": []}]}


@dataclass
class _Config:
    server: str = "https://api.example:6443"


@dataclass
class _Transport:
    """Answers ``get_json`` with the scripted failures first, then the listing."""

    failures: list[ApiError]
    config: _Config = field(default_factory=_Config)
    calls: int = 0
    retries: list[int | None] = field(default_factory=list)
    forever: bool = False  # fail every request with the last scripted failure

    async def get_json(
        self, path: str, params: Any = None, *, max_retries: int | None = None
    ) -> Any:
        self.calls += 1
        self.retries.append(max_retries)
        if self.forever:
            raise self.failures[-1]
        if self.failures:
            raise self.failures.pop(0)
        return LISTING


def _discovery(failures: list[ApiError]) -> tuple[Discovery, _Transport]:
    transport = _Transport(failures)
    return Discovery(cast(Transport, transport)), transport


@pytest.fixture(autouse=True)
def _short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "WAIT_INITIAL", 0.001)


@pytest.mark.parametrize("status", [0, 429, 500, 503])
def test_unreachable_statuses(status: int) -> None:
    assert server_unreachable(ApiError(status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409])
def test_answers_about_the_request_are_not_unreachable(status: int) -> None:
    assert not server_unreachable(ApiError(status))


async def test_waits_for_an_unreachable_server_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found, transport = _discovery([ApiError(0, "TransportError"), ApiError(503), ApiError(429)])
    with caplog.at_level(logging.WARNING, logger="kubeclient.discovery"):
        info = await found.resolve("crpy.io/v1", "Task", wait_for_server=True)
    assert info.plural == "tasks"
    assert transport.calls == 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3
    assert all("cannot reach the API server https://api.example:6443" in w for w in warnings)
    assert "(attempt 3)" in warnings[-1]
    # One request per attempt: the transport's own retries would delay the first warning.
    assert transport.retries == [0, 0, 0, 0]


async def test_the_first_failure_is_logged_before_any_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    found, transport = _discovery([ApiError(0, "TransportError", "Connection refused")])
    seen_at: list[int] = []

    class Counting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen_at.append(transport.calls)

    handler = Counting(logging.WARNING)
    logging.getLogger("kubeclient.discovery").addHandler(handler)
    try:
        await found.resolve("crpy.io/v1", "Task", wait_for_server=True)
    finally:
        logging.getLogger("kubeclient.discovery").removeHandler(handler)
    assert seen_at == [1]


async def test_a_bounded_wait_gives_up_with_the_last_failure() -> None:
    refused = ApiError(0, "TransportError", "Connection refused")
    found, transport = _discovery([refused])
    transport.forever = True
    with pytest.raises(ServerUnreachableError) as gave_up:
        await found.resolve("crpy.io/v1", "Task", wait_for_server=True, wait_timeout=0.05)
    error = gave_up.value
    assert error.last is refused and error.attempts == transport.calls >= 1
    assert error.server == "https://api.example:6443" and error.waited == 0.05
    assert "Connection refused" in str(error) and "gave up after 0.05s" in str(error)


async def test_without_waiting_the_first_failure_raises() -> None:
    found, transport = _discovery([ApiError(0, "TransportError")])
    with pytest.raises(ApiError):
        await found.resolve("crpy.io/v1", "Task")
    assert transport.calls == 1


async def test_an_answer_about_the_request_is_not_waited_for() -> None:
    found, transport = _discovery([ForbiddenError(403, "Forbidden")])
    with pytest.raises(ForbiddenError):
        await found.resolve("crpy.io/v1", "Task", wait_for_server=True)
    assert transport.calls == 1
