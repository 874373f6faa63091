"""The Backup controller never runs a second Job for one Backup, even on a stale cache.

A directed test of what ``make chaos`` seed 48 found by chance (``docs/reliability.md``): the
Backup's Job is deleted while the Backups cache has not yet seen the status write that named
the Job. Backups reach the cache 3 s late here, so the reconcile that the Job's deletion
triggers reads the Backup as it was before its Job existed, every time.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from controllers.postgres.api import API_VERSION, BACKUP_FINALIZER
from kubeclient.config import ClusterConfig
from kubeclient.transport import Transport
from tests.integration.stalecache.backup_scenario import STORAGE, BackupScenario, _controller_uid
from tests.integration.stalecache.harness import StaleReads, _create_namespace, _operator
from tests.integration.stalecache.test_fuzz import make_scenario

pytestmark = pytest.mark.integration

BACKUPS_LAG = 3.0
"""Seconds every Backup event reaches the cache late: longer than a reconcile takes to create
the Job and write the status, so the status write is still on its way when the Job is
deleted."""
WITHIN = 30.0


async def _jobs_of(scenario: BackupScenario, owner: str) -> set[str]:
    """UIDs of the Jobs controlled by the Backup with UID ``owner``."""
    jobs = await scenario._list(scenario._jobs)
    return {job["metadata"]["uid"] for job in jobs if _controller_uid(job) == owner}


@pytest.mark.parametrize("guard", [True, False], ids=["guard-on", "guard-off"])
async def test_backup_job_deleted_before_the_cache_saw_the_status_naming_it(
    admin_config: ClusterConfig, transport: Transport, request: pytest.FixtureRequest, guard: bool
) -> None:
    scenario = make_scenario("backup", transport, request)
    assert isinstance(scenario, BackupScenario)
    namespace = await _create_namespace(transport)
    try:
        async with _operator(admin_config, scenario, namespace, guard, StaleReads()) as (
            manager,
            lagging,
        ):
            await manager.cache.wait_for_sync(60)
            lagging.set_lag("backups", BACKUPS_LAG)
            # Created with the controller's finalizer already on: the first reconcile goes
            # straight to the Job and the status write, with no finalizer write in between.
            body = {
                "apiVersion": API_VERSION,
                "kind": "Backup",
                "metadata": {"name": "m9", "finalizers": [BACKUP_FINALIZER]},
                "spec": {"instanceRef": {"name": "db"}, "storage": STORAGE},
            }
            created = (await transport.request("POST", scenario._backups, body=body)).json()
            owner = created["metadata"]["uid"]
            backup_path = f"{scenario._backups}/m9"
            job_path = f"{scenario._jobs}/m9-backup"
            started = time.monotonic()
            first: set[str] = set()
            job_name = None
            while time.monotonic() - started < WITHIN:
                await asyncio.sleep(0.1)  # polling the API server for the Job and the status
                first = await _jobs_of(scenario, owner)
                backup = await scenario._get(backup_path)
                job_name = ((backup or {}).get("status") or {}).get("jobName")
                if first and job_name:
                    break
            assert len(first) == 1, f"no Job for the Backup within {WITHIN:.0f}s"
            assert job_name == "m9-backup", f"no status naming the Job within {WITHIN:.0f}s"
            # The status naming the Job is on the server, and the cache sees it only later.
            await transport.request("DELETE", job_path, body={"propagationPolicy": "Background"})
            seen: set[str] = set(first)
            phase = None
            while time.monotonic() - started < WITHIN + BACKUPS_LAG:
                await asyncio.sleep(0.2)  # polling the API server for the outcome
                seen |= await _jobs_of(scenario, owner)
                backup = await scenario._get(backup_path)
                phase = ((backup or {}).get("status") or {}).get("phase")
                if len(seen) > 1 or phase == "Failed":
                    break
            assert len(seen) == 1, f"the Backup ran {len(seen)} Jobs"
            assert phase == "Failed", f"the Backup is {phase!r}, not Failed (its Job is gone)"
            assert backup is not None
            assert "disappeared" in str((backup.get("status") or {}).get("conditions"))
    finally:
        await scenario.teardown()
        await transport.request("DELETE", f"/api/v1/namespaces/{namespace}")
