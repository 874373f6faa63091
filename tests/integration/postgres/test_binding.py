"""A ServiceBinding against a real PostgreSQL server: its Secret's credentials log in, and
deleting the binding drops the role and removes the Secret and the PostgresUser. The password
never reaches a log record, an event, or a status."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from controller_runtime import metrics
from controller_runtime.client import Client
from controller_runtime.manager import Manager
from controllers.postgres.api import API_VERSION
from controllers.postgres.common import decode_secret
from controllers.postgres.localserver import LocalPostgres
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import (
    condition,
    external_instance,
    set_policy,
    wait_for,
)

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


def is_ready(obj: dict[str, object] | None) -> bool:
    return condition(obj, "Ready").get("status") == "True"


def role_exists(server: LocalPostgres, role: str) -> bool:
    with psycopg.connect(**server.conninfo()) as conn:  # type: ignore[arg-type]
        return (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            is not None
        )


@pytest.mark.usefixtures("operator")
async def test_binding_credentials_log_in_and_deleting_it_drops_role_and_secret(
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    await external_instance(kube, namespace, postgres_server)
    instance = await wait_for(transport, "PostgresInstance", namespace, "db", is_ready)
    assert instance is not None
    assert instance["status"]["endpoint"] == {"host": "127.0.0.1", "port": postgres_server.port}
    assert instance["status"]["version"].startswith(f"{major}.")

    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "ServiceBinding",
            "metadata": {"name": "shop", "namespace": namespace},
            "spec": {"instanceRef": {"name": "db"}},
        }
    )
    binding = await wait_for(transport, "ServiceBinding", namespace, "shop", is_ready)
    assert binding is not None and binding["status"]["binding"] == {"name": "shop-credentials"}
    secret = await kube.live.get("v1", "Secret", name="shop-credentials", namespace=namespace)
    data = decode_secret(secret)
    role, password = data["username"], data["password"]
    assert role == binding["status"]["roleName"] and len(password) >= 32
    assert data["database"] == "shop" and data["port"] == str(postgres_server.port)

    # The credentials log in, by fields and by URI, and may create and use tables.
    with psycopg.connect(
        host=data["host"],
        port=data["port"],
        user=role,
        password=password,
        dbname=data["database"],
    ) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        conn.commit()
    with psycopg.connect(data["uri"]) as conn:
        row = conn.execute("SELECT current_user, count(*) FROM orders").fetchone()
        assert row == (role, 1)

    user = await kube.live.get(API_VERSION, "PostgresUser", name="shop", namespace=namespace)
    assert user["spec"]["roleName"] == role and is_ready(user)

    await kube.delete(binding)
    assert (
        await wait_for(transport, "ServiceBinding", namespace, "shop", lambda o: o is None) is None
    )
    assert not role_exists(postgres_server, role)
    for api_version, kind, name in (
        ("v1", "Secret", "shop-credentials"),
        (API_VERSION, "PostgresUser", "shop"),
    ):
        with pytest.raises(NotFoundError):
            await kube.live.get(api_version, kind, name=name, namespace=namespace)
    # The data the application wrote is kept (handed to the administrator).
    with psycopg.connect(**postgres_server.conninfo("shop")) as conn:  # type: ignore[arg-type]
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)

    # The password reached no log record (message, arguments or extra fields), no event and
    # no status.
    assert caplog.records, "nothing was logged: the check would prove nothing"
    assert any("created role" in r.getMessage() for r in caplog.records)
    for record in caplog.records:
        assert password not in record.getMessage()
        assert password not in repr(vars(record))
    assert password not in caplog.text
    events = await kube.live.list("events.k8s.io/v1", "Event", namespace=namespace)
    assert events and all(password not in repr(e) for e in events)
    assert password not in repr(
        await kube.live.get(API_VERSION, "PostgresInstance", name="db", namespace=namespace)
    )


async def test_an_external_instance_whose_version_is_disabled_is_refused(
    operator: Manager,
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: False})
    await external_instance(kube, namespace, postgres_server)
    refused = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "db",
        lambda o: condition(o, "VersionAccepted").get("status") == "False",
    )
    assert condition(refused, "VersionAccepted")["reason"] == "VersionDisabled"
    assert condition(refused, "Ready")["status"] == "False"
    assert f"version {major} is disabled" in condition(refused, "Ready")["message"]
    event = await wait_for_event(kube, namespace, "VersionDisabled", "db")
    assert event["type"] == "Warning" and f"version {major} is disabled" in event["note"]

    await set_policy(kube, {major: True})  # the policy watch reconciles the instance
    await wait_for(transport, "PostgresInstance", namespace, "db", is_ready)


def terminal_errors(controller: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "controller_runtime_terminal_reconcile_errors_total", {"controller": controller}
    )
    return value or 0.0


async def wait_for_event(kube: Client, namespace: str, reason: str, regarding: str) -> Obj:
    """The Event of ``reason`` about ``regarding``, once the recorder has written it."""
    stop = time.monotonic() + 30
    while True:
        for event in await kube.live.list("events.k8s.io/v1", "Event", namespace=namespace):
            if event.get("reason") == reason and event["regarding"]["name"] == regarding:
                return event
        assert time.monotonic() < stop, f"no {reason} event about {regarding}"
        await asyncio.sleep(0.2)


@pytest.mark.usefixtures("operator")
async def test_what_only_the_user_can_fix_is_shown_and_not_retried(
    kube: Client, transport: Transport, namespace: str, postgres_server: LocalPostgres
) -> None:
    def binding(name: str, instance: str) -> Obj:
        return {
            "apiVersion": API_VERSION,
            "kind": "ServiceBinding",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"instanceRef": {"name": instance}},
        }

    def has_reason(reason: str) -> Callable[[Obj | None], bool]:
        return lambda o: condition(o, "Ready").get("reason") == reason

    # A binding whose instance does not exist says so, in its status and in an Event.
    await kube.create(binding("orphan", "nowhere"))
    orphan = await wait_for(
        transport, "ServiceBinding", namespace, "orphan", has_reason("InstanceNotFound")
    )
    assert "'nowhere' does not exist" in condition(orphan, "Ready")["message"]
    event = await wait_for_event(kube, namespace, "InstanceNotFound", "orphan")
    assert event["type"] == "Warning" and "'nowhere' does not exist" in event["note"]

    # A Secret of the binding's name that the binding does not control is left alone; the
    # binding says why and stops (a terminal error, not an endless backoff).
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    await external_instance(kube, namespace, postgres_server)
    await wait_for(transport, "PostgresInstance", namespace, "db", is_ready)
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "taken-credentials", "namespace": namespace},
            "stringData": {"password": "someone else's"},
        }
    )
    before = terminal_errors("servicebinding")
    await kube.create(binding("taken", "db"))
    taken = await wait_for(
        transport, "ServiceBinding", namespace, "taken", has_reason("SecretNotOwned")
    )
    message = condition(taken, "Ready")["message"]
    assert "Secret taken-credentials exists and is not controlled by this binding" in message
    assert "spec.secretName" in message  # what to do about it
    event = await wait_for_event(kube, namespace, "SecretNotOwned", "taken")
    assert event["type"] == "Warning"
    assert terminal_errors("servicebinding") >= before + 1
    secret = await kube.live.get("v1", "Secret", name="taken-credentials", namespace=namespace)
    assert decode_secret(secret) == {"password": "someone else's"}
    assert not secret["metadata"].get("ownerReferences")
