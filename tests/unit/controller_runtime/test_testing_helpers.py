"""The plugin's eventually (Gomega's Eventually): retries an assertion until it holds."""

from __future__ import annotations

import pytest

from controller_runtime.testing import eventually


async def test_eventually_returns_once_the_check_passes() -> None:
    calls = []

    def check() -> int:
        calls.append(1)
        assert len(calls) >= 3, "not yet"
        return len(calls)

    assert await eventually(check, timeout=5, interval=0) == 3


async def test_eventually_takes_async_checks_and_retries_false() -> None:
    answers = iter([False, False, True])

    async def check() -> bool:
        return next(answers)

    assert await eventually(check, timeout=5, interval=0) is True


async def test_eventually_raises_the_last_failure_after_the_timeout() -> None:
    def check() -> None:
        raise AssertionError("still wrong")

    with pytest.raises(AssertionError, match="still wrong"):
        await eventually(check, timeout=0.05, interval=0.01)
    with pytest.raises(AssertionError, match="stayed false"):
        await eventually(lambda: False, timeout=0.05, interval=0.01)


async def test_other_errors_are_not_retried() -> None:
    def check() -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        await eventually(check, timeout=5)
