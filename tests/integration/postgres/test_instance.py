"""In-cluster PostgresInstances on the local control plane (no kubelet: nothing runs, so the
tests check what is rendered, and play the StatefulSet controller by writing its status).

- the version policy: a disabled version is refused with a clear condition, an enabled one
  accepted; a running version that gets disabled keeps running, and the status says so;
  a major version change is refused unless allowed; a minor one rolls the image;
- scaling 1 → 3 renders replication settings, spread constraints and a PodDisruptionBudget,
  and back; a parameter change rolls the pod template's hash; Ready follows the StatefulSet;
- deletion with ``deletionPolicy: Delete`` deletes the volumes.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller_runtime.client import Client
from controller_runtime.manager import Manager
from controllers.postgres.api import ANNOTATION_CONFIG_HASH, API_VERSION, LABEL_INSTANCE, labels_for
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import condition, set_policy, wait_for
from tests.support import CONTROLLER_MANAGER

pytestmark = pytest.mark.integration

Obj = dict[str, Any]


def instance(name: str, namespace: str, **spec: Any) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "PostgresInstance",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def cond_is(condition_type: str, status: str, reason: str | None = None) -> Any:
    def check(obj: Obj | None) -> bool:
        found = condition(obj, condition_type)
        return found.get("status") == status and (reason is None or found.get("reason") == reason)

    return check


def image_of(sts: Obj | None) -> str:
    assert sts is not None
    return str(sts["spec"]["template"]["spec"]["containers"][0]["image"])


async def play_statefulset_controller(kube: Client, sts: Obj, ready: int) -> None:
    """Write the status the StatefulSet controller would: rolled out, ``ready`` pods ready."""
    replicas = sts["spec"]["replicas"]
    await kube.patch_status(
        sts,
        {
            "status": {
                "observedGeneration": sts["metadata"]["generation"],
                "replicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": replicas,
                "updatedReplicas": replicas,
                "currentRevision": "rev-1",
                "updateRevision": "rev-1",
            }
        },
    )


async def test_the_version_policy_decides_which_versions_run(
    operator: Manager, kube: Client, transport: Transport, namespace: str
) -> None:
    await set_policy(kube, {"14": False, "16": True})
    await kube.create(instance("pg", namespace, version="14"))
    refused = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        cond_is("VersionAccepted", "False", "VersionDisabled"),
    )
    assert condition(refused, "VersionAccepted")["message"] == (
        "version 14 is disabled by the version policy"
    )
    assert condition(refused, "Ready")["status"] == "False"
    with pytest.raises(NotFoundError):
        await kube.live.get("apps/v1", "StatefulSet", name="pg", namespace=namespace)

    # Enabled: accepted and rendered.
    await set_policy(kube, {"14": True, "16": True})
    sts = await wait_for(
        transport, "statefulsets", namespace, "pg", lambda o: o is not None, api="apps/v1"
    )
    assert image_of(sts) == "postgres:14"
    await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        cond_is("VersionAccepted", "True", "VersionEnabled"),
    )

    # Disabled while running: it keeps running, and the status says it is disabled.
    await set_policy(kube, {"14": False, "16": True})
    running = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        cond_is("VersionAccepted", "True", "VersionDisabled"),
    )
    assert (
        "keeps running, but cannot be newly chosen"
        in condition(running, "VersionAccepted")["message"]
    )
    assert image_of(
        await kube.live.get("apps/v1", "StatefulSet", name="pg", namespace=namespace)
    ) == ("postgres:14")

    # A major change is refused (the old version keeps running) unless allowed.
    pg = await kube.live.get(API_VERSION, "PostgresInstance", name="pg", namespace=namespace)
    await kube.patch(pg, {"spec": {"version": "16"}})
    refused = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        cond_is("VersionAccepted", "False", "MajorUpgradeRefused"),
    )
    assert "allowMajorVersionUpgrade" in condition(refused, "VersionAccepted")["message"]
    assert condition(refused, "Degraded")["status"] == "True"
    assert image_of(
        await kube.live.get("apps/v1", "StatefulSet", name="pg", namespace=namespace)
    ) == ("postgres:14")
    await kube.patch(pg, {"spec": {"allowMajorVersionUpgrade": True}})
    await wait_for(
        transport,
        "statefulsets",
        namespace,
        "pg",
        lambda o: o is not None and image_of(o) == "postgres:16",
        api="apps/v1",
    )

    # A minor change within an enabled major rolls the image in place.
    await kube.patch(pg, {"spec": {"version": "16.4"}})
    await wait_for(
        transport,
        "statefulsets",
        namespace,
        "pg",
        lambda o: o is not None and image_of(o) == "postgres:16.4",
        api="apps/v1",
    )


@pytest.mark.plays(
    "the StatefulSet controller (writes a StatefulSet's status)", by=CONTROLLER_MANAGER
)
async def test_scaling_and_parameters_render_replication_spread_pdb_and_roll_the_template(
    operator: Manager, kube: Client, transport: Transport, namespace: str
) -> None:
    await set_policy(kube, {"16": True})
    await kube.create(
        instance(
            "pg",
            namespace,
            version="16",
            parameters={"max_connections": "200"},
            deletionPolicy="Delete",
            storage={"size": "2Gi", "storageClassName": "fast"},
        )
    )
    sts = await wait_for(
        transport, "statefulsets", namespace, "pg", lambda o: o is not None, api="apps/v1"
    )
    assert sts is not None and sts["spec"]["replicas"] == 1
    template = sts["spec"]["template"]
    keys = [c["topologyKey"] for c in template["spec"]["topologySpreadConstraints"]]
    assert keys == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "2Gi"
    assert claim["storageClassName"] == "fast"
    config = await kube.live.get("v1", "ConfigMap", name="pg-config", namespace=namespace)
    assert "max_connections = '200'" in config["data"]["postgresql.conf"]
    assert "synchronous_standby_names" not in config["data"]["postgresql.conf"]
    for service in ("pg-headless", "pg-primary", "pg-replicas"):
        await kube.live.get("v1", "Service", name=service, namespace=namespace)
    superuser = await kube.live.get("v1", "Secret", name="pg-superuser", namespace=namespace)
    assert set(superuser["data"]) == {"username", "password", "replication-password"}
    with pytest.raises(NotFoundError):
        await kube.live.get("policy/v1", "PodDisruptionBudget", name="pg", namespace=namespace)
    # The status is written after the rendered objects: wait for it, do not race it.
    pending = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        lambda obj: "endpoint" in ((obj or {}).get("status") or {}),
    )
    assert pending is not None
    assert condition(pending, "Ready")["status"] == "False"
    # The failover controller names the first Pod target; no Pod serves yet (no kubelet).
    bootstrapping = await wait_for(
        transport,
        "PostgresInstance",
        namespace,
        "pg",
        lambda obj: ((obj or {}).get("status") or {}).get("targetPrimary") == "pg-0",
    )
    assert bootstrapping is not None and "currentPrimary" not in bootstrapping["status"]
    assert bootstrapping["status"]["ha"]["phase"] == "Bootstrap"
    available = condition(bootstrapping, "PrimaryAvailable")
    assert (available["status"], available["reason"]) == ("False", "Bootstrapping")
    role = await kube.live.get(
        "rbac.authorization.k8s.io/v1", "Role", name="pg-agent", namespace=namespace
    )
    assert role["rules"][0]["resourceNames"] == ["pg"] and role["rules"][0]["verbs"] == ["get"]
    await kube.live.get("v1", "ServiceAccount", name="pg-agent", namespace=namespace)
    await kube.live.get(
        "rbac.authorization.k8s.io/v1", "RoleBinding", name="pg-agent", namespace=namespace
    )
    assert pending["status"]["endpoint"] == {"host": f"pg-primary.{namespace}.svc", "port": 5432}

    # Ready once the StatefulSet reports its pod ready.
    await play_statefulset_controller(kube, sts, ready=1)
    ready = await wait_for(transport, "PostgresInstance", namespace, "pg", cond_is("Ready", "True"))
    assert ready is not None and ready["status"]["version"] == "16"
    assert condition(ready, "Progressing")["status"] == "False"

    # 1 → 3, synchronous: replication settings, a PDB, and the config hash moves.
    first_hash = template["metadata"]["annotations"][ANNOTATION_CONFIG_HASH]
    pg = await kube.live.get(API_VERSION, "PostgresInstance", name="pg", namespace=namespace)
    await kube.patch(pg, {"spec": {"replicas": 3, "replication": {"synchronous": {"number": 1}}}})
    sts = await wait_for(
        transport,
        "statefulsets",
        namespace,
        "pg",
        lambda o: o is not None and o["spec"]["replicas"] == 3,
        api="apps/v1",
    )
    assert sts is not None
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["REPLICATION_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "pg-superuser"
    (agent,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert (
        agent["restartPolicy"] == "Always" and sts["spec"]["updateStrategy"]["type"] == "OnDelete"
    )
    config = await kube.live.get("v1", "ConfigMap", name="pg-config", namespace=namespace)
    conf = config["data"]["postgresql.conf"]
    assert "synchronous_standby_names = 'FIRST 1 (*)'" in conf and "wal_level = 'replica'" in conf
    assert "pg_basebackup" in config["data"]["entrypoint.sh"]
    pdb = await wait_for(
        transport, "poddisruptionbudgets", namespace, "pg", lambda o: o is not None, api="policy/v1"
    )
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"][LABEL_INSTANCE] == "pg"
    second_hash = sts["spec"]["template"]["metadata"]["annotations"][ANNOTATION_CONFIG_HASH]
    assert second_hash != first_hash
    progressing = await wait_for(
        transport, "PostgresInstance", namespace, "pg", cond_is("Progressing", "True")
    )
    assert condition(progressing, "Ready")["status"] == "False"

    # A parameter change rolls the pod template (its hash changes), nothing else.
    await kube.patch(pg, {"spec": {"parameters": {"max_connections": "200", "work_mem": "8MB"}}})

    def rolled(o: Obj | None) -> bool:
        return o is not None and o["spec"]["template"]["metadata"]["annotations"][
            ANNOTATION_CONFIG_HASH
        ] not in (first_hash, second_hash)

    sts = await wait_for(transport, "statefulsets", namespace, "pg", rolled, api="apps/v1")
    config = await kube.live.get("v1", "ConfigMap", name="pg-config", namespace=namespace)
    assert "work_mem = '8MB'" in config["data"]["postgresql.conf"]

    # Back to 1: the PDB goes.
    await kube.patch(pg, {"spec": {"replicas": 1}})
    await wait_for(
        transport, "poddisruptionbudgets", namespace, "pg", lambda o: o is None, api="policy/v1"
    )

    # Deletion with deletionPolicy Delete deletes the volumes (as the StatefulSet made them).
    claim_obj = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "data-pg-0",
            "namespace": namespace,
            "labels": labels_for("pg", "data"),
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}},
    }
    await kube.create(claim_obj)
    await kube.delete(pg)
    await wait_for(transport, "PostgresInstance", namespace, "pg", lambda o: o is None)
    try:
        left = await kube.live.get(
            "v1", "PersistentVolumeClaim", name="data-pg-0", namespace=namespace
        )
    except NotFoundError:
        return
    # pvc-protection keeps it until no pod uses it (no controller-manager here to say so).
    assert left["metadata"].get("deletionTimestamp")


@pytest.mark.plays(
    "the job and StatefulSet controllers (writes a Job's and a StatefulSet's status)",
    by=CONTROLLER_MANAGER,
)
async def test_an_instance_restored_from_a_backup_is_ready_once_the_restore_job_succeeded(
    operator: Manager, kube: Client, transport: Transport, namespace: str
) -> None:
    await set_policy(kube, {"16": True})
    storage = {
        "endpoint": "https://s3.example.test",
        "bucket": "b",
        "credentialsSecretRef": {"name": "s3"},
    }
    source = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "Backup",
            "metadata": {"name": "monday", "namespace": namespace},
            "spec": {"instanceRef": {"name": "old"}, "database": "shop", "storage": storage},
        }
    )
    # Played by the Backup controller in real life.
    await kube.patch_status(source, {"status": {"phase": "Succeeded"}})
    await kube.create(instance("pg", namespace, version="16", restore={"backupName": "monday"}))
    sts = await wait_for(
        transport, "statefulsets", namespace, "pg", lambda o: o is not None, api="apps/v1"
    )
    assert sts is not None
    await play_statefulset_controller(kube, sts, ready=1)
    job = await wait_for(
        transport, "jobs", namespace, "pg-restore", lambda o: o is not None, api="batch/v1"
    )
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert f"s3://b/backups/{namespace}/old/monday.dump" in pod["initContainers"][0]["command"][-1]
    assert "pg_restore" in pod["containers"][0]["command"][-1]
    restoring = await wait_for(
        transport, "PostgresInstance", namespace, "pg", cond_is("Ready", "False", "Restoring")
    )
    assert restoring is not None and restoring["status"]["restore"]["jobName"] == "pg-restore"
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
    ready = await wait_for(transport, "PostgresInstance", namespace, "pg", cond_is("Ready", "True"))
    assert ready is not None and ready["status"]["restore"]["phase"] == "Succeeded"
