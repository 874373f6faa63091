"""A single-node Kubernetes cluster on this machine, like kind without Docker.

:class:`LocalCluster` starts the local control plane (etcd + kube-apiserver, see
:mod:`controller_runtime.envtest.controlplane`) on the host end of the node's link, then
containerd, the kubelet, kube-proxy and CoreDNS inside the node's network namespace (see
:mod:`.network`) and kube-controller-manager and kube-scheduler beside the API server.

Guarantees:

* Refuses to start, with one line saying why (:class:`NodeUnavailableError`), where the machine
  cannot host a node: not root, no overlayfs, a missing tool, another node already running.
* :meth:`LocalCluster.stop` (also run when :meth:`start` fails, and by the context manager on
  any exception, KeyboardInterrupt included) removes everything the node made: processes
  (its own, every container, every shim), mounts under its work directory, the ``kubepods``
  cgroups, the network namespace with its bridge and iptables chains, the host end of the
  link, the work directory; and puts back the kernel settings the kubelet changes. A run
  killed with SIGKILL leaves its state file behind: the next start cleans up after it first.
* Network containment: only loopback, the link and the namespace carry traffic; Pods have no
  default route and CoreDNS no upstream.
* Images: the pause image always; ``images`` (OCI archives, see :mod:`.images`) are imported
  into containerd's ``k8s.io`` namespace at start.

Caveats: one node per machine (a lock says who holds it). Each control-plane component talks
to the API server with a client certificate of its own; the kubelet's serving certificate is
self-signed (the API server does not verify it, as in kind).
"""

from __future__ import annotations

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
from controller_runtime.envtest.node import cleanup, configs, network
from controller_runtime.envtest.node import s3 as s3_server
from controller_runtime.envtest.node.builds import NodeBinaries, find_node_binaries
from controller_runtime.envtest.node.images import PAUSE_IMAGE, ensure_image, pause_image

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
    """The control plane plus one node. Use as a context manager, or :meth:`start` /
    :meth:`stop`. ``images`` are OCI archives imported at start. Default start timeout 180 s
    (binaries and images are built first when missing, which is not counted). Storage:
    ``volumes`` (32) hostPath PersistentVolumes of ``volume_size`` (20Gi, not enforced) in
    the work directory, behind the default StorageClass ``local``. ``s3=True`` also runs
    an S3 server (SeaweedFS, see :mod:`.s3`) in the node's namespace; :attr:`s3_endpoint`
    says where it is and holds its generated credentials."""

    images: Sequence[Path] = ()
    crd_directory: Path | None = DEFAULT_CRD_DIRECTORY
    start_timeout: float = 180.0
    progress: Progress = _stderr
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

    # The node's start-up steps, in the order they must run; one script reads best whole.
    def _start(self, pause_archive: Path, started: float) -> None:  # noqa: PLR0915
        assert self._binaries is not None
        addr = self.addresses
        self.workdir = Path(tempfile.mkdtemp(prefix="crpy-node-", dir="/var/tmp"))
        self._kernel = cleanup.record_kernel_settings()
        self._write_state()
        network.set_up(addr)
        # Never USE_EXISTING_CLUSTER's cluster: this is the cluster such a run may be aimed at.
        self.plane = ControlPlane(
            crd_directory=self.crd_directory, node_address=addr.host, existing_cluster=False
        )
        self.plane.start()
        self.kubeconfig = self.plane.kubeconfig
        pki = self.plane.workdir / "pki"
        self.timings["control_plane"] = time.monotonic() - started

        bins = self._binaries
        containerd_dir = self.workdir / "containerd"
        containerd_dir.mkdir()
        cni_dir = self.workdir / "cni"
        cni_dir.mkdir()
        (cni_dir / "10-crpy.conflist").write_text(configs.cni_conflist(addr))
        runc = _which("runc") or "runc"
        config = self.workdir / "containerd.toml"
        config.write_text(configs.containerd_toml(self.workdir, cni_dir, PAUSE_IMAGE, runc))
        socket = containerd_dir / "containerd.sock"
        path_env = f"{bins['containerd'].parent}:/usr/sbin:/usr/bin:/sbin:/bin"
        self._spawn(
            "containerd",
            network.in_netns(
                ["env", f"PATH={path_env}", str(bins["containerd"]), f"--config={config}"]
            ),
        )
        self._wait(socket.exists, "containerd's socket", "containerd")
        for archive in (pause_archive, *self.images):
            self.import_image(archive)
        self.timings["containerd"] = time.monotonic() - started

        ca_file = pki / "ca.crt"
        kubelet_id = self.plane.mint_identity(f"system:node:{addr.node_name}", ["system:nodes"])
        resolv = self.workdir / "resolv.conf"
        resolv.write_text("# no upstream: the node's Pods resolve cluster names only\n")
        kubelet_config = self.workdir / "kubelet.yaml"
        kubelet_config.write_text(
            configs.kubelet_config(addr, socket, ca_file, resolv, self.workdir / "pod-logs")
        )
        self._spawn(
            "kubelet",
            network.in_netns(
                [
                    str(bins["kubelet"]),
                    f"--config={kubelet_config}",
                    f"--kubeconfig={kubelet_id.kubeconfig}",
                    f"--root-dir={self.workdir / 'kubelet'}",
                    f"--cert-dir={self.workdir / 'kubelet-pki'}",
                    f"--hostname-override={addr.node_name}",
                    f"--node-ip={addr.node}",
                    "--v=1",
                ]
            ),
            env={"PATH": path_env},
        )
        kcm_id = self.plane.mint_identity("system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                str(bins["kube-controller-manager"]),
                f"--kubeconfig={kcm_id.kubeconfig}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={ca_file}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )
        scheduler_id = self.plane.mint_identity("system:kube-scheduler")
        self._spawn(
            "kube-scheduler",
            [
                str(bins["kube-scheduler"]),
                f"--kubeconfig={scheduler_id.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )
        proxy_id = self.plane.mint_identity("system:kube-proxy")
        proxy_config = self.workdir / "kube-proxy.yaml"
        proxy_config.write_text(configs.kube_proxy_config(addr, proxy_id.kubeconfig))
        self._spawn(
            "kube-proxy",
            network.in_netns([str(bins["kube-proxy"]), f"--config={proxy_config}", "--v=1"]),
            env={"PATH": path_env},
        )
        rbac = self.workdir / "coredns-rbac.yaml"
        rbac.write_text(configs.COREDNS_RBAC)
        self.plane.kubectl("apply", "-f", str(rbac))
        coredns_id = self.plane.mint_identity("crpy:coredns")
        corefile = self.workdir / "Corefile"
        corefile.write_text(configs.corefile(addr, coredns_id.kubeconfig))
        self._spawn(
            "coredns",
            network.in_netns([str(bins["coredns"]), "-conf", str(corefile)]),
        )
        volumes = self.workdir / "volumes"
        for number in range(self.volumes):
            directory = volumes / f"local-{number:02d}"
            directory.mkdir(parents=True)
            directory.chmod(0o777)
        volume_manifest = self.workdir / "volumes.yaml"
        volume_manifest.write_text(configs.local_volumes(volumes, self.volumes, self.volume_size))
        self.plane.kubectl("apply", "-f", str(volume_manifest))
        self._wait(self._node_ready, f"node {addr.node_name} Ready", "kubelet")
        self.timings["node_ready"] = time.monotonic() - started
        self._wait(self._dns_ready, "CoreDNS ready", "coredns")
        self.timings["dns_ready"] = time.monotonic() - started
        if self.s3:
            self._start_s3(started)

    def _start_s3(self, started: float) -> None:
        """SeaweedFS in the node's namespace on the node's address, and the Service Pods use
        to reach it; returns once a signed listing of the bucket succeeds."""
        assert self._binaries is not None
        addr = self.addresses
        begun = time.monotonic()
        directory = self.workdir / "s3"
        credentials = s3_server.S3Credentials.generate()
        credentials_file = s3_server.write_config(directory, credentials)
        command = s3_server.weed_command(
            self._binaries["weed"], directory, addr.node, s3_server.DEFAULT_BUCKET
        )
        self._spawn("seaweedfs", network.in_netns(command))
        endpoint = s3_server.S3Endpoint(
            url=f"http://{addr.node}:{s3_server.S3_PORT}",
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
        self.kubectl("apply", "-f", "-", input_text=s3_server.service_manifest(addr.node))
        self.s3_endpoint = endpoint
        self.timings["s3_start"] = time.monotonic() - begun
        self.timings["s3_ready"] = time.monotonic() - started

    def import_image(self, archive: Path) -> None:
        """Load an OCI archive into containerd's ``k8s.io`` namespace (what the kubelet sees)."""
        assert self._binaries is not None
        socket = self.workdir / "containerd" / "containerd.sock"
        result = subprocess.run(
            [
                str(self._binaries["ctr"]),
                f"--address={socket}",
                "-n",
                "k8s.io",
                "images",
                "import",
                "--local",
                str(archive),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise NodeError(f"importing image {archive.name} failed: {result.stderr.strip()}")

    def tag_image(self, source: str, target: str) -> None:
        """Give an image already in containerd's ``k8s.io`` namespace another name (full
        references, e.g. ``docker.io/library/x:1``), as ``ctr images tag`` does: a new tag
        without a rebuild or a registry."""
        assert self._binaries is not None
        socket = self.workdir / "containerd" / "containerd.sock"
        result = subprocess.run(
            [
                str(self._binaries["ctr"]),
                f"--address={socket}",
                "-n",
                "k8s.io",
                "images",
                "tag",
                "--force",
                source,
                target,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise NodeError(f"tagging image {source} as {target} failed: {result.stderr.strip()}")

    def _node_ready(self) -> bool:
        out = self.plane.kubectl(
            "get",
            "node",
            self.addresses.node_name,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.strip() == "True"

    def _dns_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://{self.addresses.node}:8181/ready", timeout=2
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

    def _wait(self, check: object, what: str, component: str) -> None:
        assert callable(check)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            for process in self._processes:
                if not process.running():
                    raise NodeError(
                        f"{process.name} exited while waiting for {what}; last lines of its "
                        f"log:\n{process.log_tail()}"
                    )
            if check():
                return
            time.sleep(0.2)
        tail = next((p.log_tail() for p in self._processes if p.name == component), "")
        raise NodeError(
            f"{what} not reached after {self.start_timeout:.0f}s; last lines of {component}'s "
            f"log:\n{tail}"
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
        """Resident memory of the node's infrastructure processes (MiB, by component), shims
        included; containers excluded."""
        usage: dict[str, float] = {}
        pids = {p.name: p.popen.pid for p in self._processes if p.popen is not None}
        pids.update(zip(("etcd", "kube-apiserver"), self.plane.pids(), strict=False))
        for name, pid in pids.items():
            usage[name] = _rss_mib(pid)
        shims = [pid for pid in network.pids_in_netns() if _is_shim(pid)]
        usage["shims"] = sum(_rss_mib(pid) for pid in shims)
        return usage

    def logs(self, component: str, lines: int = 40) -> str:
        for process in self._processes:
            if process.name == component:
                return process.log_tail(lines)
        return ""

    # -- stop -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Remove everything the node made; safe to call twice. Raises :class:`NodeError`
        listing what could not be removed."""
        problems: list[str] = []
        for process in reversed(self._processes):
            with contextlib.suppress(Exception):
                process.stop(timeout=10)
        self._processes.clear()
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
    cleanup.kill_all(network.pids_in_netns(), grace=5)
    cleanup.kill_all(cleanup.pids_in_kubepods(), grace=2)
    cleanup.kill_all(cleanup.pids_naming(str(workdir)), grace=2)
    problems += cleanup.unmount_all(workdir)
    cleanup.remove_links_into(Path("/var/log/containers"), workdir)
    problems += cleanup.remove_kubepods_cgroups()
    problems += network.tear_down()
    problems += cleanup.restore_kernel_settings(kernel)
    shutil.rmtree(workdir, ignore_errors=True)
    if workdir.exists():
        problems.append(f"could not remove {workdir}")
    return problems


def _clean_up_stale(progress: Progress) -> None:
    """After a run that was killed: undo what its state file names."""
    state_file = _STATE_DIR / "state.json"
    stale: dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        stale = json.loads(state_file.read_text())
    if not stale and not network.exists():
        return
    progress("cleaning up after a local node that did not stop cleanly")
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


def _is_shim(pid: int) -> bool:
    try:
        return b"containerd-shim" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
