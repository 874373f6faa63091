"""Helpers of the multi-node tests: a small web server Pod pinned to a node (it answers with
the name of the node it runs on), a client Pod pinned to a node, and fetching a URL from
inside a Pod with a bounded wait.

The servers run Python's ``http.server`` in the operator's image (it has Python; the Pods run
as its user 65532). A fetch prints the body, or one line ``error: <reason>``: ``timed out``
when nothing answered within the bound (a partitioned or frozen peer), the socket's error
otherwise. Fetches for reachability (not for a fault) run under ``retry_connect`` so that
kube-proxy and CoreDNS may catch up first (tests/e2e/connect.py).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.pods import exec_in
from tests.e2e.support import diagnostics, get_json, wait_for

PORT = 8080
SERVE = f"""
cd /tmp && printf '%s' "$NODE_NAME" > index.html && exec python -m http.server {PORT}
"""
FETCH = r"""
import socket, sys, urllib.request
try:
    body = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode()
    print(body)
except Exception as err:
    reason = getattr(err, "reason", err)
    if isinstance(reason, (TimeoutError, socket.timeout)):
        print("error: timed out (Connection timed out)")
    else:
        print(f"error: {reason}")
    sys.exit(1)
"""


def _pinned(node: str) -> dict[str, Any]:
    return {"nodeSelector": {"kubernetes.io/hostname": node}}


def serve_on(cluster: LocalCluster, namespace: str, node: str, image: str) -> str:
    """A web server Pod ``web-<node>`` on ``node`` (labels ``app=web``, ``node=<node>``) and
    a Service of the same name selecting it; returns the Pod's name once it is Ready."""
    name = f"web-{node}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web", "node": node}},
        "spec": {
            **_pinned(node),
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "web",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/bash", "-c", SERVE],
                    "env": [
                        {
                            "name": "NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        }
                    ],
                    "readinessProbe": {
                        "tcpSocket": {"port": PORT},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"app": "web", "node": node}, "ports": [{"port": PORT}]},
    }
    for obj in (pod, service):
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(obj))
    return name


def client_on(cluster: LocalCluster, namespace: str, node: str, image: str) -> str:
    """A Pod ``client-<node>`` on ``node`` that sleeps (tests ``kubectl exec`` into it)."""
    name = f"client-{node}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            **_pinned(node),
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "client",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))
    return name


def wait_ready(cluster: LocalCluster, namespace: str, *pods: str, timeout: float = 180) -> None:
    for pod in pods:
        wait_for(
            lambda pod=pod: pod_ready(cluster, namespace, pod) == "True",  # type: ignore[misc]
            f"pod {namespace}/{pod} Ready",
            timeout,
            lambda: diagnostics(cluster, namespace, "pods"),
        )


def pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, "pod", name, "-n", namespace)
    return found


def pod_ready(cluster: LocalCluster, namespace: str, name: str) -> str:
    """The Pod's ``Ready`` condition (``""`` when it has none or cannot be read)."""
    out = cluster.kubectl(
        "get",
        "pod",
        name,
        "-n",
        namespace,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return out.strip()


def restarts(cluster: LocalCluster, namespace: str, name: str) -> int:
    statuses = pod(cluster, namespace, name)["status"].get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def fetch_command(url: str, timeout: float = 3.0) -> str:
    """A shell command that fetches ``url`` (module docs)."""
    return f"python -c {shlex.quote(FETCH)} {shlex.quote(url)} {timeout:g}"


def fetch(
    cluster: LocalCluster, namespace: str, pod: str, url: str, *, retry: bool, timeout: float = 3
) -> str:
    """What ``url`` answers from inside ``pod`` (``error: ...`` on failure; see the module
    docs); ``retry``: connection failures are retried as an application would."""
    command = fetch_command(url, timeout)
    out = exec_in(cluster, namespace, pod, f"retry_connect {command}" if retry else command)
    return "\n".join(line for line in out.splitlines() if not line.startswith("exit:")).strip()
