"""The suite's hypothesis profiles (registered in tests/conftest.py): load-tolerant by
default, reproducible and thorough on request."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def test_the_default_profile_tolerates_a_loaded_machine() -> None:
    active = settings()
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
        assert settings._current_profile == "ci"
    assert active.deadline is None
    assert HealthCheck.too_slow in active.suppress_health_check


def test_the_repro_profile_is_derandomized_and_has_no_database() -> None:
    repro = settings.get_profile("repro")
    assert repro.derandomize is True
    assert repro.database is None
    assert repro.deadline is None


def test_the_thorough_profile_runs_more_examples() -> None:
    default = settings()
    assert settings.get_profile("thorough").max_examples >= 10 * default.max_examples
    assert settings.get_profile("thorough").deadline is None
