"""Rendering of in-cluster instances and backup Jobs (pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.postgres import jobs, render
from controllers.postgres.api import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_VERSION,
    LABEL_ROLE,
    ROLE_PRIMARY,
)
from controllers.postgres.supervisor import SCRIPT as SUPERVISOR

AGENT = "registry.example/crpy/operator:1.2.3"


def instance(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "pg", "namespace": "shop", "uid": "u-1"},
        "spec": {"version": "16", **spec},
    }


def template_hash(obj: dict[str, Any]) -> str:
    return str(obj["spec"]["template"]["metadata"]["annotations"][ANNOTATION_CONFIG_HASH])


def test_synchronous_replication_needs_more_than_one_replica() -> None:
    assert "synchronous_standby_names" not in render.postgresql_conf(
        {"replicas": 1, "replication": {"synchronous": {"number": 1}}}
    )
    assert "synchronous_standby_names = 'FIRST 1 (*)'" in render.postgresql_conf(
        {"replicas": 3, "replication": {"synchronous": {"number": 1}}}
    )
    assert "synchronous_standby_names" not in render.postgresql_conf({"replicas": 3})


def test_parameters_are_quoted_sorted_and_reserved_ones_refused() -> None:
    conf = render.postgresql_conf({"parameters": {"work_mem": "8MB", "search_path": "a', b"}})
    assert conf.index("search_path = 'a'', b'") < conf.index("work_mem = '8MB'")
    with pytest.raises(render.RenderError, match="set by the operator"):
        render.postgresql_conf({"parameters": {"port": "1"}})
    with pytest.raises(render.RenderError, match="not valid"):
        render.postgresql_conf({"parameters": {"bad name": "1"}})
    with pytest.raises(render.RenderError, match="newlines"):
        render.postgresql_conf({"parameters": {"x": "1\nport = 2"}})


def test_tls_turns_ssl_on_and_rejects_plain_connections() -> None:
    spec = {"tls": {"secretName": "pg-tls"}}
    assert "ssl = on" in render.postgresql_conf(spec)
    hba = render.pg_hba_conf(spec)
    assert "hostssl all all 0.0.0.0/0 scram-sha-256" in hba
    assert "hostnossl all all 0.0.0.0/0 reject" in hba
    assert "hostssl" not in render.pg_hba_conf({})
    sts = render.statefulset(instance(**spec), version="16", image="postgres:16", agent_image=AGENT)
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"] == {"secretName": "pg-tls", "defaultMode": 0o640}


def test_the_template_hash_follows_the_configuration_only() -> None:
    base = render.statefulset(instance(), version="16", image="postgres:16", agent_image=AGENT)
    same = render.statefulset(
        instance(replicas=3), version="16", image="postgres:16", agent_image=AGENT
    )
    changed = render.statefulset(
        instance(parameters={"work_mem": "8MB"}),
        version="16",
        image="postgres:16",
        agent_image=AGENT,
    )
    tls = render.statefulset(
        instance(tls={"secretName": "t"}), version="16", image="postgres:16", agent_image=AGENT
    )
    assert template_hash(base) == template_hash(same)  # async replicas: same config
    assert len({template_hash(base), template_hash(changed), template_hash(tls)}) == 3


def test_the_statefulset() -> None:
    sts = render.statefulset(
        instance(
            replicas=3,
            storage={"size": "5Gi", "storageClassName": "ssd"},
            resources={"limits": {"memory": "1Gi"}},
            deletionPolicy="Delete",
        ),
        version="16.2",
        image="postgres:16.2",
        agent_image=AGENT,
    )
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["serviceName"] == "pg-headless"
    assert sts["metadata"]["annotations"][ANNOTATION_VERSION] == "16.2"
    assert spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "postgres:16.2"
    assert container["resources"] == {"limits": {"memory": "1Gi"}}
    assert [c["topologyKey"] for c in pod["topologySpreadConstraints"]] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    zone, host = pod["topologySpreadConstraints"]
    # One Pod per zone is a rule (a score can lose to other scores); a zone with no node the
    # Pod may use does not count; nodes are a preference (fewer nodes than replicas is fine).
    assert zone["whenUnsatisfiable"] == "DoNotSchedule" and zone["maxSkew"] == 1
    assert zone["nodeTaintsPolicy"] == "Honor"
    assert host["whenUnsatisfiable"] == "ScheduleAnyway"
    for constraint in (zone, host):
        assert constraint["labelSelector"] == spec["selector"], "the instance's own Pods"
    claim = spec["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == "5Gi"
    assert claim["storageClassName"] == "ssd"
    kept = [{"metadata": {"name": "data"}, "spec": {"resources": {}}}]
    assert (
        render.statefulset(
            instance(), version="16", image="x", agent_image=AGENT, claim_templates=kept
        )["spec"]["volumeClaimTemplates"]
        == kept
    )


def test_each_pod_runs_the_supervisor_and_the_agent_sidecar_with_its_own_token() -> None:
    sts = render.statefulset(
        instance(replicas=3), version="16", image="postgres:16", agent_image=AGENT, replicas=4
    )
    spec = sts["spec"]
    assert spec["replicas"] == 4  # held while the primary is a Pod a scale-down removes
    assert spec["updateStrategy"] == {"type": "OnDelete"}  # the failover controller rolls
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "pg-agent"
    assert pod["automountServiceAccountToken"] is False
    (agent,) = pod["initContainers"]
    assert agent["restartPolicy"] == "Always"  # a sidecar: up before, down after postgres
    assert agent["image"] == AGENT
    assert agent["command"] == ["python", "-m", "controllers.postgres.agent"]
    assert {p["name"]: p["containerPort"] for p in agent["ports"]} == {"agent": 8008}
    env = {e["name"]: e for e in agent["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["CRPY_INSTANCE"]["value"] == "pg"
    assert env["CRPY_HEADLESS"]["value"] == "pg-headless"
    assert not any("PASSWORD" in name for name in env)  # the agent holds no password
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    assert mounts[render.TOKEN_DIR] == "agent-token"
    assert agent["securityContext"]["readOnlyRootFilesystem"] and "/tmp" in mounts
    (postgres,) = pod["containers"]
    assert postgres["command"] == ["/bin/bash", f"{render.CONFIG_DIR}/entrypoint.sh"]
    postgres_mounts = {m["mountPath"]: m["name"] for m in postgres["volumeMounts"]}
    assert render.TOKEN_DIR not in postgres_mounts  # no token in the database's container
    for shared in (render.RUN_DIR, render.SOCKET_DIR):
        assert postgres_mounts[shared] == mounts[shared]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["run"]["emptyDir"]["medium"] == "Memory"
    sources = volumes["agent-token"]["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert pod["terminationGracePeriodSeconds"] > render.SWITCHOVER_WAIT_SECONDS
    config = render.configmap(instance())
    assert config["data"]["entrypoint.sh"] == SUPERVISOR


def test_the_agent_may_only_read_its_own_instance() -> None:
    account = render.service_account(instance())
    assert account["metadata"]["name"] == "pg-agent"
    role = render.agent_role(instance())
    assert role["rules"] == [
        {
            "apiGroups": ["postgres.crpy.io"],
            "resources": ["postgresinstances"],
            "resourceNames": ["pg"],
            "verbs": ["get"],
        }
    ]
    binding = render.agent_role_binding(instance())
    assert binding["roleRef"]["name"] == "pg-agent"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pg-agent", "namespace": "shop"}
    ]


def test_services_pdb_and_endpoint() -> None:
    primary = render.primary_service(instance())
    assert primary["spec"]["selector"] == {
        "app.kubernetes.io/name": "postgres",
        "app.kubernetes.io/instance": "pg",
        LABEL_ROLE: ROLE_PRIMARY,
    }
    headless = render.headless_service(instance())
    assert headless["spec"]["clusterIP"] == "None"
    assert render.pod_disruption_budget(instance(replicas=1)) is None
    pdb = render.pod_disruption_budget(instance(replicas=2))
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1
    assert render.endpoint(instance()) == {"host": "pg-primary.shop.svc", "port": 5432}
    external = instance(external={"host": "db.example", "port": 6432})
    assert render.endpoint(external) == {"host": "db.example", "port": 6432}


def backup(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "nightly", "namespace": "shop"},
        "spec": {
            "instanceRef": {"name": "pg"},
            "storage": {
                "endpoint": "https://s3",
                "bucket": "b",
                "prefix": "/db/",
                "credentialsSecretRef": {"name": "s3"},
            },
            **spec,
        },
    }


def test_backup_jobs() -> None:
    assert jobs.location(backup()) == "s3://b/db/shop/pg/nightly.dump"
    assert jobs.location(backup(method="pg_basebackup")).endswith("nightly.tar.gz")
    job = jobs.backup_job(backup(method="pg_basebackup"), instance(), "postgres:16")
    dump = job["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e for e in dump["env"]}
    assert env["PGUSER"] == {"name": "PGUSER", "value": "replicator"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "replication-password"
    plain = jobs.backup_job(backup(), instance(), "postgres:16")
    env = {e["name"]: e for e in plain["spec"]["template"]["spec"]["initContainers"][0]["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "pg-superuser",
        "key": "password",
    }


def test_job_names_fit_a_label() -> None:
    assert jobs.job_name("nightly") == "nightly-backup"
    long = jobs.job_name("x" * 80)
    assert len(long) <= 63 and long != jobs.job_name("x" * 81)


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({}, "Pending"),
        ({"startTime": "t"}, "Running"),
        ({"conditions": [{"type": "Complete", "status": "True"}]}, "Succeeded"),
        ({"conditions": [{"type": "Failed", "status": "True", "message": "boom"}]}, "Failed"),
        ({"conditions": [{"type": "Failed", "status": "False"}], "active": 1}, "Running"),
    ],
)
def test_job_outcomes(status: dict[str, Any], phase: str) -> None:
    assert jobs.job_outcome({"status": status})[0] == phase
    assert jobs.job_outcome(None)[0] == "Pending"
