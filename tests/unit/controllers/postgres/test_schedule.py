"""Cron schedules and the BackupPlan's scheduling and retention decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controllers.postgres.cron import CronError, Schedule
from controllers.postgres.plan import backup_name, due_run, parse_age, to_prune


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("*/15 * * * *", "2030-01-01 10:07", "2030-01-01 10:15"),
        ("0 3 * * *", "2030-01-01 03:00", "2030-01-02 03:00"),
        ("@hourly", "2030-01-01 10:59", "2030-01-01 11:00"),
        ("@weekly", "2030-01-01 00:00", "2030-01-06 00:00"),  # 2030-01-01 is a Tuesday
        ("30 2 1 jan-mar *", "2030-03-05 00:00", "2031-01-01 02:30"),
        ("0 0 * * mon-fri", "2030-01-04 12:00", "2030-01-07 00:00"),
        ("0 0 13 * 5", "2030-01-01 00:00", "2030-01-04 00:00"),  # day 13 OR a Friday
        ("0 0 29 2 *", "2030-01-01 00:00", "2032-02-29 00:00"),
        ("5/20 * * * 7", "2030-01-06 00:00", "2030-01-06 00:05"),  # 7 is Sunday
    ],
)
def test_next_run_times(schedule: str, after: str, expected: str) -> None:
    assert Schedule.parse(schedule).next_after(at(after)) == at(expected)


def test_latest_run_time_at_or_before() -> None:
    daily = Schedule.parse("0 3 * * *")
    assert daily.latest_at_or_before(at("2030-01-02 03:00")) == at("2030-01-02 03:00")
    assert daily.latest_at_or_before(at("2030-01-02 02:59")) == at("2030-01-01 03:00")
    assert list(
        Schedule.parse("@hourly").between(at("2030-01-01 00:00"), at("2030-01-01 02:00"))
    ) == [at("2030-01-01 01:00"), at("2030-01-01 02:00")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("* * * *", "5 fields"),
        ("60 * * * *", "minute: 60 is outside 0-59"),
        ("* * * * funday", "day of week"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "reversed"),
    ],
)
def test_bad_schedules_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(CronError, match=message):
        Schedule.parse(text)


def test_a_schedule_that_never_runs_is_an_error() -> None:
    with pytest.raises(CronError, match="never"):
        Schedule.parse("0 0 30 2 *").next_after(at("2030-01-01 00:00"))


def test_only_the_most_recent_missed_run_is_due() -> None:
    every10 = Schedule.parse("*/10 * * * *")
    assert due_run(every10, at("2030-01-01 00:00"), at("2030-01-01 00:35")) == at(
        "2030-01-01 00:30"
    )
    assert due_run(every10, at("2030-01-01 00:30"), at("2030-01-01 00:35")) is None


def test_ages_and_names() -> None:
    assert parse_age("30m") == timedelta(minutes=30)
    assert parse_age("7d") == timedelta(days=7)
    with pytest.raises(ValueError, match="maxAge"):
        parse_age("1w")
    assert (
        backup_name("nightly", at("2030-01-01 00:00")) == "nightly-31557600"
    )  # 2030-01-01 in minutes since 1970


def finished(name: str, when: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"postgres.crpy.io/scheduled-at": when}}}


def test_retention_keeps_the_newest_and_drops_the_old() -> None:
    backups = [finished(f"b{i}", f"2030-01-0{i}T00:00:00Z") for i in range(1, 6)]
    now = at("2030-01-06 00:00")

    def names(found: list[Any]) -> list[str]:
        return sorted(b["metadata"]["name"] for b in found)

    assert names(to_prune(backups, now, keep_last=2, max_age=None)) == ["b1", "b2", "b3"]
    assert names(to_prune(backups, now, keep_last=None, max_age=timedelta(days=2))) == [
        "b1",
        "b2",
        "b3",
    ]
    assert names(to_prune(backups, now, keep_last=4, max_age=timedelta(days=4, hours=1))) == ["b1"]
    assert to_prune(backups, now, keep_last=None, max_age=None) == []
