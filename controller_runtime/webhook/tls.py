"""The webhook server's TLS: a serving certificate that can change under a running listener,
and the certificate directory (cert-manager's Secret, mounted) watched for changes.

:class:`ServingTLS` hands the listener one :class:`ssl.SSLContext` for its whole life and
swaps, per handshake, the context that carries the certificate (OpenSSL's server-name
callback runs for every ClientHello, with or without SNI): :meth:`ServingTLS.load` makes
every *new* connection use the new pair at once, while connections already open keep the
one they were made with. No restart, no dropped request.

Every context offers TLS 1.2 and newer only, and ALPN ``http/1.1`` (the server speaks
HTTP/1.1; it does not offer HTTP/2, whose Rapid Reset advisories are why controller-runtime
users turn it off). A pair that does not load (a key that does not match its certificate,
half-written files) is refused with :class:`CertificateError` and the previous pair stays in
use.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CERT_DIR",
    "CertDirWatcher",
    "CertificateError",
    "ServingPair",
    "ServingTLS",
    "certificate_not_after",
]

DEFAULT_CERT_DIR = Path(tempfile.gettempdir()) / "k8s-webhook-server" / "serving-certs"
"""controller-runtime's default: ``$TMPDIR/k8s-webhook-server/serving-certs``."""


class CertificateError(ValueError):
    """A certificate and key that cannot serve (unreadable, mismatched, not PEM)."""


@dataclass(frozen=True)
class ServingPair:
    """A serving certificate (PEM, chain allowed) and its private key (PEM)."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the certificate's PEM: tells two pairs apart in logs (never the key)."""
        return hashlib.sha256(self.cert_pem).hexdigest()[:16]


def _context(pair: ServingPair, client_ca_pem: bytes | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    # load_cert_chain reads files only: the pair goes through a private directory that is
    # removed at once (the key never lands anywhere readable by others).
    with tempfile.TemporaryDirectory(prefix="crpy-webhook-tls-") as directory:
        cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        cert.write_bytes(pair.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(pair.key_pem)
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError, ValueError) as err:
            raise CertificateError(f"the serving certificate and key do not load: {err}") from None
    if client_ca_pem is not None:
        try:
            context.load_verify_locations(cadata=client_ca_pem.decode())
        except (ssl.SSLError, ValueError) as err:
            raise CertificateError(f"the client CA does not load: {err}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ServingTLS:
    """The listener's TLS context, whose certificate :meth:`load` replaces for new
    connections. Until a first pair is loaded, every handshake fails (the server listens,
    but ``ready`` stays false)."""

    def __init__(self, *, client_ca_pem: bytes | None = None) -> None:
        self.client_ca_pem = client_ca_pem
        self._current: ssl.SSLContext | None = None
        self.pair: ServingPair | None = None
        self.listener_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.listener_context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.listener_context.set_alpn_protocols(["http/1.1"])
        self.listener_context.sni_callback = self._select
        self.on_change: list[Callable[[ServingPair], None]] = []

    def _select(
        self, connection: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext
    ) -> int | None:
        if self._current is None:
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        connection.context = self._current
        return None

    def load(self, pair: ServingPair) -> bool:
        """Serve ``pair`` from the next handshake on; false when it is the pair already in
        use. Raises :class:`CertificateError` (and keeps the current pair) when it does not
        load."""
        if pair == self.pair:
            return False
        context = _context(pair, self.client_ca_pem)
        self._current, self.pair = context, pair
        log.info(
            "webhook server: serving certificate %s (valid until %s)",
            pair.fingerprint,
            _not_after_text(pair.cert_pem),
        )
        for callback in self.on_change:
            callback(pair)
        return True


def certificate_not_after(cert_pem: bytes) -> datetime.datetime | None:
    """The end of validity of the first certificate in ``cert_pem`` (UTC), or ``None`` if it
    cannot be read."""
    try:
        from cryptography import x509  # noqa: PLC0415 (optional dependency)

        return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
    except Exception:
        return None


def _not_after_text(cert_pem: bytes) -> str:
    when = certificate_not_after(cert_pem)
    return when.isoformat() if when is not None else "unknown"


class CertDirWatcher:
    """Loads ``<cert_dir>/<cert_name>`` and ``<key_name>`` into a :class:`ServingTLS` and
    reloads them when they change (checked every ``interval`` seconds, controller-runtime's
    certwatcher's 10 s poll; a Secret volume's update is an atomic symlink swap, which a poll
    sees whole).

    Missing files at start are not an error: the server waits for them, logging once where
    it looks, and turns ready when they appear (a cert-manager Certificate issued after the
    Pod started). A pair that does not load is logged and retried at the next poll.

    ``<cert_dir>/<ca_name>`` (``ca.crt``, optional) is re-read at every check too and handed
    to ``on_ca`` whenever it changes (``None`` once it is gone): the server's readiness trusts
    it.
    """

    def __init__(
        self,
        tls: ServingTLS,
        cert_dir: Path,
        *,
        cert_name: str = "tls.crt",
        key_name: str = "tls.key",
        ca_name: str = "ca.crt",
        interval: float = 10.0,
        on_ca: Callable[[bytes | None], None] | None = None,
    ) -> None:
        self.tls = tls
        self.cert_path = cert_dir / cert_name
        self.key_path = cert_dir / key_name
        self.ca_path = cert_dir / ca_name
        self.on_ca = on_ca
        self.ca_pem: bytes | None = None
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._complained: str | None = None

    def read(self) -> ServingPair | None:
        try:
            return ServingPair(self.cert_path.read_bytes(), self.key_path.read_bytes())
        except OSError as err:
            self._complain(
                f"webhook server: no serving certificate yet ({err.strerror}: "
                f"{err.filename}); waiting for {self.cert_path} and {self.key_path} "
                f"(mount the Secret there, or set cert_dir)"
            )
            return None

    def _complain(self, message: str) -> None:
        if message != self._complained:
            log.warning("%s", message)
            self._complained = message

    def check(self) -> bool:
        """Load the files if they changed; true if a new pair is now served."""
        try:
            ca_pem = read_optional(self.ca_path)
        except OSError:
            ca_pem = self.ca_pem
        if ca_pem != self.ca_pem:
            self.ca_pem = ca_pem
            if self.on_ca is not None:
                self.on_ca(ca_pem)
        pair = self.read()
        if pair is None:
            return False
        try:
            changed = self.tls.load(pair)
        except CertificateError as err:
            self._complain(f"webhook server: {self.cert_path}: {err}; keeping the current one")
            return False
        self._complained = None
        return changed

    def start(self) -> None:
        self.check()
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="webhook-cert-dir")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except Exception:  # never let the watcher die: the next poll tries again
                log.exception("webhook server: checking %s failed", self.cert_path)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def read_optional(path: Path) -> bytes | None:
    """The file's bytes, or ``None`` when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
