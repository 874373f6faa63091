"""The chaos suite on the PostgreSQL controllers (instance, user, binding) with a real
PostgreSQL: three leader-elected replicas (``cluster.py``) while a loader creates, deletes
and re-creates ServiceBindings under the same faults as the Task run.

At the end every binding is Ready, its role exists (once: roles are unique by name) and logs
in with the password in its Secret, the binding controls exactly one Secret, and nothing is
left of a binding that no longer exists (no Secret, no PostgresUser, no orphan role). Only
the Lease holder wrote bindings, users and Secrets (the audit log).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from controller_runtime.envtest import ControlPlane
from controllers.postgres.api import API_VERSION, identifier_from
from controllers.postgres.common import decode_secret
from controllers.postgres.localserver import LocalPostgres
from kubeclient.errors import ApiError
from tests.integration.chaos.cluster import (
    BINDINGS,
    CONVERGE_WITHIN,
    FAULT_SECONDS,
    SEED,
    TIMEOUT,
    Chaos,
    replicas,
    run_chaos,
)
from tests.support import collect_binding_orphans, create_external_instance

# make chaos only: seed 2 (a SIGKILL of the leader, a compaction and an API-server restart)
# left a binding not Ready after 120 s; see docs/reliability.md.
pytestmark = [pytest.mark.integration, pytest.mark.chaos_only]

CONVERGE_BINDINGS = CONVERGE_WITHIN + FAULT_SECONDS
"""Seconds the bindings have after the last fault: the Tasks' bound plus the fault window. A
binding whose reconciles kept failing through the faults (its writes, or PostgreSQL, out of
reach) waits out its per-item backoff as in controller-runtime (5 ms doubling, so the next
retry comes about as long after the last failure as the failures lasted), unless an event
for it comes first; the backoff is not reset when the API server is reachable again."""

CONTROLLERS = "postgres-instance,postgres-user,service-binding"


@pytest.fixture
async def chaos(
    audited_plane: tuple[ControlPlane, Path], postgres_server: LocalPostgres
) -> AsyncIterator[Chaos]:
    async with replicas(audited_plane, "chaos-bindings", CONTROLLERS) as running:
        await _prepare(running, postgres_server)
        yield running


async def _prepare(chaos: Chaos, server: LocalPostgres) -> None:
    await create_external_instance(chaos.admin, server, chaos.namespace, field_manager="chaos")


def _bindings_path(chaos: Chaos) -> str:
    return f"/apis/{API_VERSION}/namespaces/{chaos.namespace}/servicebindings"


async def load(chaos: Chaos, stop: asyncio.Event) -> None:
    """Create every binding, then delete and re-create them until ``stop``."""
    base = _bindings_path(chaos)
    rng = random.Random(SEED + 2)

    async def call(op: str, method: str, path: str, body: Any = None) -> None:
        try:
            await chaos.admin.request(method, path, body=body)
            chaos.loader_ops[op] += 1
        except (ApiError, OSError, TimeoutError):
            chaos.loader_ops[f"{op}-failed"] += 1

    def binding(i: int) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "ServiceBinding",
            "metadata": {"name": f"b{i}"},
            "spec": {"instanceRef": {"name": "db"}},
        }

    for i in range(BINDINGS):
        await call("create", "POST", base, binding(i))
    while not stop.is_set():
        i = rng.randrange(BINDINGS)
        choice = rng.random()
        if choice < 0.4:
            await call("delete", "DELETE", f"{base}/b{i}")
        elif choice < 0.8:
            await call("delete", "DELETE", f"{base}/b{i}")
            await call("recreate", "POST", base, binding(i))
        else:
            await call("create", "POST", base, binding(i))
        await asyncio.sleep(0.2)  # pacing: each binding costs a role and a Secret


def _roles(server: LocalPostgres, prefix: str) -> set[str]:
    with psycopg.connect(**server.conninfo()) as conn:  # type: ignore[arg-type]
        rows = conn.execute(
            "SELECT rolname FROM pg_roles WHERE starts_with(rolname, %s)", (prefix,)
        ).fetchall()
    return {row[0] for row in rows}


def _logs_in(server: LocalPostgres, role: str, password: str) -> bool:
    try:
        with psycopg.connect(
            host=server.host,
            port=server.port,
            user=role,
            password=password,
            dbname="postgres",
            connect_timeout=5,
        ):
            return True
    except psycopg.OperationalError:
        return False


def _ready(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _ready_reason(obj: dict[str, Any]) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return f"{c.get('reason')}: {c.get('message')}"
    return "no Ready condition"


def make_check(server: LocalPostgres) -> Any:
    collected = 0

    async def unconverged(chaos: Chaos) -> list[str]:
        nonlocal collected
        ns = chaos.namespace
        # The garbage collector's part (none runs here): dependents of bindings the API server
        # deleted although their finalizer was added concurrently (see collect_binding_orphans).
        now = await collect_binding_orphans(chaos.admin, ns)
        if now:
            collected += now
            print(f"chaos: collected {now} dependents of deleted bindings ({collected} in all)")
        bindings = {
            b["metadata"]["name"]: b
            for b in (await chaos.admin.get_json(_bindings_path(chaos))).get("items") or []
        }
        secrets = [
            s
            for s in (await chaos.admin.get_json(f"/api/v1/namespaces/{ns}/secrets")).get("items")
            or []
            if s["metadata"]["name"] != "db-admin"
        ]
        users = await chaos.admin.get_json(f"/apis/{API_VERSION}/namespaces/{ns}/postgresusers")
        user_names = {u["metadata"]["name"] for u in users.get("items") or []}
        prefix = identifier_from(ns) + "_"
        roles = await asyncio.to_thread(_roles, server, prefix)
        out: list[str] = []
        controlled: dict[str, list[str]] = {}
        by_name = {s["metadata"]["name"]: s for s in secrets}
        for secret in secrets:
            for ref in secret["metadata"].get("ownerReferences") or []:
                if ref.get("controller"):
                    controlled.setdefault(ref["uid"], []).append(secret["metadata"]["name"])
        out.extend(
            f"binding {uid} controls {len(names)} Secrets"
            for uid, names in controlled.items()
            if len(names) > 1
        )
        expected_roles = set()
        for i in range(BINDINGS):
            name = f"b{i}"
            role = identifier_from(ns, name)
            binding = bindings.get(name)
            secret = by_name.get(f"{name}-credentials")
            if binding is None:
                leftovers = [
                    what
                    for what, present in (
                        ("Secret", secret is not None),
                        ("PostgresUser", name in user_names),
                        ("role", role in roles),
                    )
                    if present
                ]
                if leftovers:
                    out.append(f"{name} is gone but its {', '.join(leftovers)} remain")
                continue
            expected_roles.add(role)
            if not _ready(binding):
                out.append(f"{name} not Ready ({_ready_reason(binding)})")
            elif secret is None or role not in roles:
                out.append(f"{name} Ready without its Secret or role")
            elif not await asyncio.to_thread(
                _logs_in, server, role, decode_secret(secret).get("password", "")
            ):
                out.append(f"role {role} does not log in with the password in its Secret")
        out.extend(f"orphan role {r}" for r in sorted(roles - expected_roles))
        return out

    return unconverged


@pytest.mark.timeout(TIMEOUT)
async def test_bindings_converge_after_chaos_and_only_the_leader_writes(
    chaos: Chaos, postgres_server: LocalPostgres
) -> None:
    try:
        await run_chaos(
            chaos, load, make_check(postgres_server), BINDINGS, converge_within=CONVERGE_BINDINGS
        )
    finally:
        await asyncio.to_thread(_drop_roles, postgres_server, identifier_from(chaos.namespace))


def _drop_roles(server: LocalPostgres, prefix: str) -> None:
    """Leave the shared server as found (a passing run leaves no role; a failed one may)."""
    roles = _roles(server, prefix + "_")
    if not roles:
        return
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
        databases = [
            r[0]
            for r in conn.execute("SELECT datname FROM pg_database WHERE datallowconn").fetchall()
        ]
    for database in databases:
        with psycopg.connect(**server.conninfo(database), autocommit=True) as conn:  # type: ignore[arg-type]
            for role in roles:
                with contextlib.suppress(psycopg.Error):
                    conn.execute(
                        psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(role))
                    )
    with psycopg.connect(**server.conninfo(), autocommit=True) as conn:  # type: ignore[arg-type]
        for role in roles:
            with contextlib.suppress(psycopg.Error):
                conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))
