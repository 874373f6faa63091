"""The PostgreSQL controllers need exactly the RBAC rules in :data:`POSTGRES_RULES` (what
``manifests/rbac/cluster-role.yaml`` should carry for them): a ServiceAccount bound to a
ClusterRole of only these rules runs the six controllers through a scenario that takes every
path that needs a permission: a binding's whole life against a real PostgreSQL, a backup, an
in-cluster instance restored from it (its agent's account and Role created, a stray role label
removed from its Pod, an outdated Pod deleted), scaled down, and deleted with its volumes, a refused
version (twice: an event series), and a plan that creates and prunes Backups. Then no request
was denied, every request is allowed by the rules as ``tests/rbac_usage.py`` models them, and
every rule was used.

Not granted, on purpose: ``get`` on PostgresInstances and ServiceBindings. The finalizer
helpers re-read an object only when their patch was refused (a concurrent change); without
``get`` that re-read fails and the reconcile is retried with backoff, which succeeds.

:func:`postgres_scenario` and :func:`delete_everything` work with any operator that runs these
controllers (the real clock included), for other RBAC harnesses to reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller_runtime.client import Client
from controller_runtime.controller import ControllerOptions
from controller_runtime.envtest import ControlPlane
from controller_runtime.manager import Manager, ManagerOptions
from controllers.postgres import (
    setup_backup_controller,
    setup_binding_controller,
    setup_instance_controller,
    setup_plan_controller,
    setup_user_controller,
)
from controllers.postgres.api import (
    ANNOTATION_SCHEDULED_AT,
    API_VERSION,
    LABEL_PLAN,
    LABEL_ROLE,
    labels_for,
)
from controllers.postgres.common import decode_secret
from controllers.postgres.localserver import LocalPostgres
from informers.reflector_machine import ReflectorOptions
from kubeclient.config import load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.errors import ForbiddenError
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import (
    condition,
    delete_policy,
    external_instance,
    set_policy,
    wait_for,
)
from tests.rbac_usage import (
    Access,
    RequestLog,
    blocking_owner_accesses,
    grants_for,
    ungranted_accesses,
    unused_grants,
)
from tests.support import CONTROLLER_MANAGER

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
GROUP = "postgres.crpy.io"

POSTGRES_RULES: list[Obj] = [
    # Cached (the controllers' watches): list and watch only; reads come from the cache.
    {
        "apiGroups": [GROUP],
        "resources": [
            "postgresinstances",
            "postgresusers",
            "servicebindings",
            "backups",
            "backupplans",
            "postgresversionpolicies",
        ],
        "verbs": ["list", "watch"],
    },
    # Finalizers are added and removed with JSON patches; the object is re-read live before
    # its cleanup (handle_finalization).
    {
        "apiGroups": [GROUP],
        "resources": ["postgresinstances", "servicebindings"],
        "verbs": ["get", "patch"],
    },
    # The binding controller applies (creates) and deletes its PostgresUser and reads it live
    # while deleting; the user controller patches its finalizer and re-reads it live to clean
    # up (handle_finalization).
    {
        "apiGroups": [GROUP],
        "resources": ["postgresusers"],
        "verbs": ["get", "create", "patch", "delete"],
    },
    # Plans create and prune Backups; a restore reads its Backup live (not cached there).
    {
        "apiGroups": [GROUP],
        "resources": ["backups"],
        "verbs": ["get", "create", "delete", "patch"],
    },
    {
        "apiGroups": [GROUP],
        "resources": [
            "postgresinstances/status",
            "postgresusers/status",
            "servicebindings/status",
            "backups/status",
            "backupplans/status",
        ],
        "verbs": ["patch"],
    },
    # blockOwnerDeletion on the owner references of what each controller creates.
    {
        "apiGroups": [GROUP],
        "resources": [
            "postgresinstances/finalizers",
            "servicebindings/finalizers",
            "backups/finalizers",
            "backupplans/finalizers",
        ],
        "verbs": ["update"],
    },
    # What an in-cluster instance renders (server-side apply: create the first time).
    {
        "apiGroups": ["apps"],
        "resources": ["statefulsets"],
        "verbs": ["list", "watch", "create", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["services", "configmaps"],
        "verbs": ["list", "watch", "create", "patch"],
    },
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    # Backup and restore Jobs.
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    # Secrets are never cached: read live; superuser and binding Secrets are created, binding
    # Secrets updated and deleted.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch", "delete"]},
    # The failover controller caches the instances' Pods (and the Nodes), labels the primary
    # and replicas and deletes Pods for a rolling update; an instance that is not Ready lists
    # its Pods live (an image that cannot be pulled).
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    # The agent's ServiceAccount, Role and RoleBinding (applied).
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["create", "patch"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["create", "patch"],
    },
    # deletionPolicy: Delete.
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list", "delete"]},
    # The event recorder: create, and patch a series.
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]

SETUPS = (
    setup_instance_controller,
    setup_user_controller,
    setup_binding_controller,
    setup_backup_controller,
    setup_plan_controller,
)
ACCOUNT = "postgres-operator"


async def grant(kube: Client, namespace: str) -> list[Obj]:
    name = f"crpy-postgres-{namespace}"
    role: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": POSTGRES_RULES,
    }
    binding: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": name,
        },
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
    }
    for obj in (role, binding):
        await kube.create(obj)
    return [role, binding]


@contextlib.asynccontextmanager
async def operator_as_account(
    control_plane: ControlPlane, namespace: str, log: RequestLog
) -> AsyncIterator[Manager]:
    identity = control_plane.mint_service_account(namespace, ACCOUNT)
    config = await load_kubeconfig(identity.kubeconfig)
    async with Transport(config) as probe:  # RBAC reaches the authorizer's cache quickly
        for _ in range(100):
            try:
                await probe.request("GET", f"/apis/{GROUP}/v1beta1/namespaces/{namespace}/backups")
                break
            except ForbiddenError:
                await asyncio.sleep(0.05)
    manager = Manager(
        config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            graceful_shutdown_timeout=5,
        ),
    )
    manager.transport.on_request = log.record
    # Plain LISTs then WATCHes, as on API servers without streaming lists: both verbs used.
    manager.factory.options = ReflectorOptions(streaming_list=False)
    options = ControllerOptions(skip_name_validation=True, max_concurrent_reconciles=2)
    for setup in SETUPS:
        await setup(manager, manager.client, options=options)
    task = asyncio.create_task(manager.run())
    try:
        yield manager
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 30)


def ready(obj: Obj | None) -> bool:
    return condition(obj, "Ready").get("status") == "True"


def phase(value: str) -> Any:
    return lambda o: o is not None and (o.get("status") or {}).get("phase") == value


async def succeed(kube: Client, job: Obj | None) -> None:
    assert job is not None
    await kube.patch_status(
        job,
        {
            "status": {
                "startTime": "2030-01-01T00:00:00Z",
                "completionTime": "2030-01-01T00:01:00Z",
                "succeeded": 1,
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True"},
                ],
            }
        },
    )


async def create_once_admitted(kube: Client, body: Obj, timeout: float = 30) -> Obj:
    """Create ``body``, again while an admission webhook refuses it: the webhook reads the
    version policy from its cache, which sees a deleted policy a moment late."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await kube.create(body)
        except ForbiddenError as err:
            if "denied the request" not in err.message or loop.time() > deadline:
                raise
        await asyncio.sleep(0.1)  # no event tells when the webhook's cache caught up


async def postgres_scenario(
    kube: Client, transport: Transport, namespace: str, server: LocalPostgres
) -> None:
    """Drive every PostgreSQL controller through every path that needs a permission (see the
    module docs), with an operator running: usable by any RBAC harness. Needs the CRDs, the
    local PostgreSQL ``server``, and ``kube``/``transport`` as an administrator."""
    major = server.version.split(".")[0]
    await set_policy(kube, {major: True, "16": True, "14": False})
    storage = {
        "endpoint": "https://s3.example.test",
        "bucket": "b",
        "credentialsSecretRef": {"name": "s3"},
    }

    def get(kind: str, name: str, check: Any, api: str = API_VERSION) -> Any:
        return wait_for(transport, kind, namespace, name, check, api=api)

    # A binding against a real server.
    await external_instance(kube, namespace, server)
    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "ServiceBinding",
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"instanceRef": {"name": "db"}},
        }
    )
    await get("ServiceBinding", "app", ready)

    # A Secret edited by hand is repaired at the binding's next reconcile (an instance
    # change triggers one).
    credentials = await kube.live.get("v1", "Secret", name="app-credentials", namespace=namespace)
    await kube.patch(credentials, {"stringData": {"host": "wrong.example"}})
    db = await kube.live.get(API_VERSION, "PostgresInstance", name="db", namespace=namespace)
    await kube.patch(db, {"metadata": {"labels": {"touched": "yes"}}})
    await get(
        "secrets",
        "app-credentials",
        lambda o: o is not None and decode_secret(o)["host"] == server.host,
        "v1",
    )

    # A backup of it, and an in-cluster instance restored from it.
    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "Backup",
            "metadata": {"name": "b0", "namespace": namespace},
            "spec": {"instanceRef": {"name": "db"}, "storage": storage},
        }
    )
    await succeed(kube, await get("jobs", "b0-backup", lambda o: o is not None, "batch/v1"))
    await get("Backup", "b0", phase("Succeeded"))
    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "PostgresInstance",
            "metadata": {"name": "pg", "namespace": namespace},
            "spec": {
                "version": "16",
                "replicas": 2,
                "deletionPolicy": "Delete",
                "restore": {"backupName": "b0"},
            },
        }
    )
    await get("poddisruptionbudgets", "pg", lambda o: o is not None, "policy/v1")
    sts = await get("statefulsets", "pg", lambda o: o is not None, "apps/v1")
    await kube.patch_status(
        sts,
        {
            "status": {
                "observedGeneration": sts["metadata"]["generation"],
                "replicas": 2,
                "readyReplicas": 2,
                "availableReplicas": 2,
                "currentReplicas": 2,
                "updatedReplicas": 2,
                "currentRevision": "r",
                "updateRevision": "r",
            }
        },
    )
    await succeed(kube, await get("jobs", "pg-restore", lambda o: o is not None, "batch/v1"))
    await get("PostgresInstance", "pg", ready)
    # Its Pods (no kubelet runs them: they never answer): pg-0 carries a primary label the
    # failover controller did not give (removed), pg-1 an old revision (deleted, to update).
    for name, labels in (
        ("pg-0", {LABEL_ROLE: "primary", "controller-revision-hash": "r"}),
        ("pg-1", {"controller-revision-hash": "old"}),
    ):
        await kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {**labels_for("pg", "database"), **labels},
                },
                "spec": {"containers": [{"name": "postgres", "image": "postgres"}]},
            }
        )
    await get(
        "pods",
        "pg-0",
        lambda o: o is not None and LABEL_ROLE not in o["metadata"]["labels"],
        "v1",
    )
    await get("pods", "pg-1", lambda o: o is None, "v1")
    # The restored-from Backup deleted: its object is deleted by a Job first.
    await kube.delete(API_VERSION, "Backup", name="b0", namespace=namespace)
    await succeed(kube, await get("jobs", "b0-delete", lambda o: o is not None, "batch/v1"))
    await get("Backup", "b0", lambda o: o is None)
    await get("jobs", "b0-delete", lambda o: o is None, "batch/v1")
    pg = await kube.live.get(API_VERSION, "PostgresInstance", name="pg", namespace=namespace)
    await kube.patch(pg, {"spec": {"replicas": 1}})
    await get("poddisruptionbudgets", "pg", lambda o: o is None, "policy/v1")

    # A refused version, reconciled twice: the second event joins a series (a patch). Where
    # the operator's admission webhook runs (tests/integration/test_manifests.py), it refuses
    # to create an instance of a disabled version; without a policy it lets one in (the
    # instance waits), so the instance is created while there is none, then the policy back.
    await delete_policy(kube)
    await create_once_admitted(
        kube,
        {
            "apiVersion": API_VERSION,
            "kind": "PostgresInstance",
            "metadata": {"name": "old", "namespace": namespace},
            "spec": {"version": "14"},
        },
    )
    await set_policy(kube, {major: True, "16": True, "14": False})
    old = await get(
        "PostgresInstance",
        "old",
        lambda o: condition(o, "VersionAccepted").get("reason") == "VersionDisabled",
    )
    events_path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"

    async def refusal_events() -> list[Obj]:
        items = (await transport.get_json(events_path)).get("items") or []
        return [e for e in items if e.get("reason") == "VersionDisabled"]

    for _ in range(200):
        if await refusal_events():
            break
        await asyncio.sleep(0.05)
    await kube.patch(old, {"spec": {"parameters": {"work_mem": "4MB"}}})
    for _ in range(200):
        found = await refusal_events()
        if found and (found[0].get("series") or {}).get("count", 1) >= 2:
            break
        await asyncio.sleep(0.05)

    # A plan: suspended while its last run is set an hour back; resumed, one run is due at
    # once (with the real clock), and an old finished Backup is pruned by age.
    plan = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "BackupPlan",
            "metadata": {"name": "nightly", "namespace": namespace},
            "spec": {
                "schedule": "*/5 * * * *",
                "suspend": True,
                "retention": {"maxAge": "1d"},
                "backupTemplate": {"spec": {"instanceRef": {"name": "db"}, "storage": storage}},
            },
        }
    )
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await kube.patch_status(plan, {"status": {"lastScheduleTime": an_hour_ago}})
    owned = {
        "apiVersion": API_VERSION,
        "kind": "BackupPlan",
        "name": "nightly",
        "uid": plan["metadata"]["uid"],
        "controller": True,
    }
    stale = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "Backup",
            "metadata": {
                "name": "nightly-old",
                "namespace": namespace,
                "labels": {LABEL_PLAN: "nightly"},
                "annotations": {ANNOTATION_SCHEDULED_AT: "2000-01-01T00:00:00Z"},
                "ownerReferences": [owned],
            },
            "spec": {"instanceRef": {"name": "db"}, "storage": storage},
        }
    )
    await kube.patch_status(stale, {"status": {"phase": "Failed"}})
    await kube.patch(plan, {"spec": {"suspend": False}})
    await get(
        "BackupPlan",
        "nightly",
        lambda o: (o or {}).get("status", {}).get("lastScheduleTime") not in (None, an_hour_ago),
    )
    await get("Backup", "nightly-old", lambda o: o is None)


async def delete_everything(kube: Client, transport: Transport, namespace: str) -> None:
    """The deletion paths: a binding (its user, role and Secret), then the instances (one
    with its volumes)."""

    def get(kind: str, name: str, check: Any, api: str = API_VERSION) -> Any:
        return wait_for(transport, kind, namespace, name, check, api=api)

    # Deletion paths: the binding (user, role, Secret), instances (volumes), the rest.
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "data-pg-0",
                "namespace": namespace,
                "labels": labels_for("pg", "data"),
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )
    await kube.delete(
        {
            "apiVersion": API_VERSION,
            "kind": "ServiceBinding",
            "metadata": {"name": "app", "namespace": namespace},
        }
    )
    await get("ServiceBinding", "app", lambda o: o is None)
    for name in ("pg", "old", "db"):
        await kube.delete(
            {
                "apiVersion": API_VERSION,
                "kind": "PostgresInstance",
                "metadata": {"name": name, "namespace": namespace},
            }
        )
        await get("PostgresInstance", name, lambda o: o is None)


@pytest.mark.plays(
    "the job and StatefulSet controllers (writes Jobs' status and a StatefulSet's readyReplicas)",
    by=CONTROLLER_MANAGER,
)
async def test_the_postgres_controllers_need_exactly_their_rules(
    control_plane: ControlPlane,
    kube: Client,
    transport: Transport,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    rbac = await grant(kube, namespace)
    grants = grants_for(rbac, namespace, ACCOUNT)
    log = RequestLog()
    async with operator_as_account(control_plane, namespace, log):
        await postgres_scenario(kube, transport, namespace, postgres_server)
        written: list[Obj] = []
        for api, kind in (
            ("apps/v1", "StatefulSet"),
            ("v1", "Service"),
            ("v1", "ConfigMap"),
            ("v1", "Secret"),
            ("v1", "ServiceAccount"),
            ("rbac.authorization.k8s.io/v1", "Role"),
            ("rbac.authorization.k8s.io/v1", "RoleBinding"),
            ("batch/v1", "Job"),
            (API_VERSION, "PostgresUser"),
            (API_VERSION, "Backup"),
        ):
            written += await kube.live.list(api, kind, namespace=namespace)

        await delete_everything(kube, transport, namespace)

    discovery = Discovery(transport)
    plurals: dict[tuple[str, str], tuple[str, str]] = {}
    for obj in written:
        for ref in obj["metadata"].get("ownerReferences") or ():
            info = await discovery.resolve(ref["apiVersion"], ref["kind"])
            plurals[(ref["apiVersion"], ref["kind"])] = (info.group, info.plural)
    accesses: list[Access] = log.accesses() + blocking_owner_accesses(
        written, lambda v, k: plurals[(v, k)]
    )
    for obj in rbac:
        await kube.delete(obj)

    denied = sorted({str(a) for a in accesses if a.status == 403})
    assert not denied, "denied:\n" + "\n".join(denied)
    ungranted = [str(a) for a in ungranted_accesses(grants, accesses)]
    assert not ungranted, "allowed, but by no rule:\n" + "\n".join(ungranted)
    unused = [str(g) for g in unused_grants(grants, accesses)]
    assert not unused, "granted but never used:\n" + "\n".join(unused)
