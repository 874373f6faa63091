"""WebhookInstallOptions reads a kustomize directory such as a project's config/webhook: the
webhook configurations and the CRDs that convert through a webhook, nothing else."""

from __future__ import annotations

from pathlib import Path

import yaml

from controller_runtime.envtest import WebhookInstallOptions, admission_webhook, configuration


def crd(name: str, strategy: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {"conversion": {"strategy": strategy}},
    }


def test_configurations_and_converting_crds_are_found_and_the_rest_ignored(
    tmp_path: Path,
) -> None:
    hook = admission_webhook(
        "vwidget.shop.example.com",
        "/validate",
        api_groups=["shop.example.com"],
        api_versions=["v1"],
        resources=["widgets"],
    )
    (tmp_path / "manifests.yaml").write_text(
        yaml.safe_dump_all([configuration("Validating", "v", [hook]), {"kind": "Service"}])
    )
    (tmp_path / "manager_patch.yaml").write_text(yaml.safe_dump([{"op": "add", "path": "/x"}]))
    (tmp_path / "conversion_widgets.yaml").write_text(
        yaml.safe_dump(crd("widgets.shop.example.com", "Webhook"))
    )
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(crd("others.shop.example.com", "None")))
    (tmp_path / "kustomization.yaml").write_text("kind: Component\n")
    (tmp_path / "notes.txt").write_text("kind: ValidatingWebhookConfiguration\n")
    options = WebhookInstallOptions(paths=[tmp_path])
    configurations, crds = options._load_paths()
    assert [c["metadata"]["name"] for c in configurations] == ["v"]
    assert crds == ["widgets.shop.example.com"]
    assert not options.empty


def test_nothing_to_install(tmp_path: Path) -> None:
    assert WebhookInstallOptions().empty
    (tmp_path / "service.yaml").write_text(yaml.safe_dump({"kind": "Service"}))
    assert WebhookInstallOptions(paths=[tmp_path]).empty
    assert not WebhookInstallOptions(conversion_crds=["widgets.shop.example.com"]).empty
