"""The ceiling of the write-heavy scenario: the same status writes with no framework.

    python -m bench.runners.limit --kubeconfig FILE --namespace NS --stamp S [--rounds K]
        [--concurrency C]

One LIST of the namespace's Tasks, then C concurrent coroutines on one aiohttp session
(C connections) send, per Task, ``rounds`` merge patches of the status subresource with exactly
the body and query the controllers send (derived status + the ``Bench`` stamp, conditioned on the
resourceVersion of the object as last seen, i.e. the LIST or the previous write's answer;
``fieldManager=controller-runtime-py`` as ours sends). No cache, no queue, no watch: the most a
Python client on this machine gets from this API server.

``--watch``: also keep one WATCH of the namespace open (from the LIST's resourceVersion, on a
connection of its own) and decode every event with orjson, nothing more, until the echo of every
write has arrived: what any controller pays for seeing its own writes (the API server's fan-out
to one more watcher, the bytes, the decoding), without a cache, queue or second reconcile.

``--sync-only``: write each Task's derived status once (no stamp, what the Task controller's
sync writes) and exit; the harness uses it, unmeasured, to bring the limit's fresh Tasks to the
state the implementations' Tasks are in after ``sync``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.request_trace import install_from_env
from bench.runners.stamp import stamped
from controller_runtime.manager import install_event_loop
from controllers.task import derive_status, utcnow
from kubeclient.config import load_kubeconfig


class EchoWatch:
    """A watch of the namespace from ``resource_version`` whose events are decoded with orjson
    and counted (MODIFIED ones), nothing more."""

    def __init__(
        self, session: aiohttp.ClientSession, base: str, resource_version: str, expected: int
    ) -> None:
        self.session = session
        self.base = base
        self.resource_version = resource_version
        self.expected = expected
        self.modified = 0
        self.caught_up = asyncio.Event()
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        params = {
            "watch": "1",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(self.base, params=params, timeout=timeout) as stream:
            stream.raise_for_status()
            async for line in stream.content:
                if orjson.loads(line)["type"] == "MODIFIED":
                    self.modified += 1
                    if self.modified >= self.expected:
                        self.caught_up.set()

    async def finish(self, timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) for the echo of every write, stop; the count."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.caught_up.wait(), timeout=timeout)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.modified


async def run(args: argparse.Namespace) -> int:
    config = await load_kubeconfig(Path(args.kubeconfig))
    base = f"{config.server}/apis/tasks.crpy.io/v1/namespaces/{args.namespace}/tasks"
    headers = {"Accept": "application/json", **(await config.credentials.headers())}
    # One connection more for the watch, so that the writes keep all of theirs.
    connector = aiohttp.TCPConnector(
        ssl=config.ssl_context, limit=args.concurrency + (1 if args.watch else 0)
    )
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        async with session.get(base) as answer:
            answer.raise_for_status()
            listed = orjson.loads(await answer.read())
        items: list[dict[str, Any]] = listed["items"]
        list_rv: str = listed["metadata"]["resourceVersion"]
        pending = iter(items)
        params = {"fieldManager": args.field_manager}
        failures = 0

        async def write(task: dict[str, Any]) -> None:
            nonlocal failures
            for _round in range(args.rounds):
                now = utcnow()
                derived, _ = derive_status(task, now)
                status = (
                    derived
                    if args.sync_only
                    else stamped(
                        derived,
                        task.get("status"),
                        stamp=args.stamp,
                        rounds=args.rounds,
                        generation=task["metadata"].get("generation"),
                        now=now,
                    )
                )
                if status is None:
                    return
                body = orjson.dumps(
                    {
                        "metadata": {"resourceVersion": task["metadata"]["resourceVersion"]},
                        "status": status,
                    }
                )
                url = f"{base}/{task['metadata']['name']}/status"
                async with session.patch(
                    url,
                    params=params,
                    data=body,
                    headers={"Content-Type": "application/merge-patch+json"},
                ) as answer:
                    payload = await answer.read()
                    if answer.status >= 400:
                        failures += 1
                        return
                task = orjson.loads(payload)
                if args.sync_only:
                    return

        async def worker() -> None:
            for task in pending:
                await write(task)

        expected = len(items) * (1 if args.sync_only else args.rounds)
        echoes = EchoWatch(session, base, list_rv, expected) if args.watch else None
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        if echoes is not None:
            seen = await echoes.finish(timeout=60.0)
            print(f"watch: {seen} MODIFIED events for {expected} writes", file=sys.stderr)
    if failures:
        print(f"{failures} writes failed", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runners.limit", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--field-manager", default="controller-runtime-py")
    parser.add_argument(
        "--watch", action="store_true", help="also watch the namespace, decoding every event"
    )
    parser.add_argument(
        "--sync-only",
        action="store_true",
        help="write each Task's derived status (no stamp) once, then exit",
    )
    args = parser.parse_args(argv)
    install_from_env("limit")
    install_event_loop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
