"""The webhook server over real TLS on loopback: every answer of the table in its docstring,
the metrics, TLS versions and ALPN, hot reload of the certificate directory, readiness, and
the drain of reviews in flight at stop."""

from __future__ import annotations

import asyncio
import ssl
import warnings
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
import pytest

from controller_runtime.client import Client
from controller_runtime.envtest.certs import CertificateAuthority
from controller_runtime.metrics import REGISTRY
from controller_runtime.webhook import (
    AdmissionRequest,
    AdmissionResult,
    Denied,
    HubConverter,
    Spoke,
    WebhookBuilder,
    WebhookServer,
)
from controller_runtime.webhook.server import handler_time, parse_go_duration


def write_pair(directory: Path, ca: CertificateAuthority, hosts: Sequence[str]) -> None:
    pair = ca.issue_serving(list(hosts))
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    (directory / "ca.crt").write_bytes(ca.cert_pem)


def client_context(ca: CertificateAuthority) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.cert_pem.decode())


def review(operation: str = "CREATE", **obj: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "r-1",
            "kind": {"group": "shop.example.com", "version": "v1", "kind": "Widget"},
            "resource": {"group": "shop.example.com", "version": "v1", "resource": "widgets"},
            "name": "w",
            "namespace": "ns",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "shop.example.com/v1", "kind": "Widget", **obj},
            "oldObject": None,
        },
    }


class Host:
    """A stand-in manager: a server and a client."""

    def __init__(self, server: WebhookServer) -> None:
        self.webhook_server = server
        self.client = cast(Client, None)


class Behaviour:
    """A validator whose behaviour the test picks per object: spec.do is ok, deny, raise or
    hang (until released)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def validate_create(
        self, request: AdmissionRequest, client: Client, obj: dict[str, Any]
    ) -> Sequence[str]:
        what = obj["spec"]["do"]
        if what == "deny":
            raise Denied("no widgets today", field="spec.do")
        if what == "raise":
            raise RuntimeError("the database is gone")
        if what == "hang":
            self.entered.set()
            await self.release.wait()
        return ["fine"]

    async def validate_update(self, *args: Any) -> Sequence[str]:
        return []

    async def validate_delete(self, *args: Any) -> Sequence[str]:
        return []


class Defaults:
    async def default(self, request: AdmissionRequest, client: Client, obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {})["color"] = "blue"


@pytest.fixture
async def ca() -> CertificateAuthority:
    return CertificateAuthority("webhook-test-ca")


@pytest.fixture
async def served(
    tmp_path: Path, ca: CertificateAuthority
) -> AsyncIterator[tuple[WebhookServer, Behaviour, aiohttp.ClientSession]]:
    write_pair(tmp_path, ca, ["127.0.0.1", "localhost"])
    server = WebhookServer(port=0, host="127.0.0.1", cert_dir=tmp_path, handler_timeout=0.5)
    behaviour = Behaviour()
    converter = HubConverter(
        hub="shop.example.com/v2",
        spokes={"shop.example.com/v1": Spoke(to_hub=lambda o: o, from_hub=lambda o: o)},
    )
    WebhookBuilder(Host(server)).for_("shop.example.com/v1", "Widget").with_validator(
        behaviour
    ).with_defaulter(Defaults()).with_converter(converter).complete()
    await server.start()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca)))
    try:
        yield server, behaviour, session
    finally:
        behaviour.release.set()
        await session.close()
        await server.stop(0)


VALIDATE = "/validate-shop-example-com-v1-widget"
MUTATE = "/mutate-shop-example-com-v1-widget"


async def post(
    session: aiohttp.ClientSession, server: WebhookServer, path: str, body: Any, **kw: Any
) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"Content-Type": kw.pop("content_type", "application/json")}
    async with session.post(f"{server.url}{path}", data=data, headers=headers) as response:
        return response.status, await response.read()


def sample(name: str, labels: dict[str, str]) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return value or 0.0


async def test_the_builder_registers_controller_runtimes_paths(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, _ = served
    assert sorted(server.paths) == ["/convert", MUTATE, VALIDATE]


async def test_an_allowed_review_carries_the_warnings(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    before = sample(
        "controller_runtime_webhook_requests_total", {"webhook": VALIDATE, "code": "200"}
    )
    status, body = await post(session, server, VALIDATE, review(spec={"do": "ok"}))
    assert status == 200
    response = orjson.loads(body)["response"]
    assert response == {"uid": "r-1", "allowed": True, "warnings": ["fine"]}
    after = sample(
        "controller_runtime_webhook_requests_total", {"webhook": VALIDATE, "code": "200"}
    )
    assert after == before + 1
    assert sample("controller_runtime_webhook_latency_seconds_count", {"webhook": VALIDATE}) >= 1
    assert sample("controller_runtime_webhook_requests_in_flight", {"webhook": VALIDATE}) == 0


async def test_a_denial_is_a_review_not_an_error(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    status, body = await post(session, server, VALIDATE, review(spec={"do": "deny"}))
    assert status == 200
    response = orjson.loads(body)["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == "no widgets today"


async def test_the_mutating_path_answers_a_patch(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    status, body = await post(session, server, MUTATE, review(spec={"do": "ok"}))
    assert status == 200
    response = orjson.loads(body)["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"{", "application/json", 400, b"malformed review: the body is not JSON"),
        (b"{}", "text/plain", 400, b"Content-Type must be application/json"),
        (
            orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}),
            "application/json",
            400,
            b"admissionReviewVersions",
        ),
    ],
)
async def test_a_malformed_request_gets_a_400_with_a_message(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
    body: bytes,
    content_type: str,
    status: int,
    message: bytes,
) -> None:
    server, _, session = served
    got, text = await post(session, server, VALIDATE, body, content_type=content_type)
    assert got == status
    assert message in text


async def test_a_handler_exception_is_a_500_with_its_reason_and_the_server_goes_on(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    status, text = await post(session, server, VALIDATE, review(spec={"do": "raise"}))
    assert status == 500
    assert b"RuntimeError: the database is gone" in text
    assert (await post(session, server, VALIDATE, review(spec={"do": "ok"})))[0] == 200


async def test_a_handler_over_its_timeout_is_a_500_saying_so(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, behaviour, session = served
    status, text = await post(session, server, VALIDATE, review(spec={"do": "hang"}))
    assert status == 500
    assert b"ran over 0.5s" in text
    assert behaviour.entered.is_set()
    assert sample("controller_runtime_webhook_requests_in_flight", {"webhook": VALIDATE}) == 0


async def test_an_oversized_body_is_refused(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    big = review(spec={"do": "ok", "blob": "x" * (server.max_request_bytes + 10)})
    status, text = await post(session, server, VALIDATE, big)
    assert status == 413
    assert b"larger than" in text


async def test_unknown_paths_are_404(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    status, text = await post(session, server, "/validate-nothing", review())
    assert status == 404 and b"no webhook is registered at /validate-nothing" in text


async def test_the_conversion_path_answers_a_conversion_review(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, _, session = served
    request = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {
            "uid": "c",
            "desiredAPIVersion": "shop.example.com/v2",
            "objects": [{"apiVersion": "shop.example.com/v1", "kind": "Widget", "metadata": {}}],
        },
    }
    status, body = await post(session, server, "/convert", request)
    assert status == 200
    response = orjson.loads(body)["response"]
    assert response["result"]["status"] == "Success"
    assert response["convertedObjects"][0]["apiVersion"] == "shop.example.com/v2"


async def test_only_tls_1_2_and_newer_and_no_http2(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession], ca: CertificateAuthority
) -> None:
    server, _, _ = served
    assert server.tls.listener_context.minimum_version == ssl.TLSVersion.TLSv1_2
    old = client_context(ca)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # the client would speak TLS 1.1 if allowed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.open_connection("127.0.0.1", server.port, ssl=old)
    h2 = client_context(ca)
    h2.set_alpn_protocols(["h2", "http/1.1"])
    _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=h2)
    ssl_object = writer.get_extra_info("ssl_object")
    assert ssl_object.selected_alpn_protocol() == "http/1.1"
    assert ssl_object.version() in ("TLSv1.2", "TLSv1.3")
    writer.close()


async def test_a_new_pair_in_the_directory_is_served_without_restart(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
    tmp_path: Path,
    ca: CertificateAuthority,
) -> None:
    server, _, _ = served
    assert await server.ready()
    other = CertificateAuthority("rotated-ca")
    write_pair(tmp_path, other, ["127.0.0.1"])
    assert server._watcher is not None and server._watcher.check()  # what the poll does
    # The old session's CA no longer verifies new connections; the new CA does.
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(other)))
    try:
        status, _ = await post(fresh, server, VALIDATE, review(spec={"do": "ok"}))
        assert status == 200
    finally:
        await fresh.close()
    stale = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca)))
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await post(stale, server, VALIDATE, review(spec={"do": "ok"}))
    finally:
        await stale.close()
    # Readiness follows the trust bundle: the old one does not trust the new certificate.
    server.trust_bundle = other.cert_pem
    assert await server.ready()
    server.trust_bundle = CertificateAuthority("stranger").cert_pem
    assert not await server.ready()


async def test_a_broken_pair_keeps_the_current_one(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
    tmp_path: Path,
    ca: CertificateAuthority,
) -> None:
    server, _, session = served
    stranger = CertificateAuthority("stranger").issue_serving(["127.0.0.1"])
    (tmp_path / "tls.key").write_bytes(stranger.key_pem)  # does not match tls.crt
    assert server._watcher is not None and not server._watcher.check()
    status, _ = await post(session, server, VALIDATE, review(spec={"do": "ok"}))
    assert status == 200
    assert await server.ready()


async def test_without_a_certificate_the_server_listens_but_is_not_ready(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    server = WebhookServer(port=0, host="127.0.0.1", cert_dir=tmp_path)
    await server.start()
    try:
        assert not await server.ready()
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(ca))
        write_pair(tmp_path, ca, ["127.0.0.1"])
        assert server._watcher is not None and server._watcher.check()
        assert await server.ready()
    finally:
        await server.stop(0)


async def test_readiness_checks_the_service_name(tmp_path: Path, ca: CertificateAuthority) -> None:
    write_pair(tmp_path, ca, ["127.0.0.1"])
    server = WebhookServer(
        port=0, host="127.0.0.1", cert_dir=tmp_path, service_hostname="hooks.system.svc"
    )
    await server.start()
    try:
        assert not await server.ready(), "the certificate is not valid for the Service's name"
        write_pair(tmp_path, ca, ["hooks.system.svc", "127.0.0.1"])
        assert server._watcher is not None and server._watcher.check()
        assert await server.ready()
    finally:
        await server.stop(0)


async def test_stop_lets_a_review_in_flight_finish(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    server, behaviour, session = served
    server.handler_timeout = 30.0
    in_flight = asyncio.create_task(post(session, server, VALIDATE, review(spec={"do": "hang"})))
    await behaviour.entered.wait()
    stopping = asyncio.create_task(server.stop(10.0))
    await asyncio.sleep(0)  # the listener closes first
    behaviour.release.set()
    status, body = await in_flight
    await stopping
    assert status == 200 and orjson.loads(body)["response"]["allowed"] is True
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(session, server, VALIDATE, review(spec={"do": "ok"}))


def test_registering_a_path_twice_or_after_start_fails() -> None:
    server = WebhookServer(cert_dir=None)
    server.register("/validate-x", lambda request: _allowed())
    with pytest.raises(ValueError, match="already registered"):
        server.register("/validate-x", lambda request: _allowed())
    with pytest.raises(ValueError, match="starts with /"):
        server.register("validate-y", lambda request: _allowed())


async def _allowed() -> AdmissionResult:
    return AdmissionResult(allowed=True)


# -- readiness: what the API server would accept ----------------------------------------------


async def test_without_a_ca_file_readiness_trusts_only_the_systems_roots(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """A self-signed pair with no ca.crt: the API server (empty caBundle: the system's roots)
    would refuse it, so the server is not ready; the CA appearing makes it ready."""
    pair = ca.issue_serving(["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    server = WebhookServer(port=0, host="127.0.0.1", cert_dir=tmp_path)
    await server.start()
    try:
        assert server.tls.pair is not None, "the pair is served"
        assert not await server.ready(), "no CA known: only the system's roots, which refuse it"
        (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
        assert server._watcher is not None
        server._watcher.check()  # what the poll does
        assert server.trust_bundle == ca.cert_pem
        assert await server.ready()
        (tmp_path / "ca.crt").unlink()
        server._watcher.check()
        assert server.trust_bundle is None and not await server.ready()
    finally:
        await server.stop(0)


async def test_readiness_needs_every_injected_bundle_to_trust_the_certificate(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession], ca: CertificateAuthority
) -> None:
    server, _, _ = served
    stranger = CertificateAuthority("stranger").cert_pem
    assert await server.ready(), "ca.crt trusts it"
    server.injected_bundles = []
    assert not await server.ready(), "the targets were not read yet"
    server.injected_bundles = [ca.cert_pem, stranger]
    assert not await server.ready(), "one target's caBundle does not trust it"
    server.injected_bundles = [b""]
    assert not await server.ready(), "an empty caBundle: the system's roots do not trust it"
    server.injected_bundles = [ca.cert_pem + stranger, ca.cert_pem]
    assert await server.ready(), "every caBundle holds its CA"
    server.injected_bundles = [b"not a certificate"]
    assert not await server.ready()


# -- the handler's time and the API server's ---------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5s", 5.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1h0m0s", 3600.0),
        ("2.5s", 2.5),
        ("", None),
        ("5", None),
        ("5 s", None),
        ("s", None),
        ("-5s", None),
    ],
)
def test_go_durations(text: str, seconds: float | None) -> None:
    assert parse_go_duration(text) == seconds


@pytest.mark.parametrize(
    ("handler_timeout", "requested", "allowed"),
    [
        (9.0, None, 9.0),
        (9.0, "10s", 9.0),
        (9.0, "5s", 4.0),
        (9.0, "1s", 0.5),
        (2.0, "30s", 2.0),
        (9.0, "garbage", 9.0),
        (9.0, "0s", 9.0),
    ],
)
def test_a_handler_never_gets_more_time_than_the_api_server_waits(
    handler_timeout: float, requested: str | None, allowed: float
) -> None:
    assert handler_time(handler_timeout, requested) == allowed


async def test_the_requests_timeout_parameter_shortens_the_handlers_time(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    """The API server sends ?timeout=<its timeoutSeconds>: a handler that hangs is answered
    with a 500 and its reason before then, not after handler_timeout."""
    server, _, session = served
    server.handler_timeout = 60.0
    status, body = await post(
        session, server, f"{VALIDATE}?timeout=2s", review(spec={"do": "hang"})
    )
    assert status == 500
    assert f"the webhook handler at {VALIDATE} ran over 1.0s" in body.decode()


# -- stopping behind a Service -----------------------------------------------------------------


async def test_after_begin_shutdown_it_is_not_ready_answers_with_connection_close_and_serves_on(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession], ca: CertificateAuthority
) -> None:
    server, _, session = served
    server.shutdown_delay = 0.5
    assert await server.ready()
    loop = asyncio.get_running_loop()
    began = loop.time()
    server.begin_shutdown()
    assert not await server.ready(), "a terminating replica takes no new traffic"
    async with session.post(
        f"{server.url}{VALIDATE}",
        data=orjson.dumps(review(spec={"do": "ok"})),
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status == 200
        assert response.headers.get("Connection", "").lower() == "close", "reconnect elsewhere"
    stopping = asyncio.create_task(server.stop(10.0))
    # The listener is still open: a new connection (a fresh session) is served.
    fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(ca)))
    try:
        status, _ = await post(fresh, server, VALIDATE, review(spec={"do": "ok"}))
        assert status == 200
        assert not stopping.done()
        await stopping
        assert loop.time() - began >= 0.5, "open for the whole delay"
        with pytest.raises(aiohttp.ClientConnectionError):
            await post(fresh, server, VALIDATE, review(spec={"do": "ok"}))
    finally:
        await fresh.close()


async def test_a_stop_without_drain_time_closes_at_once(
    served: tuple[WebhookServer, Behaviour, aiohttp.ClientSession],
) -> None:
    """Leadership lost, or a failed start: drain 0, no delay."""
    server, _, session = served
    server.shutdown_delay = 30.0
    async with asyncio.timeout(5):
        await server.stop(0)
    with pytest.raises(aiohttp.ClientConnectionError):
        await post(session, server, VALIDATE, review(spec={"do": "ok"}))


async def test_the_managers_stop_request_starts_the_webhook_servers_shutdown() -> None:
    """SIGTERM (request_stop) is when the Service and kube-proxy begin dropping the Pod: the
    shutdown delay counts from then, not from when the controllers have drained."""
    from controller_runtime.manager import Manager, ManagerOptions  # noqa: PLC0415
    from kubeclient.config import ClusterConfig  # noqa: PLC0415

    server = WebhookServer(cert_dir=None, shutdown_delay=5.0)
    config = ClusterConfig("https://127.0.0.1:1", ssl.create_default_context())
    async with Manager(config, ManagerOptions(webhook_server=server)) as manager:
        assert not server.shutting_down
        manager.request_stop()
        assert server.shutting_down
