"""The ceiling of the write-heavy scenario: the same status writes with no framework.

    python -m bench.runners.limit --kubeconfig FILE --namespace NS --stamp S [--rounds K]
        [--concurrency C]

One LIST of the namespace's Tasks, then C concurrent coroutines on one aiohttp session
(C connections) send, per Task, ``rounds`` merge patches of the status subresource with exactly
the body the controllers send (derived status + the ``Bench`` stamp, conditioned on the
resourceVersion of the object as last seen, i.e. the LIST or the previous write's answer). No
cache, no queue, no watch: the most a Python client on this machine gets from this API server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.runners.stamp import stamped
from controller_runtime.manager import install_uvloop
from controllers.task import derive_status, utcnow
from kubeclient.config import load_kubeconfig


async def run(args: argparse.Namespace) -> int:
    config = await load_kubeconfig(Path(args.kubeconfig))
    base = f"{config.server}/apis/tasks.crpy.io/v1/namespaces/{args.namespace}/tasks"
    headers = {"Accept": "application/json", **(await config.credentials.headers())}
    connector = aiohttp.TCPConnector(ssl=config.ssl_context, limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        async with session.get(base) as answer:
            answer.raise_for_status()
            items: list[dict[str, Any]] = orjson.loads(await answer.read())["items"]
        pending = iter(items)
        failures = 0

        async def write(task: dict[str, Any]) -> None:
            nonlocal failures
            for _round in range(args.rounds):
                now = utcnow()
                derived, _ = derive_status(task, now)
                status = stamped(
                    derived,
                    task.get("status"),
                    stamp=args.stamp,
                    rounds=args.rounds,
                    generation=task["metadata"].get("generation"),
                    now=now,
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
                    data=body,
                    headers={"Content-Type": "application/merge-patch+json"},
                ) as answer:
                    payload = await answer.read()
                    if answer.status >= 400:
                        failures += 1
                        return
                task = orjson.loads(payload)

        async def worker() -> None:
            for task in pending:
                await write(task)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
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
    args = parser.parse_args(argv)
    install_uvloop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
