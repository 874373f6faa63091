"""An in-cluster instance whose Pod cannot pull its image, on the local control plane (no
kubelet: the test writes the Pod's status as the kubelet would, and the StatefulSet's as its
controller would). The instance turns ``Ready=False``/``Degraded=True`` with reason
``ImagePullFailed`` naming the Pod and image, a Warning Event of that reason is recorded, and
the condition clears once the Pod runs and the StatefulSet reports it ready."""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.client import Client
from controller_runtime.manager import Manager
from controllers.postgres.api import API_VERSION, labels_for
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import condition, set_policy, wait_for
from tests.integration.postgres.test_instance import cond_is, play_statefulset_controller

pytestmark = [
    pytest.mark.integration,
    pytest.mark.plays("the kubelet and the StatefulSet controller (writes a Pod's status)"),
]


def _pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pg-0",
            "namespace": namespace,
            "labels": labels_for("pg", "database"),
        },
        "spec": {"containers": [{"name": "postgres", "image": "postgres:16"}]},
    }


def _status(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "postgres",
                    "image": "postgres:16",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
    }


async def test_an_image_that_cannot_be_pulled_is_a_condition_and_an_event(
    operator: Manager, kube: Client, transport: Transport, namespace: str
) -> None:
    await set_policy(kube, {"16": True})
    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "PostgresInstance",
            "metadata": {"name": "pg", "namespace": namespace},
            "spec": {"version": "16"},
        }
    )
    sts = await wait_for(
        transport, "statefulsets", namespace, "pg", lambda o: o is not None, api="apps/v1"
    )
    pod = await kube.create(_pod(namespace))
    message = 'Back-off pulling image "postgres:16"'
    await kube.patch_status(
        pod, _status({"waiting": {"reason": "ImagePullBackOff", "message": message}})
    )
    # Pods are not watched: the instance reads them again within its pod poll (15 s).
    failed = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        cond_is("Ready", "False", "ImagePullFailed"),
        timeout=60,
    )
    ready = condition(failed, "Ready")
    assert ready["message"] == (
        f"pod pg-0: image postgres:16 cannot be pulled (ImagePullBackOff): {message}"
    )
    degraded = condition(failed, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ImagePullFailed"
    events = await kube.live.list("events.k8s.io/v1", "Event", namespace=namespace)
    pulls = [e for e in events if e.get("reason") == "ImagePullFailed"]
    assert len(pulls) == 1, pulls
    assert pulls[0]["type"] == "Warning" and pulls[0]["regarding"]["name"] == "pg"

    # The image arrives: the Pod runs and the StatefulSet reports it ready.
    pod = await kube.live.get("v1", "Pod", name="pg-0", namespace=namespace)
    await kube.patch_status(pod, _status({"running": {"startedAt": "2026-01-01T00:00:00Z"}}))
    assert sts is not None
    await play_statefulset_controller(kube, sts, ready=1)
    recovered = await wait_for(
        transport, "PostgresInstance", namespace, "pg", cond_is("Ready", "True", "AllReplicasReady")
    )
    assert condition(recovered, "Degraded")["status"] == "False"
