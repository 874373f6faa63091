"""Releasing the leader-election Lease on a clean stop, when a renewal cancelled in flight
landed after all (its answer never read, so the Lease's resourceVersion moved on): the
release still hands the Lease over at once, unless someone else holds it by then."""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.leaderelection import LeaderElectionConfig, LeaderElector
from kubeclient.transport import Transport

pytestmark = pytest.mark.integration


async def _lease(transport: Transport, namespace: str) -> dict[str, Any]:
    lease: dict[str, Any] = await transport.get_json(
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/operator"
    )
    return lease


async def _touch(transport: Transport, namespace: str, **spec: Any) -> None:
    """Another write of the Lease (what a renewal landing unseen looks like: the same holder,
    a new resourceVersion)."""
    lease = await _lease(transport, namespace)
    lease["spec"] |= spec
    lease["metadata"].setdefault("annotations", {})["test/touched"] = "yes"
    await transport.request(
        "PUT",
        f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/operator",
        body=lease,
    )


async def test_a_release_after_a_renewal_landed_unseen_still_hands_the_lease_over(
    transport: Transport, namespace: str
) -> None:
    elector = LeaderElector(
        transport, LeaderElectionConfig(namespace=namespace, name="operator", identity="a")
    )
    await elector.acquire()
    await _touch(transport, namespace)

    assert await elector.release()
    spec = (await _lease(transport, namespace))["spec"]
    assert spec.get("holderIdentity") is None and spec["leaseDurationSeconds"] == 1


async def test_a_release_never_gives_up_a_lease_someone_else_holds_by_then(
    transport: Transport, namespace: str
) -> None:
    elector = LeaderElector(
        transport, LeaderElectionConfig(namespace=namespace, name="operator", identity="a")
    )
    await elector.acquire()
    await _touch(transport, namespace, holderIdentity="b")

    assert not await elector.release()
    assert (await _lease(transport, namespace))["spec"]["holderIdentity"] == "b"
