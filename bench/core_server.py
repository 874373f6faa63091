"""The recorded list+watch stream of the core scenario, served over loopback HTTP.

    python -m bench.core_server --body FILE [--port 0]

It prints the port it bound on 127.0.0.1 as its first line, then serves until it is stopped.
Both informers of the core scenario, ours (:mod:`bench.core`) and client-go's
(``bench/peers/go/core``), read the same bytes from it, the way they read an API server:

- ``GET /apis/tasks.crpy.io/v1/tasks`` (a LIST, any page size): an empty ``TaskList`` at
  resourceVersion ``LIST_RV``.
- the same with ``watch=true`` (or ``1``) from ``LIST_RV``: the body file (one watch event per
  line, the N recorded objects as ADDED), as a chunked HTTP/1.1 response; then the stream
  stays open and quiet until the watch's ``timeoutSeconds``, as an idle watch would.
- a watch with ``sendInitialEvents=true`` (a streaming list): the body, then the
  ``k8s.io/initial-events-end`` bookmark at the last object's resourceVersion, then quiet.
- a watch from any other resourceVersion: quiet until ``timeoutSeconds``.

Nothing is decoded here: the file is read in 1 MiB pieces and written as it is, so the server
costs little CPU beside the client under test.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import orjson
from aiohttp import web

LIST_RV = "999"
PATH = "/apis/tasks.crpy.io/v1/tasks"
PIECE = 1 << 20


def _last_resource_version(body: Path) -> str:
    with body.open("rb") as f:
        f.seek(max(0, body.stat().st_size - 64 * 1024))
        last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    return str(orjson.loads(last)["object"]["metadata"]["resourceVersion"])


def application(body: Path) -> web.Application:
    last_rv = _last_resource_version(body)
    bookmark = orjson.dumps(
        {
            "type": "BOOKMARK",
            "object": {
                "kind": "Task",
                "apiVersion": "tasks.crpy.io/v1",
                "metadata": {
                    "resourceVersion": last_rv,
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }
    )

    async def tasks(request: web.Request) -> web.StreamResponse:
        query = request.query
        if query.get("watch") not in ("true", "1"):
            listed = {
                "kind": "TaskList",
                "apiVersion": "tasks.crpy.io/v1",
                "metadata": {"resourceVersion": LIST_RV},
                "items": [],
            }
            return web.Response(body=orjson.dumps(listed), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        streaming = query.get("sendInitialEvents") == "true"
        try:
            if streaming or query.get("resourceVersion") == LIST_RV:
                with body.open("rb") as f:
                    while piece := f.read(PIECE):
                        await response.write(piece)
                if streaming:
                    await response.write(bookmark + b"\n")
            await asyncio.sleep(float(query.get("timeoutSeconds", "600")))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client under test went away once it had what it measures: not an error
        return response

    app = web.Application()
    app.router.add_get(PATH, tasks)
    return app


async def serve(body: Path, port: int) -> None:
    runner = web.AppRunner(application(body), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sockets = runner.addresses
    print(sockets[0][1], flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.core_server", description=__doc__)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.body, args.port))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
