"""One implementation as one OS process, measured by the OS.

Peak RSS is the kernel's high-water mark of the process (``VmHWM`` in ``/proc/PID/status``),
CPU seconds are its user + system time (``/proc/PID/stat``, via psutil), both read at the
moment the harness saw the work done, before the process is stopped (so shutdown is not
counted). Threads are part of the process and counted; the implementations start no child
processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


def peak_rss(pid: int) -> int | None:
    """The process's peak resident set size in bytes (VmHWM), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """User + system CPU seconds of ``pids`` together (None if any is gone)."""
    total = 0.0
    try:
        for pid in pids:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    except psutil.Error:
        return None
    return total


@dataclass
class Child:
    """A started implementation process."""

    name: str
    popen: subprocess.Popen[bytes]
    started: float
    log_path: Path
    exit_cpu: float | None = None
    exit_peak_rss: int | None = None

    @classmethod
    def start(
        cls, name: str, command: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> Child:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            started = time.monotonic()
            popen = subprocess.Popen(
                list(command),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(name, popen, started, log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it still runs. Reaps it with ``os.wait4`` when it has exited, keeping its
        rusage (CPU, peak RSS), which ``/proc`` no longer has then."""
        if self.popen.returncode is not None:
            return False
        pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            return True
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self.exit_cpu = usage.ru_utime + usage.ru_stime
        self.exit_peak_rss = usage.ru_maxrss * 1024
        return False

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for it to exit by itself; True if it did."""
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def peak_rss(self) -> int | None:
        if not self.alive():
            return self.exit_peak_rss
        return peak_rss(self.pid)

    def cpu_seconds(self) -> float | None:
        if not self.alive():
            return self.exit_cpu
        return cpu_seconds([self.pid])

    def rss(self) -> int | None:
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except psutil.Error:
            return None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the exit status."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            if not self.wait_exit(timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.wait_exit(60)
        return self.popen.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
