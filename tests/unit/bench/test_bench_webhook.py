"""The webhook scenario's pure parts: the rules ours applies, the order of a round, and the
table of medians."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import orjson
import pytest

from bench.harness import settings_from
from bench.webhook import (
    TaskRules,
    admission_review,
    configuration,
    format_table,
    median_rows,
    rotation,
    task,
)
from controller_runtime.webhook import Denied


def _create(obj: dict[str, Any]) -> list[str]:
    return asyncio.run(TaskRules().validate_create(None, None, obj))


def test_a_valid_task_is_admitted_and_priority_5_warns() -> None:
    assert _create(task("a")) == []
    assert _create(task("a", priority=5)) == ["priority 5 pages whoever is on call"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"priority": 1, "deadline": "2001-01-01T00:00:00Z"}, "cannot be due in the past"),
        ({"priority": 1, "deadline": "tomorrow"}, "not an RFC 3339 time"),
        ({"priority": 1, "details": "this is forbidden"}, '"forbidden" is not allowed'),
    ],
)
def test_what_the_rules_refuse(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(Denied, match=says):
        _create({"metadata": {"name": "a"}, "spec": spec})


def test_the_review_is_a_create_of_the_object_and_the_configuration_fails_closed() -> None:
    obj = task("x")
    review = orjson.loads(admission_review("ns", obj))
    assert review["request"]["operation"] == "CREATE"
    assert review["request"]["object"] == obj and review["request"]["namespace"] == "ns"
    hook = configuration(9443, b"-----BEGIN CERTIFICATE-----")["webhooks"][0]
    assert hook["failurePolicy"] == "Fail"
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:9443/validate-tasks-crpy-io-v1-task"
    due = datetime.datetime.fromisoformat(obj["spec"]["deadline"])
    assert due > datetime.datetime.now(datetime.UTC)


def test_every_implementation_runs_first_in_some_round() -> None:
    names = ["ours", "go", "none"]
    firsts = {rotation(names, r)[0] for r in range(3)}
    assert firsts == set(names)
    assert all(sorted(rotation(names, r)) == sorted(names) for r in range(5))


def test_the_table_keeps_the_median_run_and_the_ratio() -> None:
    rows: list[dict[str, Any]] = []
    for implementation, p99s in (("ours", [0.004, 0.009, 0.005]), ("go", [0.003, 0.002, 0.004])):
        for p99 in p99s:
            rows.append(
                {"implementation": implementation, "via": "apiserver", "p50_seconds": 0.001}
                | {"p99_seconds": p99, "max_seconds": p99, "failures": 0}
            )
    medians = {r["implementation"]: r for r in median_rows(rows)}
    assert medians["ours"]["p99_seconds"] == 0.005 and medians["ours"]["runs"] == 3
    assert medians["go"]["p99_seconds"] == 0.003
    assert "1.67x" in format_table(rows)


def test_the_scenario_is_selected_by_name() -> None:
    s = settings_from(["--scenarios", "webhook", "--quick"])
    assert s.scenarios == ("webhook",)
    assert s.webhook_seconds == 5.0 and s.webhook_rate == 100.0
