"""The client against the real local control plane: every typed error where the server raises
it, every write verb, conflicts and their retry helper, and the read-your-writes guard with a
watch frozen by a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client, ignore_not_found, retry_on_conflict
from controller_runtime.consistency import ReadYourWritesGuard
from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.faultproxy import FaultProxy
from controller_runtime.errors import (
    AlreadyExistsError,
    ApiError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotCachedError,
    NotFoundError,
    ServerTimeoutError,
    TooManyRequestsError,
)
from controller_runtime.reconcile import CURRENT_RECONCILE, ReconcileContext, Request
from informers.shared import InformerFactory
from informers.store import StoreDelta
from kubeclient.config import ClusterConfig, load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.transport import Transport
from tests.support import ClusterParts, grant_list_configmaps, until_allowed, watch_until

pytestmark = pytest.mark.integration

TASKS = "tasks.crpy.io/v1"


def configmap(name: str, namespace: str, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data or {},
    }


def task(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": TASKS,
        "kind": "Task",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
async def cache(transport: Transport) -> AsyncIterator[Cache]:
    c = Cache(InformerFactory(transport))
    yield c
    await c.stop()


@pytest.fixture
def client(transport: Transport, cache: Cache) -> Client:
    return Client(transport, cache)


# ------------------------------------------------------------------------------ cached reads


async def test_a_list_of_every_namespace_spans_the_namespaces_a_restricted_cache_holds(
    transport: Transport, namespace: str
) -> None:
    # Two cached namespaces and one the cache does not hold.
    others = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in others:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await transport.request("POST", "/api/v1/namespaces", body=body)
    cached, outside = [namespace, others[0]], others[1]
    cache = Cache(InformerFactory(transport), namespaces=cached)
    try:
        client = Client(transport, cache)
        for ns in (*cached, outside):
            await client.create(configmap("cm", ns))
        await cache.watch("v1", "ConfigMap")
        await cache.wait_for_sync(30)
        # (Only ours: a cluster may publish a CA ConfigMap into every namespace.)
        everything = [
            o for o in await client.list("v1", "ConfigMap") if o["metadata"]["name"] == "cm"
        ]
        assert sorted(o["metadata"]["namespace"] for o in everything) == sorted(cached)
        assert [o["metadata"]["name"] for o in cache.list("v1", "ConfigMap", namespace=others[0])]
        with pytest.raises(NotCachedError, match="outside the cache's scope"):
            await client.list("v1", "ConfigMap", namespace=outside)
        with pytest.raises(NotCachedError, match="outside the cache's scope"):
            await client.get("v1", "ConfigMap", name="cm", namespace=outside)
    finally:
        await cache.stop()
        for name in others:
            await transport.request("DELETE", f"/api/v1/namespaces/{name}")


async def test_cached_reads_of_an_unwatched_kind_fail_with_guidance(
    client: Client, cache: Cache, namespace: str
) -> None:
    for read in (
        client.get("v1", "Secret", name="s", namespace=namespace),
        client.list("v1", "Secret", namespace=namespace),
    ):
        with pytest.raises(NotCachedError) as caught:
            await read
        assert "cache.watch" in str(caught.value) and "client.live" in str(caught.value)
    assert cache.factory.informers() == []  # nothing started a watch behind our back

    # Once watched, the same reads are served from the cache.
    await client.create(configmap("cm", namespace))
    await cache.watch("v1", "ConfigMap")
    await cache.wait_for_sync(30)
    # The create came before the watch started, so the initial list holds it.
    assert f"{namespace}/cm" in cache.factory.informers()[0].store
    assert (await client.get("v1", "ConfigMap", name="cm", namespace=namespace))["metadata"][
        "name"
    ] == "cm"
    assert [
        o["metadata"]["name"] for o in await client.list("v1", "ConfigMap", namespace=namespace)
    ]
    with pytest.raises(NotFoundError):
        await client.get("v1", "ConfigMap", name="absent", namespace=namespace)


async def test_every_keyed_method_takes_a_request_or_keywords_and_refuses_positional_names(
    client: Client, cache: Cache, namespace: str
) -> None:
    await cache.watch("v1", "ConfigMap")
    await cache.wait_for_sync(30)
    created = await client.create(configmap("keyed", namespace, {"v": "1"}))
    request = Request(namespace, "keyed")
    store = cache.factory.informers()[0].store
    assert await store.wait_for_resource_version(created["metadata"]["resourceVersion"], 30)

    for read in (client.get, client.live.get):
        by_request = await read("v1", "ConfigMap", request)
        by_keywords = await read("v1", "ConfigMap", name="keyed", namespace=namespace)
        assert by_request["metadata"]["uid"] == by_keywords["metadata"]["uid"]
        assert by_request["metadata"]["uid"] == created["metadata"]["uid"]
        # The old positional form, either way round, fails loudly instead of reading
        # "not found".
        for swapped in ((namespace, "keyed"), ("keyed", namespace)):
            with pytest.raises(TypeError):
                await read("v1", "ConfigMap", *swapped)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="name="):
            await read("v1", "ConfigMap", "keyed")  # type: ignore[call-overload]
    assert cache.get("v1", "ConfigMap", request)["metadata"]["name"] == "keyed"

    def bump(obj: dict[str, Any]) -> None:
        obj["data"]["v"] = "2"

    mutated = await client.mutate_with_retry("v1", "ConfigMap", request, mutate=bump)
    assert mutated["data"] == {"v": "2"}

    # ignore_not_found: None for an absent object, the object otherwise, and a kind the cache
    # does not watch is still an error.
    assert await ignore_not_found(client.get("v1", "ConfigMap", Request(namespace, "no"))) is None
    assert (await ignore_not_found(client.live.get("v1", "ConfigMap", request))) is not None
    with pytest.raises(NotCachedError):
        await ignore_not_found(client.get("v1", "Secret", name="s", namespace=namespace))

    # delete: by key (Request or keywords) as well as by object.
    assert await client.delete("v1", "ConfigMap", request) is None
    await client.create(configmap("by-keywords", namespace))
    assert await client.delete("v1", "ConfigMap", name="by-keywords", namespace=namespace) is None
    with pytest.raises(NotFoundError):
        await client.live.get("v1", "ConfigMap", name="by-keywords", namespace=namespace)
    with pytest.raises(TypeError, match="not both"):
        await client.delete(configmap("x", namespace), "ConfigMap")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=r"needs metadata\.namespace"):
        await client.delete("v1", "ConfigMap", name="no-namespace")


# ------------------------------------------------------------------------------ typed errors


async def test_not_found_and_already_exists(client: Client, namespace: str) -> None:
    with pytest.raises(NotFoundError) as missing:
        await client.live.get("v1", "ConfigMap", name="absent", namespace=namespace)
    assert missing.value.status == 404 and missing.value.reason == "NotFound"
    with pytest.raises(NotFoundError):
        await client.patch(configmap("absent", namespace), {"data": {"a": "b"}})
    with pytest.raises(NotFoundError):
        await client.delete(configmap("absent", namespace))

    await client.create(configmap("twice", namespace))
    with pytest.raises(AlreadyExistsError) as exists:
        await client.create(configmap("twice", namespace))
    assert exists.value.status == 409 and exists.value.reason == "AlreadyExists"


async def test_a_stale_update_is_a_conflict(client: Client, namespace: str) -> None:
    first = await client.create(configmap("cm", namespace, {"v": "1"}))
    second = await client.update({**first, "data": {"v": "2"}})
    assert second["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    with pytest.raises(ConflictError) as stale:
        await client.update({**first, "data": {"v": "3"}})
    assert not isinstance(stale.value, AlreadyExistsError)
    assert stale.value.reason == "Conflict" and "has been modified" in stale.value.message
    assert (await client.live.get("v1", "ConfigMap", name="cm", namespace=namespace))["data"] == {
        "v": "2"
    }
    unversioned = configmap("cm", namespace, {"v": "4"})
    with pytest.raises(ValueError, match="resourceVersion"):
        await client.update(unversioned)


async def test_invalid_carries_the_field_causes(client: Client, namespace: str) -> None:
    with pytest.raises(InvalidError) as schema:
        await client.create(task("too-high", namespace, priority=7))
    assert schema.value.status == 422
    assert any(c.get("field") == "spec.priority" for c in schema.value.causes), schema.value.causes

    with pytest.raises(InvalidError) as rule:  # the CEL rule: priority 4 or 5 needs a deadline
        await client.create(task("urgent", namespace, priority=4))
    causes = rule.value.causes
    assert any(
        c.get("field") == "spec.deadline"
        and c.get("reason") == "FieldValueRequired"
        and "needs a deadline" in c.get("message", "")
        for c in causes
    ), causes


async def test_forbidden_for_an_identity_rbac_gives_nothing(
    control_plane: ControlPlane, namespace: str
) -> None:
    if use_existing_cluster():
        pytest.skip("minting a user needs the local control plane's CA")
    identity = control_plane.mint_identity(f"nobody-{uuid.uuid4().hex[:6]}")
    async with Transport(await load_kubeconfig(identity.kubeconfig)) as nobody:
        cache = Cache(InformerFactory(nobody))
        client = Client(nobody, cache)
        with pytest.raises(ForbiddenError) as denied:
            await client.create(configmap("cm", namespace))
        assert denied.value.status == 403 and identity.user in denied.value.message
        with pytest.raises(ForbiddenError):
            await client.live.list("v1", "ConfigMap", namespace=namespace)


# ------------------------------------------------------------------ 429 from a throttled plane


async def test_too_many_requests_carries_retry_after_and_reads_are_retried(
    throttled_plane: ControlPlane,
) -> None:
    # system:masters is exempt from the in-flight limit; a plain user is not.
    await grant_list_configmaps(throttled_plane, "lister")
    config = await load_kubeconfig(throttled_plane.mint_identity("lister").kubeconfig)
    statuses: list[int] = []
    async with (
        Transport(config, max_retries=0) as no_retries,
        Transport(config, observer=lambda m, s, t: statuses.append(s)) as retrying,
    ):
        await until_allowed(retrying, "list", "configmaps")
        # Discovery through the retrying transport: only the list burst should meet the limit.
        discovery = Discovery(retrying)
        await discovery.resolve("v1", "ConfigMap")
        impatient = Client(no_retries, Cache(InformerFactory(no_retries, discovery)))
        answers = await asyncio.gather(
            *(impatient.live.list("v1", "ConfigMap", namespace="default") for _ in range(40)),
            return_exceptions=True,
        )
        refused = [a for a in answers if isinstance(a, BaseException)]
        assert refused, "flow control never pushed back"
        assert all(isinstance(e, TooManyRequestsError) for e in refused), refused
        throttled = [e for e in refused if isinstance(e, TooManyRequestsError)]
        assert all(e.status == 429 and e.retry_after == 1.0 for e in throttled)

        # With the transport's default retries, the same burst gets through.
        patient = Client(retrying, Cache(InformerFactory(retrying, discovery)))
        lists = await asyncio.gather(
            *(patient.live.list("v1", "ConfigMap", namespace="default") for _ in range(40))
        )
        assert all(isinstance(items, list) for items in lists)
        assert 429 in statuses


# -------------------------------------------------------------- timeouts through a frozen link


def _via(config: ClusterConfig, proxy: FaultProxy) -> ClusterConfig:
    return dataclasses.replace(config, server=proxy.url)


@pytest.fixture
async def proxy(control_plane: ControlPlane) -> AsyncIterator[FaultProxy]:
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    p = await FaultProxy(host, int(port)).start()
    yield p
    p.thaw()
    await p.stop()


async def test_a_write_that_times_out_is_a_server_timeout_and_is_not_retried(
    admin_config: ClusterConfig, proxy: FaultProxy, namespace: str
) -> None:
    methods: list[str] = []
    async with Transport(
        _via(admin_config, proxy),
        request_timeout=1.0,
        max_retries=0,
        observer=lambda m, s, t: methods.append(m),
    ) as slow:
        # A per-client timeout, passed with every request.
        client = Client(slow, Cache(InformerFactory(slow)), timeout=1.0)
        await client.discovery.resolve("v1", "ConfigMap")
        proxy.freeze()
        with pytest.raises(ServerTimeoutError) as timed_out:
            await client.create(configmap("maybe", namespace))
        assert timed_out.value.status == 0 and "outcome is unknown" in timed_out.value.message
        assert methods.count("POST") == 1, methods  # never blindly repeated
        with pytest.raises(ServerTimeoutError):
            await client.live.get("v1", "ConfigMap", name="maybe", namespace=namespace)


# -------------------------------------------------------------------------------- patches


async def test_merge_json_and_strategic_patches(client: Client, namespace: str) -> None:
    cm = await client.create(configmap("cm", namespace, {"a": "1", "b": "2"}))
    merged = await client.patch(cm, {"data": {"a": "10", "b": None}})
    assert merged["data"] == {"a": "10"}

    tested = await client.patch(
        cm,
        [
            {"op": "test", "path": "/data/a", "value": "10"},
            {"op": "add", "path": "/data/c", "value": "3"},
        ],
        patch_type="json",
    )
    assert tested["data"] == {"a": "10", "c": "3"}
    with pytest.raises(InvalidError) as failed:
        await client.patch(
            cm,
            [
                {"op": "test", "path": "/data/a", "value": "stale"},
                {"op": "replace", "path": "/data/a", "value": "clobbered"},
            ],
            patch_type="json",
        )
    assert failed.value.status == 422
    assert (await client.live.get("v1", "ConfigMap", name="cm", namespace=namespace))["data"][
        "a"
    ] == "10"

    strategic = await client.patch(cm, {"data": {"d": "4"}}, patch_type="strategic")
    assert strategic["data"]["d"] == "4"
    t = await client.create(task("t", namespace, priority=1))
    with pytest.raises(ApiError) as unsupported:  # strategic merge does not exist for CRDs
        await client.patch(t, {"spec": {"priority": 2}}, patch_type="strategic")
    assert unsupported.value.status == 415


# ------------------------------------------------------------------------- server-side apply


async def test_server_side_apply_conflicts_without_force_and_wins_with_it(
    client: Client, namespace: str
) -> None:
    intent = configmap("shared", namespace, {"owner": "alpha"})
    created = await client.apply(intent, field_manager="alpha")
    assert created["data"] == {"owner": "alpha"}

    attempts = 0

    async def beta_apply() -> dict[str, Any]:
        nonlocal attempts
        attempts += 1
        return await client.apply(
            configmap("shared", namespace, {"owner": "beta"}), field_manager="beta"
        )

    with pytest.raises(ConflictError) as conflict:
        await retry_on_conflict(beta_apply)
    assert attempts == 1  # re-reading cannot resolve a field-manager conflict
    assert any(c.get("reason") == "FieldManagerConflict" for c in conflict.value.causes)
    assert "alpha" in conflict.value.message

    # A stale resourceVersion in the intent does not matter: apply strips it.
    forced = await client.apply(
        {
            **configmap("shared", namespace, {"owner": "beta"}),
            "metadata": {**created["metadata"], "resourceVersion": "1"},
        },
        field_manager="beta",
        force=True,
    )
    assert forced["data"] == {"owner": "beta"}
    owners = {
        m["manager"]: m.get("fieldsV1", {}).get("f:data", {})
        for m in forced["metadata"]["managedFields"]
    }
    assert "f:owner" in owners["beta"] and "f:owner" not in owners.get("alpha", {})


# ------------------------------------------------------------------------ status subresource


async def test_status_subresource_update_patch_and_apply(client: Client, namespace: str) -> None:
    created = await client.create(task("t", namespace, priority=2, deadline="2030-01-01T00:00:00Z"))
    generation = created["metadata"]["generation"]

    updated = await client.update_status({**created, "status": {"state": "InProgress"}})
    assert updated["status"] == {"state": "InProgress"}
    assert updated["metadata"]["generation"] == generation  # status writes keep the generation

    ignored = await client.update({**updated, "status": {"state": "Done"}})
    assert ignored["status"] == {"state": "InProgress"}  # the main endpoint ignores status

    patched = await client.patch_status(created, {"status": {"state": "Overdue"}})
    assert patched["status"]["state"] == "Overdue"

    condition = {
        "type": "Ready",
        "status": "True",
        "lastTransitionTime": "2030-01-01T00:00:00Z",
        "reason": "Applied",
    }
    applied = await client.apply_status(
        {**task("t", namespace), "status": {"conditions": [condition]}},
        field_manager="status-writer",
    )
    assert applied["status"]["state"] == "Overdue"
    assert applied["status"]["conditions"][0]["reason"] == "Applied"
    assert applied["metadata"]["generation"] == generation
    with pytest.raises(ValueError, match="resourceVersion"):
        await client.update_status(task("t", namespace))


# ----------------------------------------------------------------------------------- deletes


async def test_delete_with_preconditions_and_propagation(
    client: Client, transport: Transport, namespace: str, cluster_parts: ClusterParts
) -> None:
    cm = await client.create(configmap("cm", namespace))
    with pytest.raises(ConflictError):
        await client.delete(cm, preconditions={"uid": str(uuid.uuid4())})
    with pytest.raises(ConflictError):
        await client.delete(cm, preconditions={"resourceVersion": "1"})
    assert await client.delete(cm, preconditions={"uid": cm["metadata"]["uid"]}) is None
    with pytest.raises(NotFoundError):
        await client.live.get("v1", "ConfigMap", name="cm", namespace=namespace)

    # Foreground and orphan deletion add a finalizer that the garbage collector removes: the
    # object is returned marked for deletion. No garbage collector runs on the local control
    # plane (the test releases the object by hand); a cluster's removes the finalizer itself.
    for policy, finalizer in (("Foreground", "foregroundDeletion"), ("Orphan", "orphan")):
        parent = await client.create(configmap(f"parent-{finalizer.lower()}", namespace))
        pending = await client.delete(parent, propagation_policy=policy)  # type: ignore[call-overload]
        assert pending is not None
        assert pending["metadata"]["deletionTimestamp"]
        assert finalizer in pending["metadata"]["finalizers"]
        if cluster_parts.controller_manager:
            await watch_until(
                transport,
                f"/api/v1/namespaces/{namespace}/configmaps",
                lambda e: e["type"] == "DELETED",
                params={
                    "resourceVersion": pending["metadata"]["resourceVersion"],
                    "fieldSelector": f"metadata.name={parent['metadata']['name']}",
                },
            )
        else:
            assert await client.patch(pending, {"metadata": {"finalizers": None}})
        with pytest.raises(NotFoundError):
            await client.live.get(
                "v1", "ConfigMap", name=parent["metadata"]["name"], namespace=namespace
            )

    background = await client.create(task("t", namespace, priority=1))
    assert await client.delete(background, propagation_policy="Background") is None
    dry = await client.create(configmap("kept", namespace))
    await client.delete(dry, dry_run=True)
    assert await client.live.get("v1", "ConfigMap", name="kept", namespace=namespace)


async def test_delete_all_of_by_label(client: Client, namespace: str) -> None:
    for i in range(5):
        obj = configmap(f"batch-{i}", namespace)
        obj["metadata"]["labels"] = {"batch": "one"}
        await client.create(obj)
    for i in range(2):
        await client.create(configmap(f"keep-{i}", namespace))
    deleted = await client.delete_all_of(
        "v1", "ConfigMap", namespace=namespace, label_selector="batch=one"
    )
    assert sorted(o["metadata"]["name"] for o in deleted) == [f"batch-{i}" for i in range(5)]
    left = await client.live.list("v1", "ConfigMap", namespace=namespace)
    assert {o["metadata"]["name"] for o in left} >= {"keep-0", "keep-1"}
    assert not [o for o in left if o["metadata"]["name"].startswith("batch-")]
    with pytest.raises(ValueError, match="namespace"):
        await client.delete_all_of("v1", "ConfigMap", namespace=None)


async def test_dry_run_create_persists_nothing(client: Client, namespace: str) -> None:
    answer = await client.create(configmap("ghost", namespace), dry_run=True)
    assert answer["metadata"]["name"] == "ghost"
    with pytest.raises(NotFoundError):
        await client.live.get("v1", "ConfigMap", name="ghost", namespace=namespace)


# ---------------------------------------------------------------------- conflicts, for real


async def test_fifty_concurrent_writers_converge_through_the_conflict_helper(
    client: Client, namespace: str
) -> None:
    await client.create(configmap("counter", namespace, {"n": "0"}))
    attempts = 0

    def increment(obj: dict[str, Any]) -> None:
        nonlocal attempts
        attempts += 1
        obj["data"]["n"] = str(int(obj["data"]["n"]) + 1)

    await asyncio.gather(
        *(
            client.mutate_with_retry(
                "v1",
                "ConfigMap",
                name="counter",
                namespace=namespace,
                mutate=increment,
                steps=100,
                base_delay=0.005,
                factor=1.2,
                jitter=1.0,
                max_delay=0.1,
            )
            for _ in range(50)
        )
    )
    final = await client.live.get("v1", "ConfigMap", name="counter", namespace=namespace)
    assert final["data"]["n"] == "50"
    # The writers really raced: some of them lost at least once and re-read.
    assert attempts > 50
    print(f"50 writers: {attempts} attempts, {attempts - 50} conflicts")


# ------------------------------------------------------------------- read-your-writes guard


async def test_guard_holds_reconciles_back_while_the_watch_is_frozen(
    admin_config: ClusterConfig, proxy: FaultProxy, transport: Transport, namespace: str
) -> None:
    async with Transport(_via(admin_config, proxy)) as watched:
        cache = Cache(InformerFactory(watched), namespaces=[namespace])
        try:
            await cache.watch("v1", "ConfigMap")
            await cache.wait_for_sync(30)
            store = cache.factory.informers()[0].store
            deletions: dict[str, asyncio.Event] = {}

            def on_delete(delta: StoreDelta, initial: bool) -> None:
                if delta.type == "DELETED":
                    deletions.setdefault(delta.obj["metadata"]["name"], asyncio.Event()).set()

            cache.factory.informers()[0].add_handler(on_delete)
            client = Client(transport, cache)  # writes go straight to the server
            guard = ReadYourWritesGuard("test", cache)
            request = Request(namespace, "parent")

            outside = await client.create(configmap("outside", namespace))  # not in a reconcile
            assert guard.pending() == 0
            assert await store.wait_for_resource_version(outside["metadata"]["resourceVersion"], 30)

            proxy.freeze()
            token = CURRENT_RECONCILE.set(ReconcileContext("test", request, "r1", guard))
            try:
                generated = {
                    **configmap("", namespace),
                    "metadata": {"generateName": "child-", "namespace": namespace},
                }
                child = await client.create(generated)
                dropped = await client.delete(outside)
            finally:
                CURRENT_RECONCILE.reset(token)
            assert dropped is None
            assert guard.pending(request) == 2
            assert guard.check(request) == guard.requeue_delay
            assert guard.check(Request(namespace, "unrelated")) is None
            assert store.get(f"{namespace}/{child['metadata']['name']}") is None

            proxy.thaw()
            assert await store.wait_for_resource_version(child["metadata"]["resourceVersion"], 30)
            await asyncio.wait_for(deletions.setdefault("outside", asyncio.Event()).wait(), 30)
            assert guard.check(request) is None
            assert guard.pending() == 0
        finally:
            proxy.thaw()
            await cache.stop()


async def test_read_own_writes_overlay_serves_the_write_before_the_cache_has_it(
    admin_config: ClusterConfig, proxy: FaultProxy, transport: Transport, namespace: str
) -> None:
    async with Transport(_via(admin_config, proxy)) as watched:
        cache = Cache(InformerFactory(watched), namespaces=[namespace])
        try:
            created = await Client(transport, cache).create(configmap("cm", namespace, {"v": "1"}))
            await cache.watch("v1", "ConfigMap")
            await cache.wait_for_sync(30)
            informer = cache.factory.informers()[0]
            gone = asyncio.Event()
            informer.add_handler(lambda d, i: gone.set() if d.type == "DELETED" else None)
            plain = Client(transport, cache)
            overlaid = Client(transport, cache, read_own_writes=True)

            proxy.freeze()
            written = await overlaid.update({**created, "data": {"v": "2"}})
            assert (await plain.get("v1", "ConfigMap", name="cm", namespace=namespace))["data"] == {
                "v": "1"
            }
            assert (await overlaid.get("v1", "ConfigMap", name="cm", namespace=namespace))[
                "data"
            ] == {"v": "2"}
            await overlaid.delete(written)
            with pytest.raises(NotFoundError):
                await overlaid.get("v1", "ConfigMap", name="cm", namespace=namespace)
            assert await plain.get(
                "v1", "ConfigMap", name="cm", namespace=namespace
            )  # the cache lags

            proxy.thaw()
            await asyncio.wait_for(gone.wait(), 30)
            assert len(overlaid._overlay or ()) == 1  # the tombstone, until the next read
            with pytest.raises(NotFoundError):
                await plain.get("v1", "ConfigMap", name="cm", namespace=namespace)
            with pytest.raises(NotFoundError):
                await overlaid.get("v1", "ConfigMap", name="cm", namespace=namespace)
            assert len(overlaid._overlay or ()) == 0
        finally:
            proxy.thaw()
            await cache.stop()


# ----------------------------------------------------------------------- the retry helper


async def test_retry_on_conflict_is_bounded_and_retries_only_conflicts() -> None:
    calls = 0

    async def always_conflicts() -> None:
        nonlocal calls
        calls += 1
        raise ConflictError(409, "Conflict", "the object has been modified")

    with pytest.raises(ConflictError):
        await retry_on_conflict(always_conflicts, steps=3, base_delay=0.001)
    assert calls == 3

    calls = 0

    async def exists() -> None:
        nonlocal calls
        calls += 1
        raise AlreadyExistsError(409, "AlreadyExists", "already exists")

    with pytest.raises(AlreadyExistsError):
        await retry_on_conflict(exists, base_delay=0.001)
    assert calls == 1
