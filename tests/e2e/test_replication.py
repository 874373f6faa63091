"""Replication of an in-cluster PostgresInstance on a real node: scaling 1 → 3 gives two
standbys streaming from pod 0 (one synchronous: ``synchronous: {number: 1}``) that serve a row
written on the primary; scaling 3 → 1 leaves a Ready one-pod instance with its data; a
parameter change rolls every Pod and the new value is live on each.

Every SQL statement runs in the Pod itself (``kubectl exec … psql`` over the local socket,
through ``pods.psql_in``: a server still starting up is retried as an application would), so
each standby is asked directly, not through a Service."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.pods import psql_in
from tests.e2e.support import TIMINGS, diagnostics, get_json, new_namespace, wait_for

NAME = "db"
POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {"defaultImage": "postgres:{version}", "versions": [{"version": "15"}]},
}
READY_TIMEOUT = 200.0
"""Generous for a loaded 2-core machine: one pod's start is about 10 s when idle."""


@pytest.fixture
def namespace(cluster: LocalCluster, operator: str) -> Iterator[str]:
    """A fresh namespace with the version policy applied; the instance is deleted at the end
    (its claims with it: ``deletionPolicy: Delete``) so later tests get the node's CPU back."""
    name = new_namespace(cluster, "repl")
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    yield name
    cluster.kubectl(
        "delete", "postgresinstance", NAME, "-n", name, "--wait=false", check=False, timeout=60
    )


def _apply_instance(cluster: LocalCluster, namespace: str, **spec: Any) -> None:
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {"version": "15", "storage": {"size": "1Gi"}, "deletionPolicy": "Delete", **spec},
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(instance))


def _patch_instance(cluster: LocalCluster, namespace: str, patch: dict[str, Any]) -> None:
    cluster.kubectl(
        "patch", "postgresinstance", NAME, "-n", namespace, "--type=merge", "-p", json.dumps(patch)
    )


def _ready_with(cluster: LocalCluster, namespace: str, replicas: int) -> bool:
    """Ready for the latest spec (observedGeneration caught up) with ``replicas`` ready."""
    instance = get_json(cluster, "postgresinstance", NAME, "-n", namespace)
    status = instance.get("status") or {}
    ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready")
    return (
        ready == "True"
        and status.get("observedGeneration") == instance["metadata"]["generation"]
        and status.get("readyReplicas") == replicas
    )


def _wait_ready(cluster: LocalCluster, namespace: str, replicas: int) -> float:
    return wait_for(
        lambda: _ready_with(cluster, namespace, replicas),
        f"postgresinstance {namespace}/{NAME} Ready with {replicas} replicas",
        READY_TIMEOUT,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {NAME}"),
    )


def _psql(cluster: LocalCluster, namespace: str, ordinal: int, query: str) -> str:
    """``query``'s rows (``|``-separated) as run by the superuser inside pod ``ordinal``
    (``pods.psql_in``: after the shared prelude, so a server still starting up is retried);
    raises with psql's error when it fails."""
    return psql_in(cluster, namespace, f"{NAME}-{ordinal}", query)


def _try_psql(cluster: LocalCluster, namespace: str, ordinal: int, query: str) -> str | None:
    try:
        return _psql(cluster, namespace, ordinal, query)
    except Exception:
        return None


def _primary(cluster: LocalCluster, namespace: str) -> int:
    """The ordinal of the instance's current primary (``status.currentPrimary``)."""
    instance = get_json(cluster, "postgresinstance", NAME, "-n", namespace)
    current = str((instance.get("status") or {}).get("currentPrimary") or f"{NAME}-0")
    return int(current.rsplit("-", 1)[1])


def _replication_rows(cluster: LocalCluster, namespace: str) -> list[tuple[str, str]]:
    """(state, sync_state) of each standby connected to the primary, sorted."""
    out = _try_psql(
        cluster,
        namespace,
        _primary(cluster, namespace),
        "SELECT state, sync_state FROM pg_stat_replication ORDER BY 1, 2",
    )
    rows = [tuple(line.split("|")) for line in (out or "").splitlines() if line]
    return [(row[0], row[1]) for row in rows if len(row) == 2]


def _pods(cluster: LocalCluster, namespace: str) -> list[str]:
    pods = get_json(
        cluster, "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}"
    ).get("items", [])
    return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))


def _write_marker(cluster: LocalCluster, namespace: str) -> str:
    marker = f"row-{uuid.uuid4().hex[:8]}"
    _psql(
        cluster,
        namespace,
        _primary(cluster, namespace),
        f"CREATE TABLE IF NOT EXISTS marks (v text); INSERT INTO marks VALUES ('{marker}')",
    )
    return marker


def _wait_row(cluster: LocalCluster, namespace: str, ordinal: int, marker: str) -> None:
    wait_for(
        lambda: (
            _try_psql(cluster, namespace, ordinal, f"SELECT v FROM marks WHERE v = '{marker}'")
            == marker
        ),
        f"row {marker!r} written on the primary of {namespace}/{NAME} readable on pod "
        f"{NAME}-{ordinal}",
        60,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {NAME}"),
    )


def test_scale_to_three_gives_two_streaming_standbys_one_synchronous(
    cluster: LocalCluster, namespace: str
) -> None:
    _apply_instance(cluster, namespace, replicas=1, replication={"synchronous": {"number": 1}})
    _wait_ready(cluster, namespace, 1)
    marker = _write_marker(cluster, namespace)

    started = time.monotonic()
    _patch_instance(cluster, namespace, {"spec": {"replicas": 3}})
    _wait_ready(cluster, namespace, 3)
    TIMINGS["postgres_scale_1_to_3_to_ready"] = time.monotonic() - started
    wait_for(
        lambda: (
            [state for state, _ in _replication_rows(cluster, namespace)]
            == ["streaming", "streaming"]
        ),
        f"two standbys of {namespace}/{NAME} streaming (pg_stat_replication on the primary)",
        # 30-93 s measured: after pod 0 rolls, a standby may take a minute to reconnect.
        180,
        lambda: (
            f"rows: {_replication_rows(cluster, namespace)}\n"
            + diagnostics(cluster, namespace, f"postgresinstance {NAME}")
        ),
    )
    TIMINGS["postgres_scale_1_to_3_to_streaming"] = time.monotonic() - started

    # synchronous number 1 waits for exactly one standby; the other one is its stand-in.
    rows = _replication_rows(cluster, namespace)
    assert sorted(sync for _, sync in rows) == ["potential", "sync"], (
        f"postgresinstance {namespace}/{NAME}: pg_stat_replication (state, sync_state) = "
        f"{rows}\n{diagnostics(cluster, namespace, f'postgresinstance {NAME}')}"
    )
    primary = _primary(cluster, namespace)
    standbys = [o for o in range(3) if o != primary]
    names = _psql(cluster, namespace, primary, "SELECT application_name FROM pg_stat_replication")
    assert sorted(names.split()) == [f"{NAME}-{o}" for o in standbys], (
        f"{namespace}/{NAME}: standbys should name themselves after their pods: {names!r}"
    )
    for ordinal in standbys:
        recovery = _psql(cluster, namespace, ordinal, "SELECT pg_is_in_recovery()")
        assert recovery == "t", f"{namespace}/{NAME}-{ordinal} is not a standby: {recovery!r}"
        _wait_row(cluster, namespace, ordinal, marker)
    later = _write_marker(cluster, namespace)  # written while both stream
    for ordinal in standbys:
        _wait_row(cluster, namespace, ordinal, later)


def test_scale_back_to_one_keeps_the_data(cluster: LocalCluster, namespace: str) -> None:
    started = time.monotonic()
    _apply_instance(cluster, namespace, replicas=3, replication={"synchronous": {"number": 1}})
    _wait_ready(cluster, namespace, 3)
    TIMINGS["postgres_3_replicas_apply_to_ready"] = time.monotonic() - started
    marker = _write_marker(cluster, namespace)

    _patch_instance(cluster, namespace, {"spec": {"replicas": 1}})
    _wait_ready(cluster, namespace, 1)
    wait_for(
        lambda: _pods(cluster, namespace) == [f"{NAME}-0"],
        f"postgresinstance {namespace}/{NAME} down to pod {NAME}-0 only",
        120,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {NAME}"),
    )
    kept = _psql(cluster, namespace, 0, f"SELECT v FROM marks WHERE v = '{marker}'")
    assert kept == marker, (
        f"postgresinstance {namespace}/{NAME} scaled 3 → 1: row {marker!r} read on pod "
        f"{NAME}-0 as {kept!r}"
    )
    # Without standbys, a commit must not wait for one (synchronous mode is off at 1 replica).
    later = _write_marker(cluster, namespace)
    count = _psql(cluster, namespace, 0, f"SELECT count(*) FROM marks WHERE v = '{later}'")
    assert count == "1", (
        f"postgresinstance {namespace}/{NAME} at 1 replica: row {later!r} written on pod "
        f"{NAME}-0 counted {count!r} times"
    )
    settings = _psql(cluster, namespace, 0, "SHOW synchronous_standby_names")
    assert settings == "", f"pod {namespace}/{NAME}-0 still waits for standbys: {settings!r}"


def test_parameter_change_rolls_the_pods_and_is_live(cluster: LocalCluster, namespace: str) -> None:
    # max_connections only takes effect at a server restart: it proves the pods were rolled.
    _apply_instance(cluster, namespace, replicas=2, parameters={"max_connections": "100"})
    _wait_ready(cluster, namespace, 2)
    before = {o: _psql(cluster, namespace, o, "SELECT pg_postmaster_start_time()") for o in (0, 1)}

    _patch_instance(cluster, namespace, {"spec": {"parameters": {"max_connections": "140"}}})
    _wait_ready(cluster, namespace, 2)
    for ordinal in (0, 1):
        value = _psql(cluster, namespace, ordinal, "SHOW max_connections")
        assert value == "140", (
            f"{namespace}/{NAME}-{ordinal}: max_connections is {value!r}, not 140\n"
            f"{diagnostics(cluster, namespace, f'postgresinstance {NAME}')}"
        )
        restarted = _psql(cluster, namespace, ordinal, "SELECT pg_postmaster_start_time()")
        assert restarted != before[ordinal], f"{namespace}/{NAME}-{ordinal} was not restarted"
    wait_for(
        lambda: [state for state, _ in _replication_rows(cluster, namespace)] == ["streaming"],
        f"the standby of {namespace}/{NAME} streaming again after the roll",
        120,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {NAME}"),
    )
