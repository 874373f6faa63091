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
Before creating the Job, the controller reads the Backup from the server and goes on only if
the cached copy is current: a cache that has not seen the status write naming an earlier Job
(with the read-your-writes guard off, or a write made by another replica before a failover)
would otherwise start a second Job once the first was deleted, by hand or collected after the
Backup's deletion, which the cache may not have seen either. One GET per Backup.
A Job of that name controlled by another object (the Job of a deleted Backup of the same name,
not collected yet) is never taken for this Backup's: the Backup stays as it is until that Job
is gone, then runs its own.

An instance deleted (or being deleted) while its Backup's Job has not finished fails the
Backup (reason ``InstanceDeleted``) and deletes the Job: its Pod could otherwise wait forever
for the instance's Secret, or back up a new instance of the same name. The Job carries the UID
of the instance it was made for (annotation ``postgres.crpy.io/instance-uid``): an instance
re-created under the name is another one. Nothing is undone on the cache's word alone: when
the cache shows the instance gone, going or re-created, the instance is read live and the
decision follows the server (a new leader's instance cache may lag behind its Backups
cache). Likewise a Job missing from the cache is looked up live before the Backup is failed
for it. A running Backup is looked at again every ``instance_poll`` seconds (default 10).

Deleting a Backup deletes its object from the bucket (finalizer
``postgres.crpy.io/delete-object``): a running backup Job is stopped first (foreground
deletion, so no upload can land afterwards; one that never started is deleted and the
Backup released at once), then the Job ``<backup>-delete`` runs ``aws s3
rm`` with the Backup's endpoint and credentials (see :func:`jobs.delete_object_job`). When it
succeeded the Event ``ObjectDeleted`` is recorded; when it failed (wrong credentials,
endpoint gone), or the Job cannot be created (a terminating namespace refuses it), the
Warning ``ObjectNotDeleted`` names the object to delete by hand, and the
Backup goes anyway: a finalizer never hangs on an unreachable bucket. Backups that never
created a Job, and ``Failed`` ones (the upload is the Job's last step, so a failed Job left no
object), are released at once. The deletion Job is removed before the finalizer is. The
deletion Job carries the Backup's UID (annotation ``postgres.crpy.io/backup-uid``): one left by
an earlier Backup of the same name is never taken for this one's (it is waited for until it
finished, then removed). Every delete names the UID it means (a precondition), so an object
re-created under the name in between is never deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from controller_runtime import (
    AlreadyExistsError,
    CleanupPending,
    Client,
    Condition,
    ConflictError,
    Controller,
    ControllerBuilder,
    ControllerOptions,
    EnqueueRequestsFromMapFunc,
    EventRecorder,
    ForbiddenError,
    NotFoundError,
    Request,
    Result,
    format_time,
    handle_finalization,
    ignore_not_found,
    is_controlled_by,
    reconcile_logger,
    set_controller_reference,
)
from controller_runtime.builder import ControllerHost
from controller_runtime.client import PropagationPolicy
from controllers.postgres import jobs
from controllers.postgres.api import (
    ANNOTATION_BACKUP_UID,
    ANNOTATION_INSTANCE_UID,
    API_VERSION,
    BACKUP,
    BACKUP_FINALIZER,
    INSTANCE,
    POLICY,
    ref_name,
)
from controllers.postgres.common import (
    set_conditions,
    status_copy,
    version_policy,
    write_status,
)
from controllers.postgres.connection import SpecOrDeletionChanged
from controllers.postgres.policy import image_for, parse_version
from controllers.recording import controller_recorder

Obj = dict[str, Any]
TERMINAL = frozenset({"Succeeded", "Failed"})
PREDECESSOR_RECHECK = 5.0
"""Seconds between looks while a Job of the Backup's name belongs to another object."""
CACHE_RECHECK = 1.0
"""Seconds before a Backup whose cached copy was behind the server's is looked at again."""


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
    return image_for(await version_policy(client), version)


class _JobOutcome(NamedTuple):
    """Where the Backup's Job stands: the Job (``None`` once it disappeared) and the phase,
    condition reason and message to report."""

    job: Obj | None
    phase: str
    reason: str
    message: str


class BackupReconciler:
    """Reconciles one Backup; see the module docs."""

    def __init__(self, client: Client, recorder: EventRecorder) -> None:
        self.client = client
        self.recorder = recorder
        self.instance_poll = 10.0

    async def reconcile(self, request: Request) -> Result | None:
        backup = await ignore_not_found(self.client.get(API_VERSION, BACKUP, request))
        if backup is None:
            return None
        outcome = await handle_finalization(
            self.client, backup, BACKUP_FINALIZER, self._delete_object
        )
        if outcome.deleting or outcome.obj is None:
            return outcome.result
        backup = outcome.obj
        status = status_copy(backup)
        if status.get("phase") in TERMINAL:
            return None  # one-shot: never run again
        status["observedGeneration"] = backup["metadata"].get("generation")
        status["location"] = jobs.location(backup)
        found = await self._job_outcome(backup, status)
        if not isinstance(found, _JobOutcome):
            return found  # a requeue, or None: the instance is missing (recorded)
        if found.phase not in TERMINAL and found.job is not None:
            found = await self._unless_instance_gone(backup, found)
        return await self._report(backup, status, found)

    async def _job_outcome(self, backup: Obj, status: Obj) -> _JobOutcome | Result | None:
        """The Backup's Job, created when it is time, and where it stands; or what the
        reconcile returns at once: a requeue while a Job of that name is another object's or
        the cache is behind, ``None`` when the instance does not exist (recorded in the
        status)."""
        meta = backup["metadata"]
        name = jobs.job_name(meta["name"])
        # The cache is complete (synced at start, and holding our own creates before we run
        # again): a Job we created and cannot see was deleted.
        job = await ignore_not_found(
            self.client.get("batch/v1", "Job", name=name, namespace=meta["namespace"])
        )
        if job is not None and not is_controlled_by(job, backup):
            # A predecessor's: a deleted Backup of the same name whose Job is not collected
            # yet (or not yet gone from the cache). Never take its outcome; its deletion
            # brings us back, and the requeue covers a Job that is never collected.
            reconcile_logger(__name__).info("Job %s is not this Backup's; waiting for it", name)
            return Result(requeue_after=PREDECESSOR_RECHECK)
        if job is None and status.get("jobName"):
            # A cache behind the Job's creation (a new leader's Jobs cache, say) is not a
            # disappearance: only the server's answer fails the Backup.
            job = await self._get_job(meta["namespace"], name)
            if job is None or not is_controlled_by(job, backup):
                message = f"the Job {name} disappeared before it finished"
                return _JobOutcome(None, "Failed", "Failed", message)
        if job is None:
            if await self._cached_copy_behind(backup):
                return Result(requeue_after=CACHE_RECHECK)
            instance = await self._instance(backup, status)
            if instance is None:
                return None
            job = await self._create_job(backup, instance, name)
            if job is None:
                # Ours, from an attempt whose answer was lost, or a predecessor's not in the
                # cache yet: record nothing until the cache shows whose it is.
                return Result(requeue_after=PREDECESSOR_RECHECK)
        status["jobName"] = name
        phase, message = _outcome(job, meta["namespace"])
        return _JobOutcome(job, phase, phase, message)

    async def _unless_instance_gone(self, backup: Obj, found: _JobOutcome) -> _JobOutcome:
        """``found``, or a failure (the Job deleted) if the instance is gone or going: the
        Job's Pod could otherwise wait forever for the instance's Secret."""
        assert found.job is not None
        gone = await self._instance_gone(backup, found.job)
        if not gone:
            return found
        await self._delete_quietly(found.job, "Background")
        return found._replace(phase="Failed", reason="InstanceDeleted", message=gone)

    async def _report(self, backup: Obj, status: Obj, found: _JobOutcome) -> Result | None:
        """Write the status (and at the end, the event) for ``found``; come back every
        ``instance_poll`` seconds until the Backup is finished."""
        phase, reason, message = found.phase, found.reason, found.message
        job_status = (found.job or {}).get("status") or {}
        status["phase"] = phase
        if job_status.get("startTime"):
            status["startTime"] = job_status["startTime"]
        if phase in TERMINAL:
            finished = job_status.get("completionTime") or _failure_time(job_status)
            status["completionTime"] = finished or format_time(datetime.now(UTC))
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
            backup["metadata"].get("generation"),
            Condition("Complete", phase == "Succeeded", reason, message),
            Condition("Failed", phase == "Failed", reason, message if phase == "Failed" else ""),
        )
        await write_status(self.client, backup, status)
        return None if phase in TERMINAL else Result(requeue_after=self.instance_poll)

    async def _instance(self, backup: Obj, status: Obj) -> Obj | None:
        """The Backup's instance; ``None`` after recording ``InstanceNotFound``."""
        meta = backup["metadata"]
        name = ref_name(backup, "instanceRef") or ""
        instance = await ignore_not_found(
            self.client.get(API_VERSION, INSTANCE, name=name, namespace=meta["namespace"])
        )
        if instance is None:
            status["phase"] = "Pending"
            message = f"PostgresInstance {name!r} does not exist"
            set_conditions(
                status,
                meta.get("generation"),
                Condition("Complete", False, "InstanceNotFound", message),
            )
            await write_status(self.client, backup, status)
        return instance

    async def _cached_copy_behind(self, backup: Obj) -> bool:
        """Whether the server's Backup differs from ``backup`` (what this reconcile read): a
        write the cache has not seen yet, such as the status naming a Job already created,
        or a deletion. Also true when the Backup is gone."""
        meta = backup["metadata"]
        name, namespace, seen = meta["name"], meta["namespace"], meta.get("resourceVersion")
        live = await ignore_not_found(
            self.client.live.get(API_VERSION, BACKUP, name=name, namespace=namespace)
        )
        return live is None or live["metadata"].get("resourceVersion") != seen

    async def _create_job(self, backup: Obj, instance: Obj, name: str) -> Obj | None:
        """Create the backup Job; ``None`` when it exists already (an attempt whose answer
        was lost, or a predecessor's not in the cache yet)."""
        rendered = jobs.backup_job(
            backup, instance, await tools_image(self.client, backup, instance)
        )
        set_controller_reference(backup, rendered, owner_namespaced=True, obj_namespaced=True)
        annotations = rendered["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_INSTANCE_UID] = instance["metadata"]["uid"]
        try:
            job = await self.client.create(rendered)
        except AlreadyExistsError:
            return None
        reconcile_logger(__name__).info("created Job %s", name)
        return job

    async def _instance_gone(self, backup: Obj, job: Obj) -> str:
        """Why the instance ``job`` was made for is no longer there ('' while it is): deleted,
        being deleted, or re-created under its name (another UID than the Job's annotation;
        a Job without it, made by an earlier version, accepts any). The cache decides only
        that the instance is there; anything else is confirmed live."""
        name = ref_name(backup, "instanceRef") or ""
        namespace = backup["metadata"]["namespace"]
        made_for = ((job["metadata"].get("annotations") or {}).get(ANNOTATION_INSTANCE_UID)) or None
        cached = await ignore_not_found(
            self.client.get(API_VERSION, INSTANCE, name=name, namespace=namespace)
        )
        if not instance_gone(name, cached, made_for):
            return ""
        live = await ignore_not_found(
            self.client.live.get(API_VERSION, INSTANCE, name=name, namespace=namespace)
        )
        return instance_gone(name, live, made_for)

    async def _delete_quietly(self, obj: Obj, propagation: PropagationPolicy) -> None:
        """Delete ``obj`` itself (its UID is a precondition: an object re-created under the
        name meanwhile stays); gone already is fine."""
        with contextlib.suppress(NotFoundError, ConflictError):
            await self.client.delete(
                obj,
                propagation_policy=propagation,
                preconditions={"uid": obj["metadata"]["uid"]},
            )

    async def _get_job(self, namespace: str, name: str) -> Obj | None:
        return await ignore_not_found(
            self.client.live.get("batch/v1", "Job", name=name, namespace=namespace)
        )

    async def _delete_object(self, backup: Obj) -> CleanupPending | None:
        """The finalizer's cleanup (idempotent): stop the backup Job, run the deletion Job,
        record its outcome, remove it. See the module docs."""
        meta, status = backup["metadata"], backup.get("status") or {}
        if not status.get("jobName") or status.get("phase") == "Failed":
            return None  # no object was uploaded
        backup_job = await self._get_job(meta["namespace"], jobs.job_name(meta["name"]))
        if backup_job is not None and not is_controlled_by(backup_job, backup):
            backup_job = None  # an earlier Backup's: the garbage collector's, not ours
        if backup_job is not None and jobs.job_outcome(backup_job)[0] not in TERMINAL:
            if not (backup_job.get("status") or {}).get("startTime"):
                await self._delete_quietly(backup_job, "Background")
                return None  # never started: nothing was uploaded
            await self._delete_quietly(backup_job, "Foreground")
            return CleanupPending("waiting for the backup Job to stop", requeue_after=5.0)
        return await self._run_deletion_job(backup)

    async def _run_deletion_job(self, backup: Obj) -> CleanupPending | None:
        """Create the deletion Job, wait for it, record its outcome and remove it."""
        meta = backup["metadata"]
        name = jobs.job_name(meta["name"], "delete")
        job = await self._get_job(meta["namespace"], name)
        location = jobs.location(backup)
        if job is not None and not _deletion_job_of(job, backup):
            # An earlier Backup of this name left its deletion Job: never take its outcome
            # for ours. Let it finish its own deletion, then make room for ours.
            if jobs.job_outcome(job)[0] in TERMINAL:
                await self._delete_quietly(job, "Background")
            return CleanupPending(
                f"the deletion Job {name} of an earlier Backup of this name is in the way",
                requeue_after=10.0,
            )
        if job is None:
            try:
                await self.client.create(jobs.delete_object_job(backup))
            except AlreadyExistsError:
                pass
            except ForbiddenError as err:
                # A terminating namespace refuses new Jobs: the object cannot be deleted from
                # here, and the Backup must not hold the namespace's deletion forever.
                self._not_deleted(backup, location, f"the deletion Job was refused: {err}")
                return None
            else:
                reconcile_logger(__name__).info("created Job %s to delete %s", name, location)
            return CleanupPending(f"deleting {location}", requeue_after=10.0)
        phase, message = jobs.job_outcome(job)
        if phase not in TERMINAL:
            return CleanupPending(f"deleting {location}", requeue_after=10.0)
        if phase == "Succeeded":
            self.recorder.record(
                backup, "Normal", "ObjectDeleted", f"deleted {location}", "DeleteObject"
            )
        else:
            self._not_deleted(backup, location, message)
        await self._delete_quietly(job, "Background")
        return None

    def _not_deleted(self, backup: Obj, location: str, why: str) -> None:
        self.recorder.record(
            backup,
            "Warning",
            "ObjectNotDeleted",
            f"could not delete {location} ({why}); the Backup goes, delete the object by hand",
            "DeleteObject",
        )


def _outcome(job: Obj | None, namespace: str) -> tuple[str, str]:
    """The Job's phase and message; a failure says where its cause is (the Job's own
    message is only "backoff limit reached")."""
    phase, message = jobs.job_outcome(job)
    if phase == "Failed" and job is not None:
        name = job["metadata"]["name"]
        message = (
            f"the Job {name} failed: {message}; its Pods' logs say why "
            f"(kubectl logs -n {namespace} job/{name} --all-containers)"
        )
    return phase, message


def instance_gone(name: str, instance: Obj | None, made_for: str | None) -> str:
    """Why ``instance`` (as read, ``None``: not found) is not the one a Job made for the
    instance of UID ``made_for`` (``None``: any of that name) runs against; '' when it is."""
    if instance is None:
        return f"PostgresInstance {name!r} was deleted while the backup ran"
    if made_for is not None and instance["metadata"].get("uid") != made_for:
        return f"PostgresInstance {name!r} was deleted and re-created while the backup ran"
    if instance["metadata"].get("deletionTimestamp"):
        return f"PostgresInstance {name!r} is being deleted while the backup ran"
    return ""


def _deletion_job_of(job: Mapping[str, Any], backup: Mapping[str, Any]) -> bool:
    """Whether the deletion Job ``job`` is ``backup``'s: it carries its UID (or no UID at all:
    made by an earlier version, for the Backup of its name)."""
    uid = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_BACKUP_UID)
    return uid is None or uid == backup["metadata"].get("uid")


def _deletion_job_owner(job: Mapping[str, Any]) -> list[Request]:
    """A deletion Job's events go to its Backup (it has no owner reference)."""
    meta = job.get("metadata") or {}
    backup = (meta.get("labels") or {}).get(jobs.LABEL_BACKUP)
    if backup and str(meta.get("name", "")) == jobs.job_name(backup, "delete"):
        return [Request(str(meta.get("namespace", "")), backup)]
    return []


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
    recorder = controller_recorder(host, "postgres.crpy.io/backup-controller", recorder)
    return await (
        ControllerBuilder(host)
        .named("backup")
        .for_(API_VERSION, BACKUP, predicates=[SpecOrDeletionChanged()])
        .owns("batch/v1", "Job")
        .watches("batch/v1", "Job", EnqueueRequestsFromMapFunc(_deletion_job_owner))
        # Read by tools_image; a policy change does not redo a backup.
        .caches(API_VERSION, POLICY)
        # Read when creating the Job and while it runs (is it still the same instance?).
        .caches(API_VERSION, INSTANCE)
        .with_options(options)
        .complete(BackupReconciler(client, recorder))
    )
