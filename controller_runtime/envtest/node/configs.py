"""The configuration files of the local node's components, rendered from its addresses
(pure functions: no file or process is touched here).

The settings without which no Pod starts on a machine of this kind (cgroup v1, no
CAP_SYS_RESOURCE) are here: containerd's ``restrict_oom_score_adj`` and ``disable_apparmor``,
runc without systemd cgroups, the kubelet's ``failCgroupV1: false`` / ``cgroupfs`` /
``failSwapOn: false`` and low eviction thresholds. The CNI configuration gives Pods no
default route (only the service range and the node link) and no masquerading; CoreDNS has no
upstream (no ``forward`` plugin is even built).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Addresses:
    """The node's network plan. Defaults: a /30 link between the host and the node's network
    namespace, Pods in a /24 behind a bridge, the control plane's service range."""

    host: str = "172.30.255.1"
    node: str = "172.30.255.2"
    link_cidr: str = "172.30.255.0/30"
    pod_cidr: str = "172.30.0.0/24"
    pod_gateway: str = "172.30.0.1"
    service_cidr: str = "10.0.0.0/24"
    bridge: str = "crpy0"
    node_name: str = "crpy-node"


def containerd_toml(workdir: Path, cni_conf_dir: Path, sandbox_image: str, runc: str) -> str:
    """containerd 2.x (config version 3): state under ``workdir``, the CRI plugin with the
    settings this machine needs."""
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
"""


def cni_conflist(addresses: Addresses) -> str:
    """A bridge network with host-local IPAM. Routes: the service range and the node link
    only, so a Pod has no way out of the node; ``ipMasq`` off."""
    config = {
        "cniVersion": "1.0.0",
        "name": "crpy-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": addresses.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": addresses.pod_cidr, "gateway": addresses.pod_gateway}]],
                    "routes": [{"dst": addresses.service_cidr}, {"dst": addresses.link_cidr}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2)


def kubelet_config(
    addresses: Addresses,
    containerd_socket: Path,
    ca_file: Path,
    resolv_conf: Path,
    pod_logs: Path,
) -> str:
    """The kubelet's configuration: cgroup v1 with cgroupfs, swap tolerated, low eviction
    thresholds (a small disk must not evict the test's Pods), client certificates checked
    against the cluster CA and requests authorized by the API server."""
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "address": addresses.node,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [addresses.pod_gateway],
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
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(addresses: Addresses, kubeconfig: Path) -> str:
    """kube-proxy in iptables mode inside the node's namespace. Conntrack limits and
    timeouts stay as they are (0 = leave alone): they are the machine's, not the node's."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": addresses.pod_cidr,
        "hostnameOverride": addresses.node_name,
        "bindAddress": addresses.node,
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
    cluster fail instead of leaving the node. ``ready`` listens on the node's link address
    so the host can wait for it."""
    return f""".:53 {{
    errors
    health 127.0.0.1:8080
    ready {addresses.node}:8181
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


def local_volumes(directory: Path, count: int, size: str) -> str:
    """The node's storage: a default StorageClass without a provisioner and ``count``
    pre-created hostPath PersistentVolumes of ``size`` in ``directory`` (world-writable, so
    any container user can use them). A PVC binds one when its Pod is scheduled; a
    released volume is recycled by nothing (``Retain``): ``count`` bounds the claims of a
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
    for number in range(count):
        documents.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"local-{number:02d}"},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "local",
                    "hostPath": {"path": str(directory / f"local-{number:02d}"), "type": ""},
                },
            }
        )
    return yaml.safe_dump_all(documents, sort_keys=False)
