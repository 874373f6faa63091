"""Where the API server is and how to authenticate to it.

Common kubeconfig files are read directly (:mod:`kubeclient.kubeconfig_reader`);
kubernetes-asyncio loads the rest (exec credential plugins, auth providers). Either way the
result is what our own transport needs: a server URL, an :class:`ssl.SSLContext`
(verification on unless the kubeconfig explicitly says ``insecure-skip-tls-verify``), and a
:class:`Credentials` object that produces the ``Authorization`` header and can refresh it.

In-cluster configuration is read directly: the service-account token file is re-read at least
every minute (projected tokens rotate) and immediately after a 401, as client-go does.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0


class ConfigError(RuntimeError):
    """No usable cluster configuration was found; the message says what was tried."""


class Credentials(Protocol):
    """Produces request headers; refreshed after a 401."""

    async def headers(self) -> dict[str, str]:
        """Headers to add to a request (e.g. ``Authorization``); may refresh a token."""
        ...

    async def refresh(self) -> bool:
        """Force a refresh after a 401. True when the credentials may have changed."""
        ...


class NoCredentials:
    """Client certificates only (they live in the SSL context)."""

    async def headers(self) -> dict[str, str]:
        return {}

    async def refresh(self) -> bool:
        return False


@dataclass
class StaticToken:
    """A bearer token from a kubeconfig; it cannot be refreshed."""

    token: str

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def refresh(self) -> bool:
        return False


@dataclass
class TokenFile:
    """A token file (in-cluster service-account token), re-read every ``reread_seconds``
    and after a 401."""

    path: Path
    reread_seconds: float = TOKEN_REREAD_SECONDS
    _token: str = field(default="", init=False, repr=False)
    _read_at: float = field(default=float("-inf"), init=False)

    def _read(self) -> None:
        token = self.path.read_text().strip()
        if not token:
            raise ConfigError(f"the token file {self.path} is empty")
        self._token = token
        self._read_at = time.monotonic()

    async def headers(self) -> dict[str, str]:
        if time.monotonic() - self._read_at >= self.reread_seconds:
            self._read()
        return {"Authorization": f"Bearer {self._token}"}

    async def refresh(self) -> bool:
        before = self._token
        self._read()
        return self._token != before


@dataclass
class ExecPluginCredentials:
    """Tokens from a kubeconfig ``exec`` plugin, re-run when expired or after a 401.

    Caveat: plugins that return client certificates instead of tokens are supported only at
    load time (the certificate goes into the SSL context and is not rotated).
    """

    loader: Any  # kubernetes_asyncio KubeConfigLoader

    async def headers(self) -> dict[str, str]:
        await self.loader.load_from_exec_plugin()
        token = getattr(self.loader, "token", None)
        return {"Authorization": token} if token else {}

    async def refresh(self) -> bool:
        if hasattr(self.loader, "exec_plugin_expiry"):
            del self.loader.exec_plugin_expiry
        before = getattr(self.loader, "token", None)
        await self.loader.load_from_exec_plugin()
        return getattr(self.loader, "token", None) != before


@dataclass
class ClusterConfig:
    """Everything the transport needs to reach one API server."""

    server: str
    ssl_context: ssl.SSLContext
    credentials: Credentials = field(default_factory=NoCredentials)
    namespace: str = "default"
    tls_server_name: str | None = None
    source: str = ""


def in_cluster_available() -> bool:
    """True inside a Pod with a mounted service-account token."""
    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and (SERVICE_ACCOUNT_DIR / "token").is_file()
    )


def load_in_cluster_config(directory: Path = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    """The Pod's service-account configuration (server from ``KUBERNETES_SERVICE_HOST``)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    namespace_file = directory / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    return ClusterConfig(
        server=f"https://{host}:{port}",
        ssl_context=context,
        credentials=TokenFile(directory / "token"),
        namespace=namespace,
        source="in-cluster",
    )


async def load_kubeconfig(
    path: str | Path | None = None, context: str | None = None
) -> ClusterConfig:
    """Load a kubeconfig file.

    ``path`` defaults to the first entry of ``$KUBECONFIG``, else ``~/.kube/config``. The
    common shapes (a CA, a client certificate and/or a static token) are read directly
    (:mod:`kubeclient.kubeconfig_reader`); anything else (exec plugins, auth providers, ...)
    through kubernetes-asyncio, which is imported only then (it costs ~65 MiB of RSS).
    """
    # Where the path came from, for the error: a library program has no --kubeconfig flag to
    # suggest (a command line that has one adds the hint itself).
    origin = "the path given"
    if path is None:
        env = os.environ.get("KUBECONFIG", "")
        if env:
            path, origin = env.split(os.pathsep)[0], "from $KUBECONFIG"
        else:
            path, origin = str(Path.home() / ".kube" / "config"), "the default"
    if not Path(path).is_file():  # noqa: ASYNC240 (once, at start-up)
        fix = "correct $KUBECONFIG or unset it" if origin == "from $KUBECONFIG" else "check it"
        raise ConfigError(f"no kubeconfig at {path} ({origin}): no such file; {fix}")
    from kubeclient.kubeconfig_reader import read_simple_kubeconfig  # noqa: PLC0415

    simple = read_simple_kubeconfig(Path(path), context)
    if simple is not None:
        return simple
    # Imported here: kubernetes-asyncio takes seconds to import (its generated API modules),
    # and command lines that only parse flags (``--help``) should not pay for it.
    from kubernetes_asyncio.client import Configuration  # noqa: PLC0415
    from kubernetes_asyncio.config import kube_config  # noqa: PLC0415

    configuration = Configuration()
    loader = await kube_config.load_kube_config(
        config_file=str(path),
        context=context,
        client_configuration=configuration,
        persist_config=False,
    )
    if configuration.verify_ssl:
        ssl_context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    else:
        log.warning("TLS verification is off for %s (insecure-skip-tls-verify)", path)
        ssl_context = ssl.create_default_context()
        ssl_context.check_hostname = False
        ssl_context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file and configuration.key_file:
        ssl_context.load_cert_chain(configuration.cert_file, configuration.key_file)

    credentials: Credentials
    user = getattr(loader, "_user", None)
    if user is not None and "exec" in user:
        credentials = ExecPluginCredentials(loader)
    elif configuration.api_key.get("BearerToken"):
        token = str(configuration.api_key["BearerToken"]).removeprefix("Bearer ").strip()
        credentials = StaticToken(token)
    else:
        credentials = NoCredentials()
    namespace = "default"
    current = loader.current_context
    if isinstance(current, dict):
        namespace = current.get("context", {}).get("namespace") or "default"
    return ClusterConfig(
        server=str(configuration.host).rstrip("/"),
        ssl_context=ssl_context,
        credentials=credentials,
        namespace=namespace,
        tls_server_name=getattr(configuration, "tls_server_name", None),
        source=str(path),
    )


async def load_config(
    kubeconfig: str | Path | None = None, context: str | None = None
) -> ClusterConfig:
    """Find the configuration the way controller-runtime does.

    Order: an explicit ``kubeconfig``; ``$KUBECONFIG``; in-cluster; ``~/.kube/config``.
    """
    if kubeconfig is not None or os.environ.get("KUBECONFIG"):
        return await load_kubeconfig(kubeconfig, context)
    if in_cluster_available():
        return load_in_cluster_config()
    default = Path.home() / ".kube" / "config"
    if default.is_file():
        return await load_kubeconfig(default, context)
    raise ConfigError(
        "no cluster configuration: no $KUBECONFIG, not in a Pod, and no ~/.kube/config; set "
        "KUBECONFIG, pass a kubeconfig path, or create ~/.kube/config"
    )
