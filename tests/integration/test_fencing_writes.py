"""Fenced writes against the real API server: the fence is read again right before *each* time
the transport sends a write -- after a 429's ``Retry-After`` sleep, after a 401 and a credential
refresh, after waiting for a connection of the pool -- so a write whose lease was lost while it
waited is never sent; and a leader-only runnable (and an Event it recorded) writes nothing once
its leader's renew deadline passed, also when the process was paused (a blocked event loop)."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
import uuid
from typing import Any

import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.fencing import FencedError
from controller_runtime.leaderelection import LeaderElectionConfig, LeaderElectionLostError
from controller_runtime.manager import Manager, ManagerOptions
from controller_runtime.reconcile import CURRENT_RECONCILE, ReconcileContext, Request
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig, load_kubeconfig
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport
from tests.support import until_allowed

pytestmark = pytest.mark.integration

A = Request("ns", "a")


class Switch:
    """A fence the test opens and closes; ``asked`` counts how often it was read."""

    def __init__(self) -> None:
        self.up = True
        self.asked = 0
        self.first_asked = asyncio.Event()

    def holds(self) -> bool:
        self.asked += 1
        self.first_asked.set()
        return self.up

    def describe(self) -> str:
        return "the test's switch"


def configmap(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"k": "v"},
    }


async def configmaps(transport: Transport, namespace: str) -> set[str]:
    answer = await transport.get_json(f"/api/v1/namespaces/{namespace}/configmaps")
    return {
        i["metadata"]["name"]
        for i in answer["items"]
        if i["metadata"]["name"] != "kube-root-ca.crt"
    }


def in_reconcile(fence: Switch) -> Any:
    return CURRENT_RECONCILE.set(ReconcileContext("fenced-test", A, "id", fence=fence))


async def grant_configmap_writes(plane: ControlPlane, user: str) -> None:
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as admin:
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        name = f"{user}-write-configmaps"
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["create", "list", "get"],
                }
            ],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }  # fmt: skip
        await admin.request("POST", f"{rbac}/clusterroles", body=role)
        await admin.request("POST", f"{rbac}/clusterrolebindings", body=binding)


async def test_a_write_pushed_back_with_429_is_not_sent_again_once_its_fence_is_down(
    throttled_plane: ControlPlane,
) -> None:
    """40 creates at once against an API server that lets one write in at a time: some are
    answered 429 with Retry-After. The fence goes down when the first 429 arrives, before any
    retry: every request answered 429 must end in FencedError, never be sent again."""
    user = f"writer-{uuid.uuid4().hex[:6]}"
    await grant_configmap_writes(throttled_plane, user)
    config = await load_kubeconfig(throttled_plane.mint_identity(user).kubeconfig)
    fence = Switch()
    statuses: list[int] = []

    def seen(method: str, path: str, params: Any, status: int) -> None:
        if method == "POST" and path.endswith("/configmaps"):
            statuses.append(status)
            if status == 429:
                fence.up = False

    async with (
        Transport(await load_kubeconfig(throttled_plane.kubeconfig)) as admin,
        Transport(config, on_request=seen) as writer,
    ):
        namespace = f"t-{uuid.uuid4().hex[:8]}"
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        await until_allowed(writer, "create", "configmaps", namespace)
        client = Client(writer, Cache(InformerFactory(writer)))
        await client.discovery.resolve("v1", "ConfigMap")
        token = in_reconcile(fence)
        try:
            results = await asyncio.gather(
                *(client.create(configmap(f"cm-{i}", namespace)) for i in range(40)),
                return_exceptions=True,
            )
        finally:
            CURRENT_RECONCILE.reset(token)
        created = await configmaps(admin, namespace)
    assert 429 in statuses, "flow control never pushed back: the test proves nothing"
    refused = [r for r in results if isinstance(r, FencedError)]
    others = [r for r in results if isinstance(r, BaseException) and not isinstance(r, FencedError)]
    assert not others, others
    assert statuses.count(429) <= len(refused), (statuses, len(refused))
    assert len(statuses) == statuses.count(429) + statuses.count(201), statuses  # no retry sent
    assert len(created) == statuses.count(201) == len(results) - len(refused)


@dataclasses.dataclass
class RefreshedToken:
    """A bearer token that is wrong until refreshed (an expired token); the refresh is where
    the test puts down the fence (a pause during a credential plugin's run)."""

    token: str
    fence: Switch
    drop_fence: bool
    refreshed: bool = False

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token if self.refreshed else 'expired'}"}

    async def refresh(self) -> bool:
        self.refreshed = True
        if self.drop_fence:
            self.fence.up = False
        return True


@pytest.mark.parametrize("fence_drops_during_refresh", [False, True])
async def test_a_write_answered_401_is_sent_again_after_a_refresh_only_if_its_fence_holds(
    control_plane: ControlPlane,
    transport: Transport,
    namespace: str,
    fence_drops_during_refresh: bool,
) -> None:
    if use_existing_cluster():
        pytest.skip("needs the local control plane's token file and CA")
    fence = Switch()
    context = ssl.create_default_context(cafile=str(control_plane.workdir / "pki" / "ca.crt"))
    credentials = RefreshedToken(control_plane.admin_token, fence, fence_drops_during_refresh)
    statuses: list[int] = []
    config = ClusterConfig(control_plane.server, context, credentials)
    async with Transport(
        config, on_request=lambda m, p, q, s: statuses.append(s) if m == "POST" else None
    ) as expiring:
        client = Client(expiring, Cache(InformerFactory(transport)))
        await client.discovery.resolve("v1", "ConfigMap")  # through the admin's transport
        token = in_reconcile(fence)
        try:
            if fence_drops_during_refresh:
                with pytest.raises(FencedError):
                    await client.create(configmap("after-refresh", namespace))
            else:
                await client.create(configmap("after-refresh", namespace))
        finally:
            CURRENT_RECONCILE.reset(token)
    assert credentials.refreshed
    if fence_drops_during_refresh:
        assert statuses == [401]
        assert await configmaps(transport, namespace) == set()
    else:
        assert statuses == [401, 201]
        assert await configmaps(transport, namespace) == {"after-refresh"}


async def test_a_write_that_waited_for_a_connection_of_the_pool_is_not_sent_once_its_fence_is_down(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    """A transport with one connection: a watch holds it for 3 s; a write waits for it. The
    fence is read as the write begins (up), then goes down while the write waits: the write
    must not be sent when the connection comes free."""
    fence = Switch()
    holding = asyncio.Event()
    calls = 0

    def watch_connected() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the first call is before the attempt; the second, on the connection
            holding.set()

    async with Transport(admin_config, max_connections=1) as narrow:
        client = Client(narrow, Cache(InformerFactory(transport)))
        await client.discovery.resolve("v1", "ConfigMap")
        watch = asyncio.create_task(
            narrow.request(
                "GET",
                f"/api/v1/namespaces/{namespace}/configmaps",
                params={"watch": "true", "timeoutSeconds": "3"},
                before_send=watch_connected,
            )
        )
        await asyncio.wait_for(holding.wait(), 30)
        token = in_reconcile(fence)
        try:
            write = asyncio.create_task(client.create(configmap("late", namespace)))
        finally:
            CURRENT_RECONCILE.reset(token)
        await asyncio.wait_for(fence.first_asked.wait(), 30)
        assert not watch.done(), "the watch ended before the write had to wait"
        fence.up = False  # lost while waiting for the connection
        with pytest.raises(FencedError):
            await asyncio.wait_for(write, 60)
        await watch
    assert await configmaps(transport, namespace) == set()


@dataclasses.dataclass
class LateWriter:
    """A leader-only runnable that writes when told (a timer that fell due during a pause):
    an Event, then a ConfigMap."""

    manager: Manager
    namespace: str
    need_leader_election: bool = True
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    go: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    outcome: asyncio.Future[BaseException | None] | None = None

    async def start(self) -> None:
        self.outcome = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().create_task(self._run())
        self.started.set()

    async def _run(self) -> None:
        assert self.outcome is not None
        await self.go.wait()
        target = configmap("written-late", self.namespace)
        self.manager.event_recorder("crpy.io/late-writer").record(
            target, "Normal", "Late", "written after a pause", "Write"
        )
        try:
            await self.manager.client.create(target)
        except BaseException as err:
            self.outcome.set_result(err)
            raise
        self.outcome.set_result(None)

    async def stop(self, drain_timeout: float | None) -> None:
        return None


async def test_a_leader_only_runnable_writes_nothing_after_a_pause_past_the_renew_deadline(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    """The whole process (its event loop) is paused past the leader's renew deadline; then a
    leader-only runnable's timer fires before the renewal loop could step down: its Event
    and its write are refused, nothing reaches the server, and the manager steps down."""
    election = LeaderElectionConfig(
        namespace=namespace,
        name="operator",
        identity="paused",
        lease_duration=6,
        renew_deadline=4,
        retry_period=1,
    )
    manager = Manager(
        admin_config,
        ManagerOptions(
            namespaces=[namespace],
            leader_election=election,
            metrics_bind_address=None,
            health_probe_bind_address=None,
        ),
    )
    writer = LateWriter(manager, namespace)
    manager.add(writer)
    running = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(writer.started.wait(), 60)
        assert manager.elector is not None and manager.elector.holds()
        time.sleep(election.renew_deadline + 0.5)  # noqa: ASYNC251 -- the pause under test
        writer.go.set()
        assert writer.outcome is not None
        outcome = await asyncio.wait_for(writer.outcome, 30)
        assert isinstance(outcome, FencedError), outcome
        with pytest.raises(LeaderElectionLostError):
            await asyncio.wait_for(running, 60)
    finally:
        if not running.done():
            running.cancel()
    recorder = manager.event_recorder("crpy.io/late-writer")
    assert recorder.dropped == 1
    with pytest.raises(NotFoundError):
        await transport.get_json(f"/api/v1/namespaces/{namespace}/configmaps/written-late")
    events = await transport.get_json(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    assert [e for e in events["items"] if e.get("reason") == "Late"] == []
