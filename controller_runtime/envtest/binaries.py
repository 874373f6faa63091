"""Finding, or building once, the binaries of the local control plane.

Resolution order, per binary (``etcd``, ``kube-apiserver``, ``kubectl``):

1. ``$KUBEBUILDER_ASSETS`` when set: the directory setup-envtest fills. Nothing is built; a
   missing binary there is an error that says so.
2. The cache directory (see :func:`cache_root`), under ``bin/k8s-<version>_etcd-<version>/``.
3. A build from Go modules at the pinned releases below, into that cache directory. The build
   modules (``go.mod``/``go.sum`` with their ``replace`` lines) ship beside this file in
   ``gomod/``; the go.sum files pin every module by hash. The first build takes several minutes
   and prints progress; later runs reuse the result. A file lock makes concurrent callers wait
   for one build instead of racing.

If the etcd build fails, Debian's ``etcd-server`` package is the fallback (installed with
apt-get when running as root).

kine (an etcd API over SQL databases, for the ``kine-sqlite`` and ``kine-postgres`` storage
of :mod:`controller_runtime.envtest.storage`) is found and built the same way by
:func:`find_kine`, on demand: ``$KUBEBUILDER_ASSETS/kine`` when present, else the cache
directory under ``bin/kine-<version>/``, else a build from ``gomod/kine``. It is built with
``CGO_ENABLED=0``, so its SQLite driver is modernc.org/sqlite (SQLite translated to Go), not
mattn/go-sqlite3: no C compiler is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "1.36.3"
"""The kube-apiserver and kubectl release built from ``k8s.io/kubernetes``."""

ETCD_VERSION = "3.6.16"
"""The etcd release built from ``go.etcd.io/etcd/server/v3``."""

KINE_VERSION = "0.17.5"
"""The kine release built from ``github.com/k3s-io/kine``."""

GOMOD_DIR = Path(__file__).with_name("gomod")

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class BinaryError(RuntimeError):
    """A control-plane binary is missing and could not be built."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the control-plane binaries."""

    etcd: Path
    kube_apiserver: Path
    kubectl: Path | None


def cache_root() -> Path:
    """The project's cache directory, outside the repository.

    ``$CONTROLLER_RUNTIME_PY_CACHE`` if set, else ``$XDG_CACHE_HOME/controller-runtime-py``,
    else ``~/.cache/controller-runtime-py``.
    """
    explicit = os.environ.get("CONTROLLER_RUNTIME_PY_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "controller-runtime-py"


def bin_dir() -> Path:
    """Where built binaries live: one directory per pinned version pair."""
    return cache_root() / "bin" / f"k8s-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}"


def kine_dir() -> Path:
    """Where the built kine lives."""
    return cache_root() / "bin" / f"kine-{KINE_VERSION}"


def find_kine(*, build: bool = True, progress: Progress = _stderr) -> Path:
    """Locate kine, building it when missing and ``build`` is true (several minutes, once).

    Raises :class:`BinaryError` with what to do when it cannot be had.
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and _is_executable(Path(assets) / "kine"):
        return Path(assets) / "kine"
    target = kine_dir()
    kine = target / "kine"
    if _is_executable(kine):
        return kine
    if not build:
        raise BinaryError(
            f"kine is not built yet in {target}; run `python -m controller_runtime.envtest "
            "build --kine` (or put a kine binary in $KUBEBUILDER_ASSETS)"
        )
    target.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        if not _is_executable(kine):
            go_build(
                module="kine",
                packages=["github.com/k3s-io/kine"],
                outputs=["kine"],
                target=target,
                ldflags=f"-s -w -X github.com/k3s-io/kine/pkg/version.Version=v{KINE_VERSION}",
                label=f"kine v{KINE_VERSION}",
                progress=progress,
            )
    return kine


def find_binaries(*, build: bool = True, progress: Progress = _stderr) -> Binaries:
    """Locate the binaries, building missing ones when ``build`` is true.

    Raises :class:`BinaryError` with what to do when a binary cannot be had.
    """
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        directory = Path(assets)
        etcd, apiserver = directory / "etcd", directory / "kube-apiserver"
        for path in (etcd, apiserver):
            if not _is_executable(path):
                raise BinaryError(
                    f"KUBEBUILDER_ASSETS={assets} has no executable {path.name}; "
                    "fill it with setup-envtest or unset KUBEBUILDER_ASSETS to build from source"
                )
        kubectl = directory / "kubectl"
        return Binaries(etcd, apiserver, kubectl if _is_executable(kubectl) else _system_kubectl())

    target = bin_dir()
    etcd, apiserver, kubectl = target / "etcd", target / "kube-apiserver", target / "kubectl"
    if all(_is_executable(p) for p in (etcd, apiserver, kubectl)):
        return Binaries(etcd, apiserver, kubectl)
    if not build:
        raise BinaryError(
            f"control-plane binaries are not built yet in {target}; run `make binaries` "
            "(or set KUBEBUILDER_ASSETS to a setup-envtest directory)"
        )
    target.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        if not (_is_executable(apiserver) and _is_executable(kubectl)):
            _build_kubernetes(target, progress)
        if not _is_executable(etcd):
            try:
                _build_etcd(target, progress)
            except BinaryError as err:
                progress(f"etcd build failed ({err}); falling back to Debian's etcd-server")
                _install_debian_etcd(etcd, progress)
    return Binaries(etcd, apiserver, kubectl)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _system_kubectl() -> Path | None:
    found = shutil.which("kubectl")
    return Path(found) if found else None


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _version_ldflags() -> str:
    major, minor, _ = KUBERNETES_VERSION.split(".")
    pkg = "k8s.io/component-base/version"
    pairs = {
        "gitVersion": f"v{KUBERNETES_VERSION}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    return "-s -w " + " ".join(f"-X {pkg}.{key}={value}" for key, value in pairs.items())


def _build_kubernetes(target: Path, progress: Progress) -> None:
    go_build(
        module="kube",
        packages=["k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubectl"],
        outputs=["kube-apiserver", "kubectl"],
        target=target,
        ldflags=_version_ldflags(),
        label=f"kube-apiserver and kubectl v{KUBERNETES_VERSION}",
        progress=progress,
    )


def _build_etcd(target: Path, progress: Progress) -> None:
    go_build(
        module="etcd",
        packages=["go.etcd.io/etcd/server/v3"],
        outputs=["etcd"],
        target=target,
        ldflags="-s -w",
        label=f"etcd v{ETCD_VERSION}",
        progress=progress,
        rename={"server": "etcd"},
    )


def go_build(
    *,
    module: str,
    packages: list[str],
    outputs: list[str],
    target: Path,
    ldflags: str,
    label: str,
    progress: Progress,
    rename: dict[str, str] | None = None,
    gomod_root: Path = GOMOD_DIR,
    tags: str = "",
) -> None:
    """Build ``packages`` of the build module ``gomod_root/module`` into ``target``."""
    go = shutil.which("go")
    if go is None:
        raise BinaryError(
            f"building {label} needs Go (>= 1.26) on PATH; install Go or set KUBEBUILDER_ASSETS"
        )
    build_root = cache_root() / "build"
    build_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{module}-", dir=build_root) as work:
        workdir = Path(work)
        for source in (gomod_root / module).iterdir():
            if source.is_file():
                shutil.copy(source, workdir / source.name)
        out = workdir / "out"
        out.mkdir()
        env = {
            **os.environ,
            "CGO_ENABLED": "0",
            "GOWORK": "off",
            "GOFLAGS": "-mod=readonly -buildvcs=false",
            "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local"),
        }
        command = [go, "build", "-v", "-trimpath", f"-ldflags={ldflags}", "-o", str(out)]
        command += [f"-tags={tags}"] if tags else []
        command += packages
        progress(f"building {label} from Go modules (first time only; takes several minutes)")
        _run_with_progress(command, workdir, env, label, progress)
        for produced in out.iterdir():
            final = (rename or {}).get(produced.name, produced.name)
            tmp = target / f".{final}.tmp"
            shutil.move(str(produced), tmp)
            tmp.chmod(0o755)
            tmp.replace(target / final)
    missing = [name for name in outputs if not _is_executable(target / name)]
    if missing:
        raise BinaryError(f"the build of {label} did not produce {', '.join(missing)}")


def _run_with_progress(
    command: list[str], cwd: Path, env: dict[str, str], label: str, progress: Progress
) -> None:
    """Run the build, reporting how many packages compiled every 15 s."""
    started = time.monotonic()
    tail: list[str] = []
    compiled = 0
    done = threading.Event()

    def report() -> None:
        while not done.wait(15):
            elapsed = int(time.monotonic() - started)
            progress(
                f"  {label}: {compiled} packages compiled, {elapsed // 60}m{elapsed % 60:02d}s"
            )

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        with subprocess.Popen(
            command, cwd=cwd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        ) as proc:
            assert proc.stderr is not None
            for line in proc.stderr:
                # `go build -v` names each package it compiles on a line of its own;
                # anything else (downloads, errors) is kept for the error message.
                if " " in line.strip() or ":" in line:
                    tail = [*tail[-40:], line.rstrip()]
                else:
                    compiled += 1
            code = proc.wait()
    finally:
        done.set()
        reporter.join()
    elapsed = time.monotonic() - started
    if code != 0:
        raise BinaryError(f"go build of {label} failed (exit {code}):\n" + "\n".join(tail))
    progress(f"  {label}: built in {elapsed:.0f}s ({compiled} packages)")


def _install_debian_etcd(destination: Path, progress: Progress) -> None:
    system = shutil.which("etcd")
    if system is None and os.geteuid() == 0 and shutil.which("apt-get"):
        progress("installing Debian's etcd-server with apt-get")
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "etcd-server"], check=False)
        system = shutil.which("etcd")
    if system is None:
        raise BinaryError(
            "etcd could not be built and no system etcd was found; install etcd-server "
            "or set KUBEBUILDER_ASSETS"
        )
    destination.symlink_to(system)
