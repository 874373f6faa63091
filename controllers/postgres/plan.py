"""The BackupPlan controller: Backups on a cron schedule, with retention.

Like a CronJob's controller, with the same rules:

- The run due is the most recent schedule time after ``status.lastScheduleTime`` (or the
  plan's creation) that is not in the future; earlier missed times are skipped. With
  ``startingDeadlineSeconds``, a run later than that is skipped.
- ``suspend: true`` creates nothing (existing Backups stay, and retention still prunes).
- ``concurrencyPolicy`` while a Backup of the plan has not finished: ``Forbid`` (default)
  skips the run, ``Replace`` deletes the running one(s) first, ``Allow`` starts another.
- A Backup is named ``<plan>-<scheduled time in minutes since the epoch>``: a reconcile that
  runs again, or on a stale cache, cannot create a second Backup for the same time.
- Retention prunes *finished* Backups of the plan: beyond the newest ``keepLast``, and older
  than ``maxAge`` (by scheduled time). Running ones are never pruned. A pruned Backup's
  object is deleted from the bucket by the Backup's own finalizer (see
  :mod:`controllers.postgres.backup`); Backups already being deleted are not counted.

- ``LastBackupSucceeded`` reflects the newest finished Backup of the plan; when it failed
  the condition is False (reason ``BackupFailed``, the Backup's name and failure) and a
  Warning event ``BackupFailed`` is recorded on the plan once per failed Backup.

The controller requeues itself for the next schedule time. The clock is injectable
(``clock``) for tests.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from controller_runtime import (
    AlreadyExistsError,
    Client,
    Condition,
    Controller,
    ControllerBuilder,
    ControllerOptions,
    EventRecorder,
    NotFoundError,
    Request,
    Result,
    format_time,
    ignore_not_found,
    is_controlled_by,
    reconcile_logger,
    set_controller_reference,
)
from controller_runtime.builder import ControllerHost
from controllers.postgres.api import (
    ANNOTATION_SCHEDULED_AT,
    API_VERSION,
    BACKUP,
    BACKUP_PLAN,
    LABEL_MANAGED_BY,
    LABEL_PLAN,
    MANAGED_BY,
)
from controllers.postgres.common import (
    set_conditions,
    status_copy,
    write_status,
)
from controllers.postgres.connection import SpecOrDeletionChanged
from controllers.postgres.cron import CronError, Schedule
from controllers.recording import controller_recorder

Obj = dict[str, Any]
Clock = Callable[[], datetime]
TERMINAL = frozenset({"Succeeded", "Failed"})
_AGE = re.compile(r"^(\d+)([mhd])$")


def utcnow() -> datetime:
    return datetime.now(UTC)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def parse_age(text: str) -> timedelta:
    """``30m``, ``12h``, ``7d`` as a timedelta; ``ValueError`` otherwise."""
    match = _AGE.match(text)
    if match is None:
        raise ValueError(f"maxAge {text!r} is not <number>m, h or d")
    unit = {"m": "minutes", "h": "hours", "d": "days"}[match[2]]
    return timedelta(**{unit: int(match[1])})


def scheduled_at(backup: Mapping[str, Any]) -> datetime:
    """When a Backup of a plan was scheduled (its annotation; else its creation)."""
    meta = backup["metadata"]
    text = (meta.get("annotations") or {}).get(ANNOTATION_SCHEDULED_AT) or meta.get(
        "creationTimestamp"
    )
    return parse_time(text) if text else datetime.fromtimestamp(0, UTC)


def due_run(schedule: Schedule, last: datetime, now: datetime) -> datetime | None:
    """The most recent run time in ``(last, now]``, or ``None`` (earlier missed runs in
    that window are skipped, as a CronJob does)."""
    try:
        latest = schedule.latest_at_or_before(now)
    except CronError:
        return None
    return latest if latest > last else None


def to_prune(
    finished: Sequence[Mapping[str, Any]],
    now: datetime,
    *,
    keep_last: int | None,
    max_age: timedelta | None,
) -> list[Mapping[str, Any]]:
    """The finished Backups retention removes: all but the newest ``keep_last``, and all
    scheduled more than ``max_age`` before ``now``."""
    newest_first = sorted(finished, key=scheduled_at, reverse=True)
    prune = []
    for index, backup in enumerate(newest_first):
        if (keep_last is not None and index >= keep_last) or (
            max_age is not None and now - scheduled_at(backup) > max_age
        ):
            prune.append(backup)
    return prune


def backup_name(plan_name: str, moment: datetime) -> str:
    return f"{plan_name}-{int(moment.timestamp() // 60)}"


class PlanReconciler:
    """Reconciles one BackupPlan; see the module docs."""

    def __init__(self, client: Client, recorder: EventRecorder, *, clock: Clock = utcnow) -> None:
        self.client = client
        self.recorder = recorder
        self.clock = clock

    # The scheduling steps (validate, list, prune, decide the run, create, status) read in order.
    async def reconcile(self, request: Request) -> Result | None:  # noqa: PLR0915
        plan = await ignore_not_found(self.client.get(API_VERSION, BACKUP_PLAN, request))
        if plan is None or plan["metadata"].get("deletionTimestamp"):
            return None
        now = self.clock()
        meta, spec = plan["metadata"], plan.get("spec") or {}
        generation = meta.get("generation")
        status = status_copy(plan)
        status["observedGeneration"] = generation
        try:
            schedule = Schedule.parse(str(spec.get("schedule", "")))
            retention = spec.get("retention") or {}
            max_age = parse_age(retention["maxAge"]) if retention.get("maxAge") else None
        except (CronError, ValueError) as err:
            set_conditions(status, generation, Condition("Ready", False, "InvalidSpec", str(err)))
            await write_status(self.client, plan, status)
            return None  # only a spec change can fix it
        backups = [
            b
            for b in await self.client.list(
                API_VERSION,
                BACKUP,
                namespace=meta["namespace"],
                label_selector=f"{LABEL_PLAN}={meta['name']}",
            )
            if is_controlled_by(b, plan) and not b["metadata"].get("deletionTimestamp")
        ]
        active = [b for b in backups if (b.get("status") or {}).get("phase") not in TERMINAL]
        finished = [b for b in backups if b not in active]
        pruned = to_prune(finished, now, keep_last=retention.get("keepLast"), max_age=max_age)
        for backup in pruned:
            await self._delete(backup)
        if pruned:
            self.recorder.record(
                plan, "Normal", "Pruned", f"deleted {len(pruned)} Backup(s) by retention", "Prune"
            )
        last_text = status.get("lastScheduleTime") or meta.get("creationTimestamp")
        last = parse_time(last_text) if last_text else now
        due = due_run(schedule, last, now)
        message = "waiting for the next run"
        if due is not None and not spec.get("suspend"):
            deadline = spec.get("startingDeadlineSeconds")
            policy = spec.get("concurrencyPolicy", "Forbid")
            if deadline is not None and (now - due).total_seconds() > int(deadline):
                message = f"missed the run of {format_time(due)} by more than its deadline"
                self.recorder.record(plan, "Warning", "MissedSchedule", message, "Schedule")
            elif active and policy == "Forbid":
                message = f"skipped the run of {format_time(due)}: a Backup is still running"
                self.recorder.record(plan, "Normal", "Skipped", message, "Schedule")
            else:
                if active and policy == "Replace":
                    for backup in active:
                        await self._delete(backup)
                    active = []
                created = await self._create(plan, due)
                active.append(created)
                status["lastScheduleTime"] = format_time(due)
                message = f"created Backup {created['metadata']['name']}"
        elif spec.get("suspend"):
            message = "suspended"
        succeeded = [
            str((b.get("status") or {}).get("completionTime"))
            for b in finished
            if (b.get("status") or {}).get("phase") == "Succeeded"
            and (b.get("status") or {}).get("completionTime")
        ]
        if succeeded:
            status["lastSuccessfulTime"] = max(succeeded, key=parse_time)
        status["active"] = sorted(b["metadata"]["name"] for b in active)
        outcome = self._last_outcome(plan, finished)
        set_conditions(
            status,
            generation,
            Condition("Ready", True, "Scheduled", message),
            *([outcome] if outcome else []),
        )
        await write_status(self.client, plan, status)
        next_run = schedule.next_after(now)
        return Result(requeue_after=max((next_run - now).total_seconds(), 1.0))

    def _last_outcome(self, plan: Obj, finished: Sequence[Mapping[str, Any]]) -> Condition | None:
        """``LastBackupSucceeded`` from the newest finished Backup (``None`` while there is
        none); a Warning ``BackupFailed`` event on the plan when it turns False."""
        if not finished:
            return None
        newest = max(finished, key=scheduled_at)
        name, status = newest["metadata"]["name"], newest.get("status") or {}
        if status.get("phase") == "Succeeded":
            return Condition("LastBackupSucceeded", True, "BackupSucceeded", f"Backup {name}")
        failure = next(
            (c.get("message") for c in status.get("conditions") or [] if c.get("type") == "Failed"),
            None,
        )
        message = f"Backup {name} failed: {failure or 'see the Backup'}"
        before: Mapping[str, Any] = next(
            (
                c
                for c in (plan.get("status") or {}).get("conditions") or []
                if c.get("type") == "LastBackupSucceeded"
            ),
            {},
        )
        if before.get("message") != message:
            self.recorder.record(plan, "Warning", "BackupFailed", message, "Schedule")
        return Condition("LastBackupSucceeded", False, "BackupFailed", message)

    async def _create(self, plan: Obj, due: datetime) -> Obj:
        meta = plan["metadata"]
        template = (plan.get("spec") or {}).get("backupTemplate") or {}
        backup: Obj = {
            "apiVersion": API_VERSION,
            "kind": BACKUP,
            "metadata": {
                "name": backup_name(meta["name"], due),
                "namespace": meta["namespace"],
                "labels": {LABEL_PLAN: meta["name"], LABEL_MANAGED_BY: MANAGED_BY},
                "annotations": {ANNOTATION_SCHEDULED_AT: format_time(due)},
            },
            "spec": template.get("spec") or {},
        }
        set_controller_reference(plan, backup, owner_namespaced=True, obj_namespaced=True)
        try:
            created = await self.client.create(backup)
        except AlreadyExistsError:
            return backup  # created by an earlier attempt: only its name is used
        reconcile_logger(__name__).info("created Backup %s", created["metadata"]["name"])
        self.recorder.record(
            plan,
            "Normal",
            "BackupCreated",
            f"created Backup {created['metadata']['name']}",
            "Schedule",
        )
        return created

    async def _delete(self, backup: Mapping[str, Any]) -> None:
        with contextlib.suppress(NotFoundError):
            await self.client.delete(
                backup,
                preconditions={"uid": backup["metadata"]["uid"]},
                propagation_policy="Background",
            )


async def setup_plan_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    recorder: EventRecorder | None = None,
    clock: Clock = utcnow,
) -> Controller:
    """Build the BackupPlan controller on ``host``: watches plans (spec changes) and the
    Backups they own (a finished Backup updates ``active`` and may be pruned)."""
    recorder = controller_recorder(host, "postgres.crpy.io/backupplan-controller", recorder)
    return await (
        ControllerBuilder(host)
        .named("backupplan")
        .for_(API_VERSION, BACKUP_PLAN, predicates=[SpecOrDeletionChanged()])
        .owns(API_VERSION, BACKUP)
        .with_options(options)
        .complete(PlanReconciler(client, recorder, clock=clock))
    )
