"""The Backup controller: one backup of an instance, run as a Job, tracked to its end.

A Backup is one-shot: its spec is immutable, and once it reaches ``Succeeded`` or ``Failed``
it is never run again. The controller creates the Job (``<backup>-backup``, rendered by
:mod:`controllers.postgres.jobs`, controlled by the Backup) and mirrors its outcome:
``status.phase`` (``Pending`` → ``Running`` → ``Succeeded`` | ``Failed``), ``jobName``,
``location`` (``s3://bucket/key``), ``startTime``, ``completionTime`` and the conditions
``Complete`` and ``Failed``. An event marks the end.

The Job's name is derived from the Backup's, so a reconcile on a stale cache that does not
see the Job yet cannot start a second one (the create answers ``AlreadyExists``). A Job that
disappears before it finished (deleted by hand) fails the Backup rather than running it again.
A Job of that name controlled by another object (the Job of a deleted Backup of the same name,
not collected yet) is never taken for this Backup's: the Backup stays as it is until that Job
is gone, then runs its own.
"""

from __future__ import annotations

from typing import Any

from controller_runtime import (
    AlreadyExistsError,
    Client,
    Condition,
    Controller,
    ControllerBuilder,
    ControllerHost,
    ControllerOptions,
    EnqueueRequestsFromMapFunc,
    EventRecorder,
    NotFoundError,
    Request,
    Result,
    is_controlled_by,
    reconcile_logger,
    set_controller_reference,
)
from controllers.postgres import jobs
from controllers.postgres.api import API_VERSION, BACKUP, INSTANCE, POLICY, POLICY_NAME, ref_name
from controllers.postgres.common import (
    controller_recorder,
    set_conditions,
    status_copy,
    write_status,
)
from controllers.postgres.connection import SpecOrDeletionChanged
from controllers.postgres.policy import image_for, parse_version

Obj = dict[str, Any]
TERMINAL = frozenset({"Succeeded", "Failed"})
PREDECESSOR_RECHECK = 5.0
"""Seconds between looks while a Job of the Backup's name belongs to another object."""


async def tools_image(client: Client, backup: Obj, instance: Obj) -> str:
    """The image with pg_dump/pg_basebackup: ``spec.image``, else the policy's image for the
    instance's version (the server's major for an external instance; client tools must not
    be older than the server)."""
    spec = backup.get("spec") or {}
    if spec.get("image"):
        return str(spec["image"])
    version_text = (
        (instance.get("status") or {}).get("version")
        or (instance.get("spec") or {}).get("version")
        or "16"
    )
    try:
        version = parse_version(str(version_text).split(".")[0])
    except ValueError:
        version = parse_version("16")
    try:
        policy: Obj | None = await client.get(API_VERSION, POLICY, name=POLICY_NAME)
    except NotFoundError:
        policy = None
    return image_for(policy, version)


class BackupReconciler:
    """Reconciles one Backup; see the module docs."""

    def __init__(self, client: Client, recorder: EventRecorder) -> None:
        self.client = client
        self.recorder = recorder

    async def reconcile(self, request: Request) -> Result | None:
        try:
            backup = await self.client.get(API_VERSION, BACKUP, request)
        except NotFoundError:
            return None
        status = status_copy(backup)
        if status.get("phase") in TERMINAL:
            return None  # one-shot: never run again
        meta = backup["metadata"]
        generation = meta.get("generation")
        status["observedGeneration"] = generation
        status["location"] = jobs.location(backup)
        name = jobs.job_name(meta["name"])
        try:
            job: Obj | None = await self.client.get(
                "batch/v1", "Job", name=name, namespace=meta["namespace"]
            )
        except NotFoundError:
            # The cache is complete (synced at start, and holding our own creates before we
            # run again): a Job we created and cannot see was deleted.
            job = None
        if job is not None and not is_controlled_by(job, backup):
            # A predecessor's: a deleted Backup of the same name whose Job is not collected
            # yet (or not yet gone from the cache). Never take its outcome; its deletion
            # brings us back, and the requeue covers a Job that is never collected.
            reconcile_logger(__name__).info("Job %s is not this Backup's; waiting for it", name)
            return Result(requeue_after=PREDECESSOR_RECHECK)
        if job is None and status.get("jobName"):
            phase, message = "Failed", f"the Job {name} disappeared before it finished"
        elif job is None:
            instance_name = ref_name(backup, "instanceRef") or ""
            try:
                instance = await self.client.get(
                    API_VERSION, INSTANCE, name=instance_name, namespace=meta["namespace"]
                )
            except NotFoundError:
                status["phase"] = "Pending"
                set_conditions(
                    status,
                    generation,
                    Condition(
                        "Complete",
                        False,
                        "InstanceNotFound",
                        f"PostgresInstance {instance_name!r} does not exist",
                    ),
                )
                await write_status(self.client, backup, status)
                return None
            rendered = jobs.backup_job(
                backup, instance, await tools_image(self.client, backup, instance)
            )
            set_controller_reference(backup, rendered, owner_namespaced=True, obj_namespaced=True)
            try:
                job = await self.client.create(rendered)
                reconcile_logger(__name__).info("created Job %s", name)
            except AlreadyExistsError:
                # Ours, from an attempt whose answer was lost, or a predecessor's not in the
                # cache yet: record nothing until the cache shows whose it is.
                return Result(requeue_after=PREDECESSOR_RECHECK)
            status["jobName"] = name
            phase, message = jobs.job_outcome(job)
        else:
            status["jobName"] = name
            phase, message = jobs.job_outcome(job)
        job_status = (job or {}).get("status") or {}
        status["phase"] = phase
        if job_status.get("startTime"):
            status["startTime"] = job_status["startTime"]
        if phase in TERMINAL:
            finished = job_status.get("completionTime") or _failure_time(job_status)
            if finished:
                status["completionTime"] = finished
            event_type = "Normal" if phase == "Succeeded" else "Warning"
            self.recorder.record(
                backup,
                event_type,
                f"Backup{phase}",
                f"{message}: {status['location']}" if phase == "Succeeded" else message,
                "Backup",
            )
        set_conditions(
            status,
            generation,
            Condition("Complete", phase == "Succeeded", phase, message),
            Condition("Failed", phase == "Failed", phase, message if phase == "Failed" else ""),
        )
        await write_status(self.client, backup, status)
        return None


def _failure_time(job_status: dict[str, Any]) -> str | None:
    for condition in job_status.get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            time = condition.get("lastTransitionTime")
            return str(time) if time else None
    return None


async def setup_backup_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    recorder: EventRecorder | None = None,
) -> Controller:
    """Build the Backup controller on ``host``: watches Backups and their Jobs."""
    recorder = controller_recorder(host, client, "backup-controller", recorder)
    return await (
        ControllerBuilder(host)
        .named("backup")
        .for_(API_VERSION, BACKUP, predicates=[SpecOrDeletionChanged()])
        .owns("batch/v1", "Job")
        # Cached for tools_image (no reconcile: a policy change does not redo a backup).
        .watches(API_VERSION, POLICY, EnqueueRequestsFromMapFunc(lambda _: ()))
        .with_options(options)
        .complete(BackupReconciler(client, recorder))
    )
