"""Building the Go peer (``bench/peers/go``) once, into the cache directory.

Three programs share the module: the controller-runtime Task controller (``main.go``,
``task-peer``), the client-go core peer (``core/``, ``core-peer``; see :mod:`bench.core`) and
controller-runtime's webhook server (``webhook/``, ``webhook-peer``; see :mod:`bench.webhook`).
Both land in ``<cache_root>/bench/go-peer-<hash>/``, where the hash covers ``go.mod``,
``go.sum`` and every ``.go`` file: an edit of any of them builds anew, an unchanged tree reuses
the binaries. As for the control-plane binaries (:mod:`controller_runtime.envtest.binaries`)
the build is from the committed module files, ``-mod=readonly``, with the Go on PATH and the
module proxy, showing progress; nothing lands in the repository.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from controller_runtime.envtest.binaries import (
    BinaryError,
    Progress,
    _build_lock,
    _run_with_progress,
    _stderr,
    cache_root,
)

SOURCE = Path(__file__).with_name("go")
PROGRAMS = {"task-peer": ".", "core-peer": "./core", "webhook-peer": "./webhook"}
"""Each binary and the package it is built from."""


def source_files() -> list[str]:
    """The module's files, relative to :data:`SOURCE`, in a stable order."""
    found = ["go.mod", "go.sum"]
    found += sorted(str(p.relative_to(SOURCE)) for p in SOURCE.rglob("*.go"))
    return found


def source_hash() -> str:
    digest = hashlib.sha256()
    for name in source_files():
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def controller_runtime_version() -> str:
    """The pinned sigs.k8s.io/controller-runtime version, from go.mod."""
    found = re.search(r"sigs\.k8s\.io/controller-runtime (v\S+)", (SOURCE / "go.mod").read_text())
    return found.group(1) if found else "unknown"


def peer_binary(*, build: bool = True, progress: Progress = _stderr) -> Path:
    """The Go Task controller's executable, built first when missing. Raises
    :class:`BinaryError`."""
    return _binary("task-peer", build=build, progress=progress)


def core_peer_binary(*, build: bool = True, progress: Progress = _stderr) -> Path:
    """The client-go core peer's executable, built first when missing. Raises
    :class:`BinaryError`."""
    return _binary("core-peer", build=build, progress=progress)


def webhook_peer_binary(*, build: bool = True, progress: Progress = _stderr) -> Path:
    """controller-runtime's webhook server validating Tasks (see :mod:`bench.webhook`), built
    first when missing. Raises :class:`BinaryError`."""
    return _binary("webhook-peer", build=build, progress=progress)


def _binary(name: str, *, build: bool, progress: Progress) -> Path:
    target = cache_root() / "bench" / f"go-peer-{source_hash()}"
    binary = target / name
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    if not build:
        raise BinaryError(f"the Go peer is not built yet ({binary})")
    go = shutil.which("go")
    if go is None:
        raise BinaryError("building the Go peer needs Go (>= 1.26) on PATH")
    target.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        if binary.is_file():
            return binary
        with tempfile.TemporaryDirectory(prefix="go-peer-", dir=target.parent) as work:
            workdir = Path(work)
            for file in source_files():
                (workdir / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(SOURCE / file, workdir / file)
            out = workdir / name
            env = {
                **os.environ,
                "CGO_ENABLED": "0",
                "GOWORK": "off",
                "GOFLAGS": "-mod=readonly -buildvcs=false",
                "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local"),
            }
            label = f"the Go {name} (controller-runtime {controller_runtime_version()})"
            progress(f"building {label} from Go modules (first time only; about 2 minutes)")
            package = PROGRAMS[name]
            command = [go, "build", "-v", "-trimpath", "-ldflags=-s -w", "-o", str(out), package]
            _run_with_progress(command, workdir, env, label, progress)
            tmp = target / f".{name}.tmp"
            shutil.move(str(out), tmp)
            tmp.chmod(0o755)
            tmp.replace(binary)
    return binary
