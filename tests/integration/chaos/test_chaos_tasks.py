"""The chaos suite: three leader-elected replicas of ``python -m controllers`` (two with short
lease timings, one with the defaults), each behind its own FaultProxy, on a control plane of
their own whose API server writes an audit log. A loader keeps creating, updating, deleting
and re-creating Tasks while faults happen at random times drawn from a printed seed.

After the last fault, every Task must converge within :data:`CONVERGE_WITHIN` seconds
(observedGeneration = generation, the state :func:`~controllers.task.derive_status` gives,
the Overdue condition consistent); the audit log must show no Task status write by a replica
that did not hold the Lease at that moment; every replica still running must be ready and
serve its metrics.

Environment: ``CHAOS_SEED`` (default: random, printed), ``CHAOS_TASKS`` (default 200),
``CHAOS_SECONDS`` of faults (default 20). ``make chaos`` runs 2000 Tasks for 60 s. A failing
run prints the command that repeats its seed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane
from controllers.task import TASK_API_VERSION, derive_status
from kubeclient.errors import ApiError
from tests.integration.chaos.cluster import SEED, TASKS, TIMEOUT, Chaos, replicas, run_chaos

pytestmark = pytest.mark.integration

SPECS: tuple[dict[str, Any], ...] = (
    {"priority": 1},
    {"priority": 2, "taskState": "InProgress", "deadline": "2020-01-01T00:00:00Z"},
    {"priority": 1, "taskState": "Done"},
    {"priority": 3, "taskState": "InProgress", "deadline": "2099-01-01T00:00:00Z"},
    {"priority": 1, "taskState": "Cancelled"},
)


@pytest.fixture
async def chaos(audited_plane: tuple[ControlPlane, Path]) -> AsyncIterator[Chaos]:
    async with replicas(audited_plane, "chaos-tasks", "task") as running:
        yield running


# -- the loader --------------------------------------------------------------------------------


async def load(chaos: Chaos, stop: asyncio.Event) -> None:
    """Create every Task, then keep updating, deleting and re-creating them until ``stop``;
    API errors (the server may be down) are counted and the loader goes on."""
    base = f"/apis/tasks.crpy.io/v1/namespaces/{chaos.namespace}/tasks"
    rng = random.Random(SEED + 1)

    async def call(op: str, method: str, path: str, body: Any = None) -> None:
        try:
            await chaos.admin.request(method, path, body=body)
            chaos.loader_ops[op] += 1
        except (ApiError, OSError, TimeoutError):
            chaos.loader_ops[f"{op}-failed"] += 1

    def task(i: int) -> dict[str, Any]:
        return {
            "apiVersion": TASK_API_VERSION,
            "kind": "Task",
            "metadata": {"name": f"t{i}"},
            "spec": rng.choice(SPECS),
        }

    sem = asyncio.Semaphore(16)

    async def create(i: int) -> None:
        async with sem:
            await call("create", "POST", base, task(i))

    await asyncio.gather(*(create(i) for i in range(TASKS)))
    while not stop.is_set():
        i = rng.randrange(TASKS)
        choice = rng.random()
        if choice < 0.7:
            spec = rng.choice(SPECS)
            patch = {"spec": {"taskState": None, "deadline": None, **spec}}
            try:
                await chaos.admin.request(
                    "PATCH", f"{base}/t{i}", body=patch,
                    content_type="application/merge-patch+json",
                )  # fmt: skip
                chaos.loader_ops["update"] += 1
            except (ApiError, OSError, TimeoutError):
                chaos.loader_ops["update-failed"] += 1
        elif choice < 0.85:
            await call("delete", "DELETE", f"{base}/t{i}")
        else:
            await call("delete", "DELETE", f"{base}/t{i}")
            await call("recreate", "POST", base, task(i))
        await asyncio.sleep(0.02)  # pacing: about 50 writes a second


async def unconverged(chaos: Chaos) -> list[str]:
    path = f"/apis/tasks.crpy.io/v1/namespaces/{chaos.namespace}/tasks"
    listed = await chaos.admin.get_json(path)
    now = datetime.now(UTC)
    out = []
    for task in listed.get("items") or []:
        want, _ = derive_status(task, now)
        have = task.get("status") or {}
        overdue = any(
            c.get("type") == "Overdue" and c.get("status") == "True"
            for c in have.get("conditions") or []
        )
        if (
            have.get("observedGeneration") != task["metadata"].get("generation")
            or have.get("state") != want["state"]
            or overdue != (want["state"] == "Overdue")
        ):
            meta = task["metadata"]
            out.append(
                f"{meta['name']} (generation {meta.get('generation')}, observed "
                f"{have.get('observedGeneration')}, state {have.get('state')}, want "
                f"{want['state']})"
            )
    return out


@pytest.mark.timeout(TIMEOUT)
async def test_tasks_converge_after_chaos_and_only_the_leader_writes(chaos: Chaos) -> None:
    await run_chaos(chaos, load, unconverged, TASKS)
