"""Status conditions: lastTransitionTime moves only on a status change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from controller_runtime.util import (
    Condition,
    format_time,
    get_condition,
    is_true,
    remove_condition,
    set_condition,
    set_conditions,
    status_conditions,
)

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_a_new_condition_gets_every_field() -> None:
    conditions: list[dict[str, Any]] = []
    assert set_condition(
        conditions, "Ready", True, reason="Reconciled", message="ok", observed_generation=3, now=T0
    )
    assert conditions == [
        {
            "type": "Ready",
            "status": "True",
            "observedGeneration": 3,
            "reason": "Reconciled",
            "message": "ok",
            "lastTransitionTime": "2024-05-01T12:00:00Z",
        }
    ]
    assert is_true(conditions, "Ready")
    assert not is_true(conditions, "Other")


def test_same_values_change_nothing() -> None:
    conditions: list[dict[str, Any]] = []
    set_condition(conditions, "Ready", "True", reason="Done", observed_generation=1, now=T0)
    assert not set_condition(
        conditions, "Ready", "True", reason="Done", observed_generation=1, now=T1
    )
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:00:00Z"


def test_reason_message_or_generation_change_keeps_the_transition_time() -> None:
    conditions: list[dict[str, Any]] = []
    set_condition(conditions, "Ready", "False", reason="Waiting", observed_generation=1, now=T0)
    assert set_condition(
        conditions, "Ready", "False", reason="Blocked", message="m", observed_generation=2, now=T1
    )
    condition = get_condition(conditions, "Ready")
    assert condition is not None
    assert condition["reason"] == "Blocked" and condition["observedGeneration"] == 2
    assert condition["lastTransitionTime"] == "2024-05-01T12:00:00Z"


def test_status_change_moves_the_transition_time() -> None:
    conditions: list[dict[str, Any]] = []
    set_condition(conditions, "Ready", "False", reason="Waiting", observed_generation=1, now=T0)
    set_condition(conditions, "Other", "Unknown", reason="Init", observed_generation=1, now=T0)
    assert set_condition(conditions, "Ready", True, reason="Done", observed_generation=1, now=T1)
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:05:00Z"
    assert conditions[1]["lastTransitionTime"] == "2024-05-01T12:00:00Z"  # untouched
    assert [c["type"] for c in conditions] == ["Ready", "Other"]  # order kept


def test_times_are_utc_seconds_with_z() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert format_time(datetime(2024, 5, 1, 14, 0, 1, 999999, tzinfo=plus_two)) == (
        "2024-05-01T12:00:01Z"
    )
    assert format_time(datetime(2024, 5, 1, 14, 0, 1)) == "2024-05-01T14:00:01Z"  # naive: UTC
    conditions: list[dict[str, Any]] = []
    set_condition(conditions, "Ready", True, reason="Done", observed_generation=None)
    stamp = conditions[0]["lastTransitionTime"]
    parsed = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - parsed).total_seconds()) < 5
    assert "observedGeneration" not in conditions[0]


def test_invalid_status_or_reason_is_refused() -> None:
    conditions: list[dict[str, Any]] = []
    with pytest.raises(ValueError, match="True, False or Unknown"):
        set_condition(conditions, "Ready", "true", reason="Done", observed_generation=1)  # type: ignore[arg-type]
    for reason in ("", "has space", "9Lives", "trailing-dash"):
        with pytest.raises(ValueError, match="CamelCase"):
            set_condition(conditions, "Ready", True, reason=reason, observed_generation=1)
    assert conditions == []


def test_remove_and_status_conditions() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "x"}}
    conditions = status_conditions(obj)
    assert obj["status"] == {"conditions": []}
    set_condition(conditions, "Ready", True, reason="Done", observed_generation=1, now=T0)
    assert status_conditions(obj) is conditions
    assert obj["status"]["conditions"][0]["type"] == "Ready"
    assert remove_condition(conditions, "Ready")
    assert not remove_condition(conditions, "Ready")
    assert get_condition(conditions, "Ready") is None


# -- Condition values ------------------------------------------------------------------------


def test_a_condition_value_normalises_a_bool_status() -> None:
    assert Condition("Ready", True, "Reconciled").status == "True"
    assert Condition("Ready", False, "Waiting", "why").status == "False"
    assert Condition("Ready", "Unknown", "Checking").status == "Unknown"
    assert Condition("Ready", True, "Reconciled").is_true
    assert not Condition("Ready", "Unknown", "Checking").is_true


@pytest.mark.parametrize(
    ("status", "reason", "error"),
    [("Maybe", "Reconciled", "True, False or Unknown"), (True, "not valid", "CamelCase")],
)
def test_a_bad_condition_fails_where_it_is_decided(status: Any, reason: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Condition("Ready", status, reason)


def test_a_condition_value_is_immutable() -> None:
    condition = Condition("Ready", True, "Reconciled")
    with pytest.raises(AttributeError):
        condition.reason = "Other"  # type: ignore[misc]


def test_set_conditions_writes_each_and_reports_a_change() -> None:
    conditions: list[dict[str, Any]] = []
    decided = (Condition("Ready", True, "Reconciled"), Condition("Degraded", False, "AsExpected"))
    assert set_conditions(conditions, *decided, observed_generation=2, now=T0)
    assert [(c["type"], c["status"], c["observedGeneration"]) for c in conditions] == [
        ("Ready", "True", 2),
        ("Degraded", "False", 2),
    ]
    assert not set_conditions(conditions, *decided, observed_generation=2, now=T1)
    assert set_conditions(
        conditions, Condition("Ready", True, "Reconciled", "new"), observed_generation=2, now=T1
    )
    ready = get_condition(conditions, "Ready")
    assert ready is not None and ready["message"] == "new"
    assert ready["lastTransitionTime"] == format_time(T0)  # status unchanged: time kept
