"""A Kubernetes cluster of one or more nodes on this machine, like kind without Docker.

:class:`LocalCluster` starts the local control plane (etcd + kube-apiserver, see
:mod:`controller_runtime.envtest.controlplane`) on the host's end of the cluster's link, then
for each node (:mod:`.worker`) containerd, the kubelet and kube-proxy inside the node's own
network namespace (see :mod:`.network`), CoreDNS on the link, and kube-controller-manager and
kube-scheduler beside the API server.

Nodes: ``nodes`` (default 1) named ``crpy-node-1`` ... ``crpy-node-<n>``, labelled
``kubernetes.io/hostname`` (their name) and ``topology.kubernetes.io/zone`` (``zone-a``,
``zone-b``, ``zone-c`` in turn); each has a Pod range of its own (node ``i``:
``172.30.<i-1>.0/24``), routes to every other node's, and its own local PersistentVolumes
(whose ``nodeAffinity`` names it). :meth:`LocalCluster.node` gives a node's handle, with the
faults a test can inject (lose it, partition it, bring it back: :mod:`.worker`).
kube-controller-manager marks a node that stopped reporting ``Ready=Unknown`` after
``--node-monitor-grace-period`` =
:data:`~controller_runtime.envtest.node.configs.NODE_MONITOR_GRACE_SECONDS` (20 s).

Guarantees:

* Refuses to start, with one line saying why (:class:`NodeUnavailableError`), where the machine
  cannot host a node: not root, no overlayfs, a missing tool, another cluster already running.
* :meth:`LocalCluster.stop` (also run when :meth:`start` fails, and by the context manager on
  any exception, KeyboardInterrupt included) removes everything the cluster made, for every
  node: processes (its own, every container, every shim), mounts under its work directory,
  the nodes' cgroup trees (thawed first), the network namespaces with their bridges and
  iptables chains, the host end of the link, the work directory; and puts back the kernel
  settings the kubelet changes. A run killed with SIGKILL leaves its state file behind: the
  next start cleans up after it first.
* Network containment: only loopback, the link and the namespaces carry traffic; Pods have no
  default route, nodes do not masquerade, CoreDNS has no upstream.
* Images: the pause image always; ``images`` (OCI archives, see :mod:`.images`) are imported
  into every node's containerd (namespace ``k8s.io``) at start.

Caveats: one cluster per machine (a lock says who holds it). Each control-plane component
talks to the API server with a client certificate of its own; the kubelets' serving
certificates are self-signed (the API server does not verify them, as in kind).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from controller_runtime.envtest.binaries import Progress, _stderr
from controller_runtime.envtest.controlplane import (
    DEFAULT_CRD_DIRECTORY,
    ControlPlane,
    ControlPlaneError,
    _Process,
)
from controller_runtime.envtest.node import cgroups, cleanup, configs, network
from controller_runtime.envtest.node import s3 as s3_server
from controller_runtime.envtest.node.builds import NodeBinaries, find_node_binaries
from controller_runtime.envtest.node.images import PAUSE_IMAGE, ensure_image, pause_image
from controller_runtime.envtest.node.worker import WorkerNode

_STATE_DIR = Path("/var/lib/crpy-node")
"""Where the running node records its work directory and the kernel settings to restore."""


class NodeUnavailableError(RuntimeError):
    """This machine cannot host the local node; the message says why in one line."""


class NodeError(RuntimeError):
    """The local node failed to start or to stop cleanly."""


def preflight() -> None:
    """Raise :class:`NodeUnavailableError` when this machine cannot host the node."""
    if os.geteuid() != 0:
        raise NodeUnavailableError("the local node needs root (it runs containerd and a kubelet)")
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems:
        raise NodeUnavailableError("the local node needs overlayfs (modprobe overlay)")
    if (
        not Path("/sys/fs/cgroup/memory").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    ):
        raise NodeUnavailableError("the local node needs a memory cgroup hierarchy")
    missing = [t for t in ("runc", "iptables", "conntrack", "nsenter", "ip") if not _which(t)]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("/usr/lib/cni/bridge")
    if missing:
        raise NodeUnavailableError(
            f"the local node needs {', '.join(missing)}: run scripts/ensure-node-packages.sh"
        )


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


@dataclass
class LocalCluster:
    """The control plane plus ``nodes`` nodes (default 1; see the module docs). Use as a
    context manager, or :meth:`start` / :meth:`stop`. ``images`` are OCI archives imported
    into every node at start. Default start timeout 180 s (binaries and images are built
    first when missing, which is not counted). Storage: ``volumes`` (32) hostPath
    PersistentVolumes per node of ``volume_size`` (20Gi, not enforced) in the work
    directory, each bound to its node by ``nodeAffinity``, behind the default StorageClass
    ``local`` (``WaitForFirstConsumer``). ``s3=True`` also runs an S3 server (SeaweedFS, see
    :mod:`.s3`) on the cluster's link; :attr:`s3_endpoint` says where it is and holds its
    generated credentials."""

    images: Sequence[Path] = ()
    crd_directory: Path | None = DEFAULT_CRD_DIRECTORY
    start_timeout: float = 180.0
    progress: Progress = _stderr
    nodes: int = 1
    addresses: configs.Addresses = field(default_factory=configs.Addresses)
    volumes: int = 32
    volume_size: str = "20Gi"
    s3: bool = False

    plane: ControlPlane = field(init=False)
    workdir: Path = field(init=False)
    kubeconfig: Path = field(init=False)
    timings: dict[str, float] = field(init=False, default_factory=dict)
    s3_endpoint: s3_server.S3Endpoint | None = field(init=False, default=None)
    _processes: list[_Process] = field(init=False, default_factory=list)
    _workers: list[WorkerNode] = field(init=False, default_factory=list)
    _lock_file: IO[str] | None = field(init=False, default=None)
    _kernel: dict[str, str] = field(init=False, default_factory=dict)
    _binaries: NodeBinaries | None = field(init=False, default=None)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- start ----------------------------------------------------------------------------

    def start(self) -> None:
        preflight()
        self.addresses.nodes(self.nodes)  # refuses a count the plan has no room for
        self._binaries = find_node_binaries(s3=self.s3, progress=self.progress)
        pause_spec, pause_binary = pause_image(self._binaries["pause"])
        pause_archive = ensure_image(pause_spec, progress=self.progress, single_file=pause_binary)
        self._acquire_lock()
        started = time.monotonic()
        try:
            self._start(pause_archive, started)
        except BaseException:
            self.stop()
            raise
        self.timings["ready"] = time.monotonic() - started

    # The cluster's start-up steps, in the order they must run; one script reads best whole.
    def _start(self, pause_archive: Path, started: float) -> None:
        assert self._binaries is not None
        addr = self.addresses
        plans = addr.nodes(self.nodes)
        self.workdir = Path(tempfile.mkdtemp(prefix="crpy-node-", dir="/var/tmp"))
        self._kernel = cleanup.record_kernel_settings()
        self._write_state()
        network.set_up(addr, plans)
        # Never USE_EXISTING_CLUSTER's cluster: this is the cluster such a run may be aimed at.
        self.plane = ControlPlane(
            crd_directory=self.crd_directory, node_address=addr.host, existing_cluster=False
        )
        self.plane.start()
        self.kubeconfig = self.plane.kubeconfig
        pki = self.plane.workdir / "pki"
        self.timings["control_plane"] = time.monotonic() - started
        bins = self._binaries
        runc = _which("runc") or "runc"
        for plan in plans:
            worker = WorkerNode(plan, addr, self.workdir / plan.name, bins, self.kubectl)
            self._workers.append(worker)
            worker.start_containerd(PAUSE_IMAGE, runc)
        self._wait(
            lambda: all(w.socket.exists() for w in self._workers),
            "containerd's socket",
            "containerd",
        )
        # Imported before any kubelet starts: importing beside the starting components made
        # a one-node start slower, not faster, on a loaded 2-core machine.
        self._import_everywhere([pause_archive, *self.images])
        self.timings["containerd"] = time.monotonic() - started
        self._start_nodes(pki)
        self.timings["node_ready"] = time.monotonic() - started
        self._wait(self._dns_ready, "CoreDNS ready", "coredns")
        self.timings["dns_ready"] = time.monotonic() - started
        if self.s3:
            self._start_s3(started)

    def _start_nodes(self, pki: Path) -> None:
        """The kubelets, the controllers beside the API server, kube-proxy, CoreDNS and the
        volumes; returns once every node is Ready."""
        assert self._binaries is not None
        bins = self._binaries
        addr = self.addresses
        ca_file = pki / "ca.crt"
        for worker in self._workers:
            identity = self.plane.mint_identity(f"system:node:{worker.name}", ["system:nodes"])
            worker.start_kubelet(identity.kubeconfig, ca_file)
        self._start_control_plane_controllers(pki, ca_file)
        proxy_id = self.plane.mint_identity("system:kube-proxy")
        for worker in self._workers:
            worker.start_kube_proxy(proxy_id.kubeconfig)
        rbac = self.workdir / "coredns-rbac.yaml"
        rbac.write_text(configs.COREDNS_RBAC)
        self.plane.kubectl("apply", "-f", str(rbac))
        coredns_id = self.plane.mint_identity("crpy:coredns")
        corefile = self.workdir / "Corefile"
        corefile.write_text(configs.corefile(addr, coredns_id.kubeconfig))
        self._spawn(
            "coredns",
            network.in_netns([str(bins["coredns"]), "-conf", str(corefile)], network.LINK_NETNS),
        )
        directories = {}
        for worker in self._workers:
            directory = directories[worker.name] = worker.workdir / "volumes"
            for number in range(self.volumes):
                (directory / f"{number:02d}").mkdir(parents=True)
                (directory / f"{number:02d}").chmod(0o777)
        volume_manifest = self.workdir / "volumes.yaml"
        volume_manifest.write_text(
            configs.local_volumes(directories, self.volumes, self.volume_size)
        )
        self.plane.kubectl("apply", "-f", str(volume_manifest))
        self._wait(self._nodes_ready, "every node Ready", "kubelet")

    def _start_control_plane_controllers(self, pki: Path, ca_file: Path) -> None:
        """kube-controller-manager (node monitoring as the module docs say) and
        kube-scheduler, beside the API server."""
        assert self._binaries is not None
        kcm_id = self.plane.mint_identity("system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                str(self._binaries["kube-controller-manager"]),
                f"--kubeconfig={kcm_id.kubeconfig}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={ca_file}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle",
                "--concurrent-gc-syncs=5",
                f"--node-monitor-grace-period={configs.NODE_MONITOR_GRACE_SECONDS}s",
                f"--node-monitor-period={configs.NODE_MONITOR_PERIOD_SECONDS}s",
                "--v=1",
            ],
        )
        scheduler_id = self.plane.mint_identity("system:kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                str(self._binaries["kube-scheduler"]),
                f"--kubeconfig={scheduler_id.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def _import_everywhere(self, archives: Sequence[Path | str]) -> None:
        """Every archive into every node, the nodes side by side (each import is a ``ctr``
        process; nothing here starts a long-lived one, so threads are safe)."""

        def import_all(worker: WorkerNode) -> None:
            for archive in archives:
                worker.import_image(archive)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self._workers)) as pool:
            for future in [pool.submit(import_all, worker) for worker in self._workers]:
                future.result()

    def _start_s3(self, started: float) -> None:
        """SeaweedFS in the link's namespace on its shared address, and the Service Pods use
        to reach it; returns once a signed listing of the bucket succeeds."""
        assert self._binaries is not None
        addr = self.addresses
        begun = time.monotonic()
        directory = self.workdir / "s3"
        credentials = s3_server.S3Credentials.generate()
        credentials_file = s3_server.write_config(directory, credentials)
        command = s3_server.weed_command(
            self._binaries["weed"], directory, addr.infra, s3_server.DEFAULT_BUCKET
        )
        self._spawn("seaweedfs", network.in_netns(command, network.LINK_NETNS))
        endpoint = s3_server.S3Endpoint(
            url=f"http://{addr.infra}:{s3_server.S3_PORT}",
            cluster_url=s3_server.cluster_url(),
            bucket=s3_server.DEFAULT_BUCKET,
            credentials=credentials,
            credentials_file=credentials_file,
        )
        client = endpoint.client()
        self._wait(
            lambda: s3_server.wait_until_serving(client, endpoint.bucket, 2.0),
            f"S3 server serving bucket {endpoint.bucket}",
            "seaweedfs",
        )
        self.kubectl("apply", "-f", "-", input_text=s3_server.service_manifest(addr.infra))
        self.s3_endpoint = endpoint
        self.timings["s3_start"] = time.monotonic() - begun
        self.timings["s3_ready"] = time.monotonic() - started

    def import_image(self, archive: Path | str) -> None:
        """Load an OCI archive into every node's containerd (namespace ``k8s.io``, what the
        kubelets see)."""
        self._import_everywhere([archive])

    def tag_image(self, source: str, target: str) -> None:
        """Give an image already in every node's containerd another name (full references,
        e.g. ``docker.io/library/x:1``), as ``ctr images tag`` does: a new tag without a
        rebuild or a registry."""
        for worker in self._workers:
            worker.tag_image(source, target)

    # -- nodes ----------------------------------------------------------------------------

    def node(self, name: str) -> WorkerNode:
        """The node called ``name`` (``crpy-node-1`` ...): its addresses, zone and faults."""
        for worker in self._workers:
            if worker.name == name:
                return worker
        known = ", ".join(w.name for w in self._workers) or "none yet"
        raise KeyError(f"no node {name!r} in this cluster (nodes: {known})")

    @property
    def all_nodes(self) -> tuple[WorkerNode, ...]:
        """Every node, in order (``crpy-node-1`` first)."""
        return tuple(self._workers)

    def _nodes_ready(self) -> bool:
        return all(worker.ready() == "True" for worker in self._workers)

    def _dns_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://{self.addresses.infra}:8181/ready", timeout=2
            ) as response:
                return int(response.status) == 200
        except OSError:
            return False

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        if env:
            command = ["env", *(f"{key}={value}" for key, value in env.items()), *command]
        process = _Process(name, command, self.workdir / f"{name}.log")
        process.start()
        self._processes.append(process)

    def _every_process(self) -> list[_Process]:
        return [*self._processes, *(p for w in self._workers for p in w.processes.values())]

    def _wait(self, check: object, what: str, component: str) -> None:
        """Poll ``check`` until true; fail at once when a process of the cluster exits, and
        after the start timeout with the last lines of ``component``'s log (every node's)."""
        assert callable(check)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            for process in self._every_process():
                if not process.running():
                    raise NodeError(
                        f"{process.name} exited while waiting for {what}; last lines of its "
                        f"log:\n{process.log_tail()}"
                    )
            if check():
                return
            time.sleep(0.2)
        tails = [
            f"--- {p.name}\n{p.log_tail()}"
            for p in self._every_process()
            if p.name == component or p.name.endswith(f"/{component}")
        ]
        raise NodeError(
            f"{what} not reached after {self.start_timeout:.0f}s; last lines of {component}'s "
            f"log:\n" + "\n".join(tails)
        )

    # -- access ---------------------------------------------------------------------------

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, input_text: str | None = None
    ) -> str:
        """kubectl as the cluster's admin; ``input_text`` is its standard input."""
        binaries = self.plane.binaries
        assert binaries is not None and binaries.kubectl is not None
        result = subprocess.run(
            [str(binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            input=input_text,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result.stdout

    def memory_mib(self) -> dict[str, float]:
        """Resident memory of the cluster's infrastructure processes (MiB, by process: a
        node's are named ``<node>/<component>``), shims included (``<node>/shims``) and
        ``total``; containers excluded."""
        usage: dict[str, float] = {}
        pids = {p.name: p.popen.pid for p in self._every_process() if p.popen is not None}
        pids.update(zip(("etcd", "kube-apiserver"), self.plane.pids(), strict=False))
        for name, pid in pids.items():
            usage[name] = _rss_mib(pid)
        for worker in self._workers:
            shims = [pid for pid in network.pids_in_netns(worker.addresses.netns) if _is_shim(pid)]
            usage[f"{worker.name}/shims"] = sum(_rss_mib(pid) for pid in shims)
        usage["total"] = sum(usage.values())
        return usage

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system, seconds) the cluster's infrastructure processes have used
        so far, by process as in :meth:`memory_mib`, and ``total``."""
        used: dict[str, float] = {}
        pids = {p.name: p.popen.pid for p in self._every_process() if p.popen is not None}
        pids.update(zip(("etcd", "kube-apiserver"), self.plane.pids(), strict=False))
        for name, pid in pids.items():
            used[name] = _cpu_seconds(pid)
        used["total"] = sum(used.values())
        return used

    def logs(self, component: str, lines: int = 40) -> str:
        """The last lines of a process's log: ``coredns``, ``kube-scheduler`` ..., or a
        node's ``crpy-node-1/kubelet`` (a bare node component is the first node's)."""
        for process in self._every_process():
            if process.name == component:
                return process.log_tail(lines)
        for process in self._every_process():
            if process.name.endswith(f"/{component}"):
                return process.log_tail(lines)
        return ""

    # -- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Remove everything the cluster made, on every node; safe to call twice. Raises
        :class:`NodeError` listing what could not be removed."""
        problems: list[str] = []
        # A frozen process (a lost node's) cannot stop: thaw before anything is stopped.
        cgroups.thaw_all()
        for process in reversed(self._processes):
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
        self._processes.clear()
        for worker in reversed(self._workers):
            worker.stop()
        self._workers.clear()
        if hasattr(self, "workdir"):
            problems += _clean_up(self.workdir, self._kernel)
        if hasattr(self, "plane"):
            with contextlib.suppress(Exception):
                self.plane.stop()
        self._release_lock()
        if problems:
            raise NodeError("the local node left things behind: " + "; ".join(problems))

    def _acquire_lock(self) -> None:
        _STATE_DIR.mkdir(parents=True, exist_ok=True)
        lock = open(_STATE_DIR / "lock", "a+")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            owner = lock.read().strip() or "unknown"
            lock.close()
            raise NodeUnavailableError(
                f"another local node is running on this machine (pid {owner}); stop it first"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock_file = lock
        _clean_up_stale(self.progress)

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            (_STATE_DIR / "state.json").unlink(missing_ok=True)
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    def _write_state(self) -> None:
        state = {"workdir": str(self.workdir), "kernel": self._kernel, "pid": os.getpid()}
        (_STATE_DIR / "state.json").write_text(json.dumps(state))


def _clean_up(workdir: Path, kernel: dict[str, str]) -> list[str]:
    problems: list[str] = []
    cgroups.thaw_all()
    cleanup.kill_all(network.pids_in_netns(), grace=5)
    cleanup.kill_all(cgroups.pids_under(), grace=2)
    cleanup.kill_all(cleanup.pids_naming(str(workdir)), grace=2)
    problems += cleanup.unmount_all(workdir)
    cleanup.remove_links_into(Path("/var/log/containers"), workdir)
    problems += cgroups.remove()
    problems += network.tear_down()
    problems += cleanup.restore_kernel_settings(kernel)
    shutil.rmtree(workdir, ignore_errors=True)
    if workdir.exists():
        problems.append(f"could not remove {workdir}")
    return problems


def leftovers(workdir: Path | None = None) -> list[str]:
    """What a cluster leaves on the machine (empty after a clean stop): network namespaces,
    the host end of the link, node cgroups, and mounts under and the work directory
    ``workdir`` itself when given."""
    found = network.leftovers()
    found += [f"cgroup {c}" for c in cgroups.trees()]
    if workdir is not None:
        found += [f"mount {m}" for m in cleanup.mounts_under(workdir)]
        if workdir.exists():
            found.append(f"directory {workdir}")
    return found


def _clean_up_stale(progress: Progress) -> None:
    """After a run that was killed: undo what its state file names."""
    state_file = _STATE_DIR / "state.json"
    stale: dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        stale = json.loads(state_file.read_text())
    if not stale and not network.exists() and not cgroups.trees():
        return
    progress("cleaning up after a local cluster that did not stop cleanly")
    workdir = Path(str(stale.get("workdir", "/nonexistent-crpy-node")))
    kernel = stale.get("kernel")
    problems = _clean_up(workdir, dict(kernel) if isinstance(kernel, dict) else {})
    state_file.unlink(missing_ok=True)
    if problems:
        raise NodeError("cleaning up a previous local node failed: " + "; ".join(problems))


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _is_shim(pid: int) -> bool:
    try:
        return b"containerd-shim" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
