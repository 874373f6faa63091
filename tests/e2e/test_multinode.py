"""Three nodes in three zones: each labelled with its zone and hostname, with local volumes
bound to it; Pods on different nodes reach each other directly, through Services (each
node's kube-proxy) and by name (CoreDNS, reached from every node)."""

from __future__ import annotations

import ipaddress

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.nodes import PORT, fetch, pod, serve_on, wait_ready
from tests.e2e.support import Images, get_json, new_namespace

NODES = ("crpy-node-1", "crpy-node-2", "crpy-node-3")
ZONES = ("zone-a", "zone-b", "zone-c")


def test_nodes_carry_their_zone_and_hostname_and_local_volumes_their_node(
    cluster3: LocalCluster,
) -> None:
    nodes = {n["metadata"]["name"]: n for n in get_json(cluster3, "nodes")["items"]}
    assert sorted(nodes) == sorted(NODES), f"nodes: {sorted(nodes)}"
    for name, zone in zip(NODES, ZONES, strict=True):
        labels = nodes[name]["metadata"]["labels"]
        assert labels.get("topology.kubernetes.io/zone") == zone, f"node {name}: {labels}"
        assert labels.get("kubernetes.io/hostname") == name, f"node {name}: {labels}"
        addresses = {a["type"]: a["address"] for a in nodes[name]["status"]["addresses"]}
        assert addresses.get("InternalIP") == cluster3.node(name).address, f"{name}: {addresses}"
    volumes = get_json(cluster3, "pv")["items"]
    per_node: dict[str, int] = {}
    for volume in volumes:
        terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        (expression,) = terms[0]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/hostname", volume["metadata"]["name"]
        (node,) = expression["values"]
        per_node[node] = per_node.get(node, 0) + 1
    assert per_node == {name: cluster3.volumes for name in NODES}, per_node
    storage_class = get_json(cluster3, "storageclass", "local")
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"


def test_pods_on_every_node_reach_each_other_services_and_names(
    cluster3: LocalCluster, images: Images
) -> None:
    namespace = new_namespace(cluster3, "mesh")
    servers = [serve_on(cluster3, namespace, node, images.operator) for node in NODES]
    wait_ready(cluster3, namespace, *servers)
    ips = {node: pod(cluster3, namespace, f"web-{node}")["status"]["podIP"] for node in NODES}
    for node, ip in ips.items():
        pod_cidr = cluster3.node(node).addresses.pod_cidr
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(pod_cidr), (
            f"pod web-{node} has {ip}, outside its node's Pod range {pod_cidr}"
        )
    for source in NODES:
        for target in NODES:
            direct = fetch(
                cluster3, namespace, f"web-{source}", f"http://{ips[target]}:{PORT}/", retry=True
            )
            assert direct == target, f"web-{source} → pod web-{target} ({ips[target]}): {direct}"
            by_name = f"http://web-{target}.{namespace}.svc.cluster.local:{PORT}/"
            through_service = fetch(cluster3, namespace, f"web-{source}", by_name, retry=True)
            assert through_service == target, f"web-{source} → {by_name}: {through_service}"
    cluster3.kubectl("delete", "namespace", namespace, "--wait=false")
