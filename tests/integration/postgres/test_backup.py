"""Backups and BackupPlans on the local control plane (no job controller: the tests write a
Job's status as the job controller would).

- a Backup renders a Job (dump, then upload to S3) and follows its outcome to Succeeded or
  Failed;
- a BackupPlan, driven by an injected clock, creates Backups on schedule (one per run time,
  however often it is reconciled), honours ``Forbid`` and ``suspend``, and prunes finished
  Backups by ``keepLast`` and ``maxAge``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.reconcile import Request
from controller_runtime.util import EventRecorder
from controllers.postgres import setup_backup_controller, setup_instance_controller
from controllers.postgres.api import API_VERSION, BACKUP, BACKUP_PLAN, LABEL_PLAN
from controllers.postgres.cron import Schedule
from controllers.postgres.localserver import LocalPostgres
from controllers.postgres.plan import PlanReconciler, parse_time
from informers.shared import InformerFactory
from informers.store import StoreDelta
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import (
    condition,
    external_instance,
    running_operator,
    set_policy,
    wait_for,
)
from tests.support import CONTROLLER_MANAGER

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
STORAGE = {
    "endpoint": "https://s3.example.test",
    "bucket": "db-backups",
    "credentialsSecretRef": {"name": "s3-credentials"},
}


def backup(name: str, namespace: str, **spec: Any) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": BACKUP,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"instanceRef": {"name": "db"}, "storage": STORAGE, **spec},
    }


def phase_is(phase: str) -> Any:
    return lambda o: o is not None and (o.get("status") or {}).get("phase") == phase


@pytest.mark.plays("the job controller (writes the Jobs' status)", by=CONTROLLER_MANAGER)
async def test_a_backup_runs_as_a_job_and_follows_its_outcome(
    admin_config: ClusterConfig,
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True}, defaultImage="registry.example/postgres:{version}")
    await external_instance(kube, namespace, postgres_server)
    async with running_operator(
        admin_config, namespace, (setup_instance_controller, setup_backup_controller)
    ):
        await wait_for(
            transport,
            "PostgresInstance",
            namespace,
            "db",
            lambda o: condition(o, "Ready").get("status") == "True",
        )
        await kube.create(backup("nightly", namespace, database="shop"))
        job = await wait_for(
            transport, "jobs", namespace, "nightly-backup", lambda o: o is not None, api="batch/v1"
        )
        assert job is not None
        pod = job["spec"]["template"]["spec"]
        dump, upload = pod["initContainers"][0], pod["containers"][0]
        assert dump["image"] == f"registry.example/postgres:{major}"
        assert "pg_dump --format=custom" in dump["command"][-1]
        env = {e["name"]: e for e in dump["env"]}
        assert env["PGHOST"]["value"] == "127.0.0.1" and env["DATABASE"]["value"] == "shop"
        assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "db-admin",
            "key": "password",
        }
        key = f"backups/{namespace}/db/nightly.dump"
        assert f"s3://db-backups/{key}" in upload["command"][-1]
        upload_env = {e["name"]: e for e in upload["env"]}
        assert upload_env["S3_ENDPOINT"]["value"] == "https://s3.example.test"
        assert upload_env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == (
            "s3-credentials"
        )
        pending = await wait_for(transport, "Backup", namespace, "nightly", phase_is("Pending"))
        assert pending is not None and pending["status"]["jobName"] == "nightly-backup"

        started = "2030-01-01T03:00:00Z"
        job = await kube.patch_status(job, {"status": {"startTime": started, "active": 1}})
        await wait_for(transport, "Backup", namespace, "nightly", phase_is("Running"))
        finished = "2030-01-01T03:02:00Z"
        await kube.patch_status(
            job,
            {
                "status": {
                    "active": 0,
                    "succeeded": 1,
                    "completionTime": finished,
                    "conditions": [
                        {"type": "SuccessCriteriaMet", "status": "True"},
                        {"type": "Complete", "status": "True"},
                    ],
                }
            },
        )
        done = await wait_for(transport, "Backup", namespace, "nightly", phase_is("Succeeded"))
        assert done is not None
        assert done["status"]["location"] == f"s3://db-backups/{key}"
        assert (done["status"]["startTime"], done["status"]["completionTime"]) == (
            started,
            finished,
        )
        assert condition(done, "Complete")["status"] == "True"
        assert condition(done, "Failed")["status"] == "False"

        # A pg_basebackup that fails.
        await kube.create(backup("full", namespace, method="pg_basebackup"))
        job = await wait_for(
            transport, "jobs", namespace, "full-backup", lambda o: o is not None, api="batch/v1"
        )
        assert job is not None
        assert (
            "pg_basebackup" in job["spec"]["template"]["spec"]["initContainers"][0]["command"][-1]
        )
        await kube.patch_status(
            job,
            {
                "status": {
                    "startTime": started,
                    "failed": 3,
                    "conditions": [
                        {
                            "type": "FailureTarget",
                            "status": "True",
                            "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit",
                        },
                        {
                            "type": "Failed",
                            "status": "True",
                            "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit",
                        },
                    ],
                }
            },
        )
        failed = await wait_for(transport, "Backup", namespace, "full", phase_is("Failed"))
        assert condition(failed, "Failed")["message"] == (
            "the Job full-backup failed: Job has reached the specified backoff limit; its Pods' "
            f"logs say why (kubectl logs -n {namespace} job/full-backup --all-containers)"
        )
        assert condition(failed, "Complete")["status"] == "False"


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class CacheSettler:
    """Waits until the cache holds exactly what the server holds (Backups and plans)."""

    def __init__(self, cache: Cache, client: Client, namespace: str) -> None:
        self.cache, self.client, self.namespace = cache, client, namespace
        self.changed = asyncio.Event()

    def __call__(self, delta: StoreDelta, initial: bool) -> None:
        self.changed.set()

    def _versions(self, objs: list[Obj]) -> dict[str, str]:
        return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in objs}

    async def settle(self) -> None:
        for kind in (BACKUP, BACKUP_PLAN):
            live = self._versions(
                await self.client.live.list(API_VERSION, kind, namespace=self.namespace)
            )
            while (
                self._versions(self.cache.list(API_VERSION, kind, namespace=self.namespace)) != live
            ):
                self.changed.clear()
                await asyncio.wait_for(self.changed.wait(), 10)


@pytest.fixture
async def plan_env(
    transport: Transport, namespace: str
) -> AsyncIterator[tuple[Client, CacheSettler]]:
    cache = Cache(InformerFactory(transport), namespaces=[namespace])
    client = Client(transport, cache, field_manager="plan-test")
    settler = CacheSettler(cache, client, namespace)
    for kind in (BACKUP, BACKUP_PLAN):
        (await cache.watch(API_VERSION, kind)).add_handler(settler)
    await cache.wait_for_sync(30)
    yield client, settler
    await cache.stop()


async def test_a_backup_plan_creates_backups_on_schedule_and_prunes_them(
    plan_env: tuple[Client, CacheSettler], kube: Client, namespace: str
) -> None:
    client, settler = plan_env
    plan = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": BACKUP_PLAN,
            "metadata": {"name": "hourly", "namespace": namespace},
            "spec": {
                "schedule": "*/10 * * * *",
                "retention": {"keepLast": 2},
                "backupTemplate": {"spec": {"instanceRef": {"name": "db"}, "storage": STORAGE}},
            },
        }
    )
    created = parse_time(plan["metadata"]["creationTimestamp"])
    first = Schedule.parse("*/10 * * * *").next_after(created)
    clock = FakeClock(first - timedelta(seconds=30))
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    plans = PlanReconciler(client, recorder, clock=clock)
    request = Request(namespace, "hourly")

    async def reconcile() -> float | None:
        await settler.settle()
        result = await plans.reconcile(request)
        await settler.settle()
        return result.requeue_after if result is not None else None

    async def backups() -> dict[str, Obj]:
        listed = await kube.live.list(
            API_VERSION, BACKUP, namespace=namespace, label_selector=f"{LABEL_PLAN}=hourly"
        )
        return {b["metadata"]["name"]: b for b in listed}

    async def finish(name: str, phase: str = "Succeeded") -> None:
        obj = (await backups())[name]
        await kube.patch_status(
            obj, {"status": {"phase": phase, "completionTime": _iso(clock.now)}}
        )

    # Before the first run time: nothing, and a requeue for that time.
    assert await reconcile() == pytest.approx(30, abs=1)
    assert await backups() == {}

    # At the run time: one Backup, however often the plan is reconciled.
    clock.now = first + timedelta(seconds=5)
    for _ in range(3):
        await reconcile()
    names = sorted(await backups())
    assert names == [f"hourly-{int(first.timestamp() // 60)}"]
    backup_obj = (await backups())[names[0]]
    assert backup_obj["spec"]["storage"]["bucket"] == "db-backups"
    live_plan = await kube.live.get(API_VERSION, BACKUP_PLAN, name="hourly", namespace=namespace)
    assert live_plan["status"]["lastScheduleTime"] == _iso(first)
    assert live_plan["status"]["active"] == names

    # Forbid (the default): the next run is skipped while the first still runs.
    clock.now = first + timedelta(minutes=10, seconds=5)
    await reconcile()
    assert sorted(await backups()) == names

    # Once it finished, the following runs go ahead; keepLast 2 prunes the oldest.
    await finish(names[0])
    for step in range(1, 4):
        clock.now = first + timedelta(minutes=10 * step, seconds=5)
        await reconcile()
        current = await backups()
        newest = f"hourly-{int((first + timedelta(minutes=10 * step)).timestamp() // 60)}"
        assert newest in current
        await finish(newest, "Failed" if step == 2 else "Succeeded")
    await reconcile()
    remaining = sorted(await backups())
    assert len(remaining) == 2 and all(n.startswith("hourly-") for n in remaining)
    assert remaining == sorted(
        f"hourly-{int((first + timedelta(minutes=10 * s)).timestamp() // 60)}" for s in (2, 3)
    )
    live_plan = await kube.live.get(API_VERSION, BACKUP_PLAN, name="hourly", namespace=namespace)
    assert live_plan["status"]["active"] == []
    assert live_plan["status"]["lastSuccessfulTime"] == _iso(clock.now)

    # Suspended, with maxAge: no new Backups, and old ones are pruned.
    await kube.patch(live_plan, {"spec": {"suspend": True, "retention": {"maxAge": "30m"}}})
    clock.now = first + timedelta(hours=2)
    await reconcile()
    assert await backups() == {}
    await recorder.close()


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_plan_reports_its_last_backup_failing_once_and_recovering(
    plan_env: tuple[Client, CacheSettler], kube: Client, namespace: str
) -> None:
    client, settler = plan_env
    plan = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": BACKUP_PLAN,
            "metadata": {"name": "often", "namespace": namespace},
            "spec": {
                "schedule": "*/10 * * * *",
                "backupTemplate": {"spec": {"instanceRef": {"name": "db"}, "storage": STORAGE}},
            },
        }
    )
    first = Schedule.parse("*/10 * * * *").next_after(
        parse_time(plan["metadata"]["creationTimestamp"])
    )
    clock = FakeClock(first + timedelta(seconds=5))
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    plans = PlanReconciler(client, recorder, clock=clock)

    async def reconcile() -> Obj:
        await settler.settle()
        await plans.reconcile(Request(namespace, "often"))
        await settler.settle()
        return await kube.live.get(API_VERSION, BACKUP_PLAN, name="often", namespace=namespace)

    async def finish_newest(phase: str, message: str = "") -> None:
        listed = await kube.live.list(API_VERSION, BACKUP, namespace=namespace)
        newest = max(listed, key=lambda b: b["metadata"]["name"])
        conditions = [
            {
                "type": "Failed",
                "status": "True",
                "reason": "Failed",
                "message": message,
                "lastTransitionTime": _iso(clock.now),
            }
        ]
        await kube.patch_status(
            newest, {"status": {"phase": phase, "conditions": conditions if message else []}}
        )

    live = await reconcile()
    assert condition(live, "LastBackupSucceeded") == {}  # nothing finished yet
    await finish_newest("Failed", "access denied by the bucket")
    for _ in range(3):
        live = await reconcile()
    failing = condition(live, "LastBackupSucceeded")
    name = f"often-{int(first.timestamp() // 60)}"
    assert failing["status"] == "False" and failing["reason"] == "BackupFailed"
    assert failing["message"] == f"Backup {name} failed: access denied by the bucket"

    clock.now = first + timedelta(minutes=10, seconds=5)
    await reconcile()
    await finish_newest("Succeeded")
    live = await reconcile()
    assert condition(live, "LastBackupSucceeded")["status"] == "True"
    await recorder.close()
    events = await kube.live.list("events.k8s.io/v1", "Event", namespace=namespace)
    failed = [e for e in events if e.get("reason") == "BackupFailed"]
    assert len(failed) == 1 and (failed[0].get("series") or {}).get("count", 1) == 1, failed
    assert failed[0]["type"] == "Warning" and name in failed[0]["note"]
