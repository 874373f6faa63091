"""The Job that deletes a Backup's object, and how its events find the Backup."""

from __future__ import annotations

from typing import Any

from controller_runtime import Request
from controllers.postgres import jobs
from controllers.postgres.backup import _deletion_job_owner

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
