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
the handler ran over ``handler_timeout`` (9 s)     504
=================================================  =============================================

A 500 or 504 is a failed call to the API server, so the webhook configuration's
``failurePolicy`` decides (``Fail`` refuses the request with the body's reason, ``Ignore``
admits it); a denial is not a failure and refuses whatever the policy.

Metrics (controller-runtime's names, ``webhook`` = the path):
``controller_runtime_webhook_latency_seconds``, ``controller_runtime_webhook_requests_total``
(with ``code``) and ``controller_runtime_webhook_requests_in_flight``.

Stopping (SIGTERM): the listener closes (no new connection), reviews in flight finish for up
to the drain timeout the manager gives (its ``graceful_shutdown_timeout``), then idle
keep-alive connections are closed, so the API server's next call goes to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    read_optional,
)

__all__ = [
    "CONVERT_PATH",
    "DEFAULT_PORT",
    "MAX_REQUEST_BYTES",
    "AdmissionHandler",
    "WebhookServer",
    "default_paths",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 9443
CONVERT_PATH = "/convert"
MAX_REQUEST_BYTES = 7 * 1024 * 1024
"""controller-runtime's limit: two objects of etcd's 1.5 MiB, with room for the review."""

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
    that the API server gets the 504 and its reason rather than timing out itself; keep it
    under the configuration's ``timeoutSeconds``) bounds each handler;
    ``max_request_bytes`` (7 MiB) each body.

    Readiness (:meth:`ready`, the manager's ``webhook-server`` readyz check): true once a TLS
    handshake with the server itself succeeds with a certificate that :attr:`trust_bundle`
    trusts (``cert_dir/ca.crt`` when it exists, cert-manager's layout; the self-managed
    certificates set it to the caBundle they inject), and that is valid for
    ``service_hostname`` when it is set (``<service>.<namespace>.svc``, the name the API
    server checks).
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
    ) -> None:
        if handler_timeout <= 0:
            raise ValueError(f"handler_timeout must be > 0, got {handler_timeout}")
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
            )
            if self.cert_dir is not None
            else None
        )
        self.trust_bundle: bytes | None = None
        """The CA bundle readiness verifies the served certificate against."""
        self._admission: dict[str, AdmissionHandler] = {}
        self._converters: dict[tuple[str, str], Converter] = {}
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.url: str | None = None
        """``https://host:port`` once started (the port actually bound)."""

    def __repr__(self) -> str:
        return f"WebhookServer({self.host}:{self.port})"

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
            assert self.cert_dir is not None
            self.trust_bundle = read_optional(self.cert_dir / "ca.crt") or self.trust_bundle
            self._watcher.start()
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

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Close the listener, let reviews in flight finish for up to ``drain_timeout``
        seconds (``None``: 60 s), close the connections. Safe to call twice."""
        if self._listener is not None:
            self._listener.close()
        if self._watcher is not None:
            await self._watcher.stop()
        await self._close_runner(60.0 if drain_timeout is None else drain_timeout)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.wait_closed()
            self._listener = None

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
        started = time.perf_counter()
        try:
            status, body, content_type = await self._answer(request, path, handler)
        finally:
            in_flight.dec()
        WEBHOOK_LATENCY.labels(path).observe(time.perf_counter() - started)
        WEBHOOK_REQUESTS.labels(path, str(status)).inc()
        return web.Response(status=status, body=body, content_type=content_type)

    async def _answer(
        self, request: web.Request, path: str, handler: AdmissionHandler | None
    ) -> _Answer:
        if request.content_type != "application/json":
            return _text(400, f"Content-Type must be application/json, got {request.content_type}")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _text(413, f"the request body is larger than {self.max_request_bytes} bytes")
        return await self._review(path, handler, body)

    async def _review(self, path: str, handler: AdmissionHandler | None, body: bytes) -> _Answer:
        try:
            async with asyncio.timeout(self.handler_timeout):
                if handler is None:
                    review = parse_conversion_review(body)
                    answer = convert_review(review, self._converters)
                else:
                    admission = parse_admission_review(body)
                    answer = review_response(admission.uid, await handler(admission))
        except MalformedReviewError as err:
            return _text(400, f"malformed review: {err}")
        except TimeoutError:
            log.warning("webhook %s: the handler ran over %.1fs", path, self.handler_timeout)
            return _text(504, f"the webhook handler at {path} ran over {self.handler_timeout}s")
        except Exception as err:
            log.error("webhook %s: the handler raised %s", path, type(err).__name__, exc_info=err)
            reason = f"{type(err).__name__}: {err}"
            return _text(500, f"the webhook handler at {path} failed: {reason}")
        return 200, answer, "application/json"

    # -- readiness ----------------------------------------------------------------------

    async def ready(self, timeout: float = 2.0) -> bool:
        """True when a TLS handshake with this server succeeds, with a certificate that
        :attr:`trust_bundle` trusts (any certificate when no bundle is known) and, when
        ``service_hostname`` is set, valid for that name. Never raises."""
        if self._listener is None or self.tls.pair is None:
            return False
        context = ssl.create_default_context()
        if self.trust_bundle is not None:
            try:
                context.load_verify_locations(cadata=self.trust_bundle.decode())
            except (ssl.SSLError, ValueError):
                return False
            context.check_hostname = self.service_hostname is not None
        else:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
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
