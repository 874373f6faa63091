"""A manager whose reconciles take 3 seconds, for the SIGTERM test.

    python slow_operator.py KUBECONFIG NAMESPACE DIR

Writes DIR/ready once the manager runs, DIR/started when a reconcile begins and
DIR/finished when it completes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from controller_runtime import ControllerBuilder, Request
from controller_runtime.manager import Manager, ManagerOptions, run_until_signalled
from kubeclient.config import load_kubeconfig


async def main(kubeconfig: str, namespace: str, directory: Path) -> int:
    manager = Manager(
        await load_kubeconfig(kubeconfig),
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            graceful_shutdown_timeout=20,
        ),
    )

    async def reconcile(request: Request) -> None:
        (directory / "started").touch()
        await asyncio.sleep(3)
        (directory / "finished").touch()

    class Ready:
        """Marks the moment the manager leads (controllers are started right after)."""

        need_leader_election = True

        async def start(self) -> None:
            (directory / "ready").touch()

        async def stop(self, drain_timeout: float | None) -> None:
            return None

    await ControllerBuilder(manager).for_("tasks.crpy.io/v1", "Task").complete(reconcile)
    manager.add(Ready())
    await run_until_signalled(manager)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))))
