"""The webhook server: HTTPS, serving admission and conversion reviews to the API server.

The manager runs it on every replica, leader or not (the API server calls whichever Pod its
Service picks), from before the caches sync until after the controllers stopped. Standalone
(tests, a process without a manager): ``await server.start()`` and ``await server.stop()``.

On the wire (what each case answers; a handler never crashes the server, nor the manager):

=================================================  =============================================
the request                                        the answer
=================================================  =============================================
a review the handler answered                      200, the review (allowed or denied)
not ``application/json``, not JSON, not a review   400 with what is wrong
body over ``max_request_bytes`` (7 MiB)            413
a path nothing is registered at                    404
the handler raised (not :class:`Denied`)           500 with the exception's type and message
the handler ran over its time (below)              500 saying so (not 504: the API server
                                                   reports a 504 as its own timeout and
                                                   drops the reason)
=================================================  =============================================

A handler's time is ``handler_timeout`` (9 s), and never more than the API server waits:
the API server sends the time it allows (its ``timeoutSeconds``, rounded up to a second) as
the ``timeout`` query parameter, and the handler gets that less a margin (1 s, or half of
it when it is under 2 s). So the API server receives the 500 and its reason, not a timeout
of its own, whatever the configuration's ``timeoutSeconds``.

A 500 is a failed call to the API server, so the webhook configuration's
``failurePolicy`` decides (``Fail`` refuses the request with the body's reason, ``Ignore``
admits it); a denial is not a failure and refuses whatever the policy.

Metrics (controller-runtime's names, ``webhook`` = the path):
``controller_runtime_webhook_latency_seconds``, ``controller_runtime_webhook_requests_total``
(with ``code``) and ``controller_runtime_webhook_requests_in_flight``.

Stopping (SIGTERM), in this order:

1. :meth:`WebhookServer.begin_shutdown` (the manager calls it when the stop is requested):
   readiness turns false, and every answer from now on says ``Connection: close``, so the
   API server opens its next connection anew, through the Service, to a replica still in it.
2. For ``shutdown_delay`` seconds from then (0 by default; at most the drain timeout) the
   listener stays open and reviews are answered as usual: the Service's endpoints and each
   node's forwarding rules (kube-proxy) drop a terminating Pod a second or two after it
   began terminating, and until they do, new connections still arrive here. A Pod that
   closed its port at once would have them refused, and the API server does not retry a
   webhook call (a refused ``failurePolicy: Fail`` call refuses the request).
3. The listener closes and the keep-alive connections between two requests are closed at
   once (aiohttp's own shutdown would keep them open up to a second and drop a request that
   arrived meanwhile); reviews in flight finish for up to the drain timeout the manager gives
   (its ``graceful_shutdown_timeout``); then whatever is left is closed.

A handler that reads the manager's cache must hold the kinds it reads itself
(``cache.watch(..., holder=...)``): the manager stops the controllers before this server,
and a controller releases the kinds it cached when it stops, so during the delay a review
would find them gone (:class:`~controller_runtime.cache.NotCachedError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from aiohttp import web

from controller_runtime.metrics import WEBHOOK_IN_FLIGHT, WEBHOOK_LATENCY, WEBHOOK_REQUESTS
from controller_runtime.webhook.admission import (
    AdmissionRequest,
    AdmissionResult,
    MalformedReviewError,
    parse_admission_review,
    review_response,
)
from controller_runtime.webhook.conversion import (
    Converter,
    convert_review,
    parse_conversion_review,
)
from controller_runtime.webhook.tls import (
    DEFAULT_CERT_DIR,
    CertDirWatcher,
    ServingTLS,
)

__all__ = [
    "CONVERT_PATH",
    "DEFAULT_PORT",
    "MAX_REQUEST_BYTES",
    "AdmissionHandler",
    "WebhookServer",
    "default_paths",
    "handler_time",
    "parse_go_duration",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 9443
CONVERT_PATH = "/convert"
MAX_REQUEST_BYTES = 7 * 1024 * 1024
"""controller-runtime's limit: two objects of etcd's 1.5 MiB, with room for the review."""
_GO_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?)(ns|us|µs|ms|s|m|h)")

AdmissionHandler = Callable[[AdmissionRequest], Awaitable[AdmissionResult]]
"""What the server calls for one admission request (the builder wraps defaulters and
validators into one)."""

_Answer = tuple[int, bytes, str]  # status, body, content type


class WebhookServer:
    """An HTTPS server for admission and conversion webhooks.

    Defaults are controller-runtime's: ``port`` 9443 (0 picks a free one, see :attr:`url`),
    ``host`` ``"0.0.0.0"`` (every interface: the API server must reach it), the serving pair
    ``cert_dir/tls.crt`` and ``cert_dir/tls.key`` with ``cert_dir``
    ``$TMPDIR/k8s-webhook-server/serving-certs``, re-read every ``cert_poll_interval`` (10 s)
    and hot-reloaded; ``cert_dir=None`` when the pair comes from elsewhere
    (:meth:`ServingTLS.load`, e.g. the self-managed certificates). ``client_ca_name`` (a file
    in ``cert_dir``) makes the server require client certificates signed by that CA.

    ``handler_timeout`` (9 s: under the API server's default ``timeoutSeconds`` of 10 s, so
    that the API server gets the 500 and its reason rather than timing out itself; a request's
    own ``timeout`` parameter shortens it, see the module docstring) bounds each handler;
    ``max_request_bytes`` (7 MiB) each body. ``shutdown_delay`` (0 s): how long the listener
    stays open after the stop is requested (module docstring, "Stopping"); a Pod behind a
    Service wants a few seconds.

    Readiness (:meth:`ready`, the manager's ``webhook-server`` readyz check): true once a TLS
    handshake with the server itself succeeds with a certificate that the API server would
    accept, and that is valid for ``service_hostname`` when it is set
    (``<service>.<namespace>.svc``, the name the API server checks; without it the name is
    not checked). What the API server accepts is, in order of precedence:
    :attr:`injected_bundles`, the ``caBundle`` values read back from the webhook configurations
    and CRDs (:class:`~controller_runtime.webhook.trust.InjectedCABundles`; the self-managed
    certificates install it), every one of which must trust the certificate; else
    :attr:`trust_bundle` (``cert_dir/ca.crt`` when it exists, cert-manager's layout); else
    the system's roots (what the API server uses for an empty ``caBundle``), so a
    self-signed certificate without its CA is never ready.
    """

    need_leader_election = False

    def __init__(
        self,
        *,
        port: int = DEFAULT_PORT,
        host: str = "0.0.0.0",
        cert_dir: str | Path | None = DEFAULT_CERT_DIR,
        cert_name: str = "tls.crt",
        key_name: str = "tls.key",
        client_ca_name: str | None = None,
        cert_poll_interval: float = 10.0,
        handler_timeout: float = 9.0,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        service_hostname: str | None = None,
        shutdown_delay: float = 0.0,
    ) -> None:
        if handler_timeout <= 0:
            raise ValueError(f"handler_timeout must be > 0, got {handler_timeout}")
        if shutdown_delay < 0:
            raise ValueError(f"shutdown_delay must be >= 0, got {shutdown_delay}")
        self.shutdown_delay = shutdown_delay
        self.port = port
        self.host = host
        self.cert_dir = Path(cert_dir) if cert_dir is not None else None
        self.handler_timeout = handler_timeout
        self.max_request_bytes = max_request_bytes
        self.service_hostname = service_hostname
        client_ca = None
        if client_ca_name is not None:
            if self.cert_dir is None:
                raise ValueError("client_ca_name names a file in cert_dir; set cert_dir")
            client_ca = (self.cert_dir / client_ca_name).read_bytes()
        self.tls = ServingTLS(client_ca_pem=client_ca)
        self._watcher = (
            CertDirWatcher(
                self.tls,
                self.cert_dir,
                cert_name=cert_name,
                key_name=key_name,
                interval=cert_poll_interval,
                on_ca=self._trust_ca_file,
            )
            if self.cert_dir is not None
            else None
        )
        self.trust_bundle: bytes | None = None
        """The CA bundle readiness verifies the served certificate against when
        :attr:`injected_bundles` is ``None`` (``None``: the system's roots)."""
        self.injected_bundles: list[bytes] | None = None
        """The ``caBundle`` values the API server uses for this server, read back from the
        webhook configurations and CRDs (``b""``: an empty one, i.e. the system's roots);
        readiness needs each to trust the certificate. ``None``: not known, use
        :attr:`trust_bundle`; ``[]``: not read yet, not ready."""
        self._shutdown_began: float | None = None
        self._admission: dict[str, AdmissionHandler] = {}
        self._converters: dict[tuple[str, str], Converter] = {}
        self._runner: web.AppRunner | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._listener: asyncio.Server | None = None
        self.url: str | None = None
        """``https://host:port`` once started (the port actually bound)."""

    def __repr__(self) -> str:
        return f"WebhookServer({self.host}:{self.port})"

    def _trust_ca_file(self, ca_pem: bytes | None) -> None:
        self.trust_bundle = ca_pem

    def use_external_certificates(self) -> None:
        """Stop watching ``cert_dir``: the serving pair comes from :attr:`tls`'s ``load``
        (the self-managed certificates call this). Before :meth:`start` only."""
        if self._runner is not None:
            raise RuntimeError("choose where certificates come from before the server starts")
        self._watcher = None
        self.cert_dir = None

    # -- registration -------------------------------------------------------------------

    @property
    def paths(self) -> list[str]:
        """Every path served."""
        return [*self._admission, *([CONVERT_PATH] if self._converters else [])]

    def register(self, path: str, handler: AdmissionHandler) -> None:
        """Serve admission reviews at ``path`` with ``handler``. A path is registered once."""
        if not path.startswith("/"):
            raise ValueError(f"a webhook path starts with /, got {path!r}")
        if path in self._admission or path == CONVERT_PATH:
            raise ValueError(f"{path} is already registered")
        self._admission[path] = handler
        self._add_route(path)

    def register_converter(self, group: str, kind: str, converter: Converter) -> None:
        """Convert ``kind`` of ``group`` at ``/convert`` with ``converter``."""
        if (group, kind) in self._converters:
            raise ValueError(f"a converter for {kind}.{group} is already registered")
        first = not self._converters
        self._converters[(group, kind)] = converter
        if first:
            self._add_route(CONVERT_PATH)

    def _add_route(self, path: str) -> None:
        if self._runner is not None:
            raise RuntimeError("register webhooks before the server starts")
        # Series exist from registration on, at 0 (rates and alerts work before traffic).
        WEBHOOK_IN_FLIGHT.labels(path).set(0)
        WEBHOOK_LATENCY.labels(path)

    # -- serving ------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (a failure to bind raises ``OSError``), and start watching the certificate
        directory. Returns once listening; serving needs a certificate (until one is
        loaded, handshakes fail and :meth:`ready` is false)."""
        if self._runner is not None:
            return
        if self._watcher is not None:
            self._watcher.start()  # reads the pair and ca.crt (trust_bundle) at once
        app = web.Application(client_max_size=self.max_request_bytes)
        app.router.add_post("/{path:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runner = runner
        assert runner.server is not None
        loop = asyncio.get_running_loop()
        try:
            self._listener = await loop.create_server(
                runner.server,
                self.host,
                self.port,
                ssl=self.tls.listener_context,
                reuse_address=True,
            )
        except BaseException:
            await self._close_runner(0)
            raise
        host, port = self._listener.sockets[0].getsockname()[:2]
        self.port = port
        self.url = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
        log.info("webhook server listening on %s, paths %s", self.url, ", ".join(self.paths))

    def begin_shutdown(self) -> None:
        """Stop being ready and ask every client to reconnect (``Connection: close`` on each
        answer), but keep serving: the first step of stopping (module docstring). The
        manager calls it when its stop is requested; :meth:`stop` calls it if nobody did."""
        if self._shutdown_began is None:
            self._shutdown_began = time.monotonic()
            if self._listener is not None:
                log.info(
                    "webhook server: shutting down; serving for %.1fs more", self.shutdown_delay
                )

    @property
    def shutting_down(self) -> bool:
        return self._shutdown_began is not None

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Keep serving until ``shutdown_delay`` has passed since :meth:`begin_shutdown`
        (never longer than ``drain_timeout``), close the listener, let reviews in flight
        finish for up to ``drain_timeout`` seconds (``None``: 60 s), close the connections.
        Safe to call twice."""
        self.begin_shutdown()
        assert self._shutdown_began is not None
        drain = 60.0 if drain_timeout is None else drain_timeout
        linger = self._shutdown_began + min(self.shutdown_delay, drain) - time.monotonic()
        if self._listener is not None and linger > 0:
            await asyncio.sleep(linger)
        if self._listener is not None:
            self._listener.close()
        if self._watcher is not None:
            await self._watcher.stop()
        self._close_idle_connections()
        # Our own count of reviews in flight: aiohttp's shutdown would wait out its whole
        # timeout on idle keep-alive connections (the API server keeps them open).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain):
                await self._idle.wait()
        self._close_idle_connections()
        await self._close_runner(1.0)  # responses being written; anything left
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.wait_closed()
            self._listener = None

    def _close_idle_connections(self) -> None:
        """Close every keep-alive connection that is between two requests, at once.

        aiohttp's own shutdown leaves an idle connection open for up to its timeout and
        drops a request that arrives on it meanwhile (the client, which wrote it, reads an
        EOF, and the API server does not retry a webhook call): closing it at once leaves
        only the moment a request is on the wire as the FIN goes out."""
        runner = self._runner
        if runner is None or runner.server is None:
            return
        for connection in list(runner.server.connections):
            # Whether a connection is between requests is private to aiohttp: when these
            # names change, none counts as idle and the runner's shutdown closes them.
            busy = getattr(connection, "_request_in_progress", True)
            queued = getattr(connection, "_messages", True)
            if busy is False and not queued:
                connection.force_close()

    async def _close_runner(self, timeout: float) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if runner.server is not None:
            await runner.server.shutdown(timeout)
        await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        is_convert = path == CONVERT_PATH and bool(self._converters)
        handler = self._admission.get(path)
        if handler is None and not is_convert:
            return web.Response(status=404, text=f"no webhook is registered at {path}\n")
        in_flight = WEBHOOK_IN_FLIGHT.labels(path)
        in_flight.inc()
        self._in_flight += 1
        self._idle.clear()
        started = time.perf_counter()
        try:
            status, body, content_type = await self._answer(request, path, handler)
        finally:
            in_flight.dec()
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        WEBHOOK_LATENCY.labels(path).observe(time.perf_counter() - started)
        WEBHOOK_REQUESTS.labels(path, str(status)).inc()
        response = web.Response(status=status, body=body, content_type=content_type)
        if self._shutdown_began is not None:
            response.force_close()  # the client's next request opens a new connection
        return response

    async def _answer(
        self, request: web.Request, path: str, handler: AdmissionHandler | None
    ) -> _Answer:
        if request.content_type != "application/json":
            return _text(400, f"Content-Type must be application/json, got {request.content_type}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _text(413, f"the request body is larger than {self.max_request_bytes} bytes")
        timeout = handler_time(self.handler_timeout, request.query.get("timeout"))
        return await self._review(path, handler, body, timeout)

    async def _review(
        self, path: str, handler: AdmissionHandler | None, body: bytes, timeout: float
    ) -> _Answer:
        try:
            async with asyncio.timeout(timeout):
                if handler is None:
                    review = parse_conversion_review(body)
                    answer = convert_review(review, self._converters)
                else:
                    admission = parse_admission_review(body)
                    answer = review_response(admission.uid, await handler(admission))
        except MalformedReviewError as err:
            return _text(400, f"malformed review: {err}")
        except TimeoutError:
            log.warning("webhook %s: the handler ran over %.1fs", path, timeout)
            return _text(500, f"the webhook handler at {path} ran over {round(timeout, 3)}s")
        except Exception as err:
            log.error("webhook %s: the handler raised %s", path, type(err).__name__, exc_info=err)
            reason = f"{type(err).__name__}: {err}"
            return _text(500, f"the webhook handler at {path} failed: {reason}")
        return 200, answer, "application/json"

    # -- readiness ----------------------------------------------------------------------

    async def ready(self, timeout: float = 2.0) -> bool:
        """True when a TLS handshake with this server succeeds with a certificate the API
        server would accept (see the class docstring: every injected ``caBundle``, else
        :attr:`trust_bundle`, else the system's roots) and, when ``service_hostname`` is
        set, valid for that name. False once :meth:`begin_shutdown` was called. Never
        raises."""
        if self._listener is None or self.tls.pair is None or self._shutdown_began is not None:
            return False
        if self.injected_bundles is not None:
            bundles = list(dict.fromkeys(self.injected_bundles))
            if not bundles:
                return False  # the targets were not read yet
        else:
            bundles = [self.trust_bundle or b""]
        for bundle in bundles:
            if not await self._handshake(bundle, timeout):
                return False
        return True

    async def _handshake(self, bundle: bytes, timeout: float) -> bool:
        """A TLS handshake with this server, verified against ``bundle`` (``b""``: the
        system's roots)."""
        context = ssl.create_default_context()
        if bundle:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # this bundle and nothing else
            try:
                context.load_verify_locations(cadata=bundle.decode())
            except (ssl.SSLError, ValueError, UnicodeDecodeError):
                return False
        context.check_hostname = self.service_hostname is not None
        host = _loopback_for(self.host)
        try:
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(
                    host,
                    self.port,
                    ssl=context,
                    server_hostname=self.service_hostname or host,
                )
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        except (OSError, TimeoutError, ssl.SSLError):
            return False
        return True


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go duration (``5s``, ``1m30s``, ``500ms``, ``1h0m0s``); ``None`` for
    anything else."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = _GO_DURATION.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * units[unit] for number, unit in parts)


def handler_time(handler_timeout: float, requested: str | None) -> float:
    """How long a handler may run: ``handler_timeout``, and at most the time the API server
    allows (the request's ``timeout`` parameter) less a margin of 1 s (half of it under
    2 s), so that the answer reaches the API server before it gives up."""
    allowed = parse_go_duration(requested) if requested else None
    if allowed is None or allowed <= 0:
        return handler_timeout
    return min(handler_timeout, max(allowed - 1.0, allowed / 2))


def _text(status: int, message: str) -> _Answer:
    return status, (message + "\n").encode(), "text/plain"


def _loopback_for(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def default_paths(api_version: str, kind: str) -> Mapping[str, str]:
    """controller-runtime's paths for a kind: ``/mutate-<group, dots as dashes>-<version>-
    <kind, lower case>`` and ``/validate-...`` (the core group is empty: ``/mutate--v1-pod``)."""
    group, _, version = api_version.rpartition("/")
    stem = f"{group.replace('.', '-')}-{version}-{kind.lower()}"
    return {"mutate": f"/mutate-{stem}", "validate": f"/validate-{stem}"}
