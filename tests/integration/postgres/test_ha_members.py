"""The members' side of failover against real PostgreSQL and the real API server: the
supervisor and the agent of three members (tests/integration/postgres/members.py) follow what
is written in the instance's status, here written by the test as the operator would.

- bootstrap: the target initializes and serves as primary; once the phase is Healthy the
  others clone it and stream from it;
- switchover by hand: ``pending`` plus a fence stops the primary cleanly (it reports its final
  LSN, which a standby already has), the standbys stop streaming; naming a standby promotes it
  on a new timeline; Healthy makes the old primary rewind and follow it, with every row;
- a primary whose agent cannot read the API server stops accepting commits within the
  isolation bound (10 s) of its last confirming read, and serves again once it reads again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

from controllers.postgres.api import API_VERSION, INSTANCE
from controllers.postgres.standing import ISOLATION_BOUND
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport
from tests.integration.postgres.members import LocalMembers, local_members

pytestmark = pytest.mark.integration

NAME = "db"
SPEC: dict[str, Any] = {
    "version": "15",
    "replicas": 3,
    "replication": {"synchronous": {"number": 1}},
}


async def create_instance(transport: Transport, namespace: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": API_VERSION,
        "kind": INSTANCE,
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": spec,
    }
    await transport.request(
        "POST", f"/apis/{API_VERSION}/namespaces/{namespace}/postgresinstances", body=body
    )


async def write_standing(transport: Transport, namespace: str, **status: Any) -> None:
    """Merge-patch the instance's status, as the operator writes it."""
    await transport.request(
        "PATCH",
        f"/apis/{API_VERSION}/namespaces/{namespace}/postgresinstances/{NAME}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


async def until(
    check: Callable[[], Awaitable[bool]], what: str, members: LocalMembers, timeout: float = 60
) -> float:
    """Poll ``check`` (the members' reports have no watch) until true; the seconds taken."""
    started = time.monotonic()
    while not await _checked(check):
        if time.monotonic() - started > timeout:
            reports = [await members.status(i) for i in range(len(members.members))]
            pytest.fail(f"{what}: not within {timeout} s\nreports: {reports}\n{members.logs()}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def _checked(check: Callable[[], Awaitable[bool]]) -> bool:
    """``check()``, false when it could not connect (a member restarting on the way)."""
    try:
        return await check()
    except (psycopg.Error, OSError):
        return False


def role(report: dict[str, Any] | None) -> tuple[str, bool, str | None] | None:
    if report is None:
        return None
    return report["role"], report["ready"], report.get("streamingFrom")


async def bootstrapped(transport: Transport, namespace: str, members: LocalMembers) -> None:
    await write_standing(transport, namespace, targetPrimary="db-0", ha={"phase": "Bootstrap"})

    async def primary_ready() -> bool:
        return role(await members.status(0)) == ("primary", True, None)

    await until(primary_ready, "db-0 serving as primary", members)
    await write_standing(
        transport,
        namespace,
        currentPrimary="db-0",
        ha={"phase": "Healthy", "timeline": 1, "fenced": []},
    )

    async def streaming() -> bool:
        roles = [role(await members.status(i)) for i in (1, 2)]
        return roles == [("standby", True, "db-0")] * 2

    await until(streaming, "db-1 and db-2 streaming from db-0", members, timeout=90)


async def test_bootstrap_switchover_and_rejoin(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    await create_instance(transport, namespace, SPEC)
    async with local_members(admin_config, namespace, NAME, 3, SPEC) as members:
        await bootstrapped(transport, namespace, members)
        await members.query(0, "CREATE TABLE t (id int PRIMARY KEY)")
        await members.query(0, "INSERT INTO t SELECT generate_series(1, 100)")
        sync = await members.query(0, "SELECT sync_state FROM pg_stat_replication ORDER BY 1")
        assert sorted(s for (s,) in sync) == ["potential", "sync"]

        # Fence db-0 (a switchover's first step).
        await write_standing(
            transport,
            namespace,
            targetPrimary="pending",
            ha={"phase": "Fencing", "fenced": ["db-0"]},
        )

        async def fenced() -> bool:
            report = await members.status(0)
            return report is not None and report["role"] == "fenced"

        await until(fenced, "db-0 stopped and reporting its final LSN", members)
        final = await members.status(0)
        assert final is not None and final["positionKnown"] and final["receivedLsn"] > 0

        async def nobody_streams() -> bool:
            reports = [await members.status(i) for i in (1, 2)]
            return all(r is not None and r["streamingFrom"] is None for r in reports)

        await until(nobody_streams, "the standbys stop streaming", members)
        for i in (1, 2):
            report = await members.status(i)
            assert report is not None and report["receivedLsn"] >= final["receivedLsn"], (
                f"db-{i} lacks WAL the fenced primary had: {report} < {final}"
            )

        # Promote db-1.
        await write_standing(transport, namespace, targetPrimary="db-1", ha={"phase": "Promoting"})

        async def promoted() -> bool:
            report = await members.status(1)
            return report is not None and report["role"] == "primary" and report["ready"]

        await until(promoted, "db-1 promoted", members)
        report = await members.status(1)
        assert report is not None and report["timeline"] == 2
        await write_standing(
            transport,
            namespace,
            currentPrimary="db-1",
            ha={"phase": "Healthy", "timeline": 2, "fenced": ["db-0"]},
        )

        async def followers() -> bool:
            roles = [role(await members.status(i)) for i in (0, 2)]
            return roles == [("standby", True, "db-1")] * 2

        await until(followers, "db-0 (rewound) and db-2 following db-1", members, timeout=90)
        await members.query(1, "INSERT INTO t VALUES (101)")
        for i in (0, 2):

            async def has_all(i: int = i) -> bool:
                rows = await members.query(i, "SELECT count(*) FROM t")
                return rows == [(101,)]

            await until(has_all, f"db-{i} has every row", members)
        assert await members.query(0, "SELECT pg_is_in_recovery()") == [(True,)]


async def test_an_isolated_primary_stops_accepting_commits_within_the_bound(
    admin_config: ClusterConfig, transport: Transport, namespace: str
) -> None:
    spec = {**SPEC, "replication": {}}  # asynchronous: only the lease stops commits
    await create_instance(transport, namespace, spec)
    async with local_members(admin_config, namespace, NAME, 3, spec) as members:
        await bootstrapped(transport, namespace, members)
        await members.query(0, "CREATE TABLE t (id int)")
        cut_at = time.monotonic()
        members.cut_agent(0)
        last_ack = cut_at
        async with await psycopg.AsyncConnection.connect(
            **members.conninfo(0), autocommit=True
        ) as conn:
            with pytest.raises(psycopg.OperationalError):
                for _ in range(10_000):
                    await conn.execute("INSERT INTO t VALUES (1)")
                    last_ack = time.monotonic()
                    await asyncio.sleep(0.02)
        # The agent's last confirming read started at most one round (1 s) before the cut.
        assert last_ack - cut_at < ISOLATION_BOUND, (
            f"db-0 acknowledged a commit {last_ack - cut_at:.1f} s after its agent lost the "
            f"API server\n{members.logs()}"
        )

        async def stopped() -> bool:
            report = await members.status(0)
            return report is not None and report["role"] == "starting"

        # Stopped without a clean shutdown: not fenced, position unknown, never "primary"
        # again until a read that comes after this report grants it.
        await until(stopped, "db-0 reporting it stopped", members, timeout=10)
        members.cut_agent(0, cut=False)

        async def serving() -> bool:
            return role(await members.status(0)) == ("primary", True, None)

        await until(serving, "db-0 serving again once it reads its standing", members)
        await members.query(0, "INSERT INTO t VALUES (2)")
