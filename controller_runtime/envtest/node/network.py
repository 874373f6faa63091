"""The local node's network: a network namespace of its own, joined to the host by one veth
pair, and nothing else.

* The namespace ``crpy-node`` holds the kubelet, containerd, kube-proxy, CoreDNS, the Pods'
  bridge and every iptables rule kube-proxy writes; deleting it removes all of them.
* The host side of the veth (``crpy-node0``, the API server's address) and two host routes
  through it, to the Pod range and to the service range, are the only changes in the host's
  namespace; all go with the namespace. The service route makes the API server reach a
  Service's cluster IP as on a node that runs kube-proxy (a kubeadm control plane): its calls
  to admission and conversion webhooks by Service go through kube-proxy's rules in the
  node's namespace, as a Pod's connections do.
* Containment: the namespace has no default route, so nothing in it can reach beyond the host
  end of the link; a FORWARD chain (``CRPY-CONTAIN``) also drops anything from the Pod range
  to an address outside the Pod range, the service range and the link. No masquerading.

Every function here acts only on these names, never on interfaces it did not create.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from controller_runtime.envtest.node.configs import Addresses

NETNS = "crpy-node"
HOST_VETH = "crpy-node0"
NODE_VETH = "eth0"
CONTAIN_CHAIN = "CRPY-CONTAIN"


class NetworkError(RuntimeError):
    """The node's network could not be set up."""


def netns_path() -> Path:
    return Path("/run/netns") / NETNS


def in_netns(command: list[str]) -> list[str]:
    """``command`` run in the node's network namespace (and no other namespace)."""
    return ["nsenter", f"--net={netns_path()}", "--", *command]


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def exists() -> bool:
    return netns_path().exists()


def set_up(addresses: Addresses) -> None:
    """Create the namespace, the link, the host routes and the containment chain."""
    prefix = addresses.link_cidr.split("/")[1]
    steps = [
        ["ip", "netns", "add", NETNS],
        ["ip", "link", "add", HOST_VETH, "type", "veth", "peer", "name", NODE_VETH, "netns", NETNS],
        ["ip", "addr", "add", f"{addresses.host}/{prefix}", "dev", HOST_VETH],
        ["ip", "link", "set", HOST_VETH, "up"],
        ["ip", "route", "add", addresses.pod_cidr, "via", addresses.node, "dev", HOST_VETH],
        ["ip", "route", "add", addresses.service_cidr, "via", addresses.node, "dev", HOST_VETH],
    ]
    inside = [
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{addresses.node}/{prefix}", "dev", NODE_VETH],
        ["ip", "link", "set", NODE_VETH, "up"],
        ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
        ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"],
        ["iptables", "-w", "-N", CONTAIN_CHAIN],
        ["iptables", "-w", "-A", CONTAIN_CHAIN, "-d", addresses.pod_cidr, "-j", "RETURN"],
        ["iptables", "-w", "-A", CONTAIN_CHAIN, "-d", addresses.service_cidr, "-j", "RETURN"],
        ["iptables", "-w", "-A", CONTAIN_CHAIN, "-d", addresses.link_cidr, "-j", "RETURN"],
        ["iptables", "-w", "-A", CONTAIN_CHAIN, "-j", "DROP"],
        ["iptables", "-w", "-I", "FORWARD", "1", "-s", addresses.pod_cidr, "-j", CONTAIN_CHAIN],
    ]
    # The host routes are added last: the node address must exist in the namespace first.
    for step in steps[:-2]:
        _run(step)
    for step in inside:
        _run(in_netns(step))
    for step in steps[-2:]:
        _run(step)


def tear_down() -> list[str]:
    """Delete the namespace (its bridge, veth end and iptables rules go with it) and the host
    end of the link if it outlived it. Returns what could not be removed."""
    problems: list[str] = []
    if exists():
        result = subprocess.run(
            ["ip", "netns", "del", NETNS], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            problems.append(f"ip netns del {NETNS}: {result.stderr.strip()}")
    host_end = Path(f"/sys/class/net/{HOST_VETH}")
    deadline = time.monotonic() + 5
    while host_end.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the kernel removes the peer of a deleted namespace's veth lazily
    if host_end.exists():
        result = subprocess.run(
            ["ip", "link", "del", HOST_VETH], capture_output=True, text=True, check=False
        )
        if result.returncode != 0 and host_end.exists():
            problems.append(f"ip link del {HOST_VETH}: {result.stderr.strip()}")
    return problems


def pids_in_netns() -> list[int]:
    """Processes whose network namespace is the node's (all of them were started by it)."""
    if not exists():
        return []
    result = subprocess.run(
        ["ip", "netns", "pids", NETNS], capture_output=True, text=True, check=False
    )
    return [int(line) for line in result.stdout.split() if line.isdigit()]
