"""The reconcile helpers against the real local control plane: owner references, the finalizer
flow from delete to gone, create-or-update/patch, conditions through the status subresource,
and the event recorder's series."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.reconcile import CURRENT_RECONCILE, ReconcileContext, Request, Result
from controller_runtime.util import (
    AlreadyOwnedError,
    CleanupPending,
    ClusterScopedDependentError,
    CrossNamespaceOwnerError,
    EventRecorder,
    EventRecorderOptions,
    FinalizeAction,
    OperationResult,
    create_or_patch,
    create_or_update,
    ensure_finalizer,
    get_condition,
    handle_finalization,
    is_controlled_by,
    release_finalizer,
    set_condition,
    set_controller_reference,
    set_owner_reference,
    status_conditions,
)
from informers.shared import InformerFactory
from kubeclient.discovery import ResourceInfo
from kubeclient.errors import ConflictError, NotFoundError
from kubeclient.transport import Transport
from tests.support import watch_until

pytestmark = pytest.mark.integration

TASKS = "tasks.crpy.io/v1"
OURS = "crpy.io/cleanup"
FOREIGN = "other.example.com/keep"
THIRD = "third.example.com/gone-soon"
TEMPORARY = "crpy.io/temporary"


def task(name: str, namespace: str, priority: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"priority": priority},
    }


def configmap(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
    }


@pytest.fixture
async def client(transport: Transport) -> AsyncIterator[Client]:
    cache = Cache(InformerFactory(transport))
    yield Client(transport, cache)
    await cache.stop()


@pytest.fixture
async def other_namespace(transport: Transport) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await transport.request("POST", "/api/v1/namespaces", body=body)
    yield name
    with contextlib.suppress(ConflictError):
        await transport.request("DELETE", f"/api/v1/namespaces/{name}")


async def scope(client: Client, obj: Mapping[str, Any]) -> bool:
    """Whether ``obj``'s kind is namespaced, as discovery says."""
    return (await client.discovery.resolve(obj["apiVersion"], obj["kind"])).namespaced


# -- owner references --------------------------------------------------------------------------


async def test_owner_references_are_stored_as_set(client: Client, namespace: str) -> None:
    owner = await client.create(task("owner", namespace))
    second = await client.create(task("second", namespace))
    child = configmap("child", namespace)
    flags = {"owner_namespaced": await scope(client, owner), "obj_namespaced": True}
    set_controller_reference(owner, child, **flags)
    set_owner_reference(second, child, **flags)
    await client.create(child)

    stored = await client.live.get("v1", "ConfigMap", name="child", namespace=namespace)
    assert stored["metadata"]["ownerReferences"] == [
        {
            "apiVersion": TASKS,
            "kind": "Task",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        },
        {"apiVersion": TASKS, "kind": "Task", "name": "second", "uid": second["metadata"]["uid"]},
    ]
    assert is_controlled_by(stored, owner)
    assert not is_controlled_by(stored, second)

    # A second controller is refused before anything reaches the server.
    with pytest.raises(AlreadyOwnedError, match="already controlled by Task 'owner'"):
        set_controller_reference(second, stored, **flags)


async def test_invalid_owner_references_are_refused(
    client: Client, namespace: str, other_namespace: str
) -> None:
    owner = await client.create(task("owner", namespace))
    owner_namespaced = await scope(client, owner)
    assert owner_namespaced

    elsewhere = configmap("elsewhere", other_namespace)
    with pytest.raises(CrossNamespaceOwnerError, match="cross-namespace"):
        set_controller_reference(owner, elsewhere, owner_namespaced=True, obj_namespaced=True)

    for dependent in (
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{namespace}-x"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{namespace}-role"},
        },
    ):
        namespaced = await scope(client, dependent)
        assert not namespaced
        with pytest.raises(ClusterScopedDependentError, match="cluster-scoped"):
            set_owner_reference(owner, dependent, owner_namespaced=True, obj_namespaced=namespaced)
        assert "ownerReferences" not in dependent["metadata"]


# -- finalizers ----------------------------------------------------------------------------------


async def test_finalizer_flow_from_delete_to_gone(
    client: Client, transport: Transport, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="controller_runtime.util.finalizers")
    created = await client.create(task("doomed", namespace))

    # Two controllers add their finalizers at once, from the same (soon stale) state: the JSON
    # patch of the slower one fails its test, is recomputed, and neither is lost.
    ours, foreign = await asyncio.gather(
        ensure_finalizer(client, created, OURS), ensure_finalizer(client, created, FOREIGN)
    )
    live = await client.live.get(TASKS, "Task", name="doomed", namespace=namespace)
    assert sorted(live["metadata"]["finalizers"]) == sorted([OURS, FOREIGN])
    assert OURS in ours["metadata"]["finalizers"]
    assert FOREIGN in foreign["metadata"]["finalizers"]
    # Idempotent: nothing to do, no write.
    again = await ensure_finalizer(client, live, OURS)
    assert again is live

    # A removal computed from a stale state keeps a finalizer added since.
    stale = await ensure_finalizer(client, live, TEMPORARY)
    await ensure_finalizer(client, stale, THIRD)
    await release_finalizer(client, stale, TEMPORARY)
    live = await client.live.get(TASKS, "Task", name="doomed", namespace=namespace)
    assert sorted(live["metadata"]["finalizers"]) == sorted([OURS, FOREIGN, THIRD])

    deleting = await client.delete(live)
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")

    cleaned: list[dict[str, Any]] = []

    async def cleanup(obj: dict[str, Any]) -> None:
        cleaned.append(obj)
        # Meanwhile another controller removes its finalizer: our removal, computed before,
        # must fail its test and be recomputed rather than put that finalizer back.
        await release_finalizer(client, obj, THIRD)

    outcome = await handle_finalization(client, deleting, OURS, cleanup)
    assert outcome.action is FinalizeAction.FINALIZED and outcome.deleting
    assert len(cleaned) == 1 and cleaned[0]["metadata"]["uid"] == created["metadata"]["uid"]
    assert outcome.obj is not None
    assert outcome.obj["metadata"]["finalizers"] == [FOREIGN]
    live = await client.live.get(TASKS, "Task", name="doomed", namespace=namespace)
    assert live["metadata"]["finalizers"] == [FOREIGN]

    # Called again (a later reconcile): ours is gone, so no second cleanup.
    outcome = await handle_finalization(client, live, OURS, cleanup)
    assert outcome.action is FinalizeAction.SKIPPED and len(cleaned) == 1

    # The other controller finishes; the server deletes the object. Watch from the last
    # state so the DELETED event cannot be missed.
    base = f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks"
    rv = live["metadata"]["resourceVersion"]
    gone = asyncio.create_task(
        watch_until(
            transport,
            base,
            lambda e: e["type"] == "DELETED" and e["object"]["metadata"]["name"] == "doomed",
            params={"resourceVersion": rv, "fieldSelector": "metadata.name=doomed"},
        )
    )
    await release_finalizer(client, live, FOREIGN)
    await gone
    # Each race above was noticed and the patch recomputed (not merely lucky ordering).
    assert sum("raced" in r.getMessage() for r in caplog.records) >= 3
    with pytest.raises(NotFoundError):
        await client.live.get(TASKS, "Task", name="doomed", namespace=namespace)


async def test_handle_finalization_adds_then_reports_unchanged(
    client: Client, namespace: str
) -> None:
    created = await client.create(task("kept", namespace))

    async def never(obj: dict[str, Any]) -> None:
        raise AssertionError("cleanup must not run on an object that is not being deleted")

    first = await handle_finalization(client, created, OURS, never)
    assert first.action is FinalizeAction.ADDED and not first.deleting
    assert first.obj is not None
    second = await handle_finalization(client, first.obj, OURS, never)
    assert second.action is FinalizeAction.UNCHANGED

    # A failing cleanup keeps the finalizer (and the error reaches the reconcile).
    deleting = await client.delete(first.obj)
    assert deleting is not None

    async def failing(obj: dict[str, Any]) -> None:
        raise RuntimeError("backend unavailable")

    with pytest.raises(RuntimeError, match="backend unavailable"):
        await handle_finalization(client, deleting, OURS, failing)
    live = await client.live.get(TASKS, "Task", name="kept", namespace=namespace)
    assert live["metadata"]["finalizers"] == [OURS]

    # Cleanup that is not finished yet keeps the finalizer too, without an error, and says
    # when to look again; an event-driven wait asks for no requeue.
    async def waiting(obj: dict[str, Any]) -> CleanupPending:
        return CleanupPending("waiting for dependents", requeue_after=7.5)

    pending = await handle_finalization(client, live, OURS, waiting)
    assert pending.action is FinalizeAction.PENDING and pending.deleting
    assert pending.result == Result(requeue_after=7.5)
    assert pending.pending is not None and pending.pending.message == "waiting for dependents"

    async def waiting_for_events(obj: dict[str, Any]) -> CleanupPending:
        return CleanupPending("waiting for a watched object")

    assert (await handle_finalization(client, live, OURS, waiting_for_events)).result is None
    live = await client.live.get(TASKS, "Task", name="kept", namespace=namespace)
    assert live["metadata"]["finalizers"] == [OURS]

    # Once cleanup finishes, the finalizer goes (and the server deletes the object).
    finished = await handle_finalization(client, live, OURS, _no_cleanup)
    assert finished.action is FinalizeAction.FINALIZED and finished.result is None
    with pytest.raises(NotFoundError):
        await client.live.get(TASKS, "Task", name="kept", namespace=namespace)


async def _no_cleanup(obj: dict[str, Any]) -> None:
    return None


async def test_finalizer_helpers_never_touch_a_recreated_object(
    client: Client, namespace: str
) -> None:
    old = await client.create(task("phoenix", namespace))
    await client.delete(old)
    new = await client.create(task("phoenix", namespace))
    with pytest.raises(NotFoundError, match="recreated"):
        await ensure_finalizer(client, old, OURS)
    outcome = await handle_finalization(client, old, OURS, cleanup=_unexpected_cleanup)
    assert outcome.action is FinalizeAction.SKIPPED and outcome.obj is None
    live = await client.live.get(TASKS, "Task", name="phoenix", namespace=namespace)
    assert live["metadata"]["uid"] == new["metadata"]["uid"]
    assert "finalizers" not in live["metadata"]


async def _unexpected_cleanup(obj: dict[str, Any]) -> None:
    raise AssertionError("cleanup must not run")


@pytest.mark.parametrize("new_deleting", [False, True], ids=["new-alive", "new-deleting"])
async def test_finalization_of_a_stale_deleted_object_never_cleans_up_its_successor(
    client: Client, namespace: str, new_deleting: bool
) -> None:
    """A cache (a new leader's, say) still shows the old incarnation being deleted with our
    finalizer, while the server already deleted it and holds a new object of that name with
    our finalizer: the cleanup must not run for the new one, nor its finalizer go."""
    old = await client.create(task("reborn", namespace))
    old = await ensure_finalizer(client, old, OURS)
    stale = await client.delete(old)
    assert stale is not None and stale["metadata"].get("deletionTimestamp")
    await release_finalizer(client, stale, OURS)  # the old leader finished it
    new = await client.create(task("reborn", namespace))
    new = await ensure_finalizer(client, new, OURS)
    if new_deleting:
        deleted = await client.delete(new)
        assert deleted is not None
    cleaned: list[dict[str, Any]] = []

    async def cleanup(obj: dict[str, Any]) -> None:
        cleaned.append(obj)

    outcome = await handle_finalization(client, stale, OURS, cleanup)
    assert [c["metadata"]["uid"] for c in cleaned] == []
    assert outcome.action is FinalizeAction.SKIPPED and outcome.obj is None
    live = await client.live.get(TASKS, "Task", name="reborn", namespace=namespace)
    assert live["metadata"]["uid"] == new["metadata"]["uid"]
    assert live["metadata"]["finalizers"] == [OURS]
    await release_finalizer(client, live, OURS)


# -- create or update / patch ------------------------------------------------------------------


async def test_create_or_update_created_updated_unchanged(client: Client, namespace: str) -> None:
    template = configmap("settings", namespace)
    wanted = {"mode": "fast"}

    def mutate(obj: dict[str, Any]) -> None:
        obj["data"] = dict(wanted)
        obj["metadata"].setdefault("labels", {})["app"] = "demo"

    result, created = await create_or_update(client, template, mutate)
    assert result is OperationResult.CREATED
    assert created["data"] == {"mode": "fast"}
    assert "data" not in template  # the template is not modified

    result, same = await create_or_update(client, template, mutate)
    assert result is OperationResult.UNCHANGED
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

    wanted["mode"] = "safe"

    async def mutate_async(obj: dict[str, Any]) -> None:
        mutate(obj)

    result, updated = await create_or_update(client, template, mutate_async)
    assert result is OperationResult.UPDATED
    live = await client.live.get("v1", "ConfigMap", name="settings", namespace=namespace)
    assert live["data"] == {"mode": "safe"}
    assert live["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]

    def rename(obj: dict[str, Any]) -> None:
        obj["metadata"]["name"] = "other"

    with pytest.raises(ValueError, match="must not change"):
        await create_or_update(client, template, rename)


async def test_create_or_patch_writes_the_difference_and_the_status(
    client: Client, namespace: str
) -> None:
    template = task("patched", namespace)
    now = datetime(2024, 1, 1, tzinfo=UTC)

    def desired(priority: int, ready: bool) -> Any:
        def mutate(obj: dict[str, Any]) -> None:
            obj["spec"]["priority"] = priority
            set_condition(
                status_conditions(obj),
                "Ready",
                ready,
                reason="Checked",
                observed_generation=obj["metadata"].get("generation", 1),
                now=now,
            )

        return mutate

    result, created = await create_or_patch(client, template, desired(2, False))
    assert result is OperationResult.CREATED
    # The create ignored status (status subresource); it was patched in afterwards.
    assert get_condition(status_conditions(created), "Ready") is not None

    # A label set by someone else survives: only the difference is sent.
    await client.patch(created, {"metadata": {"labels": {"team": "blue"}}})
    result, _ = await create_or_patch(client, template, desired(2, False))
    assert result is OperationResult.UNCHANGED

    result, latest = await create_or_patch(client, template, desired(3, False))
    assert result is OperationResult.UPDATED
    assert latest["spec"]["priority"] == 3 and latest["metadata"]["labels"] == {"team": "blue"}

    result, latest = await create_or_patch(client, template, desired(3, True))
    assert result is OperationResult.UPDATED_STATUS_ONLY
    assert get_condition(status_conditions(latest), "Ready") == {
        "type": "Ready",
        "status": "True",
        "observedGeneration": latest["metadata"]["generation"],
        "reason": "Checked",
        "message": "",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
    }

    result, latest = await create_or_patch(
        client, template, desired(1, False), optimistic_lock=True
    )
    assert result is OperationResult.UPDATED_STATUS
    live = await client.live.get(TASKS, "Task", name="patched", namespace=namespace)
    assert live["spec"]["priority"] == 1
    condition = get_condition(status_conditions(live), "Ready")
    assert condition is not None and condition["status"] == "False"


# -- conditions ----------------------------------------------------------------------------------


async def test_conditions_round_trip_through_the_status_subresource(
    client: Client, namespace: str
) -> None:
    obj = await client.create(task("cond", namespace))
    generation = obj["metadata"]["generation"]
    t0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)

    conditions = status_conditions(obj)
    set_condition(
        conditions, "Ready", False, reason="Waiting", observed_generation=generation, now=t0
    )
    obj = await client.update_status(obj)
    stored = get_condition(status_conditions(obj), "Ready")
    assert stored == {
        "type": "Ready",
        "status": "False",
        "observedGeneration": generation,
        "reason": "Waiting",
        "message": "",
        "lastTransitionTime": "2024-05-01T12:00:00Z",
    }

    # Same status, new reason: the server keeps the old transition time.
    live = await client.live.get(TASKS, "Task", name="cond", namespace=namespace)
    changed = set_condition(
        status_conditions(live),
        "Ready",
        False,
        reason="StillWaiting",
        observed_generation=generation,
        now=t0 + timedelta(hours=1),
    )
    assert changed
    live = await client.update_status(live)
    stored = get_condition(status_conditions(live), "Ready")
    assert stored is not None and stored["reason"] == "StillWaiting"
    assert stored["lastTransitionTime"] == "2024-05-01T12:00:00Z"

    # Status change: the transition time moves.
    set_condition(
        status_conditions(live),
        "Ready",
        True,
        reason="Done",
        observed_generation=generation,
        now=t0 + timedelta(hours=2),
    )
    await client.update_status(live)
    live = await client.live.get(TASKS, "Task", name="cond", namespace=namespace)
    stored = get_condition(status_conditions(live), "Ready")
    assert stored is not None and stored["status"] == "True"
    assert stored["lastTransitionTime"] == "2024-05-01T14:00:00Z"


# -- events ----------------------------------------------------------------------------------------


async def list_events(transport: Transport, namespace: str) -> list[dict[str, Any]]:
    answer = await transport.get_json(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    return list(answer["items"])


class _Guard:
    """A consistency guard that remembers what it was told."""

    def __init__(self) -> None:
        self.writes: list[Mapping[str, Any]] = []

    def record_write(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        self.writes.append(obj)

    def record_delete(
        self, request: Request, resource: ResourceInfo, obj: Mapping[str, Any]
    ) -> None:
        self.writes.append(obj)

    def check(self, request: Request) -> float | None:
        return None


async def test_event_recorder_aggregates_repeats_into_a_series(
    client: Client, transport: Transport, namespace: str
) -> None:
    subject = await client.create(task("noisy", namespace))
    recorder = EventRecorder(
        client, reporting_controller="crpy.io/test-controller", reporting_instance="test-0"
    )
    guard = _Guard()
    token = CURRENT_RECONCILE.set(
        ReconcileContext("test", Request(namespace, "noisy"), "r-1", guard=guard)
    )
    try:
        recorder.record(subject, "Warning", "SyncFailed", "backend unavailable", "Sync")
        await recorder.flush()
        (first,) = await list_events(transport, namespace)
        assert "series" not in first
        for _ in range(9):
            recorder.record(subject, "Warning", "SyncFailed", "backend unavailable", "Sync")
        await recorder.flush()
    finally:
        CURRENT_RECONCILE.reset(token)
    # Event writes happen in the recorder's own context, not in the recording reconcile's.
    assert guard.writes == []

    (event,) = await list_events(transport, namespace)
    assert event["metadata"]["name"] == first["metadata"]["name"]  # patched, not recreated
    assert event["series"]["count"] == 10
    assert event["series"]["lastObservedTime"] >= event["eventTime"]
    assert event["regarding"]["uid"] == subject["metadata"]["uid"]
    assert (event["type"], event["reason"], event["action"], event["note"]) == (
        "Warning",
        "SyncFailed",
        "Sync",
        "backend unavailable",
    )
    assert event["reportingController"] == "crpy.io/test-controller"
    assert event["reportingInstance"] == "test-0"

    # A different note is a different event; bad input is dropped, not raised.
    recorder.record(subject, "Normal", "Synced", "all good", "Sync")
    recorder.record(subject, "Bogus", "Synced", "all good", "Sync")
    recorder.record({"kind": "Task"}, "Normal", "Synced", "all good", "Sync")
    assert recorder.dropped == 2
    await recorder.close()
    events = await list_events(transport, namespace)
    assert sorted(e["reason"] for e in events) == ["SyncFailed", "Synced"]


async def test_event_recorder_rate_limits_one_object(transport: Transport, namespace: str) -> None:
    subject = (
        await transport.request(
            "POST",
            f"/apis/tasks.crpy.io/v1/namespaces/{namespace}/tasks",
            body=task("hot", namespace),
        )
    ).json()
    recorder = EventRecorder(
        transport,
        reporting_controller="crpy.io/test-controller",
        reporting_instance="test-0",
        options=EventRecorderOptions(burst=3, refill_seconds=3600),
    )
    for i in range(20):
        recorder.record(subject, "Normal", "Step", f"step {i}", "Run")
    # The writer spends the burst, then waits for tokens.
    await recorder.wait_idle()
    assert len(await list_events(transport, namespace)) == 3
    assert recorder.pending == 17
    # A flush writes everything regardless.
    await recorder.flush()
    events = await list_events(transport, namespace)
    assert sorted(e["note"] for e in events) == sorted(f"step {i}" for i in range(20))
    await recorder.close()


async def test_event_about_a_cluster_scoped_object_goes_to_default(
    transport: Transport, namespace: str
) -> None:
    subject = (await transport.request("GET", f"/api/v1/namespaces/{namespace}")).json()
    recorder = EventRecorder(
        transport, reporting_controller="crpy.io/test-controller", reporting_instance="test-0"
    )
    recorder.record(subject, "Normal", "Observed", f"namespace {namespace}", "Observe")
    await recorder.close()
    events = [
        e for e in await list_events(transport, "default") if e["regarding"]["name"] == namespace
    ]
    assert len(events) == 1 and "namespace" not in events[0]["regarding"]
    for event in events:
        await transport.request(
            "DELETE",
            f"/apis/events.k8s.io/v1/namespaces/default/events/{event['metadata']['name']}",
        )
