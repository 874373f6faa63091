"""The high-availability controller of in-cluster PostgresInstances: the driver of the failover
machine (:mod:`controllers.postgres.failover`). It runs on the leader only, like every
controller of the manager.

Each round (every second for a replicated instance, four times a second while a failover or
switchover runs or the primary is unhealthy, every 10 s for a lone instance, and at once when
one of its Pods or their Nodes changes):

1. **observe**: each Pod's agent answers ``GET /status`` (on the Pod's address, the port named
   ``agent``; 1 s, then once more 2 s, before it counts as silent) with what its PostgreSQL
   says (role, readiness, timeline, received and replayed LSN, the member it streams from,
   ``pg_stat_replication``); the cached Pod
   gives its deletion and creation times, its Node whether the node is lost (Ready not True);
2. **decide**: :func:`~controllers.postgres.failover.decide` on the state kept in the
   instance's status (:func:`~controllers.postgres.failover.state_from_instance_status`), with
   the spec's settings and the switchover wanted (the annotation
   ``postgres.crpy.io/switchover-to``, or a rolling update's, :func:`roll_step`);
3. **apply**, in this order: the role labels (``postgres.crpy.io/role=primary`` on the current
   primary while the phase is Healthy, ``replica`` on the standbys streaming from it, none
   elsewhere: a fenced primary leaves the ``<name>-primary`` Service at once); the status
   (``currentPrimary``/``targetPrimary`` with their timestamps, ``failovers``,
   ``switchovers``, ``lastTransitionSeconds``, ``ha``, and the condition
   ``PrimaryAvailable``), written only when it changed; the Events of the decision; a
   ``POST /refresh`` to every agent when the standing changed, so they act at once instead
   of at their next read; the rolling update's next deletion; the metrics
   (:mod:`controllers.postgres.ha_metrics`).

``fenced_at``: a fence counts from when its status write returned, not from the decision
(the members' bound runs from their reads; a read that started before the write completed
may still have seen no fence).

Rolling updates (the StatefulSet's ``OnDelete`` strategy: only this controller deletes Pods for
an update): once every member streams from a healthy primary, the outdated standbys are
deleted one at a time (highest ordinal first, each waiting for the last to stream again);
then a switchover to an updated standby; then the old primary, now a standby. Pods from
before the agent existed (an upgrade of the operator) cannot report: while the machine
bootstraps they are deleted one at a time, highest ordinal first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from controller_runtime import (
    Client,
    Condition,
    Controller,
    ControllerBuilder,
    ControllerOptions,
    EnqueueRequestsFromMapFunc,
    EventRecorder,
    NotFoundError,
    Request,
    Result,
    StoreDelta,
    ignore_not_found,
    reconcile_logger,
)
from controller_runtime.builder import ControllerHost
from controller_runtime.cache import ByObject
from controllers.postgres import cron, render
from controllers.postgres.api import (
    ANNOTATION_SWITCHOVER,
    API_VERSION,
    BACKUP,
    BACKUP_PLAN,
    INSTANCE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_ROLE,
    MANAGED_BY,
    ROLE_PRIMARY,
    ROLE_REPLICA,
    ref_name,
)
from controllers.postgres.common import set_conditions, status_copy, write_status
from controllers.postgres.failover import (
    Decision,
    HAConfig,
    HAState,
    MemberObservation,
    Observation,
    Phase,
    Role,
    SyncPolicy,
    decide,
    healthy_primary,
    instance_status_fields,
    members_named,
    state_from_instance_status,
)
from controllers.postgres.ha_metrics import POSTGRES_METRICS, InstanceSample
from controllers.postgres.shared_status import owned_by_failover, write_shared_status
from controllers.postgres.standing import Report, report_of
from controllers.recording import controller_recorder

log = logging.getLogger(__name__)

Obj = dict[str, Any]

HEALTHY_INTERVAL = 1.0
TRANSITION_INTERVAL = 0.25
LONE_INTERVAL = 10.0
OBSERVE_TIMEOUT = 1.0
OBSERVE_TIMEOUTS = (OBSERVE_TIMEOUT, 2 * OBSERVE_TIMEOUT)
"""An agent's answer is awaited this long, then once more this long, before it counts as
silent."""
AGENT_PORT_NAME = "agent"
DEFAULT_AGENT_PORT = 8008
POD_SELECTOR = f"{LABEL_NAME}=postgres,{LABEL_MANAGED_BY}={MANAGED_BY}"
"""The instance Pods the operator caches (and nothing else of the cluster's Pods)."""
CONDITION = "PrimaryAvailable"
FENCE_RESTAMP_AFTER = 0.5
"""Seconds a fence's status write may take before its time is set to the write's end."""


# -- observe: pure helpers -------------------------------------------------------------------


def timestamp(text: object) -> float | None:
    """An RFC 3339 time as seconds since the epoch (``None`` for anything else)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_ready(node: Mapping[str, Any] | None) -> bool | None:
    """``False`` when the Node's Ready condition is False or Unknown (the node is lost);
    ``None`` when it is not known."""
    if node is None:
        return None
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return None


def member_observation(
    name: str, pod: Mapping[str, Any] | None, report: Report | None, ready_node: bool | None
) -> MemberObservation:
    """One member as the machine takes it: its Pod's facts, and its agent's report (``None``:
    the agent did not answer)."""
    if pod is None:
        return MemberObservation(name, pod_exists=False)
    meta = pod.get("metadata") or {}
    common: dict[str, Any] = {
        "pod_deleting": bool(meta.get("deletionTimestamp")),
        "node_lost": ready_node is False,
        "pod_created": timestamp(meta.get("creationTimestamp")),
    }
    if report is None or report.name != name:
        return MemberObservation(name, reachable=False, **common)
    return MemberObservation(
        name,
        reachable=True,
        role=report.role,
        timeline=report.timeline,
        received_lsn=report.received_lsn,
        replay_lsn=report.replay_lsn,
        streaming_from=report.streaming_from,
        ready=report.ready,
        position_known=report.position_known,
        lease_bounded=report.lease_bounded,
        **common,
    )


def ha_config(instance: Mapping[str, Any], switchover_to: str | None) -> HAConfig:
    """The machine's settings from the instance's spec."""
    spec = instance.get("spec") or {}
    replication = spec.get("replication") or {}
    replicas = int(spec.get("replicas", 1))
    try:
        policy = SyncPolicy(str(replication.get("syncPolicy") or SyncPolicy.ZERO_LOSS))
    except ValueError:
        policy = SyncPolicy.ZERO_LOSS
    return HAConfig(
        members=members_named(render.Names(instance["metadata"]["name"]).statefulset, replicas),
        synchronous=bool(replication.get("synchronous")) and replicas > 1,
        sync_policy=policy,
        failover_delay=float(replication.get("failoverDelay") or 0),
        switchover_to=switchover_to,
    )


def ordinal(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


# -- decide: what to apply -------------------------------------------------------------------


def desired_roles(state: HAState, obs: Observation) -> dict[str, str | None]:
    """The role label each existing Pod should carry (``None``: none)."""
    roles: dict[str, str | None] = {}
    healthy = state.phase == Phase.HEALTHY
    for name, m in obs.members.items():
        if not m.pod_exists:
            continue
        if healthy and name == state.current_primary:
            roles[name] = ROLE_PRIMARY
        elif (
            healthy
            and m.reachable
            and m.role == Role.STANDBY
            and m.streaming_from == state.current_primary
            and not m.pod_deleting
        ):
            roles[name] = ROLE_REPLICA
        else:
            roles[name] = None
    return roles


def primary_condition(decision: Decision, obs: Observation) -> Condition:
    """``PrimaryAvailable``: true while a healthy primary serves; the reason names the step a
    failover or switchover is at, the message what it waits for."""
    state = decision.state
    kind = "Switchover" if state.switchover else "Failover"
    if state.phase == Phase.HEALTHY:
        primary = obs.get(state.current_primary)
        if healthy_primary(primary):
            message = f"{primary.name} is the primary (timeline {primary.timeline})"
            return Condition(CONDITION, True, "PrimaryServing", message)
        return Condition(CONDITION, False, "PrimaryUnhealthy", decision.waiting or "")
    if state.phase == Phase.BOOTSTRAP:
        return Condition(CONDITION, False, "Bootstrapping", decision.waiting or "")
    if state.phase == Phase.FENCING:
        return Condition(CONDITION, False, f"{kind}Fencing", decision.waiting or "fencing")
    return Condition(CONDITION, False, f"{kind}Promoting", decision.waiting or "promoting")


def requeue_after(state: HAState, members: int, obs: Observation) -> float:
    """When to observe again (module docs)."""
    if members < 2:
        return LONE_INTERVAL
    if state.phase != Phase.HEALTHY or not healthy_primary(obs.get(state.current_primary)):
        return TRANSITION_INTERVAL
    return HEALTHY_INTERVAL


@dataclass(frozen=True)
class RollStep:
    """The rolling update's next move: a Pod to delete, or a switchover to ask for."""

    delete: str | None = None
    switchover_to: str | None = None
    waiting: str = ""


def roll_step(  # noqa: PLR0911 (one return per step of the update)
    state: HAState,
    obs: Observation,
    members: Sequence[str],
    revisions: Mapping[str, str | None],
    update_revision: str | None,
) -> RollStep:
    """The rolling update's next step (module docs). ``revisions`` maps each existing Pod to
    its ``controller-revision-hash``."""
    if not update_revision:
        return RollStep()
    outdated = [n for n in members if n in revisions and revisions[n] != update_revision]
    if not outdated:
        return RollStep()
    by_ordinal = sorted(outdated, key=ordinal, reverse=True)
    absent = [n for n in members if not obs.get(n).pod_exists or obs.get(n).pod_deleting]
    if absent:
        return RollStep(waiting="rolling update: waiting for " + ", ".join(absent))
    if state.phase == Phase.BOOTSTRAP:
        return RollStep(delete=by_ordinal[0])
    if state.phase != Phase.HEALTHY:
        return RollStep(waiting="rolling update: waiting for the failover or switchover")
    primary = state.current_primary
    lagging = [
        n
        for n in members
        if n != primary
        and not (
            obs.get(n).reachable
            and obs.get(n).role == Role.STANDBY
            and obs.get(n).streaming_from == primary
        )
    ]
    if not healthy_primary(obs.get(primary)) or lagging:
        return RollStep(
            waiting="rolling update: waiting for every member to stream from the primary"
            + (": " + ", ".join(lagging) if lagging else "")
        )
    standbys = [n for n in by_ordinal if n != primary]
    if standbys:
        return RollStep(delete=standbys[0])
    if len(members) == 1:
        return RollStep(delete=primary)  # alone: nobody to switch over to, a restart
    updated = [n for n in members if n != primary and revisions.get(n) == update_revision]
    if not updated:
        return RollStep(waiting="rolling update: no updated standby to switch over to")
    best = max(updated, key=lambda n: (obs.get(n).received_lsn, -ordinal(n)))
    return RollStep(switchover_to=best)


def _without_last_seen(status: Mapping[str, Any]) -> Obj:
    copy = dict(status)
    ha = dict(copy.get("ha") or {})
    inner = dict(ha.get("state") or {})
    inner.pop("lastSeen", None)
    ha["state"] = inner
    copy["ha"] = ha
    return copy


def lag_of(
    reports: Mapping[str, Report | None], primary: str | None
) -> tuple[dict[str, int], dict[str, float]]:
    """Replication lag per standby (bytes, seconds) from the primary's report."""
    report = reports.get(primary or "")
    bytes_: dict[str, int] = {}
    seconds: dict[str, float] = {}
    if report is None or report.role != Role.PRIMARY or not report.ready:
        return bytes_, seconds
    for row in report.replicas:
        behind = max(0, report.received_lsn - row.replay_lsn)
        bytes_[row.name] = behind
        seconds[row.name] = row.replay_lag if row.replay_lag is not None else 0.0
    return bytes_, seconds


# -- the reconciler --------------------------------------------------------------------------


class HAReconciler:
    """Reconciles the high availability of one in-cluster PostgresInstance (module docs)."""

    def __init__(self, client: Client, recorder: EventRecorder) -> None:
        self.client = client
        self.recorder = recorder
        self.clock = time.time
        self._session: aiohttp.ClientSession | None = None
        self._seen: dict[tuple[str, str], dict[str, float]] = {}
        """``last_seen`` per instance, kept here between rounds (it is written to the status
        only with another change)."""

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=OBSERVE_TIMEOUT, sock_connect=OBSERVE_TIMEOUT)
            )
        return self._session

    async def reconcile(self, request: Request) -> Result | None:
        instance = await ignore_not_found(self.client.get(API_VERSION, INSTANCE, request))
        key = (request.namespace or "", request.name)
        if (
            instance is None
            or (instance.get("spec") or {}).get("external")
            or instance["metadata"].get("deletionTimestamp")
        ):
            POSTGRES_METRICS.forget(*key)
            self._seen.pop(key, None)
            return None
        meta = instance["metadata"]
        pods = {
            p["metadata"]["name"]: p
            for p in await self.client.list(
                "v1",
                "Pod",
                namespace=meta["namespace"],
                label_selector=f"{LABEL_INSTANCE}={meta['name']},{LABEL_COMPONENT}=database",
            )
        }
        reports = await self.observe(pods)
        nodes = {name: node_ready(await self._node(pod)) for name, pod in pods.items()}
        now = self.clock()
        sts = await ignore_not_found(
            self.client.get(
                "apps/v1",
                "StatefulSet",
                name=render.Names(meta["name"]).statefulset,
                namespace=meta["namespace"],
            )
        )
        state = state_from_instance_status(instance.get("status"))
        seen = {**state.last_seen, **self._seen.get(key, {})}
        state = replace(state, last_seen=seen)
        names = sorted(set(pods) | set(ha_config(instance, None).members), key=ordinal)
        obs = Observation(
            now,
            {n: member_observation(n, pods.get(n), reports.get(n), nodes.get(n)) for n in names},
        )
        wanted = self._switchover_wanted(instance)
        base = ha_config(instance, wanted)
        revisions = {
            n: (p["metadata"].get("labels") or {}).get("controller-revision-hash")
            for n, p in pods.items()
        }
        update_revision = ((sts or {}).get("status") or {}).get("updateRevision")
        roll = roll_step(state, obs, base.members, revisions, update_revision)
        config = base
        if wanted is None and roll.switchover_to is not None:
            config = replace(base, switchover_to=roll.switchover_to)
        decision = decide(state, obs, config)
        self._seen[key] = dict(decision.state.last_seen)
        await self._apply_labels(pods, desired_roles(decision.state, obs))
        changed = await self._apply_status(instance, state, decision, obs)
        for event in decision.events:
            self.recorder.record(instance, event.type, event.reason, event.message, "Failover")
        if changed:
            await self.poke(pods)
        await self._finish_switchover_request(instance, decision.state, wanted)
        if roll.delete is not None and decision.state.phase in (Phase.HEALTHY, Phase.BOOTSTRAP):
            await self._delete_for_update(instance, pods[roll.delete])
        self._export(instance, decision.state, obs, reports)
        return Result(requeue_after=requeue_after(decision.state, len(base.members), obs))

    # -- observe ---------------------------------------------------------------------------

    async def observe(self, pods: Mapping[str, Obj]) -> dict[str, Report | None]:
        names = list(pods)
        answers = await asyncio.gather(*(self._fetch(pods[n]) for n in names))
        return dict(zip(names, answers, strict=True))

    async def _fetch(self, pod: Obj) -> Report | None:
        """The agent's report; ``None`` when it did not answer twice in a row (1 s, then 2 s:
        one slow answer on a loaded node is no reason for a failover)."""
        url = _agent_url(pod, "/status")
        if url is None:
            return None
        for timeout in OBSERVE_TIMEOUTS:
            try:
                async with self.session().get(
                    url, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as answer:
                    if answer.status != 200:
                        return None
                    return report_of(await answer.json())
            except (aiohttp.ClientError, TimeoutError, OSError):
                continue
            except ValueError:
                return None
        return None

    async def poke(self, pods: Mapping[str, Obj]) -> None:
        """Ask every agent to read its standing now (best effort)."""

        async def one(pod: Obj) -> None:
            url = _agent_url(pod, "/refresh")
            if url is None:
                return
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with self.session().post(url):
                    pass

        await asyncio.gather(*(one(p) for p in pods.values()))

    async def _node(self, pod: Obj) -> Obj | None:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return None
        return await ignore_not_found(self.client.get("v1", "Node", name=node))

    # -- apply -----------------------------------------------------------------------------

    async def _apply_labels(self, pods: Mapping[str, Obj], roles: Mapping[str, str | None]) -> None:
        # Removals first: no moment with two Pods labelled primary.
        order = sorted(roles, key=lambda n: roles[n] is not None)
        for name in order:
            pod = pods.get(name)
            if pod is None:
                continue
            have = (pod["metadata"].get("labels") or {}).get(LABEL_ROLE)
            if have == roles[name]:
                continue
            with contextlib.suppress(NotFoundError):
                await self.client.patch(pod, {"metadata": {"labels": {LABEL_ROLE: roles[name]}}})

    async def _apply_status(
        self, instance: Obj, before: HAState, decision: Decision, obs: Observation
    ) -> bool:
        """Write the state and the condition if they changed; whether the standing (what the
        agents read) changed."""
        status = status_copy(instance)
        status.update(instance_status_fields(decision.state))
        set_conditions(
            status, instance["metadata"].get("generation"), primary_condition(decision, obs)
        )
        old = instance.get("status") or {}
        if _without_last_seen(status) == _without_last_seen(old):
            return False
        written = await write_shared_status(self.client, instance, status, mine=owned_by_failover)
        stamped = {
            n: t for n, t in decision.state.fenced_at.items() if before.fenced_at.get(n) != t
        }
        finished = self.clock()
        if stamped and finished - min(stamped.values()) > FENCE_RESTAMP_AFTER:
            # A fence counts from when its write returned (module docs).
            fenced_at = {**decision.state.fenced_at, **dict.fromkeys(stamped, finished)}
            fields = instance_status_fields(replace(decision.state, fenced_at=fenced_at))
            status.update(fields)
            # From what was written (a rebase may have taken the instance controller's
            # fields from the live object): only the HA fields change.
            restamped = status_copy(written)
            restamped.update(fields)
            await write_status(self.client, written, restamped)
        standing = ("currentPrimary", "targetPrimary")
        old_ha, new_ha = old.get("ha") or {}, status.get("ha") or {}
        return any(old.get(k) != status.get(k) for k in standing) or any(
            old_ha.get(k) != new_ha.get(k) for k in ("phase", "fenced", "timeline")
        )

    async def _finish_switchover_request(
        self, instance: Obj, state: HAState, wanted: str | None
    ) -> None:
        """Remove the switchover annotation once its target is the healthy primary (or when it
        names no member: an Event says so)."""
        annotation = (instance["metadata"].get("annotations") or {}).get(ANNOTATION_SWITCHOVER)
        if annotation is None:
            return
        done = state.phase == Phase.HEALTHY and state.current_primary == annotation
        if wanted is None and not done:
            self.recorder.record(
                instance,
                "Warning",
                "SwitchoverRefused",
                f"{ANNOTATION_SWITCHOVER}={annotation!r} names no member of the instance",
                "Switchover",
            )
        elif not done:
            return
        with contextlib.suppress(NotFoundError):
            await self.client.patch(
                instance, {"metadata": {"annotations": {ANNOTATION_SWITCHOVER: None}}}
            )

    def _switchover_wanted(self, instance: Obj) -> str | None:
        annotation = (instance["metadata"].get("annotations") or {}).get(ANNOTATION_SWITCHOVER)
        if annotation is None:
            return None
        return annotation if annotation in ha_config(instance, None).members else None

    async def _delete_for_update(self, instance: Obj, pod: Obj) -> None:
        name = pod["metadata"]["name"]
        reconcile_logger(__name__).info("rolling update: deleting pod %s", name)
        self.recorder.record(
            instance, "Normal", "RollingUpdate", f"deleting {name} to update it", "Update"
        )
        with contextlib.suppress(NotFoundError):
            await self.client.delete(pod, preconditions={"uid": pod["metadata"]["uid"]})

    # -- metrics ---------------------------------------------------------------------------

    def _export(
        self,
        instance: Obj,
        state: HAState,
        obs: Observation,
        reports: Mapping[str, Report | None],
    ) -> None:
        meta = instance["metadata"]
        lag_bytes, lag_seconds = lag_of(reports, state.current_primary)
        last, interval = self._backups(instance)
        now = self.clock()
        created = timestamp(meta.get("creationTimestamp"))
        since = now - last if last is not None else (now - created if created else None)
        POSTGRES_METRICS.update(
            meta["namespace"],
            meta["name"],
            InstanceSample(
                up={n: r is not None for n, r in reports.items()},
                roles={n: str(r.role) for n, r in reports.items() if r is not None},
                lag_bytes=lag_bytes,
                lag_seconds=lag_seconds,
                primary_available=state.phase == Phase.HEALTHY
                and healthy_primary(obs.get(state.current_primary)),
                phase=str(state.phase),
                failovers=state.failovers,
                switchovers=state.switchovers,
                last_transition_seconds=state.last_transition_seconds,
                last_backup=last,
                seconds_since_backup=since,
                backup_interval=interval,
            ),
        )

    def _backups(self, instance: Obj) -> tuple[float | None, float | None]:
        """The newest successful Backup's completion and the shortest interval between two
        runs of the instance's BackupPlans (from the cache)."""
        meta = instance["metadata"]
        cache = self.client.cache
        last: float | None = None
        for backup in cache.list(API_VERSION, BACKUP, namespace=meta["namespace"]):
            status = backup.get("status") or {}
            if (
                ref_name(backup, "instanceRef") != meta["name"]
                or status.get("phase") != "Succeeded"
            ):
                continue
            done = timestamp(status.get("completionTime"))
            if done is not None and (last is None or done > last):
                last = done
        interval: float | None = None
        for plan in cache.list(API_VERSION, BACKUP_PLAN, namespace=meta["namespace"]):
            spec = plan.get("spec") or {}
            template = (spec.get("backupTemplate") or {}).get("spec") or {}
            if ref_name({"spec": template}, "instanceRef") != meta["name"]:
                continue
            try:
                schedule = cron.Schedule.parse(str(spec.get("schedule", "")))
                latest = schedule.latest_at_or_before(datetime.now(UTC))
                gap = (schedule.next_after(latest) - latest).total_seconds()
            except cron.CronError:
                continue
            interval = gap if interval is None else min(interval, gap)
        return last, interval


def _agent_url(pod: Mapping[str, Any], path: str) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    port = DEFAULT_AGENT_PORT
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        for declared in container.get("ports") or ():
            if declared.get("name") == AGENT_PORT_NAME:
                port = int(declared.get("containerPort", port))
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{path}"


async def setup_ha_controller(
    host: ControllerHost,
    client: Client,
    *,
    options: ControllerOptions | None = None,
    recorder: EventRecorder | None = None,
) -> Controller:
    """Build the high-availability controller on ``host``: it reconciles PostgresInstances,
    and an instance again whenever one of its Pods changes or a Node that runs one does. Only
    the instances' Pods are cached (label ``app.kubernetes.io/managed-by`` of this operator),
    with the Nodes, Backups and BackupPlans."""
    recorder = controller_recorder(host, "postgres.crpy.io/failover-controller", recorder)
    reconciler = HAReconciler(client, recorder)
    cache = client.cache
    cache.by_object.setdefault(("v1", "Pod"), ByObject(label_selector=POD_SELECTOR))

    def pod_instance(pod: Mapping[str, Any]) -> list[Request]:
        name = (pod["metadata"].get("labels") or {}).get(LABEL_INSTANCE)
        return [Request(pod["metadata"]["namespace"], name)] if name else []

    def readiness_changed(delta: StoreDelta) -> bool:
        return delta.old is None or node_ready(delta.obj) != node_ready(delta.old)

    def node_instances(node: Mapping[str, Any]) -> list[Request]:
        requests = set()
        for pod in cache.list("v1", "Pod"):
            if (pod.get("spec") or {}).get("nodeName") == node["metadata"]["name"]:
                requests.update(pod_instance(pod))
        return sorted(requests, key=lambda r: (r.namespace or "", r.name))

    controller = await (
        ControllerBuilder(host)
        .named("postgresfailover")
        .for_(API_VERSION, INSTANCE)
        .watches("v1", "Pod", EnqueueRequestsFromMapFunc(pod_instance))
        .watches(
            "v1", "Node", EnqueueRequestsFromMapFunc(node_instances), predicates=[readiness_changed]
        )
        .caches("apps/v1", "StatefulSet")
        .caches(API_VERSION, BACKUP)
        .caches(API_VERSION, BACKUP_PLAN)
        .with_options(options)
        .complete(reconciler)
    )
    controller.on_stop(reconciler.close)
    return controller


__all__ = ["HAReconciler", "member_observation", "roll_step", "setup_ha_controller"]
