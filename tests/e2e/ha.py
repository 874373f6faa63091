"""Helpers of the high-availability end-to-end tests (test_failover.py, test_failover_nodes.py):
a replicated instance, whether it is healthy (a primary and every other member streaming from
it, labelled so), the rows each member holds, the host's PID of a postmaster."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import diagnostics, get_json, wait_for
from tests.e2e.traffic import Log, parse

NAME = "db"
POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {"defaultImage": "postgres:{version}", "versions": [{"version": "15"}]},
}
BOOT_TIMEOUT = 300.0
RECOVERY_TIMEOUT = 180.0
LABEL_ROLE = "postgres.crpy.io/role"
ROUNDS = max(1, int(os.environ.get("CRPY_HA_ROUNDS", "1")))
"""How often each scenario runs (``make e2e-ha-numbers``: 10; ``make e2e``: once)."""
GAPS: dict[str, list[float]] = {}
"""Every write gap (and isolated primary's last acknowledgement) measured, per scenario."""


def record(scenario: str, seconds: float) -> None:
    GAPS.setdefault(scenario, []).append(seconds)


def write_numbers() -> None:
    """Every round's numbers, and per scenario the median and the worst, to
    ``$CRPY_HA_RESULTS`` (default ``ha-numbers.json``); every module of scenarios calls it at
    its end, so the file holds all the session measured so far."""
    summary = {
        scenario: {
            "rounds": len(values),
            "median": round(statistics.median(values), 3),
            "worst": round(max(values), 3),
            "values": [round(v, 3) for v in values],
        }
        for scenario, values in GAPS.items()
    }
    path = Path(os.environ.get("CRPY_HA_RESULTS", "ha-numbers.json"))
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nover {ROUNDS} round(s) each (written to {path}):")
    for scenario, numbers in summary.items():
        print(f"  {scenario}: median {numbers['median']:.2f} s, worst {numbers['worst']:.2f} s")


def apply_instance(cluster: LocalCluster, namespace: str, replicas: int, **spec: Any) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    body = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "version": "15",
            "replicas": replicas,
            "storage": {"size": "1Gi"},
            "deletionPolicy": "Delete",
            **spec,
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))


def status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    instance = get_json(cluster, "postgresinstance", NAME, "-n", namespace)
    return dict(instance.get("status") or {})


def pods(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    found = get_json(cluster, "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}")
    return {p["metadata"]["name"]: p for p in found.get("items", [])}


def roles(cluster: LocalCluster, namespace: str) -> dict[str, str]:
    """Each Pod's role label (Pods being deleted left out)."""
    return {
        name: (p["metadata"].get("labels") or {}).get(LABEL_ROLE, "")
        for name, p in pods(cluster, namespace).items()
        if not p["metadata"].get("deletionTimestamp")
    }


def healthy(
    cluster: LocalCluster,
    namespace: str,
    replicas: int,
    *,
    not_: str | None = None,
    absent: Iterable[str] = (),
) -> str | None:
    """The primary's name when the instance is healthy: a primary (not ``not_``) serving,
    every other member but ``absent`` streaming from it, the labels saying so."""
    found = status(cluster, namespace)
    current = found.get("currentPrimary")
    available = {c["type"]: c for c in found.get("conditions") or []}.get("PrimaryAvailable")
    if (found.get("ha") or {}).get("phase") != "Healthy" or not current or current == not_:
        return None
    if not available or available.get("status") != "True":
        return None
    skip = set(absent)
    labels = {n: r for n, r in roles(cluster, namespace).items() if n not in skip}
    expected = {f"{NAME}-{i}": "replica" for i in range(replicas) if f"{NAME}-{i}" not in skip}
    expected[current] = "primary"
    return str(current) if labels == expected else None


def wait_healthy(
    cluster: LocalCluster,
    namespace: str,
    replicas: int,
    what: str,
    timeout: float,
    *,
    not_: str | None = None,
    absent: Iterable[str] = (),
) -> str:
    """The primary's name from the first observation that found the instance healthy (a
    second read could catch the moment after, e.g. a rejoining member's label changing)."""
    skip = tuple(absent)
    seen: list[str] = []

    def check() -> bool:
        primary = healthy(cluster, namespace, replicas, not_=not_, absent=skip)
        if primary is not None:
            seen.append(primary)
        return primary is not None

    wait_for(
        check,
        f"postgresinstance {namespace}/{NAME}: {what}",
        timeout,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {NAME}"),
    )
    return seen[-1]


def app_log(cluster: LocalCluster, namespace: str, pod: str = "app") -> Log:
    return parse(cluster.kubectl("logs", "-n", namespace, pod, check=False, timeout=60))


def rows_on(
    cluster: LocalCluster, namespace: str, pod: str, table: str = "acked"
) -> set[int] | None:
    out = cluster.kubectl(
        "exec", "-n", namespace, pod, "-c", "postgres", "--",
        "psql", "-U", "postgres", "-d", "postgres", "-tAc", f"SELECT id FROM {table}",
        check=False, timeout=60,
    )  # fmt: skip
    try:
        return {int(line) for line in out.split()}
    except ValueError:
        return None


def holds_all(
    cluster: LocalCluster,
    namespace: str,
    pod: str,
    acked: set[int],
    after: str,
    *,
    table: str = "acked",
) -> None:
    """Until ``pod`` holds every row of ``acked`` in ``table`` (it may be catching up or
    restarting)."""

    def check() -> bool:
        return (rows_on(cluster, namespace, pod, table) or set()) >= acked

    def describe() -> str:
        missing = sorted(acked - (rows_on(cluster, namespace, pod, table) or set()))
        return f"missing: {missing[:20]}\n" + diagnostics(cluster, namespace, f"pod {pod}")

    wait_for(
        check,
        f"{namespace}/{pod} holding all {len(acked)} acknowledged rows of {table} after {after}",
        RECOVERY_TIMEOUT,
        describe,
    )


def postmaster_pid(cluster: LocalCluster, namespace: str, pod: str) -> int:
    """The host's PID of ``pod``'s postmaster: the process of its postgres container (by the
    container's ID in its cgroup) started as ``postgres -D``."""
    found = get_json(cluster, "pod", pod, "-n", namespace)
    (container,) = [c for c in found["status"]["containerStatuses"] if c["name"] == "postgres"]
    container_id = container["containerID"].split("://", 1)[-1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if container_id not in (proc / "cgroup").read_text():
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"postgres") and b"-D" in argv:
            return int(proc.name)
    raise AssertionError(f"no postmaster of pod {namespace}/{pod} among the host's processes")
