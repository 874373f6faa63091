"""Our implementation in the benchmark: the real Task controller on a real Manager.

    python -m bench.runners.ours --kubeconfig FILE --namespace NS [--mode write-heavy ...]

``normal``: exactly the operator's ``controllers.task`` (derive the status, write it only when it
changes, reconcile on spec changes), on a :class:`~controller_runtime.manager.Manager` restricted
to NS, with leader election, metrics and probes off, the event loop ``python -m controllers`` picks
(asyncio's; ``CRPY_EVENT_LOOP=uvloop`` for uvloop), logging at WARNING; ``--metrics-bind-address``
turns the metrics endpoint on (the restart scenario reads "done" from it). ``write-heavy``: the
same reconciler body, but every reconcile writes (see :mod:`bench.runners.stamp`) and the
controller has no predicate, so each status write comes back as an event; that echo of its own
conditioned write is not reconciled again (``skip_own_write_echoes``) unless
``--reconcile-echoes``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.request_trace import install_from_env
from bench.runners.stamp import stamped
from controller_runtime import ControllerBuilder, Request, Result, configure_logging
from controller_runtime.client import Client
from controller_runtime.controller import ControllerOptions
from controller_runtime.manager import (
    Manager,
    ManagerOptions,
    install_event_loop,
    run_until_signalled,
)
from controllers.task import (
    TASK_API_VERSION,
    TASK_KIND,
    TaskReconciler,
    derive_status,
    setup_task_controller,
)
from kubeclient.config import load_kubeconfig
from kubeclient.errors import NotFoundError


class WriteHeavyTaskReconciler(TaskReconciler):
    """The Task reconciler that writes on every reconcile, up to ``rounds`` per object."""

    def __init__(self, client: Client, *, stamp: str, rounds: int) -> None:
        super().__init__(client)
        self.stamp = stamp
        self.rounds = rounds

    async def reconcile(self, request: Request) -> Result | None:
        try:
            task = await self.client.get(TASK_API_VERSION, TASK_KIND, request)
        except NotFoundError:
            return None
        now = self.clock()
        derived, _ = derive_status(task, now)
        generation = task.get("metadata", {}).get("generation")
        status = stamped(
            derived,
            task.get("status"),
            stamp=self.stamp,
            rounds=self.rounds,
            generation=generation,
            now=now,
        )
        if status is not None:
            patch = {
                "metadata": {"resourceVersion": task["metadata"]["resourceVersion"]},
                "status": status,
            }
            await self.client.patch_status(task, patch)
        return None


async def run(args: argparse.Namespace) -> int:
    config = await load_kubeconfig(Path(args.kubeconfig))
    manager = Manager(
        config,
        ManagerOptions(
            namespaces=[args.namespace],
            leader_election=None,
            metrics_bind_address=args.metrics_bind_address,
            health_probe_bind_address=None,
            cache_memory_limit=args.memory_limit,
            cache_sync_timeout=args.cache_sync_timeout,
        ),
    )
    options = ControllerOptions(
        max_concurrent_reconciles=args.workers, cache_sync_timeout=args.cache_sync_timeout
    )
    if args.mode == "normal":
        await setup_task_controller(manager, manager.client, options=options)
    else:
        reconciler = WriteHeavyTaskReconciler(manager.client, stamp=args.stamp, rounds=args.rounds)
        await (
            ControllerBuilder(manager)
            .named("task")
            .for_(TASK_API_VERSION, TASK_KIND)
            .with_options(options, skip_own_write_echoes=not args.reconcile_echoes)
            .complete(reconciler)
        )
    await run_until_signalled(manager)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runners.ours", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--mode", choices=["normal", "write-heavy"], default="normal")
    parser.add_argument("--stamp", default="")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--memory-limit",
        type=int,
        default=None,
        help="ManagerOptions(cache_memory_limit=BYTES): bodies above it are evicted and "
        "fetched live on a read (default: unbounded)",
    )
    parser.add_argument(
        "--cache-sync-timeout",
        type=float,
        default=120.0,
        help="seconds the initial list may take (ManagerOptions and ControllerOptions; the "
        "harness passes its --timeout: a million objects take longer than the default 120)",
    )
    parser.add_argument(
        "--reconcile-echoes",
        action="store_true",
        help="write-heavy: reconcile the echo of each own status write again (as the Go peer "
        "does) instead of skipping it (skip_own_write_echoes, the default here)",
    )
    parser.add_argument(
        "--metrics-bind-address",
        default="0",
        help='the Prometheus endpoint, host:port ("0" = off; the restart scenario scrapes it)',
    )
    args = parser.parse_args(argv)
    configure_logging("warning", "text")
    logging.getLogger().setLevel(logging.WARNING)
    install_from_env("ours")
    install_event_loop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
