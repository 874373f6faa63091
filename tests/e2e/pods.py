"""Short-lived client Pods of the end-to-end tests: run a command in the PostgreSQL image
(it has psql) and read what it printed; run a command in a running Pod.

Every script runs after ``connect.PRELUDE``: a command written as ``retry_connect CMD ...``
(``connect.connecting``) retries connection failures for a bounded time, as an application
would, and says so when it gives up (tests/e2e/connect.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.connect import PRELUDE, Note, Sample, parse_probe, probe_script, split_note
from tests.e2e.support import TIMINGS, diagnostics, wait_for

CLIENT_IMAGE = "postgres:15"


@dataclass(frozen=True)
class Finished:
    name: str
    phase: str
    log: str
    """What the Pod printed, without ``retry_connect``'s note of a retried success."""
    note: Note | None = None
    """That note: how long the connection took to work (``None``: the first attempt did)."""


def record(namespace: str, name: str, note: Note | None) -> None:
    """Keep a retried connection's seconds in the session's timings (docs/e2e.md)."""
    if note is not None:
        TIMINGS[f"connect_retried_{namespace}/{name}"] = note.seconds


def run_pod(
    cluster: LocalCluster,
    namespace: str,
    name: str,
    script: str,
    *,
    image: str = CLIENT_IMAGE,
    env: list[dict[str, Any]] | None = None,
    mounts: dict[str, dict[str, Any]] | None = None,
    timeout: float = 120,
) -> Finished:
    """Run ``script`` with bash (after ``connect.PRELUDE``) in a fresh Pod ``name`` (never
    restarted) until it ends; ``mounts`` maps a mount path to a volume source
    (``{"secret": {...}}``, ...). Returns its phase (``Succeeded`` or ``Failed``) and its
    output; the Pod is deleted afterwards."""
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
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/bash", "-c", PRELUDE + script],
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
    log, note = split_note(cluster.kubectl("logs", "-n", namespace, name, check=False))
    record(namespace, name, note)
    finished = Finished(name, phase(), log, note)
    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)
    return finished


def succeeded(cluster: LocalCluster, namespace: str, name: str, script: str, **options: Any) -> str:
    """:func:`run_pod`'s output, or fail naming the Pod with its output and diagnostics."""
    done = run_pod(cluster, namespace, name, script, **options)
    assert done.phase == "Succeeded", (
        f"pod {namespace}/{name} failed: {done.log}\n"
        f"{diagnostics(cluster, namespace, f'pod {name}')}"
    )
    return done.log


def exec_in(cluster: LocalCluster, namespace: str, pod: str, script: str) -> str:
    """Run ``script`` with bash (after ``connect.PRELUDE``) in the running Pod ``pod``; its
    output with both streams, ending with ``exit:<status>`` (never raises on a failure)."""
    out = cluster.kubectl(
        "exec", "-n", namespace, pod, "--", "bash", "-c",
        f"{PRELUDE}\n{{ {script}\n}} 2>&1; echo exit:$?",
        check=False,
    )  # fmt: skip
    log, note = split_note(out)
    record(namespace, pod, note)
    return log


@contextlib.contextmanager
def probing(
    cluster: LocalCluster, namespace: str, name: str, host: str, port: int
) -> Iterator[Callable[[], list[Sample]]]:
    """A Pod ``name`` connecting to ``host``:``port`` every 0.2 s while the block runs
    (``connect.probe_script``); yields a function that returns its attempts so far. Starts
    once the Pod has printed its first attempt; the Pod is deleted on exit."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "probe",
                    "image": CLIENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/bash", "-c", PRELUDE + probe_script(host, port)],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))

    def samples() -> list[Sample]:
        return parse_probe(cluster.kubectl("logs", "-n", namespace, name, check=False))

    try:
        wait_for(
            lambda: bool(samples()),
            f"pod {namespace}/{name} probing {host}:{port}",
            120,
            lambda: diagnostics(cluster, namespace, f"pod {name}"),
        )
        yield samples
    finally:
        cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)


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
