"""The PostgreSQL API's admission webhooks on a real API server: a PostgresInstance whose
version the policy does not enable is refused at create (as ``kubectl apply`` would be), with
the policy's verdict; one the policy enables is accepted and gets the policy's default version
when it has none; storage cannot shrink; a major-version downgrade is refused (a minor change
and an upgrade allowed by the instance are not); a ServiceBinding whose role is another
binding's or PostgresUser's on the same instance is refused.

The operator's webhooks (controllers.postgres.webhooks) are served by a WebhookServer on
loopback with a certificate from a test CA; a Validating- and a MutatingWebhookConfiguration
point at it by URL with that CA as caBundle (what a webhook Service and its certificate are
in a cluster).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.envtest.certs import CertificateAuthority
from controller_runtime.manager import Manager, ManagerOptions
from controller_runtime.testing import eventually
from controller_runtime.webhook import WebhookServer
from controllers.postgres import setup_instance_controller
from controllers.postgres.api import API_VERSION, BINDING, INSTANCE, POLICY, POLICY_NAME, USER
from controllers.postgres.webhooks import setup_webhooks
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.errors import ApiError
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import TEST_OPTIONS


@dataclass
class Host:
    webhook_server: WebhookServer
    client: Client
    cache: Cache


def _configuration(
    kind: str, name: str, url: str, ca: bytes, *, failure: str, resource: str
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.postgres.crpy.io",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
                "rules": [
                    {
                        "apiGroups": ["postgres.crpy.io"],
                        "apiVersions": ["v1beta1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [resource],
                    }
                ],
                "matchPolicy": "Equivalent",
                "failurePolicy": failure,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }


@pytest.fixture
async def webhooks(transport: Transport, tmp_path: Path) -> AsyncIterator[Client]:
    ca = CertificateAuthority()
    ca.issue_serving(["127.0.0.1"]).write(tmp_path, "tls")
    server = WebhookServer(port=0, host="127.0.0.1", cert_dir=tmp_path)
    cache = Cache(InformerFactory(transport))
    client = Client(transport, cache, field_manager="test")
    await setup_webhooks(  # which watches in the cache what the handlers read
        Host(server, client, cache),  # type: ignore[arg-type]
        ["postgres-instance", "service-binding"],
    )
    await server.start()
    assert server.url is not None
    suffix = uuid.uuid4().hex[:6]
    names = []
    # The failure policies of manifests/webhook-configurations.yaml.
    for kind, path, failure, resource in (
        ("ValidatingWebhookConfiguration", "/validate", "Fail", "postgresinstances"),
        ("MutatingWebhookConfiguration", "/mutate", "Ignore", "postgresinstances"),
        ("ValidatingWebhookConfiguration", "/validate", "Ignore", "servicebindings"),
    ):
        name = f"postgres-{path.strip('/')}-{resource}-{suffix}"
        url = f"{server.url}{path}-postgres-crpy-io-v1beta1-{resource[:-1]}"
        body = _configuration(kind, name, url, ca.cert_pem, failure=failure, resource=resource)
        created = await client.create(body)
        names.append((kind, created["metadata"]["name"]))
    try:
        yield client
    finally:
        for kind, name in names:
            await client.delete(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": kind,
                    "metadata": {"name": name},
                }
            )
        await server.stop(0)
        await cache.stop()


POLICY_OBJECT = {
    "apiVersion": API_VERSION,
    "kind": POLICY,
    "metadata": {"name": POLICY_NAME},
    "spec": {
        "defaultVersion": "16",
        "versions": [{"version": "15"}, {"version": "16"}, {"version": "14", "enabled": False}],
    },
}


async def _policy(client: Client) -> dict[str, Any]:
    """The policy above, fresh, and seen by the webhook's cache."""
    with contextlib.suppress(ApiError):
        await client.delete(dict(POLICY_OBJECT))
    await client.create(dict(POLICY_OBJECT))
    await _cached(client)
    return POLICY_OBJECT


async def _cached(client: Client) -> None:
    async def cached() -> bool:  # the webhook reads the policy from the cache
        return bool(await client.list(API_VERSION, POLICY))

    await eventually(cached, timeout=30)


def _instance(namespace: str, name: str, version: str | None, size: str = "2Gi") -> dict[str, Any]:
    spec: dict[str, Any] = {"storage": {"size": size}}
    if version is not None:
        spec["version"] = version
    return {
        "apiVersion": API_VERSION,
        "kind": INSTANCE,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def test_the_version_policy_refuses_at_create_and_defaults_an_empty_version(
    webhooks: Client, namespace: str
) -> None:
    client = webhooks
    policy = {
        "apiVersion": API_VERSION,
        "kind": POLICY,
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "defaultVersion": "16",
            "versions": [{"version": "15"}, {"version": "16"}, {"version": "14", "enabled": False}],
        },
    }
    with contextlib.suppress(ApiError):
        await client.delete(dict(policy))
    await client.create(policy)

    await _cached(client)

    with pytest.raises(ApiError) as refused:
        await client.create(_instance(namespace, "old", "14"))
    assert refused.value.status == 403
    assert "version 14 is disabled by the version policy (enabled: 15, 16)" in str(refused.value)

    accepted = await client.create(_instance(namespace, "current", "15"))
    assert accepted["spec"]["version"] == "15"
    defaulted = await client.create(_instance(namespace, "defaulted", None))
    assert defaulted["spec"]["version"] == "16"

    shrunk = {**accepted, "spec": {**accepted["spec"], "storage": {"size": "1Gi"}}}
    with pytest.raises(ApiError) as refused:
        await client.update(shrunk)
    assert "storage cannot shrink (from 2Gi to 1Gi)" in str(refused.value)
    await client.delete(policy)


async def test_a_major_version_downgrade_is_refused_through_the_api_server(
    webhooks: Client, namespace: str
) -> None:
    client = webhooks
    policy = await _policy(client)
    created = await client.create(_instance(namespace, "db", "16"))
    downgraded = {**created, "spec": {**created["spec"], "version": "15"}}
    with pytest.raises(ApiError) as refused:
        await client.update(downgraded)
    assert refused.value.status == 403
    message = str(refused.value)
    assert 'admission webhook "postgres-validate-postgresinstances' in message
    assert "a major-version downgrade (16 to 15) is refused" in message
    assert "restore a Backup into a new instance instead" in message
    stored = await client.live.get(API_VERSION, INSTANCE, name="db", namespace=namespace)
    assert stored["spec"]["version"] == "16", "nothing was written"
    # The same update without the downgrade passes the same webhook.
    relabelled = {**stored, "metadata": {**stored["metadata"], "labels": {"tier": "gold"}}}
    assert (await client.update(relabelled))["metadata"]["labels"] == {"tier": "gold"}
    await client.delete(policy)


def _binding(namespace: str, name: str, role: str | None, instance: str = "db") -> dict[str, Any]:
    spec: dict[str, Any] = {"instanceRef": {"name": instance}, "database": "orders"}
    if role is not None:
        spec["roleName"] = role
    return {
        "apiVersion": API_VERSION,
        "kind": BINDING,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def test_a_binding_whose_role_is_taken_on_its_instance_is_refused_through_the_api_server(
    webhooks: Client, namespace: str
) -> None:
    """Against a binding and a PostgresUser of the same instance (read from the webhook's
    cache, as in the operator); the same role on another instance is fine."""
    client = webhooks
    await client.create(_binding(namespace, "checkout", "orders_app"))

    async def refused_for(body: dict[str, Any], holder: str) -> None:
        with pytest.raises(ApiError) as refused:
            await client.create(body)
        assert refused.value.status == 403
        assert (
            f"role 'orders_app' on instance {body['spec']['instanceRef']['name']} is already "
            f"the role of {holder}: set another spec.roleName"
        ) in str(refused.value)

    async def cached(kind: str, name: str) -> bool:  # the cache behind the webhook
        return any(o["metadata"]["name"] == name for o in await client.list(API_VERSION, kind))

    await eventually(lambda: cached(BINDING, "checkout"), timeout=30)
    await refused_for(_binding(namespace, "checkout-2", "orders_app"), "ServiceBinding checkout")
    other = await client.create(_binding(namespace, "elsewhere", "orders_app", instance="db2"))
    assert other["spec"]["roleName"] == "orders_app", "another instance: another role"
    user = {
        "apiVersion": API_VERSION,
        "kind": USER,
        "metadata": {"name": "migrations", "namespace": namespace},
        "spec": {
            "instanceRef": {"name": "db3"},
            "roleName": "orders_app",
            "database": "orders",
            "passwordSecretRef": {"name": "migrations-password", "key": "password"},
        },
    }
    await client.create(user)
    await eventually(lambda: cached(USER, "migrations"), timeout=30)
    await refused_for(
        _binding(namespace, "reporting", "orders_app", instance="db3"), "PostgresUser migrations"
    )
    stored = await client.list(API_VERSION, BINDING, namespace=namespace)
    assert sorted(b["metadata"]["name"] for b in stored) == ["checkout", "elsewhere"]


async def test_reviews_during_the_shutdown_delay_still_read_the_cache(
    admin_config: ClusterConfig, kube: Client, namespace: str, tmp_path: Path
) -> None:
    """At SIGTERM the controllers stop first (a controller releases the kinds it cached)
    while the webhook server keeps answering for its shutdown delay: a review in that
    window still finds the version policy (the webhooks hold it themselves), and refuses a
    disabled version with the policy's verdict rather than failing."""
    ca = CertificateAuthority()
    ca.issue_serving(["127.0.0.1"]).write(tmp_path, "tls")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server = WebhookServer(port=0, host="127.0.0.1", cert_dir=tmp_path, shutdown_delay=3.0)
    manager = Manager(
        admin_config,
        ManagerOptions(
            metrics_bind_address=None, health_probe_bind_address=None, webhook_server=server
        ),
    )
    await setup_instance_controller(manager, manager.client, options=TEST_OPTIONS)
    await setup_webhooks(manager, ["postgres-instance"])
    await _policy(manager.client)  # seen by the cache the webhooks read
    running = asyncio.create_task(manager.run())
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "during-shutdown",
            "kind": {"group": "postgres.crpy.io", "version": "v1beta1", "kind": INSTANCE},
            "resource": {
                "group": "postgres.crpy.io",
                "version": "v1beta1",
                "resource": "postgresinstances",
            },
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "someone"},
            "object": _instance(namespace, "retired", "14"),
        },
    }
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        await eventually(server.ready, timeout=30)
        await eventually(lambda: manager.cache.list(API_VERSION, POLICY), timeout=30)
        assert _cached_kinds(manager) >= {POLICY, INSTANCE, "StatefulSet"}
        manager.request_stop()  # SIGTERM

        def controllers_released() -> bool:  # what the instance controller alone cached
            return "StatefulSet" not in _cached_kinds(manager)

        await eventually(controllers_released, timeout=30)
        assert not running.done() and server.shutting_down
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            url = f"{server.url}/validate-postgres-crpy-io-v1beta1-postgresinstance"
            async with session.post(url, json=review) as answer:
                body = await answer.text()
        assert answer.status == 200, body
        response = json.loads(body)["response"]
        assert response["allowed"] is False
        assert "version 14 is disabled by the version policy" in response["status"]["message"]
    finally:
        manager.request_stop()
        await asyncio.wait_for(running, 60)
        await kube.delete(dict(POLICY_OBJECT))


def _cached_kinds(manager: Manager) -> set[str]:
    return {entry.resource.kind for entry in manager.cache.kinds()}
