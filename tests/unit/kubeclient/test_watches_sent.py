"""Transport.watches_sent: a watch counts as unsent until its request is written, and a watch
that fails or is cancelled before that stops counting. Loopback servers stand in for the
network's two cases: one that takes the request and holds the answer, one that accepts the
connection and never speaks TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from kubeclient.config import ClusterConfig
from kubeclient.errors import ApiError
from kubeclient.transport import Transport


@contextlib.asynccontextmanager
async def holding_server() -> AsyncIterator[tuple[str, asyncio.Event, asyncio.Event]]:
    """An HTTP server whose watch handler records the request, then answers only when
    released. Yields (URL, request received, release)."""
    received, release = asyncio.Event(), asyncio.Event()

    async def watch(request: web.Request) -> web.StreamResponse:
        received.set()
        await release.wait()
        return web.json_response({"kind": "Status"})

    app = web.Application()
    app.router.add_get("/watch", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", received, release
    finally:
        release.set()
        await runner.cleanup()


async def open_watch(transport: Transport, opened: asyncio.Event) -> None:
    async with transport.stream("/watch"):
        opened.set()


async def test_no_watch_means_nothing_to_wait_for() -> None:
    async with Transport(ClusterConfig("http://127.0.0.1:9", ssl.create_default_context())) as t:
        assert await t.watches_sent(0)


async def test_a_watch_counts_as_sent_once_written_not_once_answered() -> None:
    async with holding_server() as (url, received, release):
        transport = Transport(ClusterConfig(url, ssl.create_default_context()))
        opened = asyncio.Event()
        watching = asyncio.create_task(open_watch(transport, opened))
        try:
            await asyncio.sleep(0)  # the watch's first step: it is counted
            assert transport._unsent_watches == 1
            assert await transport.watches_sent(10)
            assert not opened.is_set()  # sent, and not answered: the server holds the answer
            await asyncio.wait_for(received.wait(), 10)  # the server has the request
            release.set()
            await asyncio.wait_for(watching, 10)
            assert transport._unsent_watches == 0
        finally:
            watching.cancel()
            await transport.close()


async def test_a_watch_stuck_before_its_request_is_written_times_out_then_stops_counting() -> None:
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # the TLS handshake never gets its answer
        accepted.set()

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    transport = Transport(ClusterConfig(f"https://127.0.0.1:{port}", ssl.create_default_context()))
    watching = asyncio.create_task(open_watch(transport, asyncio.Event()))
    try:
        await asyncio.wait_for(accepted.wait(), 10)
        assert not await transport.watches_sent(0.05)
        assert transport._unsent_watches == 1
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
        assert transport._unsent_watches == 0
        assert await transport.watches_sent(0)
    finally:
        for writer in held:
            writer.close()
        silent.close()
        await transport.close()


async def test_a_refused_watch_stops_counting() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens there now: the connection is refused
    transport = Transport(ClusterConfig(f"http://127.0.0.1:{port}", ssl.create_default_context()))
    try:
        with pytest.raises(ApiError) as refused:
            await open_watch(transport, asyncio.Event())
        assert refused.value.status == 0  # a transport error, not an answer
        assert transport._unsent_watches == 0
        assert await transport.watches_sent(0)
    finally:
        await transport.close()
