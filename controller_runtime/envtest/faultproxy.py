"""A fault-injecting TCP proxy for tests: sits between a client and the real API server on
loopback and cuts, freezes or refuses connections on command.

TLS passes through untouched (the proxy sees only ciphertext), so the client still verifies
the real server's certificate; the serving certificate is valid for 127.0.0.1.

With ``tls=(server_context, upstream_context)`` the proxy terminates TLS instead: it serves
with ``server_context`` (a certificate the client trusts) and connects upstream with
``upstream_context`` (whose client certificate is then the identity every request has). It
then sees HTTP/1.1 in the clear: :meth:`FaultProxy.inject_line` can put any bytes on every
open chunked response (a watch) as one more line, and :attr:`FaultProxy.watch_latency` delays
the responses to watch requests only (a lagging cache whose live reads are current).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    downstream_bytes: int = 0
    budget: int | None = None  # server->client bytes still allowed before a cut
    delayed: asyncio.Queue[tuple[float, bytes]] | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    http: _ChunkTracker | None = None  # with TLS terminated: where the response stream is
    requests: _RequestTracker | None = None  # with TLS terminated: the request being answered

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()


class _ChunkTracker:
    """Follows server-to-client HTTP/1.1 responses just enough to know when the stream sits
    between two chunks of a chunked body: the one place a line can be added unnoticed."""

    def __init__(self) -> None:
        self._buffer = b""
        self._state = "headers"  # headers | size | data | trailer | body
        self._left = 0  # bytes of chunk data (+ CRLF) or of a Content-Length body still due
        self._chunked = False  # the headers being read announced a chunked body

    @property
    def at_boundary(self) -> bool:
        return self._state == "size" and not self._buffer

    def feed(self, data: bytes) -> list[int]:
        """Advance over ``data``; return the offsets in it that are chunk boundaries."""
        boundaries: list[int] = []
        i = 0
        while i < len(data):
            if self._state in ("headers", "size", "trailer"):
                end = data.find(b"\n", i)
                if end < 0:
                    self._buffer += data[i:]
                    break
                line, self._buffer = self._buffer + data[i : end + 1], b""
                i = end + 1
                self._line(line)
                if self._state == "size" and not self._buffer:
                    boundaries.append(i)
            else:
                take = min(self._left, len(data) - i)
                self._left -= take
                i += take
                if self._left == 0:
                    self._state = "size" if self._state == "data" else "headers"
                    if self._state == "size":
                        boundaries.append(i)
        return boundaries

    def _line(self, line: bytes) -> None:
        if self._state == "headers":
            if line.strip():
                name, _, value = line.decode("latin-1").partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "transfer-encoding" and "chunked" in value:
                    self._chunked = True
                elif name == "content-length":
                    self._left = int(value)
            elif self._chunked:
                self._chunked = False
                self._state = "size"
            else:
                self._state = "body" if self._left else "headers"
        elif self._state == "size":
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self._state = "trailer"
            else:
                self._state, self._left = "data", size + 2
        elif not line.strip():  # the empty line that ends the trailer
            self._state = "headers"


class _RequestTracker(_ChunkTracker):
    """Follows client-to-server HTTP/1.1 requests (framed like responses: headers, then a
    ``Content-Length`` or chunked body) and keeps the target of the latest request line."""

    def __init__(self) -> None:
        super().__init__()
        self.target = b""
        self._request_line = True

    @property
    def watching(self) -> bool:
        """Whether the latest request is a watch (``watch=1`` or ``watch=true``): without
        pipelining, the response now flowing back is its answer."""
        query = self.target.partition(b"?")[2]
        return any(p in (b"watch=1", b"watch=true") for p in query.split(b"&"))

    def _line(self, line: bytes) -> None:
        if self._state == "headers" and self._request_line and line.strip():
            parts = line.split(b" ")
            self.target = parts[1] if len(parts) == 3 else b""
            self._request_line = False
            return
        if self._state == "headers" and not line.strip():
            self._request_line = True
        super()._line(line)


def _chunk(line: bytes) -> bytes:
    payload = line + b"\n"
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


class FaultProxy:
    """Forward 127.0.0.1:<port> to ``target_host:target_port``.

    Faults: :meth:`cut_all` (abort every open connection now), :meth:`cut_after` (let each
    open connection pass ``n`` more server-to-client bytes, then abort it: a cut mid-stream),
    :meth:`freeze`/:meth:`thaw` (stop moving bytes, as a half-open connection would),
    :meth:`hold_answers`/:meth:`release_answers` (stop moving server-to-client bytes only:
    requests reach the server and take effect, their answers wait),
    :attr:`refuse` (close new connections at once), and :attr:`latency` (seconds added to
    every server-to-client byte, in order: a lagging informer). With TLS terminated (see the
    module docstring), :meth:`inject_line` adds a line to every open chunked response, and
    :attr:`watch_latency` adds seconds to the server-to-client bytes of watch responses only
    (on top of ``latency``): a client whose caches lag while its other requests are answered
    at once. Bytes already on their way keep their order.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.tls = tls
        self.injected = 0
        self.refuse = False
        self.latency = 0.0
        self.watch_latency = 0.0
        self.connections_accepted = 0
        self.cuts = 0
        self.bytes_to_client = 0
        """Bytes passed from the server to clients, over every connection so far."""
        self._links: set[_Link] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._answering = asyncio.Event()
        self._answering.set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> FaultProxy:
        server_ssl = self.tls[0] if self.tls is not None else None
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=server_ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.cut_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut_all(self) -> None:
        for link in list(self._links):
            link.abort()
            self.cuts += 1

    def cut_after(self, nbytes: int) -> None:
        for link in self._links:
            link.budget = nbytes

    def inject_line(self, line: bytes) -> int:
        """Send ``line`` (plus a newline) as one more chunk on every response stream that sits
        between two chunks now (open watches). Needs ``tls``; returns how many streams got it.
        Only for idle streams: latency or a frozen proxy would reorder it."""
        if self.tls is None:
            raise RuntimeError("inject_line needs a FaultProxy with tls=(server, upstream)")
        sent = 0
        for link in self._links:
            if link.http is not None and link.http.at_boundary:
                link.client.write(_chunk(line))
                sent += 1
        self.injected += sent
        return sent

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def hold_answers(self) -> None:
        self._answering.clear()

    def release_answers(self) -> None:
        self._answering.set()

    def _latency_of(self, link: _Link) -> float:
        watching = link.requests is not None and link.requests.watching
        return self.latency + (self.watch_latency if watching else 0.0)

    async def _delayed(
        self, link: _Link, writer: asyncio.StreamWriter, data: bytes, latency: float
    ) -> None:
        """Deliver ``data`` ``latency`` seconds after it arrived, keeping the order (never
        before what was queued earlier), without holding up the reading of what comes next."""
        loop = asyncio.get_running_loop()
        if link.delayed is None:
            link.delayed = asyncio.Queue()
            link.tasks.append(asyncio.create_task(self._deliver(link, writer)))
        link.delayed.put_nowait((loop.time() + latency, data))

    async def _deliver(self, link: _Link, writer: asyncio.StreamWriter) -> None:
        assert link.delayed is not None
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await link.delayed.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            link.abort()

    @property
    def open_connections(self) -> int:
        return len(self._links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.target_host,
                self.target_port,
                ssl=self.tls[1] if self.tls is not None else None,
            )
        except OSError:
            writer.transport.abort()
            return
        terminated = self.tls is not None
        link = _Link(
            writer,
            up_writer,
            http=_ChunkTracker() if terminated else None,
            requests=_RequestTracker() if terminated else None,
        )
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link, downstream=False)),
            asyncio.create_task(self._pump(up_reader, writer, link, downstream=True)),
        ]
        try:
            await asyncio.gather(*link.tasks[:2], return_exceptions=True)
        finally:
            self._links.discard(link)
            link.abort()
            for task in link.tasks[2:]:  # a delayed-delivery task, if latency was on
                task.cancel()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        downstream: bool,
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                # Frozen: nothing moves, not even the end of a stream (a half-open connection).
                await self._flowing.wait()
                if downstream:
                    await self._answering.wait()
                if not data:
                    break
                if downstream and link.budget is not None:
                    if len(data) >= link.budget:
                        writer.write(data[: link.budget])
                        with contextlib.suppress(ConnectionError):
                            await writer.drain()
                        self.cuts += 1
                        link.abort()
                        return
                    link.budget -= len(data)
                if not downstream and link.requests is not None:
                    link.requests.feed(data)
                if downstream:
                    link.downstream_bytes += len(data)
                    self.bytes_to_client += len(data)
                    if link.http is not None:
                        link.http.feed(data)
                    latency = self._latency_of(link)
                    if latency > 0 or link.delayed is not None:
                        await self._delayed(link, writer, data, latency)
                        continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.abort()
