"""Authentication paths against the real API server: bearer tokens from a kubeconfig, exec
credential plugins (re-run after a 401), and the in-cluster token file (re-read after a 401)."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from kubeclient.config import ConfigError, load_in_cluster_config, load_kubeconfig
from kubeclient.errors import UnauthorizedError
from kubeclient.kubeconfig_reader import read_simple_kubeconfig
from kubeclient.transport import Transport

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(use_existing_cluster(), reason="uses the local control plane's token"),
]

EXEC_PLUGIN = """
import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
with open(here / "calls", "a") as calls:
    calls.write("x")
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1",
    "kind": "ExecCredential",
    "status": {"token": (here / "token").read_text().strip(),
               "expirationTimestamp": "2099-01-01T00:00:00Z"},
}))
"""


def _cluster(plane: ControlPlane) -> dict[str, Any]:
    config = yaml.safe_load(plane.kubeconfig.read_text())
    cluster: dict[str, Any] = config["clusters"][0]["cluster"]
    return cluster


def _kubeconfig(path: Path, plane: ControlPlane, user: dict[str, Any]) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": _cluster(plane)}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))
    return path


async def test_bearer_token_from_a_kubeconfig(control_plane: ControlPlane, tmp_path: Path) -> None:
    good = _kubeconfig(tmp_path / "good", control_plane, {"token": control_plane.admin_token})
    async with Transport(await load_kubeconfig(good)) as transport:
        assert (await transport.get_json("/api/v1/namespaces"))["kind"] == "NamespaceList"
    bad = _kubeconfig(tmp_path / "bad", control_plane, {"token": "not-a-token"})
    async with Transport(await load_kubeconfig(bad)) as transport:
        with pytest.raises(UnauthorizedError):
            await transport.get_json("/api/v1/namespaces")


async def test_exec_plugin_token_is_refreshed_after_a_401(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(EXEC_PLUGIN)
    (tmp_path / "token").write_text("expired-token")
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin), str(tmp_path)],
            "interactiveMode": "Never",
        }
    }
    config = await load_kubeconfig(_kubeconfig(tmp_path / "kubeconfig", control_plane, user))
    # The plugin has run once, and its (still unexpired) token is cached. Rotate it behind the
    # client's back: the next request gets a 401, the client re-runs the plugin, and succeeds.
    (tmp_path / "token").write_text(control_plane.admin_token)
    async with Transport(config) as transport:
        assert (await transport.get_json("/api/v1/namespaces"))["kind"] == "NamespaceList"
    assert len((tmp_path / "calls").read_text()) >= 2


async def test_in_cluster_token_file_is_re_read_after_a_401(
    control_plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, port = control_plane.server.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    ca = base64.b64decode(_cluster(control_plane)["certificate-authority-data"])
    (tmp_path / "ca.crt").write_bytes(ca)
    (tmp_path / "namespace").write_text("team-a")
    (tmp_path / "token").write_text("old-projected-token")
    config = load_in_cluster_config(tmp_path)
    assert config.namespace == "team-a"
    async with Transport(config) as transport:
        with pytest.raises(UnauthorizedError):
            await transport.get_json("/api/v1/namespaces")
        (tmp_path / "token").write_text(control_plane.admin_token)  # the kubelet rotated it
        answer = await transport.get_json("/api/v1/namespaces")
        assert answer["kind"] == "NamespaceList"


def test_common_kubeconfigs_are_read_without_kubernetes_asyncio(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # The admin kubeconfig (CA data, client certificate data) and a token one are read by our
    # own reader, in a fresh interpreter that never imports kubernetes-asyncio, and work.
    token = _kubeconfig(tmp_path / "token", control_plane, {"token": control_plane.admin_token})
    probe = (
        "import asyncio, sys\n"
        "from kubeclient.config import load_kubeconfig\n"
        "from kubeclient.transport import Transport\n"
        "async def main(path):\n"
        "    async with Transport(await load_kubeconfig(path)) as transport:\n"
        "        kind = (await transport.get_json('/api/v1/namespaces'))['kind']\n"
        "    print(kind, 'kubernetes_asyncio' in sys.modules)\n"
        "for path in sys.argv[1:]:\n"
        "    asyncio.run(main(path))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(control_plane.kubeconfig), str(token)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split("\n")
    assert out[:2] == ["NamespaceList False", "NamespaceList False"], out


async def test_a_kubeconfig_reader_fallback_keeps_the_same_answers(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # CA and client certificate as files next to the kubeconfig (relative paths): our reader;
    # the same plus an unknown user key: kubernetes-asyncio. Both reach the server as admin.
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())["users"][0]["user"]
    cluster = _cluster(control_plane)
    (tmp_path / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(admin["client-certificate-data"]))
    (tmp_path / "tls.key").write_bytes(base64.b64decode(admin["client-key-data"]))
    files = {"client-certificate": "tls.crt", "client-key": "tls.key"}
    for name, user in (("ours", files), ("fallback", {**files, "username": "ignored"})):
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {"server": cluster["server"], "certificate-authority": "ca.crt"},
                }
            ],
            "users": [{"name": "u", "user": user}],
            "contexts": [
                {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "n1"}}
            ],
            "current-context": "x",
        }
        path = tmp_path / f"kubeconfig-{name}"
        path.write_text(yaml.safe_dump(config))
        simple = read_simple_kubeconfig(path)
        assert (simple is None) == (name == "fallback")
        loaded = await load_kubeconfig(path)
        assert loaded.namespace == "n1"
        assert loaded.server == cluster["server"].rstrip("/")
        async with Transport(loaded) as transport:
            assert (await transport.get_json("/api/v1/namespaces"))["kind"] == "NamespaceList"
    with pytest.raises(ConfigError, match="no context 'missing'"):
        read_simple_kubeconfig(tmp_path / "kubeconfig-ours", "missing")
