"""The operator's webhooks as the base install serves them (`kubectl apply -k manifests/`), on a
real node: the in-cluster Deployment answers admission and conversion reviews through its
Services, with the certificates it made itself; `kubectl apply` of an invalid PostgresInstance
is refused with the webhook's message; a v1beta1 object is read and written in v1alpha1
through the in-cluster conversion webhook; and a rolling restart of the operator under 20
creates a second, with `failurePolicy: Fail`, refuses none of them (the numbers go to the
session's timings; docs/e2e.md records them).

Runs before test_uninstall.py (file order)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from controllers.api.postgres.conversion import SYNCHRONOUS_ANNOTATION, instance_to_v1alpha1
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport
from tests.e2e.operator import operator_pods, ready_replicas
from tests.e2e.support import (
    OPERATOR_NAMESPACE,
    TIMINGS,
    diagnostics,
    get_json,
    new_namespace,
)
from tests.e2e.webhook_load import (
    MUTATING,
    VALIDATING,
    Load,
    WebhookCalls,
    create_at_rate,
    read_at_rate,
    webhook_calls,
)

POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {
        "defaultImage": "postgres:{version}",
        "defaultVersion": "15",
        "versions": [{"version": "15"}, {"version": "16"}, {"version": "14", "enabled": False}],
    },
}
SECRET = "crpy-operator-webhook-certs"
CONFIGURATION = "crpy-operator"
CRD = "postgresinstances.postgres.crpy.io"
RATE = 20.0


def _context(cluster: LocalCluster) -> str:
    return diagnostics(cluster, OPERATOR_NAMESPACE, "deployment crpy-operator")


def kubectl_result(
    cluster: LocalCluster, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl with its exit status and standard error (a refusal is the point here)."""
    kubectl = cluster.plane.binaries.kubectl if cluster.plane.binaries else None
    assert kubectl is not None
    return subprocess.run(
        [str(kubectl), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        input=input_text,
    )


@pytest.fixture(scope="module")
def policy(cluster: LocalCluster, operator: str) -> Iterator[dict[str, Any]]:
    """The version policy these tests need; the one before it is put back afterwards."""
    before = kubectl_result(cluster, "get", "postgresversionpolicy", "default", "-o", "json")
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    yield POLICY
    if before.returncode == 0:
        previous = json.loads(before.stdout)
        previous["metadata"] = {"name": "default"}
        cluster.kubectl("replace", "-f", "-", input_text=json.dumps(previous))
    else:
        cluster.kubectl("delete", "postgresversionpolicy", "default", "--ignore-not-found")


def _ca_bundles(cluster: LocalCluster) -> dict[str, list[str]]:
    bundles: dict[str, list[str]] = {}
    for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
        obj = get_json(cluster, kind, CONFIGURATION)
        bundles[kind] = [w["clientConfig"].get("caBundle", "") for w in obj["webhooks"]]
    crd = get_json(cluster, "crd", CRD)
    bundles["crd"] = [crd["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle", "")]
    return bundles


def test_the_deployment_serves_the_webhooks_through_its_service_with_its_own_certificates(
    cluster: LocalCluster, policy: dict[str, Any]
) -> None:
    secret = get_json(cluster, "secret", SECRET, "-n", OPERATOR_NAMESPACE)
    assert secret["type"] == "kubernetes.io/tls"
    ca = secret["data"]["ca.crt"]
    assert base64.b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
    bundles = _ca_bundles(cluster)
    assert all(b == ca for values in bundles.values() for b in values), (
        f"every caBundle is the Secret's CA: {bundles}\n{_context(cluster)}"
    )
    # Through the Service, the mutating webhook defaults the version from the policy and
    # the validating one admits it (a server-side dry run: admission runs, nothing is kept).
    namespace = new_namespace(cluster, "webhooks")
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "defaulted", "namespace": namespace},
        "spec": {"replicas": 1, "storage": {"size": "1Gi"}},
    }
    before = webhook_calls(cluster, VALIDATING)
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input_text=json.dumps(instance)
    )
    assert json.loads(out)["spec"]["version"] == "15", "defaulted by the mutating webhook"
    after = webhook_calls(cluster, VALIDATING)
    assert after.calls - before.calls >= 1, "the API server called the validating webhook"
    assert after.rejected_calling == before.rejected_calling


def test_kubectl_apply_of_an_invalid_instance_is_refused_with_the_webhooks_message(
    cluster: LocalCluster, policy: dict[str, Any]
) -> None:
    namespace = new_namespace(cluster, "webhooks")
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "retired", "namespace": namespace},
        "spec": {"version": "14", "replicas": 1, "storage": {"size": "1Gi"}},
    }
    refused = kubectl_result(cluster, "apply", "-f", "-", input_text=json.dumps(instance))
    assert refused.returncode != 0, refused.stdout
    assert f'admission webhook "{VALIDATING}" denied the request' in refused.stderr
    assert "version 14 is disabled by the version policy (enabled: 15, 16)" in refused.stderr
    TIMINGS["webhook_refusal_message"] = len(refused.stderr)  # seen; its text is above
    missing = kubectl_result(cluster, "get", "postgresinstance", "retired", "-n", namespace)
    assert missing.returncode != 0, "nothing was stored"


def test_a_v1beta1_object_reads_and_writes_in_v1alpha1_through_the_conversion_webhook(
    cluster: LocalCluster, policy: dict[str, Any]
) -> None:
    """An existing server (no Pods to run) whose replication setting v1alpha1 cannot
    express: read in v1alpha1 it is ``mode: sync`` plus the annotation that keeps the rest;
    a v1alpha1 write of it keeps the v1beta1 setting."""
    namespace = new_namespace(cluster, "conversion")
    synchronous = {"number": 2, "method": "Any"}
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "legacy", "namespace": namespace},
        "spec": {
            "external": {
                "host": f"nowhere.{namespace}.svc.cluster.local",
                "port": 5432,
                "adminSecretRef": {"name": "nowhere-admin"},
            },
            "replication": {"synchronous": synchronous},
        },
    }
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(instance))
    try:
        stored = get_json(
            cluster, "postgresinstances.v1beta1.postgres.crpy.io", "legacy", "-n", namespace
        )
        old = get_json(
            cluster, "postgresinstances.v1alpha1.postgres.crpy.io", "legacy", "-n", namespace
        )
        assert old["apiVersion"] == "postgres.crpy.io/v1alpha1"
        assert old["spec"]["replication"]["mode"] == "sync"
        assert "synchronous" not in old["spec"]["replication"]
        annotations = old["metadata"].get("annotations") or {}
        assert json.loads(annotations[SYNCHRONOUS_ANNOTATION]) == synchronous
        expected = instance_to_v1alpha1(stored)
        assert old["spec"] == expected["spec"], "what the operator's conversion gives"

        # A v1alpha1 client's read-modify-write (a label added) keeps the v1beta1 setting.
        old["metadata"].setdefault("labels", {})["team"] = "shop"
        cluster.kubectl("replace", "-f", "-", input_text=json.dumps(old))
        again = get_json(
            cluster, "postgresinstances.v1beta1.postgres.crpy.io", "legacy", "-n", namespace
        )
        assert again["spec"]["replication"]["synchronous"] == synchronous
        assert "mode" not in again["spec"]["replication"]
        assert again["metadata"]["labels"]["team"] == "shop"
        assert SYNCHRONOUS_ANNOTATION not in (again["metadata"].get("annotations") or {})
        listed = get_json(cluster, "postgresinstances.v1alpha1.postgres.crpy.io", "-n", namespace)
        assert [i["spec"]["replication"]["mode"] for i in listed["items"]] == ["sync"]
    finally:
        cluster.kubectl("delete", "postgresinstance", "legacy", "-n", namespace, "--wait=false")


# -- a rolling restart under load --------------------------------------------------------------


def _stored_instance(cluster: LocalCluster, namespace: str) -> None:
    """One PostgresInstance stored in ``namespace`` (an existing server's, so no Pod runs):
    what the v1alpha1 reads of the load convert."""
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "stored", "namespace": namespace},
        "spec": {
            "external": {
                "host": f"nowhere.{namespace}.svc.cluster.local",
                "port": 5432,
                "adminSecretRef": {"name": "nowhere-admin"},
            },
        },
    }
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(instance))


def webhook_failures_logged(cluster: LocalCluster, since: int) -> list[str]:
    """The API server's log lines, from byte ``since`` on, about calls to the operator's
    webhooks that failed (each says why: refused, reset, EOF, timeout, certificate)."""
    log = cluster.plane.workdir / "kube-apiserver.log"
    with log.open("rb") as handle:
        handle.seek(since)
        text = handle.read().decode(errors="replace")
    return [
        line
        for line in text.splitlines()
        if "postgresinstance.postgres.crpy.io" in line
        and ("failed calling webhook" in line.lower() or "failing open" in line.lower())
    ]


def apiserver_log_size(cluster: LocalCluster) -> int:
    return (cluster.plane.workdir / "kube-apiserver.log").stat().st_size


async def _rolling_restart_under_load(cluster: LocalCluster, namespace: str) -> tuple[Load, Load]:
    """Creates at RATE a second from before ``kubectl rollout restart`` until both old Pods
    are gone (and a little after), the roll done meanwhile; beside them, v1alpha1 reads of
    the namespace's one stored instance (each converted by the webhook) at 10 a second.
    Returns (creates, reads)."""
    old = [pod["metadata"]["name"] for pod in operator_pods(cluster)]  # type: ignore[index]
    config = await load_kubeconfig(cluster.kubeconfig)
    async with Transport(config, max_retries=0) as transport:
        stop = asyncio.Event()
        load = asyncio.create_task(create_at_rate(transport, namespace, stop, rate=RATE))
        alpha = f"/apis/postgres.crpy.io/v1alpha1/namespaces/{namespace}/postgresinstances"
        reads = asyncio.create_task(read_at_rate(transport, alpha, stop))
        try:
            await asyncio.sleep(3)  # the load's steady state before the roll
            await asyncio.to_thread(
                cluster.kubectl,
                "rollout",
                "restart",
                "deployment/crpy-operator",
                "-n",
                OPERATOR_NAMESPACE,
            )
            await asyncio.to_thread(
                cluster.kubectl,
                "rollout",
                "status",
                "deployment/crpy-operator",
                "-n",
                OPERATOR_NAMESPACE,
                "--timeout=300s",
                timeout=320,
            )
            await asyncio.to_thread(
                cluster.kubectl,
                "wait",
                "--for=delete",
                *(f"pod/{name}" for name in old),
                "-n",
                OPERATOR_NAMESPACE,
                "--timeout=120s",
                timeout=140,
            )
            await asyncio.sleep(3)  # and a steady state after it
        finally:
            stop.set()
            result = await load
            read = await reads
    return result, read


def test_a_rolling_restart_under_20_creates_a_second_refuses_none(
    cluster: LocalCluster, policy: dict[str, Any]
) -> None:
    """The validating webhook is ``failurePolicy: Fail``: a create that reaches a replica
    whose port is closed, or one not yet serving a trusted certificate, is refused. Zero
    refusals come from: readiness only once a TLS handshake with a certificate the
    configurations' caBundle trusts succeeds (a new Pod gets traffic only then), the
    replica answering for 5 s after its SIGTERM while the Service and kube-proxy drop it,
    ``Connection: close`` on those answers, and ``maxUnavailable: 0``."""
    namespace = new_namespace(cluster, "webhook-load")
    assert ready_replicas(cluster) == 2, _context(cluster)
    old = {pod["metadata"]["name"] for pod in operator_pods(cluster)}  # type: ignore[index]
    before = {name: webhook_calls(cluster, name) for name in (VALIDATING, MUTATING)}
    _stored_instance(cluster, namespace)
    log_at = apiserver_log_size(cluster)
    load, reads = asyncio.run(_rolling_restart_under_load(cluster, namespace))
    failures = webhook_failures_logged(cluster, log_at)
    TIMINGS["webhook_restart_conversion_reads"] = reads.sent
    TIMINGS["webhook_restart_conversion_failed"] = len(reads.refused)
    print(
        f"\nv1alpha1 reads (conversion) meanwhile: {reads.summary()}; failed: "
        f"{[message[:200] for _, _, message in reads.refused[:5]]}"
    )
    after = {name: webhook_calls(cluster, name) for name in (VALIDATING, MUTATING)}
    calls: dict[str, WebhookCalls] = {n: after[n] - before[n] for n in before}
    TIMINGS["webhook_restart_creates"] = load.sent
    TIMINGS["webhook_restart_refused"] = len(load.refused)
    TIMINGS["webhook_restart_seconds"] = round(load.seconds, 1)
    TIMINGS["webhook_restart_rate"] = round(load.achieved_rate, 1)
    TIMINGS["webhook_restart_p50_ms"] = round(load.latency(0.5) * 1000, 1)
    TIMINGS["webhook_restart_p99_ms"] = round(load.latency(0.99) * 1000, 1)
    TIMINGS["webhook_restart_validating_calls"] = calls[VALIDATING].calls
    TIMINGS["webhook_restart_mutating_failed_open"] = calls[MUTATING].failed_open
    TIMINGS["webhook_restart_max_ms"] = round(max(load.latencies, default=0) * 1000, 1)
    print(f"\nrolling restart under load: {load.summary()}; API server: {calls}")
    print("\n".join(["API server log, failed webhook calls:", *failures]))
    assert not load.refused, (
        f"{len(load.refused)} of {load.sent} creates refused during the rolling restart: "
        f"{load.refused[:10]}\n{failures}\n{_context(cluster)}"
    )
    assert load.achieved_rate >= 0.9 * RATE, load.summary()
    # Every create went through the validating webhook, and no call to either failed.
    assert calls[VALIDATING].calls >= load.sent, calls
    assert calls[VALIDATING].rejected_calling == 0, (calls, failures)
    assert calls[MUTATING].failed_open == 0, (calls, failures)
    pods = operator_pods(cluster)
    new = {pod["metadata"]["name"] for pod in pods}  # type: ignore[index]
    assert len(new) == 2 and not new & old, f"both replicas replaced: {old} -> {new}"
    assert ready_replicas(cluster) == 2, _context(cluster)


def _set_shutdown_delay(cluster: LocalCluster, value: str | None) -> None:
    """Add ``--webhook-shutdown-delay=value`` to the operator's arguments (``None``: remove
    it again) and wait until the rollout is done and the old Pods are gone."""
    old = [pod["metadata"]["name"] for pod in operator_pods(cluster)]  # type: ignore[index]
    deployment = get_json(cluster, "deployment", "crpy-operator", "-n", OPERATOR_NAMESPACE)
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flag = "--webhook-shutdown-delay="
    kept = [a for a in args if not a.startswith(flag)]
    wanted = kept if value is None else [*kept, flag + value]
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": wanted}]
    cluster.kubectl(
        "patch",
        "deployment",
        "crpy-operator",
        "-n",
        OPERATOR_NAMESPACE,
        "--type=json",
        "-p",
        json.dumps(patch),
    )
    cluster.kubectl(
        "rollout",
        "status",
        "deployment/crpy-operator",
        "-n",
        OPERATOR_NAMESPACE,
        "--timeout=300s",
        timeout=320,
    )
    cluster.kubectl(
        "wait",
        "--for=delete",
        *(f"pod/{name}" for name in old),
        "-n",
        OPERATOR_NAMESPACE,
        "--timeout=120s",
        timeout=140,
    )


def test_without_the_shutdown_delay_the_same_restart_is_measured_for_comparison(
    cluster: LocalCluster, policy: dict[str, Any]
) -> None:
    """The control: the replicas started with ``--webhook-shutdown-delay=0`` (the port closes
    at SIGTERM, as before the delay existed), then the same restart under the same load. Its
    refusals are recorded, not asserted (how many depends on how the API server's connections
    fall at that moment); docs/e2e.md has the numbers. The Deployment is put back after."""
    namespace = new_namespace(cluster, "webhook-control")
    _set_shutdown_delay(cluster, "0")
    try:
        for pod in operator_pods(cluster):
            args = pod["spec"]["containers"][0]["args"]  # type: ignore[index]
            assert "--webhook-shutdown-delay=0" in args, _context(cluster)
        assert ready_replicas(cluster) == 2, _context(cluster)
        before = webhook_calls(cluster, VALIDATING)
        _stored_instance(cluster, namespace)
        log_at = apiserver_log_size(cluster)
        load, reads = asyncio.run(_rolling_restart_under_load(cluster, namespace))
        calls = webhook_calls(cluster, VALIDATING) - before
        TIMINGS["webhook_no_delay_conversion_failed"] = len(reads.refused)
        failures = webhook_failures_logged(cluster, log_at)
        TIMINGS["webhook_no_delay_restart_creates"] = load.sent
        TIMINGS["webhook_no_delay_restart_refused"] = len(load.refused)
        TIMINGS["webhook_no_delay_calling_errors"] = calls.rejected_calling
        print(
            f"\nwithout the shutdown delay: {load.summary()}; API server: {calls}; "
            f"refusals: {[message[:160] for _, _, message in load.refused[:5]]}"
        )
        print("\n".join(["API server log, failed webhook calls:", *failures]))
        assert load.achieved_rate >= 0.9 * RATE, load.summary()
        assert calls.calls >= load.admitted, "the admitted creates went through the webhook"
    finally:
        _set_shutdown_delay(cluster, None)
    assert ready_replicas(cluster) == 2, _context(cluster)
