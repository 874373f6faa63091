"""Helpers of the backup tests: a PostgreSQL instance with rows in it, the S3 credentials
Secret, one-shot psql Pods, and reading Backups and the bucket."""

from __future__ import annotations

import json
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from controller_runtime.envtest.node.images import AWS_CLI_IMAGE
from controller_runtime.envtest.node.s3 import S3Endpoint
from tests.e2e.connect import connecting, retry_connection
from tests.e2e.pods import secret_env, succeeded
from tests.e2e.support import diagnostics, get_json, wait_for

POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {"defaultImage": "postgres:{version}", "versions": [{"version": "15"}]},
}
CREDENTIALS_SECRET = "s3-credentials"
ROWS = 50_000
FILL_SQL = (
    "CREATE TABLE items AS SELECT g AS id, md5(g::text) || md5((g * 7)::text) AS body "
    f"FROM generate_series(1, {ROWS}) AS g"
)
"""About 5 MB of table: 50k rows of an id and 64 hex characters."""


def s3_endpoint(cluster: LocalCluster) -> S3Endpoint:
    endpoint = cluster.s3_endpoint
    assert isinstance(endpoint, S3Endpoint), "the e2e cluster runs without S3 (s3=True)"
    return endpoint


def apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(obj))


def credentials_secret(
    cluster: LocalCluster, namespace: str, name: str = CREDENTIALS_SECRET, *, wrong: bool = False
) -> str:
    """A Secret with the cluster's S3 keys (or, ``wrong=True``, a key the server rejects)."""
    creds = s3_endpoint(cluster).credentials
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": {
            "AWS_ACCESS_KEY_ID": "CRPYWRONGKEY0000" if wrong else creds.access_key,
            "AWS_SECRET_ACCESS_KEY": "wrong-secret" if wrong else creds.secret_key,
        },
    }
    apply(cluster, secret)
    return name


def storage(cluster: LocalCluster, secret: str = CREDENTIALS_SECRET) -> dict[str, Any]:
    endpoint = s3_endpoint(cluster)
    return {
        "endpoint": endpoint.cluster_url,
        "bucket": endpoint.bucket,
        "prefix": "e2e",
        "credentialsSecretRef": {"name": secret},
    }


def backup_spec(cluster: LocalCluster, instance: str, secret: str = CREDENTIALS_SECRET) -> Any:
    return {
        "instanceRef": {"name": instance},
        "method": "pg_dump",
        "database": "postgres",
        "uploaderImage": AWS_CLI_IMAGE,
        "storage": storage(cluster, secret),
    }


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def instance_ready(cluster: LocalCluster, namespace: str, name: str) -> bool:
    out = cluster.kubectl(
        "get",
        "postgresinstance",
        name,
        "-n",
        namespace,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return out.strip() == "True"


def create_instance(
    cluster: LocalCluster, namespace: str, name: str, restore_from: str | None = None
) -> float:
    """A 1-replica PostgresInstance (version 15) turned Ready; returns the seconds it took."""
    apply(cluster, POLICY)
    spec: dict[str, Any] = {"version": "15", "replicas": 1, "storage": {"size": "1Gi"}}
    if restore_from:
        spec["restore"] = {"backupName": restore_from}
    apply(
        cluster,
        {
            "apiVersion": "postgres.crpy.io/v1beta1",
            "kind": "PostgresInstance",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        },
    )
    return wait_for(
        lambda: instance_ready(cluster, namespace, name),
        f"postgresinstance {namespace}/{name} Ready",
        200,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {name}"),
    )


def psql(cluster: LocalCluster, namespace: str, instance: str, pod: str, sql: str) -> str:
    """Run ``sql`` as the superuser against ``<instance>-primary`` in a one-shot Pod
    (connection failures retried, tests/e2e/connect.py); return its output (fails with
    diagnostics when the Pod fails)."""
    return succeeded(
        cluster,
        namespace,
        pod,
        connecting(
            *("psql", "-v", "ON_ERROR_STOP=1", "-h", f"{instance}-primary", "-U", "postgres"),
            *("-d", "postgres", "-tAc", sql),
        ),
        env=[secret_env("PGPASSWORD", f"{instance}-superuser", "password")],
    )


def get_backup(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "backup", name, "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(out)) if out.strip() else {}


def backup_phase(cluster: LocalCluster, namespace: str, name: str) -> str:
    return str((get_backup(cluster, namespace, name).get("status") or {}).get("phase", ""))


def bucket_keys(cluster: LocalCluster, prefix: str) -> dict[str, int]:
    """The objects under ``prefix`` in the cluster's bucket, listed through the S3 API
    (connection failures retried, tests/e2e/connect.py)."""
    endpoint = s3_endpoint(cluster)
    return retry_connection(
        lambda: endpoint.client().list_objects(endpoint.bucket, prefix),
        f"listing s3://{endpoint.bucket}/{prefix} at {endpoint.url}",
    )


def key_of(location: str, bucket: str) -> str:
    """``s3://bucket/key`` → ``key``."""
    head = f"s3://{bucket}/"
    assert location.startswith(head), f"location {location!r} is not in bucket {bucket!r}"
    return location[len(head) :]


def jobs_in(cluster: LocalCluster, namespace: str) -> list[str]:
    return [j["metadata"]["name"] for j in get_json(cluster, "jobs", "-n", namespace)["items"]]
