"""The fuzzer's scenarios: each shipped controller, its workload and its invariants.

* :class:`TaskScenario`: the Task controller (``controllers/task.py``). Workload: create,
  change the spec, delete, re-create with the same name. Converged when every Task's status is
  what :func:`~controllers.task.derive_status` gives for its spec, for its generation.
* :class:`BindingScenario`: the PostgreSQL instance, user and binding controllers
  (``controllers/postgres/``) against a real PostgreSQL. Workload: create, delete and
  re-create ServiceBindings. Safety after every step: at most one Secret controlled by each
  binding, and a Secret's password never changes. Converged when every binding is Ready, its
  role logs in with the password in its Secret, and no role, Secret or PostgresUser is left
  for a binding that no longer exists. A gone binding's dependents are deleted by the
  scenario in the garbage collector's place on the local control plane, and by the cluster's
  own collector on a cluster that runs a controller-manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql as pgsql

from controller_runtime.client import Client
from controller_runtime.controller import ControllerOptions
from controller_runtime.manager import Manager
from controllers.postgres import (
    setup_binding_controller,
    setup_instance_controller,
    setup_user_controller,
)
from controllers.postgres.api import API_VERSION, identifier_from
from controllers.postgres.common import decode_secret
from controllers.postgres.localserver import LocalPostgres
from controllers.task import TASK_API_VERSION, derive_status, setup_task_controller
from kubeclient.errors import AlreadyExistsError, ConflictError, NotFoundError
from kubeclient.transport import Transport
from tests.support import collect_binding_orphans, create_external_instance

Obj = dict[str, Any]
OPTIONS = ControllerOptions(skip_name_validation=True, max_concurrent_reconciles=2)
PAST = "2020-01-01T00:00:00Z"
FUTURE = "2099-01-01T00:00:00Z"
SPECS: tuple[dict[str, Any], ...] = (
    {"priority": 1},
    {"priority": 2, "taskState": "InProgress", "deadline": PAST},
    {"priority": 1, "taskState": "Done", "deadline": PAST},
    {"priority": 3, "taskState": "InProgress", "deadline": FUTURE},
    {"priority": 1, "taskState": "Cancelled"},
)
"""Task specs whose derived state does not change while a run lasts (deadlines far away)."""


class TaskScenario:
    name = "task"
    resources: tuple[str, ...] = ("tasks",)
    actions: tuple[str, ...] = ("create", "update", "delete", "recreate")
    objects = 3

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.namespace = ""
        self._specs = itertools.cycle(SPECS)

    @property
    def _base(self) -> str:
        return f"/apis/tasks.crpy.io/v1/namespaces/{self.namespace}/tasks"

    async def setup(self, manager: Manager, client: Client, namespace: str) -> None:
        self.namespace = namespace
        await setup_task_controller(manager, client, options=OPTIONS)

    async def _create(self, index: int) -> None:
        body = {
            "apiVersion": TASK_API_VERSION,
            "kind": "Task",
            "metadata": {"name": f"t{index}"},
            "spec": next(self._specs),
        }
        with contextlib.suppress(AlreadyExistsError):
            await self.transport.request("POST", self._base, body=body)

    async def act(self, action: str, index: int) -> None:
        if action == "create":
            await self._create(index)
        elif action == "update":
            await self.transport.request(
                "PUT",
                f"{self._base}/t{index}",
                body=await self._with_next_spec(index),
            )
        elif action == "delete":
            await self.transport.request("DELETE", f"{self._base}/t{index}")
        else:
            with contextlib.suppress(NotFoundError):
                await self.transport.request("DELETE", f"{self._base}/t{index}")
            await self._create(index)

    async def _with_next_spec(self, index: int) -> Obj:
        task: Obj = await self.transport.get_json(f"{self._base}/t{index}")
        task["spec"] = next(self._specs)
        return task

    async def violations(self) -> list[str]:
        return []  # the Task controller has no external effect besides its status

    async def unconverged(self) -> list[str]:
        listed = await self.transport.get_json(self._base)
        now = datetime.now(UTC)
        out: list[str] = []
        for task in listed.get("items") or []:
            meta = task["metadata"]
            want, _ = derive_status(task, now)
            have = task.get("status") or {}
            if have.get("observedGeneration") != meta.get("generation"):
                out.append(
                    f"Task {meta['name']} observedGeneration {have.get('observedGeneration')} "
                    f"!= generation {meta.get('generation')}"
                )
            elif have.get("state") != want["state"]:
                out.append(f"Task {meta['name']} state {have.get('state')} != {want['state']}")
            elif _overdue(have) != (want["state"] == "Overdue"):
                out.append(f"Task {meta['name']} Overdue condition inconsistent with its state")
        return out

    async def teardown(self) -> None:
        return None


def _overdue(status: Obj) -> bool:
    return any(
        c.get("type") == "Overdue" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


class BindingScenario:
    name = "binding"
    resources: tuple[str, ...] = (
        "servicebindings",
        "postgresusers",
        "secrets",
        "postgresinstances",
    )
    actions: tuple[str, ...] = ("create", "delete", "recreate")
    objects = 2

    def __init__(
        self, transport: Transport, server: LocalPostgres, *, play_collector: bool = True
    ) -> None:
        self.transport = transport
        self.server = server
        self.play_collector = play_collector
        """Delete a gone binding's dependents in the garbage collector's place: on the local
        control plane (no controller-manager); on a cluster that runs one, its collector does
        it and convergence waits for that."""
        self.namespace = ""
        self._passwords: dict[str, str] = {}
        self.collected = 0
        """Dependents deleted in the garbage collector's place (``collect_binding_orphans``)."""

    @property
    def _bindings(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/servicebindings"

    async def setup(self, manager: Manager, client: Client, namespace: str) -> None:
        self.namespace = namespace
        await create_external_instance(
            self.transport, self.server, namespace, field_manager="fuzzer"
        )
        for setup in (setup_instance_controller, setup_user_controller, setup_binding_controller):
            await setup(manager, client, options=OPTIONS)

    def role(self, index: int) -> str:
        return identifier_from(self.namespace, f"b{index}")

    async def _create(self, index: int) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": "ServiceBinding",
            "metadata": {"name": f"b{index}"},
            "spec": {"instanceRef": {"name": "db"}},
        }
        with contextlib.suppress(ConflictError):
            await self.transport.request("POST", self._bindings, body=body)

    async def act(self, action: str, index: int) -> None:
        if action in ("delete", "recreate"):
            with contextlib.suppress(NotFoundError):
                await self.transport.request("DELETE", f"{self._bindings}/b{index}")
        if action in ("create", "recreate"):
            await self._create(index)

    async def _secrets(self) -> list[Obj]:
        listed = await self.transport.get_json(f"/api/v1/namespaces/{self.namespace}/secrets")
        return [s for s in listed.get("items") or [] if s["metadata"]["name"] != "db-admin"]

    async def violations(self) -> list[str]:
        out: list[str] = []
        owners: dict[str, list[str]] = {}
        for secret in await self._secrets():
            meta = secret["metadata"]
            for ref in meta.get("ownerReferences") or []:
                if ref.get("controller"):
                    owners.setdefault(ref["uid"], []).append(meta["name"])
            password = decode_secret(secret).get("password", "")
            before = self._passwords.setdefault(meta["uid"], password)
            if before != password:
                out.append(f"Secret {meta['name']} ({meta['uid']}) changed its password")
        out.extend(
            f"binding {uid} controls {len(names)} Secrets: {sorted(names)}"
            for uid, names in owners.items()
            if len(names) > 1
        )
        return out

    async def unconverged(self) -> list[str]:
        if self.play_collector:  # the garbage collector's part (kubernetes#77988)
            self.collected += await collect_binding_orphans(self.transport, self.namespace)
        out: list[str] = []
        listed = await self.transport.get_json(self._bindings)
        bindings = {b["metadata"]["name"]: b for b in listed.get("items") or []}
        secrets = {s["metadata"]["name"]: s for s in await self._secrets()}
        users = await self.transport.get_json(
            f"/apis/{API_VERSION}/namespaces/{self.namespace}/postgresusers"
        )
        user_names = {u["metadata"]["name"] for u in users.get("items") or []}
        roles = await asyncio.to_thread(self._roles)
        for index in range(self.objects):
            name, role = f"b{index}", self.role(index)
            binding = bindings.get(name)
            secret = secrets.get(f"{name}-credentials")
            if binding is None:
                for what, present in (
                    ("Secret", secret is not None),
                    ("PostgresUser", name in user_names),
                    ("role", role in roles),
                ):
                    if present:
                        out.append(f"binding {name} is gone but its {what} remains")
                continue
            if not _ready(binding):
                out.append(f"binding {name} not Ready")
            elif secret is None or role not in roles:
                out.append(f"binding {name} Ready without its Secret or role")
            elif not await asyncio.to_thread(
                self._logs_in, role, decode_secret(secret).get("password", "")
            ):
                out.append(f"role {role} does not log in with the password in its Secret")
        return out

    def _roles(self) -> set[str]:
        prefix = identifier_from(self.namespace, "")
        with psycopg.connect(**self.server.conninfo()) as conn:  # type: ignore[arg-type]
            rows = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (f"{prefix}%",)
            ).fetchall()
        return {row[0] for row in rows}

    def _logs_in(self, role: str, password: str) -> bool:
        try:
            with psycopg.connect(
                host=self.server.host,
                port=self.server.port,
                user=role,
                password=password,
                dbname="postgres",
                connect_timeout=5,
            ):
                return True
        except psycopg.OperationalError:
            return False

    async def teardown(self) -> None:
        if self.namespace:
            await asyncio.to_thread(self._drop_roles)

    def _drop_roles(self) -> None:
        """Drop what a failed run left behind (a converged run leaves nothing)."""
        roles = self._roles()
        if not roles:
            return
        with psycopg.connect(**self.server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
            databases = [
                row[0]
                for row in conn.execute(
                    "SELECT datname FROM pg_database WHERE datallowconn"
                ).fetchall()
            ]
        for database in databases:
            with psycopg.connect(**self.server.conninfo(database), autocommit=True) as conn:  # type: ignore[arg-type]
                for role in roles:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
        with psycopg.connect(**self.server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
            for role in roles:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


def _ready(obj: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )
