"""The limit of the restart scenario: a plain paginated LIST of the namespace, decoded.

    python -m bench.runners.listlimit --kubeconfig FILE --namespace NS [--page 500]

One aiohttp session, ``GET ...?limit=500`` then ``&continue=...`` until the server says there
is no more, each page decoded with ``orjson.loads`` and then dropped. Nothing else: no cache,
no watch, no queue, no reconcile. The time and bytes any client must pay to see every object
once. Prints one JSON line, ``{"objects": N, "bytes": B, "pages": P, "page_seconds": {...},
"complete": true}``, and exits; the harness measures it as a process (start to exit, peak
RSS, CPU). With ``--seconds S`` it stops after the page that ends past S seconds and says
``"complete": false``: what it listed by then, and its pages' times, still tell the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import orjson

from controller_runtime.manager import install_event_loop
from kubeclient.config import load_kubeconfig


async def run(args: argparse.Namespace) -> int:
    config = await load_kubeconfig(Path(args.kubeconfig))
    url = f"{config.server}/apis/tasks.crpy.io/v1/namespaces/{args.namespace}/tasks"
    headers = {"Accept": "application/json", **(await config.credentials.headers())}
    connector = aiohttp.TCPConnector(ssl=config.ssl_context, limit=1)
    objects = size = 0
    token = ""
    took: list[float] = []
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        while True:
            params = {"limit": str(args.page)}
            if token:
                params["continue"] = token
            asked = time.monotonic()
            async with session.get(url, params=params) as answer:
                answer.raise_for_status()
                body = await answer.read()
            took.append(time.monotonic() - asked)
            page = orjson.loads(body)
            objects += len(page["items"])
            size += len(body)
            token = page["metadata"].get("continue") or ""
            del page, body
            if not token or (args.seconds and time.monotonic() - started > args.seconds):
                break
    summary = {
        "objects": objects,
        "bytes": size,
        "pages": len(took),
        "page_seconds": page_seconds(took),
        "complete": not token,
    }
    print(orjson.dumps(summary).decode(), flush=True)
    return 0


def page_seconds(took: list[float]) -> dict[str, float]:
    """The first page's time (a consistent read may wait for the server's cache), the median
    and the slowest of the pages."""
    ordered = sorted(took)
    return {
        "first": took[0],
        "p50": ordered[len(ordered) // 2],
        "max": ordered[-1],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runners.listlimit", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="stop after the page that ends past this many seconds (default 0: list it all)",
    )
    args = parser.parse_args(argv)
    install_event_loop()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
