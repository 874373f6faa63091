"""Failover when the primary's node is lost or partitioned, on three nodes in three zones (one
member per zone), under the writing application of tests/e2e/traffic.py running on another
node than the primary.

- **node lost** (its kubelet and kube-proxy killed, its Pods frozen, and its network cut, as
  for a machine that hangs or loses power: nothing on it answers, not even its kernel's TCP,
  which would otherwise keep a client's connection to the frozen primary open and silent
  forever): a standby is promoted
  without waiting for the control plane to mark the node (the old primary's agent does not
  answer, and its fence holds by the isolation bound); every acknowledged row is on the new
  primary and the remaining standby; when the node comes back the thawed old primary stops at
  once (its lease is long gone) and rejoins as a standby with every row;
- **node partitioned** (it runs on, reaching nobody): besides the above, a second application
  on the partitioned node writes to the old primary directly (its own table): its last
  acknowledgement comes at most 10 s after the partition (the isolated primary stops by
  itself), so no two primaries ever acknowledge, and every row it had acknowledged is on the
  new primary (synchronous mode: a standby had it).

Every sample of the application saw at most one writable member. The write gaps are recorded
in the session's timings (docs/e2e.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e import ha
from tests.e2e.ha import BOOT_TIMEOUT, NAME, RECOVERY_TIMEOUT, ROUNDS, app_log
from tests.e2e.operator import leader_pod, operator_pods
from tests.e2e.support import TIMINGS, diagnostics, new_namespace, wait_for
from tests.e2e.traffic import double_primaries, start_app, write_gap

REPLICAS = 3
ISOLATION_BOUND = 10.0


@pytest.fixture(scope="module", autouse=True)
def numbers() -> Iterator[None]:
    """With ``CRPY_HA_ROUNDS`` > 1 (``make e2e-ha-numbers``), the numbers file at the end."""
    yield
    if ROUNDS > 1:
        ha.write_numbers()


@pytest.fixture
def namespace(cluster3: LocalCluster, operator: str) -> Iterator[str]:
    """A 3-replica ZeroLoss instance, healthy, one member per node; every node put back and
    the instance deleted at the end, pass or fail."""
    name = new_namespace(cluster3, "hanode")
    try:
        started = time.monotonic()
        ha.apply_instance(cluster3, name, REPLICAS, replication={"synchronous": {"number": 1}})
        ha.wait_healthy(cluster3, name, REPLICAS, "healthy with 3 members", BOOT_TIMEOUT)
        TIMINGS["ha_3_nodes_apply_to_healthy"] = time.monotonic() - started
        yield name
    finally:
        for node in cluster3.all_nodes:
            node.restore()
        for node in cluster3.all_nodes:
            node.wait_ready("True", timeout=180)
        cluster3.kubectl(
            "delete", "postgresinstance", NAME, "-n", name, "--wait=false", check=False
        )


def node_of(cluster: LocalCluster, namespace: str, pod: str) -> str:
    return str(ha.pods(cluster, namespace)[pod]["spec"]["nodeName"])


def leader_on(cluster: LocalCluster, node: str) -> bool:
    """Whether the operator's leader (the Pod holding its Lease) runs on ``node``. When it
    does, a fault of that node also costs the leader: the failover starts only once a
    follower has taken the Lease (docs/e2e.md, "High availability")."""
    holder = leader_pod(cluster)
    for pod in operator_pods(cluster):
        meta, spec = pod["metadata"], pod["spec"]
        assert isinstance(meta, dict) and isinstance(spec, dict)
        if meta["name"] == holder:
            return bool(spec.get("nodeName") == node)
    return False


def app_elsewhere(cluster: LocalCluster, namespace: str, victim: str, image: str) -> None:
    """The application, on a node other than ``victim``, committing."""
    node = next(n.name for n in cluster.all_nodes if n.name != victim)
    start_app(cluster, namespace, NAME, REPLICAS, image, node=node)
    wait_for(
        lambda: len(app_log(cluster, namespace).acks) >= 20,
        f"the application in {namespace} committing",
        120,
        lambda: diagnostics(cluster, namespace, "pod app"),
    )


def after_failover(
    cluster: LocalCluster,
    namespace: str,
    fault: str,
    *,
    old: str,
    since: float,
    with_leader: bool,
) -> str:
    """The checks after the fault, before the node is back; the new primary. ``with_leader``:
    the operator's leader ran on the faulted node (its gap is recorded apart)."""
    new = ha.wait_healthy(
        cluster,
        namespace,
        REPLICAS,
        f"failed over from {old} after its node was {fault}",
        RECOVERY_TIMEOUT,
        not_=old,
        absent=[old],
    )
    wait_for(
        lambda: app_log(cluster, namespace).acked_after(since) >= 10,
        f"{namespace}: the application committing through {new}",
        RECOVERY_TIMEOUT,
        lambda: diagnostics(cluster, namespace, "pod app"),
    )
    log = app_log(cluster, namespace)
    for member in ha.roles(cluster, namespace):
        if member != old:
            ha.holds_all(cluster, namespace, member, log.acked_ids(), f"node {fault}")
    gap = write_gap(log, since)
    scenario = f"node_{fault}" + ("_with_operator_leader" if with_leader else "")
    TIMINGS[f"ha_write_gap_{scenario}"] = gap
    ha.record(scenario, gap)
    leader_note = " (the operator's leader was on that node)" if with_leader else ""
    print(f"\nnode {fault}: {old} -> {new}, write gap {gap:.2f} s{leader_note}")
    return new


def after_return(cluster: LocalCluster, namespace: str, fault: str, *, old: str) -> None:
    """The node is back: the old primary rejoins as a standby with every row, and no sample
    ever saw two writable members."""
    ha.wait_healthy(
        cluster, namespace, REPLICAS, f"{old} back as a standby", RECOVERY_TIMEOUT * 2, not_=old
    )
    log = app_log(cluster, namespace)
    ha.holds_all(cluster, namespace, old, log.acked_ids(), f"its node {fault} and back")
    doubles = double_primaries(log)
    assert doubles == [], f"{namespace}: two writable members around node {fault}: {doubles[:5]}"


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_primary_node_lost(
    cluster3: LocalCluster, namespace: str, operator: str, round_: int
) -> None:
    old = ha.wait_healthy(cluster3, namespace, REPLICAS, "healthy", RECOVERY_TIMEOUT)
    victim = node_of(cluster3, namespace, old)
    app_elsewhere(cluster3, namespace, victim, operator)
    with_leader = leader_on(cluster3, victim)
    lost_at = time.time()
    cluster3.node(victim).lose(containers="freeze")
    cluster3.node(victim).partition()
    after_failover(cluster3, namespace, "lost", old=old, since=lost_at, with_leader=with_leader)
    assert (ha.status(cluster3, namespace).get("failovers") or 0) == 1
    cluster3.node(victim).restore()
    cluster3.node(victim).wait_ready("True", timeout=180)
    after_return(cluster3, namespace, "lost", old=old)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_primary_node_partitioned(
    cluster3: LocalCluster, namespace: str, operator: str, round_: int
) -> None:
    old = ha.wait_healthy(cluster3, namespace, REPLICAS, "healthy", RECOVERY_TIMEOUT)
    victim = node_of(cluster3, namespace, old)
    app_elsewhere(cluster3, namespace, victim, operator)
    # A second application on the victim's node, writing to the old primary by its address:
    # it can still reach it once the node is cut off.
    address = ha.pods(cluster3, namespace)[old]["status"]["podIP"]
    start_app(
        cluster3, namespace, NAME, 0, operator,
        name="isolated", node=victim, primary=address, table="isolated",
    )  # fmt: skip
    wait_for(
        lambda: len(app_log(cluster3, namespace, "isolated").acks) >= 20,
        f"the isolated application in {namespace} committing to {old}",
        120,
        lambda: diagnostics(cluster3, namespace, "pod isolated"),
    )
    with_leader = leader_on(cluster3, victim)
    cut_at = time.time()
    cluster3.node(victim).partition()
    new = after_failover(
        cluster3, namespace, "partitioned", old=old, since=cut_at, with_leader=with_leader
    )
    cluster3.node(victim).restore()
    cluster3.node(victim).wait_ready("True", timeout=180)
    isolated = app_log(cluster3, namespace, "isolated")
    last = max(t for _, t in isolated.acks)
    TIMINGS["ha_isolated_primary_last_ack_after_cut"] = last - cut_at
    ha.record("isolated_primary_last_ack_after_cut", last - cut_at)
    assert last - cut_at < ISOLATION_BOUND, (
        f"{namespace}: the partitioned primary {old} acknowledged a commit "
        f"{last - cut_at:.1f} s after the cut (bound {ISOLATION_BOUND} s)"
    )
    ha.holds_all(cluster3, namespace, new, isolated.acked_ids(), "the partition", table="isolated")
    after_return(cluster3, namespace, "partitioned", old=old)
