"""Reading the common kubeconfig shapes directly, without importing kubernetes-asyncio.

Importing ``kubernetes_asyncio.config`` imports every generated model of its client (~770
modules) and raises a process's RSS by ~65 MiB, which is most of an operator's empty footprint.
Most kubeconfigs need none of it: a server, a CA, and a client certificate or a bearer token.

:func:`read_simple_kubeconfig` handles exactly those and returns ``None`` for anything else
(exec plugins, auth providers, basic auth, token files, proxies, ...), so that the caller falls
back to kubernetes-asyncio, which handles them all. It never guesses: an unknown key in the
selected cluster or user means ``None``.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import yaml

from kubeclient.config import ClusterConfig, ConfigError, Credentials, NoCredentials, StaticToken

log = logging.getLogger(__name__)

SIMPLE_CLUSTER_KEYS = frozenset(
    {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "extensions",
    }
)
SIMPLE_USER_KEYS = frozenset(
    {"token", "client-certificate", "client-certificate-data", "client-key", "client-key-data"}
)


def _named(entries: Any, name: str, what: str) -> dict[str, Any] | None:
    for entry in entries or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(what)
            return value if isinstance(value, dict) else {}
    return None


def _pem(section: dict[str, Any], key: str, base: Path) -> bytes | None:
    """The PEM bytes of ``key``-data (base64) or of the file ``key`` (relative to ``base``)."""
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = section.get(key)
    if path:
        return (base / Path(path).expanduser()).read_bytes()
    return None


def read_simple_kubeconfig(path: Path, context: str | None = None) -> ClusterConfig | None:
    """The configuration of ``context`` (default: the current one) in ``path``, or ``None``
    when it needs more than a server, a CA, a client certificate and/or a static token (the
    caller then uses kubernetes-asyncio). Raises :class:`ConfigError` when the named context,
    its cluster or its server is missing."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        return None
    name = context or doc.get("current-context")
    if not name:
        return None
    ctx = _named(doc.get("contexts"), name, "context")
    if ctx is None:
        raise ConfigError(f"no context {name!r} in {path}")
    cluster = _named(doc.get("clusters"), ctx.get("cluster", ""), "cluster")
    if cluster is None or not cluster.get("server"):
        raise ConfigError(f"context {name!r} in {path} has no cluster with a server")
    user = _named(doc.get("users"), ctx.get("user", ""), "user") or {}
    if set(cluster) - SIMPLE_CLUSTER_KEYS or set(user) - SIMPLE_USER_KEYS:
        return None
    base = path.parent
    if cluster.get("insecure-skip-tls-verify"):
        log.warning("TLS verification is off for %s (insecure-skip-tls-verify)", path)
        context_ = ssl.create_default_context()
        context_.check_hostname = False
        context_.verify_mode = ssl.CERT_NONE
    else:
        ca = _pem(cluster, "certificate-authority", base)
        context_ = ssl.create_default_context(cadata=ca.decode() if ca else None)
    cert = _pem(user, "client-certificate", base)
    key = _pem(user, "client-key", base)
    if cert and key:
        # ssl loads a certificate chain from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="kubeconfig-") as tmp:
            cert_file, key_file = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
            for file, content in ((cert_file, cert), (key_file, key)):
                fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(content)
            context_.load_cert_chain(cert_file, key_file)
    elif cert or key:
        return None  # half a pair: let kubernetes-asyncio report it
    token = str(user.get("token") or "").removeprefix("Bearer ").strip()
    credentials: Credentials = StaticToken(token) if token else NoCredentials()
    return ClusterConfig(
        server=str(cluster["server"]).rstrip("/"),
        ssl_context=context_,
        credentials=credentials,
        namespace=ctx.get("namespace") or "default",
        tls_server_name=cluster.get("tls-server-name"),
        source=str(path),
    )
