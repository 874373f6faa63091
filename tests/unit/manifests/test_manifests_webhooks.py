"""The webhooks as ``manifests/`` install them, offline: the Deployment serves them with
self-managed certificates, each configuration's webhooks reach a path the operator serves
through the admission Service, the failure policies are the ones docs/deploy.md gives, every
``timeoutSeconds`` leaves the handler's time room, the names the operator's flags default to
are the names the manifests use (objects and RBAC ``resourceNames``), and the grace period
covers the shutdown delay. (On an API server: tests/integration/test_manifests.py; on a
node: tests/e2e/test_webhooks.py.)"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from controller_runtime.client import Client
from controller_runtime.webhook import WebhookServer
from controllers.cli import KNOWN_CONTROLLERS, OperatorSettings, settings_from
from controllers.postgres.webhooks import setup_webhooks
from tests.unit.manifests.test_manifests_schema import (
    MANIFESTS,
    Doc,
    container,
    container_port,
    installed,
    load_documents,
    only,
    pod_spec,
    service,
)

FAIL_ONLY = {"vpostgresinstance.postgres.crpy.io"}
"""The webhooks whose failure refuses the request (docs/deploy.md, "Admission webhooks")."""


def settings() -> OperatorSettings:
    return settings_from(container()["args"])


def configurations() -> list[Doc]:
    return [d for d in installed() if d["kind"].endswith("WebhookConfiguration")]


def webhooks() -> list[tuple[str, dict[str, Any]]]:
    return [(c["kind"], w) for c in configurations() for w in c["webhooks"]]


class _Cache:
    async def watch(self, *args: object, **kwargs: object) -> None:
        pass  # no API server here: only the paths matter


class _Host:
    def __init__(self) -> None:
        self.webhook_server = WebhookServer(cert_dir=None)
        self.client = cast(Client, None)
        self.cache = _Cache()


def served_paths() -> set[str]:
    host = _Host()
    asyncio.run(setup_webhooks(host, KNOWN_CONTROLLERS))  # type: ignore[arg-type]
    return set(host.webhook_server.paths)


def test_the_deployment_serves_the_webhooks_with_self_managed_certificates() -> None:
    s = settings()
    assert s.webhook_port == container_port("webhook") == 9443
    assert s.webhook_certificates == "self-managed"
    assert s.webhook_namespace is None, "the Pod's namespace"


def test_every_webhook_reaches_a_path_the_operator_serves_through_the_admission_service() -> None:
    paths = served_paths()
    namespace = only("Namespace")["metadata"]["name"]
    seen = set()
    for kind, webhook in webhooks():
        target = webhook["clientConfig"]["service"]
        assert (target["name"], target["namespace"]) == ("crpy-operator-webhook", namespace)
        assert target.get("port", 443) == service("crpy-operator-webhook")["ports"][0]["port"]
        assert target["path"] in paths, f"{webhook['name']}: nothing is served at {target['path']}"
        assert "caBundle" not in webhook["clientConfig"], "the operator writes it (kubectl apply "
        "would reset an injected one to what the file says)"
        mutating = kind == "MutatingWebhookConfiguration"
        assert target["path"].startswith("/mutate-" if mutating else "/validate-")
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["sideEffects"] == "None"
        assert webhook["matchPolicy"] == "Equivalent"
        for rule in webhook["rules"]:
            assert rule["apiVersions"] == ["v1beta1"], (
                "the storage version; Equivalent does the rest"
            )
            assert "DELETE" not in rule["operations"], "deletes are never refused (finalizers)"
        seen.add(target["path"])
    assert seen == paths - {"/convert"}, "every admission path the operator serves is configured"


def test_failure_policies_are_fail_only_where_safety_needs_it() -> None:
    for _, webhook in webhooks():
        expected = "Fail" if webhook["name"] in FAIL_ONLY else "Ignore"
        assert webhook["failurePolicy"] == expected, webhook["name"]


def test_the_handlers_time_is_under_every_timeout_seconds() -> None:
    """A review slower than the handler's time is answered with a 500 and its reason; that
    only reaches the API server if the API server still waits (timeoutSeconds)."""
    handler = settings().webhook_handler_timeout
    for _, webhook in webhooks():
        assert webhook["timeoutSeconds"] >= handler + 1, webhook["name"]


def test_the_names_the_flags_default_to_are_the_manifests_names() -> None:
    s = settings()
    assert {c["metadata"]["name"] for c in configurations()} == {s.webhook_configuration}
    assert sorted(c["kind"] for c in configurations()) == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]
    assert [service(name) for name in s.webhook_services]  # each exists
    crds = {
        d["metadata"]["name"]: d for d in installed() if d["kind"] == "CustomResourceDefinition"
    }
    for name in s.webhook_conversion_crds:
        conversion = crds[name]["spec"]["conversion"]
        assert conversion["strategy"] == "Webhook"
        target = conversion["webhook"]["clientConfig"]["service"]
        assert target["name"] in s.webhook_services
        assert target["path"] == "/convert"
    converting = {n for n, d in crds.items() if d["spec"].get("conversion", {}).get("webhook")}
    assert converting == set(s.webhook_conversion_crds)


def test_the_rbac_names_exactly_the_webhook_objects() -> None:
    s = settings()
    docs = installed()
    cluster_role = only("ClusterRole", docs)
    named = {
        resource: (tuple(rule["resourceNames"]), tuple(rule["verbs"]))
        for rule in cluster_role["rules"]
        if rule.get("resourceNames")
        for resource in rule["resources"]
    }
    assert named == {
        "mutatingwebhookconfigurations": ((s.webhook_configuration,), ("get", "update")),
        "validatingwebhookconfigurations": ((s.webhook_configuration,), ("get", "update")),
        "customresourcedefinitions": (s.webhook_conversion_crds, ("get", "update")),
    }
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "crpy-operator"]
    (role,) = roles
    secrets = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert {(tuple(r.get("resourceNames", ())), tuple(r["verbs"])) for r in secrets} == {
        ((s.webhook_secret,), ("get", "update")),
        ((), ("create",)),
    }
    (binding,) = [
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "crpy-operator"
    ]
    assert binding["roleRef"]["name"] == "crpy-operator"


def test_the_grace_period_covers_the_drain_and_the_webhooks_shutdown() -> None:
    s = settings()
    grace = pod_spec()["terminationGracePeriodSeconds"]
    # The shutdown delay runs from the SIGTERM, beside the reconciles' drain; then reviews in
    # flight get up to the handler's time.
    longest = max(s.graceful_shutdown_timeout, s.webhook_shutdown_delay) + s.webhook_handler_timeout
    assert grace >= longest + 5
    assert s.webhook_shutdown_delay >= 2, "kube-proxy takes a second or two to drop the Pod"


def test_the_configurations_file_is_installed_once() -> None:
    docs = load_documents(MANIFESTS / "webhook-configurations.yaml")
    assert [d["kind"] for d in docs] == [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ]
