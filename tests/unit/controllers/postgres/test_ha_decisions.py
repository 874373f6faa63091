"""The failover controller's pure parts (controllers/postgres/ha.py): what it makes of a Pod
and its agent's report, the role labels, the rolling update's steps, the condition, how soon
it looks again; and the instance controller's hold on a scale-down that would remove the
primary."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.postgres.failover import (
    PENDING,
    Decision,
    HAConfig,
    HAState,
    MemberObservation,
    Observation,
    Phase,
    Role,
    SyncPolicy,
)
from controllers.postgres.ha import (
    HEALTHY_INTERVAL,
    LONE_INTERVAL,
    TRANSITION_INTERVAL,
    _agent_url,
    desired_roles,
    ha_config,
    lag_of,
    member_observation,
    node_ready,
    primary_condition,
    requeue_after,
    roll_step,
    timestamp,
)
from controllers.postgres.instance import rollout_progress, statefulset_replicas
from controllers.postgres.standing import Replica, Report

MEMBERS = ("db-0", "db-1", "db-2")


def pod(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:10Z", **meta},
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "agent", "ports": [{"name": "agent", "containerPort": 9}]}],
        },
        "status": {"podIP": "10.0.0.7"},
    }


def primary(name: str, lsn: int = 100, **kw: Any) -> MemberObservation:
    return MemberObservation(name, reachable=True, role=Role.PRIMARY, received_lsn=lsn, **kw)


def standby(name: str, source: str | None = "db-0", lsn: int = 100) -> MemberObservation:
    return MemberObservation(
        name, reachable=True, role=Role.STANDBY, streaming_from=source, received_lsn=lsn
    )


def observe(*members: MemberObservation) -> Observation:
    return Observation(1.0, {m.name: m for m in members})


HEALTHY = HAState(phase=Phase.HEALTHY, current_primary="db-0", target_primary="db-0")


def test_a_pod_and_its_report_make_the_members_observation() -> None:
    report = Report(
        "db-1",
        Role.STANDBY,
        ready=True,
        timeline=2,
        received_lsn=50,
        replay_lsn=40,
        position_known=True,
        streaming_from="db-0",
        lease_bounded=False,
    )
    m = member_observation("db-1", pod("db-1"), report, ready_node=True)
    assert m == MemberObservation(
        "db-1",
        reachable=True,
        role=Role.STANDBY,
        timeline=2,
        received_lsn=50,
        replay_lsn=40,
        streaming_from="db-0",
        pod_created=timestamp("2026-01-01T00:00:10Z"),
        lease_bounded=False,
    )
    silent = member_observation("db-1", pod("db-1", deletionTimestamp="x"), None, ready_node=False)
    assert not silent.reachable and silent.pod_deleting and silent.node_lost
    assert member_observation("db-1", None, report, True) == MemberObservation(
        "db-1", pod_exists=False
    )
    # A report from another member (a reused address) is no report of this one.
    assert not member_observation("db-2", pod("db-2"), report, True).reachable
    assert timestamp("garbage") is None and timestamp(None) is None


def test_node_readiness_and_the_agents_address() -> None:
    def node(status: str) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": "Ready", "status": status}]}}

    assert node_ready(node("True")) is True
    assert node_ready(node("Unknown")) is False and node_ready(node("False")) is False
    assert node_ready(None) is None and node_ready({"status": {}}) is None
    assert _agent_url(pod("db-0"), "/status") == "http://10.0.0.7:9/status"
    assert _agent_url({"status": {}}, "/status") is None
    ipv6 = {"status": {"podIP": "fd00::7"}, "spec": {}}
    assert _agent_url(ipv6, "/refresh") == "http://[fd00::7]:8008/refresh"


def test_the_configuration_comes_from_the_spec() -> None:
    instance = {
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3,
            "replication": {
                "synchronous": {"number": 1},
                "syncPolicy": "DegradeToAsync",
                "failoverDelay": 5,
            },
        },
    }
    assert ha_config(instance, "db-2") == HAConfig(
        MEMBERS,
        synchronous=True,
        sync_policy=SyncPolicy.DEGRADE_TO_ASYNC,
        failover_delay=5.0,
        switchover_to="db-2",
    )
    lone = ha_config(
        {"metadata": {"name": "db"}, "spec": {"replication": {"synchronous": {}}}}, None
    )
    assert lone.members == ("db-0",) and not lone.synchronous


def test_labels_name_the_primary_while_healthy_and_the_standbys_that_stream_from_it() -> None:
    obs = observe(
        primary("db-0"),
        standby("db-1"),
        standby("db-2", source=None),
        MemberObservation("db-3", pod_exists=False),
    )
    assert desired_roles(HEALTHY, obs) == {"db-0": "primary", "db-1": "replica", "db-2": None}
    fencing = replace(HEALTHY, phase=Phase.FENCING, target_primary=PENDING)
    assert desired_roles(fencing, obs) == {"db-0": None, "db-1": None, "db-2": None}
    deleting = observe(primary("db-0"), replace(standby("db-1"), pod_deleting=True))
    assert desired_roles(HEALTHY, deleting)["db-1"] is None


@settings(max_examples=200, deadline=None)
@given(
    phase=st.sampled_from(list(Phase)),
    current=st.sampled_from([None, *MEMBERS]),
    roles=st.lists(st.sampled_from(list(Role)), min_size=3, max_size=3),
    sources=st.lists(st.sampled_from([None, *MEMBERS]), min_size=3, max_size=3),
)
def test_at_most_one_pod_is_labelled_primary_and_only_while_healthy(
    phase: Phase, current: str | None, roles: list[Role], sources: list[str | None]
) -> None:
    state = HAState(phase=phase, current_primary=current, target_primary=current)
    obs = observe(
        *(
            MemberObservation(n, reachable=True, role=r, streaming_from=s)
            for n, r, s in zip(MEMBERS, roles, sources, strict=True)
        )
    )
    labelled = [n for n, role in desired_roles(state, obs).items() if role == "primary"]
    assert len(labelled) <= 1
    if labelled:
        assert phase == Phase.HEALTHY and labelled == [current]


def test_a_rolling_update_rolls_standbys_first_then_switches_over_then_the_old_primary() -> None:
    revisions = {"db-0": "old", "db-1": "old", "db-2": "old"}
    obs = observe(primary("db-0"), standby("db-1", lsn=90), standby("db-2", lsn=100))
    assert roll_step(HEALTHY, obs, MEMBERS, revisions, "new").delete == "db-2"
    revisions["db-2"] = "new"
    assert roll_step(HEALTHY, obs, MEMBERS, revisions, "new").delete == "db-1"
    revisions["db-1"] = "new"
    step = roll_step(HEALTHY, obs, MEMBERS, revisions, "new")
    assert step.delete is None and step.switchover_to == "db-2"  # the most advanced
    # After the switchover db-0 is a standby of db-2, and the last one to roll.
    after = replace(HEALTHY, current_primary="db-2", target_primary="db-2")
    switched = observe(standby("db-0", "db-2"), standby("db-1", "db-2"), primary("db-2"))
    assert roll_step(after, switched, MEMBERS, revisions, "new").delete == "db-0"
    revisions["db-0"] = "new"
    assert roll_step(after, switched, MEMBERS, revisions, "new") == roll_step(
        after, switched, MEMBERS, revisions, None
    )


def test_a_rolling_update_waits_for_every_member_to_stream_and_for_pods_to_return() -> None:
    revisions = {"db-0": "old", "db-1": "old", "db-2": "new"}
    lagging = observe(primary("db-0"), standby("db-1", source=None), standby("db-2"))
    step = roll_step(HEALTHY, lagging, MEMBERS, revisions, "new")
    assert step.delete is None and "db-1" in step.waiting
    gone = observe(primary("db-0"), standby("db-1"), MemberObservation("db-2", pod_exists=False))
    assert roll_step(HEALTHY, gone, MEMBERS, {"db-0": "old", "db-1": "old"}, "new").delete is None
    fencing = replace(HEALTHY, phase=Phase.FENCING)
    step = roll_step(
        fencing,
        observe(primary("db-0"), standby("db-1"), standby("db-2")),
        MEMBERS,
        revisions,
        "new",
    )
    assert step.delete is None and step.waiting
    # Pods from before the agent report nothing: while bootstrapping they roll in order.
    silent = observe(*(MemberObservation(n) for n in MEMBERS))
    boot = HAState(target_primary="db-0")
    assert roll_step(boot, silent, MEMBERS, {n: "old" for n in MEMBERS}, "new").delete == "db-2"


def test_a_lone_instance_rolls_its_only_pod() -> None:
    obs = observe(primary("db-0"))
    assert roll_step(HEALTHY, obs, ("db-0",), {"db-0": "old"}, "new").delete == "db-0"


def test_the_condition_names_the_step_and_what_it_waits_for() -> None:
    obs = observe(primary("db-0"), standby("db-1"))
    ok = primary_condition(Decision(HEALTHY), obs)
    assert ok.status == "True" and ok.reason == "PrimaryServing"
    fencing = replace(HEALTHY, phase=Phase.FENCING, switchover=True)
    waiting = primary_condition(Decision(fencing, waiting="waiting for the fence of db-0"), obs)
    assert (waiting.status, waiting.reason, waiting.message) == (
        "False",
        "SwitchoverFencing",
        "waiting for the fence of db-0",
    )
    promoting = primary_condition(Decision(replace(HEALTHY, phase=Phase.PROMOTING)), obs)
    assert promoting.reason == "FailoverPromoting"
    sick = primary_condition(Decision(HEALTHY, waiting="w"), observe(primary("db-0", ready=False)))
    assert sick.status == "False" and sick.reason == "PrimaryUnhealthy"


def test_it_looks_again_sooner_while_something_is_wrong() -> None:
    obs = observe(primary("db-0"), standby("db-1"))
    assert requeue_after(HEALTHY, 3, obs) == HEALTHY_INTERVAL
    assert requeue_after(replace(HEALTHY, phase=Phase.FENCING), 3, obs) == TRANSITION_INTERVAL
    assert requeue_after(HEALTHY, 3, observe(primary("db-0", ready=False))) == TRANSITION_INTERVAL
    assert requeue_after(HEALTHY, 1, obs) == LONE_INTERVAL


def test_lag_comes_from_the_primarys_replication_rows() -> None:
    report = Report(
        "db-0",
        Role.PRIMARY,
        ready=True,
        received_lsn=1000,
        replicas=(
            Replica("db-1", "streaming", "sync", 990, 900, 0.5),
            Replica("db-2", "catchup", "async", 0, 0, None),
        ),
    )
    assert lag_of({"db-0": report}, "db-0") == (
        {"db-1": 100, "db-2": 1000},
        {"db-1": 0.5, "db-2": 0.0},
    )
    assert lag_of({"db-0": None}, "db-0") == ({}, {})


def test_a_scale_down_keeps_the_primarys_pod_until_it_is_switched_over() -> None:
    def instance(replicas: int, primary: str | None) -> dict[str, Any]:
        return {
            "metadata": {"name": "db"},
            "spec": {"replicas": replicas},
            "status": {"currentPrimary": primary} if primary else {},
        }

    assert statefulset_replicas(instance(1, "db-2")) == 3
    assert statefulset_replicas(instance(1, "db-0")) == 1
    assert statefulset_replicas(instance(3, None)) == 3
    assert statefulset_replicas(instance(2, "other-5")) == 2


def test_an_on_delete_rollout_is_done_when_every_pod_is_updated() -> None:
    sts: dict[str, Any] = {
        "metadata": {"generation": 2},
        "spec": {"updateStrategy": {"type": "OnDelete"}},
        "status": {
            "observedGeneration": 2,
            "replicas": 3,
            "readyReplicas": 3,
            "updatedReplicas": 3,
            "currentRevision": "a",  # OnDelete never moves it
            "updateRevision": "b",
        },
    }
    assert rollout_progress(sts, 3).ready
    sts["status"]["updatedReplicas"] = 2
    assert not rollout_progress(sts, 3).rolled
