"""Deleting a Backup deletes its object, and a Backup outlives neither its instance nor a
failing bucket (the local control plane has no job controller: the tests write a Job's
status as the job controller would).

- a Succeeded Backup, deleted, stays (finalizer) until the Job ``<backup>-delete`` (``aws s3
  rm`` of its key, no owner reference) completed; then the Job is removed, the Backup goes,
  an ``ObjectDeleted`` event is recorded;
- when that Job fails the Backup still goes, with a Warning ``ObjectNotDeleted`` naming the
  object;
- a Failed Backup goes at once, without a deletion Job; so does one whose Job never
  started (the Job is deleted);
- an instance deleted while its Backup's Job runs fails the Backup (``InstanceDeleted``) and
  deletes the Job; so does one deleted and re-created under the same name (another UID);
- a deletion Job of an earlier Backup of the same name is never taken for this one's.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.client import Client
from controllers.postgres import setup_backup_controller, setup_instance_controller
from controllers.postgres.api import (
    ANNOTATION_BACKUP_UID,
    ANNOTATION_INSTANCE_UID,
    API_VERSION,
    BACKUP,
    BACKUP_FINALIZER,
)
from controllers.postgres.jobs import delete_object_job
from controllers.postgres.localserver import LocalPostgres
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

pytestmark = [
    pytest.mark.integration,
    pytest.mark.plays("the job controller (writes a Job's status)", by=CONTROLLER_MANAGER),
]

Obj = dict[str, Any]
STORAGE = {
    "endpoint": "https://s3.example.test",
    "bucket": "db-backups",
    "credentialsSecretRef": {"name": "s3-credentials"},
}
COMPLETE = {
    "startTime": "2030-01-01T03:00:00Z",
    "completionTime": "2030-01-01T03:01:00Z",
    "succeeded": 1,
    "conditions": [
        {"type": "SuccessCriteriaMet", "status": "True"},
        {"type": "Complete", "status": "True"},
    ],
}
FAILED = {
    "startTime": "2030-01-01T03:00:00Z",
    "failed": 2,
    "conditions": [
        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        },
    ],
}


def backup(name: str, namespace: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": BACKUP,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"instanceRef": {"name": "db"}, "storage": STORAGE},
    }


def phase_is(phase: str) -> Any:
    return lambda o: o is not None and (o.get("status") or {}).get("phase") == phase


async def finished_backup(
    kube: Client, transport: Transport, namespace: str, name: str, job_status: Obj
) -> Obj:
    """Create Backup ``name``, finish its Job with ``job_status``, wait for the outcome."""
    await kube.create(backup(name, namespace))
    job = await wait_for(
        transport, "jobs", namespace, f"{name}-backup", lambda o: o is not None, api="batch/v1"
    )
    assert job is not None
    await kube.patch_status(job, {"status": job_status})
    phase = "Succeeded" if job_status is COMPLETE else "Failed"
    done = await wait_for(transport, "Backup", namespace, name, phase_is(phase))
    assert done is not None
    assert BACKUP_FINALIZER in done["metadata"]["finalizers"]
    return done


async def events_for(kube: Client, namespace: str, name: str) -> list[Obj]:
    events = await kube.live.list("events.k8s.io/v1", "Event", namespace=namespace)
    return [e for e in events if (e.get("regarding") or {}).get("name") == name]


@pytest.fixture
async def backups_running(
    admin_config: ClusterConfig, kube: Client, namespace: str, postgres_server: LocalPostgres
) -> Any:
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True}, defaultImage="registry.example/postgres:{version}")
    await external_instance(kube, namespace, postgres_server)
    async with running_operator(
        admin_config, namespace, (setup_instance_controller, setup_backup_controller)
    ) as manager:
        yield manager


async def test_deleting_a_succeeded_backup_runs_a_deletion_job_first(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    done = await finished_backup(kube, transport, namespace, "nightly", COMPLETE)
    await kube.delete(done)
    job = await wait_for(
        transport, "jobs", namespace, "nightly-delete", lambda o: o is not None, api="batch/v1"
    )
    assert job is not None
    assert not job["metadata"].get("ownerReferences")
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    container = job["spec"]["template"]["spec"]["containers"][0]
    key = f"s3://db-backups/backups/{namespace}/db/nightly.dump"
    assert "aws s3 rm" in container["command"][-1] and key in container["command"][-1]
    env = {e["name"]: e for e in container["env"]}
    assert env["S3_ENDPOINT"]["value"] == "https://s3.example.test"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "s3-credentials"
    pending = await kube.live.get(API_VERSION, BACKUP, name="nightly", namespace=namespace)
    assert pending["metadata"].get("deletionTimestamp"), "the Backup went before its object"

    await kube.patch_status(job, {"status": COMPLETE})
    assert await wait_for(transport, "Backup", namespace, "nightly", lambda o: o is None) is None
    assert (
        await wait_for(
            transport, "jobs", namespace, "nightly-delete", lambda o: o is None, api="batch/v1"
        )
        is None
    )
    reasons = {e["reason"]: e for e in await events_for(kube, namespace, "nightly")}
    assert key in reasons["ObjectDeleted"]["note"]


async def test_a_failing_deletion_job_does_not_keep_the_backup(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    done = await finished_backup(kube, transport, namespace, "weekly", COMPLETE)
    await kube.delete(done)
    job = await wait_for(
        transport, "jobs", namespace, "weekly-delete", lambda o: o is not None, api="batch/v1"
    )
    assert job is not None
    await kube.patch_status(job, {"status": FAILED})
    assert await wait_for(transport, "Backup", namespace, "weekly", lambda o: o is None) is None
    reasons = {e["reason"]: e for e in await events_for(kube, namespace, "weekly")}
    warning = reasons["ObjectNotDeleted"]
    assert warning["type"] == "Warning"
    assert f"s3://db-backups/backups/{namespace}/db/weekly.dump" in warning["note"]
    assert "backoff limit" in warning["note"]


async def test_a_failed_backup_goes_at_once(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    done = await finished_backup(kube, transport, namespace, "broken", FAILED)
    await kube.delete(done)
    assert await wait_for(transport, "Backup", namespace, "broken", lambda o: o is None) is None
    jobs = await kube.live.list("batch/v1", "Job", namespace=namespace)
    assert "broken-delete" not in [j["metadata"]["name"] for j in jobs]


async def test_an_instance_deleted_during_the_backup_fails_it(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    await kube.create(backup("orphan", namespace))
    job = await wait_for(
        transport, "jobs", namespace, "orphan-backup", lambda o: o is not None, api="batch/v1"
    )
    assert job is not None
    await kube.patch_status(job, {"status": {"startTime": "2030-01-01T03:00:00Z", "active": 1}})
    await wait_for(transport, "Backup", namespace, "orphan", phase_is("Running"))
    await kube.delete(API_VERSION, "PostgresInstance", name="db", namespace=namespace)
    failed = await wait_for(
        transport, "Backup", namespace, "orphan", phase_is("Failed"), timeout=60
    )
    assert condition(failed, "Failed")["reason"] == "InstanceDeleted"
    assert "'db'" in condition(failed, "Failed")["message"]
    assert failed is not None and failed["status"]["completionTime"]
    # The Job is deleted (background propagation: no garbage collector here, so only the Job).
    assert (
        await wait_for(
            transport, "jobs", namespace, "orphan-backup", lambda o: o is None, api="batch/v1"
        )
        is None
    )
    await kube.delete(failed)
    assert await wait_for(transport, "Backup", namespace, "orphan", lambda o: o is None) is None


async def test_a_backup_whose_job_never_started_goes_with_its_job(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    await kube.create(backup("early", namespace))
    job = await wait_for(
        transport, "jobs", namespace, "early-backup", lambda o: o is not None, api="batch/v1"
    )
    assert job is not None
    await wait_for(transport, "Backup", namespace, "early", phase_is("Pending"))
    await kube.delete(API_VERSION, BACKUP, name="early", namespace=namespace)
    assert await wait_for(transport, "Backup", namespace, "early", lambda o: o is None) is None
    assert (
        await wait_for(
            transport, "jobs", namespace, "early-backup", lambda o: o is None, api="batch/v1"
        )
        is None
    )
    jobs = await kube.live.list("batch/v1", "Job", namespace=namespace)
    assert "early-delete" not in [j["metadata"]["name"] for j in jobs]


async def test_a_terminating_namespace_does_not_hold_a_backup(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    """A terminating namespace refuses the deletion Job: the Backup goes anyway (its
    finalizer would otherwise hold the namespace's deletion forever)."""
    done = await finished_backup(kube, transport, namespace, "last", COMPLETE)
    await kube.delete("v1", "Namespace", name=namespace)
    await kube.delete(done)
    assert await wait_for(transport, "Backup", namespace, "last", lambda o: o is None) is None
    jobs = await kube.live.list("batch/v1", "Job", namespace=namespace)
    assert "last-delete" not in [j["metadata"]["name"] for j in jobs]


async def test_an_instance_recreated_during_the_backup_fails_it(
    admin_config: ClusterConfig,
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    """The Job is made for one instance (its UID is on the Job): an instance deleted and
    re-created under the same name between two looks is another one, and fails the Backup
    like a deletion (the Job would otherwise back up the new instance, or wait for ever)."""
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True}, defaultImage="registry.example/postgres:{version}")
    first = await external_instance(kube, namespace, postgres_server)
    # Only the Backup controller: nothing holds the instance's deletion, so the re-creation
    # follows at once.
    async with running_operator(admin_config, namespace, (setup_backup_controller,)):
        await kube.create(backup("moved", namespace))
        job = await wait_for(
            transport, "jobs", namespace, "moved-backup", lambda o: o is not None, api="batch/v1"
        )
        assert job is not None
        assert job["metadata"]["annotations"][ANNOTATION_INSTANCE_UID] == first["metadata"]["uid"]
        await kube.patch_status(job, {"status": {"startTime": "2030-01-01T03:00:00Z", "active": 1}})
        await wait_for(transport, "Backup", namespace, "moved", phase_is("Running"))
        await kube.delete(first)
        second = dict(first)
        second["metadata"] = {"name": "db", "namespace": namespace}
        second.pop("status", None)
        second = await kube.create(second)
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        failed = await wait_for(
            transport, "Backup", namespace, "moved", phase_is("Failed"), timeout=60
        )
        assert condition(failed, "Failed")["reason"] == "InstanceDeleted"
        assert (
            await wait_for(
                transport, "jobs", namespace, "moved-backup", lambda o: o is None, api="batch/v1"
            )
            is None
        )


async def test_a_deletion_job_of_an_earlier_backup_of_the_name_is_not_taken_for_ours(
    backups_running: Any, kube: Client, transport: Transport, namespace: str
) -> None:
    """A deletion Job left by an earlier Backup of the same name (it deletes that Backup's
    object) is waited for and removed, never taken for this Backup's: its success is not
    this object's deletion."""
    done = await finished_backup(kube, transport, namespace, "again", COMPLETE)
    earlier = delete_object_job(
        {**done, "metadata": {**done["metadata"], "uid": "uid-of-an-earlier-backup"}}
    )
    earlier = await kube.create(earlier)
    await kube.delete(done)
    await kube.patch_status(earlier, {"status": COMPLETE})
    ours = await wait_for(
        transport,
        "jobs",
        namespace,
        "again-delete",
        lambda o: (
            o is not None
            and o["metadata"].get("annotations", {}).get(ANNOTATION_BACKUP_UID)
            == done["metadata"]["uid"]
        ),
        api="batch/v1",
    )
    assert ours is not None
    assert [e["reason"] for e in await events_for(kube, namespace, "again")].count(
        "ObjectDeleted"
    ) == 0, "the earlier Backup's deletion was taken for this one's"
    await kube.patch_status(ours, {"status": COMPLETE})
    assert await wait_for(transport, "Backup", namespace, "again", lambda o: o is None) is None
    reasons = [e["reason"] for e in await events_for(kube, namespace, "again")]
    assert reasons.count("ObjectDeleted") == 1
