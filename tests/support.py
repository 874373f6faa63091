"""Small helpers for integration tests: await a condition through a real watch."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from controller_runtime.envtest import ControlPlane
from controllers.postgres.api import API_VERSION as PG_API_VERSION
from controllers.postgres.api import POLICY, POLICY_NAME
from controllers.postgres.localserver import LocalPostgres
from informers._framing import LineFramer
from informers.sharding import HashRange, ShardField, ShardSelector
from kubeclient.config import load_kubeconfig
from kubeclient.errors import ConflictError, NotFoundError
from kubeclient.transport import Transport

Event = Mapping[str, Any]


SHARDING_GATE = "ShardedListAndWatch"
"""The API server's alpha gate for sharded list and watch (KEP-5866)."""
CONTROLLER_MANAGER = "controller-manager"
"""The component that runs the job, StatefulSet, garbage-collector ... controllers."""
KUBELET = "kubelet"
"""The component that runs Pods and writes their status (a node)."""


@dataclass(frozen=True)
class ClusterParts:
    """What the cluster under test runs besides its API server. The local control plane runs
    neither; a cluster reached with ``USE_EXISTING_CLUSTER`` usually runs both."""

    controller_manager: bool
    """Its controllers answer: ``kube-system``'s ``default`` ServiceAccount (made by the
    ServiceAccount controller) or the ``kube-controller-manager`` leader Lease exists."""
    nodes: int
    """Nodes registered (kubelets that run Pods)."""
    filters_shards: bool = False
    """Its API server filters lists and watches by ``shardSelector`` (the alpha gate
    ``ShardedListAndWatch`` is on, KEP-5866); a server without it ignores the parameter."""

    def runs(self, component: str) -> bool:
        """Whether the cluster runs ``component`` (:data:`CONTROLLER_MANAGER` or
        :data:`KUBELET`) itself."""
        if component == CONTROLLER_MANAGER:
            return self.controller_manager
        if component == KUBELET:
            return self.nodes > 0
        raise ValueError(f"unknown component {component!r}: {CONTROLLER_MANAGER} or {KUBELET}")

    def plays_reason(self, part: str, by: tuple[str, ...]) -> str | None:
        """Why a test that plays ``part`` (a role of the components ``by``) cannot run here:
        ``None`` when the cluster runs none of them, so that the test's writes are the only
        ones (a one-line skip reason otherwise)."""
        running = [component for component in by if self.runs(component)]
        if not running:
            return None
        return f"plays {part}, which this cluster runs itself ({', '.join(running)})"


ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
"""The ConfigMap a cluster's controller-manager (its root-ca-cert-publisher) puts into every
namespace: on an existing cluster a test's fresh namespace is not empty of ConfigMaps."""

PLAYED_BY_DEFAULT = (CONTROLLER_MANAGER, KUBELET)
"""The components a ``plays(...)`` marker without ``by=`` stands in for."""


def detect_cluster_parts(plane: ControlPlane) -> ClusterParts:
    """:class:`ClusterParts` of ``plane``: a local control plane runs neither component and
    filters shards as its feature gates say; an existing cluster is asked."""
    if not plane.existing_cluster:
        gate = bool(plane.feature_gates.get(SHARDING_GATE, False))
        return ClusterParts(controller_manager=False, nodes=0, filters_shards=gate)
    found = [
        plane.kubectl(*args, "-o", "name", check=False).strip()
        for args in (
            ("get", "serviceaccount", "default", "-n", "kube-system"),
            ("get", "lease", "kube-controller-manager", "-n", "kube-system"),
        )
    ]
    nodes = plane.kubectl("get", "nodes", "-o", "name", check=False).split()
    return ClusterParts(
        controller_manager=any(found), nodes=len(nodes), filters_shards=_filters_shards(plane)
    )


def _filters_shards(plane: ControlPlane) -> bool:
    """Whether the server honours a ``shardSelector``: a list of Namespaces for a 2**-32 sliver
    of the hash space holds only Namespaces in it (almost surely none) when it does, and every
    Namespace (at least the four every cluster has) when the parameter is ignored. A server
    that refuses the parameter does not filter either."""
    sliver = ShardSelector(ShardField.UID, [HashRange(0, 1 << 32)])
    query = urllib.parse.urlencode({"shardSelector": sliver.wire})
    raw = plane.kubectl("get", "--raw", f"/api/v1/namespaces?{query}", check=False)
    if not raw.strip():
        return False
    return all(sliver.matches(item) for item in orjson.loads(raw).get("items") or [])


async def watch_until(
    transport: Transport,
    path: str,
    condition: Callable[[Event], bool],
    *,
    params: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> Event:
    """Watch ``path`` (from the current state) until an event satisfies ``condition``."""

    async def run() -> Event:
        query = {"watch": "1", **(params or {})}
        async with transport.stream(path, query) as response:
            framer = LineFramer()
            async for chunk in response.content.iter_any():
                for line in framer.feed(chunk):
                    event = orjson.loads(line)
                    if condition(event):
                        return event  # type: ignore[no-any-return]
        raise AssertionError(f"the watch on {path} ended before the condition held")

    return await asyncio.wait_for(run(), timeout)


def condition_true(obj: Mapping[str, Any], condition_type: str) -> bool:
    # A CRD's first events may carry "conditions": null (the controllers have not set any).
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == condition_type and c.get("status") == "True" for c in conditions)


async def grant_list_configmaps(plane: ControlPlane, user: str) -> None:
    """Let ``user`` list ConfigMaps cluster-wide, with an explicit ClusterRole (the built-in
    "view" is an aggregated role, and aggregation needs the controller-manager the local
    control plane does not run)."""
    async with Transport(await load_kubeconfig(plane.kubeconfig)) as admin:
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        name = f"{user}-list-configmaps"
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }  # fmt: skip
        await admin.request("POST", f"{rbac}/clusterroles", body=role)
        await admin.request("POST", f"{rbac}/clusterrolebindings", body=binding)


async def until_allowed(
    transport: Transport, verb: str, resource: str, namespace: str | None = None
) -> None:
    """Ask the server (SelfSubjectAccessReview) until RBAC lets ``transport``'s identity do
    ``verb`` on ``resource``: the authorizer reads RBAC from its own informer, so a new
    binding takes effect a moment after it is created."""
    attributes = {"verb": verb, "resource": resource}
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    for _ in range(200):
        answer = await transport.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review
        )
        if answer.json()["status"].get("allowed"):
            return
    raise AssertionError(f"RBAC never allowed {verb} {resource}")


async def create_external_instance(
    transport: Transport, server: LocalPostgres, namespace: str, *, field_manager: str
) -> None:
    """Enable ``server``'s major version in the version policy, then create the PostgresInstance
    ``db`` in ``namespace`` pointing at ``server``, with its admin Secret ``db-admin``."""
    major = server.version.split(".")[0]
    policy = {
        "apiVersion": PG_API_VERSION,
        "kind": POLICY,
        "metadata": {"name": POLICY_NAME},
        "spec": {"versions": [{"version": major, "enabled": True}]},
    }
    await transport.request(
        "PATCH",
        f"/apis/{PG_API_VERSION}/postgresversionpolicies/{POLICY_NAME}",
        body=policy,
        content_type="application/apply-patch+yaml",
        params={"fieldManager": field_manager, "force": "true"},
    )
    await transport.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/secrets",
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db-admin"},
            "stringData": {"username": server.user, "password": server.password},
        },
    )
    await transport.request(
        "POST",
        f"/apis/{PG_API_VERSION}/namespaces/{namespace}/postgresinstances",
        body={
            "apiVersion": PG_API_VERSION,
            "kind": "PostgresInstance",
            "metadata": {"name": "db"},
            "spec": {
                "external": {
                    "host": server.host,
                    "port": server.port,
                    "adminSecretRef": {"name": "db-admin"},
                }
            },
        },
    )


async def collect_binding_orphans(transport: Transport, namespace: str) -> int:
    """Delete, as the garbage collector would (none runs on the local control plane), every
    Secret and PostgresUser in ``namespace`` whose controlling ServiceBinding is gone; return
    how many were deleted (objects already being deleted are left to finish).

    It matters because the API server can delete a binding whose finalizer was added
    concurrently (kubernetes/kubernetes#77988, open in 1.36): the DELETE decided on the object
    as it was before the finalizer, so the binding's cleanup never runs, while the reconcile
    that added the finalizer goes on to create the binding's Secret and PostgresUser. In a
    cluster the collector removes them (their owner's UID is gone) and the PostgresUser's own
    finalizer drops the role. Like the collector, this checks the owner live, by name and UID,
    before deleting (``Background``, with the dependent's UID as a precondition).
    """
    bindings = f"/apis/{PG_API_VERSION}/namespaces/{namespace}/servicebindings"
    dependents: list[tuple[str, Mapping[str, Any]]] = []
    for base in (
        f"/api/v1/namespaces/{namespace}/secrets",
        bindings.replace("servicebindings", "postgresusers"),
    ):
        listed = await transport.get_json(base)
        dependents += [(base, obj) for obj in listed.get("items") or []]
    collected = 0
    for base, obj in dependents:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            continue  # already being deleted (a PostgresUser waits for its finalizer)
        owner = next(
            (
                ref
                for ref in meta.get("ownerReferences") or []
                if ref.get("controller") and ref.get("kind") == "ServiceBinding"
            ),
            None,
        )
        if owner is None:
            continue
        try:
            live = await transport.get_json(f"{bindings}/{owner['name']}")
        except NotFoundError:
            live = None
        if live is not None and live["metadata"].get("uid") == owner.get("uid"):
            continue
        with contextlib.suppress(NotFoundError, ConflictError):
            await transport.request(
                "DELETE",
                f"{base}/{meta['name']}",
                body={"propagationPolicy": "Background", "preconditions": {"uid": meta["uid"]}},
            )
            collected += 1
    return collected
