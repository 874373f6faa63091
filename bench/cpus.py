"""Split the machine's cores between the control plane and the clients under test.

On a machine with few cores the API server, etcd and the client being measured share them,
so every millisecond of CPU a client spends per write is taken from the server, and the
server's own run-to-run variation hides differences between clients. ``--split-cores
SERVER:CLIENT`` (for example ``0:1``) pins the control plane's processes to the first set of
cores and the harness with everything it starts (the implementations, the plain client) to
the second, so a client's cost shows as its own core's load and the write rate measures how
well it keeps the server busy.

Linux only (``os.sched_setaffinity``). Affinity is set on every thread of a process, since
the call itself changes one thread; threads started later inherit their creator's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CoreSplit:
    """The cores the control plane runs on, and those the harness and its children run on."""

    server: frozenset[int]
    client: frozenset[int]

    def describe(self) -> str:
        def cores(s: frozenset[int]) -> str:
            return ",".join(str(c) for c in sorted(s))

        return f"server on cores {cores(self.server)}, clients on cores {cores(self.client)}"


def parse_split(value: str) -> CoreSplit:
    """``"0:1"`` or ``"0,1:2,3"``: the server's cores, a colon, the clients' cores. Raises
    ``ValueError`` naming the problem when the sets are empty, overlap, or name a core this
    process may not use."""
    server_text, sep, client_text = value.partition(":")
    if not sep:
        raise ValueError(f"--split-cores {value!r}: expected SERVER:CLIENT, e.g. 0:1")
    try:
        server = frozenset(int(c) for c in server_text.split(",") if c.strip())
        client = frozenset(int(c) for c in client_text.split(",") if c.strip())
    except ValueError:
        raise ValueError(f"--split-cores {value!r}: cores are integers, e.g. 0:1") from None
    if not server or not client:
        raise ValueError(f"--split-cores {value!r}: both sides need at least one core")
    if server & client:
        raise ValueError(f"--split-cores {value!r}: the sides share {sorted(server & client)}")
    available = os.sched_getaffinity(0)
    missing = (server | client) - available
    if missing:
        raise ValueError(
            f"--split-cores {value!r}: cores {sorted(missing)} are not available here "
            f"(this process may use {sorted(available)})"
        )
    return CoreSplit(server, client)


def threads_of(pid: int) -> list[int]:
    """The thread ids of ``pid`` (``[pid]`` when ``/proc`` does not list them)."""
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return [pid]


def pin(pids: Iterable[int], cores: frozenset[int]) -> None:
    """Restrict every thread of each process in ``pids`` to ``cores``. A thread that exits
    meanwhile is skipped."""
    for pid in pids:
        for tid in threads_of(pid):
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:
                continue


def apply(split: CoreSplit, server_pids: Iterable[int]) -> None:
    """Pin the control plane's processes to ``split.server`` and this process (so everything
    it starts from now on) to ``split.client``."""
    pin(server_pids, split.server)
    pin([os.getpid()], split.client)
