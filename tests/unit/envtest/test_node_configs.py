"""The local node's rendered configuration and image archives (pure parts, no root needed)."""

from __future__ import annotations

import hashlib
import ipaddress
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
NODE = ADDR.node(1)


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
    nri = config["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is True, "NRI's socket is one per machine: not for several nodes"


@given(st.integers(min_value=1, max_value=configs.MAX_NODES))
def test_pods_get_no_default_route_and_no_masquerading(index: int) -> None:
    node = ADDR.node(index)
    plugin = json.loads(configs.cni_conflist(ADDR, node, Path("/x/ipam")))["plugins"][0]
    assert plugin["ipMasq"] is False
    routes = [route["dst"] for route in plugin["ipam"]["routes"]]
    assert routes == [ADDR.pod_cidr, ADDR.service_cidr, ADDR.link_cidr]
    assert not any(dst.endswith("/0") for dst in routes)
    assert plugin["ipam"]["ranges"] == [[{"subnet": node.pod_cidr, "gateway": node.pod_gateway}]]
    assert plugin["ipam"]["dataDir"] == "/x/ipam", "each node keeps its own allocations"


def test_every_node_has_its_own_addresses_pod_range_zone_and_cgroup_tree() -> None:
    nodes = ADDR.nodes(configs.MAX_NODES)
    link = ipaddress.ip_network(ADDR.link_cidr)
    pods = ipaddress.ip_network(ADDR.pod_cidr)
    assert [n.name for n in nodes[:3]] == ["crpy-node-1", "crpy-node-2", "crpy-node-3"]
    assert [n.zone for n in nodes[:4]] == ["zone-a", "zone-b", "zone-c", "zone-a"]
    assert nodes[0].address == "172.30.255.2" and nodes[0].pod_cidr == "172.30.0.0/24"
    addresses = [ipaddress.ip_address(n.address) for n in nodes]
    assert len(set(addresses)) == len(nodes)
    assert all(a in link for a in addresses)
    assert str(ADDR.host) not in {n.address for n in nodes}
    assert ADDR.infra not in {n.address for n in nodes}
    ranges = [ipaddress.ip_network(n.pod_cidr) for n in nodes]
    assert all(r.subnet_of(pods) for r in ranges)  # type: ignore[arg-type]
    assert not any(a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :])
    assert not any(r.overlaps(link) for r in ranges)
    assert len({n.cgroup_root for n in nodes}) == len(nodes)
    with pytest.raises(ValueError, match="1 to"):
        ADDR.node(configs.MAX_NODES + 1)


def test_kubelet_runs_on_cgroup_v1_with_cgroupfs_and_low_eviction(tmp_path: Path) -> None:
    node = ADDR.node(2)
    config = yaml.safe_load(
        configs.kubelet_config(
            ADDR,
            node,
            containerd_socket=tmp_path / "sock",
            ca_file=tmp_path / "ca.crt",
            resolv_conf=tmp_path / "r",
            pod_logs=tmp_path / "logs",
        )
    )
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/crpy-node-2", "kubelets must not share a kubepods tree"
    assert config["failSwapOn"] is False
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["clusterDNS"] == [ADDR.infra]
    assert config["address"] == node.address
    assert config["evictionHard"]["nodefs.available"] == "1%"
    assert config["podLogsDir"] == str(tmp_path / "logs")
    renew = config["nodeLeaseDurationSeconds"] / 4
    assert renew * 3 < configs.NODE_MONITOR_GRACE_SECONDS, "a late renewal must not flap"
    assert configs.kubelet_labels(node) == "topology.kubernetes.io/zone=zone-b"


def test_kube_proxy_leaves_the_machines_conntrack_settings_alone(tmp_path: Path) -> None:
    node = ADDR.node(3)
    config = yaml.safe_load(configs.kube_proxy_config(ADDR, node, tmp_path / "kubeconfig"))
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["conntrack"]["min"] == 0
    assert config["clusterCIDR"] == ADDR.pod_cidr
    assert config["hostnameOverride"] == "crpy-node-3"
    assert config["bindAddress"] == node.address


def test_local_volumes_are_bound_to_their_node(tmp_path: Path) -> None:
    directories = {n.name: tmp_path / n.name for n in ADDR.nodes(3)}
    documents = list(yaml.safe_load_all(configs.local_volumes(directories, 2, "1Gi")))
    storage_class = documents[0]
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"
    volumes = documents[1:]
    assert len(volumes) == 6
    for volume in volumes:
        terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        (expression,) = terms[0]["matchExpressions"]
        (node,) = expression["values"]
        assert expression["key"] == "kubernetes.io/hostname" and expression["operator"] == "In"
        assert volume["metadata"]["name"].startswith(f"{node}-")
        assert volume["spec"]["hostPath"]["path"].startswith(str(directories[node]) + "/")
    assert len({v["metadata"]["name"] for v in volumes}) == 6
    assert len({v["spec"]["hostPath"]["path"] for v in volumes}) == 6


def test_coredns_has_no_upstream(tmp_path: Path) -> None:
    corefile = configs.corefile(ADDR, tmp_path / "kubeconfig")
    assert "forward" not in corefile
    assert f"ready {ADDR.infra}:8181" in corefile
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
