"""A PostgresInstance on a real node: the in-cluster operator renders it, the StatefulSet's
Pod runs the PostgreSQL 15 image on a PersistentVolume, the instance turns Ready and a client
Pod connects through the primary Service (retrying while the Service's rules and name catch
up, as an application would: tests/e2e/connect.py)."""

from __future__ import annotations

import json
import time

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.backups import instance_ready
from tests.e2e.connect import connecting
from tests.e2e.pods import secret_env, succeeded
from tests.e2e.support import TIMINGS, diagnostics, new_namespace, wait_for

POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {"defaultImage": "postgres:{version}", "versions": [{"version": "15"}]},
}


def test_one_replica_turns_ready_and_accepts_connections(
    cluster: LocalCluster, operator: str
) -> None:
    namespace = new_namespace(cluster, "pg")
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "db", "namespace": namespace},
        "spec": {"version": "15", "replicas": 1, "storage": {"size": "1Gi"}},
    }
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(instance))
    wait_for(
        lambda: instance_ready(cluster, namespace, "db"),
        f"postgresinstance {namespace}/db Ready",
        240,
        lambda: diagnostics(cluster, namespace, "postgresinstance db"),
    )
    TIMINGS["postgres_1_replica_apply_to_ready"] = time.monotonic() - started

    log = succeeded(
        cluster,
        namespace,
        "client",
        connecting(
            *("psql", "-h", "db-primary", "-U", "postgres", "-d", "postgres"),
            *("-tAc", "SELECT 'answer:' || (6 * 7)"),
        ),
        env=[secret_env("PGPASSWORD", "db-superuser", "password")],
    )
    assert "answer:42" in log, f"{log}\n{diagnostics(cluster, namespace, 'postgresinstance db')}"
    cluster.kubectl("delete", "postgresinstance", "db", "-n", namespace, timeout=180)
