"""The PostgresInstance controller's decide steps, which need no server: the rollout's
conditions, the Degraded summary, kept volume claim templates and the external version."""

from __future__ import annotations

from typing import Any

from controller_runtime import Condition
from controllers.postgres import render
from controllers.postgres.instance import (
    degraded_condition,
    external_verdict,
    kept_claim_templates,
    rollout_progress,
)
from controllers.postgres.policy import Version


def sts(generation: int = 2, **status: Any) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {}, "status": status}


def instance(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "db", "namespace": "ns", "generation": 1},
        "spec": {"version": "16", **spec},
    }


def test_a_rolled_out_statefulset_with_every_replica_ready_is_ready() -> None:
    done = rollout_progress(
        sts(observedGeneration=2, replicas=2, readyReplicas=2, updatedReplicas=2,
            currentRevision="a", updateRevision="a"),
        2,
    )  # fmt: skip
    assert done.ready and done.rolled and done.ready_replicas == 2
    ready, progressing = done.conditions()
    assert ready == Condition("Ready", True, "AllReplicasReady", "2/2 replicas ready, 2 updated")
    assert (progressing.status, progressing.reason) == ("False", "RolledOut")


def test_an_unobserved_or_half_updated_statefulset_is_rolling_out() -> None:
    stale = rollout_progress(sts(observedGeneration=1, readyReplicas=1, updatedReplicas=1), 1)
    assert not stale.rolled and not stale.ready
    assert [c.reason for c in stale.conditions()] == ["NotReady", "RollingOut"]
    half = rollout_progress(
        sts(observedGeneration=2, readyReplicas=2, updatedReplicas=1, currentRevision="a",
            updateRevision="b"),
        2,
    )  # fmt: skip
    assert not half.rolled and half.conditions()[1].is_true


def test_rolled_out_but_not_all_ready_waits_for_replicas() -> None:
    waiting = rollout_progress(
        sts(observedGeneration=2, replicas=2, readyReplicas=1, updatedReplicas=2), 2
    )
    assert waiting.rolled and not waiting.ready
    assert waiting.conditions()[1].reason == "WaitingForReplicas"


def test_a_pending_restore_keeps_a_ready_rollout_not_ready() -> None:
    done = rollout_progress(
        sts(observedGeneration=2, replicas=1, readyReplicas=1, updatedReplicas=1), 1
    )
    ready, progressing = done.restoring("waiting for Backup 'b' to succeed").conditions()
    assert ready == Condition("Ready", False, "Restoring", "waiting for Backup 'b' to succeed")
    assert progressing.is_true  # not ready: still progressing


def test_a_scale_down_is_not_ready_while_surplus_pods_remain() -> None:
    # 3 -> 1 without a template change: the StatefulSet still counts 3 ready pods while it
    # deletes two of them; the instance is not Ready with one pod until they are gone.
    shrinking = rollout_progress(
        sts(observedGeneration=2, replicas=3, readyReplicas=3, updatedReplicas=3,
            currentRevision="a", updateRevision="a"),
        1,
    )  # fmt: skip
    assert not shrinking.ready and not shrinking.rolled
    assert shrinking.message == "3/1 replicas ready, 3 updated, 2 more to remove"
    done = rollout_progress(
        sts(observedGeneration=2, replicas=1, readyReplicas=1, updatedReplicas=1,
            currentRevision="a", updateRevision="a"),
        1,
    )  # fmt: skip
    assert done.ready


def test_degraded_names_the_first_problem_and_every_message() -> None:
    assert degraded_condition([]) == Condition("Degraded", False, "AsExpected", "")
    both = degraded_condition(
        [Condition("Degraded", True, "VersionDisabled", "a"), Condition("Degraded", True, "X", "b")]
    )
    assert both == Condition("Degraded", True, "VersionDisabled", "a; b")


def test_claim_templates_are_kept_and_a_storage_change_is_reported() -> None:
    assert kept_claim_templates(instance(), None) == (None, None)
    wanted = instance(storage={"size": "1Gi"})
    same = render.volume_claim_templates(wanted)
    existing = {"metadata": {}, "spec": {"volumeClaimTemplates": same}}
    assert kept_claim_templates(wanted, existing) == (same, None)
    bigger = instance(storage={"size": "5Gi"})
    claims, problem = kept_claim_templates(bigger, existing)
    assert claims == same  # the StatefulSet's templates cannot change
    assert problem is not None and problem.reason == "StorageChangeNotApplied"


def test_an_external_server_must_run_the_major_version_asked_for() -> None:
    policy = {"spec": {"versions": [{"version": "16"}, {"version": "15"}]}}
    mismatch = external_verdict(instance(version="15"), policy, Version(16, 2))
    assert not mismatch.accepted and mismatch.reason == "VersionMismatch"
    assert "spec.version is 15 but the server runs 16.2" in mismatch.message
    assert external_verdict(instance(version="16"), policy, Version(16, 2)).accepted
    disabled = {"spec": {"versions": [{"version": "16", "enabled": False}]}}
    assert not external_verdict(instance(version="16"), disabled, Version(16, 2)).accepted
