"""Imports aiohttp with its two default TLS contexts loading the CA bundle at first use.

When ``aiohttp.connector`` is imported it builds two default TLS contexts (the one a request
with ``ssl=True`` uses, and the one for ``ssl=False``), and each loads the system's CA bundle
from disk: 20-25 ms apiece, the largest single cost of importing aiohttp and about an eighth
of a small operator's start-up (docs/benchmarks.md, "Start-up"). The runtime never uses
either: every request of ours carries a context of its own, built from the kubeconfig's or
the service account's CA. A program's own aiohttp requests with the default ``ssl=True``
do use the first one.

Importing this module imports aiohttp (once per process, before any of our modules do) with
the CA-bundle load of every context made during that import put off until the context is
first used: the context's class is :class:`DeferredDefaultCAContext` until then, which loads
the bundle exactly as :meth:`ssl.SSLContext.set_default_verify_paths` would have (the same
files, ``SSL_CERT_FILE``/``SSL_CERT_DIR`` read at that moment) before its first TLS
connection, server or client, in any thread or event loop, and before
:meth:`~ssl.SSLContext.get_ca_certs` or :meth:`~ssl.SSLContext.cert_store_stats` answer; it
then turns back into a plain :class:`ssl.SSLContext`. Guarantees: a handshake through either
context verifies against the same CAs as it would have without this module (nothing
verifies against an empty store), the load happens at most once per context, and nothing
else about the contexts changes (protocol, options, ALPN, hostname checks are aiohttp's own).

Caveats: the first connection through aiohttp's default context pays the load (20-25 ms, in
whatever thread opens it; aiohttp made them at import so as not to block an event loop, and
a program that minds that can pass its own ``ssl=`` context, as the runtime does). If aiohttp
was imported before this module (a program that imports it before any of ours), or
:class:`ssl.SSLContext` was replaced (truststore's ``inject_into_ssl()``), nothing is deferred
and aiohttp is as it always is.
"""

from __future__ import annotations

import ssl
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DeferredDefaultCAContext", "deferring_default_ca_loads"]

_LOAD_DEFAULTS = ssl.SSLContext.set_default_verify_paths
_PLAIN: Any = ssl.SSLContext  # Any: its _wrap_bio and _wrap_socket (C methods) are not typed
_LOADING = threading.Lock()


class DeferredDefaultCAContext(ssl.SSLContext):
    """An :class:`ssl.SSLContext` that still owes its default CA load; see the module."""

    def _load_owed_defaults(self) -> None:
        with _LOADING:
            if type(self) is DeferredDefaultCAContext:
                _LOAD_DEFAULTS(self)
                self.__class__ = _PLAIN

    # Every SSLObject and SSLSocket (asyncio's and uvloop's TLS transports, ssl.wrap_socket)
    # is made through one of these two.
    def _wrap_bio(self, *args: Any, **kwargs: Any) -> Any:
        self._load_owed_defaults()
        return _PLAIN._wrap_bio(self, *args, **kwargs)

    def _wrap_socket(self, *args: Any, **kwargs: Any) -> Any:
        self._load_owed_defaults()
        return _PLAIN._wrap_socket(self, *args, **kwargs)

    def get_ca_certs(self, binary_form: bool = False) -> Any:
        self._load_owed_defaults()
        return ssl.SSLContext.get_ca_certs(self, binary_form)

    def cert_store_stats(self) -> dict[str, int]:
        self._load_owed_defaults()
        return ssl.SSLContext.cert_store_stats(self)


def _defer_load(self: ssl.SSLContext) -> None:
    if type(self) is ssl.SSLContext:
        self.__class__ = DeferredDefaultCAContext
    else:  # a subclass of somebody else's: not ours to change
        _LOAD_DEFAULTS(self)


@contextmanager
def deferring_default_ca_loads() -> Iterator[None]:
    """While open, :meth:`ssl.SSLContext.set_default_verify_paths` (and so
    :func:`ssl.create_default_context` without CA arguments) defers its load to the
    context's first use. Meant to be held around one import; restored on exit."""
    own = ssl.SSLContext.__dict__.get("set_default_verify_paths")  # None: inherited from C
    ssl.SSLContext.set_default_verify_paths = _defer_load  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own is None:
            del ssl.SSLContext.set_default_verify_paths
        else:
            ssl.SSLContext.set_default_verify_paths = own  # type: ignore[method-assign]


# Not when ssl.SSLContext is no longer the standard library's (truststore's
# inject_into_ssl() replaces it): that class is not ours to reshape.
if "aiohttp" not in sys.modules and ssl.SSLContext.__module__ == "ssl":
    with deferring_default_ca_loads():
        import aiohttp  # noqa: F401
