"""Fixtures of the PostgreSQL operator's tests: a throwaway PostgreSQL server for the session
(``initdb`` + ``postgres`` on a free loopback port, stopped at the end), the operator's
controllers running on a manager scoped to the test's namespace, and helpers to create the
objects every test needs (the version policy, an admin Secret, an external instance)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.controller import ControllerOptions
from controller_runtime.manager import Manager, ManagerOptions
from controllers.postgres import (
    setup_binding_controller,
    setup_instance_controller,
    setup_user_controller,
)
from controllers.postgres.api import API_VERSION, POLICY, POLICY_NAME
from controllers.postgres.localserver import LocalPostgres, PostgresNotFoundError
from informers.shared import InformerFactory
from kubeclient.config import ClusterConfig
from kubeclient.errors import NotFoundError
from kubeclient.transport import Transport
from tests.support import watch_until

Obj = dict[str, Any]
Setup = Callable[..., Awaitable[object]]
POSTGRES_CONTROLLERS: tuple[Setup, ...] = (
    setup_instance_controller,
    setup_user_controller,
    setup_binding_controller,
)
TEST_OPTIONS = ControllerOptions(skip_name_validation=True, max_concurrent_reconciles=2)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """A local PostgreSQL server (started in the main thread: it dies with it)."""
    server = LocalPostgres()
    try:
        server.start()
    except PostgresNotFoundError as err:
        pytest.fail(str(err))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def kube(transport: Transport) -> AsyncIterator[Client]:
    """A client for the test's own reads (live) and writes; it caches nothing."""
    cache = Cache(InformerFactory(transport))
    yield Client(transport, cache, field_manager="test")
    await cache.stop()


@contextlib.asynccontextmanager
async def running_operator(
    config: ClusterConfig,
    namespace: str,
    setups: tuple[Setup, ...] = POSTGRES_CONTROLLERS,
    **kwargs: Any,
) -> AsyncIterator[Manager]:
    """A manager watching ``namespace`` with the given controllers, running until exit."""
    manager = Manager(
        config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            graceful_shutdown_timeout=5,
        ),
    )
    for setup in setups:
        await setup(manager, manager.client, options=TEST_OPTIONS, **kwargs)
    task = asyncio.create_task(manager.run())
    try:
        yield manager
    finally:
        manager.request_stop()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def operator(admin_config: ClusterConfig, namespace: str) -> AsyncIterator[Manager]:
    """Instance, user and binding controllers on the test's namespace."""
    async with running_operator(admin_config, namespace) as manager:
        yield manager


async def set_policy(kube: Client, versions: Mapping[str, bool], **spec: Any) -> Obj:
    """Apply the version policy ``default`` with exactly these versions."""
    policy = {
        "apiVersion": API_VERSION,
        "kind": POLICY,
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "versions": [{"version": v, "enabled": on} for v, on in versions.items()],
            **spec,
        },
    }
    return await kube.apply(policy, force=True)


async def delete_policy(kube: Client) -> None:
    with contextlib.suppress(NotFoundError):
        await kube.delete(
            {"apiVersion": API_VERSION, "kind": POLICY, "metadata": {"name": POLICY_NAME}}
        )


async def external_instance(
    kube: Client, namespace: str, server: LocalPostgres, name: str = "db"
) -> Obj:
    """An admin Secret for ``server`` and an external PostgresInstance using it."""
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-admin", "namespace": namespace},
            "stringData": {"username": server.user, "password": server.password},
        }
    )
    return await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": "PostgresInstance",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "external": {
                    "host": server.host,
                    "port": server.port,
                    "adminSecretRef": {"name": f"{name}-admin"},
                }
            },
        }
    )


def plural_of(kind: str) -> str:
    return {
        "PostgresInstance": "postgresinstances",
        "PostgresUser": "postgresusers",
        "ServiceBinding": "servicebindings",
        "Backup": "backups",
        "BackupPlan": "backupplans",
    }[kind]


def condition(obj: Mapping[str, Any] | None, condition_type: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == condition_type:
            return dict(c)
    return {}


async def wait_for(
    transport: Transport,
    kind: str,
    namespace: str,
    name: str,
    check: Callable[[Obj | None], bool],
    *,
    api: str = API_VERSION,
    timeout: float = 30.0,
) -> Obj | None:
    """Watch one object until ``check`` holds for it (``None``: it does not exist). Returns
    the object (or ``None``). Lists first, then watches from the list's resourceVersion, so
    no change between the two is missed."""
    plural = kind if api in ("v1", "apps/v1", "batch/v1", "policy/v1") else plural_of(kind)
    prefix = "/api/v1" if api == "v1" else f"/apis/{api}"
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    selector = {"fieldSelector": f"metadata.name={name}"}
    listing = await transport.get_json(path, selector)
    items = listing.get("items") or []
    for item in items:  # list items of built-in kinds come without them
        item.setdefault("apiVersion", listing.get("apiVersion"))
        item.setdefault("kind", str(listing.get("kind", "")).removesuffix("List"))
    current: Obj | None = dict(items[0]) if items else None
    if check(current):
        return current
    found: list[Obj | None] = []

    def matches(event: Mapping[str, Any]) -> bool:
        if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        obj = dict(event["object"]) if event["type"] != "DELETED" else None
        if check(obj):
            found.append(obj)
            return True
        return False

    params = {**selector, "resourceVersion": listing["metadata"]["resourceVersion"]}
    await watch_until(transport, path, matches, params=params, timeout=timeout)
    return found[0]
