"""Failover, switchover and rolling updates of a 3-replica synchronous (ZeroLoss) instance on
the real node, under a writing application (tests/e2e/traffic.py) that commits one row per
statement through ``<name>-primary`` and samples which members are writable.

The scenarios run in order on one instance, each from a healthy one (a primary and two
standbys streaming from it, labelled so):

1. the primary's postmaster is killed with SIGKILL from the host;
2. the primary's Pod is deleted (as a drain does);
3. a switchover is asked for with the ``postgres.crpy.io/switchover-to`` annotation;
4. a parameter change rolls every Pod (standbys first, a switchover, the old primary last).

After each: a new primary serves and the application commits through it, every acknowledged
row is on every member, the old primary is back as a streaming standby, no sample saw two
writable members, and the write gap (last acknowledgement before the fault to the first
after) is recorded in the session's timings (docs/e2e.md; never asserted: numbers are
measured, not tested).

``CRPY_HA_ROUNDS=N`` (``make e2e-ha-numbers``: 10) repeats each scenario N times on the same
instance and writes every write gap, with medians and worst cases, to
``$CRPY_HA_RESULTS`` (default ``ha-numbers.json`` in the working directory; with
test_failover_nodes.py's numbers when both run).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e import ha
from tests.e2e.ha import BOOT_TIMEOUT, NAME, RECOVERY_TIMEOUT, ROUNDS, app_log
from tests.e2e.support import TIMINGS, diagnostics, get_json, new_namespace, wait_for
from tests.e2e.traffic import double_primaries, errors_between, start_app, write_gap

REPLICAS = 3


def healthy(cluster: LocalCluster, namespace: str, *, not_: str | None = None) -> str | None:
    return ha.healthy(cluster, namespace, REPLICAS, not_=not_)


def wait_healthy(
    cluster: LocalCluster, namespace: str, what: str, timeout: float, *, not_: str | None = None
) -> str:
    return ha.wait_healthy(cluster, namespace, REPLICAS, what, timeout, not_=not_)


@pytest.fixture(scope="module")
def instance(cluster: LocalCluster, operator: str) -> Iterator[str]:
    """A 3-replica ZeroLoss instance, healthy, with the application writing to it."""
    namespace = new_namespace(cluster, "ha")
    started = time.monotonic()
    ha.apply_instance(cluster, namespace, REPLICAS, replication={"synchronous": {"number": 1}})
    wait_healthy(cluster, namespace, "healthy with 3 members", BOOT_TIMEOUT)
    TIMINGS["ha_3_replicas_apply_to_healthy"] = time.monotonic() - started
    start_app(cluster, namespace, NAME, REPLICAS, operator)
    wait_for(
        lambda: len(app_log(cluster, namespace).acks) >= 20,
        f"the application in {namespace} committing",
        120,
        lambda: diagnostics(cluster, namespace, "pod app"),
    )
    yield namespace
    if ROUNDS > 1:
        ha.write_numbers()
    cluster.kubectl("delete", "pod", "app", "-n", namespace, "--wait=false", check=False)
    cluster.kubectl(
        "delete", "postgresinstance", NAME, "-n", namespace, "--wait=false", check=False, timeout=60
    )


def check_after(
    cluster: LocalCluster, namespace: str, fault: str, *, old: str, since: float, new: str
) -> None:
    """The checks every scenario ends with (module docs); records the write gap."""
    wait_for(
        lambda: app_log(cluster, namespace).acked_after(since) >= 10,
        f"{namespace}: the application committing through the new primary {new}",
        RECOVERY_TIMEOUT,
        lambda: diagnostics(cluster, namespace, "pod app"),
    )
    log = app_log(cluster, namespace)
    acked = log.acked_ids()
    for i in range(REPLICAS):
        ha.holds_all(cluster, namespace, f"{NAME}-{i}", acked, fault)
    assert ha.roles(cluster, namespace)[old] == "replica", f"{old} did not rejoin as a standby"
    doubles = double_primaries(log)
    assert doubles == [], f"{namespace}: two writable members after {fault}: {doubles[:5]}"
    gap = write_gap(log, since)
    TIMINGS[f"ha_write_gap_{fault}"] = gap
    ha.record(fault, gap)
    errors = errors_between(log, since, since + gap + 1)
    print(f"\n{fault}: {old} -> {new}, write gap {gap:.2f} s, errors {errors}")


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_postmaster_killed_from_the_host(cluster: LocalCluster, instance: str, round_: int) -> None:
    namespace = instance
    old = wait_healthy(cluster, namespace, "healthy", RECOVERY_TIMEOUT)
    pid = ha.postmaster_pid(cluster, namespace, old)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    new = wait_healthy(cluster, namespace, f"failed over from {old}", RECOVERY_TIMEOUT, not_=old)
    check_after(cluster, namespace, "postmaster_kill", old=old, since=killed_at, new=new)
    found = ha.status(cluster, namespace)
    assert found["failovers"] >= 1 and found["lastTransitionSeconds"] > 0


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_primary_pod_deleted(cluster: LocalCluster, instance: str, round_: int) -> None:
    namespace = instance
    old = wait_healthy(cluster, namespace, "healthy", RECOVERY_TIMEOUT)
    before = ha.status(cluster, namespace).get("switchovers") or 0
    deleted_at = time.time()
    cluster.kubectl("delete", "pod", old, "-n", namespace, "--wait=false")
    new = wait_healthy(cluster, namespace, f"switched over from {old}", RECOVERY_TIMEOUT, not_=old)
    check_after(cluster, namespace, "primary_pod_delete", old=old, since=deleted_at, new=new)
    assert (ha.status(cluster, namespace).get("switchovers") or 0) == before + 1


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_switchover_by_annotation(cluster: LocalCluster, instance: str, round_: int) -> None:
    namespace = instance
    old = wait_healthy(cluster, namespace, "healthy", RECOVERY_TIMEOUT)
    target = next(f"{NAME}-{i}" for i in range(REPLICAS) if f"{NAME}-{i}" != old)
    asked_at = time.time()
    cluster.kubectl(
        "annotate", "postgresinstance", NAME, "-n", namespace,
        f"postgres.crpy.io/switchover-to={target}",
    )  # fmt: skip
    new = wait_healthy(cluster, namespace, f"switched over to {target}", RECOVERY_TIMEOUT, not_=old)
    assert new == target
    check_after(cluster, namespace, "switchover", old=old, since=asked_at, new=new)
    annotations = (
        get_json(cluster, "postgresinstance", NAME, "-n", namespace)["metadata"].get("annotations")
        or {}
    )
    assert "postgres.crpy.io/switchover-to" not in annotations


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_rolling_parameter_change(cluster: LocalCluster, instance: str, round_: int) -> None:
    namespace = instance
    old = wait_healthy(cluster, namespace, "healthy", RECOVERY_TIMEOUT)
    before = ha.status(cluster, namespace).get("switchovers") or 0
    changed_at = time.time()
    cluster.kubectl(
        "patch", "postgresinstance", NAME, "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"parameters": {"max_connections": str(120 + round_)}}}),
    )  # fmt: skip

    def rolled() -> bool:
        sts = get_json(cluster, "statefulset", NAME, "-n", namespace)
        return (sts.get("status") or {}).get("updatedReplicas") == REPLICAS and (
            healthy(cluster, namespace, not_=old) is not None
        )

    wait_for(
        rolled,
        f"postgresinstance {namespace}/{NAME}: every Pod rolled, the primary moved off {old}",
        RECOVERY_TIMEOUT * 2,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {NAME}"),
    )
    new = healthy(cluster, namespace, not_=old)
    assert new is not None
    for i in range(REPLICAS):
        value = cluster.kubectl(
            "exec", "-n", namespace, f"{NAME}-{i}", "-c", "postgres", "--",
            "psql", "-U", "postgres", "-tAc", "SHOW max_connections",
        ).strip()  # fmt: skip
        assert value == str(120 + round_), f"{namespace}/{NAME}-{i}: max_connections {value!r}"
    check_after(cluster, namespace, "rolling_update", old=old, since=changed_at, new=new)
    assert (ha.status(cluster, namespace).get("switchovers") or 0) == before + 1
