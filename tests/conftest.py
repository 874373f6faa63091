"""Fixtures shared by the whole suite: one local control plane per session (started only when
a test asks for it), a transport to it as the admin, and a fresh namespace per test.

Hypothesis profiles, chosen with the ``HYPOTHESIS_PROFILE`` environment variable:

- ``ci`` (the default): no per-example deadline and no "too slow" health checks, because on a
  loaded machine (2 cores shared by several jobs) input generation and single examples can take
  many times their usual time, and that says nothing about the code under test;
- ``repro``: ``ci`` derandomized (a seed fixed per test) and without the example database, so
  that a failure seen once runs the same examples again anywhere;
- ``thorough``: ``ci`` with ten times the examples (tests that set ``max_examples``
  themselves keep their own), for a long run before a release.

A failing example is printed together with the ``@reproduce_failure`` blob to paste.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.audit import WRITES_POLICY
from controller_runtime.envtest.storage import ETCD, default_storage
from kubeclient.config import ClusterConfig, load_kubeconfig
from kubeclient.errors import ConflictError
from kubeclient.transport import Transport
from tests.support import PLAYED_BY_DEFAULT, ClusterParts, detect_cluster_parts

TEST_FEATURE_GATES = {"ShardedListAndWatch": True}
"""Alpha gates the suite's control plane turns on (sharded list and watch, KEP-5866)."""

_LOAD_TOLERANT = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
    print_blob=True,
)
settings.register_profile("ci", _LOAD_TOLERANT)
settings.register_profile("repro", _LOAD_TOLERANT, derandomize=True, database=None)
settings.register_profile("thorough", _LOAD_TOLERANT, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The end-to-end tests need a real node (root, minutes of set-up): only `make e2e` runs them.
collect_ignore = [] if os.environ.get("CRPY_E2E") else ["e2e"]

# Tests that compact or read etcd through its own gRPC gateway, which kine does not have: on another
# storage (CRPY_ENVTEST_STORAGE, `make test-storage`) they are deselected, and
# tests/integration/storage/test_compaction.py covers the same relist on every backend.
ETCD_GATEWAY_TESTS = (
    "tests/integration/test_informers.py::test_real_410_after_etcd_compaction_relists_and_converges",
    "tests/integration/test_informers.py::test_uid_change_behind_a_410_reaches_handlers_as_delete_then_add",
    "tests/integration/postgres/test_api_upgrade.py::test_old_objects_survive_the_upgrade_read_in_both_versions_and_migrate",
)


def pytest_report_header() -> str:
    return f"control-plane storage: {default_storage()}"


@pytest.fixture(scope="session")
def cluster_parts(control_plane: ControlPlane) -> ClusterParts:
    return detect_cluster_parts(control_plane)


@pytest.fixture(autouse=True)
def _skip_what_the_cluster_does_itself(request: pytest.FixtureRequest) -> None:
    """A test marked ``plays("the job controller", by=("controller-manager",))`` writes what
    a cluster component would write itself (a Job's status, a Pod's, a StatefulSet's; deletes
    what the garbage collector would), which only the local control plane leaves to the test:
    on an existing cluster that runs one of the components ``by`` (default: the
    controller-manager and the kubelet) it is skipped, saying so in one line."""
    marker = request.node.get_closest_marker("plays")
    if marker is None or not use_existing_cluster():
        return
    by = marker.kwargs.get("by", PLAYED_BY_DEFAULT)
    parts: ClusterParts = request.getfixturevalue("cluster_parts")
    reason = parts.plays_reason(marker.args[0], (by,) if isinstance(by, str) else tuple(by))
    if reason:
        pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if default_storage() == ETCD:
        return
    kept = [item for item in items if item.nodeid not in ETCD_GATEWAY_TESTS]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in ETCD_GATEWAY_TESTS])
        items[:] = kept


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver (or USE_EXISTING_CLUSTER's cluster) with the CRDs installed and
    :data:`TEST_FEATURE_GATES` on."""
    with ControlPlane(feature_gates=TEST_FEATURE_GATES) as plane:
        yield plane


@pytest.fixture(scope="session")
def gates_off_plane() -> Iterator[ControlPlane]:
    """A second local control plane with ``ShardedListAndWatch`` off: the server ignores
    ``shardSelector``, so sharded informers must filter on the client. Its audit log records
    every write (``WRITES_POLICY``). Started only when a test asks."""
    if use_existing_cluster():
        pytest.skip("needs a local control plane with its own feature gates")
    with ControlPlane(
        feature_gates={"ShardedListAndWatch": False}, audit_policy=WRITES_POLICY
    ) as plane:
        yield plane


@pytest.fixture
def sharding_gate_on(cluster_parts: ClusterParts) -> None:
    """For tests of the server's filtering on the session's cluster: skipped where its API
    server ignores ``shardSelector`` (an existing cluster without the alpha gate, where
    ``test_sharding_informers.py``'s gate-off test runs instead)."""
    if not cluster_parts.filters_shards:
        pytest.skip("needs ShardedListAndWatch on; this cluster's API server ignores shardSelector")


@pytest.fixture(scope="session")
def audited_plane() -> Iterator[ControlPlane]:
    """A local control plane like ``control_plane`` (the same feature gates) whose API server
    writes every write to its audit log (``plane.audit_log``, ``WRITES_POLICY``): who sent
    what, and when the server received it. Started only when a test asks."""
    if use_existing_cluster():
        pytest.skip("needs a local control plane with an audit log")
    with ControlPlane(feature_gates=TEST_FEATURE_GATES, audit_policy=WRITES_POLICY) as plane:
        yield plane


@pytest.fixture
async def audited_admin(audited_plane: ControlPlane) -> AsyncIterator[Transport]:
    """A transport to ``audited_plane`` as its admin."""
    async with Transport(await load_kubeconfig(audited_plane.kubeconfig)) as transport:
        yield transport


@pytest.fixture
async def audited_namespace(audited_admin: Transport) -> str:
    """A fresh namespace on ``audited_plane`` (left behind: the plane is the session's)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await audited_admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


@pytest.fixture(scope="session")
def throttled_plane() -> Iterator[ControlPlane]:
    """A second local control plane with at most one request in flight (the classic
    max-in-flight filter, without APF), for real 429s. Started only when a test asks."""
    if use_existing_cluster():
        pytest.skip("needs a local control plane with its own flags")
    args = {
        "--enable-priority-and-fairness": "false",
        "--max-requests-inflight": "1",
        "--max-mutating-requests-inflight": "1",
    }
    with ControlPlane(crd_directory=None, extra_apiserver_args=args) as plane:
        yield plane


@pytest.fixture(scope="session")
async def admin_config(control_plane: ControlPlane) -> ClusterConfig:
    return await load_kubeconfig(control_plane.kubeconfig)


@pytest.fixture(scope="session")
async def transport(admin_config: ClusterConfig) -> AsyncIterator[Transport]:
    async with Transport(admin_config) as t:
        yield t


@pytest.fixture
async def namespace(transport: Transport) -> AsyncIterator[str]:
    """A fresh namespace, deleted after the test (on the local control plane it stays
    Terminating: no namespace controller; a cluster's controller-manager empties and removes
    it)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await transport.request("POST", "/api/v1/namespaces", body=body)
    yield name
    with contextlib.suppress(ConflictError):
        await transport.request("DELETE", f"/api/v1/namespaces/{name}")
