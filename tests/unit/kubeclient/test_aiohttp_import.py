"""kubeclient._aiohttp: aiohttp's default TLS contexts load the CA bundle at first use, and
verify exactly as before.

Each case runs in a fresh interpreter (the deferral happens once, at aiohttp's import) against
a TLS server on loopback whose certificate a throwaway CA signed; ``SSL_CERT_FILE`` names the
"system" bundle the default contexts are to trust.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from controller_runtime.envtest.certs import CertificateAuthority

CHILD = textwrap.dedent(
    """
    import asyncio, json, ssl, sys, threading
    import_first, loop_kind, serve_cert, serve_key = sys.argv[1:5]
    if import_first == "aiohttp":
        import aiohttp
    import controller_runtime  # our packages first: aiohttp's import is deferred by them
    import aiohttp
    import aiohttp.connector as connector
    from aiohttp import web
    import kubeclient._aiohttp as deferral

    loads = []
    original = deferral._LOAD_DEFAULTS
    def counted(context):
        loads.append(threading.get_ident())
        original(context)
    deferral._LOAD_DEFAULTS = counted

    report = {
        "classes_before": [type(connector._SSL_CONTEXT_VERIFIED).__name__,
                           type(connector._SSL_CONTEXT_UNVERIFIED).__name__],
        "patch_left": "set_default_verify_paths" in ssl.SSLContext.__dict__,
        "fresh_default_cas": ssl.create_default_context().cert_store_stats()["x509_ca"],
    }

    async def fetch(url, **kwargs):
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(url, **kwargs) as answer:
                    return str(answer.status)
            except aiohttp.ClientConnectorCertificateError:
                return "certificate refused"

    async def serve_and_fetch():
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(serve_cert, serve_key)
        app = web.Application()
        app.router.add_get("/", lambda request: web.Response(text="ok"))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        url = f"https://127.0.0.1:{port}/"
        try:
            # Ten first connections at once through the verifying default, then the
            # non-verifying one (ssl=False).
            verified = await asyncio.gather(*(fetch(url) for _ in range(10)))
            unverified = await fetch(url, ssl=False)
            return verified, unverified
        finally:
            await runner.cleanup()

    if loop_kind == "uvloop":
        import uvloop
        verified, unverified = uvloop.run(serve_and_fetch())
    else:
        verified, unverified = asyncio.run(serve_and_fetch())
    report.update(
        verified=sorted(set(verified)),
        unverified=unverified,
        classes_after=[type(connector._SSL_CONTEXT_VERIFIED).__name__,
                       type(connector._SSL_CONTEXT_UNVERIFIED).__name__],
        loads=len(loads),
        default_cas_after=connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
    )
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A serving pair signed by one CA, a bundle that trusts it, one that does not."""
    directory = tmp_path_factory.mktemp("pki")
    trusted, other = CertificateAuthority("trusted-ca"), CertificateAuthority("other-ca")
    cert, key = trusted.issue_serving(["127.0.0.1"]).write(directory, "serving")
    (directory / "trusting.pem").write_bytes(trusted.cert_pem)
    (directory / "other.pem").write_bytes(other.cert_pem)
    return {
        "cert": cert,
        "key": key,
        "trusting": directory / "trusting.pem",
        "other": directory / "other.pem",
    }


def run_python(pki: dict[str, Path], bundle: str, *args: str) -> Any:
    """``python *args`` in a fresh interpreter whose "system" CA bundle is ``pki[bundle]``;
    the JSON of its last line of output."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SSL_CERT_")}
    environment |= {"SSL_CERT_FILE": str(pki[bundle]), "SSL_CERT_DIR": str(pki[bundle].parent)}
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def run_child(
    pki: dict[str, Path], bundle: str, *, import_first: str = "ours", loop: str = "asyncio"
) -> dict[str, object]:
    report: dict[str, object] = run_python(
        pki, bundle, "-c", CHILD, import_first, loop, str(pki["cert"]), str(pki["key"])
    )
    return report


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_default_context_trusts_the_bundle_once_loaded_at_first_use(
    pki: dict[str, Path], loop: str
) -> None:
    report = run_child(pki, "trusting", loop=loop)
    deferred = "DeferredDefaultCAContext"
    assert report["classes_before"] == [deferred, deferred]
    assert report["patch_left"] is False
    assert report["fresh_default_cas"] == 1  # contexts made after the import load at once
    assert report["verified"] == ["200"]
    assert report["unverified"] == "200"
    # Both contexts were used; each loaded once (ten concurrent first connections).
    assert report["loads"] == 2
    assert report["classes_after"] == ["SSLContext", "SSLContext"]
    assert report["default_cas_after"] == 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_default_context_still_refuses_a_server_the_bundle_does_not_trust(
    pki: dict[str, Path], loop: str
) -> None:
    report = run_child(pki, "other", loop=loop)
    assert report["classes_before"] == ["DeferredDefaultCAContext"] * 2
    assert report["verified"] == ["certificate refused"]
    assert report["unverified"] == "200"  # ssl=False verifies nothing, as before
    assert report["default_cas_after"] == 1  # the other CA: the bundle was loaded, not skipped


def test_nothing_is_deferred_when_aiohttp_was_imported_first(pki: dict[str, Path]) -> None:
    report = run_child(pki, "trusting", import_first="aiohttp")
    assert report["classes_before"] == ["SSLContext", "SSLContext"]
    assert report["loads"] == 0
    assert report["verified"] == ["200"]
    assert report["patch_left"] is False


def test_a_deferred_context_answers_for_its_certificates_before_any_connection(
    pki: dict[str, Path],
) -> None:
    script = (
        "import controller_runtime, aiohttp.connector as c, json; "
        "v = c._SSL_CONTEXT_VERIFIED; "
        "print(json.dumps([type(v).__name__, len(v.get_ca_certs()), type(v).__name__]))"
    )
    expected = ["DeferredDefaultCAContext", 1, "SSLContext"]
    assert run_python(pki, "trusting", "-c", script) == expected


def test_nothing_is_deferred_when_ssl_context_was_replaced(pki: dict[str, Path]) -> None:
    """As truststore's inject_into_ssl() does, ssl.SSLContext is then a class of another
    module (stood for here by relabelling the standard one, which replacing it naively would
    break)."""
    script = (
        "import ssl, json\n"
        "ssl.SSLContext.__module__ = 'truststore'\n"
        "import controller_runtime, aiohttp.connector as c\n"
        "v = c._SSL_CONTEXT_VERIFIED\n"
        "stats = ssl._ssl._SSLContext.cert_store_stats(v)  # what is loaded now, not on demand\n"
        "print(json.dumps([type(v).__name__, stats['x509_ca']]))\n"
    )
    # Made and loaded at import, as always.
    assert run_python(pki, "trusting", "-c", script) == ["SSLContext", 1]
