"""A rolling upgrade of the operator to a new image tag on a real node.

The operator's image is tagged anew in containerd (``ctr images tag``: the same contents, a
new name, no registry) and set with kustomize's ``images``, as docs/deploy.md does, then
applied. The Deployment rolls both replicas; the Lease must end on a Pod of the new tag, and
no two replicas may reconcile at once.

How "no two at once" is checked: a replica reconciles only while its controllers run, which
is after it logs "became leader" and, on SIGTERM, until its controllers have drained, after
which it releases the Lease and logs "released the lease" (docs/manager.md's shutdown order).
Every operator Pod's log is streamed while the roll runs (a deleted Pod's log is gone with
it), and the leaders, ordered by when they became leader, must each start after the previous
one logged the release: the spans in which they could reconcile do not overlap. All Pods log
with the one clock of this machine. A leader that is replaced without logging the release
fails the test (a graceful roll always releases).

Meanwhile a Task's spec is changed every second; after the roll its status must describe its
last generation (the new leader picked up what changed during the handover)."""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
from pathlib import Path

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.operator import leader_pod, operator_pods, overlay, ready_replicas
from tests.e2e.operator_logs import LogFollower, leadership, overlap
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


def _pod_images(cluster: LocalCluster) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["containers"][0]["image"]  # type: ignore[index]
        for p in operator_pods(cluster)
    }


def _rolled(cluster: LocalCluster, image: str, old: set[str]) -> bool:
    pods = _pod_images(cluster)
    holder = leader_pod(cluster)
    return (
        len(pods) == 2
        and not old & pods.keys()
        and all(i.endswith(image) for i in pods.values())
        and ready_replicas(cluster) == 2
        and holder in pods
    )


def _change_task_until(cluster: LocalCluster, namespace: str, stop: threading.Event) -> None:
    priority = 1
    while not stop.is_set():
        priority = priority % 5 + 1
        cluster.kubectl(
            "patch", "task", "rolling", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"priority": priority}}), check=False,
        )  # fmt: skip
        stop.wait(1.0)


def test_rolling_upgrade_hands_the_lease_over_with_no_two_leaders(
    cluster: LocalCluster, operator: str
) -> None:
    wait_for(
        lambda: ready_replicas(cluster) == 2 and leader_pod(cluster) in _pod_images(cluster),
        f"deployment {OPERATOR_NAMESPACE}/crpy-operator: 2 ready replicas and a leader",
        180,
        lambda: _describe(cluster),
    )
    old = set(_pod_images(cluster))
    repository, tag = operator.rsplit(":", 1)
    new_image = f"{repository}:{tag}-next"
    cluster.tag_image(f"docker.io/{operator}", f"docker.io/{new_image}")

    namespace = new_namespace(cluster, "upgrade")
    task = {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": {"name": "rolling", "namespace": namespace},
        "spec": {"priority": 1},
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(task))

    with tempfile.TemporaryDirectory(prefix="crpy-e2e-upgrade-") as temp:
        follower = LogFollower(cluster, Path(temp))
        follower.start()
        wait_for(
            lambda: old <= follower.following(),
            f"streaming the logs of operator pods {sorted(old)}",
            60,
            lambda: _describe(cluster),
        )
        stop = threading.Event()
        updater = threading.Thread(target=_change_task_until, args=(cluster, namespace, stop))
        updater.start()
        try:
            directory = overlay(new_image)
            cluster.kubectl("apply", "-k", str(directory))
            TIMINGS["upgrade_apply_to_rolled"] = wait_for(
                lambda: _rolled(cluster, new_image, old),
                f"deployment {OPERATOR_NAMESPACE}/crpy-operator rolled to {new_image} with "
                "2 ready replicas and the Lease on a new Pod",
                300,
                lambda: _describe(cluster),
            )
        finally:
            stop.set()
            updater.join(timeout=30)
            logs = follower.stop()
        leaders = sorted(
            (found for pod, path in logs.items() if (found := leadership(pod, path))),
            key=lambda found: found.acquired,
        )
        texts = {pod: path.read_text(errors="replace")[-3000:] for pod, path in logs.items()}

    context = (
        f"leaders (by acquisition): {leaders}\nold pods {sorted(old)}\n"
        + "\n".join(f"--- streamed log of {pod}\n{text}" for pod, text in texts.items())
        + "\n"
        + _describe(cluster)
    )
    print(
        "\nupgrade leaders: "
        + ", ".join(
            f"{x.pod} {x.acquired.time()}-{x.released and x.released.time()}" for x in leaders
        )
    )
    new = set(_pod_images(cluster))
    assert old <= logs.keys(), context
    assert leaders and leaders[0].pod in old, context
    assert leaders[-1].pod in new, context
    assert leaders[-1].pod == leader_pod(cluster), context
    problem = overlap(leaders)
    assert problem is None, f"two replicas could reconcile at once: {problem}\n{context}"
    handover = next((b, a) for b, a in itertools.pairwise(leaders) if a.pod in new)
    signalled = handover[0].signalled or handover[0].released
    assert signalled is not None and handover[0].released is not None, context
    TIMINGS["upgrade_old_leader_sigterm_to_new_leader"] = (
        handover[1].acquired - signalled
    ).total_seconds()
    TIMINGS["upgrade_release_to_new_leader"] = (
        handover[1].acquired - handover[0].released
    ).total_seconds()

    def converged() -> bool:
        found = get_json(cluster, "task", "rolling", "-n", namespace)
        status = found.get("status") or {}
        return bool(status.get("state")) and status.get("observedGeneration") == found[
            "metadata"
        ].get("generation")

    wait_for(
        converged,
        f"task {namespace}/rolling status describing its last generation after the upgrade",
        60,
        lambda: diagnostics(cluster, namespace, "task rolling"),
    )
    generation = get_json(cluster, "task", "rolling", "-n", namespace)["metadata"]["generation"]
    assert generation > 3, f"task {namespace}/rolling changed only {generation} times"
