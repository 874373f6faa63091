"""The local cluster's S3 server configuration: generated credentials that never print, files
only root can read, a ``weed mini`` bound to the node's address without the ports that clash
with the node, and the Service Pods use to reach it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import yaml

from controller_runtime.envtest.node import s3


def test_credentials_are_random_and_their_secret_never_prints() -> None:
    one, two = s3.S3Credentials.generate(), s3.S3Credentials.generate()
    assert one != two and one.access_key.startswith("CRPY")
    assert len(one.secret_key) >= 30
    assert one.secret_key not in repr(one) and one.secret_key not in str(one)
    endpoint = s3.S3Endpoint("http://x", "http://y", "b", one, Path("/nowhere"))
    assert one.secret_key not in repr(endpoint)


def test_the_identity_and_credentials_files_are_private(tmp_path: Path) -> None:
    creds = s3.S3Credentials.generate()
    credentials_file = s3.write_config(tmp_path, creds)
    identities = tmp_path / "identities.json"
    for path in (credentials_file, identities):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    identity = json.loads(identities.read_text())["identities"][0]
    assert identity["credentials"] == [
        {"accessKey": creds.access_key, "secretKey": creds.secret_key}
    ]
    assert "Admin" in identity["actions"]
    assert credentials_file.read_text().splitlines() == [
        f"AWS_ACCESS_KEY_ID={creds.access_key}",
        f"AWS_SECRET_ACCESS_KEY={creds.secret_key}",
    ]
    assert (tmp_path / "data").is_dir()


def test_weed_listens_on_the_node_address_without_clashing_ports(tmp_path: Path) -> None:
    command = s3.weed_command(Path("/bin/weed"), tmp_path, "172.30.255.2", "backups")
    assert command[:2] == ["/bin/weed", "mini"]
    assert "-ip.bind=172.30.255.2" in command and "-ip=172.30.255.2" in command
    assert f"-s3.port={s3.S3_PORT}" in command
    # 8181 (Iceberg's default) is CoreDNS's readiness port in the node's namespace.
    assert "-s3.port.iceberg=0" in command and "-s3.port.lance=0" in command
    assert "-webdav=false" in command and "-bucket=backups" in command
    assert f"-dir={tmp_path / 'data'}" in command
    assert f"-s3.config={tmp_path / 'identities.json'}" in command
    assert f"-s3.localSocket={tmp_path / 's3.sock'}" in command  # not a shared /tmp path


def test_pods_reach_the_server_through_a_service_backed_by_the_node_address() -> None:
    docs = list(yaml.safe_load_all(s3.service_manifest("172.30.255.2")))
    kinds = {d["kind"]: d for d in docs}
    service, slice_ = kinds["Service"], kinds["EndpointSlice"]
    assert "selector" not in service["spec"]
    assert service["spec"]["ports"][0]["port"] == s3.S3_PORT
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == service["metadata"]["name"]
    assert slice_["endpoints"][0]["addresses"] == ["172.30.255.2"]
    assert slice_["ports"][0]["port"] == s3.S3_PORT
    assert s3.cluster_url() == (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}"
        f".svc.cluster.local:{s3.S3_PORT}"
    )
