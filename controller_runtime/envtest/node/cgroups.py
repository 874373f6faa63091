"""Each node's cgroups. Several kubelets on one machine must not share the ``kubepods`` tree,
so node ``X``'s kubelet has ``cgroupRoot: /X`` and every Pod of that node lives under ``/X``
in each hierarchy (cgroup v1; ``/sys/fs/cgroup/X`` on a unified v2 machine). That tree is
also how a node is lost at once (:func:`freeze`: the freezer stops every process of every
Pod of the node) and how its containers are found (:func:`pids_under`).

Every function acts only on trees named like a node (``crpy-node-<n>``) and on the
top-level ``kubepods`` an earlier single-node layout made.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_NODE_TREE = re.compile(r"^crpy-node-\d+$")
_LEGACY_TREE = "kubepods"


class CgroupError(RuntimeError):
    """A node's cgroups could not be made, frozen or thawed."""


def unified() -> bool:
    """Whether the machine has the unified (v2) hierarchy at /sys/fs/cgroup."""
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def hierarchies() -> list[Path]:
    """The mounted hierarchies: /sys/fs/cgroup itself on v2, each directory of it on v1
    (named ones such as ``systemd`` and the hybrid ``unified`` included)."""
    if unified():
        return [CGROUP_ROOT]
    if not CGROUP_ROOT.is_dir():
        return []
    return sorted(d for d in CGROUP_ROOT.iterdir() if (d / "cgroup.procs").exists())


def create_root(name: str) -> None:
    """Make ``/name`` in every hierarchy (the kubelet refuses a ``cgroupRoot`` that does
    not exist). In the v1 cpuset hierarchy its CPUs and memory nodes are copied from the
    machine's (a new cpuset has none, and a cgroup with none takes no process)."""
    for hierarchy in hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            parent = hierarchy / setting
            if parent.exists() and not unified() and not (path / setting).read_text().strip():
                (path / setting).write_text(parent.read_text().strip())


def trees(name: str | None = None) -> list[Path]:
    """The top of node ``name``'s tree in each hierarchy, or of every node's tree (and of a
    legacy top-level ``kubepods``) when ``name`` is ``None``; only those that exist."""
    found: list[Path] = []
    for hierarchy in hierarchies():
        if name is not None:
            candidates = [hierarchy / name]
        else:
            candidates = [
                d for d in hierarchy.iterdir() if d.is_dir() and _NODE_TREE.match(d.name)
            ] + [hierarchy / _LEGACY_TREE]
        found += [path for path in candidates if path.is_dir()]
    return found


def cgroups(name: str | None = None) -> list[Path]:
    """Every cgroup in those trees (see :func:`trees`), deepest first."""
    found: list[Path] = []
    for top in trees(name):
        found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def pids_under(name: str | None = None) -> list[int]:
    """The processes in node ``name``'s Pods (every node's when ``None``)."""
    pids: set[int] = set()
    for cgroup in cgroups(name):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
    return sorted(pids)


def _freezer(name: str) -> tuple[Path, str, str]:
    """The file that freezes ``name``'s tree, and what to write to freeze and to thaw."""
    if unified():
        return CGROUP_ROOT / name / "cgroup.freeze", "1", "0"
    return CGROUP_ROOT / "freezer" / name / "freezer.state", "FROZEN", "THAWED"


def freeze(name: str, timeout: float = 10.0) -> None:
    """Stop every process of node ``name``'s Pods (they keep their memory, sockets and
    addresses; the kernel still answers for their sockets). Returns once all are frozen."""
    path, frozen, _ = _freezer(name)
    if not path.exists():
        raise CgroupError(f"cannot freeze node {name}: {path} does not exist")
    path.write_text(frozen)
    deadline = time.monotonic() + timeout
    while not is_frozen(name):
        if time.monotonic() > deadline:
            raise CgroupError(f"node {name}'s Pods not frozen after {timeout:.0f}s ({path})")
        time.sleep(0.05)


def thaw(name: str) -> None:
    """Undo :func:`freeze` (nothing to do when the tree is not frozen or is gone)."""
    path, _, thawed = _freezer(name)
    with contextlib.suppress(FileNotFoundError):
        path.write_text(thawed)


def is_frozen(name: str) -> bool:
    path, frozen, _ = _freezer(name)
    if unified():
        events = path.with_name("cgroup.events")
        with contextlib.suppress(OSError):
            return "frozen 1" in events.read_text()
        return False
    with contextlib.suppress(OSError):
        return path.read_text().strip() == frozen
    return False


def thaw_all() -> None:
    """Thaw every node's tree: a frozen process cannot die, so this comes before a kill."""
    for top in trees():
        if top.name != _LEGACY_TREE:
            thaw(top.name)


def remove(name: str | None = None) -> list[str]:
    """Remove node ``name``'s cgroups (every node's, and a legacy ``kubepods``, when
    ``None``), deepest first; they must hold no process any more. Returns what could not
    be removed."""
    problems = []
    for cgroup in cgroups(name):
        try:
            cgroup.rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            problems.append(f"cgroup {cgroup}: {err}")
    return problems
