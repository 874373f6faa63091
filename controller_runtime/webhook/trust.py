"""What the API server trusts: the ``caBundle`` of every webhook configuration and CRD
conversion that points at this server, read back from the API, for the server's readiness.

A replica is ready to take reviews only when the API server would accept its certificate.
The API server checks the served certificate against the ``caBundle`` of the configuration
(or the CRD's conversion) it is calling through, and against the system's roots when that
``caBundle`` is empty. A certificate directory's ``ca.crt`` or a Secret's bundle says what
*should* be injected; only the targets themselves say what *is*: a CA injector that has not
run yet, or a bundle someone overwrote, shows there and nowhere else.

::

    InjectedCABundles(
        validating_configurations=["widgets"],
        conversion_crds=["widgets.shop.example.com"],
    ).install(manager)

:meth:`InjectedCABundles.install` adds a :class:`CABundleReader` (every replica) that reads
each named target with a live ``get`` and hands the bundles to the server
(:attr:`~controller_runtime.webhook.WebhookServer.injected_bundles`): its readiness then
requires a TLS handshake verified by *every* one of them (each webhook of each configuration,
each CRD's conversion). It reads every ``interval`` (10 s), and every ``retry_interval``
(1 s) while the server is not ready, so a replica turns ready about a second after the
bundle lands. A target that cannot be read keeps its last known bundle; one that was never
read, or does not exist, keeps the server not ready (and is logged). RBAC: ``get`` on each
named configuration and CRD (``resourceNames``).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller_runtime.webhook._loop import Loop

if TYPE_CHECKING:
    from controller_runtime.client import Client
    from controller_runtime.manager import Manager
    from controller_runtime.webhook.server import WebhookServer

__all__ = ["CABundleReader", "InjectedCABundles", "Target", "bundles_of"]

log = logging.getLogger(__name__)

ADMISSION = "admissionregistration.k8s.io/v1"
CRD_API = "apiextensions.k8s.io/v1"


@dataclass(frozen=True)
class Target:
    """Something that carries a ``caBundle`` for this server: a webhook configuration
    (``kind`` ``MutatingWebhookConfiguration`` or ``ValidatingWebhookConfiguration``) or a
    ``CustomResourceDefinition`` (its conversion webhook)."""

    api_version: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def targets(
    mutating: Sequence[str], validating: Sequence[str], crds: Sequence[str]
) -> list[Target]:
    return [
        *(Target(ADMISSION, "MutatingWebhookConfiguration", n) for n in mutating),
        *(Target(ADMISSION, "ValidatingWebhookConfiguration", n) for n in validating),
        *(Target(CRD_API, "CustomResourceDefinition", n) for n in crds),
    ]


def client_configs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``clientConfig`` of every webhook of a configuration, or of a CRD's conversion
    webhook (none when the CRD converts without a webhook). The dicts are the object's own:
    changing one changes the object."""
    if obj.get("kind") == "CustomResourceDefinition":
        webhook = ((obj.get("spec") or {}).get("conversion") or {}).get("webhook")
        if not isinstance(webhook, dict):
            return []
        return [webhook.setdefault("clientConfig", {})]
    return [w.setdefault("clientConfig", {}) for w in obj.get("webhooks") or []]


def _decoded(value: object) -> bytes:
    if not isinstance(value, str) or not value:
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return b"?"  # not base64: trusts nothing (the API server refuses such an object)


def bundles_of(obj: dict[str, Any]) -> list[bytes]:
    """Each ``caBundle`` of ``obj`` (decoded; ``b""`` where empty: the system's roots)."""
    return [_decoded(config.get("caBundle")) for config in client_configs(obj)]


@dataclass(frozen=True)
class InjectedCABundles:
    """Readiness against the ``caBundle`` values the API server uses; see the module docstring.
    The targets are named like :class:`~controller_runtime.webhook.SelfManagedCertificates`'
    (which installs this itself)."""

    mutating_configurations: Sequence[str] = ()
    validating_configurations: Sequence[str] = ()
    conversion_crds: Sequence[str] = ()
    interval: float = 10.0
    retry_interval: float = 1.0

    @property
    def targets(self) -> list[Target]:
        return targets(
            self.mutating_configurations, self.validating_configurations, self.conversion_crds
        )

    def install(self, manager: Manager) -> CABundleReader:
        """Add the reader to ``manager``; its webhook server's readiness then follows the
        targets' bundles."""
        if not self.targets:
            raise ValueError("name at least one webhook configuration or CRD to read")
        reader = CABundleReader(self, manager.client, manager.webhook_server)
        manager.add(reader)
        return reader


class CABundleReader(Loop):
    """Every replica: read the targets' ``caBundle`` values into the server's readiness."""

    need_leader_election = False
    name = "webhook-cabundle-reader"

    def __init__(self, config: InjectedCABundles, client: Client, server: WebhookServer) -> None:
        super().__init__()
        self.config, self.client, self.server = config, client, server
        self.known: dict[Target, list[bytes]] = {}
        self._complained: set[str] = set()
        server.injected_bundles = []  # not ready until every target was read

    def __repr__(self) -> str:
        return f"CABundleReader({', '.join(map(str, self.config.targets))})"

    async def read(self) -> bool:
        """Read every target once; true when each was read (now or before)."""
        from controller_runtime.errors import NotFoundError  # noqa: PLC0415

        complete = True
        for target in self.config.targets:
            try:
                obj = await self.client.live.get(target.api_version, target.kind, name=target.name)
            except NotFoundError:
                self._complain(f"webhook readiness: {target} does not exist; not ready")
                self.known.pop(target, None)
                complete = False
                continue
            except Exception as err:
                self._complain(
                    f"webhook readiness: cannot read {target} ({type(err).__name__}: {err}); "
                    "keeping what was read before"
                )
                complete = complete and target in self.known
                continue
            bundles = bundles_of(obj)
            if not bundles:
                self._complain(f"webhook readiness: {target} has no webhook to read a caBundle of")
            self.known[target] = bundles
        self.server.injected_bundles = (
            [b for t in self.config.targets for b in self.known.get(t, [])] if complete else []
        )
        if complete and not any(self.known.values()):
            complete = False
        return complete

    def _complain(self, message: str) -> None:
        if message not in self._complained:
            self._complained.add(message)
            log.warning("%s", message)

    async def _once(self) -> float:
        complete = await self.read()
        if complete and await self.server.ready():
            self._complained.clear()
            return self.config.interval
        return self.config.retry_interval
