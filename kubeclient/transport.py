"""The HTTP transport to the API server: aiohttp, orjson, our own retries.

Two connection pools: one for ordinary requests (a total timeout per request, 100
connections), and one for watches (no total timeout: a watch lives as long as the server keeps
it; aiohttp is HTTP/1.1, so each open watch holds one connection of its own, and watches
must never starve ordinary requests of connections).

Retries follow client-go: an answer 429 with a ``Retry-After`` means the server did not
process the request, so any verb is retried after that many seconds; 5xx with
``Retry-After`` is retried for reads only (a write's outcome is unknown); a connection error
is retried (after 1 s) for reads only. At most ``max_retries`` (10) times. A 401 refreshes the
credentials once and retries.

A connection failure is anything that keeps a request from being sent or answered:
``aiohttp.ClientError``, a timeout, an ``OSError``, and a ``RuntimeError`` raised while the
session is open — the event loop's own failures surface that way (uvloop's "File descriptor N
is used by transport" while reconnecting during a storm of refused connections). All of them
become an :class:`ApiError` with status 0 (reason ``TransportError``) once retries are spent,
so callers handle one kind of failure.

Each wait is the server's ``Retry-After`` stretched by a random factor in [1, 2): never
shorter than asked, and clients pushed back together do not all come back in the same
millisecond (a real in-flight limit of 1 turned 40 synchronised retries into 40 new 429s).

A request may take ``before_send``, a check called right before *each* time the request is
sent: after the wait for a connection of the pool and the connection's set-up, after a
``Retry-After`` sleep, after a credential refresh, and when aiohttp sends again on a fresh
connection because a kept-alive one was closed under it. An exception it raises stops the
request there (nothing of that attempt is sent; earlier attempts were answered 429 or 401,
or never reached the server) and propagates unchanged, without retries. Fences use it
(:mod:`controller_runtime.fencing`): a process paused between two attempts sends no second
one once its lease is no longer provably held.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from kubeclient.config import ClusterConfig
from kubeclient.errors import ApiError, error_from_status, parse_retry_after

log = logging.getLogger(__name__)

USER_AGENT = "controller-runtime-py/0.1"
READ_METHODS = frozenset({"GET", "HEAD"})

RequestObserver = Callable[[str, int, float], None]
"""Called after every request with (method, HTTP status or 0 for a transport error, seconds)."""

RequestHook = Callable[[str, str, Mapping[str, str] | None, int], None]
"""Called after every request with (method, path, query parameters, HTTP status or 0 for a
transport error). A watch is reported as the ``GET`` it is (its parameters carry ``watch``),
so that a hook can tell what the API server authorised (e.g. RBAC verbs in tests)."""


BeforeSend = Callable[[], None]
"""A check called right before each time a request is sent; it raises to stop the request."""

# RuntimeError subclasses that never mean a connection failed.
_NOT_CONNECTION_FAILURES = (RecursionError, NotImplementedError)

_BEFORE_SEND: contextvars.ContextVar[BeforeSend | None] = contextvars.ContextVar(
    "kubeclient_before_send", default=None
)


class _RefusedError(Exception):
    """``before_send`` raised ``refusal`` once a connection was ready (carried through
    aiohttp, which would otherwise wrap an ``OSError``)."""

    def __init__(self, refusal: BaseException) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class _CheckedConnector(aiohttp.TCPConnector):
    """The request pool's connector: once a connection is ready for a request (after any
    wait for a free slot and the connection's set-up), and with nothing awaited between this
    and the request being written, it calls the request's ``before_send``."""

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> Any:
        connection = await super().connect(req, traces, timeout)
        check = _BEFORE_SEND.get()
        if check is not None:
            try:
                check()
            except BaseException as refusal:
                connection.release()  # nothing was written on it: back to the pool
                raise _RefusedError(refusal) from refusal
        return connection


@dataclass(frozen=True, slots=True)
class Response:
    """A complete answer: status, headers and the raw body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None


class _UnsentWatch:
    """One watch request counted in its transport until it is sent or fails (:meth:`done`,
    idempotent)."""

    __slots__ = ("_transport",)

    def __init__(self, transport: Transport) -> None:
        self._transport: Transport | None = transport
        if transport._unsent_watches == 0:
            # A new event for each batch: unset, and bound to whichever loop first waits on it.
            transport._watches_sent = asyncio.Event()
        transport._unsent_watches += 1

    def done(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport._unsent_watches -= 1
            if transport._unsent_watches == 0:
                transport._watches_sent.set()


async def _watch_headers_sent(
    session: aiohttp.ClientSession,
    context: Any,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    if isinstance(context.trace_request_ctx, _UnsentWatch):
        context.trace_request_ctx.done()


class Transport:
    """Requests and watch streams to one API server.

    Defaults: ``request_timeout`` 60 s (the server caps writes at 34 s itself),
    ``max_retries`` 10, ``max_connections`` 100 for requests. Call :meth:`close` when done
    (or use ``async with``).
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        request_timeout: float = 60.0,
        max_retries: int = 10,
        max_connections: int = 100,
        user_agent: str = USER_AGENT,
        observer: RequestObserver | None = None,
        on_request: RequestHook | None = None,
    ) -> None:
        self.config = config
        self.max_retries = max_retries
        self.observer = observer
        self.on_request = on_request
        self._request_timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=30)
        self._watch_timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None
        self._unsent_watches = 0
        self._watches_sent = asyncio.Event()  # replaced when a watch begins (_UnsentWatch)

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _sessions(self) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
        # Created lazily: a ClientSession binds to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=_CheckedConnector(
                    ssl=self.config.ssl_context, limit=self._max_connections
                ),
                timeout=self._request_timeout,
                headers=self._headers,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        if self._watch_session is None or self._watch_session.closed:
            sent = aiohttp.TraceConfig()
            sent.on_request_headers_sent.append(_watch_headers_sent)
            self._watch_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.config.ssl_context, limit=0),
                timeout=self._watch_timeout,
                headers=self._headers,
                trace_configs=[sent],
            )
        return self._session, self._watch_session

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None and not session.closed:
                await session.close()
        self._session = self._watch_session = None

    def url(self, path: str) -> str:
        return self.config.server + path

    async def watches_sent(self, timeout: float) -> bool:
        """Wait until every watch begun so far (:meth:`stream`) has its request written to the
        server or has failed, for at most ``timeout`` seconds; True if none is still unsent.
        Returns at once when none is. The manager starts its HTTP servers after this, so that
        the API server prepares the informers' first answers while their imports run."""
        if self._unsent_watches == 0:
            return True
        try:
            await asyncio.wait_for(self._watches_sent.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _observe(
        self,
        method: str,
        status: int,
        started: float,
        path: str,
        params: Mapping[str, str] | None,
    ) -> None:
        if self.observer is not None:
            self.observer(method, status, time.monotonic() - started)
        if self.on_request is not None:
            self.on_request("GET" if method == "WATCH" else method, path, params, status)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int | None = None,
        before_send: BeforeSend | None = None,
    ) -> Response:
        """Send a request; return the answer or raise the typed :class:`ApiError`.

        ``body`` may be bytes (sent as is) or anything orjson encodes. ``max_retries``
        overrides the transport's for this request (0: the caller retries itself).
        ``before_send`` is called right before each time the request is sent (see the
        module docs); what it raises propagates unchanged.
        """
        token = _BEFORE_SEND.set(before_send)  # read by the pool's connector
        try:
            return await self._request(
                method,
                path,
                params=params,
                body=body,
                content_type=content_type,
                timeout=timeout,
                headers=headers,
                max_retries=max_retries,
                before_send=before_send,
            )
        finally:
            _BEFORE_SEND.reset(token)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
        headers: Mapping[str, str] | None,
        max_retries: int | None,
        before_send: BeforeSend | None,
    ) -> Response:
        retries = self.max_retries if max_retries is None else max_retries
        session, _ = self._sessions()
        data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        refreshed = False
        attempt = 0
        while True:
            if before_send is not None:
                before_send()  # before asking for credentials and a connection at all
            request_headers = {**(await self.config.credentials.headers()), **(headers or {})}
            if data is not None:
                request_headers["Content-Type"] = content_type
            started = time.monotonic()
            try:
                async with session.request(
                    method,
                    self.url(path),
                    params=params,
                    data=data,
                    headers=request_headers,
                    server_hostname=self.config.tls_server_name,
                    # Always explicit: aiohttp reads timeout=None as "no timeout at all".
                    timeout=(
                        aiohttp.ClientTimeout(total=timeout, sock_connect=30)
                        if timeout is not None
                        else self._request_timeout
                    ),
                ) as answer:
                    payload = await answer.read()
                    status = answer.status
                    answer_headers = answer.headers
            except _RefusedError as refused:
                raise refused.refusal from None
            except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as err:
                if isinstance(err, RuntimeError) and (
                    session.closed or isinstance(err, _NOT_CONNECTION_FAILURES)
                ):
                    raise  # "Session is closed" (used after close()) or a bug: not the network
                self._observe(method, 0, started, path, params)
                if method in READ_METHODS and attempt < retries:
                    attempt += 1
                    log.debug(
                        "retrying %s %s after a transport error: %s: %s",
                        method,
                        path,
                        type(err).__name__,
                        err,
                    )
                    await asyncio.sleep(1.0)
                    continue
                raise ApiError(
                    0,
                    "TransportError",
                    f"{type(err).__name__}: {err}" if str(err) else type(err).__name__,
                    method=method,
                    path=path,
                ) from err
            self._observe(method, status, started, path, params)
            if status < 400:
                return Response(status, answer_headers, payload)
            if status == 401 and not refreshed:
                refreshed = True
                if await self.config.credentials.refresh():
                    continue
            retry_after = parse_retry_after(answer_headers.get("Retry-After"))
            retriable = status == 429 or (status >= 500 and method in READ_METHODS)
            if retry_after is not None and retriable and attempt < retries:
                attempt += 1
                delay = retry_after * (1.0 + random.random())
                log.debug("%s %s answered %d; retrying in %.1fs", method, path, status, delay)
                await asyncio.sleep(delay)
                continue
            raise error_from_status(
                status,
                payload,
                retry_after_header=answer_headers.get("Retry-After"),
                method=method,
                path=path,
            )

    async def get_json(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        max_retries: int | None = None,
    ) -> Any:
        return (await self.request("GET", path, params=params, max_retries=max_retries)).json()

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open a streaming GET (a watch) on the watch pool.

        Yields the response once the server answered 200; iterate
        ``response.content.iter_any()`` for the raw chunks. A non-200 answer raises the typed
        :class:`ApiError` (with ``retry_after``) instead; there is no retry here, because the
        reflector decides what to do next.

        Any failure to connect is an ``ApiError`` with status 0 (``TransportError``): not only
        ``aiohttp.ClientError`` and timeouts but also a bare ``OSError`` and a ``RuntimeError``
        raised while connecting (uvloop's ``File descriptor N is used by transport``,
        MagicStack/uvloop#653), so a caller never mistakes a refused connection for a bug.
        ``RecursionError``, ``NotImplementedError`` and "Session is closed" are re-raised as
        they are: bugs, not the network (as in :meth:`request`).
        """
        _, session = self._sessions()
        for attempt in range(2):
            request_headers = {**(await self.config.credentials.headers()), **(headers or {})}
            started = time.monotonic()
            unsent = _UnsentWatch(self)
            try:
                response = await session.get(
                    self.url(path),
                    params=params,
                    headers=request_headers,
                    server_hostname=self.config.tls_server_name,
                    trace_request_ctx=unsent,
                )
            except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as err:
                if isinstance(err, RuntimeError) and (
                    session.closed or isinstance(err, _NOT_CONNECTION_FAILURES)
                ):
                    raise  # "Session is closed" (used after close()) or a bug: not the network
                self._observe("WATCH", 0, started, path, params)
                raise ApiError(
                    0, "TransportError", str(err) or type(err).__name__, method="WATCH", path=path
                ) from err
            finally:
                unsent.done()  # sent and answered, or failed (cancelled, too) before it was
            self._observe("WATCH", response.status, started, path, params)
            try:
                if response.status == 200:
                    yield response
                    return
                payload = await response.read()
                if (
                    response.status == 401
                    and attempt == 0
                    and await self.config.credentials.refresh()
                ):
                    continue
                raise error_from_status(
                    response.status,
                    payload,
                    retry_after_header=response.headers.get("Retry-After"),
                    method="WATCH",
                    path=path,
                )
            finally:
                response.release()
                response.close()
