"""The write-heavy scenario's status stamp, shared by every Python implementation (ours, kopf,
the plain-client limit); ``bench/peers/go/main.go`` does the same in Go.

In write-heavy mode every reconcile writes: the derived status plus a condition of type
``Bench`` whose message is ``"<stamp>/<n>"``, n counting this run's writes to the object, up to
``rounds``. The stamp makes each write a real change (the API server skips a patch that changes
nothing: no new resourceVersion, no watch event) and lets the harness see each one from outside.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controller_runtime.util.conditions import get_condition, set_condition

BENCH_CONDITION = "Bench"


def bench_count(status: dict[str, Any] | None, stamp: str) -> int:
    """How many writes of the run ``stamp`` the status says were made (0 for another run)."""
    condition = get_condition((status or {}).get("conditions") or [], BENCH_CONDITION)
    if condition is None:
        return 0
    prefix, _, count = str(condition.get("message", "")).partition("/")
    if prefix != stamp or not count.isdigit():
        return 0
    return int(count)


def stamped(
    derived: dict[str, Any],
    current: dict[str, Any] | None,
    *,
    stamp: str,
    rounds: int,
    generation: int | None,
    now: datetime,
) -> dict[str, Any] | None:
    """``derived`` (a fresh status, mutated) with the next stamp, or ``None`` once ``current``
    already carries ``rounds`` writes of this run."""
    written = bench_count(current, stamp)
    if written >= rounds:
        return None
    set_condition(
        derived.setdefault("conditions", []),
        BENCH_CONDITION,
        True,
        reason="WriteHeavy",
        message=f"{stamp}/{written + 1}",
        observed_generation=generation,
        now=now,
    )
    return derived
