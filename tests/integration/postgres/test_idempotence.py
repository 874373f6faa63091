"""Repeated reconciles, and reconciles on a cache that is always one write behind, never
create a second role, a second Secret or PostgresUser, and never lose the password.

The reconcilers are called directly (no controller, so no read-your-writes guard to hide the
staleness), with a client whose cached reads return, for every object, the version *before*
its latest one (or "not found" for an object seen only once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg
import pytest

from controller_runtime.cache import Cache
from controller_runtime.client import Client
from controller_runtime.objectkey import resolve_key
from controller_runtime.reconcile import Request
from controller_runtime.util import EventRecorder
from controllers.postgres.api import (
    API_VERSION,
    BINDING,
    INSTANCE,
    LABEL_BINDING,
    POLICY,
    USER,
    USER_FINALIZER,
)
from controllers.postgres.binding import BindingReconciler
from controllers.postgres.common import decode_secret
from controllers.postgres.instance import InstanceReconciler
from controllers.postgres.localserver import LocalPostgres
from controllers.postgres.user import UserReconciler
from informers.labels import LabelSelector
from informers.shared import InformerFactory
from informers.store import DELETED, StoreDelta
from kubeclient.errors import ConflictError, InvalidError, NotFoundError
from kubeclient.transport import Transport
from tests.integration.postgres.conftest import external_instance, set_policy

pytestmark = pytest.mark.integration

KINDS = (
    (API_VERSION, INSTANCE),
    (API_VERSION, USER),
    (API_VERSION, BINDING),
    (API_VERSION, POLICY),
)


class LaggingClient(Client):
    """Cached reads one write behind: the previous version of each object."""

    def __init__(self, transport: Transport, cache: Cache) -> None:
        super().__init__(transport, cache, field_manager="lagging-test")
        self.history: dict[tuple[str, str | None, str], list[dict[str, Any] | None]] = {}
        self.lagging = True
        self._changed = asyncio.Event()

    def observe(self, kind: str) -> Any:
        def handler(delta: StoreDelta, initial: bool) -> None:
            meta = delta.obj["metadata"]
            key = (kind, meta.get("namespace"), meta["name"])
            self.history.setdefault(key, []).append(None if delta.type == DELETED else delta.obj)
            self._changed.set()

        return handler

    async def catch_up(self, namespace: str) -> None:
        """Wait until the history holds the server's current version of every object."""
        for api_version, kind in KINDS:
            scope = None if kind == POLICY else namespace
            for obj in await self.live.list(api_version, kind, namespace=scope):
                meta = obj["metadata"]
                key = (kind, meta.get("namespace"), meta["name"])

                def seen(key: Any = key, rv: str = meta["resourceVersion"]) -> bool:
                    versions = self.history.get(key) or [None]
                    last = versions[-1]
                    return last is not None and last["metadata"]["resourceVersion"] == rv

                while not seen():
                    self._changed.clear()
                    await asyncio.wait_for(self._changed.wait(), 10)

    def _lagged(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        versions = self.history.get((kind, namespace, name), [])
        return versions[-2] if len(versions) >= 2 else None

    async def get(  # type: ignore[override]  # the dict form only
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        if not self.lagging:
            return await super().get(api_version, kind, key, name=name, namespace=namespace)
        namespace, name = resolve_key(key, name, namespace, method="get")
        obj = self._lagged(kind, namespace, name)
        if obj is None:
            raise NotFoundError(404, "NotFound", f"{kind} {name} not found (lagging cache)")
        return dict(obj)

    async def list(  # type: ignore[override]  # the dict form only
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: LabelSelector | str | None = None,
    ) -> list[dict[str, Any]]:
        current = await super().list(api_version, kind, namespace=namespace)
        if not self.lagging:
            return current
        out = []
        for obj in current:
            meta = obj["metadata"]
            lagged = self._lagged(kind, meta.get("namespace"), meta["name"])
            if lagged is not None:
                out.append(lagged)
        return out


@pytest.fixture
async def lagging(transport: Transport, namespace: str) -> AsyncIterator[LaggingClient]:
    cache = Cache(InformerFactory(transport), namespaces=[namespace])
    client = LaggingClient(transport, cache)
    for api_version, kind in KINDS:
        entry = await cache.watch(api_version, kind)
        entry.add_handler(client.observe(kind))
    await cache.wait_for_sync(30)
    yield client
    await cache.stop()


def roles_like(server: LocalPostgres, prefix: str) -> list[str]:
    with psycopg.connect(**server.conninfo()) as conn:  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (prefix + "%",)
        ).fetchall()
    return [str(r[0]) for r in rows]


async def test_repeated_and_stale_reconciles_keep_one_role_and_one_password(
    lagging: LaggingClient,
    transport: Transport,
    kube: Client,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    instances = InstanceReconciler(lagging, recorder)
    bindings = BindingReconciler(lagging, recorder)
    users = UserReconciler(lagging, recorder)
    await external_instance(kube, namespace, postgres_server)
    request = Request(namespace, "db")

    async def step(reconcile: Any, req: Request) -> None:
        # What the controller does with an error: try again (here, at the next step).
        with contextlib.suppress(ConflictError, InvalidError, NotFoundError, RuntimeError):
            await reconcile(req)
        await lagging.catch_up(namespace)

    async def touch(kind: str, name: str) -> None:
        # A metadata-only write: the lagging cache now shows the version before it.
        obj = {
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
        }
        await kube.patch(obj, {"metadata": {"labels": {"touched": "yes"}}})
        await lagging.catch_up(namespace)

    # Bring the instance to Ready first, with a fresh cache.
    lagging.lagging = False
    await lagging.catch_up(namespace)
    await step(instances.reconcile, request)
    await touch(INSTANCE, "db")
    lagging.lagging = True
    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": BINDING,
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"instanceRef": {"name": "db"}},
        }
    )
    await touch(BINDING, "app")
    app = Request(namespace, "app")
    passwords: set[str] = set()
    role = f"{namespace.replace('-', '_')}_app"
    for _ in range(6):
        await step(bindings.reconcile, app)
        if len(lagging.history.get((USER, namespace, "app"), [])) == 1:
            await touch(USER, "app")
        await step(users.reconcile, app)
        with contextlib.suppress(NotFoundError):
            secret = await kube.live.get(
                "v1", "Secret", name="app-credentials", namespace=namespace
            )
            passwords.add(decode_secret(secret)["password"])
    assert roles_like(postgres_server, role) == [role], "no progress while the cache lagged"
    # Then with a fresh cache, repeatedly: everything converges, nothing is duplicated.
    lagging.lagging = False
    for _ in range(3):
        await step(bindings.reconcile, app)
        await step(users.reconcile, app)
    await recorder.close()

    assert len(passwords) == 1, "the password changed"
    (password,) = passwords
    assert roles_like(postgres_server, namespace.replace("-", "_")) == [role]
    selector = f"{LABEL_BINDING}=app"
    secrets = await kube.live.list("v1", "Secret", namespace=namespace, label_selector=selector)
    assert [s["metadata"]["name"] for s in secrets] == ["app-credentials"]
    users_listed = await kube.live.list(API_VERSION, USER, namespace=namespace)
    assert [u["metadata"]["name"] for u in users_listed] == ["app"]
    with psycopg.connect(
        host=postgres_server.host,
        port=postgres_server.port,
        user=role,
        password=password,
        dbname="app",
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    user = users_listed[0]
    ready: Mapping[str, Any] = next(c for c in user["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


async def test_a_role_created_for_a_user_deleted_meanwhile_is_dropped_again(
    lagging: LaggingClient,
    kube: Client,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    """A reconcile that reads a PostgresUser the server has deleted (a cache behind the
    deletion, or the API server's delete/finalizer race, kubernetes/kubernetes#77988) and
    creates its role drops the role again: its finalizer will never run, so nothing else
    would (found by `make chaos`, seed 36: an orphan role)."""
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    await external_instance(kube, namespace, postgres_server)
    lagging.lagging = False
    await lagging.catch_up(namespace)
    await InstanceReconciler(lagging, recorder).reconcile(Request(namespace, "db"))
    await lagging.catch_up(namespace)
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gone-pw", "namespace": namespace},
            "stringData": {"password": "a-password-for-gone"},
        }
    )
    role = f"{namespace.replace('-', '_')}_gone"
    created = await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": USER,
            "metadata": {
                "name": "gone",
                "namespace": namespace,
                "finalizers": [USER_FINALIZER],
            },
            "spec": {
                "instanceRef": {"name": "db"},
                "roleName": role,
                "database": "gone",
                "passwordSecretRef": {"name": "gone-pw", "key": "password"},
            },
        }
    )
    await lagging.catch_up(namespace)
    # The server deletes it; the reconcile below still reads it as it was, alive and with its
    # finalizer, as a cache that has not seen the deletion does.
    await kube.patch(created, {"metadata": {"finalizers": None}})
    await kube.delete(created)
    instance = await kube.live.get(API_VERSION, INSTANCE, name="db", namespace=namespace)
    ready = next(c for c in instance["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", instance["status"]
    lagging.history[(INSTANCE, namespace, "db")] = [instance, instance]
    lagging.history[(USER, namespace, "gone")] = [created, created]
    lagging.lagging = True
    users = UserReconciler(lagging, recorder)
    with contextlib.suppress(NotFoundError):  # before the fix: the status write finds it gone
        await users.reconcile(Request(namespace, "gone"))
    await recorder.close()
    assert roles_like(postgres_server, role) == [], "the role of a deleted PostgresUser remains"


@pytest.mark.parametrize("same_role", [False, True], ids=["other-role", "same-role"])
async def test_a_role_created_for_a_user_recreated_meanwhile_follows_the_new_user(
    lagging: LaggingClient,
    kube: Client,
    namespace: str,
    postgres_server: LocalPostgres,
    same_role: bool,
) -> None:
    """A reconcile reads a PostgresUser the server has deleted and re-created under the same
    name (a new leader whose cache lags): the role it creates from the old spec is dropped
    again when the new PostgresUser asks for another role (nothing else would ever drop it),
    and kept when it asks for the same one (it is the new user's role too)."""
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    await external_instance(kube, namespace, postgres_server)
    lagging.lagging = False
    await lagging.catch_up(namespace)
    await InstanceReconciler(lagging, recorder).reconcile(Request(namespace, "db"))
    await lagging.catch_up(namespace)
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "twice-pw", "namespace": namespace},
            "stringData": {"password": "a-password-for-twice"},
        }
    )
    prefix = namespace.replace("-", "_")
    old_role, new_role = f"{prefix}_old", f"{prefix}_old" if same_role else f"{prefix}_new"

    def user(role: str) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": USER,
            "metadata": {"name": "twice", "namespace": namespace, "finalizers": [USER_FINALIZER]},
            "spec": {
                "instanceRef": {"name": "db"},
                "roleName": role,
                "database": "twice",
                "passwordSecretRef": {"name": "twice-pw", "key": "password"},
            },
        }

    created = await kube.create(user(old_role))
    await lagging.catch_up(namespace)
    await kube.patch(created, {"metadata": {"finalizers": None}})
    await kube.delete(created)
    recreated = await kube.create(user(new_role))
    assert recreated["metadata"]["uid"] != created["metadata"]["uid"]
    instance = await kube.live.get(API_VERSION, INSTANCE, name="db", namespace=namespace)
    lagging.history[(INSTANCE, namespace, "db")] = [instance, instance]
    lagging.history[(USER, namespace, "twice")] = [created, created]
    lagging.lagging = True
    users = UserReconciler(lagging, recorder)
    # The status write of the old incarnation fails its preconditions: retried by the
    # controller, on the new incarnation once the cache caught up.
    with contextlib.suppress(ConflictError, NotFoundError):
        await users.reconcile(Request(namespace, "twice"))
    await recorder.close()
    assert roles_like(postgres_server, old_role) == ([old_role] if same_role else []), (
        "the role of a re-created PostgresUser's predecessor remains"
    )


async def test_a_cache_behind_the_instance_does_not_release_a_user_without_its_drop(
    lagging: LaggingClient,
    kube: Client,
    namespace: str,
    postgres_server: LocalPostgres,
) -> None:
    """The finalizer of a deleted PostgresUser is released without dropping the role only when
    the instance is really gone: a cache that does not show the instance (a new leader whose
    instance watch lags behind its users watch) is checked against the server first."""
    major = postgres_server.version.split(".")[0]
    await set_policy(kube, {major: True})
    recorder = EventRecorder(kube, reporting_controller="crpy.io/test", reporting_instance="t")
    await external_instance(kube, namespace, postgres_server)
    lagging.lagging = False
    await lagging.catch_up(namespace)
    await InstanceReconciler(lagging, recorder).reconcile(Request(namespace, "db"))
    await lagging.catch_up(namespace)
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "kept-pw", "namespace": namespace},
            "stringData": {"password": "a-password-for-kept"},
        }
    )
    role = f"{namespace.replace('-', '_')}_kept"
    await kube.create(
        {
            "apiVersion": API_VERSION,
            "kind": USER,
            "metadata": {"name": "kept", "namespace": namespace},
            "spec": {
                "instanceRef": {"name": "db"},
                "roleName": role,
                "database": "kept",
                "passwordSecretRef": {"name": "kept-pw", "key": "password"},
            },
        }
    )
    await lagging.catch_up(namespace)
    users = UserReconciler(lagging, recorder)
    for _ in range(2):  # the finalizer, then the role
        await users.reconcile(Request(namespace, "kept"))
        await lagging.catch_up(namespace)
    assert roles_like(postgres_server, role) == [role]
    await kube.delete(API_VERSION, USER, name="kept", namespace=namespace)
    await lagging.catch_up(namespace)
    deleting = await kube.live.get(API_VERSION, USER, name="kept", namespace=namespace)
    # The user's deletion is in the cache; the instance is not (yet).
    lagging.history[(USER, namespace, "kept")] = [deleting, deleting]
    lagging.history[(INSTANCE, namespace, "db")] = []
    lagging.lagging = True
    await users.reconcile(Request(namespace, "kept"))
    await recorder.close()
    assert roles_like(postgres_server, role) == [], "released without dropping the role"
