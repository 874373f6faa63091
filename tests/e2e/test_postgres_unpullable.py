"""Bad input on a real node: a PostgresInstance whose image cannot be pulled.

The version policy maps release ``15.99`` to an image that is not loaded into containerd; the
node has no registry, so the kubelet's pull fails at once (``ErrImagePull``, then
``ImagePullBackOff``). The instance must say so: ``Ready=False`` and ``Degraded=True`` with
reason ``ImagePullFailed`` naming the image, and a Warning Event of that reason on the
instance. Meanwhile the operator keeps serving another instance, which turns Ready."""

from __future__ import annotations

import json
import time

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.pods import condition
from tests.e2e.support import TIMINGS, diagnostics, get_json, new_namespace, wait_for

MISSING_IMAGE = "crpy-e2e/not-loaded:15.99"
POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {
        "defaultImage": "postgres:{version}",
        "versions": [{"version": "15"}, {"version": "15.99", "image": MISSING_IMAGE}],
    },
}


def _instance(namespace: str, name: str, version: str) -> str:
    return json.dumps(
        {
            "apiVersion": "postgres.crpy.io/v1beta1",
            "kind": "PostgresInstance",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "version": version,
                "replicas": 1,
                "storage": {"size": "1Gi"},
                "deletionPolicy": "Delete",
            },
        }
    )


def test_an_unpullable_image_ends_in_a_clear_condition_and_event(
    cluster: LocalCluster, operator: str
) -> None:
    namespace = new_namespace(cluster, "pgpull")
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input_text=_instance(namespace, "broken", "15.99"))
    cluster.kubectl("apply", "-f", "-", input_text=_instance(namespace, "healthy", "15"))

    def describe() -> str:
        return diagnostics(cluster, namespace, "postgresinstances broken and healthy")

    def pull_failed() -> bool:
        ready = condition(cluster, "postgresinstance", namespace, "broken", "Ready")
        return ready.get("reason") == "ImagePullFailed"

    TIMINGS["postgres_unpullable_to_condition"] = wait_for(
        pull_failed, f"postgresinstance {namespace}/broken Ready=False ImagePullFailed", 120,
        describe,
    )  # fmt: skip
    ready = condition(cluster, "postgresinstance", namespace, "broken", "Ready")
    degraded = condition(cluster, "postgresinstance", namespace, "broken", "Degraded")
    context = f"postgresinstance {namespace}/broken: Ready {ready}, Degraded {degraded}"
    assert ready["status"] == "False", context
    assert MISSING_IMAGE in ready["message"] and "broken-0" in ready["message"], context
    assert degraded.get("status") == "True" and degraded.get("reason") == "ImagePullFailed", context

    def warned() -> bool:
        events = get_json(cluster, "events.events.k8s.io", "-n", namespace)["items"]
        return any(
            e.get("reason") == "ImagePullFailed"
            and e.get("type") == "Warning"
            and (e.get("regarding") or {}).get("kind") == "PostgresInstance"
            and (e.get("regarding") or {}).get("name") == "broken"
            and MISSING_IMAGE in (e.get("note") or "")
            for e in events
        )

    wait_for(warned, f"a Warning event ImagePullFailed on postgresinstance {namespace}/broken",
             60, describe)  # fmt: skip
    wait_for(
        lambda: (
            condition(cluster, "postgresinstance", namespace, "healthy", "Ready").get("status")
            == "True"
        ),
        f"postgresinstance {namespace}/healthy Ready while broken cannot pull its image",
        240,
        describe,
    )
    TIMINGS["postgres_healthy_beside_unpullable_to_ready"] = time.monotonic() - started
    still = condition(cluster, "postgresinstance", namespace, "broken", "Ready")
    assert still.get("reason") == "ImagePullFailed", f"postgresinstance {namespace}/broken: {still}"
    cluster.kubectl("delete", "postgresinstance", "broken", "healthy", "-n", namespace,
                    timeout=180)  # fmt: skip
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
