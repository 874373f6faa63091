"""A PostgresInstance's replicas are spread over the zones: with 3 replicas on 3 nodes in 3
zones, one Pod per zone, and each Pod's claim bound to a local volume of the node it runs on
(controllers/postgres/render.py, ``spread_constraints``; docs/postgres.md, "Where the Pods
run")."""

from __future__ import annotations

import json
import time

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import TIMINGS, diagnostics, get_json, new_namespace, wait_for

POLICY = {
    "apiVersion": "postgres.crpy.io/v1beta1",
    "kind": "PostgresVersionPolicy",
    "metadata": {"name": "default"},
    "spec": {"defaultImage": "postgres:{version}", "versions": [{"version": "15"}]},
}
NAME = "spread"


def _ready_replicas(cluster: LocalCluster, namespace: str) -> int:
    status = get_json(cluster, "postgresinstance", NAME, "-n", namespace).get("status") or {}
    ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready")
    return int(status.get("readyReplicas") or 0) if ready == "True" else 0


def test_three_replicas_run_one_per_zone_on_volumes_of_their_node(
    cluster3: LocalCluster, operator: str
) -> None:
    namespace = new_namespace(cluster3, "spread")
    cluster3.kubectl("apply", "-f", "-", input_text=json.dumps(POLICY))
    instance = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "version": "15",
            "replicas": 3,
            "storage": {"size": "1Gi"},
            "deletionPolicy": "Delete",
        },
    }
    started = time.monotonic()
    cluster3.kubectl("apply", "-f", "-", input_text=json.dumps(instance))
    wait_for(
        lambda: _ready_replicas(cluster3, namespace) == 3,
        f"postgresinstance {namespace}/{NAME} Ready with 3 replicas",
        300,
        lambda: diagnostics(cluster3, namespace, f"postgresinstance {NAME}"),
    )
    TIMINGS["postgres_3_replicas_3_zones_apply_to_ready"] = time.monotonic() - started

    zones = {
        n["metadata"]["name"]: n["metadata"]["labels"]["topology.kubernetes.io/zone"]
        for n in get_json(cluster3, "nodes")["items"]
    }
    pods = get_json(cluster3, "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}")
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods["items"]}
    where = {pod: (node, zones[node]) for pod, node in sorted(placed.items())}
    assert len(placed) == 3, f"postgresinstance {namespace}/{NAME}: pods {where}"
    assert sorted(zone for _, zone in where.values()) == ["zone-a", "zone-b", "zone-c"], (
        f"postgresinstance {namespace}/{NAME}: not one pod per zone: {where}"
    )
    volumes = {v["metadata"]["name"]: v for v in get_json(cluster3, "pv")["items"]}
    for claim in get_json(cluster3, "pvc", "-n", namespace)["items"]:
        pod = claim["metadata"]["name"].removeprefix("data-")
        volume = volumes[claim["spec"]["volumeName"]]
        terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        (node,) = terms[0]["matchExpressions"][0]["values"]
        assert node == placed[pod], (
            f"claim {namespace}/{claim['metadata']['name']} is bound to volume "
            f"{volume['metadata']['name']} of {node}, but pod {pod} runs on {placed[pod]}"
        )
    cluster3.kubectl("delete", "postgresinstance", NAME, "-n", namespace, "--wait=false")
