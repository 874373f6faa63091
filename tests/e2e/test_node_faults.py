"""The node faults a test can inject (controller_runtime/envtest/node/worker.py), each seen
from outside the node: a lost node turns ``Ready=Unknown`` after the node-monitor grace
period and its Pods ``Ready=False``, then comes back with its Pods (frozen: the same
containers; killed: started again); a partitioned node keeps running its Pods but nobody
reaches them, and the control plane loses it the same way, until the link is back; killed
containers are restarted by the node's kubelet while the node stays Ready.

Every test puts every node back and waits for it to be Ready, pass or fail, so the tests
after it get the whole cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from controller_runtime.envtest.node.configs import (
    NODE_LEASE_SECONDS,
    NODE_MONITOR_GRACE_SECONDS,
    NODE_MONITOR_PERIOD_SECONDS,
)
from tests.e2e.nodes import (
    PORT,
    client_on,
    fetch,
    pod,
    pod_ready,
    restarts,
    serve_on,
    wait_ready,
)
from tests.e2e.support import TIMINGS, Images, diagnostics, new_namespace, wait_for

VICTIM = "crpy-node-3"
WITNESS = "crpy-node-1"
NOT_READY_BOUND = NODE_MONITOR_GRACE_SECONDS + NODE_MONITOR_PERIOD_SECONDS + 60
"""How long a test waits for a lost node to be marked: the grace period, one monitor period,
and a minute for a loaded machine."""


@pytest.fixture
def namespace(cluster3: LocalCluster) -> Iterator[str]:
    name = new_namespace(cluster3, "faults")
    try:
        yield name
    finally:
        for node in cluster3.all_nodes:
            node.restore()
        for node in cluster3.all_nodes:
            node.wait_ready("True", timeout=180)
        cluster3.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _node_condition(cluster: LocalCluster, name: str) -> dict[str, str]:
    out = cluster.kubectl(
        "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')]}"
    )
    return dict(json.loads(out))


def _running_container(cluster: LocalCluster, namespace: str, name: str) -> str | None:
    """The ID of the Pod's running container (``None`` while none runs). Every container the
    kubelet starts gets a new ID, so a changed ID says it started anew; start times cannot,
    since they have whole seconds and a Pod may start and be killed within one."""
    statuses = pod(cluster, namespace, name)["status"].get("containerStatuses") or []
    for entry in statuses:
        if (entry.get("state") or {}).get("running") and entry.get("containerID"):
            return str(entry["containerID"])
    return None


@pytest.mark.parametrize("containers", ["freeze", "kill"])
def test_a_lost_node_turns_not_ready_then_comes_back(
    cluster3: LocalCluster, images: Images, namespace: str, containers: str
) -> None:
    web = serve_on(cluster3, namespace, VICTIM, images.operator)
    wait_ready(cluster3, namespace, web)
    node = cluster3.node(VICTIM)
    before = _running_container(cluster3, namespace, web)
    assert before is not None, f"pod {web} is Ready without a running container"

    node.lose(containers="freeze" if containers == "freeze" else "kill")
    seconds = node.wait_ready("Unknown", timeout=NOT_READY_BOUND)
    TIMINGS[f"node_lost_{containers}_to_not_ready"] = seconds
    condition = _node_condition(cluster3, VICTIM)
    assert condition["reason"] == "NodeStatusUnknown", f"node {VICTIM}: {condition}"
    # The Lease was last renewed at most one renewal interval before the loss, so the grace
    # period cannot have run out sooner than this.
    earliest = NODE_MONITOR_GRACE_SECONDS - NODE_LEASE_SECONDS / 4
    assert seconds >= earliest - 1, f"node {VICTIM} lost {seconds:.1f}s after lose()"
    for other in cluster3.all_nodes:
        if other.name != VICTIM:
            assert other.ready() == "True", f"node {other.name} should be unaffected"
    wait_for(
        lambda: pod_ready(cluster3, namespace, web) == "False",
        f"pod {namespace}/{web} on lost node {VICTIM} marked not Ready",
        60,
        lambda: diagnostics(cluster3, namespace, f"pod {web}"),
    )

    started = time.monotonic()
    node.restore()
    TIMINGS[f"node_lost_{containers}_restore_to_ready"] = node.wait_ready("True", timeout=180)
    wait_ready(cluster3, namespace, web)
    TIMINGS[f"node_lost_{containers}_restore_to_pod_ready"] = time.monotonic() - started
    if containers == "freeze":
        restarted = restarts(cluster3, namespace, web)
        assert restarted == 0, f"pod {web} was frozen, not killed: {restarted} restarts"
        assert _running_container(cluster3, namespace, web) == before, (
            f"pod {web} was frozen, yet its container started anew"
        )
    else:
        assert _running_container(cluster3, namespace, web) not in (before, None), (
            f"pod {web}'s container was killed with the node, yet it runs on: "
            f"{pod(cluster3, namespace, web)['status']}"
        )


def test_a_partitioned_node_runs_on_unreachable_then_heals(
    cluster3: LocalCluster, images: Images, namespace: str
) -> None:
    web = serve_on(cluster3, namespace, VICTIM, images.operator)
    client = client_on(cluster3, namespace, WITNESS, images.operator)
    wait_ready(cluster3, namespace, web, client)
    ip = pod(cluster3, namespace, web)["status"]["podIP"]
    url = f"http://{ip}:{PORT}/"
    assert fetch(cluster3, namespace, client, url, retry=True) == VICTIM
    node = cluster3.node(VICTIM)

    node.partition()
    unreachable = fetch(cluster3, namespace, client, url, retry=False)
    assert unreachable.startswith("error:"), f"{client} still reaches {web} ({ip}): {unreachable}"
    # The node itself still reaches its Pod: it runs on, cut off.
    inside = node.run(["python3", "-c", _host_fetch(url)])
    assert inside.stdout.strip() == VICTIM, f"node {VICTIM} → its own pod: {inside}"
    assert node.processes["kubelet"].running(), f"node {VICTIM}'s kubelet should run on"
    seconds = node.wait_ready("Unknown", timeout=NOT_READY_BOUND)
    TIMINGS["node_partitioned_to_not_ready"] = seconds
    assert pod_ready(cluster3, namespace, client) == "True", "the witness's pod is unaffected"

    started = time.monotonic()
    node.restore()
    TIMINGS["node_partition_healed_to_ready"] = node.wait_ready("True", timeout=180)
    healed = fetch(cluster3, namespace, client, url, retry=True)
    assert healed == VICTIM, f"{client} → {web} after the partition healed: {healed}"
    TIMINGS["node_partition_healed_to_reachable"] = time.monotonic() - started
    assert restarts(cluster3, namespace, web) == 0, f"pod {web} should have run throughout"


def _host_fetch(url: str) -> str:
    return (
        "import urllib.request\n"
        f"print(urllib.request.urlopen({url!r}, timeout=5).read().decode())\n"
    )


def test_killed_containers_are_restarted_by_their_kubelet(
    cluster3: LocalCluster, images: Images, namespace: str
) -> None:
    target = "crpy-node-2"
    web = serve_on(cluster3, namespace, target, images.operator)
    wait_ready(cluster3, namespace, web)
    node = cluster3.node(target)

    before = _running_container(cluster3, namespace, web)
    assert before is not None, f"pod {web} is Ready without a running container"
    killed = node.kill_containers()
    assert killed >= 2, f"node {target}: only {killed} processes in its Pods (sandbox + web)"
    wait_for(
        lambda: (
            _running_container(cluster3, namespace, web) not in (before, None)
            and pod_ready(cluster3, namespace, web) == "True"
        ),
        f"pod {namespace}/{web} started again by the kubelet of {target} and Ready",
        120,
        lambda: diagnostics(cluster3, namespace, f"pod {web}"),
    )
    assert node.ready() == "True", f"node {target} should have stayed Ready"
    answer = fetch(cluster3, namespace, web, f"http://127.0.0.1:{PORT}/", retry=True)
    assert answer == target, f"pod {web} after its restart: {answer}"
