"""The configuration files of the local cluster's components, rendered from its network
plan (pure functions: no file or process is touched here).

The settings without which no Pod starts on a machine of this kind (cgroup v1, no
CAP_SYS_RESOURCE) are here: containerd's ``restrict_oom_score_adj`` and ``disable_apparmor``,
runc without systemd cgroups, the kubelet's ``failCgroupV1: false`` / ``cgroupfs`` /
``failSwapOn: false`` and low eviction thresholds. The CNI configuration gives Pods no
default route (only the cluster's Pod range, the service range and the link) and no
masquerading; CoreDNS has no upstream (no ``forward`` plugin is even built).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

ZONES = ("zone-a", "zone-b", "zone-c")
"""The zones the nodes are labelled with (``topology.kubernetes.io/zone``), in turn."""

MAX_NODES = 16
"""The most nodes one cluster may have (each takes a /24 of the Pod range)."""


@dataclass(frozen=True)
class NodeAddresses:
    """One node's share of the plan: its name (also its network namespace's and its cgroup
    root's), zone, address on the cluster's link, and the /24 its Pods get."""

    name: str
    zone: str
    address: str
    pod_cidr: str
    pod_gateway: str
    bridge: str = "crpy0"
    """The Pods' bridge inside the node's namespace (each node has its own)."""

    @property
    def netns(self) -> str:
        return self.name

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``: each node's Pods live under a tree of their own."""
        return f"/{self.name}"


@dataclass(frozen=True)
class Addresses:
    """The cluster's network plan. Defaults: one link (a bridge the cluster makes) joining
    the host (``host``, where the API server listens), every node (``link_cidr``'s
    addresses after the host's: node 1 is ``172.30.255.2``) and the cluster's own services
    (``infra``: CoreDNS and the S3 server); each node's Pods in the /24 number ``i - 1`` of
    ``pod_cidr`` (node 1: ``172.30.0.0/24``); the control plane's service range."""

    host: str = "172.30.255.1"
    infra: str = "172.30.255.254"
    link_cidr: str = "172.30.255.0/24"
    pod_cidr: str = "172.30.0.0/17"
    service_cidr: str = "10.0.0.0/24"
    node_prefix: str = "crpy-node"
    zones: tuple[str, ...] = ZONES

    def node(self, index: int) -> NodeAddresses:
        """Node ``index`` (1-based): ``crpy-node-<index>`` in zone ``zones[(index - 1) %
        len(zones)]``."""
        if not 1 <= index <= MAX_NODES:
            raise ValueError(f"a local cluster has 1 to {MAX_NODES} nodes, not {index}")
        link = ipaddress.IPv4Network(self.link_cidr)
        pods = list(ipaddress.IPv4Network(self.pod_cidr).subnets(new_prefix=24))
        if index + 1 >= link.num_addresses - 1 or index > len(pods):
            raise ValueError(
                f"the plan {self.link_cidr}/{self.pod_cidr} has no room for node {index}"
            )
        pod_cidr = pods[index - 1]
        return NodeAddresses(
            name=f"{self.node_prefix}-{index}",
            zone=self.zones[(index - 1) % len(self.zones)],
            address=str(link.network_address + 1 + index),
            pod_cidr=str(pod_cidr),
            pod_gateway=str(pod_cidr.network_address + 1),
        )

    def nodes(self, count: int) -> list[NodeAddresses]:
        return [self.node(index) for index in range(1, count + 1)]

    @property
    def link_prefix(self) -> int:
        return ipaddress.IPv4Network(self.link_cidr).prefixlen


def containerd_toml(workdir: Path, cni_conf_dir: Path, sandbox_image: str, runc: str) -> str:
    """containerd 2.x (config version 3): state under ``workdir``, the CRI plugin with the
    settings this machine needs, nothing shared with another node's containerd (NRI off)."""
    root = workdir / "containerd"
    cri = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = "{root / "root"}"
state = "{root / "state"}"

[grpc]
  address = "{root / "containerd.sock"}"

[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"

[debug]
  address = ""

[metrics]
  address = ""

[{cri}]
  enable_selinux = false
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true

  [{cri}.containerd]
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"

  [{cri}.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni_conf_dir}"
    max_conf_num = 1

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox_image}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

# NRI's socket is one path per machine (/var/run/nri/nri.sock): a second node's containerd
# would take it from the first. No NRI plugin is used.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
"""


def cni_conflist(addresses: Addresses, node: NodeAddresses, ipam_dir: Path) -> str:
    """A bridge network with host-local IPAM over the node's /24 (its allocations kept in
    ``ipam_dir``, the node's own). Routes: every node's Pods, the service range and the
    cluster's link only, so a Pod has no way out of the cluster; ``ipMasq`` off."""
    config = {
        "cniVersion": "1.0.0",
        "name": "crpy-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [[{"subnet": node.pod_cidr, "gateway": node.pod_gateway}]],
                    "routes": [
                        {"dst": addresses.pod_cidr},
                        {"dst": addresses.service_cidr},
                        {"dst": addresses.link_cidr},
                    ],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2)


NODE_LEASE_SECONDS = 20
"""The kubelet's ``nodeLeaseDurationSeconds``: it renews its Lease every quarter of it
(5 s), four renewals per :data:`NODE_MONITOR_GRACE_SECONDS`."""

NODE_MONITOR_GRACE_SECONDS = 20
"""kube-controller-manager's ``--node-monitor-grace-period``: a node whose kubelet has not
renewed its Lease (nor posted its status) for this long is marked ``Ready=Unknown``. The
upstream default is 50 s; 20 s lets node-loss tests finish in under a minute."""

NODE_MONITOR_PERIOD_SECONDS = 5
"""kube-controller-manager's ``--node-monitor-period`` (upstream default): how often it
checks the nodes, so ``Ready=Unknown`` comes at most this much after the grace period."""


def kubelet_config(
    addresses: Addresses,
    node: NodeAddresses,
    *,
    containerd_socket: Path,
    ca_file: Path,
    resolv_conf: Path,
    pod_logs: Path,
) -> str:
    """The kubelet's configuration: cgroup v1 with cgroupfs under the node's own
    ``cgroupRoot``, swap tolerated, low eviction thresholds (a small disk must not evict the
    test's Pods), client certificates checked against the cluster CA and requests authorized
    by the API server, CoreDNS at the cluster's ``infra`` address, a Lease of
    :data:`NODE_LEASE_SECONDS`."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "address": node.address,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [addresses.infra],
        "resolvConf": str(resolv_conf),
        "podLogsDir": str(pod_logs),
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "maxPods": 60,
        "shutdownGracePeriod": "0s",
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_labels(node: NodeAddresses) -> str:
    """The kubelet's ``--node-labels``: the node's zone (``kubernetes.io/hostname`` the
    kubelet sets itself, from ``--hostname-override``)."""
    return f"topology.kubernetes.io/zone={node.zone}"


def kube_proxy_config(addresses: Addresses, node: NodeAddresses, kubeconfig: Path) -> str:
    """kube-proxy in iptables mode inside the node's namespace; ``clusterCIDR`` is every
    node's Pods. Conntrack limits and timeouts stay as they are (0 = leave alone): they are
    the machine's, not the node's."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": addresses.pod_cidr,
        "hostnameOverride": node.name,
        "bindAddress": node.address,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


def corefile(addresses: Addresses, kubeconfig: Path) -> str:
    """CoreDNS answering for ``cluster.local`` only: no upstream, so names outside the
    cluster fail instead of leaving the node. It runs in the link's namespace, where its
    only address is ``infra`` (every node's Pods reach it there); ``ready`` listens on
    that address so the host can wait for it."""
    return f""".:53 {{
    errors
    health 127.0.0.1:8080
    ready {addresses.infra}:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loop
    reload
}}
"""


COREDNS_RBAC = """apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: crpy:coredns
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: crpy:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: crpy:coredns
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: crpy:coredns
"""


def local_volumes(directories: dict[str, Path], count: int, size: str) -> str:
    """The cluster's storage, as real local disks are: a default StorageClass without a
    provisioner that binds a claim only when its Pod is scheduled (``WaitForFirstConsumer``),
    and for each node (``directories``: node name → its volumes' directory) ``count``
    pre-created hostPath PersistentVolumes ``<node>-NN`` of ``size`` whose ``nodeAffinity``
    names that node: a claim binds on one node and its Pod can run only there. The
    directories are world-writable, so any container user can use them. A released volume is
    recycled by nothing (``Retain``): ``count`` bounds the claims a node takes in a
    cluster's life."""
    documents: list[dict[str, object]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": "local",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Retain",
        }
    ]
    for node, directory in directories.items():
        for number in range(count):
            documents.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": f"{node}-{number:02d}", "labels": {"crpy.io/node": node}},
                    "spec": {
                        "capacity": {"storage": size},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": "local",
                        "hostPath": {"path": str(directory / f"{number:02d}"), "type": ""},
                        "nodeAffinity": {
                            "required": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": [node],
                                            }
                                        ]
                                    }
                                ]
                            }
                        },
                    },
                }
            )
    return yaml.safe_dump_all(documents, sort_keys=False)
