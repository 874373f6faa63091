"""Webhooks through the real API server: a manager serves a defaulter, a validator and a
conversion for a two-version CRD, installed by envtest's WebhookInstallOptions.

What is checked from the client's side: defaults land in the stored object and fields the
handler does not know survive; a denial's message and field reach the client; a handler that
raises or runs over its timeout is refused under ``failurePolicy: Fail`` and admitted under
``Ignore``; the validator reads other objects through the client; conversion round-trips
every field between the versions, both ways, through the API server's storage; the manager's
readiness includes the webhook server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller_runtime import (
    AdmissionRequest,
    Client,
    Denied,
    ForbiddenError,
    HubConverter,
    InvalidError,
    Manager,
    ManagerOptions,
    NotFoundError,
    Spoke,
    WebhookBuilder,
)
from controller_runtime.envtest import (
    ControlPlane,
    WebhookInstallation,
    WebhookInstallOptions,
    admission_webhook,
    configuration,
)
from controller_runtime.envtest.certs import CertificateAuthority
from controller_runtime.errors import ApiError
from controller_runtime.testing import eventually
from controller_runtime.webhook import AdmissionResult, WebhookServer
from controller_runtime.webhook.rotation import RotationPolicy, Step
from controller_runtime.webhook.selfmanaged import (
    CertificateReloader,
    CertificateRotator,
    SelfManagedCertificates,
)
from controller_runtime.webhook.trust import bundles_of
from kubeclient.config import ClusterConfig

pytestmark = pytest.mark.integration

GROUP = "webhooks.crpy.io"
V1, V2 = f"{GROUP}/v1", f"{GROUP}/v2"
CRD_NAME = f"widgets.{GROUP}"
VALIDATE = f"/validate-{GROUP.replace('.', '-')}-v2-widget"
MUTATE = f"/mutate-{GROUP.replace('.', '-')}-v2-widget"


def crd() -> dict[str, Any]:
    def version(name: str, storage: bool, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "served": True,
            "storage": storage,
            "schema": {
                "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                            "properties": spec,
                        }
                    },
                }
            },
        }

    common = {"size": {"type": "integer"}, "color": {"type": "string"}, "do": {"type": "string"}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                version(
                    "v1",
                    False,
                    {**common, "replicas": {"type": "integer"}, "mode": {"type": "string"}},
                ),
                version(
                    "v2",
                    True,
                    {
                        **common,
                        "replication": {
                            "type": "object",
                            "properties": {
                                "count": {"type": "integer"},
                                "synchronous": {"type": "boolean"},
                            },
                        },
                    },
                ),
            ],
        },
    }


# v1 spells replication as spec.replicas and spec.mode (sync/async); v2, the hub and the
# storage version, as spec.replication {count, synchronous}.
def v1_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    if "replicas" in spec or "mode" in spec:
        spec["replication"] = {
            "count": spec.pop("replicas", 1),
            "synchronous": spec.pop("mode", "async") == "sync",
        }
    return obj


def v2_to_v1(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    replication = spec.pop("replication", None)
    if replication is not None:
        spec["replicas"] = replication.get("count", 1)
        spec["mode"] = "sync" if replication.get("synchronous") else "async"
    return obj


class Defaults:
    async def default(self, request: AdmissionRequest, client: Client, obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {}).setdefault("color", "blue")


class Rules:
    def __init__(self) -> None:
        self.never = asyncio.Event()
        self.dry_runs: list[bool] = []

    async def validate_create(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        spec = obj.get("spec") or {}
        self.dry_runs.append(request.dry_run)
        if spec.get("do") == "raise":
            raise RuntimeError("the policy store is unreachable")
        if spec.get("do") == "hang":
            await self.never.wait()
        if spec.get("size", 0) > 10:
            raise Denied("a widget is at most 10 big", field="spec.size", code=422)
        policy = spec.get("policy")
        if policy is not None:
            try:
                await client.live.get("v1", "ConfigMap", name=policy, namespace=request.namespace)
            except NotFoundError:
                raise Denied(f"the policy {policy!r} does not exist", field="spec.policy") from None
        return ["widgets are experimental"] if spec.get("size") == 10 else []

    async def validate_update(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any], old: dict[str, Any]
    ) -> Sequence[str]:
        if obj["spec"].get("size", 0) < old["spec"].get("size", 0):
            raise Denied("a widget never shrinks", field="spec.size")
        return await self.validate_create(request, client, obj)

    async def validate_delete(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        if (obj["metadata"].get("labels") or {}).get("protected") == "true":
            raise Denied("this widget is protected")
        return []


def webhooks() -> WebhookInstallOptions:
    def hook(name: str, path: str, **options: Any) -> dict[str, Any]:
        return admission_webhook(
            name, path, api_groups=[GROUP], api_versions=["v2"], resources=["widgets"], **options
        )

    def selector(operator: str) -> dict[str, Any]:
        return {
            "matchExpressions": [{"key": "failure", "operator": operator, "values": ["ignore"]}]
        }

    failing = hook(
        f"vwidget.{GROUP}", VALIDATE, operations=["CREATE", "UPDATE", "DELETE"], timeout_seconds=5
    )
    failing["objectSelector"] = selector("NotIn")
    ignoring = hook(f"vwidget-ignore.{GROUP}", VALIDATE, failure_policy="Ignore", timeout_seconds=5)
    ignoring["objectSelector"] = selector("In")
    return WebhookInstallOptions(
        mutating=[configuration("Mutating", "widgets", [hook(f"mwidget.{GROUP}", MUTATE)])],
        validating=[configuration("Validating", "widgets", [failing, ignoring])],
        conversion_crds=[CRD_NAME],
    )


class Setup:
    def __init__(self, manager: Manager, rules: Rules, installation: WebhookInstallation) -> None:
        self.manager = manager
        self.rules = rules
        self.installation = installation

    @property
    def client(self) -> Client:
        return self.manager.client


def widget(namespace: str, api_version: str = V2, **spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", None)
    metadata: dict[str, Any] = {"name": f"w-{uuid.uuid4().hex[:8]}", "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": api_version, "kind": "Widget", "metadata": metadata, "spec": spec}


@pytest.fixture(scope="module")
async def setup(
    control_plane: ControlPlane,
    admin_config: ClusterConfig,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Setup]:
    crd_file = tmp_path_factory.mktemp("crd") / "widgets.yaml"
    crd_file.write_text(yaml.safe_dump(crd()))
    await asyncio.to_thread(control_plane.install_crds, [crd_file])
    installation = await asyncio.to_thread(webhooks().install, control_plane)
    rules = Rules()
    options = ManagerOptions(
        metrics_bind_address=None,
        health_probe_bind_address="127.0.0.1:0",
        webhook_server=installation.server(handler_timeout=1.0),
    )
    manager = Manager(admin_config, options)
    converter = HubConverter(hub=V2, spokes={V1: Spoke(to_hub=v1_to_v2, from_hub=v2_to_v1)})
    WebhookBuilder(manager).for_(V2, "Widget").with_defaulter(Defaults()).with_validator(
        rules
    ).with_converter(converter).complete()
    running = asyncio.create_task(manager.run())
    try:
        yield Setup(manager, rules, installation)
    finally:
        rules.never.set()
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await asyncio.to_thread(installation.uninstall, control_plane)
        await asyncio.to_thread(
            control_plane.kubectl, "delete", "crd", CRD_NAME, "--ignore-not-found"
        )


@pytest.fixture
async def active(setup: Setup, namespace: str) -> Setup:
    """The webhooks take effect a moment after their configurations are stored."""

    async def denied() -> None:
        with pytest.raises(ApiError, match="at most 10 big"):
            await setup.client.create(widget(namespace, size=11), dry_run=True)

    await eventually(denied, timeout=30)
    return setup


async def test_the_manager_is_ready_once_the_webhook_server_answers_tls(active: Setup) -> None:
    url = active.manager.health_url
    assert url is not None
    async with aiohttp.ClientSession() as session, session.get(f"{url}/readyz?verbose") as got:
        text = await got.text()
    assert "[+]webhook-server ok" in text, text


async def test_defaults_land_and_unknown_fields_survive(active: Setup, namespace: str) -> None:
    created = await active.client.create(widget(namespace, size=3, extra={"kept": [1, "two"]}))
    assert created["spec"]["color"] == "blue"
    assert created["spec"]["extra"] == {"kept": [1, "two"]}
    stored = await active.client.live.get(
        V2, "Widget", name=created["metadata"]["name"], namespace=namespace
    )
    assert stored["spec"] == {"size": 3, "color": "blue", "extra": {"kept": [1, "two"]}}


async def test_a_denial_reaches_the_client_with_its_message_and_field(
    active: Setup, namespace: str
) -> None:
    with pytest.raises(InvalidError) as caught:
        await active.client.create(widget(namespace, size=12))
    assert "a widget is at most 10 big" in caught.value.message
    assert f"vwidget.{GROUP}" in caught.value.message
    created = await active.client.create(widget(namespace, size=5))
    with pytest.raises(ForbiddenError, match="a widget never shrinks"):
        await active.client.patch(created, {"spec": {"size": 4}})


async def test_the_validator_reads_other_objects_through_the_client(
    active: Setup, namespace: str
) -> None:
    with pytest.raises(ForbiddenError, match="the policy 'gold' does not exist"):
        await active.client.create(widget(namespace, size=1, policy="gold"))
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gold", "namespace": namespace},
    }
    await active.client.create(config_map)
    await active.client.create(widget(namespace, size=1, policy="gold"))


async def test_dry_run_reaches_the_handler_and_deletes_are_validated(
    active: Setup, namespace: str
) -> None:
    before = len(active.rules.dry_runs)
    await active.client.create(widget(namespace, size=2), dry_run=True)
    assert active.rules.dry_runs[before:] == [True]
    protected = await active.client.create(widget(namespace, size=1, labels={"protected": "true"}))
    with pytest.raises(ForbiddenError, match="this widget is protected"):
        await active.client.delete(protected)


@pytest.mark.parametrize("what", ["raise", "hang"])
async def test_a_failing_handler_obeys_the_failure_policy(
    active: Setup, namespace: str, what: str
) -> None:
    with pytest.raises(ApiError) as caught:
        await active.client.create(widget(namespace, size=1, do=what))
    reason = "the policy store is unreachable" if what == "raise" else "ran over 1.0s"
    assert reason in caught.value.message, caught.value.message
    assert f'failed calling webhook "vwidget.{GROUP}"' in caught.value.message
    admitted = await active.client.create(
        widget(namespace, size=1, do=what, labels={"failure": "ignore"})
    )
    assert admitted["spec"]["do"] == what


async def test_conversion_both_ways_through_the_api_server(active: Setup, namespace: str) -> None:
    old_style = widget(namespace, V1, size=4, replicas=3, mode="sync", note="v1-only text")
    created = await active.client.create(old_style)
    name = created["metadata"]["name"]
    assert created["apiVersion"] == V1
    assert created["spec"] == {
        "size": 4,
        "replicas": 3,
        "mode": "sync",
        "note": "v1-only text",
        "color": "blue",
    }
    as_v2 = await active.client.live.get(V2, "Widget", name=name, namespace=namespace)
    assert as_v2["spec"]["replication"] == {"count": 3, "synchronous": True}
    assert as_v2["metadata"]["uid"] == created["metadata"]["uid"]
    new_style = widget(namespace, V2, size=2, replication={"count": 5, "synchronous": False})
    stored = await active.client.create(new_style)
    as_v1 = await active.client.live.get(
        V1, "Widget", name=stored["metadata"]["name"], namespace=namespace
    )
    assert as_v1["spec"] == {"size": 2, "color": "blue", "replicas": 5, "mode": "async"}


SPECS = st.fixed_dictionaries(
    {
        "size": st.integers(0, 10),
        "replicas": st.integers(0, 9),
        "mode": st.sampled_from(["sync", "async"]),
        "color": st.sampled_from(["red", "blue"]),
    },
    optional={"note": st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)},
)


@settings(
    max_examples=8,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    deadline=None,
)
@given(spec=SPECS)
async def test_every_field_round_trips_through_storage(
    active: Setup, namespace: str, spec: dict[str, Any]
) -> None:
    created = await active.client.create(widget(namespace, V1, **spec))
    name = created["metadata"]["name"]
    read_back = await active.client.live.get(V1, "Widget", name=name, namespace=namespace)
    assert read_back["spec"] == spec
    as_v2 = await active.client.live.get(V2, "Widget", name=name, namespace=namespace)
    assert v2_to_v1({"spec": dict(as_v2["spec"])})["spec"] == spec


def test_the_installed_configurations_point_at_the_local_server(setup: Setup) -> None:
    for document in setup.installation.configurations:
        for webhook in document["webhooks"]:
            url = webhook["clientConfig"]["url"]
            assert url.startswith(f"https://127.0.0.1:{setup.installation.port}/")
            assert "service" not in webhook["clientConfig"]
    assert Path(setup.installation.cert_dir, "tls.crt").exists()


async def test_self_managed_certificates_rotate_while_requests_flow(
    control_plane: ControlPlane, admin_config: ClusterConfig, setup: Setup, namespace: str
) -> None:
    """A second manager on its own configuration, with certificates it manages itself and a
    CA valid 40 s: while creates flow, the CA is replaced (added, switched to, the old one
    dropped) and not one admission fails."""
    options = WebhookInstallOptions(
        validating=[
            configuration(
                "Validating",
                "widgets-selfmanaged",
                [
                    admission_webhook(
                        f"vwidget-selfmanaged.{GROUP}",
                        "/validate-selfmanaged",
                        api_groups=[GROUP],
                        api_versions=["v2"],
                        resources=["widgets"],
                    )
                ],
            )
        ]
    )
    installation = await asyncio.to_thread(options.install, control_plane)
    server = installation.server()
    manager = Manager(
        admin_config,
        ManagerOptions(
            metrics_bind_address=None, health_probe_bind_address=None, webhook_server=server
        ),
    )
    seen: list[str] = []

    async def allow(request: AdmissionRequest) -> AdmissionResult:
        seen.append(request.uid)
        return AdmissionResult(allowed=True)

    server.register("/validate-selfmanaged", allow)
    policy = RotationPolicy(
        ca_validity=40.0,
        ca_renew_before=20.0,
        serving_validity=30.0,
        serving_renew_before=10.0,
        overlap=3.0,
    )
    rotator, _ = SelfManagedCertificates(
        secret=("webhook-certs", namespace),
        service=("webhook-service", "system"),
        validating_configurations=["widgets-selfmanaged"],
        extra_hosts=["127.0.0.1"],
        policy=policy,
        reload_interval=0.5,
        check_interval=0.5,
    ).install(manager)
    running = asyncio.create_task(manager.run())
    try:
        # The configuration names the envtest CA until the rotator injects its own.
        await eventually(server.ready, timeout=30)
        await eventually(lambda: len(seen) > 0 or _probe(setup, namespace, seen), timeout=30)
        failures: list[str] = []
        created = 0
        while Step.DROP_OLD not in rotator.steps:
            try:
                await setup.client.create(widget(namespace, size=1), dry_run=True)
                created += 1
            except ApiError as err:
                failures.append(err.message)
            assert len(failures) == 0, failures
            await asyncio.sleep(0.05)  # a steady flow of requests, not a synchronisation
        assert rotator.steps[:1] == [Step.CREATE]
        assert Step.ADD_CA in rotator.steps and Step.SWITCH in rotator.steps
        assert created > 50 and not failures
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await asyncio.to_thread(installation.uninstall, control_plane)


async def _probe(setup: Setup, namespace: str, seen: list[str]) -> bool:
    with contextlib.suppress(ApiError):
        await setup.client.create(widget(namespace, size=1), dry_run=True)
    return len(seen) > 0


# -- self-managed certificates: every target, bootstrap, readiness -----------------------------

GADGETS = f"gadgets.{GROUP}"
GADGET_MUTATE = f"/mutate-{GROUP.replace('.', '-')}-v2-gadget"


def gadget_crd() -> dict[str, Any]:
    """The Widget CRD's schema under another name: a conversion of this test's own."""
    document = crd()
    document["metadata"]["name"] = GADGETS
    document["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"}
    return document


@pytest.fixture
async def gadgets(
    control_plane: ControlPlane, tmp_path: Path
) -> AsyncIterator[WebhookInstallation]:
    """The Gadget CRD with its conversion, and a MutatingWebhookConfiguration for it, pointed
    at a local port with envtest's CA as caBundle (which the rotator must replace)."""
    path = tmp_path / "gadgets.yaml"
    path.write_text(yaml.safe_dump(gadget_crd()))
    await asyncio.to_thread(control_plane.install_crds, [path])
    hook = admission_webhook(
        f"mgadget.{GROUP}",
        GADGET_MUTATE,
        api_groups=[GROUP],
        api_versions=["v2"],
        resources=["gadgets"],
        timeout_seconds=5,
    )
    options = WebhookInstallOptions(
        mutating=[configuration("Mutating", "gadgets-selfmanaged", [hook])],
        conversion_crds=[GADGETS],
    )
    installation = await asyncio.to_thread(options.install, control_plane)
    try:
        yield installation
    finally:
        await asyncio.to_thread(installation.uninstall, control_plane)
        await asyncio.to_thread(
            control_plane.kubectl, "delete", "crd", GADGETS, "--ignore-not-found"
        )


def _bundle(document: dict[str, Any]) -> bytes:
    (only,) = set(bundles_of(document))
    return only


async def test_self_managed_certificates_reach_mutating_configurations_and_crd_conversion(
    admin_config: ClusterConfig, gadgets: WebhookInstallation, namespace: str
) -> None:
    """The rotator writes its CA into a MutatingWebhookConfiguration and a CRD's conversion
    (the API server then calls both with the rotator's certificate); readiness follows the
    bundles the targets hold: a caBundle overwritten with another CA makes the replica not
    ready until the rotator writes its own back."""
    server = gadgets.server()
    manager = Manager(
        admin_config,
        ManagerOptions(
            metrics_bind_address=None, health_probe_bind_address=None, webhook_server=server
        ),
    )
    converter = HubConverter(hub=V2, spokes={V1: Spoke(to_hub=v1_to_v2, from_hub=v2_to_v1)})
    WebhookBuilder(manager).for_(V2, "Gadget").with_defaulter(Defaults()).with_converter(
        converter
    ).complete()
    rotator, _ = SelfManagedCertificates(
        secret=("gadget-webhook-certs", namespace),
        service=("webhook-service", "system"),
        mutating_configurations=["gadgets-selfmanaged"],
        conversion_crds=[GADGETS],
        extra_hosts=["127.0.0.1"],
        reload_interval=0.5,
        check_interval=600.0,  # only the first pass and pokes: the test decides when
    ).install(manager)
    client = manager.client
    running = asyncio.create_task(manager.run())
    try:
        await eventually(server.ready, timeout=30)
        secret = await client.live.get(
            "v1", "Secret", name="gadget-webhook-certs", namespace=namespace
        )
        ca = base64.b64decode(secret["data"]["ca.crt"])
        assert ca != gadgets.ca_pem, "the rotator's own CA, not envtest's"
        mutating = await client.live.get(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            name="gadgets-selfmanaged",
        )
        definition = await client.live.get(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", name=GADGETS
        )
        assert _bundle(mutating) == ca
        assert _bundle(definition) == ca

        # The API server trusts the rotator's certificate through both.
        async def defaulted() -> dict[str, Any]:
            body = {
                "apiVersion": V2,
                "kind": "Gadget",
                "metadata": {"name": f"g-{uuid.uuid4().hex[:8]}", "namespace": namespace},
                "spec": {"size": 1, "replication": {"count": 3, "synchronous": True}},
            }
            created = await client.create(body)
            assert created["spec"]["color"] == "blue", "the mutating webhook ran"
            return created

        created = await eventually(defaulted, timeout=30)
        old = await client.live.get(
            V1, "Gadget", name=created["metadata"]["name"], namespace=namespace
        )
        assert old["spec"]["replicas"] == 3 and old["spec"]["mode"] == "sync", "converted"

        # Someone overwrites the conversion's caBundle: not ready; the rotator restores it.
        stranger = CertificateAuthority("stranger").cert_pem
        definition["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] = base64.b64encode(
            stranger
        ).decode()
        await client.update(definition)

        async def not_ready() -> bool:
            return not await server.ready()

        await eventually(not_ready, timeout=30)
        rotator.poke()
        await eventually(server.ready, timeout=30)
        restored = await client.live.get(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", name=GADGETS
        )
        assert _bundle(restored) == ca
    finally:
        manager.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_any_replica_creates_the_certificates_only_when_there_are_none_anywhere(
    admin_config: ClusterConfig, namespace: str
) -> None:
    """The bootstrap a replica does before any leader exists (module docstring of
    selfmanaged): with no Secret and no caBundle anywhere it creates both; with a Secret, or
    with a caBundle in some target, it does nothing."""
    name = f"bootstrap-{uuid.uuid4().hex[:6]}"
    manager = Manager(admin_config, ManagerOptions(metrics_bind_address=None))
    client = manager.client
    hook = admission_webhook(
        f"vbootstrap.{GROUP}",
        "/validate-bootstrap",
        api_groups=[GROUP],
        api_versions=["v2"],
        resources=["widgets"],
        failure_policy="Ignore",
    )
    hook["clientConfig"] = {"url": "https://127.0.0.1:9/validate-bootstrap"}  # no caBundle
    await client.create(configuration("Validating", name, [hook]))
    config = SelfManagedCertificates(
        secret=(name, namespace),
        service=("webhook-service", "system"),
        validating_configurations=[name, f"{name}-missing"],  # a missing target counts as empty
    )
    rotator = CertificateRotator(config, client)
    group = "admissionregistration.k8s.io/v1"
    try:
        assert await rotator.bootstrap()
        secret = await client.live.get("v1", "Secret", name=name, namespace=namespace)
        ca = base64.b64decode(secret["data"]["ca.crt"])
        written = await client.live.get(group, "ValidatingWebhookConfiguration", name=name)
        assert _bundle(written) == ca
        assert not await rotator.bootstrap(), "there is a Secret: the leader's job now"
        # A caBundle emptied (or a first injection lost to another writer): a replica that
        # is not ready fills it from the Secret, leader or not.
        written["webhooks"][0]["clientConfig"]["caBundle"] = ""
        await client.update(written)
        server = WebhookServer(cert_dir=None)  # not listening: not ready
        reloader = CertificateReloader(config, client, server, bootstrap=rotator)
        await reloader._once()
        refilled = await client.live.get(group, "ValidatingWebhookConfiguration", name=name)
        assert _bundle(refilled) == ca
        assert server.tls.pair is not None, "and serves the Secret's certificate"
        await client.delete(secret)
        assert not await rotator.bootstrap(), "a caBundle is in place: never replaced"
        with pytest.raises(NotFoundError):
            await client.live.get("v1", "Secret", name=name, namespace=namespace)
        unchanged = await client.live.get(group, "ValidatingWebhookConfiguration", name=name)
        assert _bundle(unchanged) == ca
    finally:
        await client.delete(
            {
                "apiVersion": group,
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name},
            }
        )
        await manager.close()


async def test_a_handler_never_runs_past_the_configurations_timeout_seconds(
    control_plane: ControlPlane, namespace: str, admin_config: ClusterConfig
) -> None:
    """``timeoutSeconds: 2`` and a server whose own handler_timeout is 9 s: a hanging handler
    is cut at the time the API server allows (its ?timeout), so the request is refused with
    the server's reason, not with the API server's timeout."""
    hook = admission_webhook(
        f"vslow.{GROUP}",
        "/validate-slow",
        api_groups=[GROUP],
        api_versions=["v2"],
        resources=["widgets"],
        timeout_seconds=2,
    )
    hook["objectSelector"] = {"matchLabels": {"slow": "true"}}
    options = WebhookInstallOptions(
        validating=[configuration("Validating", "widgets-slow", [hook])]
    )
    installation = await asyncio.to_thread(options.install, control_plane)
    server = installation.server()
    assert server.handler_timeout == 9.0
    never = asyncio.Event()

    async def hang(request: AdmissionRequest) -> AdmissionResult:
        await never.wait()
        return AdmissionResult(allowed=True)

    server.register("/validate-slow", hang)
    await server.start()
    manager = Manager(admin_config, ManagerOptions(metrics_bind_address=None))
    try:

        async def refused_with_the_servers_reason() -> None:
            with pytest.raises(ApiError) as caught:
                await manager.client.create(
                    widget(namespace, size=1, labels={"slow": "true"}), dry_run=True
                )
            assert "the webhook handler at /validate-slow ran over 1.0s" in caught.value.message, (
                caught.value.message
            )

        await eventually(refused_with_the_servers_reason, timeout=30)
    finally:
        never.set()
        await server.stop(0)
        await manager.close()
        await asyncio.to_thread(installation.uninstall, control_plane)
