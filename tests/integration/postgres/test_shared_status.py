"""The PostgresInstance status's two writers on the real API server: the instance
controller's write, refused with 409 because the failover controller wrote since it read, is
rebased and lands; a write whose own fields moved (a stale read) is still refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller_runtime import ConflictError
from controller_runtime.client import Client
from controllers.postgres.api import API_VERSION
from controllers.postgres.common import write_status
from controllers.postgres.shared_status import (
    owned_by_failover,
    owned_by_instance,
    write_shared_status,
)

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


def cond(kind: str, status: str) -> Obj:
    return {
        "type": kind,
        "status": status,
        "reason": "Test",
        "message": "",
        "lastTransitionTime": "2026-12-05T00:00:00Z",
    }


async def _instance(kube: Client, namespace: str) -> Obj:
    created = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "PostgresInstance",
            "metadata": {"name": "pg", "namespace": namespace},
            "spec": {"version": "16", "replicas": 3},
        }
    )
    return await write_status(
        kube,
        created,
        {
            "readyReplicas": 0,
            "conditions": [cond("Ready", "False"), cond("PrimaryAvailable", "False")],
        },
    )


async def test_a_write_that_lost_to_the_other_writer_is_rebased(
    kube: Client, namespace: str
) -> None:
    read = await _instance(kube, namespace)
    # The failover controller writes its fields and condition after the read.
    theirs = copy.deepcopy(read["status"])
    theirs["currentPrimary"] = "pg-1"
    theirs["conditions"] = [cond("Ready", "False"), cond("PrimaryAvailable", "True")]
    await write_status(kube, read, theirs)
    # The instance controller's status, computed from its (now outdated) read.
    mine = copy.deepcopy(read["status"])
    mine["readyReplicas"] = 3
    mine["conditions"] = [cond("Ready", "True"), cond("PrimaryAvailable", "False")]
    with pytest.raises(ConflictError):
        await write_status(kube, read, mine)  # what a plain write does
    await write_shared_status(kube, read, mine, mine=owned_by_instance)
    live = await kube.live.get(API_VERSION, "PostgresInstance", name="pg", namespace=namespace)
    status = live["status"]
    assert status["readyReplicas"] == 3 and status["currentPrimary"] == "pg-1"
    kinds = {c["type"]: c["status"] for c in status["conditions"]}
    assert kinds == {"Ready": "True", "PrimaryAvailable": "True"}


async def test_a_write_whose_own_fields_moved_is_refused(kube: Client, namespace: str) -> None:
    read = await _instance(kube, namespace)
    newer = copy.deepcopy(read["status"])
    newer["readyReplicas"] = 2  # the instance controller's own field, written since
    await write_status(kube, read, newer)
    stale = copy.deepcopy(read["status"])
    stale["conditions"] = [cond("Ready", "True"), cond("PrimaryAvailable", "False")]
    with pytest.raises(ConflictError):
        await write_shared_status(kube, read, stale, mine=owned_by_instance)
    # The failover controller, for which readyReplicas is the other writer's field, rebases.
    ha = copy.deepcopy(read["status"])
    ha["currentPrimary"] = "pg-0"
    await write_shared_status(kube, read, ha, mine=owned_by_failover)
    live = await kube.live.get(API_VERSION, "PostgresInstance", name="pg", namespace=namespace)
    assert live["status"]["readyReplicas"] == 2 and live["status"]["currentPrimary"] == "pg-0"


async def test_a_spec_change_since_the_read_is_refused(kube: Client, namespace: str) -> None:
    read = await _instance(kube, namespace)
    await kube.patch(read, {"spec": {"replicas": 1}})
    mine = copy.deepcopy(read["status"])
    mine["readyReplicas"] = 3
    with pytest.raises(ConflictError):
        await write_shared_status(kube, read, mine, mine=owned_by_instance)
