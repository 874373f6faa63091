"""The orphan-role sweep against a real PostgreSQL and a real control plane: a role whose
PostgresUser vanished while the controller was between ``CREATE ROLE`` and its check that the
user still exists is dropped by the instance's sweep, with an Event; roles the operator does
not own, roles of another instance and roles a live PostgresUser claims are never dropped;
roles of an earlier operator version get the mark when a PostgresUser claims them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql

from controller_runtime.client import Client
from controller_runtime.util import EventRecorder
from controllers.postgres import sql, user
from controllers.postgres.api import API_VERSION, INSTANCE, USER, USER_FINALIZER
from controllers.postgres.connection import admin_conninfo
from controllers.postgres.localserver import LocalPostgres
from controllers.postgres.ownership import RoleOwner
from controllers.postgres.sweep import sweep_orphan_roles
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import (
    condition,
    external_instance,
    running_operator,
    set_policy,
    wait_for,
)
from tests.support import watch_until

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


def is_ready(obj: Obj | None) -> bool:
    return condition(obj, "Ready").get("status") == "True"


def comment_of(server: LocalPostgres, role: str) -> str | None:
    """The role's comment; ``"<no role>"`` when the role does not exist."""
    with psycopg.connect(**server.conninfo()) as conn:  # type: ignore[arg-type]
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = %s",
            (role,),
        ).fetchone()
    if row is None:
        return "<no role>"
    return None if row[0] is None else str(row[0])


def create_role(server: LocalPostgres, role: str, comment: str | None) -> None:
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
        conn.execute(psql.SQL("CREATE ROLE {} LOGIN").format(psql.Identifier(role)))
        if comment is not None:
            conn.execute(
                psql.SQL("COMMENT ON ROLE {} IS {}").format(
                    psql.Identifier(role), psql.Literal(comment)
                )
            )


def drop_roles(server: LocalPostgres, *roles: str) -> None:
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
        for role in roles:
            conn.execute(psql.SQL("DROP ROLE IF EXISTS {}").format(psql.Identifier(role)))


async def wait_for_event(
    transport: Transport, namespace: str, reason: str, about: str, timeout: float = 60.0
) -> Obj:
    """The first Event of ``reason`` about ``about`` (listed, then watched)."""
    path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"

    def wanted(event: Mapping[str, Any]) -> bool:
        return event.get("reason") == reason and event["regarding"]["name"] == about

    listing = await transport.get_json(path)
    for event in listing.get("items") or []:
        if wanted(event):
            return dict(event)
    found = await watch_until(
        transport,
        path,
        lambda e: e["type"] in ("ADDED", "MODIFIED") and wanted(e["object"]),
        params={"resourceVersion": listing["metadata"]["resourceVersion"]},
        timeout=timeout,
    )
    return dict(found["object"])


def postgres_user(namespace: str, name: str, role: str, secret: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": USER,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "instanceRef": {"name": "db"},
            "roleName": role,
            "database": name,
            "passwordSecretRef": {"name": secret, "key": "password"},
        },
    }


async def password_secret(kube: Client, namespace: str, name: str) -> None:
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {"password": f"a-password-for-{name}"},
        }
    )


class ReconcileInterruptedError(Exception):
    """What ends the reconcile between ``CREATE ROLE`` and its check in this test (in a real
    run: the process dies, or leadership is lost and the reconcile is cancelled)."""


async def test_a_role_left_by_an_interrupted_reconcile_is_swept_and_no_other(  # noqa: PLR0917 (fixtures)
    admin_config: ClusterConfig,
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = namespace.replace("-", "_")
    orphan, kept = f"{prefix}_orphan", f"{prefix}_kept"
    by_hand, foreign, elsewhere = f"{prefix}_by_hand", f"{prefix}_foreign", f"{prefix}_other_db"
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    await external_instance(kube, namespace, postgres_server)
    # Roles that are not this instance's to sweep, though nothing claims them: one created by
    # hand (no comment), one with somebody else's comment, one marked for another instance.
    create_role(postgres_server, by_hand, None)
    create_role(postgres_server, foreign, "owned by the DBA")
    create_role(
        postgres_server, elsewhere, RoleOwner(namespace, "other-db", "gone", "gone").comment()
    )
    await password_secret(kube, namespace, "orphan-pw")
    await password_secret(kube, namespace, "kept-pw")

    interrupted: list[str] = []
    check = user.UserReconciler._role_still_wanted

    async def interrupt(self: user.UserReconciler, obj: Obj, role: str) -> bool:
        if obj["metadata"]["name"] != "orphan":
            return await check(self, obj, role)
        # The role was created (the transaction with its mark committed). Meanwhile the user
        # went without its finalizer running (the API server's delete/finalizer race, or a
        # finalizer removed by hand), and this reconcile never reaches its check.
        assert (
            comment_of(postgres_server, role)
            == RoleOwner(namespace, "db", "orphan", "orphan").comment()
        )
        live = await kube.live.get(API_VERSION, USER, name="orphan", namespace=namespace)
        await kube.patch(live, {"metadata": {"finalizers": None}})
        await kube.delete(live)
        interrupted.append(role)
        raise ReconcileInterruptedError

    monkeypatch.setattr(user.UserReconciler, "_role_still_wanted", interrupt)
    try:
        async with running_operator(admin_config, namespace):
            await wait_for(transport, INSTANCE, namespace, "db", is_ready)
            await kube.create(postgres_user(namespace, "kept", kept, "kept-pw"))
            await wait_for(transport, USER, namespace, "kept", is_ready)
            await kube.create(postgres_user(namespace, "orphan", orphan, "orphan-pw"))
            event = await wait_for_event(transport, namespace, "OrphanRoleDropped", "db")
            assert interrupted == [orphan]
            assert event["type"] == "Normal"
            assert f"dropped role {orphan}" in event["note"] and "orphan" in event["note"]
            assert comment_of(postgres_server, orphan) == "<no role>"
            # Kept: the live user's role (marked), and every role not marked for this instance.
            assert (
                comment_of(postgres_server, kept)
                == RoleOwner(namespace, "db", "kept", "kept").comment()
            )
            assert comment_of(postgres_server, by_hand) is None
            assert comment_of(postgres_server, foreign) == "owned by the DBA"
            assert (
                comment_of(postgres_server, elsewhere)
                == RoleOwner(namespace, "other-db", "gone", "gone").comment()
            )
            # Only one sweep dropped anything, and only that role.
            events = await transport.get_json(
                f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
            )
            swept = [e for e in events["items"] if e.get("reason") == "OrphanRoleDropped"]
            assert [orphan in e["note"] for e in swept] == [True]
    finally:
        drop_roles(postgres_server, by_hand, foreign, elsewhere)


async def test_a_role_of_an_earlier_version_is_marked_when_claimed_and_swept_when_not(
    admin_config: ClusterConfig,
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    """An earlier operator version created roles without a mark: a PostgresUser that claims
    one marks it (it is the operator's from then on), and once that user is gone without its
    finalizer the sweep drops it. An unclaimed role without a mark is left alone."""
    prefix = namespace.replace("-", "_")
    old, never_claimed = f"{prefix}_old", f"{prefix}_never_claimed"
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    await external_instance(kube, namespace, postgres_server)
    create_role(postgres_server, old, None)
    create_role(postgres_server, never_claimed, None)
    await password_secret(kube, namespace, "old-pw")
    try:
        async with running_operator(admin_config, namespace):
            await kube.create(postgres_user(namespace, "old", old, "old-pw"))
            ready = await wait_for(transport, USER, namespace, "old", is_ready)
            assert ready is not None
            mark = RoleOwner(namespace, "db", "old", "old").comment()
            assert comment_of(postgres_server, old) == mark
            # Gone without its finalizer: only the sweep can drop the role now.
            await kube.patch(ready, {"metadata": {"finalizers": None}})
            await kube.delete(ready)
            await wait_for_event(transport, namespace, "OrphanRoleDropped", "db")
            assert comment_of(postgres_server, old) == "<no role>"
            assert comment_of(postgres_server, never_claimed) is None
    finally:
        drop_roles(postgres_server, old, never_claimed)


async def test_the_sweep_never_drops_a_role_a_reconcile_is_working_on(
    kube: Client, namespace: str, postgres_server: LocalPostgres
) -> None:
    """While the role's advisory lock is held (as ``ensure_role`` holds it from before
    ``CREATE ROLE`` until the role is converged) the sweep leaves the role; once released, a
    sweep drops it. And a role a live PostgresUser claims is never dropped, even when the
    sweep's cache does not show that user yet (the live list decides)."""
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    await external_instance(kube, namespace, postgres_server)
    instance = await kube.live.get(API_VERSION, INSTANCE, name="db", namespace=namespace)
    info = await admin_conninfo(kube, instance)
    prefix = namespace.replace("-", "_")
    busy, claimed = f"{prefix}_busy", f"{prefix}_claimed"
    for role in (busy, claimed):
        create_role(postgres_server, role, RoleOwner(namespace, "db", role, role).comment())
    live_user = postgres_user(namespace, "claimed", claimed, "claimed-pw")
    live_user["metadata"]["finalizers"] = [USER_FINALIZER]
    await kube.create(live_user)
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    try:
        # kube's cache holds no PostgresUser (it caches nothing): every marked role is a
        # candidate, and the live list decides.
        async with sql.connect(info) as holder:
            await holder.execute(
                "SELECT pg_advisory_lock(%s, hashtext(%s))", (sql.ROLE_LOCK_CLASS, busy)
            )
            assert await sweep_orphan_roles(kube, recorder, instance, info) == []
        assert comment_of(postgres_server, busy) is not None
        assert comment_of(postgres_server, claimed) is not None
        assert await sweep_orphan_roles(kube, recorder, instance, info) == [busy]
        assert comment_of(postgres_server, busy) == "<no role>"
        assert comment_of(postgres_server, claimed) is not None
    finally:
        await recorder.close()
        drop_roles(postgres_server, busy, claimed)
        live = await kube.live.get(API_VERSION, USER, name="claimed", namespace=namespace)
        await kube.patch(live, {"metadata": {"finalizers": None}})
