"""Runs last (file order): uninstalling the operator as docs/deploy.md says leaves nothing of
it in the cluster."""

from __future__ import annotations

import shutil

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.operator import overlay
from tests.e2e.support import OPERATOR_NAMESPACE, Images, wait_for


def test_uninstall_leaves_nothing(cluster: LocalCluster, images: Images, operator: str) -> None:
    plurals = cluster.kubectl(
        "get",
        "crd",
        "-l",
        "app.kubernetes.io/part-of=controller-runtime-py",
        "-o",
        "jsonpath={range .items[*]}{.spec.names.plural}.{.spec.group},{end}",
    ).rstrip(",")
    assert plurals, "no CRDs of the operator were installed"
    cluster.kubectl("delete", "--all", "--all-namespaces", plurals, timeout=180)
    directory = overlay(images.operator)
    try:
        cluster.kubectl("delete", "-k", str(directory), timeout=180)
    finally:
        shutil.rmtree(directory)

    def gone() -> bool:
        left = cluster.kubectl(
            "get",
            "crd,clusterrole,clusterrolebinding,namespace",
            "-l",
            "app.kubernetes.io/part-of=controller-runtime-py",
            "-o",
            "name",
            check=False,
        )
        namespace = cluster.kubectl("get", "namespace", OPERATOR_NAMESPACE, check=False)
        return not left.strip() and not namespace.strip()

    wait_for(
        gone,
        "the operator's objects all deleted",
        120,
        lambda: cluster.kubectl("get", "all", "-n", OPERATOR_NAMESPACE, check=False),
    )
