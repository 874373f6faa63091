"""The Job that deletes a Backup's object, and how its events find the Backup."""

from __future__ import annotations

from typing import Any

from controller_runtime import Request
from controllers.postgres import jobs
from controllers.postgres.api import ANNOTATION_BACKUP_UID
from controllers.postgres.backup import _deletion_job_of, _deletion_job_owner, instance_gone

BACKUP: dict[str, Any] = {
    "metadata": {"name": "nightly-29000000", "namespace": "shop"},
    "spec": {
        "instanceRef": {"name": "db"},
        "uploaderImage": "example/aws-cli:1",
        "storage": {
            "endpoint": "http://s3.example.test:8333",
            "bucket": "backups",
            "prefix": "/daily/",
            "region": "eu-west-1",
            "credentialsSecretRef": {"name": "s3-keys"},
        },
    },
}


def test_the_deletion_job_removes_exactly_the_uploaded_key() -> None:
    job = jobs.delete_object_job(BACKUP)
    container = job["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][-1]
    assert script.startswith("aws s3 rm ")
    assert '"s3://backups/daily/shop/db/nightly-29000000.dump"' in script
    assert jobs.location(BACKUP) == "s3://backups/daily/shop/db/nightly-29000000.dump"
    assert container["image"] == "example/aws-cli:1"
    env = {e["name"]: e for e in container["env"]}
    assert env["S3_ENDPOINT"]["value"] == "http://s3.example.test:8333"
    assert env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "s3-keys", "key": key}
    assert "volumeMounts" not in container


def test_the_deletion_job_is_not_owned_and_cleans_itself_up() -> None:
    job = jobs.delete_object_job(BACKUP)
    meta = job["metadata"]
    assert meta["name"] == "nightly-29000000-delete"
    assert "ownerReferences" not in meta
    assert meta["labels"][jobs.LABEL_BACKUP] == "nightly-29000000"
    assert job["spec"]["ttlSecondsAfterFinished"] == jobs.DELETE_JOB_TTL_SECONDS
    assert job["spec"]["backoffLimit"] == 1
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_a_long_backup_name_keeps_the_job_name_valid_and_mapped_back() -> None:
    long = {**BACKUP, "metadata": {"name": "b" * 60, "namespace": "shop"}}
    job = jobs.delete_object_job(long)
    assert len(job["metadata"]["name"]) <= 63
    assert list(_deletion_job_owner(job)) == [Request("shop", "b" * 60)]


def test_only_deletion_jobs_map_to_their_backup() -> None:
    deletion = jobs.delete_object_job(BACKUP)
    assert list(_deletion_job_owner(deletion)) == [Request("shop", "nightly-29000000")]
    backup_job = {
        "metadata": {
            "name": "nightly-29000000-backup",
            "namespace": "shop",
            "labels": {jobs.LABEL_BACKUP: "nightly-29000000"},
        }
    }
    assert list(_deletion_job_owner(backup_job)) == []
    assert list(_deletion_job_owner({"metadata": {"name": "x", "namespace": "shop"}})) == []


def test_the_deletion_job_names_its_backup_by_uid_and_only_it_is_taken_for_its_own() -> None:
    backup = {**BACKUP, "metadata": {**BACKUP["metadata"], "uid": "u-1"}}
    job = jobs.delete_object_job(backup)
    assert job["metadata"]["annotations"] == {ANNOTATION_BACKUP_UID: "u-1"}
    assert _deletion_job_of(job, backup)
    successor = {**backup, "metadata": {**backup["metadata"], "uid": "u-2"}}
    assert not _deletion_job_of(job, successor)
    # A Job of an earlier version, without the annotation, is the Backup's of its name.
    assert _deletion_job_of(jobs.delete_object_job(BACKUP), successor)


def instance(uid: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "db", "namespace": "shop", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"metadata": meta}


def test_an_instance_is_gone_for_a_job_when_deleted_going_or_another_one() -> None:
    assert instance_gone("db", instance("i-1"), "i-1") == ""
    assert instance_gone("db", instance("i-2"), None) == ""  # a Job of an earlier version
    assert "was deleted while" in instance_gone("db", None, "i-1")
    assert "re-created" in instance_gone("db", instance("i-2"), "i-1")
    assert "being deleted" in instance_gone("db", instance("i-1", deleting=True), "i-1")
