"""Installing the operator on the local cluster as docs/deploy.md says: ``kubectl apply -k``
of ``manifests/`` through an overlay that sets the image (kustomize's ``images``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from controller_runtime.envtest.controlplane import ControlPlaneError
from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import OPERATOR_NAMESPACE, diagnostics, get_json, wait_for

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
LEASE = "controller-runtime-py-operator"


def overlay(image: str) -> Path:
    """A kustomization that takes ``manifests/`` and sets the operator's image."""
    repository, tag = image.rsplit(":", 1)
    directory = Path(tempfile.mkdtemp(prefix="crpy-e2e-overlay-"))
    (directory / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(MANIFESTS, directory)}\n"
        "images:\n"
        "  - name: controller-runtime-py/operator\n"
        f"    newName: {repository}\n"
        f"    newTag: {tag}\n"
    )
    return directory


WEBHOOK_PROBE = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresInstance",
    "metadata": {"name": "crpy-webhook-probe", "namespace": OPERATOR_NAMESPACE},
    "spec": {"version": "15", "replicas": 1, "storage": {"size": "1Gi"}},
}
"""A PostgresInstance created with ``--dry-run=server`` only: it passes both webhooks."""


def webhooks_answer(cluster: LocalCluster) -> bool:
    """Whether the API server reaches the operator's webhooks through their Service: a
    server-side dry-run create is answered by them (admitted, or refused by their rules), not
    refused because they could not be called."""
    try:
        cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input_text=json.dumps(WEBHOOK_PROBE)
        )
    except ControlPlaneError as err:
        return "failed calling webhook" not in str(err)
    return True


def install(cluster: LocalCluster, image: str, timeout: float = 240) -> float:
    """Apply the manifests and wait until both replicas are ready and the API server
    reaches the webhooks through their Service (kube-proxy writes the Service's rules a
    moment after the endpoints are ready: until then a `Fail` webhook refuses every
    PostgresInstance write, as it would for an application); return the seconds."""
    started = time.monotonic()
    directory = overlay(image)
    try:
        cluster.kubectl("apply", "-k", str(directory))
    finally:
        shutil.rmtree(directory)
    wait_for(
        lambda: ready_replicas(cluster) == 2,
        f"deployment {OPERATOR_NAMESPACE}/crpy-operator with 2 ready replicas",
        timeout,
        lambda: diagnostics(cluster, OPERATOR_NAMESPACE, "deployment crpy-operator"),
    )
    wait_for(
        lambda: webhooks_answer(cluster),
        "the operator's webhooks answering through their Service",
        60,
        lambda: diagnostics(cluster, OPERATOR_NAMESPACE, "service crpy-operator-webhook"),
    )
    return time.monotonic() - started


def ready_replicas(cluster: LocalCluster) -> int:
    out = cluster.kubectl(
        "get",
        "deployment",
        "crpy-operator",
        "-n",
        OPERATOR_NAMESPACE,
        "-o",
        "jsonpath={.status.readyReplicas}",
        check=False,
    )
    return int(out) if out.strip().isdigit() else 0


def leader(cluster: LocalCluster) -> str:
    """The Pod holding the Lease ('' when none)."""
    out = cluster.kubectl(
        "get",
        "lease",
        LEASE,
        "-n",
        OPERATOR_NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    )
    return out.strip()


def leader_pod(cluster: LocalCluster) -> str:
    """The name of the Pod holding the Lease (its identity up to the first ``_``; '' when
    none)."""
    return leader(cluster).split("_", 1)[0]


def operator_pods(cluster: LocalCluster) -> list[dict[str, object]]:
    pods = get_json(
        cluster, "pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=crpy-operator"
    )
    items: list[dict[str, object]] = pods["items"]
    return items
