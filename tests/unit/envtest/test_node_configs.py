"""The local node's rendered configuration and image archives (pure parts, no root needed)."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.envtest.node import configs
from controller_runtime.envtest.node.cluster import NodeUnavailableError, preflight
from controller_runtime.envtest.node.images import ImageSpec, _pack_oci_archive

ADDR = configs.Addresses()


def test_containerd_has_the_settings_without_which_no_pod_starts(tmp_path: Path) -> None:
    text = configs.containerd_toml(tmp_path, tmp_path / "cni", "pause:1", "/usr/sbin/runc")
    config = tomllib.loads(text)
    assert config["version"] == 3
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["disable_apparmor"] is True
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False
    assert runc["options"]["BinaryName"] == "/usr/sbin/runc"
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["snapshotter"] == "overlayfs"
    assert images["pinned_images"]["sandbox"] == "pause:1"
    assert config["grpc"]["address"].startswith(str(tmp_path))
    assert config["root"].startswith(str(tmp_path)) and config["state"].startswith(str(tmp_path))


def test_pods_get_no_default_route_and_no_masquerading() -> None:
    plugin = json.loads(configs.cni_conflist(ADDR))["plugins"][0]
    assert plugin["ipMasq"] is False
    routes = [route["dst"] for route in plugin["ipam"]["routes"]]
    assert routes == [ADDR.service_cidr, ADDR.link_cidr]
    assert not any(dst.endswith("/0") for dst in routes)


def test_kubelet_runs_on_cgroup_v1_with_cgroupfs_and_low_eviction(tmp_path: Path) -> None:
    config = yaml.safe_load(
        configs.kubelet_config(
            ADDR, tmp_path / "sock", tmp_path / "ca.crt", tmp_path / "r", tmp_path / "logs"
        )
    )
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failSwapOn"] is False
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["clusterDNS"] == [ADDR.pod_gateway]
    assert config["evictionHard"]["nodefs.available"] == "1%"
    assert config["podLogsDir"] == str(tmp_path / "logs")


def test_kube_proxy_leaves_the_machines_conntrack_settings_alone(tmp_path: Path) -> None:
    config = yaml.safe_load(configs.kube_proxy_config(ADDR, tmp_path / "kubeconfig"))
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["conntrack"]["min"] == 0
    assert config["clusterCIDR"] == ADDR.pod_cidr


def test_coredns_has_no_upstream(tmp_path: Path) -> None:
    corefile = configs.corefile(ADDR, tmp_path / "kubeconfig")
    assert "forward" not in corefile
    assert "kubernetes cluster.local" in corefile


def test_an_oci_archive_is_consistent(tmp_path: Path) -> None:
    (tmp_path / "hello").write_text("hi")
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        tar.add(tmp_path / "hello", arcname="hello")
    spec = ImageSpec(name="docker.io/library/demo:1", config={"Entrypoint": ["/hello"]})
    archive = tmp_path / "image.tar"
    _pack_oci_archive(spec, layer, archive)
    with tarfile.open(archive) as tar:
        blobs = {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(blobs["index.json"])
    entry = index["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == "docker.io/library/demo:1"
    manifest = json.loads(blobs[f"blobs/{entry['digest'].replace(':', '/')}"])
    config = json.loads(blobs[f"blobs/{manifest['config']['digest'].replace(':', '/')}"])
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    assert config["config"]["Entrypoint"] == ["/hello"]
    assert json.loads(blobs["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}


@given(st.lists(st.text(max_size=8), max_size=4), st.text(min_size=1, max_size=8))
def test_an_image_is_rebuilt_when_any_input_changes(packages: list[str], extra: str) -> None:
    base = ImageSpec(name="x:1", packages=tuple(packages))
    changed = ImageSpec(name="x:1", packages=tuple(packages), inputs=(extra,))
    assert base.fingerprint() == ImageSpec(name="x:1", packages=tuple(packages)).fingerprint()
    assert base.fingerprint() != changed.fingerprint()
    assert base.archive_path() != changed.archive_path()


def test_the_node_refuses_without_root_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NodeUnavailableError) as caught:
        preflight()
    message = str(caught.value)
    assert "root" in message and "\n" not in message
