"""Which kubectl to tell people to run against the local control plane.

kubectl supports servers one minor version older or newer than itself. The kubectl on
``PATH`` is often older than the kube-apiserver this project builds (``KUBERNETES_VERSION``),
and then some commands fail or print warnings. :func:`kubectl_command` answers ``"kubectl"``
when the one on ``PATH`` is within that skew, else the path of the kubectl built beside the
kube-apiserver (in the binaries cache), so that printed command lines work when pasted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from controller_runtime.envtest.binaries import KUBERNETES_VERSION

__all__ = ["SUPPORTED_SKEW", "kubectl_command", "path_kubectl_version", "within_skew"]

SUPPORTED_SKEW = 1
"""Minor versions kubectl may differ from the server by (Kubernetes' version skew policy)."""

_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def _major_minor(version: str) -> tuple[int, int] | None:
    match = _VERSION.match(version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def within_skew(client_version: str, server_version: str) -> bool:
    """True if a kubectl of ``client_version`` supports a server of ``server_version``
    (``"v1.32.4-dispatcher"``, ``"1.36.3"``, ...): same major, minors at most
    :data:`SUPPORTED_SKEW` apart. Unparseable versions are not within skew."""
    client, server = _major_minor(client_version), _major_minor(server_version)
    if client is None or server is None:
        return False
    return client[0] == server[0] and abs(client[1] - server[1]) <= SUPPORTED_SKEW


def path_kubectl_version() -> str | None:
    """The version of the kubectl on ``PATH`` (its ``gitVersion``), or ``None`` when there is
    none or it does not answer within 10 s."""
    executable = shutil.which("kubectl")
    if executable is None:
        return None
    try:
        answer = subprocess.run(
            [executable, "version", "--client", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        version = json.loads(answer.stdout)["clientVersion"]["gitVersion"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None
    return str(version)


def kubectl_command(
    built: Path | None,
    server_version: str = KUBERNETES_VERSION,
    *,
    path_version: str | None = None,
) -> str:
    """``"kubectl"`` when the kubectl on ``PATH`` supports ``server_version``, else ``built``
    (the kubectl built with the control plane) when there is one, else ``"kubectl"``.

    ``path_version`` is the ``PATH`` kubectl's version (default: asked with
    :func:`path_kubectl_version`)."""
    version = path_version if path_version is not None else path_kubectl_version()
    if version is not None and within_skew(version, server_version):
        return "kubectl"
    if built is not None and built.is_file():
        return str(built)
    return "kubectl"
