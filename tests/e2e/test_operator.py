"""The operator's own lifecycle on a real node: its image, `kubectl apply -k manifests/`, two
replicas under Pod Security "restricted", one leader, a Task reconciled in-cluster, failover
when the leader's Pod is deleted. (Uninstall: test_uninstall.py, which runs last.)"""

from __future__ import annotations

import json
import time

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.operator import LEASE, leader_pod, operator_pods
from tests.e2e.support import (
    OPERATOR_NAMESPACE,
    TIMINGS,
    diagnostics,
    get_json,
    new_namespace,
    wait_for,
)


def _describe(cluster: LocalCluster) -> str:
    return diagnostics(cluster, OPERATOR_NAMESPACE, "deployment crpy-operator")


def test_two_replicas_run_restricted_one_leads_probes_green(
    cluster: LocalCluster, operator: str
) -> None:
    namespace = get_json(cluster, "namespace", OPERATOR_NAMESPACE)
    labels = namespace["metadata"]["labels"]
    assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", (
        f"namespace {OPERATOR_NAMESPACE} labels: {labels}"
    )
    # Earlier tests fault the nodes (killed containers, lost and partitioned nodes), and an
    # operator replica on such a node restarts: wait for both to be Running and Ready again.
    wait_for(
        lambda: _two_replicas_serving(operator_pods(cluster)),
        f"two operator replicas Running and Ready in {OPERATOR_NAMESPACE}",
        180,
        lambda: _describe(cluster),
    )
    pods = operator_pods(cluster)
    context = _describe(cluster)
    for pod in pods:
        container = pod["spec"]["containers"][0]  # type: ignore[index]
        assert container["image"].endswith(operator), context
    names = {pod["metadata"]["name"] for pod in pods}  # type: ignore[index]
    wait_for(
        lambda: leader_pod(cluster) in names,
        f"lease {OPERATOR_NAMESPACE}/{LEASE} held by one of the pods {sorted(names)}",
        60,
        lambda: context,
    )
    assert get_json(cluster, "networkpolicy", "-n", OPERATOR_NAMESPACE)["items"], (
        f"no NetworkPolicy in namespace {OPERATOR_NAMESPACE}\n{context}"
    )
    assert get_json(cluster, "poddisruptionbudget", "-n", OPERATOR_NAMESPACE)["items"], (
        f"no PodDisruptionBudget in namespace {OPERATOR_NAMESPACE}\n{context}"
    )


def _two_replicas_serving(pods: list[dict[str, object]]) -> bool:
    """Exactly two operator Pods, each Running, Ready, every container started and ready."""
    if len(pods) != 2:
        return False
    for pod in pods:
        status = pod.get("status")
        if not isinstance(status, dict) or status.get("phase") != "Running":
            return False
        ready = {c["type"]: c["status"] for c in status.get("conditions") or []}
        containers = status.get("containerStatuses") or []
        if ready.get("Ready") != "True" or not containers:
            return False
        if not all(c.get("ready") and c.get("started") for c in containers):
            return False
    return True


def _task(cluster: LocalCluster, namespace: str, name: str) -> None:
    task = {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"priority": 3},
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(task))


def _reconciled(cluster: LocalCluster, namespace: str, name: str) -> bool:
    out = cluster.kubectl(
        "get", "task", name, "-n", namespace, "-o", "jsonpath={.status.state}", check=False
    )
    return bool(out.strip())


def test_a_task_created_with_kubectl_is_reconciled_in_cluster(
    cluster: LocalCluster, operator: str
) -> None:
    namespace = new_namespace(cluster, "task")
    _task(cluster, namespace, "first")
    took = wait_for(
        lambda: _reconciled(cluster, namespace, "first"),
        f"task {namespace}/first reconciled (status.state set)",
        60,
        lambda: diagnostics(cluster, namespace, "task first"),
    )
    TIMINGS["task_reconciled"] = took


def test_deleting_the_leader_pod_fails_over(cluster: LocalCluster, operator: str) -> None:
    holder = leader_pod(cluster)
    assert holder, _describe(cluster)
    started = time.monotonic()
    cluster.kubectl("delete", "pod", holder, "-n", OPERATOR_NAMESPACE, "--wait=false")

    def taken_over() -> bool:
        current = leader_pod(cluster)
        return bool(current) and current != holder

    TIMINGS["failover"] = wait_for(
        taken_over,
        f"lease {OPERATOR_NAMESPACE}/{LEASE} taken over from pod {holder}",
        90,
        lambda: _describe(cluster),
    )
    namespace = new_namespace(cluster, "failover")
    _task(cluster, namespace, "after-failover")
    wait_for(
        lambda: _reconciled(cluster, namespace, "after-failover"),
        f"task {namespace}/after-failover reconciled by the new leader",
        60,
        lambda: diagnostics(cluster, namespace, "task after-failover"),
    )
    TIMINGS["failover_to_reconciled"] = time.monotonic() - started
