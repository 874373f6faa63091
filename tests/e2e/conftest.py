"""The end-to-end suite: one local cluster with real nodes per session (`make e2e`).

The images are built (or taken from the cache) first: pause, the operator from this
checkout's sources, PostgreSQL 15 and the S3 client. Where the machine cannot host a node
(not root, no overlayfs, ...) every test here is skipped with that one-line reason.

How many nodes: tests choose. The session's cluster has 3 nodes (zones a, b, c) when a
collected test uses the ``cluster3`` fixture, else 1; ``CRPY_E2E_NODES=N`` sets the number
instead (a test that needs more nodes than that fails, saying so).

The session's teardown asserts that the cluster left nothing behind: no network namespace, no
host end of its link, no mount under its work directory, no node cgroup, and the kernel
settings the kubelet changes back to their recorded values.

A test whose setup or call fails gets a report section after its own message: the state of
every namespace it used (objects, events, ``describe`` of the Pods that are not fine, every
Pod's logs) and the operator's namespace with its replicas' logs (``tests/e2e/failures.py``).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from controller_runtime.envtest.node import cleanup
from controller_runtime.envtest.node.cluster import (
    LocalCluster,
    NodeUnavailableError,
    preflight,
)
from controller_runtime.envtest.node.cluster import leftovers as cluster_leftovers
from controller_runtime.envtest.node.images import (
    aws_cli_image,
    ensure_image,
    operator_image,
    operator_tag,
    postgres_image,
)
from tests.e2e import kubeproxy
from tests.e2e.failures import failure_section, namespaces_used
from tests.e2e.operator import install
from tests.e2e.support import (
    NAMESPACES,
    OPERATOR_NAMESPACE,
    TIMINGS,
    Images,
    namespace_state,
)

KUBE_PROXY_WINDOWS: list[kubeproxy.Window] = []
"""kube-proxy over each test that used the cluster (printed at the end of the session)."""

_FAILED: list[str] = []
"""A session fixture that failed is retried by every test that uses it: building images or
starting the node takes minutes, so the first failure is remembered and repeated instead."""


@pytest.fixture(scope="session")
def images() -> Images:
    try:
        preflight()
    except NodeUnavailableError as err:
        pytest.skip(str(err))
    if _FAILED:
        pytest.fail(f"the images or the node failed earlier in this session: {_FAILED[0]}")
    tag = operator_tag()
    try:
        return Images(
            operator=f"controller-runtime-py/operator:{tag}",
            operator_archive=ensure_image(operator_image(tag)),
            postgres_archive=ensure_image(postgres_image()),
            aws_cli_archive=ensure_image(aws_cli_image()),
        )
    except Exception as err:
        _FAILED.append(str(err).splitlines()[0])
        raise


_NODES = {"wanted": 1}
"""How many nodes the session's cluster gets (module docs), decided at collection."""


RUNS_FIRST = ("test_killed_node.py",)
"""Test files that start clusters of their own and so must run before the session's cluster
takes the machine's one node lock (a stable sort puts them first, whatever their names)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if any("cluster3" in getattr(item, "fixturenames", ()) for item in items):
        _NODES["wanted"] = 3
    items.sort(key=lambda item: item.path.name not in RUNS_FIRST)


def session_nodes() -> int:
    """The session cluster's size: ``$CRPY_E2E_NODES`` when set, else what the collected
    tests need (module docs)."""
    configured = os.environ.get("CRPY_E2E_NODES", "").strip()
    return int(configured) if configured else _NODES["wanted"]


@pytest.fixture(scope="session")
def cluster(images: Images) -> Iterator[LocalCluster]:
    before = cleanup.record_kernel_settings()
    node = LocalCluster(
        crd_directory=None,
        images=[images.operator_archive, images.postgres_archive, images.aws_cli_archive],
        nodes=session_nodes(),
        # The backup tests' bucket (SeaweedFS; see controller_runtime/envtest/node/s3.py).
        s3=True,
    )
    if _FAILED:
        pytest.fail(f"the images or the node failed earlier in this session: {_FAILED[0]}")
    try:
        node.start()
    except Exception as err:
        _FAILED.append(str(err).splitlines()[0])
        raise
    TIMINGS["cluster_nodes"] = len(node.all_nodes)
    TIMINGS.update({f"cluster_{k}": v for k, v in node.timings.items()})
    workdir: Path = node.workdir
    try:
        yield node
        TIMINGS.update({f"memory_mib_{k}": v for k, v in node.memory_mib().items()})
        TIMINGS.update({f"cpu_s_{k}": v for k, v in node.cpu_seconds().items()})
        netns = [n.addresses.netns for n in node.all_nodes]
        TIMINGS.update(kubeproxy.summary(kubeproxy.read_metrics(netns)))
    finally:
        node.stop()
        print(f"\ne2e timings and memory: {TIMINGS}")
        print("\nkube-proxy by test (programming: endpoint change -> rules written):")
        for window in KUBE_PROXY_WINDOWS:
            print(f"  {window.line()}")
        print("kube-proxy by file:")
        for window in kubeproxy.by_file(KUBE_PROXY_WINDOWS):
            print(f"  {window.line()}")
    leftovers = cluster_leftovers(workdir)
    if cleanup.record_kernel_settings() != before:
        leftovers.append(f"kernel settings {cleanup.record_kernel_settings()} != {before}")
    assert not leftovers, f"the local node left behind: {leftovers}"


@pytest.fixture(scope="session")
def cluster3(cluster: LocalCluster) -> LocalCluster:
    """The session's cluster, which has at least 3 nodes (``crpy-node-1`` .. ``-3`` in
    ``zone-a`` .. ``zone-c``) when a collected test uses this fixture (module docs)."""
    if len(cluster.all_nodes) < 3:
        pytest.fail(
            f"this test needs 3 nodes; the session's cluster has {len(cluster.all_nodes)} "
            f"(CRPY_E2E_NODES={os.environ.get('CRPY_E2E_NODES')}): unset it or make it 3"
        )
    return cluster


@pytest.fixture(scope="session")
def operator(cluster: LocalCluster, images: Images) -> str:
    """The operator installed with ``kubectl apply -k`` (2 replicas ready); its image."""
    TIMINGS["operator_install_to_ready"] = install(cluster, images.operator)
    return images.operator


@pytest.fixture(autouse=True)
def _kube_proxy_window(request: pytest.FixtureRequest) -> Iterator[None]:
    """Read kube-proxy's histograms before and after each test that uses the cluster (the
    session fixture is up by then), for :data:`KUBE_PROXY_WINDOWS`."""
    if "cluster" not in request.fixturenames:
        yield
        return
    cluster: LocalCluster = request.getfixturevalue("cluster")
    netns = [n.addresses.netns for n in cluster.all_nodes]
    before = kubeproxy.read_metrics(netns)
    yield
    after = kubeproxy.read_metrics(netns)
    KUBE_PROXY_WINDOWS.append(
        kubeproxy.window(request.node.nodeid, before, after, os.getloadavg()[0])
    )


def pytest_runtest_logstart(nodeid: str) -> None:
    NAMESPACES.begin(nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Append the cluster's state to the report of a failed setup or call (module docs)."""
    report = yield
    funcargs: dict[str, object] = getattr(item, "funcargs", {})
    cluster = funcargs.get("cluster")
    if report.failed and isinstance(cluster, LocalCluster):
        namespaces = namespaces_used(
            funcargs.values(), NAMESPACES.made_by(item.nodeid), NAMESPACES.everything()
        )

        def describe(namespace: str) -> str:
            try:
                return f"--- namespace {namespace}\n{namespace_state(cluster, namespace)}"
            except Exception as err:  # a cluster that stopped answering must not hide the failure
                return f"--- namespace {namespace}: could not be read: {err!r}"

        operator_namespace = OPERATOR_NAMESPACE if "operator" in funcargs else None
        section = failure_section(
            report.when, report.failed, namespaces, operator_namespace, describe
        )
        if section is not None:
            report.sections.append(section)
    return report
