"""Cron schedules (the five-field syntax of a CronJob), evaluated in UTC.

Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or ``jan``-``dec``),
day of week (0-7, 0 and 7 are Sunday, or ``sun``-``sat``). Each is ``*``, a number, a range
``a-b``, a list ``a,b``, with an optional step ``/n`` (``*/15``, ``1-30/5``, ``5/10``).
Macros: ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``),
``@hourly``. As in cron, when both day fields are restricted a day matches either one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
MAX_SEARCH_YEARS = 5


class CronError(ValueError):
    """A schedule that does not parse; the message says which field."""


def _value(text: str, names: dict[str, int], low: int, high: int, field: str) -> int:
    key = text.lower()
    if key in names:
        return names[key]
    if not text.isdigit():
        raise CronError(f"{field}: {text!r} is not a number")
    number = int(text)
    if not low <= number <= high:
        raise CronError(f"{field}: {number} is outside {low}-{high}")
    return number


def _field(text: str, low: int, high: int, field: str, names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{field}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            a, b = base.split("-", 1)
            start, end = _value(a, names, low, high, field), _value(b, names, low, high, field)
            if start > end:
                raise CronError(f"{field}: range {base!r} is reversed")
        else:
            start = _value(base, names, low, high, field)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    if not values:
        raise CronError(f"{field}: empty")
    return frozenset(values)


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule; :meth:`next_after` finds run times."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """Parse ``text``; :class:`CronError` says what is wrong."""
        expanded = _MACROS.get(text.strip().lower(), text)
        fields = expanded.split()
        if len(fields) != 5:
            raise CronError(
                f"a schedule has 5 fields (minute hour day-of-month month day-of-week) or is "
                f"a macro such as @daily; got {text!r}"
            )
        weekdays = _field(fields[4], 0, 7, "day of week", _DAYS)
        return cls(
            minutes=_field(fields[0], 0, 59, "minute", {}),
            hours=_field(fields[1], 0, 23, "hour", {}),
            days=_field(fields[2], 1, 31, "day of month", {}),
            months=_field(fields[3], 1, 12, "month", _MONTHS),
            weekdays=frozenset(d % 7 for d in weekdays),
            days_restricted=not fields[2].startswith("*"),
            weekdays_restricted=not fields[4].startswith("*"),
        )

    def _day_matches(self, moment: datetime) -> bool:
        in_days = moment.day in self.days
        in_weekdays = (moment.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def next_after(self, moment: datetime) -> datetime:
        """The first run time strictly after ``moment`` (UTC, whole minutes). Raises
        :class:`CronError` if there is none within five years (e.g. ``0 0 30 2 *``)."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        t = moment.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = t + timedelta(days=366 * MAX_SEARCH_YEARS)
        while t < limit:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                return t
        raise CronError("the schedule never runs")

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last run time at or before ``moment`` (UTC, whole minutes); :class:`CronError`
        if there is none within the five years before."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        t = moment.astimezone(UTC).replace(second=0, microsecond=0)
        limit = t - timedelta(days=366 * MAX_SEARCH_YEARS)
        while t > limit:
            if t.month not in self.months:
                t = t.replace(day=1, hour=0, minute=0) - timedelta(minutes=1)
            elif not self._day_matches(t):
                t = t.replace(hour=0, minute=0) - timedelta(minutes=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) - timedelta(minutes=1)
            elif t.minute not in self.minutes:
                t -= timedelta(minutes=1)
            else:
                return t
        raise CronError("the schedule never runs")

    def between(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Run times ``t`` with ``after < t <= until``, in order."""
        t = self.next_after(after)
        while t <= until:
            yield t
            t = self.next_after(t)
