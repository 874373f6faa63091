"""The operator's manifests against real API servers: rendered by kustomize and validated, the
CRDs accepted, ``kubectl apply -k manifests/`` installing everything (twice: the second time
changes nothing), the Pods admitted under Pod Security "restricted", the ServiceAccount
holding exactly the manifests' permissions, and the operator itself running under them.

The last test is the least-privilege check: a fresh local control plane, the manifests
applied, and two replicas of the real operator (the Deployment's own arguments) authenticated
as the manifests' ServiceAccount. One leads and reconciles; the other, a follower, syncs its
cache with plain LISTs as on API servers without streaming lists. Both serve the webhooks
with the self-managed certificates, as in a cluster (the certificates' Secret created, the CA
written into the webhook configurations and the PostgresInstance CRD's conversion, each
replica reading those back for its readiness); the configurations and the conversion are
pointed by URL at the leader's server (no Service routes to a process on this machine), so
every PostgresInstance and ServiceBinding write of the scenarios goes through the webhooks.
Every controller's scenario (:data:`SCENARIOS`) is driven, the custom resources are deleted
while the operator still runs (the documented uninstall order, so finalizers are handled),
and every request the operator made is recorded. Then: no request was denied, every request
is allowed by the manifests' rules as modelled (``tests/rbac_usage.py``), and every granted
rule was used. Finally ``kubectl delete -k manifests/`` removes the installation. It runs
twice: for the base, and
for the sharded variant applied on top of it (``manifests/sharded/``: the Task controller
sharded over a ring of Leases with the ring's own Role, the other controllers leader-elected),
where both replicas also work on their own slots of the ring.

The tests that install do so on a local control plane started for this module (they install
cluster-wide objects); the last one starts another each time, since it also uninstalls. With
``USE_EXISTING_CLUSTER`` they are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import orjson
import pytest
import yaml

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.controller import ControllerOptions
from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.binaries import KUBERNETES_VERSION, find_binaries
from controller_runtime.envtest.controlplane import use_existing_cluster
from controller_runtime.manager import Manager
from controller_runtime.metrics import REGISTRY
from controllers.__main__ import settings_from
from controllers.app import CONTROLLERS, build_manager, setup_webhooks
from controllers.cli import OperatorSettings
from controllers.postgres.localserver import LocalPostgres
from informers.reflector_machine import ReflectorOptions
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig, load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.errors import ApiError, ConflictError, NotFoundError
from kubeclient.transport import Transport
from tests.integration.postgres import test_rbac_usage as pg_rbac
from tests.rbac_usage import (
    Access,
    RequestLog,
    blocking_owner_accesses,
    classify,
    grants_for,
    ungranted_accesses,
    unused_grants,
)
from tests.support import watch_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
SCHEMA_VERSION = ".".join(KUBERNETES_VERSION.split(".")[:2])
TIMEOUT = 30.0

Doc = dict[str, Any]

# -- kubectl and the rendered manifests -------------------------------------------------------


@functools.cache
def kubectl_executable() -> str:
    if not use_existing_cluster():
        kubectl = find_binaries().kubectl
        if kubectl is not None:
            return str(kubectl)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is not available; run `make binaries`")
    return found


def kubectl(
    plane: ControlPlane | None, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """kubectl (as the admin of ``plane``), keeping stderr: warnings matter here."""
    config = [f"--kubeconfig={plane.kubeconfig}"] if plane is not None else []
    result = subprocess.run(
        [kubectl_executable(), *config, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if check and result.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


VARIANTS: dict[str, tuple[Path, ...]] = {
    "base": (MANIFESTS,),
    # Applied on top of the base, in this order (docs/deploy.md): the Deployment replaced,
    # the ring's Role and RoleBinding added.
    "sharded": (MANIFESTS, MANIFESTS / "sharded"),
}
"""Each installable variant: the kustomizations ``kubectl apply -k`` takes, in order."""


def render(directory: Path) -> list[Doc]:
    """What ``kubectl apply -k <directory>`` sends: the kustomization rendered."""
    out = kubectl(None, "kustomize", str(directory)).stdout
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


def render_variant(variant: str) -> list[Doc]:
    """The objects a variant's applies leave: a later kustomization's object replaces an
    earlier one of the same kind, namespace and name."""
    objects: dict[tuple[str, str, str], Doc] = {}
    for directory in VARIANTS[variant]:
        for doc in render(directory):
            meta = doc["metadata"]
            objects[(doc["kind"], meta.get("namespace", ""), meta["name"])] = doc
    return list(objects.values())


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    """What ``kubectl apply -k manifests/`` sends: the kustomization rendered."""
    return render(MANIFESTS)


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def ref(doc: Doc) -> list[str]:
    """kubectl arguments naming ``doc``."""
    meta = doc["metadata"]
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    kind = f"{doc['kind'].lower()}.{group}" if group else doc["kind"].lower()
    args = [f"{kind}/{meta['name']}"]
    if meta.get("namespace"):
        args.append(f"--namespace={meta['namespace']}")
    return args


def operator_account(docs: list[Doc]) -> tuple[str, str]:
    (deployment,) = of_kind(docs, "Deployment")
    namespace = deployment["metadata"]["namespace"]
    return namespace, deployment["spec"]["template"]["spec"]["serviceAccountName"]


def operator_args(docs: list[Doc]) -> list[str]:
    (deployment,) = of_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def install(
    plane: ControlPlane, docs: list[Doc], variant: str = "base"
) -> subprocess.CompletedProcess[str]:
    """``kubectl apply -k manifests/`` (then the variant's other kustomizations), then wait
    until the CRDs are established. Returns the first apply."""
    applied, *_ = [kubectl(plane, "apply", "-k", str(d)) for d in VARIANTS[variant]]
    crds = [f"crd/{d['metadata']['name']}" for d in of_kind(docs, "CustomResourceDefinition")]
    kubectl(plane, "wait", "--for=condition=Established", f"--timeout={TIMEOUT:.0f}s", *crds)
    return applied


async def wait_served(admin: Transport, docs: list[Doc]) -> None:
    """Until discovery lists every CRD's resource (it lags Established briefly, and has no
    watch to wait on: poll)."""
    async with asyncio.timeout(TIMEOUT):
        for crd in of_kind(docs, "CustomResourceDefinition"):
            spec = crd["spec"]
            for version in (v["name"] for v in spec["versions"] if v.get("served", True)):
                while True:
                    with contextlib.suppress(NotFoundError):
                        listing = await admin.get_json(f"/apis/{spec['group']}/{version}")
                        names = {r["name"] for r in listing.get("resources") or ()}
                        if spec["names"]["plural"] in names:
                            break
                    await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    if use_existing_cluster():
        pytest.skip("installs the operator cluster-wide: local control plane only")
    with ControlPlane(crd_directory=None) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def installed(plane: ControlPlane, rendered: list[Doc]) -> subprocess.CompletedProcess[str]:
    return install(plane, rendered)


# -- validation --------------------------------------------------------------------------------


def test_the_rendered_manifests_validate_against_the_kubernetes_schemas(
    rendered: list[Doc],
) -> None:
    custom = {d["spec"]["group"] for d in of_kind(rendered, "CustomResourceDefinition")}
    problems = []
    for doc in rendered:
        if doc["apiVersion"].split("/")[0] in custom:
            continue
        try:
            kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {where}: {err.message}")
    assert not problems
    kinds = {d["kind"] for d in rendered}
    assert {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
    } <= kinds
    (deployment,) = of_kind(rendered, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "controller-runtime-py/operator:0.2.0"


def test_the_crds_are_accepted_by_the_api_server(plane: ControlPlane, tmp_path: Path) -> None:
    out = kubectl(
        plane, "apply", "--server-side", "--dry-run=server", "-f", str(MANIFESTS / "crds")
    ).stdout
    crds = sorted(
        doc["metadata"]["name"]
        for path in (MANIFESTS / "crds").glob("*.y*ml")
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    )
    assert all(f"customresourcedefinition.apiextensions.k8s.io/{n} " in out for n in crds), out

    # The check can fail: a schema the API server refuses (not structural) is reported.
    broken = yaml.safe_load((MANIFESTS / "crds" / "tasks.crpy.io_tasks.yaml").read_text())
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["type"] = (
        "objekt"
    )
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    refused = kubectl(
        plane, "apply", "--server-side", "--dry-run=server", "-f", str(path), check=False
    )
    assert refused.returncode != 0
    assert "objekt" in refused.stderr


# -- installation ------------------------------------------------------------------------------


def _resource_versions(plane: ControlPlane) -> dict[str, str]:
    listed = orjson.loads(kubectl(plane, "get", "-k", str(MANIFESTS), "-o", "json").stdout)
    return {
        f"{item['kind']}/{item['metadata']['name']}": item["metadata"]["resourceVersion"]
        for item in listed["items"]
    }


def test_kubectl_apply_k_installs_everything_and_a_second_apply_changes_nothing(
    plane: ControlPlane, rendered: list[Doc], installed: subprocess.CompletedProcess[str]
) -> None:
    lines = installed.stdout.splitlines()
    for doc in rendered:
        name = doc["metadata"]["name"]
        assert any(f"/{name} " in line for line in lines), f"{doc['kind']} {name} not applied"
    assert "PodSecurity" not in installed.stderr, installed.stderr
    assert "Warning" not in installed.stderr, installed.stderr

    before = _resource_versions(plane)
    assert len(before) == len(rendered)
    again = kubectl(plane, "apply", "-k", str(MANIFESTS))
    assert "Warning" not in again.stderr, again.stderr
    # kubectl may say "configured" for a no-op patch (PodDisruptionBudgets); the objects'
    # resourceVersions show whether anything changed.
    assert _resource_versions(plane) == before


def test_the_operator_pods_are_admitted_under_pod_security_restricted(
    plane: ControlPlane,
    rendered: list[Doc],
    installed: subprocess.CompletedProcess[str],
    tmp_path: Path,
) -> None:
    (deployment,) = of_kind(rendered, "Deployment")
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "operator-pod-security-check",
            "namespace": deployment["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    admitted = kubectl(plane, "create", "--dry-run=server", "-f", str(path), check=False)
    assert admitted.returncode == 0, admitted.stderr
    assert "PodSecurity" not in admitted.stderr, admitted.stderr

    # Admission does enforce it: the same Pod allowed to escalate privileges is refused.
    container = pod["spec"]["containers"][0]
    container["securityContext"]["allowPrivilegeEscalation"] = True
    path.write_text(yaml.safe_dump(pod))
    refused = kubectl(plane, "create", "--dry-run=server", "-f", str(path), check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


DEFAULT_RULES = frozenset(
    {
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create", ""),
        ("authorization.k8s.io", "selfsubjectrulesreviews", "create", ""),
        ("authentication.k8s.io", "selfsubjectreviews", "create", ""),
    }
)
"""What every authenticated user may do (the built-in ``system:basic-user`` role)."""


async def test_the_service_account_holds_exactly_the_manifests_permissions(
    plane: ControlPlane, rendered: list[Doc], installed: subprocess.CompletedProcess[str]
) -> None:
    """The API server's own view (SelfSubjectRulesReview, as the ServiceAccount) of what it
    may do, in its namespace and in another one, equals the model of the manifests' rules."""
    namespace, name = operator_account(rendered)
    grants = grants_for(rendered, namespace, name)
    identity = plane.mint_service_account(namespace, name)
    config = await load_kubeconfig(identity.kubeconfig)
    async with Transport(config) as account:
        for where in (namespace, "some-other-namespace"):
            body = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": where},
            }
            answer = await account.request(
                "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", body=body
            )
            status = answer.json()["status"]
            assert not status.get("incomplete"), status
            actual = {
                (group, resource, verb, resource_name)
                for rule in status["resourceRules"]
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
                for resource_name in rule.get("resourceNames") or [""]
            } - DEFAULT_RULES
            expected = {
                (g.group, g.resource, g.verb, g.resource_name)
                for g in grants
                if g.namespace in ("", where)
            }
            assert actual == expected, f"in {where}"


# -- the operator under its own RBAC -----------------------------------------------------------


@dataclass
class Scene:
    """What a scenario gets: the control plane, an admin transport and a fresh namespace.

    A scenario may leave ``teardown`` coroutines (run after what the operator wrote was
    recorded, before every custom resource is deleted) and ``cleanups`` (run at the very end,
    e.g. to stop a database the finalizers still need)."""

    plane: ControlPlane
    admin: Transport
    namespace: str
    teardown: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)


Scenario = Callable[[Scene], Awaitable[None]]


async def task_scenario(scene: Scene) -> None:
    """Tasks: one without a deadline settles as Pending, one past its deadline turns
    Overdue (the controller patches their status)."""
    path = f"/apis/tasks.crpy.io/v1/namespaces/{scene.namespace}/tasks"
    tasks = {"open": ("Pending", {}), "late": ("Overdue", {"deadline": "2000-01-01T00:00:00Z"})}
    for name, (_, extra) in tasks.items():
        body = {
            "apiVersion": "tasks.crpy.io/v1",
            "kind": "Task",
            "metadata": {"name": name},
            "spec": {"priority": 1, **extra},
        }
        await scene.admin.request("POST", path, body=body)
    for name, (state, _) in tasks.items():
        await watch_until(
            scene.admin,
            path,
            has_state(state),
            params={"fieldSelector": f"metadata.name={name}"},
            timeout=TIMEOUT,
        )


def has_state(state: str) -> Callable[[Mapping[str, Any]], bool]:
    def check(event: Mapping[str, Any]) -> bool:
        return bool((event["object"].get("status") or {}).get("state") == state)

    return check


async def postgres_scenario(scene: Scene) -> None:
    """Every PostgreSQL controller through every path that needs a permission, against a real
    PostgreSQL (tests/integration/postgres/test_rbac_usage.py); their deletion paths run in
    teardown, while the server still runs (dropping roles needs it)."""
    cache = Cache(InformerFactory(scene.admin))
    kube = Client(scene.admin, cache)
    server = LocalPostgres()
    # Started from the event loop's (main) thread on purpose: the server dies with the thread
    # that started it, and a pool thread may go away first.
    server.start()
    scene.cleanups.append(server.stop)
    await pg_rbac.postgres_scenario(kube, scene.admin, scene.namespace, server)

    async def delete() -> None:
        await pg_rbac.delete_everything(kube, scene.admin, scene.namespace)
        await cache.stop()

    scene.teardown.append(delete)


SCENARIOS: dict[str, Scenario] = {
    "task": task_scenario,
    # One scenario drives the five PostgreSQL controllers together: each needs the others.
    "postgres-instance": postgres_scenario,
    "postgres-user": postgres_scenario,
    "service-binding": postgres_scenario,
    "backup": postgres_scenario,
    "backup-plan": postgres_scenario,
}
"""For every controller in ``controllers.app.CONTROLLERS``: a scenario that makes it use every
permission it needs (create its resources, wait until they are reconciled). The test then
deletes every custom resource while the operator runs, so deletion paths and finalizers are
exercised without a scenario's help. A scenario raises if the controller does not do its job."""


def test_every_controller_has_an_rbac_scenario() -> None:
    missing = sorted(set(CONTROLLERS) - set(SCENARIOS))
    assert not missing, (
        f"add a scenario for {missing} to SCENARIOS in tests/integration/test_manifests.py, "
        "so that the RBAC test runs these controllers and sees every permission they use"
    )


@dataclass
class Replica:
    manager: Manager
    run: asyncio.Task[None]
    ring_transport: Transport | None = None


async def start_replica(
    settings: OperatorSettings,
    config: ClusterConfig,
    log: RequestLog,
    *,
    streaming: bool,
    ring_log: RequestLog | None = None,
) -> Replica:
    """The operator as ``python -m controllers`` builds it, with every request recorded.

    With a shard ring, the ring talks through a transport of its own (same identity), whose
    requests ``ring_log`` records too: they tell which Lease requests are the ring's (the
    ring's Lease creates look like leader election's)."""
    manager = build_manager(settings, config)
    manager.transport.on_request = log.record
    ring_transport = None
    if manager.shard_ring is not None:
        assert ring_log is not None

        def record(method: str, path: str, params: Mapping[str, str] | None, status: int) -> None:
            log.record(method, path, params, status)
            ring_log.record(method, path, params, status)

        ring_transport = Transport(config, on_request=record)
        manager.shard_ring.transport = ring_transport
    if not streaming:
        manager.factory.options = ReflectorOptions(streaming_list=False)
    # Two replicas in one process: each webhook server on a free loopback port.
    manager.webhook_server.host, manager.webhook_server.port = "127.0.0.1", 0
    # What controllers.app.setup_controllers does, but with skip_name_validation: controller
    # names are unique per process (they label metrics), and here two replicas share one.
    for name in settings.controllers:
        workers = settings.concurrency.get(name, settings.max_concurrent_reconciles)
        options = ControllerOptions(max_concurrent_reconciles=workers, skip_name_validation=True)
        await CONTROLLERS[name](manager, options)
    await setup_webhooks(manager, settings)
    run = asyncio.create_task(manager.run(), name="operator-replica")
    return Replica(manager, run, ring_transport)


async def wait_or_fail(
    what: str, awaitable: Awaitable[object], log: RequestLog, *replicas: Replica
) -> None:
    """Wait for ``awaitable``; fail at once if a request is denied or a replica stops, or
    after :data:`TIMEOUT`."""
    waiting = asyncio.ensure_future(awaitable)
    denied = asyncio.create_task(log.denied.wait())
    done, _ = await asyncio.wait(
        {waiting, denied, *(r.run for r in replicas)},
        timeout=TIMEOUT,
        return_when=asyncio.FIRST_COMPLETED,
    )
    denied.cancel()
    if waiting in done:
        waiting.result()
        return
    waiting.cancel()
    refused = sorted({str(a) for a in log.accesses() if a.status == 403})
    for replica in replicas:
        if replica.run in done:
            pytest.fail(
                f"{what}: a replica stopped: {replica.run.exception()!r}; denied: {refused}"
            )
    if refused:
        pytest.fail(f"{what}: the manifests' RBAC denied:\n" + "\n".join(refused))
    pytest.fail(f"{what}: not within {TIMEOUT}s")


async def point_webhooks_at(admin: Transport, url: str, docs: list[Doc]) -> None:
    """Rewrite every webhook configuration's and CRD conversion's ``service`` to ``url`` plus
    its path, keeping the caBundle the operator wrote (a conflict with its writes: again)."""
    paths = []
    for doc in docs:
        if doc["kind"].endswith("WebhookConfiguration"):
            paths.append(f"/apis/admissionregistration.k8s.io/v1/{doc['kind'].lower()}s")
        elif doc["kind"] == "CustomResourceDefinition" and doc["spec"].get("conversion", {}).get(
            "webhook"
        ):
            paths.append("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        else:
            continue
        paths[-1] += f"/{doc['metadata']['name']}"
    for path in paths:
        while True:
            obj = await admin.get_json(path)
            if obj["kind"] == "CustomResourceDefinition":
                configs = [obj["spec"]["conversion"]["webhook"]["clientConfig"]]
            else:
                configs = [w["clientConfig"] for w in obj["webhooks"]]
            for config in configs:
                service = config.pop("service", None)
                if service is not None:
                    config["url"] = f"{url}{service['path']}"
            try:
                await admin.request("PUT", path, body=obj)
                break
            except ConflictError:
                continue


async def webhooks_answer(admin: Transport, replica: Replica, namespace: str) -> None:
    """Until the API server's PostgresInstance writes go through ``replica``'s webhook: a
    dry-run create is admitted and the replica counted the review."""
    path = "/validate-postgres-crpy-io-v1beta1-postgresinstance"
    body = {
        "apiVersion": "postgres.crpy.io/v1beta1",
        "kind": "PostgresInstance",
        "metadata": {"name": "webhook-probe", "namespace": namespace},
        "spec": {"version": "16", "storage": {"size": "1Gi"}},
    }

    def reviews() -> float:
        return (
            REGISTRY.get_sample_value(
                "controller_runtime_webhook_requests_total", {"webhook": path, "code": "200"}
            )
            or 0.0
        )

    while True:
        before = reviews()
        with contextlib.suppress(ApiError):
            await admin.request(
                "POST",
                f"/apis/postgres.crpy.io/v1beta1/namespaces/{namespace}/postgresinstances",
                params={"dryRun": "All"},
                body=body,
                max_retries=0,
            )
            if reviews() > before and await replica.manager.webhook_server.ready():
                return
        await asyncio.sleep(0.2)  # no event says when the API server trusts the new CA


async def stop(replica: Replica) -> None:
    replica.manager.request_stop()
    try:
        await asyncio.wait_for(replica.run, TIMEOUT)
    finally:
        if replica.ring_transport is not None:
            await replica.ring_transport.close()


async def objects_written(admin: Transport, log: RequestLog) -> list[Doc]:
    """The objects in every collection the operator created or changed something in (as they
    are now), for the permissions admission checks on them."""
    collections = set()
    for method, path, params, status in log.requests:
        if method not in ("POST", "PUT", "PATCH") or not 200 <= status < 300:
            continue
        accesses = classify(method, path, params, status)
        if not accesses or "/" in accesses[0].resource:
            continue  # a subresource: the object's metadata did not change
        collections.add(path if method == "POST" else path.rsplit("/", 1)[0])
    objects: list[Doc] = []
    for collection in sorted(collections):
        objects.extend((await admin.get_json(collection)).get("items") or [])
    return objects


async def owner_finalizer_accesses(admin: Transport, objects: list[Doc]) -> list[Access]:
    discovery = Discovery(admin)
    owners = {
        (ref["apiVersion"], ref["kind"])
        for obj in objects
        for ref in obj.get("metadata", {}).get("ownerReferences") or ()
    }
    resources = {}
    for api_version, kind in owners:
        info = await discovery.resolve(api_version, kind)
        resources[(api_version, kind)] = (info.group, info.plural)
    return blocking_owner_accesses(objects, lambda v, k: resources[(v, k)])


def delete_every_custom_resource(plane: ControlPlane, docs: list[Doc]) -> None:
    """The first step of an uninstall, as docs/deploy.md gives it: while the operator runs, so
    finalizers are handled. The CRDs are found by the label the kustomization sets."""
    resources = kubectl(
        plane,
        "get",
        "crd",
        "-l",
        "app.kubernetes.io/part-of=controller-runtime-py",
        "-o",
        "jsonpath={range .items[*]}{.spec.names.plural}.{.spec.group},{end}",
    ).stdout.rstrip(",")
    expected = {
        f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
        for crd in of_kind(docs, "CustomResourceDefinition")
    }
    assert set(resources.split(",")) == expected
    kubectl(plane, "delete", "--all", "--all-namespaces", resources, f"--timeout={TIMEOUT:.0f}s")


@pytest.fixture
def fresh_plane() -> Iterator[ControlPlane]:
    if use_existing_cluster():
        pytest.skip(
            "installs the operator cluster-wide and uninstalls it: local control plane only"
        )
    with ControlPlane(crd_directory=None) as fresh:
        yield fresh


async def ring_split(replicas: list[Replica]) -> None:
    """Until every replica works on some slots of the ring and together they work on each
    slot once (the rings' state in this process: polled, no event marks it)."""
    rings = [ring for r in replicas if (ring := r.manager.shard_ring) is not None]
    assert len(rings) == len(replicas)
    every = list(range(rings[0].config.slots))
    while True:
        active = [ring.active for ring in rings]
        if all(active) and sorted(slot for slots in active for slot in slots) == every:
            return
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_the_operator_runs_under_its_manifests_rbac_and_uses_every_rule(
    fresh_plane: ControlPlane, variant: str
) -> None:
    """The base install (leader election), and the sharded variant on top of it (the Task
    controller sharded over a ring of Leases, the others leader-elected): the same checks,
    each against its own RBAC."""
    plane = fresh_plane
    rendered = render_variant(variant)
    install(plane, rendered, variant)
    namespace, account = operator_account(rendered)
    grants = grants_for(rendered, namespace, account)
    assert grants, "the manifests grant the operator nothing"
    config = await load_kubeconfig(plane.mint_service_account(namespace, account).kubeconfig)
    admin_config = await load_kubeconfig(plane.kubeconfig)
    controllers = [name for name in CONTROLLERS if name in SCENARIOS]
    settings = settings_from(
        [
            *operator_args(rendered),
            # In a Pod these come from the Pod: the Lease goes to the ServiceAccount's namespace.
            f"--leader-election-namespace={namespace}",
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            f"--controllers={','.join(controllers)}",
            # The webhooks' Secret and Services: the Pod's namespace in a cluster. The API
            # server calls the leader by URL (127.0.0.1), which its certificate must name.
            f"--webhook-namespace={namespace}",
            "--webhook-extra-hosts=127.0.0.1",
            "--webhook-shutdown-delay=0.5",
        ]
    )
    assert settings.webhook_port and settings.webhook_certificates == "self-managed"
    assert settings.leader_elect
    sharded = variant == "sharded"
    assert (settings.shard_ring is not None) == sharded

    log = RequestLog()
    ring_log = RequestLog()  # the shard ring's requests (sharded variant)
    replicas: list[Replica] = []
    async with Transport(admin_config) as admin:
        await wait_served(admin, rendered)
        scenes = {name: Scene(plane, admin, f"rbac-{name}") for name in controllers}
        for scene in scenes.values():
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": scene.namespace}}
            await admin.request("POST", "/api/v1/namespaces", body=body)
        try:
            leader = await start_replica(settings, config, log, streaming=True, ring_log=ring_log)
            replicas.append(leader)
            assert leader.manager.elector is not None
            await wait_or_fail("leading", leader.manager.elector.became_leader.wait(), log, leader)
            webhook_url = leader.manager.webhook_server.url
            assert webhook_url is not None, "the webhook server listens before leading"
            await point_webhooks_at(admin, webhook_url, rendered)
            await wait_or_fail(
                "the webhooks answering through the API server",
                webhooks_answer(admin, leader, scenes[controllers[0]].namespace),
                log,
                leader,
            )
            follower = await start_replica(
                settings, config, log, streaming=False, ring_log=ring_log
            )
            replicas.append(follower)
            await wait_or_fail(
                "the follower's cache", follower.manager.cache.wait_for_sync(TIMEOUT), log, follower
            )
            assert not follower.manager.is_leader
            if sharded:  # both replicas work on Tasks, each on its own slots
                await wait_or_fail("the ring's split", ring_split(replicas), log, *replicas)

            ran: set[Scenario] = set()
            for name, scene in scenes.items():
                if SCENARIOS[name] in ran:  # one scenario may cover several controllers
                    continue
                ran.add(SCENARIOS[name])
                await wait_or_fail(f"the {name} scenario", SCENARIOS[name](scene), log, *replicas)
            written = await objects_written(admin, log)
            for scene in scenes.values():
                for teardown in scene.teardown:
                    await wait_or_fail("a scenario's teardown", teardown(), log, *replicas)
            await wait_or_fail(
                "deleting the custom resources",
                asyncio.to_thread(delete_every_custom_resource, plane, rendered),
                log,
                *replicas,
            )
        finally:
            for replica in reversed(replicas):
                with contextlib.suppress(Exception):
                    await stop(replica)
            for scene in scenes.values():
                for cleanup in scene.cleanups:
                    cleanup()
        for replica in replicas:
            assert replica.run.done() and replica.run.exception() is None
        by_admission = await owner_finalizer_accesses(admin, written)
    requested = log.accesses()
    accesses = requested + by_admission

    denied = sorted({str(a) for a in requested if a.status == 403})
    assert not denied, "requests the manifests' RBAC denied:\n" + "\n".join(denied)
    ungranted = [str(a) for a in ungranted_accesses(grants, requested)]
    assert not ungranted, (
        "allowed by the API server but by no rule of the manifests (is the model in "
        "tests/rbac_usage.py wrong?):\n" + "\n".join(ungranted)
    )
    missing = [str(a) for a in ungranted_accesses(grants, by_admission)]
    assert not missing, (
        "owner references with blockOwnerDeletion need update on the owner's finalizers "
        "subresource where OwnerReferencesPermissionEnforcement is on:\n" + "\n".join(missing)
    )
    unused = [str(g) for g in unused_grants(grants, accesses)]
    used = sorted({str(a) for a in accesses if a.authorized})
    assert not unused, (
        "granted but never used by any controller (drop the rule, or extend the scenario):\n"
        + "\n".join(unused)
        + "\n\nwhat the operator did:\n"
        + "\n".join(used)
    )

    if sharded:
        # The ring's Role on its own: exactly what the ring does, no more, no less (its
        # create overlaps leader election's Role, which the checks above cannot tell apart).
        ring_grants = grants_for(render(VARIANTS[variant][-1]), namespace, account)
        assert ring_grants, "manifests/sharded/ grants the ring nothing"
        ring_accesses = ring_log.accesses()
        beyond = [str(a) for a in ungranted_accesses(ring_grants, ring_accesses)]
        assert not beyond, "the ring needs rights beyond its own Role:\n" + "\n".join(beyond)
        idle = [str(g) for g in unused_grants(ring_grants, ring_accesses)]
        ring_used = sorted({str(a) for a in ring_accesses if a.authorized})
        assert not idle, (
            "granted by the ring's Role but never used by the ring:\n"
            + "\n".join(idle)
            + "\n\nwhat the ring did:\n"
            + "\n".join(ring_used)
        )

    # Uninstall: the custom resources are gone already; now everything else, the variant's
    # kustomizations in reverse order (the base's Deployment went with the sharded one).
    for i, directory in enumerate(reversed(VARIANTS[variant])):
        gone_already = ["--ignore-not-found"] if i else []
        kubectl(plane, "delete", "-k", str(directory), "--wait=false", *gone_already)
    remaining = [d for d in rendered if d["kind"] != "Namespace"]
    for doc in remaining:
        kubectl(plane, "wait", "--for=delete", *ref(doc), f"--timeout={TIMEOUT:.0f}s")
    (operator_namespace,) = of_kind(rendered, "Namespace")
    gone = kubectl(plane, "get", *ref(operator_namespace), "-o", "json", check=False)
    # No namespace controller runs on the local control plane: the namespace stays Terminating.
    assert gone.returncode != 0 or orjson.loads(gone.stdout)["metadata"].get("deletionTimestamp")


# -- the cert-manager Component ----------------------------------------------------------------


def test_the_cert_manager_component_serves_the_certificates_secret_from_the_cert_dir(
    tmp_path: Path,
) -> None:
    """``manifests/cert-manager`` (a kustomize Component, included from an overlay beside
    the base, as docs/deploy.md shows): the operator in cert-dir mode with the Certificate's
    Secret mounted at its certificate directory, cert-manager's CA injector told to fill every
    caBundle the operator reads, the self-managed Secret's Role gone; everything else as in
    the base, and every built-in object still valid."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(MANIFESTS, overlay)],
                "components": [os.path.relpath(MANIFESTS / "cert-manager", overlay)],
            }
        )
    )
    docs = render(overlay)
    base = render(MANIFESTS)
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    (deployment,) = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    settings = settings_from(container["args"])
    assert settings.webhook_certificates == "cert-dir"
    assert settings.webhook_port == 9443
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-certificates"]
    assert mount["mountPath"] == settings.webhook_cert_dir and mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-certificates"]
    serving = by_key[("Certificate", "crpy-operator-webhook")]
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    namespace = deployment["metadata"]["namespace"]
    for service in settings.webhook_services:
        assert f"{service}.{namespace}.svc" in serving["spec"]["dnsNames"]
    inject = f"{namespace}/{serving['metadata']['name']}"
    annotated = [
        by_key[("ValidatingWebhookConfiguration", settings.webhook_configuration)],
        by_key[("MutatingWebhookConfiguration", settings.webhook_configuration)],
        *(by_key[("CustomResourceDefinition", name)] for name in settings.webhook_conversion_crds),
    ]
    for doc in annotated:
        assert doc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == inject
    assert ("Role", "crpy-operator") not in by_key
    assert ("RoleBinding", "crpy-operator") not in by_key
    added = {key for key in by_key} - {(d["kind"], d["metadata"]["name"]) for d in base}
    assert {kind for kind, _ in added} == {"Issuer", "Certificate"}
    problems = []
    for doc in docs:
        if doc["apiVersion"].split("/")[0] in ("cert-manager.io", "postgres.crpy.io"):
            continue
        if doc["kind"] == "CustomResourceDefinition" or doc["apiVersion"].startswith("tasks"):
            continue
        try:
            kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {err.message}")
    assert not problems
