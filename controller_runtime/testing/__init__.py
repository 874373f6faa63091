"""A pytest plugin for testing controllers against a real local control plane.

Enable it in a project's ``conftest.py`` (``pytest_plugins = ["controller_runtime.testing"]``)
or on the command line (``pytest -p controller_runtime.testing``). It is not registered as an
automatic entry point on purpose: its fixture names (``client``, ``namespace``, ``manager``)
are the obvious ones, and a project that merely depends on the library must not get them
by surprise. Needs the ``testing`` extra (``pip install 'controller-runtime-py[testing]'``),
and pytest-asyncio (async tests: ``asyncio_mode = "auto"``, or ``@pytest.mark.asyncio``).

What controller-runtime users get from envtest and Gomega, as fixtures and helpers:

==========================  ===============================================================
``control_plane``           (session) etcd + kube-apiserver on loopback
                            (:class:`~controller_runtime.envtest.ControlPlane`), with the
                            CRDs of ``controller_runtime_crd_dirs`` and those generated from
                            the classes in ``controller_runtime_resources`` installed; the
                            current kubeconfig's cluster with ``USE_EXISTING_CLUSTER=true``
``cluster_config``          the admin's :class:`~controller_runtime.config.ClusterConfig`
``namespace``               a fresh namespace per test, deleted afterwards
``client``                  a :class:`~controller_runtime.Client` as the admin, with a cache
                            of its own (reads of a kind start with
                            ``client.cache.watch(...)``, or use ``client.live``)
``manager``                 a :class:`~controller_runtime.Manager` limited to ``namespace``,
                            with the ``controllers`` set up and running (caches synced), and
                            serving the webhooks of ``webhook_installation`` when there are
                            any; stopped gracefully after the test, and the test fails if it
                            ended with an error
``controllers``             what ``manager`` sets up: a list of ``setup(manager)`` functions
                            (``async`` or not); by default those named by
                            ``controller_runtime_setup`` (``module:function``). Override it
                            in a ``conftest.py``
``webhook_installation``    (session) the webhook configurations and CRD conversions of
                            ``controller_runtime_webhook_paths``, installed pointing at a
                            local webhook server (:class:`~controller_runtime.envtest.
                            WebhookInstallOptions`); ``None`` when there are none. While
                            they are installed, a request they cover needs a ``manager`` to
                            answer it (their ``failurePolicy`` decides otherwise)
``manager_options``         the :class:`~controller_runtime.ManagerOptions` ``manager`` starts
                            from (default ``ManagerOptions()``; namespaces, metrics and
                            probes are then set for the test)
==========================  ===============================================================

Helpers: :func:`wait_for` (until a watched object passes a check, driven by watch events)
and :func:`eventually` (Gomega's ``Eventually``: retry an assertion until it holds).

ini options (``[tool.pytest.ini_options]``): ``controller_runtime_crd_dirs`` (directories of
CRD YAML), ``controller_runtime_resources`` (modules with ``@crd`` classes: their CRDs are
generated and installed), ``controller_runtime_setup`` (``module:function`` per line),
``controller_runtime_webhook_paths`` (YAML files or directories of webhook configurations and
CRD conversion patches, a project's ``config/webhook``; missing ones are skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import pytest
import pytest_asyncio

from controller_runtime.cache import Cache, InformerFactory
from controller_runtime.client import Client, Transport
from controller_runtime.config import ClusterConfig, load_kubeconfig
from controller_runtime.envtest import ControlPlane, WebhookInstallation, WebhookInstallOptions
from controller_runtime.errors import NotFoundError
from controller_runtime.manager import Manager, ManagerOptions
from controller_runtime.resource import Resource, split_target

__all__ = [
    "DEFAULT_TIMEOUT",
    "Setup",
    "eventually",
    "wait_for",
]

Setup = Callable[[Manager], Awaitable[object] | object]
"""A function that adds controllers (or webhooks) to a manager, ``async`` or not (what
``controllers`` lists)."""
R = TypeVar("R", bound=Resource)
T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
"""Seconds :func:`wait_for` and :func:`eventually` wait by default (Gomega's is 1 s; a
controller's first reconcile after its caches sync takes longer on a loaded machine)."""


# ------------------------------------------------------------------------------- helpers


@overload
async def wait_for(
    client: Client,
    target: type[R],
    *,
    name: str,
    namespace: str | None = None,
    until: Callable[[R], bool] = ...,
    timeout: float = DEFAULT_TIMEOUT,
) -> R: ...


@overload
async def wait_for(
    client: Client,
    target: str,
    kind: str,
    *,
    name: str,
    namespace: str | None = None,
    until: Callable[[dict[str, Any]], bool] = ...,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]: ...


async def wait_for(
    client: Client,
    target: str | type[R],
    kind: str | None = None,
    *,
    name: str,
    namespace: str | None = None,
    until: Callable[[Any], bool] = lambda _: True,
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """The object once it exists and ``until(obj)`` holds, as the client's cache sees it.

    Watches the kind in ``client.cache`` (if it does not already) and checks again on every
    change of that kind: no polling. ``target`` is a resource class or an api_version (then
    ``kind`` follows). Raises ``TimeoutError`` after ``timeout`` seconds, with the last state
    seen in the message.
    """
    cls, api_version, kind, _ = split_target(target, kind, None, method="wait_for")
    entry = await client.cache.watch(api_version, kind)
    changed = asyncio.Event()
    registrations = entry.add_handler(lambda delta, initial: changed.set())
    last: Any = None
    try:
        async with asyncio.timeout(timeout):
            await client.cache.wait_for_sync(timeout)
            while True:
                changed.clear()
                try:
                    if cls is not None:
                        last = client.cache.get(cls, name=name, namespace=namespace)
                    else:
                        last = client.cache.get(api_version, kind, name=name, namespace=namespace)
                except NotFoundError:
                    last = None
                if last is not None and until(last):
                    return last
                await changed.wait()
    except TimeoutError:
        where = f"{namespace}/{name}" if namespace else name
        state = "absent" if last is None else f"last seen: {last!r}"
        raise TimeoutError(
            f"{kind} {where}: the condition did not hold within {timeout}s ({state})"
        ) from None
    finally:
        for registration in registrations:
            registration.remove()


async def eventually(
    check: Callable[[], Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.1,
) -> Any:
    """Gomega's ``Eventually``: call ``check`` (sync or async) until it returns without an
    ``AssertionError`` (and, if it returns a bool, returns ``True``); return its last value.

    For conditions no watch can show (a log line, a file, a metric). For objects prefer
    :func:`wait_for`, which reacts to watch events instead of polling every ``interval``
    seconds. After ``timeout`` the last ``AssertionError`` is raised (or one saying the
    check stayed false).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        failure: AssertionError | None = None
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result is not False:
                return result
            failure = AssertionError(f"{check!r} stayed false for {timeout}s")
        except AssertionError as err:
            failure = err
        if loop.time() >= deadline:
            raise failure
        await asyncio.sleep(interval)


# ------------------------------------------------------------------------------- plugin


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "controller_runtime_crd_dirs",
        "directories of CRD YAML installed in the test control plane",
        type="paths",
        default=[],
    )
    parser.addini(
        "controller_runtime_resources",
        "modules whose @crd classes' CRDs are generated and installed",
        type="linelist",
        default=[],
    )
    parser.addini(
        "controller_runtime_setup",
        "module:function per line: what the manager fixture sets up",
        type="linelist",
        default=[],
    )
    parser.addini(
        "controller_runtime_webhook_paths",
        "webhook configurations and CRD conversion patches installed for a local webhook server",
        type="paths",
        default=[],
    )


def _generated_crds(modules: Sequence[str], directory: Path) -> list[Path]:
    from controller_runtime.crdgen import discover, render_all  # noqa: PLC0415 (only here)

    paths = []
    for name, text in render_all(discover(modules)).items():
        path = directory / name
        path.write_text(text)
        paths.append(path)
    return paths


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """The session's control plane, with the configured CRDs installed."""
    directories: list[Path] = list(pytestconfig.getini("controller_runtime_crd_dirs"))
    modules: list[str] = list(pytestconfig.getini("controller_runtime_resources"))
    with ControlPlane(crd_directory=None) as plane, tempfile.TemporaryDirectory() as tmp:
        files = [p for d in directories for p in sorted(Path(d).glob("*.yaml"))]
        files += _generated_crds(modules, Path(tmp)) if modules else []
        if files:
            plane.install_crds(files)
        yield plane


@pytest.fixture(scope="session")
def webhook_installation(
    pytestconfig: pytest.Config, control_plane: ControlPlane
) -> Iterator[WebhookInstallation | None]:
    """The webhooks of ``controller_runtime_webhook_paths``, installed once for the session
    and pointed at a server on loopback (the ``manager`` fixture runs it); ``None`` when
    there is nothing to install. Uninstalled at the end of the session."""
    paths = [Path(p) for p in pytestconfig.getini("controller_runtime_webhook_paths")]
    options = WebhookInstallOptions(paths=[p for p in paths if p.exists()])
    if options.empty:
        yield None
        return
    installation = options.install(control_plane)
    try:
        yield installation
    finally:
        installation.uninstall(control_plane)


@pytest_asyncio.fixture
async def cluster_config(control_plane: ControlPlane) -> ClusterConfig:
    """The admin's configuration for ``control_plane``."""
    return await load_kubeconfig(control_plane.kubeconfig)


@pytest_asyncio.fixture
async def namespace(cluster_config: ClusterConfig) -> AsyncIterator[str]:
    """A fresh namespace (``t-<random>``), deleted after the test (on the local control
    plane it then stays Terminating: there is no namespace controller)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    async with Transport(cluster_config) as transport:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await transport.request("POST", "/api/v1/namespaces", body=body)
        yield name
        with contextlib.suppress(Exception):
            await transport.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest_asyncio.fixture
async def client(cluster_config: ClusterConfig) -> AsyncIterator[Client]:
    """A client as the admin, with a cache of its own across all namespaces."""
    async with Transport(cluster_config) as transport:
        cache = Cache(InformerFactory(transport))
        try:
            yield Client(transport, cache, field_manager="controller-runtime-py-test")
        finally:
            await cache.stop()


def _load_setup(reference: str) -> Setup:
    module_name, _, attribute = reference.partition(":")
    if not attribute:
        raise pytest.UsageError(
            f"controller_runtime_setup: {reference!r} should be module:function"
        )
    setup: Setup = getattr(importlib.import_module(module_name), attribute)
    return setup


@pytest.fixture
def controllers(pytestconfig: pytest.Config) -> list[Setup]:
    """What the ``manager`` fixture sets up (override in a conftest.py)."""
    return [_load_setup(r) for r in pytestconfig.getini("controller_runtime_setup")]


@pytest.fixture
def manager_options() -> ManagerOptions:
    """The options the ``manager`` fixture starts from (override in a conftest.py)."""
    return ManagerOptions()


@pytest_asyncio.fixture
async def manager(
    cluster_config: ClusterConfig,
    namespace: str,
    controllers: list[Setup],
    manager_options: ManagerOptions,
    webhook_installation: WebhookInstallation | None,
) -> AsyncIterator[Manager]:
    """A running manager limited to ``namespace``, with ``controllers`` set up, once its
    caches synced; no metrics or probe endpoints; its webhook server is the one
    ``webhook_installation`` points the API server at, when there is one (unless
    ``manager_options`` names another). Stopped gracefully after the test, whose result then
    includes how the manager ended."""
    webhook_server = manager_options.webhook_server
    if webhook_server is None and webhook_installation is not None:
        webhook_server = webhook_installation.server()
    options = dataclasses.replace(
        manager_options,
        namespaces=[namespace],
        metrics_bind_address=None,
        health_probe_bind_address=None,
        webhook_server=webhook_server,
    )
    async with Manager(cluster_config, options) as manager:
        for setup in controllers:
            added = setup(manager)
            if inspect.isawaitable(added):
                await added
        run = asyncio.create_task(manager.run(), name="controller-runtime-test-manager")
        ready = asyncio.create_task(_until_ready(manager))
        done, _ = await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
        if run in done:
            ready.cancel()
            run.result()
            raise RuntimeError("the manager stopped before its caches synced")
        try:
            await ready
            yield manager
        finally:
            # Stopping also releases the controllers' names for the next test's manager.
            manager.request_stop()
            await asyncio.wait_for(run, options.graceful_shutdown_timeout + 30)


async def _until_ready(manager: Manager) -> None:
    # Synced caches are enough: from then on every change reaches the controllers' queues,
    # and their workers start right after (a reconcile never misses an object created now).
    await manager.cache.wait_for_sync(None)
