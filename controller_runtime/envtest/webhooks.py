"""Webhooks on the local control plane: configurations and CRD conversion pointed at a
webhook server in the test process (controller-runtime's ``WebhookInstallOptions``).

::

    install = WebhookInstallOptions(
        validating=[configuration("Validating", "widgets", [admission_webhook(...)])],
        conversion_crds=["widgets.shop.example.com"],
    ).install(control_plane)
    server = install.server()            # a WebhookServer on the port and certificate
    ...                                  # register handlers, start it, run the test
    install.uninstall(control_plane)

:meth:`WebhookInstallOptions.install` generates a CA and a serving certificate for
``127.0.0.1`` and ``localhost`` in a temporary directory, picks a free loopback port, and
rewrites every webhook's ``clientConfig`` (a ``service`` reference, as in a manifest) to
``url: https://127.0.0.1:<port>/<the service's path>`` with the CA as ``caBundle``; each CRD
named in ``conversion_crds`` gets a ``Webhook`` conversion at ``/convert`` on the same server.
It returns once the API server serves the configurations back (within ``max_time``, 10 s).

The API server starts calling a webhook a moment after its configuration is stored (its
admission plugin watches the configurations): a test that needs the first request to go
through the webhook waits for it (e.g. with ``eventually``), as it would in a cluster.
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import socket
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from controller_runtime.envtest.certs import CertificateAuthority

if TYPE_CHECKING:
    from controller_runtime.envtest.controlplane import ControlPlane
    from controller_runtime.webhook import WebhookServer

__all__ = [
    "WebhookInstallOptions",
    "WebhookInstallation",
    "admission_webhook",
    "configuration",
]

ADMISSION_GROUP = "admissionregistration.k8s.io/v1"


def admission_webhook(
    name: str,
    path: str,
    *,
    api_groups: Sequence[str],
    api_versions: Sequence[str],
    resources: Sequence[str],
    operations: Sequence[str] = ("CREATE", "UPDATE"),
    failure_policy: str = "Fail",
    timeout_seconds: int = 10,
    side_effects: str = "None",
    service: tuple[str, str] = ("webhook-service", "system"),
) -> dict[str, Any]:
    """One webhook entry of a configuration, as a manifest writes it: ``clientConfig`` names
    a Service (``service`` is its name and namespace) and ``path``. ``name`` must be a
    qualified name (``vwidget.shop.example.com``)."""
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": side_effects,
        "failurePolicy": failure_policy,
        "timeoutSeconds": timeout_seconds,
        "clientConfig": {"service": {"name": service[0], "namespace": service[1], "path": path}},
        "rules": [
            {
                "apiGroups": list(api_groups),
                "apiVersions": list(api_versions),
                "resources": list(resources),
                "operations": list(operations),
                "scope": "*",
            }
        ],
    }


def configuration(kind: str, name: str, webhooks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A ``ValidatingWebhookConfiguration`` (``kind="Validating"``) or
    ``MutatingWebhookConfiguration`` (``"Mutating"``) named ``name``."""
    if kind not in ("Validating", "Mutating"):
        raise ValueError(f"kind is Validating or Mutating, got {kind!r}")
    return {
        "apiVersion": ADMISSION_GROUP,
        "kind": f"{kind}WebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [copy.deepcopy(dict(w)) for w in webhooks],
    }


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class WebhookInstallOptions:
    """What to install; see the module docstring. ``paths`` are YAML files (or directories
    of them, ``*.yaml``): the webhook configurations among their documents are added to
    ``mutating`` and ``validating``, and every ``CustomResourceDefinition`` document whose
    ``spec.conversion.strategy`` is ``Webhook`` (a CRD, or a kustomize patch of one) adds its
    name to ``conversion_crds``; other documents are ignored, so a kustomize directory such
    as a project's ``config/webhook`` can be given whole. Defaults: nothing to install.

    ``local_serving_host`` (``127.0.0.1``) and ``local_serving_port`` (0: a free port picked
    at install) are where the API server is told to call; ``max_time`` (10 s) and
    ``poll_interval`` (0.1 s) bound the wait for the configurations to be served.
    """

    mutating: list[dict[str, Any]] = field(default_factory=list)
    validating: list[dict[str, Any]] = field(default_factory=list)
    conversion_crds: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    local_serving_host: str = "127.0.0.1"
    local_serving_port: int = 0
    max_time: float = 10.0
    poll_interval: float = 0.1

    @property
    def empty(self) -> bool:
        """Whether there is nothing to install (no configuration, no CRD to convert), the
        documents under ``paths`` included."""
        configurations, crds = self._load_paths()
        return not any((self.mutating, self.validating, self.conversion_crds, configurations, crds))

    def install(self, plane: ControlPlane) -> WebhookInstallation:
        """Generate the CA and serving pair, point the configurations and the CRDs'
        conversion at the local server, apply them, and wait until they are served."""
        configurations, found_crds = self._load_paths()
        documents = [*self.mutating, *self.validating, *configurations]
        conversion_crds = list(dict.fromkeys([*self.conversion_crds, *found_crds]))
        host = self.local_serving_host
        port = self.local_serving_port or _free_port(host)
        ca = CertificateAuthority("controller-runtime-py-envtest-webhook-ca")
        cert_dir = Path(tempfile.mkdtemp(prefix="crpy-envtest-webhook-"))
        serving = ca.issue_serving([host, "localhost"])
        serving.write(cert_dir, "tls")
        (cert_dir / "ca.crt").write_bytes(ca.cert_pem)
        base = f"https://{host}:{port}"
        ca_bundle = base64.b64encode(ca.cert_pem).decode()
        installed = [_pointed_at(document, base, ca_bundle) for document in documents]
        installation = WebhookInstallation(
            host=host,
            port=port,
            cert_dir=cert_dir,
            ca_pem=ca.cert_pem,
            configurations=installed,
            conversion_crds=conversion_crds,
        )
        try:
            if installed:
                manifest = cert_dir / "webhook-configurations.yaml"
                manifest.write_text(yaml.safe_dump_all(installed))
                plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
            for crd in conversion_crds:
                conversion = {
                    "strategy": "Webhook",
                    "webhook": {
                        "conversionReviewVersions": ["v1"],
                        "clientConfig": {"url": f"{base}/convert", "caBundle": ca_bundle},
                    },
                }
                patch = json.dumps({"spec": {"conversion": conversion}})
                plane.kubectl("patch", "crd", crd, "--type=merge", "-p", patch)
            self._wait_served(plane, installation)
        except BaseException:
            installation.uninstall(plane)
            raise
        return installation

    def _load_paths(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The webhook configurations and the names of the CRDs converting through a webhook
        in the documents under ``paths``."""
        files: list[Path] = []
        for path in self.paths:
            files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        configurations: list[dict[str, Any]] = []
        crds: list[str] = []
        for file in files:
            for document in yaml.safe_load_all(file.read_text()):
                if not isinstance(document, dict):
                    continue  # a JSON patch (a list), an empty document
                kind = str(document.get("kind", ""))
                if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                    configurations.append(document)
                elif kind == "CustomResourceDefinition" and _converts_by_webhook(document):
                    crds.append(str(document["metadata"]["name"]))
        return configurations, crds

    def _wait_served(self, plane: ControlPlane, installation: WebhookInstallation) -> None:
        deadline = time.monotonic() + self.max_time
        wanted = [
            (_resource_of(d["kind"]), d["metadata"]["name"]) for d in installation.configurations
        ]
        for resource, name in wanted:
            while not plane.kubectl("get", resource, name, "-o", "name", check=False).strip():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{resource}/{name} is not served after {self.max_time}s")
                time.sleep(self.poll_interval)


def _converts_by_webhook(crd: Mapping[str, Any]) -> bool:
    spec = crd.get("spec")
    conversion = spec.get("conversion") if isinstance(spec, dict) else None
    return isinstance(conversion, dict) and conversion.get("strategy") == "Webhook"


def _resource_of(kind: str) -> str:
    return f"{kind.lower()}s.admissionregistration.k8s.io"


def _pointed_at(document: Mapping[str, Any], base: str, ca_bundle: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(document))
    for webhook in out.get("webhooks") or []:
        client = webhook.setdefault("clientConfig", {})
        service = client.pop("service", None) or {}
        # A URL already there keeps its path; the host is always the local server's.
        path = service.get("path") or urllib.parse.urlsplit(client.get("url") or "").path
        client["url"] = f"{base}{path}"
        client["caBundle"] = ca_bundle
    return out


@dataclass
class WebhookInstallation:
    """What :meth:`WebhookInstallOptions.install` installed: where the server must listen
    (``host``, ``port``, the pair in ``cert_dir``), and the CA the API server trusts."""

    host: str
    port: int
    cert_dir: Path
    ca_pem: bytes
    configurations: list[dict[str, Any]]
    conversion_crds: list[str]

    def server(self, **options: Any) -> WebhookServer:
        """A :class:`~controller_runtime.webhook.WebhookServer` on this host, port and
        certificate (more options as keywords)."""
        from controller_runtime.webhook import WebhookServer  # noqa: PLC0415

        return WebhookServer(host=self.host, port=self.port, cert_dir=self.cert_dir, **options)

    def uninstall(self, plane: ControlPlane) -> None:
        """Delete the configurations, put the CRDs' conversion back to ``None``, remove the
        certificate directory. Safe to call twice."""
        for document in self.configurations:
            plane.kubectl(
                "delete",
                _resource_of(document["kind"]),
                document["metadata"]["name"],
                "--ignore-not-found",
                check=False,
            )
        for crd in self.conversion_crds:
            patch = json.dumps({"spec": {"conversion": {"strategy": "None", "webhook": None}}})
            plane.kubectl("patch", "crd", crd, "--type=merge", "-p", patch, check=False)
        shutil.rmtree(self.cert_dir, ignore_errors=True)
