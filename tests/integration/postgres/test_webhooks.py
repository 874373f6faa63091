"""The PostgreSQL API's admission webhooks on a real API server: a PostgresInstance whose
version the policy does not enable is refused at create (as ``kubectl apply`` would be), with
the policy's verdict; one the policy enables is accepted and gets the policy's default version
when it has none; storage cannot shrink.

The operator's webhooks (controllers.postgres.webhooks) are served by a WebhookServer on
loopback with a certificate from a test CA; a Validating- and a MutatingWebhookConfiguration
point at it by URL with that CA as caBundle (what a webhook Service and its certificate are
in a cluster).
"""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.envtest.certs import CertificateAuthority
from controller_runtime.testing import eventually
from controller_runtime.webhook import WebhookServer
from controllers.postgres.api import API_VERSION, INSTANCE, POLICY, POLICY_NAME
from controllers.postgres.webhooks import setup_webhooks
from informers.shared import InformerFactory
from kubeclient.errors import ApiError
from kubeclient.transport import Transport


@dataclass
class Host:
    webhook_server: WebhookServer
    client: Client


def _configuration(kind: str, name: str, url: str, ca: bytes, failure: str) -> dict[str, Any]:
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
                        "resources": ["postgresinstances"],
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
    await cache.watch(API_VERSION, POLICY)
    setup_webhooks(Host(server, client), ["postgres-instance"])  # type: ignore[arg-type]
    await server.start()
    assert server.url is not None
    suffix = uuid.uuid4().hex[:6]
    names = []
    for kind, path, failure in (
        ("ValidatingWebhookConfiguration", "/validate", "Fail"),
        ("MutatingWebhookConfiguration", "/mutate", "Ignore"),
    ):
        name = f"postgres-{path.strip('/')}-{suffix}"
        url = f"{server.url}{path}-postgres-crpy-io-v1beta1-postgresinstance"
        body = _configuration(kind, name, url, ca.cert_pem, failure)
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

    async def cached() -> bool:  # the webhook reads the policy from the cache
        return bool(await client.list(API_VERSION, POLICY))

    await eventually(cached, timeout=30)

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
