"""The fuzzer's scenario for the Backup and BackupPlan controllers (``controllers/postgres/``).

There is no job controller on the fuzzer's control plane, so the scenario plays its part: it
writes a Job's status (``Complete`` or ``Failed``) through the API server, and deletes a
deleted Backup's Job as the garbage collector would (``Background``: a Job's default, orphan,
waits for a garbage collector that does not run here). The plan's clock is the scenario's:
``tick`` moves it one minute on and changes the plan's spec (``startingDeadlineSeconds``, far
larger than any lateness here) so that the plan is reconciled at the new time.

Workload (``objects`` manual Backups ``m0``.., and one plan ``p``: every minute, concurrency
``Allow``, retention ``keepLast`` 2 and ``maxAge`` 3m): create a manual Backup; re-create it
with the same name; complete or fail its Job (and the oldest unfinished Job of the plan's
Backups); delete its Job by hand; tick the plan's clock.

Safety, after every step:

- never two Jobs for one Backup (by the Backup's UID, over the whole run);
- never a Backup of the plan deleted while its Job had not finished (``Allow`` deletes none);
- never a Backup pruned that retention keeps: among the plan's Backups whose Jobs the
  scenario finished, the newest ``keepLast`` scheduled within ``maxAge`` of the clock must
  still exist;
- never a second Backup for one scheduled time (a pruned one created again).

Converged: every Backup's phase is what its own Job says (``Pending`` with a Job it controls
until the scenario finished it; ``Failed`` when its Job was deleted by hand before it
finished); the plan observed its generation, lists exactly its unfinished Backups as
``active``, scheduled the latest run time of its clock, and nothing left to prune.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from controller_runtime.client import Client
from controller_runtime.manager import Manager
from controllers.postgres import (
    setup_backup_controller,
    setup_instance_controller,
    setup_plan_controller,
)
from controllers.postgres.api import API_VERSION, LABEL_PLAN
from controllers.postgres.cron import Schedule
from controllers.postgres.localserver import LocalPostgres
from controllers.postgres.plan import parse_time, scheduled_at, to_prune
from kubeclient.errors import ConflictError, NotFoundError
from kubeclient.transport import Transport
from tests.integration.stalecache.scenarios import OPTIONS
from tests.support import create_external_instance

Obj = dict[str, Any]
STORAGE = {
    "endpoint": "https://s3.example.test",
    "bucket": "db-backups",
    "credentialsSecretRef": {"name": "s3-credentials"},
}
SCHEDULE = "* * * * *"
KEEP_LAST = 2
MAX_AGE = timedelta(minutes=3)
TERMINAL = ("Succeeded", "Failed")
MERGE = "application/merge-patch+json"


class ScenarioClock:
    """The plan's clock: starts at the real time, moves only when the scenario ticks."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def _controller_uid(obj: Obj) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _phase(obj: Obj) -> str | None:
    phase = (obj.get("status") or {}).get("phase")
    return str(phase) if phase else None


class BackupScenario:
    name = "backup"
    resources: tuple[str, ...] = ("backups", "jobs", "backupplans")
    actions: tuple[str, ...] = ("create", "recreate", "complete", "fail", "delete-job", "tick")
    objects = 2

    def __init__(self, transport: Transport, server: LocalPostgres) -> None:
        self.transport = transport
        self.server = server
        self.namespace = ""
        self.clock = ScenarioClock()
        self._deadline = 86400
        # What the scenario did, by Backup UID: the outcome it wrote on the Backup's Job, and
        # the Backups whose unfinished Job it deleted by hand.
        self.outcomes: dict[str, str] = {}
        self.jobs_deleted: set[str] = set()
        # What it saw: the Jobs of each Backup, and the plan's Backups (uid -> name, time).
        self.jobs_seen: dict[str, set[str]] = {}
        self.plan_backups: dict[str, tuple[str, datetime]] = {}
        self.gone: set[str] = set()

    @property
    def _backups(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/backups"

    @property
    def _jobs(self) -> str:
        return f"/apis/batch/v1/namespaces/{self.namespace}/jobs"

    @property
    def _plan(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/backupplans/p"

    async def setup(self, manager: Manager, client: Client, namespace: str) -> None:
        self.namespace = namespace
        await create_external_instance(
            self.transport, self.server, namespace, field_manager="fuzzer"
        )
        # The instance controller runs beside them, as in the operator (it also caches the
        # PostgresInstances the Backup controller reads).
        await setup_instance_controller(manager, client, options=OPTIONS)
        await setup_backup_controller(manager, client, options=OPTIONS)
        await setup_plan_controller(manager, client, options=OPTIONS, clock=self.clock)
        plan = {
            "apiVersion": API_VERSION,
            "kind": "BackupPlan",
            "metadata": {"name": "p"},
            "spec": {
                "schedule": SCHEDULE,
                "concurrencyPolicy": "Allow",
                "startingDeadlineSeconds": self._deadline,
                "retention": {"keepLast": KEEP_LAST, "maxAge": "3m"},
                "backupTemplate": {"spec": {"instanceRef": {"name": "db"}, "storage": STORAGE}},
            },
        }
        await self.transport.request(
            "POST", f"/apis/{API_VERSION}/namespaces/{namespace}/backupplans", body=plan
        )

    # -- workload -------------------------------------------------------------------------

    async def act(self, action: str, index: int) -> None:
        await self._play_job_and_garbage_collectors()
        name = f"m{index}"
        if action == "tick":
            await self._tick()
        elif action == "create":
            await self._create(name)
        elif action == "recreate":
            await self._delete_backup(name)
            await self._create(name)
        elif action in ("complete", "fail"):
            outcome = "Succeeded" if action == "complete" else "Failed"
            await self._finish_job(f"{name}-backup", outcome)
            await self._finish_oldest_plan_job(outcome)
        else:  # delete-job: a Job deleted by hand
            job = await self._get(f"{self._jobs}/{name}-backup")
            owner = _controller_uid(job) if job else None
            if job is None or owner is None:
                return
            with contextlib.suppress(NotFoundError):
                await self.transport.request(
                    "DELETE",
                    f"{self._jobs}/{name}-backup",
                    body={
                        "preconditions": {"uid": job["metadata"]["uid"]},
                        "propagationPolicy": "Background",
                    },
                )
                if owner not in self.outcomes:
                    self.jobs_deleted.add(owner)

    async def _get(self, path: str) -> Obj | None:
        try:
            found: Obj = await self.transport.get_json(path)
        except NotFoundError:
            return None
        return found

    async def _create(self, name: str) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": "Backup",
            "metadata": {"name": name},
            "spec": {"instanceRef": {"name": "db"}, "storage": STORAGE},
        }
        with contextlib.suppress(Exception):  # already there
            await self.transport.request("POST", self._backups, body=body)

    async def _delete_backup(self, name: str) -> None:
        backup = await self._get(f"{self._backups}/{name}")
        if backup is None:
            return
        with contextlib.suppress(NotFoundError):
            await self.transport.request("DELETE", f"{self._backups}/{name}")
        # The garbage collector's part: the Jobs the deleted Backup controlled go too.
        for job in await self._list(self._jobs):
            if _controller_uid(job) == backup["metadata"]["uid"]:
                with contextlib.suppress(NotFoundError):
                    await self.transport.request(
                        "DELETE",
                        f"{self._jobs}/{job['metadata']['name']}",
                        body={"propagationPolicy": "Background"},
                    )

    async def _tick(self) -> None:
        self.clock.now += timedelta(minutes=1)
        self._deadline += 1
        await self.transport.request(
            "PATCH",
            self._plan,
            body={"spec": {"startingDeadlineSeconds": self._deadline}},
            content_type=MERGE,
        )

    async def _finish_oldest_plan_job(self, outcome: str) -> None:
        running = [
            b
            for b in await self._list(self._backups)
            if (b["metadata"].get("labels") or {}).get(LABEL_PLAN) == "p"
            and b["metadata"]["uid"] not in self.outcomes
            and b["metadata"]["uid"] not in self.jobs_deleted
        ]
        for backup in sorted(running, key=scheduled_at):
            if await self._finish_job(f"{backup['metadata']['name']}-backup", outcome):
                return

    async def _finish_job(self, name: str, outcome: str) -> bool:
        """Write the job controller's final status on Job ``name``; whether it was done."""
        job = await self._get(f"{self._jobs}/{name}")
        owner = _controller_uid(job) if job else None
        if job is None or owner is None or owner in self.outcomes:
            return False
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if outcome == "Succeeded":
            conditions = [
                {"type": "SuccessCriteriaMet", "status": "True"},
                {"type": "Complete", "status": "True"},
            ]
            status: Obj = {"startTime": now, "completionTime": now, "succeeded": 1}
        else:
            why = {"reason": "BackoffLimitExceeded", "message": "backoff limit reached"}
            conditions = [
                {"type": "FailureTarget", "status": "True", **why},
                {"type": "Failed", "status": "True", **why},
            ]
            status = {"startTime": now, "failed": 1}
        status["conditions"] = conditions
        try:
            await self.transport.request(
                "PATCH",
                f"{self._jobs}/{name}/status",
                body={
                    "metadata": {"uid": job["metadata"]["uid"]},
                    "status": status,
                },
                content_type=MERGE,
            )
        except (NotFoundError, ConflictError):  # gone, or another Job by now
            return False
        self.outcomes[owner] = outcome
        return True

    async def _play_job_and_garbage_collectors(self) -> None:
        """What the controllers missing here would do for the Backup finalizer's Jobs: the
        garbage collector ends a foreground deletion (a Job has no Pods here), and the job
        controller completes the ``<backup>-delete`` Jobs (the object deletion succeeds)."""
        for job in await self._list(self._jobs):
            meta = job["metadata"]
            finalizers = meta.get("finalizers") or []
            path = f"{self._jobs}/{meta['name']}"
            with contextlib.suppress(NotFoundError, ConflictError):
                if meta.get("deletionTimestamp") and "foregroundDeletion" in finalizers:
                    rest = [f for f in finalizers if f != "foregroundDeletion"]
                    await self.transport.request(
                        "PATCH",
                        path,
                        body={
                            "metadata": {
                                "finalizers": rest,
                                "resourceVersion": meta["resourceVersion"],
                            }
                        },
                        content_type=MERGE,
                    )
                elif meta["name"].endswith("-delete") and not (job.get("status") or {}).get(
                    "conditions"
                ):
                    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    await self.transport.request(
                        "PATCH",
                        f"{path}/status",
                        body={
                            "status": {
                                "startTime": now,
                                "completionTime": now,
                                "succeeded": 1,
                                "conditions": [
                                    {"type": "SuccessCriteriaMet", "status": "True"},
                                    {"type": "Complete", "status": "True"},
                                ],
                            }
                        },
                        content_type=MERGE,
                    )

    async def _list(self, path: str) -> list[Obj]:
        listed = await self.transport.get_json(path)
        return list(listed.get("items") or [])

    # -- invariants -----------------------------------------------------------------------

    def _kept(self) -> set[str]:
        """UIDs of the plan's finished Backups that retention keeps at the clock's time."""
        finished = [
            (when, uid)
            for uid, (_, when) in self.plan_backups.items()
            if uid in self.outcomes and self.clock.now - when <= MAX_AGE
        ]
        return {uid for _, uid in sorted(finished, reverse=True)[:KEEP_LAST]}

    async def violations(self) -> list[str]:
        out: list[str] = []
        for job in await self._list(self._jobs):
            owner = _controller_uid(job)
            if owner is None:
                continue
            seen = self.jobs_seen.setdefault(owner, set())
            seen.add(job["metadata"]["uid"])
            if len(seen) > 1:
                out.append(f"Backup {owner} ran {len(seen)} Jobs ({job['metadata']['name']})")
        backups = await self._list(self._backups)
        present = {b["metadata"]["uid"] for b in backups}
        names: dict[str, set[str]] = {}
        for backup in backups:
            meta = backup["metadata"]
            if (meta.get("labels") or {}).get(LABEL_PLAN) == "p":
                self.plan_backups[meta["uid"]] = (meta["name"], scheduled_at(backup))
        for uid, (name, _) in self.plan_backups.items():
            names.setdefault(name, set()).add(uid)
        out.extend(
            f"two Backups for one scheduled time: {name} ({len(uids)} UIDs)"
            for name, uids in names.items()
            if len(uids) > 1
        )
        kept = self._kept()
        for uid, (name, _) in self.plan_backups.items():
            if uid in present:
                continue
            self.gone.add(uid)
            if uid not in self.outcomes and uid not in self.jobs_deleted:
                out.append(f"Backup {name} ({uid}) was deleted before its Job finished")
            elif uid in kept:
                out.append(f"Backup {name} ({uid}) was pruned though retention keeps it")
        return out

    def _expected_phase(self, uid: str) -> str:
        if uid in self.outcomes:
            return self.outcomes[uid]
        return "Failed" if uid in self.jobs_deleted else "Pending"

    async def unconverged(self) -> list[str]:
        await self._play_job_and_garbage_collectors()
        out: list[str] = []
        jobs = {j["metadata"]["name"]: j for j in await self._list(self._jobs)}
        backups = await self._list(self._backups)
        for backup in backups:
            meta = backup["metadata"]
            want, have = self._expected_phase(meta["uid"]), _phase(backup)
            if have != want:
                out.append(f"Backup {meta['name']} is {have}, its Job says {want}")
            job = jobs.get(f"{meta['name']}-backup")
            # A Job is needed until it finished: one finished and then deleted by hand
            # leaves its Backup with the outcome it gave (and no second Job).
            if want == "Pending" and (job is None or _controller_uid(job) != meta["uid"]):
                out.append(f"Backup {meta['name']} has no Job of its own")
        plan = await self._get(self._plan)
        if plan is None:
            return [*out, "the plan is gone"]
        status = plan.get("status") or {}
        if status.get("observedGeneration") != plan["metadata"].get("generation"):
            out.append("the plan has not observed its generation")
        mine = [b for b in backups if _controller_uid(b) == plan["metadata"]["uid"]]
        active = sorted(b["metadata"]["name"] for b in mine if _phase(b) not in TERMINAL)
        if sorted(status.get("active") or []) != active:
            out.append(f"the plan lists {status.get('active')} active, not {active}")
        latest = Schedule.parse(SCHEDULE).latest_at_or_before(self.clock.now)
        created = parse_time(plan["metadata"]["creationTimestamp"])
        if latest > created and status.get("lastScheduleTime") != latest.strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ):
            out.append(f"the plan has not scheduled {latest} ({status.get('lastScheduleTime')})")
        finished = [b for b in mine if _phase(b) in TERMINAL]
        prune = to_prune(finished, self.clock.now, keep_last=KEEP_LAST, max_age=MAX_AGE)
        if prune:
            out.append(f"retention has not pruned {[b['metadata']['name'] for b in prune]}")
        return out

    async def teardown(self) -> None:
        return None
