"""Day-two behaviour of one in-cluster PostgresInstance on a real node, shared by the tests of
this module (one instance keeps the suite fast; each scenario is its own test):

- TLS from a certificate Secret: a client verifying the server (``sslmode=verify-full``, the
  CA, the Service's DNS name) connects over TLS; one without the CA, one with another CA, and
  one without TLS are refused.
- A ServiceBinding used by an application Pod that takes the binding's Secret as environment
  variables (as docs/postgres.md shows): it connects and writes; deleting the binding drops the
  role (seen with the administrator's connection) and the running application's next
  connection is refused; its data stays.
- Storage on a PersistentVolumeClaim survives the deletion of the PostgreSQL Pod: the
  StatefulSet recreates the Pod on the same claim and the row written before is still there.

The certificates are made here with the openssl command (a CA and a server certificate whose
names are the primary Service's DNS names)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.connect import connecting, outage
from tests.e2e.pods import condition, exec_in, probing, run_pod, secret_env
from tests.e2e.support import TIMINGS, diagnostics, get_json, new_namespace, wait_for

POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {"defaultImage": "postgres:{version}", "versions": [{"version": "15"}]},
}
INSTANCE = "db"


@dataclass(frozen=True)
class Instance:
    namespace: str
    name: str
    host: str
    """The primary Service's DNS name (the name in the server certificate)."""

    def superuser_env(self) -> list[dict[str, Any]]:
        return [
            {"name": "PGHOST", "value": self.host},
            {"name": "PGUSER", "value": "postgres"},
            secret_env("PGPASSWORD", f"{self.name}-superuser", "password"),
        ]


def _openssl(directory: Path, *args: str) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=directory, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"openssl {' '.join(args)} failed: {result.stderr}"


def _certificates(directory: Path, names: list[str]) -> None:
    """``ca.crt``/``ca.key``, ``other-ca.crt`` and ``tls.crt``/``tls.key`` (signed by ca,
    valid for ``names``) in ``directory``."""
    for ca in ("ca", "other-ca"):
        _openssl(
            directory,
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN=crpy-e2e-{ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
        )  # fmt: skip
    _openssl(
        directory,
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={names[0]}",
        "-keyout", "tls.key", "-out", "tls.csr",
    )  # fmt: skip
    (directory / "san.ext").write_text(
        "subjectAltName=" + ",".join(f"DNS:{name}" for name in names) + "\n"
    )
    _openssl(
        directory,
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "tls.crt",
    )  # fmt: skip


def _ready(cluster: LocalCluster, namespace: str, name: str) -> bool:
    return condition(cluster, "postgresinstance", namespace, name, "Ready").get("status") == "True"


@pytest.fixture(scope="module")
def instance(cluster: LocalCluster, operator: str) -> Iterator[Instance]:
    """A 1-replica instance with TLS from a certificate Secret; the CAs as ConfigMaps."""
    namespace = new_namespace(cluster, "pgops")
    primary = f"{INSTANCE}-primary"
    names = [
        f"{primary}.{namespace}.svc",
        f"{primary}.{namespace}.svc.cluster.local",
        f"{primary}.{namespace}",
        primary,
    ]
    with tempfile.TemporaryDirectory(prefix="crpy-e2e-tls-") as temp:
        directory = Path(temp)
        _certificates(directory, names)
        cluster.kubectl(
            "create", "secret", "tls", f"{INSTANCE}-tls", "-n", namespace,
            f"--cert={directory / 'tls.crt'}", f"--key={directory / 'tls.key'}",
        )  # fmt: skip
        for ca in ("ca", "other-ca"):
            cluster.kubectl(
                "create", "configmap", ca, "-n", namespace,
                f"--from-file=ca.crt={directory / f'{ca}.crt'}",
            )  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    spec = {
        "version": "15",
        "replicas": 1,
        "storage": {"size": "1Gi"},
        "tls": {"secretName": f"{INSTANCE}-tls"},
        "deletionPolicy": "Delete",
    }
    manifest = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": INSTANCE, "namespace": namespace},
        "spec": spec,
    }
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))
    wait_for(
        lambda: _ready(cluster, namespace, INSTANCE),
        f"postgresinstance {namespace}/{INSTANCE} (TLS) Ready",
        240,
        lambda: diagnostics(cluster, namespace, f"postgresinstance {INSTANCE}"),
    )
    TIMINGS["postgres_tls_1_replica_apply_to_ready"] = time.monotonic() - started
    yield Instance(namespace, INSTANCE, names[0])
    # Bindings first: the instance's deletion waits until their roles are dropped.
    cluster.kubectl("delete", "servicebinding", "--all", "-n", namespace, timeout=180)
    cluster.kubectl("delete", "postgresinstance", INSTANCE, "-n", namespace, timeout=180)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _sql(
    cluster: LocalCluster, db: Instance, pod: str, query: str, database: str = "postgres"
) -> str:
    """Run ``query`` in ``database`` as the superuser (TLS verified with the CA); its
    output, or fail."""
    done = run_pod(
        cluster,
        db.namespace,
        pod,
        connecting("psql", "-v", "ON_ERROR_STOP=1", "-tAc", query),
        env=[
            *db.superuser_env(),
            {"name": "PGSSLMODE", "value": "verify-full"},
            {"name": "PGSSLROOTCERT", "value": "/ca/ca.crt"},
            {"name": "PGDATABASE", "value": database},
        ],
        mounts={"/ca": {"configMap": {"name": "ca"}}},
    )
    assert done.phase == "Succeeded", (
        f"pod {db.namespace}/{pod} ({query}): {done.log}\n"
        f"{diagnostics(cluster, db.namespace, f'postgresinstance {db.name}')}"
    )
    return done.log


def test_tls_verify_full_with_the_ca_connects_and_without_it_is_refused(
    cluster: LocalCluster, instance: Instance
) -> None:
    log = _sql(
        cluster,
        instance,
        "tls-verified",
        "SELECT 'ssl:' || ssl || ':' || version FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    assert "ssl:true:TLS" in log, f"pod {instance.namespace}/tls-verified: {log}"

    refused = {
        "tls-no-ca": ([{"name": "PGSSLMODE", "value": "verify-full"}], {}, "root certificate"),
        "tls-other-ca": (
            [
                {"name": "PGSSLMODE", "value": "verify-full"},
                {"name": "PGSSLROOTCERT", "value": "/ca/ca.crt"},
            ],
            {"/ca": {"configMap": {"name": "other-ca"}}},
            "certificate verify failed",
        ),
        "tls-disabled": ([{"name": "PGSSLMODE", "value": "disable"}], {}, "pg_hba.conf"),
    }
    for pod, (env, mounts, expected) in refused.items():
        done = run_pod(
            cluster,
            instance.namespace,
            pod,
            connecting("psql", "-tAc", "SELECT 1"),
            env=[*instance.superuser_env(), *env],
            mounts=mounts,
        )
        if done.phase != "Failed" or expected not in done.log:
            raise AssertionError(
                f"pod {instance.namespace}/{pod} should be refused ({expected}): "
                f"{done.phase} {done.log}\n"
                f"{diagnostics(cluster, instance.namespace, f'postgresinstance {instance.name}')}"
            )


def test_binding_secret_used_by_an_app_then_deleted_drops_the_role(
    cluster: LocalCluster, instance: Instance
) -> None:
    namespace = instance.namespace
    binding = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "ServiceBinding",
        "metadata": {"name": "shop", "namespace": namespace},
        "spec": {"instanceRef": {"name": instance.name}, "database": "shop"},
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(binding))
    wait_for(
        lambda: (
            condition(cluster, "servicebinding", namespace, "shop", "Ready").get("status") == "True"
        ),
        f"servicebinding {namespace}/shop Ready",
        120,
        lambda: diagnostics(cluster, namespace, "servicebinding shop"),
    )
    role = (
        f"{namespace.replace('-', '_')}_shop"  # the default: <namespace>_<name>, as an identifier
    )
    app = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "postgres:15",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "infinity"],
                    "env": [
                        {"name": "HOME", "value": "/tmp"},
                        secret_env("DATABASE_URL", "shop-credentials", "uri"),
                    ],
                }
            ]
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(app))
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/app", "-n", namespace, "--timeout=120s",
        timeout=150,
    )  # fmt: skip
    written = exec_in(
        cluster,
        namespace,
        "app",
        'retry_connect psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -tA '
        "-c 'CREATE TABLE orders (id int)' -c 'INSERT INTO orders VALUES (42)' "
        "-c \"SELECT 'rows:' || count(*) || ':' || current_user FROM orders\"",
    )
    context = f"pod {namespace}/app with binding shop's Secret: {written}"
    assert f"rows:1:{role}" in written and "exit:0" in written, context
    count = f"SELECT 'roles:' || count(*) FROM pg_roles WHERE rolname = '{role}'"
    roles = _sql(cluster, instance, "admin-role-before", count)
    assert "roles:1" in roles, (
        f"role {role} of servicebinding {namespace}/shop not in postgresinstance "
        f"{namespace}/{instance.name}: {roles}"
    )

    cluster.kubectl("delete", "servicebinding", "shop", "-n", namespace, timeout=120)
    assert "roles:0" in _sql(cluster, instance, "admin-role-after", count), (
        f"role {role} still exists after servicebinding {namespace}/shop was deleted\n"
        f"{diagnostics(cluster, namespace, 'servicebinding shop')}"
    )
    again = exec_in(cluster, namespace, "app", 'retry_connect psql "$DATABASE_URL" -tAc "SELECT 1"')
    context = f"pod {namespace}/app after servicebinding shop was deleted: {again}"
    assert "exit:0" not in again and "password authentication failed" in again, context
    rows = _sql(
        cluster, instance, "admin-data-kept", "SELECT 'kept:' || count(*) FROM orders", "shop"
    )
    assert "kept:1" in rows, f"the rows of role {role} in database shop: {rows}"
    cluster.kubectl("delete", "pod", "app", "-n", namespace, "--wait=false")


def test_data_on_the_claim_survives_deleting_the_pod(
    cluster: LocalCluster, instance: Instance
) -> None:
    namespace, pod = instance.namespace, f"{instance.name}-0"
    marker = f"survivor-{uuid.uuid4().hex[:8]}"
    _sql(
        cluster,
        instance,
        "pvc-write",
        f"CREATE TABLE IF NOT EXISTS kept (v text); INSERT INTO kept VALUES ('{marker}')",
    )
    before = get_json(cluster, "pod", pod, "-n", namespace)
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in before["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert len(claims) == 1, f"pod {namespace}/{pod} volumes: {before['spec']['volumes']}"
    claim_uid = get_json(cluster, "pvc", claims[0], "-n", namespace)["metadata"]["uid"]

    # A Pod beside it connects to the primary Service all along: how long the Service does
    # not answer, and how long after the EndpointSlice names the new Pod ready it answers
    # again (docs/e2e.md, "From ready to reachable"; measured, not asserted).
    primary = f"{instance.name}-primary"
    with probing(cluster, namespace, "probe-primary", primary, 5432) as samples:
        wait_for(
            lambda: any(s.ok for s in samples()),
            f"pod {namespace}/probe-primary connects to service {primary}",
            60,
            lambda: diagnostics(cluster, namespace, f"postgresinstance {instance.name}"),
        )
        started, deleted_at = time.monotonic(), time.time()
        cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")

        def recreated_and_ready() -> bool:
            out = cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
            if not out.strip():
                return False
            now = json.loads(out)
            if now["metadata"]["uid"] == before["metadata"]["uid"]:
                return False
            ready = {c["type"]: c["status"] for c in now["status"].get("conditions", [])}
            return ready.get("Ready") == "True"

        wait_for(
            recreated_and_ready,
            f"pod {namespace}/{pod} recreated and Ready",
            180,
            lambda: diagnostics(cluster, namespace, f"postgresinstance {instance.name}"),
        )
        TIMINGS["postgres_pod_deleted_to_ready"] = time.monotonic() - started
        after = get_json(cluster, "pod", pod, "-n", namespace)

        def primary_service_routes_to_the_new_pod() -> bool:
            # A Pod Ready is not yet a Service that routes to it: its EndpointSlice must list
            # the new address as ready before a client connects through the Service.
            slices = get_json(
                cluster,
                "endpointslices",
                "-n",
                namespace,
                "-l",
                f"kubernetes.io/service-name={instance.name}-primary",
            )
            return any(
                after["status"].get("podIP") in e.get("addresses", [])
                and (e.get("conditions") or {}).get("ready")
                for s in slices.get("items", [])
                for e in s.get("endpoints") or []
            )

        wait_for(
            primary_service_routes_to_the_new_pod,
            f"service {namespace}/{instance.name}-primary routes to the new pod {pod}",
            120,
            lambda: diagnostics(cluster, namespace, f"postgresinstance {instance.name}"),
        )
        slice_ready_at = time.time()
        TIMINGS["postgres_pod_deleted_to_endpointslice_ready"] = time.monotonic() - started
        wait_for(
            lambda: outage(samples(), deleted_at).recovered_at is not None,
            f"pod {namespace}/probe-primary connects to service {primary} again",
            120,
            lambda: (
                f"{outage(samples(), deleted_at)}\n"
                f"{diagnostics(cluster, namespace, f'postgresinstance {instance.name}')}"
            ),
        )
        seen = outage(samples(), deleted_at)
    assert seen.recovered_at is not None
    TIMINGS["primary_service_outage"] = seen.seconds
    TIMINGS["primary_endpointslice_ready_to_reachable"] = seen.recovered_at - slice_ready_at
    print(f"\nservice {namespace}/{primary} after pod {pod} was deleted: {seen}")
    again = [
        v["persistentVolumeClaim"]["claimName"]
        for v in after["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert again == claims, f"pod {namespace}/{pod} now uses {again}, before {claims}"
    uid = get_json(cluster, "pvc", claims[0], "-n", namespace)["metadata"]["uid"]
    assert uid == claim_uid, f"pvc {namespace}/{claims[0]} was replaced"
    found = _sql(cluster, instance, "pvc-read", f"SELECT v FROM kept WHERE v = '{marker}'")
    assert marker in found, (
        f"row {marker} lost after pod {namespace}/{pod} was recreated: {found}\n"
        f"{diagnostics(cluster, namespace, f'postgresinstance {instance.name}')}"
    )
