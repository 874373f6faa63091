"""Self-managed webhook certificates: a CA and a serving certificate in a Secret, created and
rotated by the leader, injected into the webhook configurations and the CRDs' conversion,
and served by every replica without a restart.

::

    SelfManagedCertificates(
        secret=("webhook-certs", "system"),
        service=("webhook-service", "system"),
        validating_configurations=["widgets"],
        conversion_crds=["widgets.shop.example.com"],
    ).install(manager)

Two runnables do the work (:meth:`SelfManagedCertificates.install` adds both):

* the **rotator** (leader only) reads the Secret, takes the step
  :func:`~controller_runtime.webhook.rotation.plan` names (create, renew, add a next CA,
  switch, drop the old CA), writes the Secret (a conditioned update: two leaders never
  overwrite each other), then makes every target's ``caBundle`` equal to the Secret's bundle
  (every webhook of each named configuration; each named CRD's
  ``spec.conversion.webhook.clientConfig``), and records when that was done. It looks again
  when the next step is due, and at least every ``check_interval`` (60 s), so a webhook
  added to a configuration later, or a ``caBundle`` someone overwrote, gets the bundle back.
* the **reloader** (every replica) reads the Secret every ``reload_interval`` (10 s; every
  second until it first found one) and serves its certificate
  (:class:`~controller_runtime.webhook.tls.ServingTLS`: new connections get it at once, open
  ones keep theirs). When there are no certificates anywhere yet (no Secret, and no target
  with a ``caBundle``: a first install, or an upgrade from a release without webhooks), any
  replica creates them and fills the empty ``caBundle`` values itself, without waiting for a
  leader: a replica whose caches can only sync through its own conversion webhook (objects
  stored in another version) would otherwise wait for a leader that waits for it. A replica
  that is not ready fills any ``caBundle`` still empty with the Secret's bundle (a first
  injection that lost a race with another writer). It never replaces a bundle: rotation
  stays the leader's.
* the **caBundle reader** (every replica,
  :class:`~controller_runtime.webhook.trust.InjectedCABundles`) makes the server's readiness
  follow the ``caBundle`` values the targets actually hold, and the certificate's validity for
  ``<service>.<namespace>.svc``.

The Secret is of type ``kubernetes.io/tls``: ``tls.crt``/``tls.key`` (the serving pair),
``ca.crt`` (the bundle, newest CA first; cert-manager's layout, so the Secret may also be
mounted as a certificate directory), ``signer.crt``/``signer.key`` (the CA that signs) and,
while one is introduced, ``next.crt``/``next.key``. The CA's key is in the Secret: limit
``get`` on it to the operator's service account (RBAC ``resourceNames``). Nothing here logs a
key.

Needs the ``cryptography`` package (``pip install controller-runtime-py[webhook]``).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from controller_runtime.webhook._loop import Loop
from controller_runtime.webhook.rotation import (
    Authority,
    Leaf,
    RotationPolicy,
    RotationState,
    Step,
    next_check,
    plan,
    transition,
)
from controller_runtime.webhook.tls import CertificateError, ServingPair
from controller_runtime.webhook.trust import (
    CABundleReader,
    InjectedCABundles,
    Target,
    bundles_of,
    client_configs,
    targets,
)

if TYPE_CHECKING:
    from controller_runtime.client import Client
    from controller_runtime.manager import Manager
    from controller_runtime.webhook.server import WebhookServer

__all__ = [
    "INJECTED_AT",
    "SWITCHED_AT",
    "CertificateReloader",
    "CertificateRotator",
    "SelfManagedCertificates",
    "service_hosts",
]

log = logging.getLogger(__name__)

INJECTED_AT = "webhook.controller-runtime-py.io/bundle-injected-at"
SWITCHED_AT = "webhook.controller-runtime-py.io/switched-at"


def service_hosts(name: str, namespace: str) -> list[str]:
    """The names a Service is called by: ``name``, ``name.ns``, ``name.ns.svc`` (what the
    API server checks) and ``name.ns.svc.cluster.local``."""
    return [
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.cluster.local",
    ]


# -- certificates (cryptography) -----------------------------------------------------------


def _crypto() -> Any:
    try:
        from cryptography import x509  # noqa: PLC0415 (optional dependency)
    except ImportError:  # pragma: no cover (installed with the [webhook] extra)
        raise ImportError(
            "self-managed webhook certificates need the cryptography package: "
            "pip install 'controller-runtime-py[webhook]'"
        ) from None
    return x509


def _fingerprint(cert_pem: bytes) -> str:
    return hashlib.sha256(cert_pem.strip()).hexdigest()[:16]


def _pem_blocks(bundle: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----"
    return [part.strip() + b"\n" + marker + b"\n" for part in bundle.split(marker) if part.strip()]


@dataclass
class _Minted:
    cert_pem: bytes
    key_pem: bytes


class _Mint:
    """Issues ECDSA P-256 certificates and remembers their PEMs by fingerprint."""

    def __init__(self, known: dict[str, _Minted]) -> None:
        self.known = known

    def authority(self, not_after: float) -> Authority:
        x509 = _crypto()
        from cryptography.hazmat.primitives import hashes  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import NameOID  # noqa: PLC0415

        key = ec.generate_private_key(ec.SECP256R1())
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"webhook-ca-{stamp}")])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_utc(time.time() - 300))
            .not_valid_after(_utc(not_after))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return self._remember(cert, key, not_after)

    def leaf(self, ca: Authority, not_after: float, hosts: frozenset[str]) -> Leaf:
        x509 = _crypto()
        import ipaddress  # noqa: PLC0415

        from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

        issuer = self.known[ca.id]
        ca_cert = x509.load_pem_x509_certificate(issuer.cert_pem)
        ca_key = serialization.load_pem_private_key(issuer.key_pem, password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[Any] = []
        for host in sorted(hosts):
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        common = next((h for h in sorted(hosts) if h.endswith(".svc")), sorted(hosts)[0])
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_utc(time.time() - 300))
            .not_valid_after(_utc(not_after))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        minted = self._remember(cert, key, not_after)
        return Leaf(minted.id, ca.id, not_after, frozenset(hosts))

    def _remember(self, cert: Any, key: Any, not_after: float) -> Authority:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        identity = _fingerprint(cert_pem)
        self.known[identity] = _Minted(cert_pem, key_pem)
        return Authority(identity, not_after)


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC)


def _cert_facts(cert_pem: bytes) -> tuple[float, frozenset[str], str]:
    """End of validity (epoch), the SAN host names, the issuer's fingerprint-free name."""
    x509 = _crypto()
    cert = x509.load_pem_x509_certificate(cert_pem)
    hosts: set[str] = set()
    with contextlib.suppress(x509.ExtensionNotFound):
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts |= {str(v) for v in sans.get_values_for_type(x509.DNSName)}
        hosts |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    return cert.not_valid_after_utc.timestamp(), frozenset(hosts), cert.issuer.rfc4514_string()


def _issued_by(leaf_pem: bytes, ca_pem: bytes) -> bool:
    x509 = _crypto()
    try:
        x509.load_pem_x509_certificate(leaf_pem).verify_directly_issued_by(
            x509.load_pem_x509_certificate(ca_pem)
        )
    except Exception:
        return False
    return True


# -- the Secret ----------------------------------------------------------------------------


@dataclass
class _Stored:
    """The Secret, read: the state as values, the PEMs behind it, its resourceVersion."""

    state: RotationState | None
    known: dict[str, _Minted] = field(default_factory=dict)
    bundle_pems: dict[str, bytes] = field(default_factory=dict)
    resource_version: str | None = None
    exists: bool = False


def _decode(data: dict[str, str], key: str) -> bytes | None:
    value = data.get(key)
    return base64.b64decode(value) if value else None


def read_state(secret: dict[str, Any] | None) -> _Stored:
    """Parse the Secret (``None``: absent). A Secret this module cannot read gives a state of
    ``None`` (the rotator then creates a fresh CA, logging why)."""
    if secret is None:
        return _Stored(None)
    metadata = secret.get("metadata") or {}
    stored = _Stored(None, resource_version=metadata.get("resourceVersion"), exists=True)
    data = secret.get("data") or {}
    annotations = metadata.get("annotations") or {}
    try:
        signer_pem, signer_key = _decode(data, "signer.crt"), _decode(data, "signer.key")
        tls_pem, tls_key = _decode(data, "tls.crt"), _decode(data, "tls.key")
        bundle = _decode(data, "ca.crt") or b""
        if not (signer_pem and signer_key and tls_pem and tls_key):
            return stored
        signer = Authority(_fingerprint(signer_pem), _cert_facts(signer_pem)[0])
        stored.known[signer.id] = _Minted(signer_pem, signer_key)
        next_ca = None
        next_pem, next_key = _decode(data, "next.crt"), _decode(data, "next.key")
        if next_pem and next_key:
            next_ca = Authority(_fingerprint(next_pem), _cert_facts(next_pem)[0])
            stored.known[next_ca.id] = _Minted(next_pem, next_key)
        for pem in _pem_blocks(bundle):
            stored.bundle_pems[_fingerprint(pem)] = pem
        not_after, hosts, _ = _cert_facts(tls_pem)
        issuer = signer.id if _issued_by(tls_pem, signer_pem) else "unknown"
        serving = Leaf(_fingerprint(tls_pem), issuer, not_after, hosts)
        stored.known[serving.id] = _Minted(tls_pem, tls_key)
        stored.state = RotationState(
            signer=signer,
            serving=serving,
            bundle=tuple(stored.bundle_pems),
            next_ca=next_ca,
            bundle_injected_at=_float(annotations.get(INJECTED_AT)),
            switched_at=_float(annotations.get(SWITCHED_AT)),
        )
    except Exception as err:
        log.warning("webhook certificates: the Secret cannot be read (%s)", type(err).__name__)
        stored.state = None
    return stored


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def secret_body(
    name: str, namespace: str, state: RotationState, known: dict[str, _Minted], bundle: bytes
) -> dict[str, Any]:
    """The Secret holding ``state`` (``bundle``: the PEMs of ``state.bundle``, in order)."""
    serving, signer = known[state.serving.id], known[state.signer.id]
    data = {
        "tls.crt": _b64(serving.cert_pem),
        "tls.key": _b64(serving.key_pem),
        "ca.crt": _b64(bundle),
        "signer.crt": _b64(signer.cert_pem),
        "signer.key": _b64(signer.key_pem),
    }
    if state.next_ca is not None:
        following = known[state.next_ca.id]
        data["next.crt"], data["next.key"] = _b64(following.cert_pem), _b64(following.key_pem)
    annotations = {}
    if state.bundle_injected_at is not None:
        annotations[INJECTED_AT] = repr(state.bundle_injected_at)
    if state.switched_at is not None:
        annotations[SWITCHED_AT] = repr(state.switched_at)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": metadata,
        "data": data,
    }


# -- the runnables ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SelfManagedCertificates:
    """The webhook server's certificates, managed in-cluster; see the module docstring.

    ``secret`` and ``service`` are ``(name, namespace)``; ``extra_hosts`` are more names (or
    IP addresses) for the serving certificate (a local server's ``127.0.0.1``).
    ``policy``: validity and rotation timing (:class:`~controller_runtime.webhook.rotation.
    RotationPolicy`: CA 365 days, serving 90 days, renewed 30 days before their end, 10 min
    overlap). ``reload_interval`` (10 s): how often every replica re-reads the Secret;
    ``check_interval`` (60 s): the leader's longest pause between two checks.
    """

    secret: tuple[str, str]
    service: tuple[str, str]
    mutating_configurations: Sequence[str] = ()
    validating_configurations: Sequence[str] = ()
    conversion_crds: Sequence[str] = ()
    extra_hosts: Sequence[str] = ()
    policy: RotationPolicy = field(default_factory=RotationPolicy)
    reload_interval: float = 10.0
    check_interval: float = 60.0

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset([*service_hosts(*self.service), *self.extra_hosts])

    @property
    def targets(self) -> list[Target]:
        """Every object whose ``caBundle`` is kept equal to the Secret's bundle."""
        return targets(
            self.mutating_configurations, self.validating_configurations, self.conversion_crds
        )

    def install(self, manager: Manager) -> tuple[CertificateRotator, CertificateReloader]:
        """Serve the Secret's certificate from ``manager.webhook_server`` (its certificate
        directory is no longer watched), and add the rotator, the reloader and (when any
        target is named) the caBundle reader behind its readiness."""
        self.policy.check(self.reload_interval)
        server = manager.webhook_server
        server.use_external_certificates()
        server.service_hostname = f"{self.service[0]}.{self.service[1]}.svc"
        rotator = CertificateRotator(self, manager.client)
        reloader = CertificateReloader(self, manager.client, server, bootstrap=rotator)
        rotator.on_write = reloader.poke
        manager.add(rotator)
        manager.add(reloader)
        if self.targets:
            bundles = InjectedCABundles(
                mutating_configurations=self.mutating_configurations,
                validating_configurations=self.validating_configurations,
                conversion_crds=self.conversion_crds,
                interval=self.reload_interval,
            )
            reader = CABundleReader(bundles, manager.client, server)
            rotator.on_inject = reader.poke
            manager.add(reader)
        return rotator, reloader


class CertificateReloader(Loop):
    """Every replica: serve the Secret's certificate, trust its bundle for readiness."""

    need_leader_election = False
    name = "webhook-certificate-reloader"

    def __init__(
        self,
        config: SelfManagedCertificates,
        client: Client,
        server: WebhookServer,
        *,
        bootstrap: CertificateRotator | None = None,
    ) -> None:
        super().__init__()
        self.config, self.client, self.server = config, client, server
        self.bootstrap = bootstrap
        """Creates the certificates when there are none anywhere, and fills an empty
        ``caBundle`` while this replica is not ready (the rotator's
        :meth:`~CertificateRotator.bootstrap` and :meth:`~CertificateRotator.fill_empty`,
        which any replica may call); ``None``: wait for the leader."""

    def __repr__(self) -> str:
        return f"CertificateReloader({self.config.secret[1]}/{self.config.secret[0]})"

    async def _once(self) -> float:
        name, namespace = self.config.secret
        from controller_runtime.errors import NotFoundError  # noqa: PLC0415

        waiting = min(1.0, self.config.reload_interval)  # until a first pair is served
        try:
            secret = await self.client.live.get("v1", "Secret", name=name, namespace=namespace)
        except NotFoundError:
            if self.bootstrap is None or not await self.bootstrap.bootstrap():
                log.info("webhook certificates: waiting for the Secret %s/%s", namespace, name)
                return waiting if self.server.tls.pair is None else self.config.reload_interval
            secret = await self.client.live.get("v1", "Secret", name=name, namespace=namespace)
        data = secret.get("data") or {}
        cert, key, bundle = (_decode(data, k) for k in ("tls.crt", "tls.key", "ca.crt"))
        if cert and key:
            try:
                self.server.tls.load(ServingPair(cert, key))
            except CertificateError as err:
                log.warning("webhook certificates: %s; keeping the current pair", err)
        if bundle:
            self.server.trust_bundle = bundle
            if self.bootstrap is not None and not await self.server.ready():
                # A caBundle still empty (a first start whose injection lost a race, or one
                # someone emptied): fill it, whoever leads; a bundle is never replaced here.
                await self.bootstrap.fill_empty(bundle)
                return waiting
        return self.config.reload_interval if self.server.tls.pair is not None else waiting


class CertificateRotator(Loop):
    """The leader: create and rotate the Secret's certificates, inject the bundle."""

    need_leader_election = True
    name = "webhook-certificate-rotator"

    def __init__(
        self,
        config: SelfManagedCertificates,
        client: Client,
        *,
        on_write: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.config, self.client = config, client
        self.on_write = on_write
        self.on_inject: Callable[[], None] | None = None
        """Called after a bundle was written to a target (the caBundle reader's poke)."""
        self.clock = clock
        self.steps: list[Step] = []
        """Every step taken but ``NONE``, in order (for tests and logs)."""

    async def _once(self) -> float:
        from controller_runtime.errors import NotFoundError  # noqa: PLC0415

        name, namespace = self.config.secret
        try:
            secret = await self.client.live.get("v1", "Secret", name=name, namespace=namespace)
        except NotFoundError:
            secret = None
        stored = read_state(secret)
        now = self.clock()
        policy, hosts = self.config.policy, self.config.hosts
        step = plan(stored.state, now, policy, hosts)
        state = stored.state
        if step is not Step.NONE:
            if step is Step.CREATE and stored.exists:
                log.warning(
                    "webhook certificates: the Secret %s/%s holds no usable CA; creating a new one",
                    namespace,
                    name,
                )
            mint = _Mint(stored.known)
            state = transition(
                state,
                step,
                now,
                policy,
                hosts,
                new_authority=mint.authority,
                new_leaf=mint.leaf,
            )
            assert state is not None
            await self._write(stored, state)
            self.steps.append(step)
            log.info("webhook certificates: %s (serving %s)", step.value, state.serving.id)
        assert state is not None
        bundle = self._bundle(stored, state)
        await self._inject(bundle)
        if state.bundle_injected_at is None:
            state = replace(state, bundle_injected_at=self.clock())
            await self._write(stored, state)
        return next_check(state, self.clock(), policy, self.config.check_interval) - self.clock()

    def _bundle(self, stored: _Stored, state: RotationState) -> bytes:
        pems = []
        for identity in state.bundle:
            pem = stored.bundle_pems.get(identity) or (
                stored.known[identity].cert_pem if identity in stored.known else None
            )
            if pem is not None:
                pems.append(pem)
        return b"".join(pems)

    async def _write(self, stored: _Stored, state: RotationState) -> None:
        name, namespace = self.config.secret
        bundle = self._bundle(stored, state)
        body = secret_body(name, namespace, state, stored.known, bundle)
        if not stored.exists:
            written = await self.client.create(body)  # AlreadyExistsError: next pass reads it
        else:
            body["metadata"]["resourceVersion"] = stored.resource_version
            written = await self.client.update(body)  # ConflictError: another writer; next pass
        stored.resource_version = written["metadata"]["resourceVersion"]
        stored.exists = True
        if self.on_write is not None:
            self.on_write()

    def __repr__(self) -> str:
        return f"CertificateRotator({self.config.secret[1]}/{self.config.secret[0]})"

    async def bootstrap(self) -> bool:
        """Create the certificates if there are none anywhere: no Secret, and no ``caBundle``
        in any target (a missing target counts as empty). Then fill the empty ``caBundle``
        values; a non-empty one is never touched (that is the leader's :meth:`_once`). Any
        replica may call it: the Secret is created, never overwritten, so of two replicas
        that try at once one wins and the other reads the winner's. True when this call
        created them."""
        from controller_runtime.errors import AlreadyExistsError, NotFoundError  # noqa: PLC0415

        name, namespace = self.config.secret
        try:
            await self.client.live.get("v1", "Secret", name=name, namespace=namespace)
        except NotFoundError:
            pass
        else:
            return False
        for target in self.config.targets:
            try:
                obj = await self.client.live.get(target.api_version, target.kind, name=target.name)
            except NotFoundError:
                continue
            if any(bundles_of(obj)):
                log.info(
                    "webhook certificates: no Secret %s/%s, but %s holds a caBundle: "
                    "waiting for the leader to create the certificates",
                    namespace,
                    name,
                    target,
                )
                return False
        stored = _Stored(None)
        mint = _Mint(stored.known)
        now, policy, hosts = self.clock(), self.config.policy, self.config.hosts
        state = transition(
            None,
            Step.CREATE,
            now,
            policy,
            hosts,
            new_authority=mint.authority,
            new_leaf=mint.leaf,
        )
        assert state is not None
        try:
            await self._write(stored, state)
        except AlreadyExistsError:
            return False
        log.info("webhook certificates: created (serving %s)", state.serving.id)
        await self.fill_empty(self._bundle(stored, state))
        return True

    async def fill_empty(self, bundle: bytes) -> None:
        """Write ``bundle`` into every target's ``caBundle`` that is empty, and nowhere else
        (missing targets are skipped). Any replica may call it: an empty ``caBundle`` trusts
        only the system's roots, so filling it never takes trust away."""
        await self._inject(bundle, only_empty=True)

    async def _inject(self, bundle: bytes, *, only_empty: bool = False) -> None:
        """Write ``bundle`` into every target's ``caBundle`` (``only_empty``: only where
        there is none; missing targets are then skipped too). Each write is conditioned on
        what was read; one that loses to another writer reads again (5 times)."""
        from controller_runtime.errors import ConflictError  # noqa: PLC0415

        for target in self.config.targets:
            for attempt in range(5):
                try:
                    await self._inject_into(target, _b64(bundle), only_empty=only_empty)
                    break
                except ConflictError:
                    if attempt == 4:
                        raise

    async def _inject_into(self, target: Target, encoded: str, *, only_empty: bool) -> None:
        from controller_runtime.errors import NotFoundError  # noqa: PLC0415

        try:
            obj = await self.client.live.get(target.api_version, target.kind, name=target.name)
        except NotFoundError:
            if only_empty:
                return
            raise
        configs = client_configs(obj)
        if not configs and target.kind == "CustomResourceDefinition":
            log.warning(
                "webhook certificates: the CRD %s has no webhook conversion to inject into",
                target.name,
            )
            return
        changed = False
        for client_config in configs:
            if only_empty and client_config.get("caBundle"):
                continue
            if client_config.get("caBundle") != encoded:
                client_config["caBundle"] = encoded
                changed = True
        if changed:
            await self.client.update(obj)
            if self.on_inject is not None:
                self.on_inject()
