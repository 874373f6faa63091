"""Rendering of an in-cluster PostgresInstance: pure functions from the instance (and the
version the policy lets it run) to the objects that run it.

What is rendered, for an instance ``<name>``:

- ConfigMap ``<name>-config``: ``postgresql.conf``, ``pg_hba.conf`` and the container's
  entrypoint, the supervisor (:mod:`controllers.postgres.supervisor`);
- Secret ``<name>-superuser`` (``username``, ``password``, ``replication-password``):
  created once, never rewritten (:func:`superuser_secret`);
- ServiceAccount, Role and RoleBinding ``<name>-agent``: the Pods' agent may ``get`` this one
  PostgresInstance, nothing else (it reads its standing there);
- StatefulSet ``<name>``: each Pod runs the supervisor in the ``postgres`` container and the
  agent (:mod:`controllers.postgres.agent`, the operator's image) as a sidecar that starts
  before it and stops after it; they share ``/run/crpy-ha`` and the server's socket
  directory. Which Pod is primary is not its ordinal: the failover controller
  (:mod:`controllers.postgres.ha`) names it in the instance's status, and the agents act on
  it. ``wal_log_hints`` is on, so a former primary rejoins with ``pg_rewind``. The update
  strategy is ``OnDelete``: the failover controller rolls the Pods (standbys first, then a
  switchover, then the old primary);
- Service ``<name>-headless`` (stable Pod DNS names), ``<name>-primary`` (the Pod labelled
  ``postgres.crpy.io/role=primary`` by the failover controller) and ``<name>-replicas`` (the
  Pods labelled ``replica``: standbys streaming from the primary, read-only);
- PodDisruptionBudget ``<name>`` (``maxUnavailable: 1``) while ``replicas > 1``.

The pod template carries a hash of the rendered configuration, so a change of parameters,
replication mode or TLS rolls the pods; a changed image (minor upgrade, or the operator's own
image for the agent) rolls them too.
Caveats: replication uses ``wal_keep_size`` rather than slots, so a standby down for long
must be re-cloned (the supervisor clones anew when ``pg_rewind`` keeps failing).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controllers.postgres.api import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_VERSION,
    API_VERSION,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_ROLE,
    ROLE_PRIMARY,
    ROLE_REPLICA,
    labels_for,
)
from controllers.postgres.supervisor import SCRIPT as SUPERVISOR

Obj = dict[str, Any]

PORT = 5432
DATA_DIR = "/var/lib/postgresql/data"
PGDATA = f"{DATA_DIR}/pgdata"
CONFIG_DIR = "/etc/postgres"
RUN_DIR = "/run/crpy-ha"
SOCKET_DIR = "/var/run/postgresql"
TLS_DIR = "/etc/postgres-tls"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
AGENT_PORT = 8008
TERMINATION_GRACE_SECONDS = 60
SWITCHOVER_WAIT_SECONDS = 30
"""How long a deleted Pod's primary keeps serving while the operator switches over (within
the grace period; a fast shutdown follows)."""
POSTGRES_UID = 999  # the official image's postgres user
SUPERUSER = "postgres"
REPLICATION_USER = "replicator"

RESERVED_PARAMETERS = frozenset(
    {
        "config_file",
        "data_directory",
        "hba_file",
        "ident_file",
        "listen_addresses",
        "port",
        "primary_conninfo",
        "ssl",
        "ssl_cert_file",
        "ssl_key_file",
        "ssl_ca_file",
        "synchronous_standby_names",
        "unix_socket_directories",
    }
)
"""Parameters the operator sets itself; ``spec.parameters`` may not override them."""
_PARAMETER = re.compile(r"^[a-z_][a-z0-9_.]*$")


class RenderError(ValueError):
    """The spec cannot be rendered (e.g. an invalid or reserved parameter)."""


@dataclass(frozen=True)
class Names:
    """The names of everything rendered for instance ``name``."""

    name: str

    @property
    def config(self) -> str:
        return f"{self.name}-config"

    @property
    def superuser(self) -> str:
        return f"{self.name}-superuser"

    @property
    def headless(self) -> str:
        return f"{self.name}-headless"

    @property
    def primary(self) -> str:
        return f"{self.name}-primary"

    @property
    def replicas(self) -> str:
        return f"{self.name}-replicas"

    @property
    def agent(self) -> str:
        """The ServiceAccount, Role and RoleBinding of the Pods' agent."""
        return f"{self.name}-agent"

    @property
    def statefulset(self) -> str:
        return self.name

    @property
    def pdb(self) -> str:
        return self.name


DEFAULT_STORAGE_SIZE = "1Gi"
"""The volume size of each pod when ``spec.storage.size`` is not set (the CRD's default)."""


def endpoint(instance: Mapping[str, Any]) -> dict[str, Any]:
    """Where applications connect: the primary Service's DNS name, or the external server."""
    spec = instance.get("spec") or {}
    external = spec.get("external")
    if external:
        return {"host": external["host"], "port": int(external.get("port", PORT))}
    meta = instance["metadata"]
    return {"host": f"{Names(meta['name']).primary}.{meta['namespace']}.svc", "port": PORT}


def quote_conf(value: str) -> str:
    """A postgresql.conf value: single-quoted, quotes doubled, no newlines."""
    if "\n" in value or "\r" in value:
        raise RenderError("parameter values cannot contain newlines")
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def postgresql_conf(spec: Mapping[str, Any]) -> str:
    """The server configuration: the operator's settings, then ``spec.parameters``."""
    standbys_names = synchronous_standby_names(spec)
    lines = [
        "# Rendered by the postgres operator; edit spec.parameters instead.",
        "listen_addresses = '*'",
        f"port = {PORT}",
        "password_encryption = 'scram-sha-256'",
        "wal_level = 'replica'",
        "max_wal_senders = 10",
        "wal_keep_size = '1GB'",
        "hot_standby = on",
        # pg_rewind needs it: a former primary rejoins as a standby without a new clone.
        "wal_log_hints = on",
        # A standby (or primary) that is gone is noticed in seconds, not the default minute:
        # synchronous commits wait for it that long.
        "wal_sender_timeout = '10s'",
        "wal_receiver_timeout = '10s'",
    ]
    if standbys_names:
        lines.append(f"synchronous_standby_names = '{standbys_names}'")
    if (spec.get("tls") or {}).get("secretName"):
        lines += [
            "ssl = on",
            f"ssl_cert_file = '{TLS_DIR}/tls.crt'",
            f"ssl_key_file = '{TLS_DIR}/tls.key'",
        ]
    parameters = spec.get("parameters") or {}
    for name in sorted(parameters):
        if not _PARAMETER.match(name):
            raise RenderError(f"parameter name {name!r} is not valid")
        if name in RESERVED_PARAMETERS:
            raise RenderError(f"parameter {name!r} is set by the operator and cannot be changed")
        lines.append(f"{name} = {quote_conf(str(parameters[name]))}")
    return "\n".join(lines) + "\n"


def synchronous_standby_names(spec: Mapping[str, Any]) -> str:
    """``synchronous_standby_names`` for ``spec.replication.synchronous``, or ``""`` (commits
    do not wait) when it is unset or the instance has no standby.

    ``First`` gives ``FIRST n (*)``: a commit waits for the first ``n`` standbys to connect
    (pg_stat_replication's sync_state ``sync``); the others are ``potential`` and one takes
    over at once when a synchronous one goes, so the loss of one pod does not block commits
    while another standby is up. ``Any`` gives ``ANY n (*)``, a quorum commit (sync_state
    ``quorum``). ``n`` is capped at the standbys there are (replicas - 1): a number above
    would block every commit.
    """
    synchronous = (spec.get("replication") or {}).get("synchronous")
    standbys = int(spec.get("replicas", 1)) - 1
    if not isinstance(synchronous, Mapping) or standbys < 1:
        return ""
    number = max(1, min(int(synchronous.get("number", 1)), standbys))
    method = "ANY" if synchronous.get("method") == "Any" else "FIRST"
    return f"{method} {number} (*)"


def pg_hba_conf(spec: Mapping[str, Any]) -> str:
    """Client authentication: SCRAM over TCP (TLS only when TLS is configured)."""
    tls = bool((spec.get("tls") or {}).get("secretName"))
    host = "hostssl" if tls else "host"
    lines = ["local all all trust"]  # inside the pod only (probes, the entrypoint)
    for net in ("0.0.0.0/0", "::/0"):
        lines.append(f"{host} replication {REPLICATION_USER} {net} scram-sha-256")
        lines.append(f"{host} all all {net} scram-sha-256")
        if tls:
            lines.append(f"hostnossl all all {net} reject")
    return "\n".join(lines) + "\n"


def config_data(spec: Mapping[str, Any]) -> dict[str, str]:
    """The ConfigMap's data."""
    return {
        "postgresql.conf": postgresql_conf(spec),
        "pg_hba.conf": pg_hba_conf(spec),
        "entrypoint.sh": SUPERVISOR,
    }


def config_hash(data: Mapping[str, str], spec: Mapping[str, Any]) -> str:
    """A short hash of everything a running server reads at start: the ConfigMap's data and
    the TLS Secret's name. Put on the pod template, a change of it rolls the pods."""
    tls = (spec.get("tls") or {}).get("secretName") or ""
    blob = json.dumps({"data": dict(data), "tls": tls}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _meta(instance: Mapping[str, Any], name: str, component: str) -> Obj:
    return {
        "name": name,
        "namespace": instance["metadata"]["namespace"],
        "labels": labels_for(instance["metadata"]["name"], component),
    }


def _selector(instance: Mapping[str, Any]) -> dict[str, str]:
    return {LABEL_NAME: "postgres", LABEL_INSTANCE: instance["metadata"]["name"]}


def configmap(instance: Mapping[str, Any]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(instance, Names(instance["metadata"]["name"]).config, "config"),
        "data": config_data(instance.get("spec") or {}),
    }


def superuser_secret(instance: Mapping[str, Any], data: Mapping[str, str]) -> Obj:
    """The superuser Secret, with ``data`` already base64-encoded."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(instance, Names(instance["metadata"]["name"]).superuser, "credentials"),
        "data": dict(data),
    }


def headless_service(instance: Mapping[str, Any]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(instance, Names(instance["metadata"]["name"]).headless, "database"),
        "spec": {
            "clusterIP": "None",
            # Standbys must resolve the primary before it is ready, to wait for it.
            "publishNotReadyAddresses": True,
            "selector": _selector(instance),
            "ports": [{"name": "postgres", "port": PORT, "targetPort": PORT}],
        },
    }


def primary_service(instance: Mapping[str, Any]) -> Obj:
    """What applications write through: the Pod the failover controller labels primary."""
    return _role_service(instance, Names(instance["metadata"]["name"]).primary, ROLE_PRIMARY)


def replicas_service(instance: Mapping[str, Any]) -> Obj:
    """Read-only connections: the streaming standbys the operator labels replica."""
    return _role_service(instance, Names(instance["metadata"]["name"]).replicas, ROLE_REPLICA)


def _role_service(instance: Mapping[str, Any], name: str, role: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(instance, name, "database"),
        "spec": {
            "type": "ClusterIP",
            "selector": {**_selector(instance), LABEL_ROLE: role},
            "ports": [{"name": "postgres", "port": PORT, "targetPort": PORT}],
        },
    }


def service_account(instance: Mapping[str, Any]) -> Obj:
    """The Pods' identity: their agent reads the instance with it (and nothing else)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(instance, Names(instance["metadata"]["name"]).agent, "agent"),
        "automountServiceAccountToken": False,
    }


def agent_role(instance: Mapping[str, Any]) -> Obj:
    """``get`` on this one PostgresInstance: the agent's standing is in its status."""
    name = instance["metadata"]["name"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(instance, Names(name).agent, "agent"),
        "rules": [
            {
                "apiGroups": [API_VERSION.split("/")[0]],
                "resources": ["postgresinstances"],
                "resourceNames": [name],
                "verbs": ["get"],
            }
        ],
    }


def agent_role_binding(instance: Mapping[str, Any]) -> Obj:
    names = Names(instance["metadata"]["name"])
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(instance, names.agent, "agent"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.agent},
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": names.agent,
                "namespace": instance["metadata"]["namespace"],
            }
        ],
    }


def pod_disruption_budget(instance: Mapping[str, Any]) -> Obj | None:
    """One pod at a time may be evicted, while there is more than one; else ``None``."""
    if int((instance.get("spec") or {}).get("replicas", 1)) <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(instance, Names(instance["metadata"]["name"]).pdb, "database"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(instance)}},
    }


def spread_constraints(instance: Mapping[str, Any]) -> list[Obj]:
    """Spread pods across zones (a rule) and nodes (a preference); docs/postgres.md, "Where
    the Pods run".

    Zones: ``DoNotSchedule`` with ``maxSkew: 1``, so replicas never differ by more than one
    per zone: one Pod per zone while there are no more replicas than zones (a soft
    constraint is only a score among others, and a replica once placed on a local volume
    stays there). ``nodeTaintsPolicy: Honor`` is the fallback: a zone whose nodes are all
    tainted for the Pod (lost, not ready, cordoned, reserved) does not count, so the
    replicas spread over the zones left instead of waiting for it. Nodes must carry the
    ``topology.kubernetes.io/zone`` label (one zone for all is fine).

    Nodes: ``ScheduleAnyway``: a cluster with fewer nodes than replicas still runs them all
    (stacked), rather than leaving pods pending."""
    selector = {"matchLabels": _selector(instance)}
    return [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "nodeTaintsPolicy": "Honor",
            "labelSelector": selector,
        },
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": selector,
        },
    ]


def volume_claim_templates(instance: Mapping[str, Any]) -> list[Obj]:
    storage = (instance.get("spec") or {}).get("storage") or {}
    spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.get("size", DEFAULT_STORAGE_SIZE)}},
    }
    if storage.get("storageClassName"):
        spec["storageClassName"] = storage["storageClassName"]
    return [
        {
            "metadata": {
                "name": "data",
                "labels": labels_for(instance["metadata"]["name"], "data"),
            },
            "spec": spec,
        }
    ]


def _secret_env(name: str, secret: str, key: str) -> Obj:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def statefulset(
    instance: Mapping[str, Any],
    *,
    version: str,
    image: str,
    agent_image: str,
    claim_templates: list[Obj] | None = None,
    replicas: int | None = None,
) -> Obj:
    """The StatefulSet running ``image`` (PostgreSQL ``version``) with the agent sidecar from
    ``agent_image``. ``claim_templates`` replaces the rendered ``volumeClaimTemplates`` (they
    are immutable once created); ``replicas`` (default ``spec.replicas``) is more while the
    primary is a Pod a scale-down would remove (``instance.statefulset_replicas``)."""
    spec = instance.get("spec") or {}
    name = instance["metadata"]["name"]
    names = Names(name)
    data = config_data(spec)
    labels = labels_for(name, "database")
    tls_secret = (spec.get("tls") or {}).get("secretName")
    shared: list[Obj] = [
        {"name": "run", "mountPath": RUN_DIR},
        {"name": "sockets", "mountPath": SOCKET_DIR},
    ]
    mounts: list[Obj] = [
        {"name": "data", "mountPath": DATA_DIR},
        {"name": "config", "mountPath": CONFIG_DIR},
        *shared,
    ]
    namespace_file = {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    volumes: list[Obj] = [
        {
            "name": "config",
            "configMap": {
                "name": names.config,
                "items": [
                    {"key": k, "path": k}
                    for k in ("postgresql.conf", "pg_hba.conf", "entrypoint.sh")
                ],
            },
        },
        # The agent's and the supervisor's files (the lease among them): in memory.
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        {"name": "sockets", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        # The agent's root is read-only; Python wants a temporary directory.
        {"name": "agent-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
        # The agent's token, in the agent only (the postgres container has none).
        {
            "name": "agent-token",
            "projected": {
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {"downwardAPI": {"items": [namespace_file]}},
                ]
            },
        },
    ]
    if tls_secret:
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        # 0640, root-owned, group fsGroup: a key file mode PostgreSQL accepts.
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o640}})
    probe_command = ["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(PORT), "-U", SUPERUSER]
    # The supervisor writes its heartbeat every second; it runs PostgreSQL (or keeps it down
    # on purpose, fenced), so a server that is down is no reason to restart the container.
    heartbeat = (
        f"read -r beat < {RUN_DIR}/heartbeat && read -r up _ < /proc/uptime"
        " && [ $(( ${up/./} - beat )) -lt 3000 ]"
    )
    container: Obj = {
        "name": "postgres",
        "image": image,
        "command": ["/bin/bash", f"{CONFIG_DIR}/entrypoint.sh"],
        "env": [
            {"name": "POSTGRES_USER", "value": SUPERUSER},
            _secret_env("POSTGRES_PASSWORD", names.superuser, "password"),
            _secret_env("REPLICATION_PASSWORD", names.superuser, "replication-password"),
            {"name": "PGDATA", "value": PGDATA},
            {"name": "CRPY_TERM_WAIT", "value": str(SWITCHOVER_WAIT_SECONDS)},
        ],
        "ports": [{"name": "postgres", "containerPort": PORT}],
        "readinessProbe": {
            "exec": {"command": probe_command},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "exec": {"command": ["/bin/bash", "-c", heartbeat]},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": mounts,
    }
    if spec.get("resources"):
        container["resources"] = spec["resources"]
    agent_mounts = [
        *shared,
        {"name": "agent-tmp", "mountPath": "/tmp"},
        {"name": "agent-token", "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    agent: Obj = {
        "name": "agent",
        "image": agent_image,
        "imagePullPolicy": "IfNotPresent",
        # A sidecar: it starts before the postgres container and stops after it.
        "restartPolicy": "Always",
        "command": ["python", "-m", "controllers.postgres.agent"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "CRPY_INSTANCE", "value": name},
            {"name": "CRPY_HEADLESS", "value": names.headless},
            {"name": "POSTGRES_USER", "value": SUPERUSER},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [{"name": "agent", "containerPort": AGENT_PORT}],
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "agent"},
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "agent"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": agent_mounts,
    }
    retention = "Delete" if spec.get("deletionPolicy") == "Delete" else "Retain"
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            **_meta(instance, names.statefulset, "database"),
            "annotations": {ANNOTATION_VERSION: version},
        },
        "spec": {
            "serviceName": names.headless,
            "replicas": replicas if replicas is not None else int(spec.get("replicas", 1)),
            "podManagementPolicy": "OrderedReady",
            # The failover controller deletes the Pods of an update itself: standbys first.
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": retention,
                "whenScaled": "Retain",
            },
            "selector": {"matchLabels": _selector(instance)},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        ANNOTATION_CONFIG_HASH: config_hash(data, spec),
                        ANNOTATION_VERSION: version,
                    },
                },
                "spec": {
                    "serviceAccountName": names.agent,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsUser": POSTGRES_UID,
                        "runAsGroup": POSTGRES_UID,
                        "fsGroup": POSTGRES_UID,
                        "runAsNonRoot": True,
                    },
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "topologySpreadConstraints": spread_constraints(instance),
                    "initContainers": [agent],
                    "containers": [container],
                    "volumes": volumes,
                },
            },
            "volumeClaimTemplates": claim_templates or volume_claim_templates(instance),
        },
    }
