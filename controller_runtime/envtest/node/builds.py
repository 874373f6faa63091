"""Finding, or building once, the binaries of the local node.

Built from Go modules at pinned releases (the build modules ship beside this file in
``gomod/``, the Kubernetes one is the control plane's), into the project's cache directory
(see :func:`controller_runtime.envtest.binaries.cache_root`), one directory per component and
version, each under a file lock so concurrent callers wait for one build:

* kubelet, kube-controller-manager, kube-scheduler, kube-proxy (``k8s.io/kubernetes``; on top
  of the control plane's build, about 2-5 minutes);
* containerd 2.x, its runc shim and ``ctr`` (the kubelet of Kubernetes 1.36 needs containerd 2);
* CoreDNS with only the plugins a local cluster needs (no ``forward``: nothing leaves the node);
* SeaweedFS (``weed``), the S3-compatible server of the backup tests (Apache-2.0);
* ``pause``, the static binary of the Pods' sandbox image (``gomod/pause/main.go``).

The first build prints a progress line every 15 s; later calls return at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from controller_runtime.envtest.binaries import (
    KUBERNETES_VERSION,
    BinaryError,
    Progress,
    _stderr,
    _version_ldflags,
    cache_root,
    go_build,
)

CONTAINERD_VERSION = "2.4.2"
COREDNS_VERSION = "1.15.0"
SEAWEEDFS_VERSION = "0.0.0-20261109003541-7506e5f91cd6"
"""SeaweedFS is served by the Go module proxy only as this pseudo-version."""

NODE_GOMOD_DIR = Path(__file__).with_name("gomod")
_KUBE_GOMOD_DIR = NODE_GOMOD_DIR.parent.parent / "gomod"


@dataclass(frozen=True)
class _Component:
    name: str
    module: str
    gomod_root: Path
    packages: tuple[str, ...]
    outputs: tuple[str, ...]
    version: str
    tags: str = ""
    kubernetes_ldflags: bool = False

    def directory(self) -> Path:
        return cache_root() / "bin" / "node" / f"{self.name}-{self.version}"


_COMPONENTS = (
    _Component(
        name="kubernetes-node",
        module="kube",
        gomod_root=_KUBE_GOMOD_DIR,
        packages=tuple(
            f"k8s.io/kubernetes/cmd/{cmd}"
            for cmd in ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy")
        ),
        outputs=("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"),
        version=KUBERNETES_VERSION,
        kubernetes_ldflags=True,
    ),
    _Component(
        name="containerd",
        module="containerd",
        gomod_root=NODE_GOMOD_DIR,
        packages=tuple(
            f"github.com/containerd/containerd/v2/cmd/{cmd}"
            for cmd in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        outputs=("containerd", "containerd-shim-runc-v2", "ctr"),
        version=CONTAINERD_VERSION,
        tags="no_btrfs no_devmapper no_zfs",
    ),
    _Component(
        name="coredns",
        module="coredns",
        gomod_root=NODE_GOMOD_DIR,
        packages=(".",),
        outputs=("coredns",),
        version=COREDNS_VERSION,
    ),
    _Component(
        name="seaweedfs",
        module="seaweedfs",
        gomod_root=NODE_GOMOD_DIR,
        packages=("github.com/seaweedfs/seaweedfs/weed",),
        outputs=("weed",),
        version=SEAWEEDFS_VERSION,
    ),
    _Component(
        name="pause",
        module="pause",
        gomod_root=NODE_GOMOD_DIR,
        packages=(".",),
        outputs=("pause",),
        version="1",
    ),
)


@dataclass(frozen=True)
class NodeBinaries:
    """Paths of the local node's binaries, by name (``kubelet``, ``containerd``, ``weed`` ...)."""

    paths: dict[str, Path]

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]


def find_node_binaries(
    *, build: bool = True, s3: bool = True, progress: Progress = _stderr
) -> NodeBinaries:
    """Locate the node's binaries, building missing components when ``build`` is true;
    SeaweedFS (``weed``) only when ``s3`` is true (the node itself does not need it).

    Raises :class:`BinaryError` saying what to do when a binary cannot be had.
    """
    paths: dict[str, Path] = {}
    for component in _COMPONENTS:
        if component.name == "seaweedfs" and not s3:
            continue
        directory = component.directory()
        wanted = [directory / name for name in component.outputs]
        if not all(_is_executable(path) for path in wanted):
            if not build:
                raise BinaryError(
                    f"the local node's {component.name} is not built yet in {directory}; "
                    "run `make node-binaries`"
                )
            directory.mkdir(parents=True, exist_ok=True)
            with _lock(directory):
                if not all(_is_executable(path) for path in wanted):
                    go_build(
                        module=component.module,
                        gomod_root=component.gomod_root,
                        packages=list(component.packages),
                        outputs=list(component.outputs),
                        target=directory,
                        ldflags=_version_ldflags() if component.kubernetes_ldflags else "-s -w",
                        tags=component.tags,
                        label=f"{component.name} {component.version}",
                        progress=progress,
                    )
        paths.update({path.name: path for path in wanted})
    return NodeBinaries(paths)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@contextlib.contextmanager
def _lock(directory: Path) -> Iterator[None]:
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
