"""derive_status works on a copy: the Task it is given (a cache read) is never changed."""

from __future__ import annotations

import copy
from collections import UserDict
from datetime import UTC, datetime
from typing import Any

from controllers.task import derive_status

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _task(status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "t", "namespace": "ns", "generation": 2},
        "spec": {"taskState": "Pending", "deadline": "2026-11-30T11:00:00Z"},
        "status": status,
    }


def test_the_task_and_its_nested_conditions_are_left_alone() -> None:
    status = {
        "state": "Pending",
        "observedGeneration": 1,
        "conditions": [{"type": "Overdue", "status": "False", "reason": "OnTime"}],
    }
    task = _task(status)
    before = copy.deepcopy(task)
    derived, _ = derive_status(task, NOW)
    assert derived["state"] == "Overdue"
    assert derived["conditions"][0]["status"] == "True"
    assert task == before  # the condition list inside was not touched


def test_a_status_orjson_cannot_encode_is_still_copied() -> None:
    conditions = [UserDict({"type": "Other", "status": "True"})]  # not a dict: no orjson
    task = _task({"state": "Pending", "conditions": conditions})
    derived, _ = derive_status(task, NOW)
    assert derived["conditions"] is not conditions
    assert len(conditions) == 1
    assert [c["type"] for c in derived["conditions"]] == ["Other", "Overdue"]
