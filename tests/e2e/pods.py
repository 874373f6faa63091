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
from tests.e2e.connect import (
    PRELUDE,
    Note,
    Sample,
    connecting,
    parse_probe,
    probe_script,
    split_note,
)
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


def exec_in(
    cluster: LocalCluster,
    namespace: str,
    pod: str,
    script: str,
    *,
    container: str | None = None,
    timeout: float = 120,
) -> str:
    """Run ``script`` with bash (after ``connect.PRELUDE``) in the running Pod ``pod`` (its
    ``container``, else the Pod's default one); its output with both streams, ending with
    ``exit:<status>`` (never raises on a failure; when kubectl itself fails, e.g. the
    container is not running, there is no ``exit:`` line). ``timeout`` bounds the whole
    exec: keep it above ``connect.RETRY_SECONDS`` plus one attempt."""
    target = ["-c", container] if container else []
    out = cluster.kubectl(
        "exec", "-n", namespace, pod, *target, "--", "bash", "-c", exec_script(script),
        check=False, timeout=timeout,
    )  # fmt: skip
    log, note = split_note(out)
    record(namespace, pod, note)
    return log


def exec_script(script: str) -> str:
    """What :func:`exec_in` runs with bash: the prelude, ``script`` with its stderr on its
    stdout, then ``exit:<status>``."""
    return f"{PRELUDE}\n{{ {script}\n}} 2>&1; echo exit:$?"


def exec_status(output: str) -> tuple[str, int | None]:
    """:func:`exec_in`'s output split into what the script printed and its exit status
    (``None`` when the script did not finish: kubectl itself failed)."""
    body, marker, status = output.rpartition("exit:")
    if not marker or not status.strip().isdigit():
        return output, None
    return body, int(status.strip())


def psql_in(cluster: LocalCluster, namespace: str, pod: str, query: str) -> str:
    """``query``'s rows (``psql -tA``: ``|``-separated) as run by the superuser over the
    local socket of ``pod``'s ``postgres`` container, through :func:`exec_in` (a server
    still starting up is retried, connect.py); raises ``AssertionError`` with psql's or
    kubectl's error when it fails."""
    command = connecting(
        "psql", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "postgres", "-tAc", query
    )
    output, status = exec_status(
        exec_in(cluster, namespace, pod, command, container="postgres", timeout=90)
    )
    if status is None:
        raise AssertionError(
            f"kubectl exec into pod {namespace}/{pod} (container postgres) failed before psql "
            f"ended (is the container running?): {query!r}: {output.strip()[-2000:]!r}"
        )
    if status != 0:
        raise AssertionError(
            f"psql in pod {namespace}/{pod} failed (exit {status}): {query!r}: "
            f"{output.strip()[-2000:]}"
        )
    return output.strip()


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
