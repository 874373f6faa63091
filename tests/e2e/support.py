"""Helpers of the end-to-end tests: waiting on the cluster, and failure messages that name
the object and carry the operator's and the Pod's logs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.failures import NamespaceLog

OPERATOR_NAMESPACE = "crpy-system"
NAMESPACES = NamespaceLog()
"""Which test made which namespace (``new_namespace``), for the failure sections."""
OPERATOR_SELECTOR = "app.kubernetes.io/name=crpy-operator"
TIMINGS: dict[str, float] = {}
"""Numbers the tests measure; printed at the end of the session (docs/e2e.md)."""


@dataclass(frozen=True)
class Images:
    operator: str
    operator_archive: Path
    postgres_archive: Path
    aws_cli_archive: Path


def get_json(cluster: LocalCluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


def namespace_state(cluster: LocalCluster, namespace: str) -> str:
    """A namespace's objects, its events, ``kubectl describe`` of its Pods that are not
    Running and ready or Succeeded, and every Pod's logs."""
    parts = [cluster.kubectl("get", "all", "-n", namespace, "-o", "wide", check=False)]
    parts.append(
        cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False)[
            -4000:
        ]
    )
    pods = json.loads(
        cluster.kubectl("get", "pods", "-n", namespace, "-o", "json", check=False)
        or '{"items": []}'
    )
    for pod in pods.get("items", []):
        name = pod["metadata"]["name"]
        if not _pod_fine(pod):
            parts.append(f"--- describe pod {namespace}/{name}")
            described = cluster.kubectl("describe", "pod", name, "-n", namespace, check=False)
            parts.append(described[-3000:])
        parts.append(f"--- logs of pod {namespace}/{name}")
        parts.append(
            cluster.kubectl(
                "logs", "-n", namespace, name, "--all-containers", "--tail=40", check=False
            )
        )
    return "\n".join(parts)


def _pod_fine(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") == "Succeeded":
        return True
    ready = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return status.get("phase") == "Running" and ready.get("Ready") == "True"


def operator_logs(cluster: LocalCluster) -> str:
    """The last lines of each operator replica's log, each line prefixed with its Pod."""
    return cluster.kubectl(
        "logs",
        "-n",
        OPERATOR_NAMESPACE,
        "-l",
        OPERATOR_SELECTOR,
        "--tail=60",
        "--prefix",
        check=False,
    )


def diagnostics(cluster: LocalCluster, namespace: str, what: str) -> str:
    """What a failing test prints: the object, the namespace's Pods with their logs and
    events, and the operator's logs."""
    parts = [f"--- {what} in namespace {namespace}", namespace_state(cluster, namespace)]
    if namespace != OPERATOR_NAMESPACE:
        parts += ["--- operator logs", operator_logs(cluster)]
    return "\n".join(parts)


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout: float,
    describe: Callable[[], str] = lambda: "",
) -> float:
    """Poll ``condition`` until true; return the seconds it took. On timeout fail with
    ``what`` and ``describe()`` (diagnostics)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"{what}: not reached within {timeout:.0f}s\n{describe()}")


def new_namespace(cluster: LocalCluster, prefix: str) -> str:
    """A fresh namespace whose ``default`` ServiceAccount exists (the controller-manager
    makes it; a Pod created before it is refused)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    NAMESPACES.made(name)
    wait_for(
        lambda: bool(
            cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).strip()
        ),
        f"serviceaccount {name}/default",
        60,
    )
    return name
