"""One node of a :class:`~controller_runtime.envtest.node.cluster.LocalCluster`: containerd,
the kubelet and kube-proxy in the node's own network namespace, its Pods in its own cgroup
tree, and the faults a test can inject into it.

Faults (all return at once; observe their effect through the API, e.g. :meth:`WorkerNode.
wait_ready`):

* :meth:`~WorkerNode.lose`: the node is gone as far as the cluster can tell. Its kubelet
  and kube-proxy are killed (SIGKILL: no goodbye to the API server), and its Pods'
  processes are frozen (``containers="freeze"``, the default: they keep memory, sockets and
  addresses, as a hung machine does) or killed (``containers="kill"``: as a crashed
  machine's). kube-controller-manager marks the Node ``Ready=Unknown`` once its Lease has
  not been renewed for the node-monitor grace period
  (:data:`~controller_runtime.envtest.node.configs.NODE_MONITOR_GRACE_SECONDS`, 20 s;
  checked every 5 s; the Lease is renewed every 5 s), so 15-25 s after :meth:`lose`, and
  its Pods ``Ready=False``. Its network stays up: a frozen Pod's kernel still completes a
  TCP handshake (then nothing answers); add :meth:`partition` for a node that also drops
  off the network.
* :meth:`~WorkerNode.partition`: the node keeps running (kubelet, Pods, everything), but
  its port on the cluster's link is down: it reaches neither the API server, nor CoreDNS,
  nor the other nodes and their Pods, and none of them reaches it. The Node turns
  ``Ready=Unknown`` as for a lost node; its Pods go on running unseen.
* :meth:`~WorkerNode.restore`: undoes whatever faults are in force: the link back up, the
  Pods thawed, the kubelet and kube-proxy started again (the kubelet re-reads the Pods from
  containerd and reports to the API server; killed containers are started anew).
* :meth:`~WorkerNode.kill_containers`: SIGKILL every process of every Pod of the node
  (sandboxes included) while the kubelet keeps running: it restarts them as their
  ``restartPolicy`` says (new sandboxes: a Pod may get a new address).

Caveat: a kubelet or kube-proxy started again by :meth:`restore` does not die with the
process that started it (:meth:`restore` may be called from any thread); the cluster's
:meth:`~controller_runtime.envtest.node.cluster.LocalCluster.stop`, or the next start after
a killed run, removes it like every process of the node's namespace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from controller_runtime.envtest.controlplane import _Process
from controller_runtime.envtest.node import cgroups, configs, network
from controller_runtime.envtest.node.builds import NodeBinaries

Kubectl = Callable[..., str]
"""The cluster's kubectl: ``kubectl(*args, check=...)`` returns standard output."""


class NodeFaultError(RuntimeError):
    """A fault could not be injected or undone, or a node did not reach a state in time."""


class _Detached(_Process):
    """A process that does not die with the thread that started it (see module caveat)."""

    def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self.popen = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )


@dataclass
class WorkerNode:
    """One node (see module docs). Made and started by the cluster; tests get it from
    :meth:`LocalCluster.node`."""

    addresses: configs.NodeAddresses
    plan: configs.Addresses
    workdir: Path
    binaries: NodeBinaries
    kubectl: Kubectl
    processes: dict[str, _Process] = field(default_factory=dict)
    _commands: dict[str, list[str]] = field(default_factory=dict)
    _lost: bool = False
    _frozen: bool = False
    _partitioned: bool = False

    @property
    def name(self) -> str:
        return self.addresses.name

    @property
    def zone(self) -> str:
        return self.addresses.zone

    @property
    def address(self) -> str:
        """The node's address on the cluster's link (its InternalIP)."""
        return self.addresses.address

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def _path_env(self) -> str:
        return f"{self.binaries['containerd'].parent}:/usr/sbin:/usr/bin:/sbin:/bin"

    # -- start (by the cluster, from its thread) -------------------------------------------

    def start_containerd(self, sandbox_image: str, runc: str) -> None:
        """Write the node's containerd and CNI configuration and start containerd; the
        node's cgroup tree is made here too (before any Pod can need it)."""
        cgroups.create_root(self.name)
        (self.workdir / "containerd").mkdir(parents=True)
        cni_dir = self.workdir / "cni"
        cni_dir.mkdir()
        (cni_dir / "10-crpy.conflist").write_text(
            configs.cni_conflist(self.plan, self.addresses, self.workdir / "ipam")
        )
        config = self.workdir / "containerd.toml"
        config.write_text(configs.containerd_toml(self.workdir, cni_dir, sandbox_image, runc))
        self._spawn(
            "containerd",
            [
                "env",
                f"PATH={self._path_env()}",
                str(self.binaries["containerd"]),
                f"--config={config}",
            ],
        )

    def start_kubelet(self, kubeconfig: Path, ca_file: Path) -> None:
        resolv = self.workdir / "resolv.conf"
        resolv.write_text("# no upstream: the node's Pods resolve cluster names only\n")
        kubelet_config = self.workdir / "kubelet.yaml"
        kubelet_config.write_text(
            configs.kubelet_config(
                self.plan,
                self.addresses,
                containerd_socket=self.socket,
                ca_file=ca_file,
                resolv_conf=resolv,
                pod_logs=self.workdir / "pod-logs",
            )
        )
        self._spawn(
            "kubelet",
            [
                "env",
                f"PATH={self._path_env()}",
                str(self.binaries["kubelet"]),
                f"--config={kubelet_config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.workdir / 'kubelet'}",
                f"--cert-dir={self.workdir / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.address}",
                f"--node-labels={configs.kubelet_labels(self.addresses)}",
                "--v=1",
            ],
        )

    def start_kube_proxy(self, kubeconfig: Path) -> None:
        proxy_config = self.workdir / "kube-proxy.yaml"
        proxy_config.write_text(configs.kube_proxy_config(self.plan, self.addresses, kubeconfig))
        self._spawn(
            "kube-proxy",
            [
                "env",
                f"PATH={self._path_env()}",
                str(self.binaries["kube-proxy"]),
                f"--config={proxy_config}",
                "--v=1",
            ],
        )

    def _spawn(self, component: str, command: list[str], *, detached: bool = False) -> None:
        command = network.in_netns(command, self.addresses.netns)
        kind = _Detached if detached else _Process
        process = kind(f"{self.name}/{component}", command, self.workdir / f"{component}.log")
        process.start()
        self.processes[component] = process
        self._commands[component] = command

    def import_image(self, archive: Path | str) -> None:
        """Load an OCI archive into the node's containerd (namespace ``k8s.io``)."""
        path = Path(archive)
        self._ctr("images", "import", "--local", str(path), what=f"importing {path.name}")

    def tag_image(self, source: str, target: str) -> None:
        self._ctr("images", "tag", "--force", source, target, what=f"tagging {source}")

    def _ctr(self, *args: str, what: str) -> None:
        result = subprocess.run(
            [str(self.binaries["ctr"]), f"--address={self.socket}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise NodeFaultError(f"{what} on node {self.name} failed: {result.stderr.strip()}")

    # -- faults ----------------------------------------------------------------------------

    @property
    def faults(self) -> frozenset[str]:
        """The faults in force: ``"lost"``, ``"partitioned"`` (empty when healthy)."""
        return frozenset(
            name for name, on in (("lost", self._lost), ("partitioned", self._partitioned)) if on
        )

    def lose(self, *, containers: Literal["freeze", "kill"] = "freeze") -> None:
        """Lose the node (module docs): kubelet and kube-proxy killed, the Pods' processes
        frozen or killed. Undo with :meth:`restore`."""
        if self._lost:
            raise NodeFaultError(f"node {self.name} is already lost")
        for component in ("kubelet", "kube-proxy"):
            process = self.processes.get(component)
            if process is not None and process.popen is not None:
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGKILL)
                process.popen.wait()
        self._lost = True
        if containers == "freeze":
            cgroups.freeze(self.name)
            self._frozen = True
        else:
            self.kill_containers()

    def partition(self) -> None:
        """Cut the node off the cluster's link (module docs). Undo with :meth:`restore`."""
        if self._partitioned:
            raise NodeFaultError(f"node {self.name} is already partitioned")
        network.partition(self.addresses)
        self._partitioned = True

    def restore(self) -> None:
        """Undo every fault in force (module docs); nothing to do on a healthy node. Returns
        at once: :meth:`wait_ready` waits for the Node to be ``Ready`` again."""
        if self._partitioned:
            network.reconnect(self.addresses)
            self._partitioned = False
        if self._frozen:
            cgroups.thaw(self.name)
            self._frozen = False
        if self._lost:
            for component in ("kubelet", "kube-proxy"):
                command = self._commands[component]
                process = _Detached(
                    f"{self.name}/{component}", command, self.workdir / f"{component}.log"
                )
                process.start()
                self.processes[component] = process
            self._lost = False

    def kill_containers(self) -> int:
        """SIGKILL every process of the node's Pods (module docs); how many there were."""
        if self._frozen:
            raise NodeFaultError(f"node {self.name}'s Pods are frozen: restore() it first")
        pids = cgroups.pids_under(self.name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    # -- observing -------------------------------------------------------------------------

    def ready(self) -> str:
        """The Node's ``Ready`` condition: ``"True"``, ``"False"``, ``"Unknown"``, or ``""``
        when the API server does not answer or the Node has none yet."""
        return self.kubectl(
            "get",
            "node",
            self.name,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        ).strip()

    def wait_ready(self, status: str = "True", timeout: float = 120.0) -> float:
        """Wait until the Node's ``Ready`` condition is ``status`` (``"True"``, or
        ``"Unknown"`` for a lost or partitioned node); the seconds it took. Raises
        :class:`NodeFaultError` after ``timeout``."""
        started = time.monotonic()
        seen = ""
        while time.monotonic() - started < timeout:
            seen = self.ready()
            if seen == status:
                return time.monotonic() - started
            time.sleep(0.25)
        raise NodeFaultError(
            f"node {self.name}: Ready is {seen or 'unknown'!r}, not {status!r}, after "
            f"{timeout:.0f}s (faults: {sorted(self.faults) or 'none'}); last lines of its "
            f"kubelet's log:\n{self.log_tail('kubelet')}"
        )

    def run(self, command: list[str], *, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a host program in the node's network namespace (as the node itself would, for
        example to reach one of its Pods while it is partitioned)."""
        return subprocess.run(
            network.in_netns(command, self.addresses.netns),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def log_tail(self, component: str, lines: int = 30) -> str:
        process = self.processes.get(component)
        return process.log_tail(lines) if process is not None else ""

    def stop(self) -> None:
        """Stop the node's own processes (its Pods are the cluster's cleanup's)."""
        for process in reversed(list(self.processes.values())):
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
