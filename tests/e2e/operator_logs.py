"""Following the operator Pods' logs through a rolling upgrade, and reading from them when
each Pod led.

A Pod's log is gone once the Pod is deleted, so :class:`LogFollower` streams every operator
Pod's log (``kubectl logs -f``) into a file from the moment the Pod is seen until it ends.
The operator logs JSON lines (``ts``, ``msg``); :func:`leadership` reads from them the span
in which a Pod could reconcile."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from controller_runtime.envtest.node.cluster import LocalCluster
from tests.e2e.support import OPERATOR_NAMESPACE, OPERATOR_SELECTOR

BECAME_LEADER = "became leader of"
RELEASED = "released the lease"
SIGNALLED = "shutting down"


class LogFollower:
    """Streams the log of every operator Pod that exists while it runs into ``directory``
    (one file per Pod). :meth:`stop` ends the streams (the ``kubectl`` processes it started)."""

    def __init__(self, cluster: LocalCluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        self._streams: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def following(self) -> set[str]:
        """The Pods whose logs are being streamed."""
        return {name for name, p in list(self._streams.items()) if p.poll() is None}

    def stop(self) -> dict[str, Path]:
        """End the streams; the log file of each Pod seen."""
        self._stop.set()
        self._thread.join(timeout=30)
        for process in self._streams.values():
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)
        return {name: self.directory / f"{name}.log" for name in self._streams}

    def _run(self) -> None:
        kubectl = self.cluster.plane.binaries
        assert kubectl is not None and kubectl.kubectl is not None
        while not self._stop.is_set():
            out = self.cluster.kubectl(
                "get", "pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR, "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.phase}{'\\n'}{end}",
                check=False,
            )  # fmt: skip
            for line in out.splitlines():
                name, _, phase = line.partition(" ")
                running = self._streams.get(name)
                # A stream started before the container ran ends at once: start it again.
                if phase == "Running" and (running is None or running.poll() not in (None, 0)):
                    self._follow(name, str(kubectl.kubectl))
            self._stop.wait(0.5)

    def _follow(self, name: str, kubectl: str) -> None:
        with (self.directory / f"{name}.log").open("wb") as sink:
            self._streams[name] = subprocess.Popen(
                [
                    kubectl, f"--kubeconfig={self.cluster.kubeconfig}", "logs", "-f",
                    "-n", OPERATOR_NAMESPACE, name,
                ],
                stdout=sink,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip


@dataclass(frozen=True)
class Leadership:
    """When one Pod held the Lease, from its own log."""

    pod: str
    acquired: datetime
    released: datetime | None
    """Its "released the lease" line (logged after its controllers drained); ``None`` when
    the log ends without one."""
    last_line: datetime
    signalled: datetime | None


def read_lines(path: Path) -> list[tuple[datetime, str]]:
    """The JSON lines of a log as (time, message); other lines are skipped."""
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(raw)
            lines.append((datetime.fromisoformat(record["ts"]), str(record.get("msg", ""))))
        except (ValueError, KeyError, TypeError):
            continue
    return lines


def leadership(pod: str, path: Path) -> Leadership | None:
    """When ``pod`` led (``None`` if its log never says it became leader)."""
    lines = read_lines(path)
    acquired = next((t for t, m in lines if BECAME_LEADER in m), None)
    if acquired is None:
        return None
    return Leadership(
        pod=pod,
        acquired=acquired,
        released=next((t for t, m in lines if RELEASED in m and t >= acquired), None),
        last_line=lines[-1][0],
        signalled=next((t for t, m in lines if SIGNALLED in m), None),
    )


def overlap(leaders: list[Leadership]) -> str | None:
    """Why two of ``leaders`` could have reconciled at once, or ``None``: ordered by when
    they became leader, each must become leader no earlier than the previous one logged
    that it released the Lease (a leader replaced without that line counts as overlap)."""
    ordered = sorted(leaders, key=lambda found: found.acquired)
    for before, after in itertools.pairwise(ordered):
        if before.released is None:
            return f"pod {before.pod} never logged the release before pod {after.pod} led"
        if after.acquired < before.released:
            return (
                f"pod {after.pod} became leader at {after.acquired} before pod {before.pod} "
                f"released the lease at {before.released}"
            )
    return None
