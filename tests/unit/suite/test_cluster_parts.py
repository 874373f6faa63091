"""What the suite decides from the cluster's parts (tests/support.py, tests/conftest.py): a
test marked ``plays(...)``, which writes what a component writes, runs only where no such
component runs; the server's filtering by ``shardSelector`` is told from its answer."""

from __future__ import annotations

import json

import pytest

from tests.support import (
    CONTROLLER_MANAGER,
    KUBELET,
    PLAYED_BY_DEFAULT,
    SHARDING_GATE,
    ClusterParts,
    detect_cluster_parts,
)

LOCAL = ClusterParts(controller_manager=False, nodes=0)
NODE_CLUSTER = ClusterParts(controller_manager=True, nodes=1)
NO_NODES = ClusterParts(controller_manager=True, nodes=0)


def test_the_local_control_plane_lets_every_part_be_played() -> None:
    assert LOCAL.plays_reason("the job controller", PLAYED_BY_DEFAULT) is None


def test_a_cluster_running_the_component_skips_naming_it() -> None:
    reason = NODE_CLUSTER.plays_reason("the job controller", (CONTROLLER_MANAGER,))
    assert reason == "plays the job controller, which this cluster runs itself (controller-manager)"
    both = NODE_CLUSTER.plays_reason("the kubelet", PLAYED_BY_DEFAULT)
    assert both is not None and both.endswith("(controller-manager, kubelet)")


def test_only_the_components_named_count() -> None:
    assert NO_NODES.plays_reason("the kubelet", (KUBELET,)) is None
    assert NO_NODES.plays_reason("the garbage collector", (CONTROLLER_MANAGER,)) is not None


def test_an_unknown_component_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown component 'scheduler'"):
        NODE_CLUSTER.runs("scheduler")


class _Cluster:
    """An existing cluster as detect_cluster_parts sees it: kubectl answers, fixed here."""

    existing_cluster = True

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.feature_gates: dict[str, bool] = {}

    def kubectl(self, *args: str, check: bool = True) -> str:
        key = args[1] if args[0] == "get" and args[1] != "--raw" else "raw"
        return self.answers.get(key, "")


NAMESPACES = {
    "items": [
        {"metadata": {"name": name, "uid": f"6f0c2d6e-9d1b-4c1e-8a2b-00000000000{i}"}}
        for i, name in enumerate(("default", "kube-system", "kube-public", "kube-node-lease"))
    ]
}


def test_a_node_cluster_without_the_gate_is_detected() -> None:
    cluster = _Cluster(
        {
            "serviceaccount": "serviceaccount/default",
            "nodes": "node/crpy-node",
            "raw": json.dumps(NAMESPACES),  # the selector ignored: every Namespace
        }
    )
    parts = detect_cluster_parts(cluster)  # type: ignore[arg-type]
    assert parts == ClusterParts(controller_manager=True, nodes=1, filters_shards=False)


def test_a_server_that_filters_or_refuses_the_selector() -> None:
    filtered = _Cluster({"raw": json.dumps({"items": []})})
    assert detect_cluster_parts(filtered).filters_shards  # type: ignore[arg-type]
    refused = _Cluster({})  # kubectl failed: no output
    parts = detect_cluster_parts(refused)  # type: ignore[arg-type]
    assert parts == ClusterParts(controller_manager=False, nodes=0, filters_shards=False)


def test_a_local_plane_filters_as_its_gates_say() -> None:
    class Local:
        existing_cluster = False
        feature_gates = {SHARDING_GATE: True}

    assert detect_cluster_parts(Local()).filters_shards  # type: ignore[arg-type]
