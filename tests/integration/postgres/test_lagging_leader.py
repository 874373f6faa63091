"""A new leader whose cache lags: two real operator processes (``python -m controllers``), the
old leader on a direct connection and the new one behind a FaultProxy that delays only its
watches. While the new one's cache is behind, an object is deleted and re-created under its
name (the old leader does the cleanup); the old leader is killed; the new one takes the Lease
with the previous incarnation still in its cache, and must not undo the new incarnation's
effects on the old one's behalf.

- a ServiceBinding: the finalizer helper reads the binding live by name; the new leader's
  stale, terminating incarnation must not run the cleanup on the re-created binding (which
  would delete its PostgresUser and Secret, drop its role and hand out a new password);
- a PostgresUser re-created with another ``roleName``: the new leader creates the old
  incarnation's role from its stale cache, and must drop it again (the live user asks for
  another role) instead of keeping it for ever because a user of that name exists.

Each test also checks, in the new leader's log, that it really acted on the stale incarnation
(else it would prove nothing). The lag (:data:`WATCH_LAG`) outlasts the old leader's death and
the new one's takeover; the new leader has caught up once it reports on an object created
after everything else (a marker) and its queues are empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.faultproxy import FaultProxy
from controllers.postgres.api import API_VERSION, BINDING, USER, identifier_from
from controllers.postgres.common import decode_secret
from controllers.postgres.localserver import LocalPostgres
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport
from tests.integration.chaos.cluster import SHORT_LEASE, Replica, _free_port, _until_ready
from tests.integration.postgres.conftest import condition, plural_of, wait_for
from tests.support import create_external_instance, watch_until

pytestmark = pytest.mark.integration

WATCH_LAG = 20.0
"""Seconds the new leader's watches lag: past the delete, the re-create, the old leader's
death and the Lease's expiry (4 s with the short timings) with room to spare."""
LEASE_NAMESPACE = "default"
Obj = dict[str, Any]


@dataclass
class Pair:
    old: Replica
    new: Replica
    lease_id: str
    old_identity: str


def _lease_path(lease_id: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"


async def lease_holder(
    transport: Transport, lease_id: str, wanted: Callable[[str], bool], timeout: float = 60.0
) -> str:
    """The Lease's holder once ``wanted(holder)`` (listed, then watched)."""
    path = _lease_path(lease_id)
    selector = {"fieldSelector": f"metadata.name={lease_id}"}
    listing = await transport.get_json(path, selector)
    for item in listing.get("items") or []:
        holder = str((item.get("spec") or {}).get("holderIdentity") or "")
        if wanted(holder):
            return holder
    params = {**selector, "resourceVersion": listing["metadata"]["resourceVersion"]}

    def held(event: Mapping[str, Any]) -> bool:
        spec = (event.get("object") or {}).get("spec") or {}
        return event["type"] in ("ADDED", "MODIFIED") and wanted(
            str(spec.get("holderIdentity") or "")
        )

    event = await watch_until(transport, path, held, params=params, timeout=timeout)
    return str(event["object"]["spec"]["holderIdentity"])


def _metric(replica: Replica, name: str, label: str) -> float:
    """Sum of metric ``name`` over series whose labels contain ``label`` (-1: no answer)."""
    url = f"http://127.0.0.1:{replica.metrics_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    except OSError:
        return -1.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


async def until_idle(replica: Replica, controllers: list[str], timeout: float = 60.0) -> None:
    """Wait until ``controllers`` of ``replica`` have empty queues and no reconcile running."""
    deadline = time.monotonic() + timeout
    while True:
        busy = [
            c
            for c in controllers
            for name, label in (
                ("workqueue_depth", f'name="{c}"'),
                ("controller_runtime_active_workers", f'controller="{c}"'),
            )
            if await asyncio.to_thread(_metric, replica, name, label) != 0
        ]
        if not busy:
            return
        assert time.monotonic() < deadline, f"{replica.name}: {busy} still busy"
        await asyncio.sleep(0.5)  # polling a metric: there is no event to await from outside


@contextlib.asynccontextmanager
async def old_and_new_leader(  # noqa: PLR0917
    plane: ControlPlane,
    transport: Transport,
    namespace: str,
    workdir: Path,
    controllers: str,
    new_controllers: str | None = None,
) -> AsyncIterator[Pair]:
    """The old leader (direct) running ``controllers`` and holding the Lease, and a follower
    running ``new_controllers`` (default: the same) behind a TLS-terminating FaultProxy (its
    watches can be delayed: ``pair.new.proxy.watch_latency``) with its caches synced; both
    stopped on exit, their logs' tails printed."""
    if use_existing_cluster():
        pytest.skip("needs the local control plane's certificates")
    lease_id = f"lagging-{namespace}"
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    pki = plane.workdir / "pki"
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
    upstream = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    upstream.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    direct = await FaultProxy(host, int(port)).start()
    lagging = await FaultProxy(host, int(port), tls=(serving, upstream)).start()
    replicas: list[Replica] = []
    for name, proxy, extra, running in (
        ("old-leader", direct, ["--log-level", "info"], controllers),
        ("new-leader", lagging, ["--log-level", "debug"], new_controllers or controllers),
    ):
        kubeconfig = workdir / f"{name}.kubeconfig"
        kubeconfig.write_text(plane.kubeconfig.read_text().replace(plane.server, proxy.url))
        replicas.append(
            Replica(
                name,
                [*SHORT_LEASE, *extra],
                proxy,
                kubeconfig,
                _free_port(),
                _free_port(),
                workdir / f"{name}.log",
                namespace,
                running,
                lease_id,
            )
        )
    old, new = replicas
    try:
        await old.start()
        identity = await lease_holder(transport, lease_id, bool)
        await new.start()
        assert not await _until_ready([old, new]), "a replica did not get ready"
        yield Pair(old, new, lease_id, identity)
    finally:
        for replica in replicas:
            await replica.stop()
            await replica.proxy.stop()
            tail = replica.log.read_text(errors="replace").splitlines()[-20:]
            print(f"--- last lines of {replica.name}:", *tail, sep="\n")


async def take_over(transport: Transport, pair: Pair) -> None:
    """Kill the old leader (SIGKILL: nothing released) and wait for the new one to lead."""
    await pair.old.stop(signal.SIGKILL)
    await lease_holder(transport, pair.lease_id, lambda h: bool(h) and h != pair.old_identity)


async def caught_up(
    transport: Transport, pair: Pair, namespace: str, body: Obj, *, controller: str
) -> None:
    """Create ``body`` (an object whose instance does not exist: the new leader reports
    ``InstanceNotFound``) and wait until the new leader reported it and its queue is empty:
    its cache has then seen everything that happened before."""
    kind = body["kind"]
    await transport.request(
        "POST", f"/apis/{API_VERSION}/namespaces/{namespace}/{plural_of(kind)}", body=body
    )
    name = body["metadata"]["name"]
    reported = await wait_for(
        transport,
        kind,
        namespace,
        name,
        lambda o: condition(o, "Ready").get("reason") == "InstanceNotFound",
        timeout=WATCH_LAG + 60,
    )
    assert reported is not None
    await until_idle(pair.new, [controller])


async def get_or_none(transport: Transport, path: str) -> Obj | None:
    try:
        return dict(await transport.get_json(path))
    except NotFoundError:
        return None


def uid_of(obj: Obj | None) -> str | None:
    return None if obj is None else str(obj["metadata"]["uid"])


def role_names(server: LocalPostgres, prefix: str) -> set[str]:
    with psycopg.connect(**server.conninfo()) as conn:  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (prefix,)
        ).fetchall()
    return {str(row[0]) for row in rows}


def drop_roles(server: LocalPostgres, roles: set[str]) -> None:
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
        for role in roles:
            ident = psycopg.sql.Identifier(role)
            with contextlib.suppress(psycopg.Error):
                conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(ident))
                conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(ident))


def logs_in(server: LocalPostgres, role: str, password: str) -> bool:
    try:
        with psycopg.connect(
            host=server.host, port=server.port, user=role, password=password, dbname="postgres"
        ):
            return True
    except psycopg.OperationalError:
        return False


@pytest.mark.timeout(240)
async def test_a_lagging_new_leader_never_finalizes_a_re_created_binding(
    control_plane: ControlPlane,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
    tmp_path: Path,
) -> None:
    await create_external_instance(transport, postgres_server, namespace, field_manager="test")
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/servicebindings"
    binding = {
        "apiVersion": API_VERSION,
        "kind": BINDING,
        "metadata": {"name": "app"},
        "spec": {"instanceRef": {"name": "db"}},
    }
    role = identifier_from(namespace, "app")
    controllers = "postgres-instance,postgres-user,service-binding"

    def ready(obj: Obj | None) -> bool:
        return condition(obj, "Ready").get("status") == "True"

    try:
        async with old_and_new_leader(
            control_plane, transport, namespace, tmp_path, controllers
        ) as pair:
            await transport.request("POST", path, body=binding)
            first = await wait_for(transport, BINDING, namespace, "app", ready, timeout=60)
            assert first is not None
            pair.new.proxy.watch_latency = WATCH_LAG
            # The old leader cleans up and the binding goes; it is re-created at once.
            await transport.request("DELETE", f"{path}/app")
            await wait_for(transport, BINDING, namespace, "app", lambda o: o is None)
            await transport.request("POST", path, body=binding)
            second = await wait_for(transport, BINDING, namespace, "app", ready, timeout=60)
            assert second is not None
            assert second["metadata"]["uid"] != first["metadata"]["uid"]
            secret_path = f"/api/v1/namespaces/{namespace}/secrets/app-credentials"
            secret = await transport.get_json(secret_path)
            user_path = f"/apis/{API_VERSION}/namespaces/{namespace}/postgresusers/app"
            user = await transport.get_json(user_path)

            await take_over(transport, pair)
            marker = {**binding, "metadata": {"name": "marker"}}
            marker["spec"] = {"instanceRef": {"name": "nowhere"}}
            await caught_up(transport, pair, namespace, marker, controller="servicebinding")
            await until_idle(pair.new, ["postgresuser", "postgresinstance"])

            now = await get_or_none(transport, secret_path)
            assert uid_of(now) == uid_of(secret), (
                "the re-created binding's Secret was deleted by the stale finalization"
            )
            assert now is not None
            password = decode_secret(now)["password"]
            assert password == decode_secret(secret)["password"]
            still = await get_or_none(transport, user_path)
            assert uid_of(still) == uid_of(user), (
                "the re-created binding's PostgresUser was deleted by the stale finalization"
            )
            assert logs_in(postgres_server, role, password)
            events = await transport.get_json(
                f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
            )
            unbound = [
                e
                for e in events.get("items") or []
                if e.get("reason") == "Unbound"
                and e["regarding"].get("uid") == second["metadata"]["uid"]
            ]
            assert unbound == [], "the re-created binding was unbound"
            log = pair.new.log.read_text(errors="replace")
            assert "not finalizing the new object" in log, (
                "the new leader never acted on the stale, terminating binding: the test "
                "proves nothing (lag too short?)"
            )
    finally:
        drop_roles(postgres_server, role_names(postgres_server, identifier_from(namespace)))


@pytest.mark.timeout(240)
async def test_a_lagging_new_leader_drops_the_role_of_a_user_re_created_for_another(
    control_plane: ControlPlane,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
    tmp_path: Path,
) -> None:
    await create_external_instance(transport, postgres_server, namespace, field_manager="test")
    await transport.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "u-pw"},
            "stringData": {"password": "a-password-for-u"},
        },
    )
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/postgresusers"
    prefix = identifier_from(namespace)
    old_role, new_role = f"{prefix}_first", f"{prefix}_second"

    def user(name: str, role: str, instance: str = "db") -> Obj:
        return {
            "apiVersion": API_VERSION,
            "kind": USER,
            "metadata": {"name": name},
            "spec": {
                "instanceRef": {"name": instance},
                "roleName": role,
                "database": "u",
                "passwordSecretRef": {"name": "u-pw", "key": "password"},
            },
        }

    def ready(obj: Obj | None) -> bool:
        return condition(obj, "Ready").get("status") == "True"

    try:
        # The new leader runs the user controller alone: no instance, so no orphan sweep that
        # would clean up after it.
        async with old_and_new_leader(
            control_plane,
            transport,
            namespace,
            tmp_path,
            "postgres-instance,postgres-user",
            "postgres-user",
        ) as pair:
            await transport.request("POST", path, body=user("u", old_role))
            await wait_for(transport, USER, namespace, "u", ready, timeout=60)
            assert role_names(postgres_server, prefix) == {old_role}
            pair.new.proxy.watch_latency = WATCH_LAG
            await transport.request("DELETE", f"{path}/u")
            await wait_for(transport, USER, namespace, "u", lambda o: o is None)
            assert role_names(postgres_server, prefix) == set()
            await transport.request("POST", path, body=user("u", new_role))
            await wait_for(transport, USER, namespace, "u", ready, timeout=60)
            assert role_names(postgres_server, prefix) == {new_role}

            await take_over(transport, pair)
            marker = user("marker", f"{prefix}_marker", instance="nowhere")
            await caught_up(transport, pair, namespace, marker, controller="postgresuser")

            assert role_names(postgres_server, prefix) == {new_role}, (
                "the role created for the stale incarnation is left behind"
            )
            log = pair.new.log.read_text(errors="replace")
            # "created role X" (kept) or "dropped role X again": it did create it.
            assert f"created role {old_role}" in log or f"dropped role {old_role} again" in log, (
                "the new leader never created the stale user's role: the test proves nothing"
            )
    finally:
        drop_roles(postgres_server, role_names(postgres_server, prefix))
