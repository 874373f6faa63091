"""Command line for the local control plane.

    python -m controller_runtime.envtest build   # build (once) and cache the binaries
    python -m controller_runtime.envtest run     # start, install CRDs, print how to reach it
    python -m controller_runtime.envtest build --node   # also the node's binaries
    python -m controller_runtime.envtest run --node     # a cluster with a node that runs Pods
    python -m controller_runtime.envtest run --node --nodes 3   # three nodes in three zones
    python -m controller_runtime.envtest run --node -- pytest   # run a command against it
    python -m controller_runtime.envtest run --storage kine-postgres   # kine on PostgreSQL
    python -m controller_runtime.envtest run --storage-override /events=kine-sqlite
    python -m controller_runtime.envtest build --kine   # also kine (etcd API over SQL)

``run --node --nodes N`` starts N nodes (``crpy-node-1`` ...), in zones ``zone-a``,
``zone-b``, ``zone-c`` in turn (docs/e2e.md, "Several nodes").

``run`` keeps the control plane up until interrupted (Ctrl-C or SIGTERM) and then tears it
down, leaving no process or temporary directory behind. ``run --node -- COMMAND ...`` runs
the command once the cluster is ready instead (with ``KUBECONFIG`` naming the cluster's admin
kubeconfig and the cached kubectl first on ``PATH``), then tears the cluster down and exits
with the command's status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from controller_runtime.envtest.binaries import (
    KUBERNETES_VERSION,
    BinaryError,
    bin_dir,
    find_binaries,
    find_kine,
)
from controller_runtime.envtest.controlplane import (
    DEFAULT_CRD_DIRECTORY,
    ControlPlane,
    ControlPlaneError,
)
from controller_runtime.envtest.kubectl import kubectl_command
from controller_runtime.envtest.node.builds import find_node_binaries
from controller_runtime.envtest.node.cluster import (
    LocalCluster,
    NodeError,
    NodeUnavailableError,
    preflight,
)
from controller_runtime.envtest.node.configs import MAX_NODES
from controller_runtime.envtest.node.images import ImageError
from controller_runtime.envtest.storage import BACKENDS, StorageError, default_storage


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m controller_runtime.envtest",
        description="A local Kubernetes control plane (etcd + kube-apiserver) on loopback.",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build", help="build (once) and cache etcd, kube-apiserver and kubectl", allow_abbrev=False
    )
    build.add_argument(
        "--node", action="store_true", help="also the node's binaries and its pause image"
    )
    build.add_argument(
        "--kine", action="store_true", help="also kine, for the kine-sqlite/kine-postgres storage"
    )
    run = commands.add_parser(
        "run", help="start it and keep it running until interrupted", allow_abbrev=False
    )
    run.add_argument(
        "--crds",
        type=Path,
        default=DEFAULT_CRD_DIRECTORY,
        help="directory of CRD manifests to install (default: %(default)s)",
    )
    run.add_argument(
        "--node",
        action="store_true",
        help="a cluster with nodes (kubelet, containerd, ...) that runs Pods; needs root",
    )
    run.add_argument(
        "--nodes",
        type=_node_count,
        default=1,
        metavar="N",
        help="with --node: how many nodes (default %(default)s; zones zone-a, zone-b, zone-c "
        f"in turn; at most {MAX_NODES})",
    )
    run.add_argument(
        "--s3",
        action="store_true",
        help="with --node: also an S3 server (SeaweedFS) that Pods reach by a Service",
    )
    run.add_argument(
        "command_line",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="with --node: run COMMAND against the cluster (KUBECONFIG set), then stop it",
    )
    run.add_argument(
        "--feature-gate",
        dest="feature_gates",
        action="append",
        type=_gate,
        default=[],
        metavar="NAME=true|false",
        help="an API server feature gate, e.g. ShardedListAndWatch=true (repeatable)",
    )
    run.add_argument(
        "--storage",
        choices=BACKENDS,
        default=None,
        help="where the API server keeps its objects (default: $CRPY_ENVTEST_STORAGE or etcd); "
        "kine-postgres starts a throwaway PostgreSQL server",
    )
    run.add_argument(
        "--storage-override",
        dest="storage_overrides",
        action="append",
        type=_override,
        default=[],
        metavar="GROUP/RESOURCE=BACKEND",
        help="keep one built-in resource on another backend, e.g. /events=kine-postgres "
        "(the core group is empty; custom resources cannot be moved; repeatable)",
    )
    return parser


def _override(text: str) -> tuple[str, str]:
    key, sep, backend = text.rpartition("=")
    if not sep or "/" not in key or backend not in BACKENDS:
        raise argparse.ArgumentTypeError(
            f"expected GROUP/RESOURCE=BACKEND with BACKEND one of {', '.join(BACKENDS)}, "
            f"got {text!r}"
        )
    return key, backend


def _node_count(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_NODES:
        raise argparse.ArgumentTypeError(f"expected a number of nodes from 1 to {MAX_NODES}")
    return count


def _gate(text: str) -> tuple[str, bool]:
    name, sep, value = text.partition("=")
    if not sep or not name or value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected NAME=true or NAME=false, got {text!r}")
    return name, value.lower() == "true"


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(3600):
        pass


def plane_kubectl(plane: ControlPlane) -> str:
    """The kubectl to print for ``plane``: see
    :func:`~controller_runtime.envtest.kubectl.kubectl_command`."""
    return kubectl_command(plane.binaries.kubectl if plane.binaries else None)


def print_access(plane: ControlPlane, kubectl: str | None = None) -> None:
    kubectl = kubectl or plane_kubectl(plane)
    print(f"API server:  {plane.server}")
    if kubectl != "kubectl":
        print(
            f"kubectl:     {kubectl} (the kubectl on PATH is missing or too far from "
            f"v{KUBERNETES_VERSION}: kubectl supports one minor version either way)"
        )
    print(f"kubeconfig:  {plane.kubeconfig}")
    print(f"try:         {kubectl} --kubeconfig {plane.kubeconfig} get crds")
    print(f"             export KUBECONFIG={plane.kubeconfig}", flush=True)


def print_storage(plane: ControlPlane) -> None:
    """Which backend keeps what, and where its etcd API listens."""
    for backend, process in plane.storage_processes.items():
        kept = [key for key, b in plane.storage_overrides.items() if b == backend]
        if backend != plane.storage:
            what = ", ".join(kept)
        elif len(kept) < len(plane.storage_overrides):
            what = "all resources not overridden"
        else:
            what = "all resources"
        extra = f", database {process.database}" if process.database else ""
        print(f"storage:     {backend} at {process.url} ({what}{extra})", flush=True)


def command_env(
    kubeconfig: Path, kubectl: Path | None, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The environment of ``run --node -- COMMAND``: ``environ`` with ``KUBECONFIG`` set to
    ``kubeconfig`` and ``kubectl``'s directory (when known) first on ``PATH``."""
    env = dict(environ, KUBECONFIG=str(kubeconfig))
    first = str(kubectl.parent) if kubectl is not None else ""
    env["PATH"] = os.pathsep.join(p for p in (first, env.get("PATH", "")) if p)
    return env


def _stop_on_sigterm() -> None:
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run_node(crds: Path, *, nodes: int = 1, s3: bool = False, command: Sequence[str] = ()) -> int:
    """Start a cluster of ``nodes`` nodes, print how to reach it, wait for a signal (or run
    ``command`` against it), tear it down. Returns the command's exit status (0 without
    one)."""
    try:
        preflight()
    except NodeUnavailableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    with LocalCluster(crd_directory=crds, nodes=nodes, s3=s3) as cluster:
        timings = ", ".join(f"{k} {v:.1f}s" for k, v in cluster.timings.items())
        print(f"local cluster ready ({timings})")
        print_access(cluster.plane)
        for node in cluster.all_nodes:
            print(
                f"node:        {node.name} ({node.zone}) at {node.address}, "
                f"Pods {node.addresses.pod_cidr}"
            )
        print(f"work directory: {cluster.workdir} (component logs)")
        if cluster.s3_endpoint is not None:
            endpoint = cluster.s3_endpoint
            print(f"S3 endpoint: {endpoint.url} (from Pods: {endpoint.cluster_url})")
            print(f"S3 bucket:   {endpoint.bucket}")
            print(f"S3 keys:     {endpoint.credentials_file} (AWS_ACCESS_KEY_ID=...)")
        if command:
            _stop_on_sigterm()
            kubectl = (cluster.plane.binaries or find_binaries()).kubectl
            print(f"running: {' '.join(command)}", flush=True)
            status = subprocess.run(
                list(command), env=command_env(cluster.plane.kubeconfig, kubectl), check=False
            ).returncode
            print(f"exit status {status}; stopping ...", flush=True)
            return status
        print("Ctrl-C stops it and removes everything it made.", flush=True)
        wait_for_signal()
        print("stopping ...", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.node and args.feature_gates:
        parser.error("--feature-gate is not supported with --node yet")
    if args.command == "run" and args.nodes != 1 and not args.node:
        parser.error("--nodes needs --node")
    if args.command == "run" and args.s3 and not args.node:
        parser.error("--s3 needs --node (the S3 server runs in the node's network namespace)")
    if args.command == "run" and args.node and (args.storage or args.storage_overrides):
        parser.error("--storage and --storage-override are not supported with --node yet")
    try:
        if args.command == "build":
            binaries = find_binaries()
            print(f"binaries ready in {bin_dir()}: {binaries.kube_apiserver.name}, etcd, kubectl")
            if args.kine:
                print(f"kine ready: {find_kine()}")
            if args.node:
                node = find_node_binaries()
                print(f"node binaries ready: {', '.join(sorted(node.paths))}")
            return 0
        command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
        if command and not args.node:
            parser.error("a command to run (after --) needs --node")
        if args.node:
            return run_node(args.crds, nodes=args.nodes, s3=args.s3, command=command)
        started = time.monotonic()
        gates = dict(args.feature_gates)
        plane = ControlPlane(
            crd_directory=args.crds,
            feature_gates=gates,
            storage=args.storage or default_storage(),
            storage_overrides=dict(args.storage_overrides),
        )
        with plane:
            print(f"local control plane ready in {time.monotonic() - started:.1f}s")
            print_access(plane)
            print_storage(plane)
            print("Ctrl-C stops it.", flush=True)
            wait_for_signal()
            print("stopping ...", flush=True)
        return 0
    except (BinaryError, ControlPlaneError, ImageError, NodeError, StorageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
