"""An upgrade across the PostgreSQL API's versions, on a real API server and etcd: objects
created under the previous release's CRDs (v1alpha1 only, stored as v1alpha1) survive the
upgrade to this release's CRDs (v1beta1 stored, v1alpha1 served), read back the same in both
versions, and the storage-version migration rewrites them in etcd as v1beta1 and narrows the
CRDs' ``status.storedVersions``.

The previous release's CRDs are generated from the frozen v1alpha1 classes alone, which is
what that release's CRDs were (one version, stored, no conversion). The kinds whose versions
share one schema are converted by the API server itself; PostgresInstance converts through the
operator's webhook, served on loopback here with the CRD pointing at it by URL.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.crdgen import crd_documents, render
from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.certs import CertificateAuthority
from controller_runtime.storage_migration import StorageVersionMigrator, migrate
from controller_runtime.webhook import WebhookServer
from controllers.api.postgres import (
    BackupPlanV1alpha1,
    BackupV1alpha1,
    PostgresInstanceV1alpha1,
    PostgresUserV1alpha1,
    PostgresVersionPolicyV1alpha1,
    ServiceBindingV1alpha1,
)
from controllers.api.postgres.conversion import SYNCHRONOUS_ANNOTATION, instance_to_v1beta1
from controllers.migrate import run
from controllers.postgres.webhooks import setup_webhooks
from informers.shared import InformerFactory
from kubeclient.config import load_kubeconfig
from kubeclient.transport import Transport

pytestmark = pytest.mark.skipif(
    use_existing_cluster(),
    reason="starts control planes of its own (with the previous release's CRDs, and etcd read "
    "directly)",
)

ROOT = Path(__file__).resolve().parents[3]
GROUP = "postgres.crpy.io"
ALPHA, BETA = f"{GROUP}/v1alpha1", f"{GROUP}/v1beta1"
NAMESPACE = "upgrade"
INSTANCE_CRD_FILE = "postgres.crpy.io_postgresinstances.yaml"

SAME_SCHEMA = (
    PostgresUserV1alpha1,
    ServiceBindingV1alpha1,
    BackupV1alpha1,
    BackupPlanV1alpha1,
    PostgresVersionPolicyV1alpha1,
)

OBJECTS: list[dict[str, Any]] = [
    {
        "kind": "PostgresUser",
        "metadata": {"name": "reporting", "namespace": NAMESPACE, "labels": {"team": "bi"}},
        "spec": {
            "instanceRef": {"name": "db"},
            "roleName": "reporting",
            "database": "reports",
            "privileges": "ReadOnly",
            "connectionLimit": 5,
            "passwordSecretRef": {"name": "reporting-password"},
        },
    },
    {
        "kind": "ServiceBinding",
        "metadata": {"name": "shop", "namespace": NAMESPACE},
        "spec": {"instanceRef": {"name": "db"}, "roleName": "shop_app", "secretName": "shop-db"},
    },
    {
        "kind": "Backup",
        "metadata": {"name": "nightly-1", "namespace": NAMESPACE},
        "spec": {
            "instanceRef": {"name": "db"},
            "method": "pg_basebackup",
            "storage": {
                "endpoint": "https://s3.example.com",
                "bucket": "dumps",
                "credentialsSecretRef": {"name": "s3"},
            },
        },
    },
    {
        "kind": "BackupPlan",
        "metadata": {"name": "nightly", "namespace": NAMESPACE},
        "spec": {
            "schedule": "@daily",
            "retention": {"keepLast": 3},
            "backupTemplate": {
                "spec": {
                    "instanceRef": {"name": "db"},
                    "storage": {
                        "endpoint": "https://s3.example.com",
                        "bucket": "dumps",
                        "credentialsSecretRef": {"name": "s3"},
                    },
                }
            },
        },
    },
    {
        "kind": "PostgresVersionPolicy",
        "metadata": {"name": "default"},
        "spec": {"versions": [{"version": "15"}, {"version": "14", "enabled": False}]},
    },
]


def previous_release_crds(directory: Path) -> list[Path]:
    """The CRDs the previous release shipped: each kind's v1alpha1 alone, stored."""
    paths = []
    for name, document, header in crd_documents(SAME_SCHEMA):
        document["spec"].pop("conversion", None)
        (version,) = document["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["storage"] is True
        path = directory / name
        path.write_text(render(document, header))
        paths.append(path)
    return paths


def crd_name(kind: str) -> str:
    return str(
        next(
            doc["metadata"]["name"]
            for _, doc, _ in crd_documents([*SAME_SCHEMA, PostgresInstanceV1alpha1])
            if doc["spec"]["names"]["kind"] == kind
        )
    )


@pytest.fixture(scope="module")
def old_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own: the session's has this release's CRDs installed."""
    with ControlPlane(crd_directory=None) as plane:
        plane.install_crds(previous_release_crds(tmp_path_factory.mktemp("old-crds")))
        yield plane


@pytest.fixture
async def client(old_plane: ControlPlane) -> AsyncIterator[Client]:
    async with Transport(await load_kubeconfig(old_plane.kubeconfig)) as transport:
        cache = Cache(InformerFactory(transport))
        yield Client(transport, cache, field_manager="test")
        await cache.stop()


def etcd_key(obj: dict[str, Any]) -> str:
    plural = crd_name(obj["kind"]).split(".")[0]
    meta = obj["metadata"]
    where = f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]
    return f"/registry/{GROUP}/{plural}/{where}"


async def stored_api_version(plane: ControlPlane, obj: dict[str, Any]) -> str:
    """The apiVersion etcd holds the object in (custom resources are stored as JSON)."""
    body = {"key": base64.b64encode(etcd_key(obj).encode()).decode()}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{plane.etcd_url}/v3/kv/range", json=body) as answer,
    ):
        assert answer.status == 200, await answer.text()
        (kv,) = (await answer.json())["kvs"]
    return str(json.loads(base64.b64decode(kv["value"]))["apiVersion"])


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """What must survive: everything but apiVersion, the resourceVersion and managedFields
    (a rewrite moves the first and adds to the second)."""
    meta = {
        k: v for k, v in obj["metadata"].items() if k not in {"resourceVersion", "managedFields"}
    }
    return {**{k: v for k, v in obj.items() if k != "apiVersion"}, "metadata": meta}


async def test_old_objects_survive_the_upgrade_read_in_both_versions_and_migrate(
    old_plane: ControlPlane, client: Client
) -> None:
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    created = [await client.create({"apiVersion": ALPHA, **obj}) for obj in OBJECTS]
    for obj in created:
        assert await stored_api_version(old_plane, obj) == ALPHA

    old_plane.install_crds(sorted((ROOT / "manifests" / "crds").glob(f"{GROUP}_*.yaml")))

    for before in created:
        meta = before["metadata"]
        key = {"name": meta["name"], "namespace": meta.get("namespace")}
        as_beta = await client.live.get(BETA, before["kind"], **key)
        as_alpha = await client.live.get(ALPHA, before["kind"], **key)
        assert as_beta["apiVersion"] == BETA and as_alpha["apiVersion"] == ALPHA
        assert comparable(as_beta) == comparable(before) == comparable(as_alpha)
        assert await stored_api_version(old_plane, before) == ALPHA, "not rewritten yet"

    # The migration Job of manifests/upgrade/, under its own ServiceAccount and ClusterRole.
    await client.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "crpy-system"}}
    )
    for name in ("service-account.yaml", "cluster-role.yaml", "cluster-role-binding.yaml"):
        old_plane.kubectl("apply", "-f", str(ROOT / "manifests" / "upgrade" / name))
    job = old_plane.mint_service_account("crpy-system", "crpy-storage-migration")
    assert await run(str(job.kubeconfig), None, timeout=120) == 0

    for before in created:
        assert await stored_api_version(old_plane, before) == BETA
        meta = before["metadata"]
        key = {"name": meta["name"], "namespace": meta.get("namespace")}
        after = await client.live.get(BETA, before["kind"], **key)
        assert comparable(after) == comparable(before)
        crd = await client.live.get(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", name=crd_name(before["kind"])
        )
        assert crd["status"]["storedVersions"] == ["v1beta1"]
    # A second pass finds nothing to do (one GET per CRD).
    assert await migrate(client, crd_name("PostgresUser")) is None
    assert await run(str(job.kubeconfig), None, timeout=120) == 0

    # The runnable form (a manager's leader could run it), after a write in v1alpha1 under the
    # new CRDs: stored as v1beta1 already (writes always store the storage version).
    name = crd_name("PostgresUser")
    crd = await client.live.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name=name)
    await client.patch_status(crd, {"status": {"storedVersions": ["v1alpha1", "v1beta1"]}})
    obj = {**OBJECTS[0], "metadata": {**OBJECTS[0]["metadata"], "name": "second"}}
    second = await client.create({"apiVersion": ALPHA, **obj})
    assert await stored_api_version(old_plane, second) == BETA
    migrator = StorageVersionMigrator(client, [name])
    await migrator.start()
    await migrator.done.wait()
    await migrator.stop(0)
    result = migrator.results[name]
    assert result is not None and result.rewritten + result.skipped >= 1
    crd = await client.live.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name=name)
    assert crd["status"]["storedVersions"] == ["v1beta1"]


@dataclass
class _Host:
    webhook_server: WebhookServer
    client: Client


INSTANCES: list[dict[str, Any]] = [
    {"name": "sync", "spec": {"version": "15", "replicas": 3, "replication": {"mode": "sync"}}},
    {"name": "async", "spec": {"version": "15", "replicas": 2, "replication": {"mode": "async"}}},
    {"name": "plain", "spec": {"version": "16", "storage": {"size": "5Gi"}}},
]


async def test_postgres_instances_convert_through_the_webhook_and_migrate(tmp_path: Path) -> None:
    """PostgresInstance, whose versions differ: the old objects read back in both versions
    through the operator's conversion webhook (served on loopback, the CRD pointing at it by
    URL with a test CA), a v1beta1 setting v1alpha1 cannot express survives a v1alpha1 read,
    and the migration rewrites the old objects as v1beta1."""
    old = previous_instance_crd(tmp_path)
    ca = CertificateAuthority()
    ca.issue_serving(["127.0.0.1"]).write(tmp_path, "tls")
    with ControlPlane(crd_directory=None) as plane:
        plane.install_crds([old])
        async with Transport(await load_kubeconfig(plane.kubeconfig)) as transport:
            cache = Cache(InformerFactory(transport))
            client = Client(transport, cache, field_manager="test")
            server = WebhookServer(port=0, host="127.0.0.1", cert_dir=tmp_path)
            setup_webhooks(_Host(server, client), [])  # type: ignore[arg-type]
            await server.start()
            try:
                await _convert_and_migrate(plane, client, server, ca.cert_pem, tmp_path)
            finally:
                await server.stop(0)
                await cache.stop()


def previous_instance_crd(directory: Path) -> Path:
    ((name, document, header),) = crd_documents([PostgresInstanceV1alpha1])
    document["spec"].pop("conversion", None)
    path = directory / f"old-{name}"
    path.write_text(render(document, header))
    return path


async def _convert_and_migrate(
    plane: ControlPlane, client: Client, server: WebhookServer, ca: bytes, directory: Path
) -> None:
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    created = []
    for item in INSTANCES:
        body = {
            "apiVersion": ALPHA,
            "kind": "PostgresInstance",
            "metadata": {"name": item["name"], "namespace": NAMESPACE},
            "spec": item["spec"],
        }
        created.append(await client.create(body))

    new = yaml.safe_load((ROOT / "manifests" / "crds" / INSTANCE_CRD_FILE).read_text())
    new["spec"]["conversion"]["webhook"]["clientConfig"] = {
        "url": f"{server.url}/convert",
        "caBundle": base64.b64encode(ca).decode(),
    }
    upgraded = directory / INSTANCE_CRD_FILE
    upgraded.write_text(yaml.safe_dump(new))
    plane.install_crds([upgraded])

    for before in created:
        key = {"name": before["metadata"]["name"], "namespace": NAMESPACE}
        assert await stored_api_version(plane, before) == ALPHA
        as_alpha = await client.live.get(ALPHA, "PostgresInstance", **key)
        as_beta = await client.live.get(BETA, "PostgresInstance", **key)
        assert comparable(as_alpha) == comparable(before)
        assert as_beta == {**instance_to_v1beta1(as_alpha), "metadata": as_beta["metadata"]}
    sync = await client.live.get(BETA, "PostgresInstance", name="sync", namespace=NAMESPACE)
    # syncPolicy: the schema's default, filled in by the API server.
    assert sync["spec"]["replication"] == {
        "synchronous": {"number": 1, "method": "First"},
        "syncPolicy": "ZeroLoss",
    }

    # A setting only v1beta1 can say, read and written back by a v1alpha1 client.
    sync["spec"]["replication"]["synchronous"] = {"number": 2, "method": "Any"}
    sync = await client.update(sync)
    as_alpha = await client.live.get(ALPHA, "PostgresInstance", name="sync", namespace=NAMESPACE)
    assert as_alpha["spec"]["replication"] == {"mode": "sync", "syncPolicy": "ZeroLoss"}
    as_alpha["metadata"].setdefault("labels", {})["touched"] = "by-v1alpha1"
    await client.update(as_alpha)
    again = await client.live.get(BETA, "PostgresInstance", name="sync", namespace=NAMESPACE)
    assert again["spec"]["replication"] == {
        "synchronous": {"number": 2, "method": "Any"},
        "syncPolicy": "ZeroLoss",
    }
    assert SYNCHRONOUS_ANNOTATION not in (again["metadata"].get("annotations") or {})

    result = await migrate(client, "postgresinstances.postgres.crpy.io")
    assert result is not None and result.rewritten + result.skipped == len(INSTANCES)
    for before in created:
        assert await stored_api_version(plane, before) == BETA
