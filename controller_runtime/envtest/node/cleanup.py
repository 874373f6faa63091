"""Undoing what a local cluster leaves on the machine: its processes, mounts and the kernel
settings the kubelet changes (its cgroups: :mod:`.cgroups`; its network: :mod:`.network`).
Each function touches only what is provably the cluster's: processes naming its work
directory, mounts under its work directory, the three kernel settings recorded before the
first kubelet started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

KERNEL_SETTINGS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""The kernel settings the kubelet changes on start (as kind's does)."""


def record_kernel_settings() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in KERNEL_SETTINGS}


def restore_kernel_settings(recorded: dict[str, str]) -> list[str]:
    problems = []
    for name, value in recorded.items():
        path = Path("/proc/sys") / name
        try:
            if path.read_text().strip() != value:
                path.write_text(value)
        except OSError as err:
            problems.append(f"restoring {name}={value}: {err}")
    return problems


def pids_naming(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (the node's work directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace"
            ):
                found.append(int(entry.name))
    return found


def kill_all(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _signal(pid, sig)]
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
            time.sleep(0.05)
        if not alive:
            return
        pids = alive


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or under ``directory``, deepest (latest) first."""
    prefix = str(directory)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return list(reversed(points))


def unmount_all(directory: Path) -> list[str]:
    problems = []
    for _ in range(3):
        points = mounts_under(directory)
        if not points:
            return []
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    problems = [f"still mounted: {point}" for point in mounts_under(directory)]
    return problems


def remove_links_into(directory: Path, target: Path) -> None:
    """Remove the symbolic links in ``directory`` that point into ``target`` (the kubelet
    links every container's log into /var/log/containers, a path it does not let one
    configure)."""
    if not directory.is_dir():
        return
    for link in directory.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(str(target) + "/"):
                link.unlink()
