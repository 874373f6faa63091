"""Reading the caBundle values back from webhook configurations and CRDs (the parts without an
API server; tests/integration/test_webhooks.py reads them from a real one)."""

from __future__ import annotations

import base64

from controller_runtime.webhook.trust import InjectedCABundles, bundles_of, client_configs


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_webhook_of_a_configuration_counts_and_an_empty_bundle_means_the_system_roots() -> (
    None
):
    configuration = {
        "kind": "ValidatingWebhookConfiguration",
        "webhooks": [
            {"name": "a", "clientConfig": {"caBundle": b64(b"CA-1")}},
            {"name": "b", "clientConfig": {"service": {"name": "s"}}},
            {"name": "c"},
        ],
    }
    assert bundles_of(configuration) == [b"CA-1", b"", b""]
    # The clientConfigs are the object's own: the rotator writes through them.
    for config in client_configs(configuration):
        config["caBundle"] = b64(b"CA-2")
    assert bundles_of(configuration) == [b"CA-2"] * 3


def test_a_crd_counts_only_its_conversion_webhook() -> None:
    crd = {
        "kind": "CustomResourceDefinition",
        "spec": {
            "conversion": {
                "strategy": "Webhook",
                "webhook": {"clientConfig": {"caBundle": b64(b"CA")}},
            }
        },
    }
    assert bundles_of(crd) == [b"CA"]
    assert bundles_of({"kind": "CustomResourceDefinition", "spec": {}}) == []
    assert client_configs({"kind": "CustomResourceDefinition", "spec": {}}) == []


def test_a_bundle_that_is_not_base64_trusts_nothing() -> None:
    configuration = {
        "kind": "MutatingWebhookConfiguration",
        "webhooks": [{"clientConfig": {"caBundle": "%%%"}}],
    }
    assert bundles_of(configuration) == [b"?"]


def test_the_targets_are_named_by_kind() -> None:
    bundles = InjectedCABundles(
        mutating_configurations=["m"], validating_configurations=["v"], conversion_crds=["c.x"]
    )
    assert [str(t) for t in bundles.targets] == [
        "MutatingWebhookConfiguration m",
        "ValidatingWebhookConfiguration v",
        "CustomResourceDefinition c.x",
    ]
