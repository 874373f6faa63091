"""The local cluster's network: a link (a bridge in a network namespace of its own) that joins
the host and one network namespace per node, and nothing else.

::

    host namespace               crpy-net (the link)                 crpy-node-<i> (a node)
    crpy-net0 172.30.255.1 ──── host ┐                          ┌─ eth0 172.30.255.<1+i>
    (API server; routes to            crpy-br 172.30.255.254 ───┤  crpy0 172.30.<i-1>.1/24
     every node's Pods)               (CoreDNS, S3 server)      └─ (the node's Pods)
                                      port crpy-node-<i> per node

* ``crpy-net`` holds the bridge ``crpy-br`` with one port per node (named after the node)
  and one to the host, and the cluster's shared services (CoreDNS, the S3 server) on the
  bridge's address ``infra``. It routes each node's Pod range to that node (for its replies).
* Each node's namespace (named after the node) holds its containerd, kubelet and
  kube-proxy, its Pods' bridge ``crpy0`` and every iptables rule its kube-proxy writes; a
  route to every other node's Pod range through that node's address on the link, so Pods
  on different nodes reach each other without encapsulation and without masquerading.
* The host end of the link (``crpy-net0``, the API server's address), one route per node
  to its Pod range and one route to the service range through the first node are the only
  changes in the host's namespace; they go with ``crpy-net``. The service route makes the API
  server reach a Service's cluster IP as on a node that runs kube-proxy (a kubeadm control
  plane): its calls to admission and conversion webhooks by Service go through the first
  node's kube-proxy rules (which masquerade them, the host being outside the cluster's Pod
  range, so the replies come back the same way), as a Pod's connections do. While the first
  node is partitioned or lost, the API server reaches no Service.
* Containment: no namespace has a default route, so nothing in them can reach beyond the
  link; in every node a FORWARD chain (``CRPY-CONTAIN``) also drops anything from the Pod
  range to an address outside the Pod range, the service range and the link. No
  masquerading. The host does not forward (``ip_forward`` stays as it is).
* A node is partitioned by taking its port on the bridge down (:func:`partition`): its
  namespace, processes and Pods keep running and keep their addresses and routes, but
  nothing crosses the link any more, in either direction, until :func:`reconnect`.

Every function here acts only on these names, never on interfaces it did not create.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from controller_runtime.envtest.node.configs import Addresses, NodeAddresses

LINK_NETNS = "crpy-net"
HOST_VETH = "crpy-net0"
HOST_PORT = "host"
BRIDGE = "crpy-br"
NODE_VETH = "eth0"
CONTAIN_CHAIN = "CRPY-CONTAIN"

_OURS = re.compile(r"^(crpy-net|crpy-node(-\d+)?)$")
"""Namespaces this module makes (``crpy-node`` alone: a single node of an earlier layout,
which a killed run may have left)."""
_LEGACY_HOST_VETHS = ("crpy-node0",)
NETNS_DIR = Path("/run/netns")
"""Where ``ip netns`` keeps named network namespaces."""


class NetworkError(RuntimeError):
    """The cluster's network could not be set up or changed."""


def netns_path(netns: str) -> Path:
    return NETNS_DIR / netns


def in_netns(command: list[str], netns: str) -> list[str]:
    """``command`` run in network namespace ``netns`` (and no other namespace)."""
    return ["nsenter", f"--net={netns_path(netns)}", "--", *command]


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def namespaces() -> list[str]:
    """The network namespaces of ours that exist (the link's and every node's)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(entry.name for entry in NETNS_DIR.iterdir() if _OURS.match(entry.name))


def exists() -> bool:
    """Whether any namespace of ours exists (a cluster runs, or one was left behind)."""
    return bool(namespaces())


def set_up(addresses: Addresses, nodes: Sequence[NodeAddresses]) -> None:
    """Create the link with the host's end, then each node's namespace on it, with routes
    between every two of them and the containment chain in each node."""
    prefix = addresses.link_prefix
    link = ["ip", "-n", LINK_NETNS]
    for step in (
        ["ip", "netns", "add", LINK_NETNS],
        [*link, "link", "set", "lo", "up"],
        [*link, "link", "add", BRIDGE, "type", "bridge"],
        [*link, "addr", "add", f"{addresses.infra}/{prefix}", "dev", BRIDGE],
        [*link, "link", "set", BRIDGE, "up"],
        [
            *["ip", "link", "add", HOST_VETH, "type", "veth"],
            *["peer", "name", HOST_PORT, "netns", LINK_NETNS],
        ],
        [*link, "link", "set", HOST_PORT, "master", BRIDGE, "up"],
        ["ip", "addr", "add", f"{addresses.host}/{prefix}", "dev", HOST_VETH],
        ["ip", "link", "set", HOST_VETH, "up"],
    ):
        _run(step)
    for number, node in enumerate(nodes):
        _set_up_node(addresses, node, earlier=nodes[:number])
    if nodes:
        first = nodes[0].address
        _run(["ip", "route", "add", addresses.service_cidr, "via", first, "dev", HOST_VETH])


def _set_up_node(
    addresses: Addresses, node: NodeAddresses, *, earlier: Sequence[NodeAddresses]
) -> None:
    """One node's namespace on the link, with routes both ways between it and the nodes
    set up before it."""
    prefix = addresses.link_prefix
    inside = ["ip", "-n", node.netns]
    for step in (
        ["ip", "netns", "add", node.netns],
        [
            *["ip", "-n", LINK_NETNS, "link", "add", node.name, "type", "veth"],
            *["peer", "name", NODE_VETH, "netns", node.netns],
        ],
        ["ip", "-n", LINK_NETNS, "link", "set", node.name, "master", BRIDGE, "up"],
        [*inside, "link", "set", "lo", "up"],
        [*inside, "addr", "add", f"{node.address}/{prefix}", "dev", NODE_VETH],
        [*inside, "link", "set", NODE_VETH, "up"],
    ):
        _run(step)
    contain = ["iptables", "-w"]
    for step in (
        ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
        ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"],
        [*contain, "-N", CONTAIN_CHAIN],
        [*contain, "-A", CONTAIN_CHAIN, "-d", addresses.pod_cidr, "-j", "RETURN"],
        [*contain, "-A", CONTAIN_CHAIN, "-d", addresses.service_cidr, "-j", "RETURN"],
        [*contain, "-A", CONTAIN_CHAIN, "-d", addresses.link_cidr, "-j", "RETURN"],
        [*contain, "-A", CONTAIN_CHAIN, "-j", "DROP"],
        [*contain, "-I", "FORWARD", "1", "-s", addresses.pod_cidr, "-j", CONTAIN_CHAIN],
    ):
        _run(in_netns(step, node.netns))
    # Each node's Pods are reached through that node's address on the link: from the other
    # nodes, from the link's namespace (CoreDNS's and S3's replies) and from the host.
    via = ["via", node.address]
    for other in earlier:
        _run(["ip", "-n", other.netns, "route", "add", node.pod_cidr, *via])
        _run([*inside, "route", "add", other.pod_cidr, "via", other.address])
    _run(["ip", "-n", LINK_NETNS, "route", "add", node.pod_cidr, *via])
    _run(["ip", "route", "add", node.pod_cidr, *via, "dev", HOST_VETH])


def partition(node: NodeAddresses) -> None:
    """Cut ``node`` off the link: its port on the bridge goes down, so it reaches neither
    the API server, nor the other nodes, nor CoreDNS, and none of them reaches it. Nothing
    inside the node changes."""
    _run(["ip", "-n", LINK_NETNS, "link", "set", node.name, "down"])


def reconnect(node: NodeAddresses) -> None:
    """Undo :func:`partition`."""
    _run(["ip", "-n", LINK_NETNS, "link", "set", node.name, "up"])


def tear_down() -> list[str]:
    """Delete every namespace of ours (bridges, veth ends and iptables rules go with them)
    and the host end of the link if it outlived them. Returns what could not be removed."""
    problems: list[str] = []
    for netns in namespaces():
        result = subprocess.run(
            ["ip", "netns", "del", netns], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            problems.append(f"ip netns del {netns}: {result.stderr.strip()}")
    for veth in (HOST_VETH, *_LEGACY_HOST_VETHS):
        host_end = Path(f"/sys/class/net/{veth}")
        deadline = time.monotonic() + 5
        while host_end.exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the kernel removes the peer of a deleted namespace's veth lazily
        if host_end.exists():
            result = subprocess.run(
                ["ip", "link", "del", veth], capture_output=True, text=True, check=False
            )
            if result.returncode != 0 and host_end.exists():
                problems.append(f"ip link del {veth}: {result.stderr.strip()}")
    return problems


def leftovers() -> list[str]:
    """What of ours is on the machine: namespaces and host ends of links (empty once a
    cluster has stopped)."""
    found = [f"network namespace {netns}" for netns in namespaces()]
    found += [
        f"interface {veth}"
        for veth in (HOST_VETH, *_LEGACY_HOST_VETHS)
        if Path(f"/sys/class/net/{veth}").exists()
    ]
    return found


def pids_in_netns(netns: str | None = None) -> list[int]:
    """Processes whose network namespace is ``netns`` (default: any of ours); all of them
    were started by the cluster."""
    pids: list[int] = []
    for name in [netns] if netns else namespaces():
        if not netns_path(name).exists():
            continue
        result = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
        )
        pids += [int(line) for line in result.stdout.split() if line.isdigit()]
    return pids
