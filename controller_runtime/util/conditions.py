"""Status conditions (``metav1.Condition``): set, get, remove.

A condition is ``{type, status, observedGeneration, lastTransitionTime, reason, message}``.
``lastTransitionTime`` is when ``status`` last changed, so it moves only then: rewriting the
same status with a new reason or message keeps it. Times are RFC 3339 in UTC with seconds
precision (``2024-05-01T12:00:00Z``), the wire form of ``metav1.Time``.

The functions work on the list itself (``obj["status"]["conditions"]``; see
:func:`status_conditions`) and mutate it in place, like apimachinery's ``meta`` helpers.
A reconcile that decides several conditions at once can build :class:`Condition` values and
write them with :func:`set_conditions`: a Condition is checked when it is made, so a bad
reason fails where it is decided, not where it is written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

ConditionStatus = Literal["True", "False", "Unknown"]

_STATUSES = frozenset({"True", "False", "Unknown"})
# metav1.Condition's reason: CamelCase-ish, validated by the server where the CRD uses it.
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition as a reconcile decides it: ``type``, ``status``, ``reason``, ``message``.

    ``status`` may be given as a bool (``True`` → ``"True"``) and is stored as the string.
    Raises ``ValueError`` at construction for a status other than True/False/Unknown or a
    reason the server would reject (see :func:`set_condition`). The observed generation and
    transition time are not part of the decision: :func:`set_conditions` adds them.
    """

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""

    def __init__(
        self, type: str, status: ConditionStatus | bool, reason: str, message: str = ""
    ) -> None:
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "status", _status_text(status))
        object.__setattr__(self, "reason", _check_reason(reason))
        object.__setattr__(self, "message", message)

    @property
    def is_true(self) -> bool:
        """Whether ``status`` is ``"True"``."""
        return self.status == "True"


def _status_text(status: ConditionStatus | bool) -> ConditionStatus:
    value = ("True" if status else "False") if isinstance(status, bool) else status
    if value not in _STATUSES:
        raise ValueError(f"condition status must be True, False or Unknown, not {status!r}")
    return value


def _check_reason(reason: str) -> str:
    if not _REASON.match(reason):
        raise ValueError(
            f"condition reason {reason!r} is not valid: use a CamelCase word such as "
            "'Reconciled' (letters, digits, '_', ',' or ':'; starting with a letter)"
        )
    return reason


def format_time(moment: datetime) -> str:
    """``moment`` as a ``metav1.Time`` string (UTC, whole seconds); naive means UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """``obj["status"]["conditions"]``, created empty when absent (so it can be set)."""
    status = obj.get("status")
    if not isinstance(status, dict):
        status = obj["status"] = {}
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        conditions = status["conditions"] = []
    return conditions


def get_condition(
    conditions: Sequence[Mapping[str, Any]], condition_type: str
) -> dict[str, Any] | None:
    """A copy of the condition of ``condition_type``, or ``None``."""
    for condition in conditions:
        if condition.get("type") == condition_type:
            return dict(condition)
    return None


def is_true(conditions: Sequence[Mapping[str, Any]], condition_type: str) -> bool:
    """Whether the condition exists with status ``"True"``."""
    condition = get_condition(conditions, condition_type)
    return condition is not None and condition.get("status") == "True"


def set_condition(
    conditions: list[dict[str, Any]],
    condition_type: str,
    status: ConditionStatus | bool,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None,
    now: datetime | None = None,
) -> bool:
    """Set the condition of ``condition_type`` in place; return whether anything changed.

    ``status`` may be a bool (``True`` → ``"True"``). ``observed_generation`` is the
    ``metadata.generation`` the condition was computed from (``None`` leaves it out).
    ``lastTransitionTime`` is set to ``now`` (default: the current time) for a new condition
    and when ``status`` changes; otherwise it is kept. Raises ``ValueError`` for a status
    other than True/False/Unknown or a reason the server would reject (``metav1.Condition``
    wants a non-empty CamelCase word, e.g. ``"Reconciled"``).
    """
    value = _status_text(status)
    _check_reason(reason)
    desired: dict[str, Any] = {"type": condition_type, "status": value}
    if observed_generation is not None:
        desired["observedGeneration"] = observed_generation
    desired["reason"] = reason
    desired["message"] = message
    for index, existing in enumerate(conditions):
        if existing.get("type") != condition_type:
            continue
        if existing.get("status") == value and existing.get("lastTransitionTime"):
            desired["lastTransitionTime"] = existing["lastTransitionTime"]
        else:
            desired["lastTransitionTime"] = format_time(now or datetime.now(UTC))
        if existing == desired:
            return False
        conditions[index] = desired
        return True
    desired["lastTransitionTime"] = format_time(now or datetime.now(UTC))
    conditions.append(desired)
    return True


def set_conditions(
    conditions: list[dict[str, Any]],
    *decided: Condition,
    observed_generation: int | None,
    now: datetime | None = None,
) -> bool:
    """Set each of ``decided`` in place (as :func:`set_condition` does, in order: a later
    one of the same type wins); return whether anything changed."""
    changed = False
    for condition in decided:
        changed |= set_condition(
            conditions,
            condition.type,
            condition.status,
            reason=condition.reason,
            message=condition.message,
            observed_generation=observed_generation,
            now=now,
        )
    return changed


def remove_condition(conditions: list[dict[str, Any]], condition_type: str) -> bool:
    """Remove the condition of ``condition_type`` in place; return whether one was there."""
    kept = [c for c in conditions if c.get("type") != condition_type]
    if len(kept) == len(conditions):
        return False
    conditions[:] = kept
    return True
