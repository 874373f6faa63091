"""Short-lived client Pods of the end-to-end tests: run a command in the PostgreSQL image
(it has psql) and read what it printed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import diagnostics, wait_for

CLIENT_IMAGE = "postgres:15"


@dataclass(frozen=True)
class Finished:
    name: str
    phase: str
    log: str


def run_pod(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    script: str,
    *,
    env: list[dict[str, Any]] | None = None,
    mounts: dict[str, dict[str, Any]] | None = None,
    timeout: float = 120,
) -> Finished:
    """Run ``script`` with bash in a fresh Pod ``name`` (never restarted) until it ends;
    ``mounts`` maps a mount path to a volume source (``{"secret": {...}}``, ...). Returns its
    phase (``Succeeded`` or ``Failed``) and its output; the Pod is deleted afterwards."""
    volumes = [{"name": f"v{i}", **source} for i, source in enumerate((mounts or {}).values())]
    volume_mounts = [
        {"name": f"v{i}", "mountPath": path, "readOnly": True}
        for i, path in enumerate((mounts or {}).keys())
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "client",
                    "image": CLIENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/bash", "-c", script],
                    "env": [{"name": "HOME", "value": "/tmp"}, *(env or [])],
                    "volumeMounts": volume_mounts,
                }
            ],
            "volumes": volumes,
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))

    def phase() -> str:
        return cluster.kubectl(
            "get", "pod", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
        ).strip()

    wait_for(
        lambda: phase() in ("Succeeded", "Failed"),
        f"pod {namespace}/{name} finishing",
        timeout,
        lambda: diagnostics(cluster, namespace, f"pod {name}"),
    )
    finished = Finished(name, phase(), cluster.kubectl("logs", "-n", namespace, name, check=False))
    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)
    return finished


def secret_env(variable: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def condition(
    cluster: LocalCluster, kind: str, namespace: str, name: str, type_: str
) -> dict[str, Any]:
    """Condition ``type_`` of an object (``{}`` when the object or the condition is absent)."""
    out = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if not out.strip():
        return {}
    for found in (json.loads(out).get("status") or {}).get("conditions") or []:
        if found.get("type") == type_:
            return dict(found)
    return {}
