"""The PostgresInstance controller.

An instance either runs in the cluster (rendered by :mod:`controllers.postgres.render`) or
points at an existing server (``spec.external``). Either way its version must be one the
:mod:`version policy <controllers.postgres.policy>` enables. Status: ``endpoint`` (host,
port), ``version`` (the version that runs), ``readyReplicas``, ``observedGeneration`` and the
conditions ``Ready``, ``Progressing``, ``Degraded`` and ``VersionAccepted``; written only when
it changes.

- In-cluster: Ready once the StatefulSet has rolled out and reports every replica ready.
  Which Pod is primary, failover, switchover and the Pods' rolling updates are the failover
  controller's (:mod:`controllers.postgres.ha`, set up with this one); this controller keeps
  a primary that a scale-down would remove until it has been switched over
  (:func:`statefulset_replicas`).
  While it is not, the instance's Pods are read live every ``pod_poll`` seconds (default 15);
  a Pod whose image cannot be pulled makes ``Ready=False`` and ``Degraded=True`` with reason
  ``ImagePullFailed`` (the Pod, the image and the kubelet's message) and a Warning Event of
  that reason, once per new message.
- External: Ready when the operator can log in as the administrator; rechecked every
  ``recheck_after`` seconds (default 300).

``spec.restore.backupName`` (in-cluster, set at creation): once the server is up, a Job
restores that ``pg_dump`` Backup into it (``status.restore``); the instance is Ready only
after it succeeded.

A refused version is a Warning Event too (the condition's reason), and the instance keeps what
runs.

Deletion (finalizer ``postgres.crpy.io/instance``, through
:func:`~controller_runtime.handle_finalization`) stays pending while a PostgresUser refers to
the instance (their finalizers drop their roles while the server is still there; their
deletion events bring the instance back), then, with ``spec.deletionPolicy: Delete``, deletes
the instance's PersistentVolumeClaims; ``Retain`` (default) keeps them. Rendered objects go with
the instance by garbage collection.

While the instance is Ready, each reconcile sweeps its orphan roles
(:mod:`controllers.postgres.sweep`): at start-up, after every PostgresUser deletion, and at
least every ``recheck_after`` (external) or ``sweep_every`` (in-cluster, default 600) seconds.

The in-cluster path is observe (the StatefulSet) → decide (pure functions below:
:func:`rollout_progress`, :func:`kept_claim_templates`, :func:`rendered_children`,
:func:`degraded_condition`) → apply (objects, then status); see docs/design.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

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
    NotFoundError,
    Request,
    Result,
    StoreDelta,
    handle_finalization,
    ignore_not_found,
    reconcile_logger,
    request_for,
    set_controller_reference,
)
from controller_runtime.builder import ControllerHost
from controller_runtime.cache import DELETED
from controllers.postgres import jobs, render, sql
from controllers.postgres.agent_image import agent_image
from controllers.postgres.api import (
    ANNOTATION_VERSION,
    API_VERSION,
    BACKUP,
    INSTANCE,
    INSTANCE_FINALIZER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    POLICY,
    USER,
    ref_name,
)
from controllers.postgres.common import (
    encode_data,
    instance_referrers,
    set_conditions,
    status_copy,
    version_policy,
)
from controllers.postgres.connection import (
    ConfigurationError,
    SpecOrDeletionChanged,
    admin_conninfo,
    read_secret,
)
from controllers.postgres.ha import setup_ha_controller
from controllers.postgres.pods import image_problem
from controllers.postgres.policy import (
    Verdict,
    Version,
    evaluate,
    parse_version,
    server_version,
)
from controllers.postgres.scram import generate_password
from controllers.postgres.shared_status import owned_by_instance, write_shared_status
from controllers.postgres.sweep import sweep_orphan_roles
from controllers.recording import controller_recorder

log = logging.getLogger(__name__)

IMAGE_PULL_FAILED = "ImagePullFailed"
"""The reason of ``Ready=False`` and ``Degraded=True`` while a Pod's image cannot be pulled."""

Obj = dict[str, Any]
FIELD_MANAGER = "postgres-instance"


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """How far the StatefulSet's rollout is, as its controller reports it."""

    ready: bool
    """Rolled out, and every replica ready."""
    rolled: bool
    """The controller saw the latest spec and every replica runs the latest revision."""
    ready_replicas: int
    message: str
    ready_reason: str

    def image_failed(self, message: str) -> RolloutProgress:
        """The same rollout, not Ready because a Pod's image cannot be pulled."""
        return replace(self, ready=False, ready_reason=IMAGE_PULL_FAILED, message=message)

    def restoring(self, message: str) -> RolloutProgress:
        """The same rollout, not Ready because ``spec.restore`` has not finished."""
        return replace(self, ready=False, ready_reason="Restoring", message=message)

    def conditions(self) -> tuple[Condition, Condition]:
        """``Ready`` and ``Progressing``."""
        if not self.rolled:
            progressing = "RollingOut"
        else:
            progressing = "WaitingForReplicas" if not self.ready else "RolledOut"
        return (
            Condition("Ready", self.ready, self.ready_reason, self.message),
            Condition("Progressing", not (self.ready and self.rolled), progressing, self.message),
        )


def rollout_progress(sts: Obj, replicas: int) -> RolloutProgress:
    """The rollout of ``sts`` towards ``replicas`` ready pods. Rolled out means: the
    controller saw the latest spec, every pod runs the latest revision, and no pod beyond
    ``replicas`` is left (a scale-down is done only when the surplus pods are gone). With the
    ``OnDelete`` strategy the StatefulSet never moves ``currentRevision``: the updated Pods'
    count says it."""
    status = sts.get("status") or {}
    observed = int(status.get("observedGeneration", 0)) >= int(sts["metadata"].get("generation", 1))
    pods = int(status.get("replicas", 0))
    ready = int(status.get("readyReplicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    on_delete = ((sts.get("spec") or {}).get("updateStrategy") or {}).get("type") == "OnDelete"
    revisions_match = on_delete or status.get("currentRevision") == status.get("updateRevision")
    rolled = observed and updated >= replicas and revisions_match and pods == replicas
    all_ready = rolled and ready >= replicas
    surplus = f", {pods - replicas} more to remove" if pods > replicas else ""
    return RolloutProgress(
        ready=all_ready,
        rolled=rolled,
        ready_replicas=ready,
        message=f"{ready}/{replicas} replicas ready, {updated} updated{surplus}",
        ready_reason="AllReplicasReady" if all_ready else "NotReady",
    )


def degraded_condition(problems: list[Condition]) -> Condition:
    """``Degraded``: the first problem's reason, every problem's message; ``AsExpected``
    when there is none."""
    if not problems:
        return Condition("Degraded", False, "AsExpected", "")
    return Condition("Degraded", True, problems[0].reason, "; ".join(p.message for p in problems))


def external_verdict(instance: Obj, policy: Obj | None, actual: Version) -> Verdict:
    """Whether the external server's version ``actual`` is acceptable: it must match
    ``spec.version``'s major when set, and be enabled by the policy."""
    status, spec = instance.get("status") or {}, instance.get("spec") or {}
    previous = status.get("version")
    running = Version(parse_version(previous.split(".")[0]).major) if previous else None
    wanted = spec.get("version")
    if wanted and _major(wanted) != actual.major:
        return Verdict(
            False, None, "VersionMismatch", f"spec.version is {wanted} but the server runs {actual}"
        )
    return evaluate(policy, str(actual.major), running)


def kept_claim_templates(
    instance: Obj, sts: Obj | None
) -> tuple[list[Obj] | None, Condition | None]:
    """The StatefulSet's volume claim templates, which cannot change once it exists (``None``
    before), and a ``Degraded`` problem when the spec asks for other storage."""
    if sts is None:
        return None, None
    claims = sts["spec"].get("volumeClaimTemplates")
    if claims and _claims_differ(claims, render.volume_claim_templates(instance)):
        return claims, Condition(
            "Degraded",
            True,
            "StorageChangeNotApplied",
            "storage size and class are fixed once the StatefulSet exists; "
            "expand its PersistentVolumeClaims instead",
        )
    return claims, None


def statefulset_replicas(instance: Obj) -> int:
    """``spec.replicas``, or more while the current primary is a Pod a scale-down would
    remove: the failover controller switches over first (the primary is then no member), and
    only then does the StatefulSet shrink."""
    replicas = int((instance.get("spec") or {}).get("replicas", 1))
    primary = str((instance.get("status") or {}).get("currentPrimary") or "")
    prefix = render.Names(instance["metadata"]["name"]).statefulset + "-"
    ordinal = primary[len(prefix) :] if primary.startswith(prefix) else ""
    if ordinal.isdigit() and int(ordinal) >= replicas:
        return int(ordinal) + 1
    return replicas


def rendered_children(
    instance: Obj, verdict: Verdict, claims: list[Obj] | None, agent_image: str
) -> list[Obj]:
    """The objects an in-cluster instance runs on, the StatefulSet last;
    :class:`render.RenderError` for a spec that cannot be rendered."""
    assert verdict.version is not None and verdict.image is not None
    return [
        render.configmap(instance),
        render.headless_service(instance),
        render.primary_service(instance),
        render.replicas_service(instance),
        render.service_account(instance),
        render.agent_role(instance),
        render.agent_role_binding(instance),
        render.statefulset(
            instance,
            version=str(verdict.version),
            image=verdict.image,
            agent_image=agent_image,
            claim_templates=claims,
            replicas=statefulset_replicas(instance),
        ),
    ]


def _claims_differ(existing: list[Obj], desired: list[Obj]) -> bool:
    def key(templates: list[Obj]) -> list[tuple[Any, Any]]:
        return [
            (
                (t.get("spec") or {}).get("resources", {}).get("requests", {}).get("storage"),
                (t.get("spec") or {}).get("storageClassName"),
            )
            for t in templates
        ]

    return key(existing) != key(desired)


class InstanceReconciler:
    """Reconciles one PostgresInstance; see the module docs."""

    def __init__(
        self,
        client: Client,
        recorder: EventRecorder,
        *,
        recheck_after: float = 300.0,
        sweep_every: float = 600.0,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.recheck_after = recheck_after
        self.sweep_every = sweep_every
        """A Ready in-cluster instance is reconciled (and its orphan roles swept) again after
        this many seconds; an external one every ``recheck_after``."""
        self.backup_poll = 30.0
        self.pod_poll = 15.0
        """While not Ready, the Pods are read again after this many seconds (they are not
        watched: a Pod stuck pulling its image does not change the StatefulSet)."""

    async def reconcile(self, request: Request) -> Result | None:
        instance = await ignore_not_found(self.client.get(API_VERSION, INSTANCE, request))
        if instance is None:
            return None
        outcome = await handle_finalization(
            self.client, instance, INSTANCE_FINALIZER, self._cleanup
        )
        if outcome.deleting or outcome.obj is None:
            return outcome.result
        instance = outcome.obj
        policy = await version_policy(self.client)
        if (instance.get("spec") or {}).get("external"):
            return await self._external(instance, policy)
        return await self._in_cluster(instance, policy)

    # -- deletion -------------------------------------------------------------------------

    async def _cleanup(self, instance: Obj) -> CleanupPending | None:
        """Pending while PostgresUsers refer to the instance: their finalizers need the
        server (and its admin Secret) to drop their roles, and their deletion events bring
        the instance back. Then, with ``deletionPolicy: Delete``, delete the volumes."""
        meta = instance["metadata"]
        users = sorted(
            u["metadata"]["name"]
            for u in await instance_referrers(self.client, API_VERSION, USER, instance)
        )
        if users:
            message = f"waiting for {len(users)} PostgresUser(s) to drop their roles: " + (
                ", ".join(users[:10])
            )
            status = status_copy(instance)
            set_conditions(
                status, meta.get("generation"), Condition("Ready", False, "Terminating", message)
            )
            await write_shared_status(self.client, instance, status, mine=owned_by_instance)
            return CleanupPending(message)
        spec = instance.get("spec") or {}
        if not spec.get("external") and spec.get("deletionPolicy") == "Delete":
            claims = await self.client.live.list(
                "v1",
                "PersistentVolumeClaim",
                namespace=meta["namespace"],
                label_selector=f"{LABEL_INSTANCE}={meta['name']},{LABEL_COMPONENT}=data",
            )
            for claim in claims:
                # The claim listed, not one re-created under its name since (by the
                # StatefulSet controller, or for a new instance of this name).
                with contextlib.suppress(NotFoundError, ConflictError):
                    await self.client.delete(claim, preconditions={"uid": claim["metadata"]["uid"]})
            if claims:
                self.recorder.record(
                    instance,
                    "Normal",
                    "VolumesDeleted",
                    f"deleted {len(claims)} PersistentVolumeClaim(s) (deletionPolicy: Delete)",
                    "Delete",
                )
        return None

    # -- external servers -----------------------------------------------------------------

    async def _external(self, instance: Obj, policy: Obj | None) -> Result | None:
        generation = instance["metadata"].get("generation")
        status = status_copy(instance)
        status["endpoint"] = render.endpoint(instance)
        status["observedGeneration"] = generation
        try:
            info = await admin_conninfo(self.client, instance)
            actual = server_version(await sql.server_version_num(info))
        except (ConfigurationError, sql.DatabaseError) as err:
            reason = "AdminSecretInvalid" if isinstance(err, ConfigurationError) else "Unreachable"
            set_conditions(
                status,
                generation,
                Condition("Ready", False, reason, str(err)),
                Condition("Progressing", False, reason, "retrying with backoff"),
                Condition("Degraded", True, reason, str(err)),
            )
            await write_shared_status(self.client, instance, status, mine=owned_by_instance)
            raise
        verdict = external_verdict(instance, policy, actual)
        if verdict.accepted:
            status["version"] = str(actual)
            ready = Condition(
                "Ready", True, "Connected", f"the server answers (PostgreSQL {actual})"
            )
        else:
            ready = Condition("Ready", False, verdict.reason, verdict.message)
            self._refused(instance, verdict)
        set_conditions(
            status,
            generation,
            Condition("VersionAccepted", verdict.accepted, verdict.reason, verdict.message),
            ready,
            Condition("Progressing", False, "Idle", ""),
            Condition("Degraded", not verdict.accepted, verdict.reason, verdict.message),
        )
        await write_shared_status(self.client, instance, status, mine=owned_by_instance)
        if verdict.accepted:
            await self._sweep(instance, info)
        return Result(requeue_after=self.recheck_after)

    # -- in-cluster servers ---------------------------------------------------------------
    #
    # observe (the StatefulSet that runs) → decide (the version, the objects to render, the
    # conditions) → apply (the objects, then the status). Each step is a method below.

    async def _in_cluster(self, instance: Obj, policy: Obj | None) -> Result | None:
        spec = instance.get("spec") or {}
        generation = instance["metadata"].get("generation")
        status = status_copy(instance)
        status["endpoint"] = render.endpoint(instance)
        status["observedGeneration"] = generation
        sts = await self._observe_statefulset(instance)
        running = _rendered_version(sts)
        verdict = evaluate(
            policy,
            str(spec.get("version", "")),
            running,
            allow_major_upgrade=bool(spec.get("allowMajorVersionUpgrade")),
        )
        accepted = Condition("VersionAccepted", verdict.accepted, verdict.reason, verdict.message)
        problems: list[Condition] = []
        if not verdict.accepted:
            problems.append(Condition("Degraded", True, verdict.reason, verdict.message))
            self._refused(instance, verdict)
        if verdict.version is None or verdict.image is None:
            await self._render_nothing(instance, status, accepted, verdict)
            return None
        claims, storage_problem = kept_claim_templates(instance, sts)
        if storage_problem is not None:
            problems.append(storage_problem)
        try:
            children = rendered_children(instance, verdict, claims, await agent_image(self.client))
        except render.RenderError as err:
            reason, message = "InvalidSpec", str(err)
            degraded = Condition("Degraded", True, reason, message)
            progressing = Condition("Progressing", False, reason, "fix the spec")
            set_conditions(status, generation, accepted, degraded, progressing)
            await write_shared_status(self.client, instance, status, mine=owned_by_instance)
            return None
        applied = await self._apply_children(instance, children)
        if running is not None and running != verdict.version:
            message = f"rolling from PostgreSQL {running} to {verdict.version}"
            self.recorder.record(instance, "Normal", "Upgrading", message, "Upgrade")
        return await self._report_rollout(instance, status, accepted, verdict, applied, problems)

    async def _render_nothing(
        self, instance: Obj, status: Obj, accepted: Condition, verdict: Verdict
    ) -> None:
        """No version can run (none accepted, none running): render nothing, say why."""
        set_conditions(
            status,
            instance["metadata"].get("generation"),
            accepted,
            Condition("Ready", False, verdict.reason, verdict.message),
            Condition("Progressing", False, verdict.reason, "nothing is rendered"),
            Condition("Degraded", True, verdict.reason, verdict.message),
        )
        await write_shared_status(self.client, instance, status, mine=owned_by_instance)

    async def _report_rollout(  # noqa: PLR0917 (the steps' results, passed on)
        self,
        instance: Obj,
        status: Obj,
        accepted: Condition,
        verdict: Verdict,
        applied: Obj,
        problems: list[Condition],
    ) -> Result | None:
        """The rollout's progress (Pods that cannot pull their image, the restore of
        ``spec.restore``) into the status; come back while there is something to wait for."""
        spec = instance.get("spec") or {}
        progress = rollout_progress(applied, int(spec.get("replicas", 1)))
        status["readyReplicas"] = progress.ready_replicas
        if progress.ready:
            status["version"] = str(verdict.version)
        wait_for_pods = not progress.ready
        if wait_for_pods:
            progress = await self._check_images(instance, progress, problems)
        wait_for_backup = False
        if spec.get("restore") and progress.ready:
            progress, wait_for_backup = await self._restore_progress(
                instance, status, verdict, progress, problems
            )
        set_conditions(
            status,
            instance["metadata"].get("generation"),
            accepted,
            *progress.conditions(),
            degraded_condition(problems),
        )
        await write_shared_status(self.client, instance, status, mine=owned_by_instance)
        if wait_for_backup:
            return Result(requeue_after=self.backup_poll)
        if wait_for_pods:
            return Result(requeue_after=self.pod_poll)
        if progress.ready:
            await self._sweep(instance)
            return Result(requeue_after=self.sweep_every)
        return None

    async def _sweep(self, instance: Obj, info: sql.ConnInfo | None = None) -> None:
        """Drop the roles of the (Ready) instance that no PostgresUser claims
        (:mod:`controllers.postgres.sweep`). A server that does not answer is logged, not
        raised: the status is written, and the next reconcile sweeps again."""
        try:
            info = info or await admin_conninfo(self.client, instance)
            await sweep_orphan_roles(self.client, self.recorder, instance, info)
        except (ConfigurationError, sql.DatabaseError) as err:
            reconcile_logger(__name__).info("orphan-role sweep skipped: %s", err)

    async def _restore_progress(
        self,
        instance: Obj,
        status: Obj,
        verdict: Verdict,
        progress: RolloutProgress,
        problems: list[Condition],
    ) -> tuple[RolloutProgress, bool]:
        """The rollout as the restore leaves it, and whether to look again for the Backup
        (whose changes are not watched) while waiting for it."""
        restored, message = await self._restore(instance, status, verdict)
        if restored:
            return progress, False
        if status["restore"].get("phase") == "Failed":
            problems.append(Condition("Degraded", True, "RestoreFailed", message))
            return progress.restoring(message), False
        return progress.restoring(message), not status["restore"].get("jobName")

    async def _check_images(
        self, instance: Obj, progress: RolloutProgress, problems: list[Condition]
    ) -> RolloutProgress:
        """While not Ready: a Pod that cannot pull its image (:func:`image_problem`, Pods
        read live) makes the rollout ``ImagePullFailed``, adds a ``Degraded`` problem and
        records a Warning Event when the message is new."""
        meta = instance["metadata"]
        pods = await self.client.live.list(
            "v1",
            "Pod",
            namespace=meta["namespace"],
            label_selector=f"{LABEL_INSTANCE}={meta['name']},{LABEL_COMPONENT}=database",
        )
        pulling = image_problem(pods)
        if pulling is None:
            return progress
        problems.append(Condition("Degraded", True, IMAGE_PULL_FAILED, pulling))
        if _condition_message(instance, "Ready") != pulling:
            self.recorder.record(instance, "Warning", IMAGE_PULL_FAILED, pulling, "Pull")
        return progress.image_failed(pulling)

    async def _observe_statefulset(self, instance: Obj) -> Obj | None:
        meta = instance["metadata"]
        name = render.Names(meta["name"]).statefulset
        return await ignore_not_found(
            self.client.get("apps/v1", "StatefulSet", name=name, namespace=meta["namespace"])
        )

    async def _apply_children(self, instance: Obj, children: list[Obj]) -> Obj:
        """Apply the rendered objects (the StatefulSet last) and the superuser Secret and
        PodDisruptionBudget; return the StatefulSet as applied."""
        await self._ensure_superuser_secret(instance)
        applied: Obj = {}
        for child in children:
            set_controller_reference(instance, child, owner_namespaced=True, obj_namespaced=True)
            applied = await self.client.apply(child, field_manager=FIELD_MANAGER, force=True)
        await self._pdb(instance)
        return applied

    async def _restore(self, instance: Obj, status: Obj, verdict: Verdict) -> tuple[bool, str]:
        """Run the restore Job of ``spec.restore`` once the server is up; (done, message).
        The Job is created once (``status.restore.jobName``) and its outcome recorded in
        ``status.restore.phase``; only ``pg_dump`` backups can be restored this way."""
        meta = instance["metadata"]
        restore = status.setdefault("restore", {})
        if restore.get("phase") == "Succeeded":
            return True, "restored"
        backup_name = str(instance["spec"]["restore"]["backupName"])
        backup = await ignore_not_found(
            self.client.live.get(API_VERSION, BACKUP, name=backup_name, namespace=meta["namespace"])
        )
        if backup is None:
            restore["phase"] = "Pending"
            return False, f"waiting for Backup {backup_name!r} to exist"
        if (backup.get("spec") or {}).get("method") == "pg_basebackup":
            restore["phase"] = "Failed"
            return False, "restoring a pg_basebackup backup is not supported; use pg_dump"
        if (backup.get("status") or {}).get("phase") != "Succeeded":
            restore["phase"] = "Pending"
            return False, f"waiting for Backup {backup_name!r} to succeed"
        name = jobs.job_name(meta["name"], "restore")
        job = await ignore_not_found(
            self.client.get("batch/v1", "Job", name=name, namespace=meta["namespace"])
        )
        if job is None:
            assert verdict.image is not None
            rendered = jobs.restore_job(instance, backup, verdict.image)
            set_controller_reference(instance, rendered, owner_namespaced=True, obj_namespaced=True)
            try:
                job = await self.client.create(rendered)
            except AlreadyExistsError:
                job = None  # ours, from an attempt whose answer was lost: its events follow
        restore["jobName"] = name
        phase, message = jobs.job_outcome(job)
        restore["phase"] = phase
        if phase in ("Succeeded", "Failed"):
            self.recorder.record(
                instance,
                "Normal" if phase == "Succeeded" else "Warning",
                f"Restore{phase}",
                f"restore from Backup {backup_name}: {message}",
                "Restore",
            )
        return phase == "Succeeded", f"restore from Backup {backup_name}: {message}"

    async def _ensure_superuser_secret(self, instance: Obj) -> None:
        meta = instance["metadata"]
        name = render.Names(meta["name"]).superuser
        if await read_secret(self.client, name, meta["namespace"]) is not None:
            return  # created once, never rewritten: the data directory holds this password
        secret = render.superuser_secret(
            instance,
            encode_data(
                {
                    "username": render.SUPERUSER,
                    "password": generate_password(),
                    "replication-password": generate_password(),
                }
            ),
        )
        set_controller_reference(instance, secret, owner_namespaced=True, obj_namespaced=True)
        try:
            await self.client.create(secret)
        except AlreadyExistsError:
            return
        self.recorder.record(
            instance, "Normal", "SecretCreated", f"created Secret {name}", "Create"
        )

    async def _pdb(self, instance: Obj) -> None:
        pdb = render.pod_disruption_budget(instance)
        meta = instance["metadata"]
        if pdb is not None:
            set_controller_reference(instance, pdb, owner_namespaced=True, obj_namespaced=True)
            await self.client.apply(pdb, field_manager=FIELD_MANAGER, force=True)
            return
        name = render.Names(meta["name"]).pdb
        existing = await ignore_not_found(
            self.client.get(
                "policy/v1", "PodDisruptionBudget", name=name, namespace=meta["namespace"]
            )
        )
        if existing is None:
            return
        with contextlib.suppress(NotFoundError):
            await self.client.delete(existing, preconditions={"uid": existing["metadata"]["uid"]})

    def _refused(self, instance: Obj, verdict: Verdict) -> None:
        log = reconcile_logger(__name__)
        log.info("version refused: %s", verdict.message)
        self.recorder.record(instance, "Warning", verdict.reason, verdict.message, "ChooseVersion")


def _condition_message(instance: Obj, kind: str) -> str | None:
    for condition in (instance.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return str(condition.get("message", ""))
    return None


def _major(text: str) -> int | None:
    try:
        return parse_version(text).major
    except ValueError:
        return None


def _rendered_version(sts: Obj | None) -> Version | None:
    if sts is None:
        return None
    text = (sts["metadata"].get("annotations") or {}).get(ANNOTATION_VERSION)
    try:
        return parse_version(text) if text else None
    except ValueError:
        return None


async def setup_instance_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    recorder: EventRecorder | None = None,
    recheck_after: float = 300.0,
    sweep_every: float = 600.0,
) -> Controller:
    """Build the PostgresInstance controller on ``host`` (a manager, or anything with
    ``add``: it also gets the recorder's closer), and the instances' failover controller
    (:func:`controllers.postgres.ha.setup_ha_controller`) beside it. Watches instances (spec
    changes and deletions), the objects it renders, the version policy (any change reconciles
    every instance) and PostgresUser deletions (to finish an instance's deletion)."""
    await setup_ha_controller(host, client, options=options, recorder=recorder)
    recorder = controller_recorder(host, "postgres.crpy.io/instance-controller", recorder)
    reconciler = InstanceReconciler(
        client, recorder, recheck_after=recheck_after, sweep_every=sweep_every
    )
    cache = client.cache

    def every_instance(_: Mapping[str, Any]) -> list[Request]:
        # Metadata is all it needs: also the instances a memory budget holds no body of.
        bodies, evicted = cache.list_held(API_VERSION, INSTANCE)
        return [request_for(i) for i in bodies] + evicted

    def user_instance(user: Mapping[str, Any]) -> list[Request]:
        name = ref_name(user, "instanceRef")
        return [Request(user["metadata"]["namespace"], name)] if name else []

    def deleted(delta: StoreDelta) -> bool:
        return delta.type == DELETED

    return await (
        ControllerBuilder(host)
        .named("postgresinstance")
        .for_(API_VERSION, INSTANCE, predicates=[SpecOrDeletionChanged()])
        .owns("apps/v1", "StatefulSet")
        .owns("v1", "Service")
        .owns("v1", "ConfigMap")
        .owns("policy/v1", "PodDisruptionBudget")
        .owns("batch/v1", "Job")
        .watches(API_VERSION, POLICY, EnqueueRequestsFromMapFunc(every_instance))
        .watches(API_VERSION, USER, EnqueueRequestsFromMapFunc(user_instance), predicates=[deleted])
        .with_options(options)
        .complete(reconciler)
    )
