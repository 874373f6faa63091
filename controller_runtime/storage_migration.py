"""Storage-version migration: rewrite every object of a CRD that etcd still holds in a version
other than the storage version, then drop that version from the CRD's ``status.storedVersions``.

When a CRD's storage version changes (``v1alpha1`` → ``v1beta1``), the objects written before
stay in etcd in the old version: the API server converts them on every read (through the
conversion webhook, when there is one), and the old version cannot be removed from the CRD
while ``status.storedVersions`` lists it. Kubernetes' answer is to rewrite each object once:
a PUT of the object as read (no change) makes the API server encode it anew, in the storage
version (the bytes differ, so the write happens). This is what kube-storage-version-migrator
does; :class:`StorageVersionMigrator` does it from the operator, as a leader-only runnable::

    manager.add(StorageVersionMigrator(manager.client, ["postgresinstances.postgres.crpy.io"]))

For each CRD, in order: read it; if ``status.storedVersions`` is exactly the storage version,
there is nothing to do; else list every object (in the storage version, all namespaces, paged)
and PUT each one back unchanged (a conflict or a 404 means someone else wrote or deleted it
since: it is then stored in the storage version already, so it is skipped); then a merge
patch of the CRD's status sets ``storedVersions`` to the storage version alone, conditioned on
the CRD's ``resourceVersion`` read at the start (if the CRD changed meanwhile, the pass starts
over).

Guarantees: an object's content never changes (the PUT sends what was read, with its
resourceVersion as a precondition: nothing written by anyone else is overwritten);
``storedVersions`` is narrowed only after every object that existed when the pass began was
rewritten or found rewritten; a failed pass (the API server unreachable, the conversion webhook
down) is retried with backoff (1 s doubling to 5 min) until it succeeds or the runnable stops;
nothing raises out of :meth:`StorageVersionMigrator.start`. Needs: ``get`` on the CRDs
(``customresourcedefinitions``, by name), ``patch`` on ``customresourcedefinitions/status``,
``list`` and ``update`` on each kind. Caveats: the list holds one page (500) at a time of the
request but all objects' bodies in memory until the pass ends (one kind at a time); an object
whose read needs the conversion webhook fails the pass until the webhook answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller_runtime.client import Client
from kubeclient.errors import ConflictError, NotFoundError

__all__ = [
    "MigrationPlan",
    "MigrationResult",
    "StorageVersionMigrator",
    "migrate",
    "plan_migration",
]

log = logging.getLogger("controller_runtime.storage_migration")

CRD_API_VERSION = "apiextensions.k8s.io/v1"
CRD_KIND = "CustomResourceDefinition"


@dataclass(frozen=True)
class MigrationPlan:
    """What one CRD needs: its objects rewritten in ``storage_version``, then
    ``status.storedVersions`` narrowed from ``stored_versions`` to it."""

    crd_name: str
    api_version: str
    kind: str
    storage_version: str
    stored_versions: tuple[str, ...]
    resource_version: str


def plan_migration(crd: Mapping[str, Any]) -> MigrationPlan | None:
    """The migration a CRD needs, or ``None`` (every object is stored in the storage version,
    or the CRD has no storage version this can name). Pure."""
    spec = crd.get("spec") or {}
    storage = [
        v.get("name")
        for v in spec.get("versions") or []
        if isinstance(v, Mapping) and v.get("storage")
    ]
    if len(storage) != 1 or not isinstance(storage[0], str):
        return None
    version: str = storage[0]
    stored = tuple((crd.get("status") or {}).get("storedVersions") or ())
    if stored == (version,) or not stored:
        return None
    meta = crd.get("metadata") or {}
    names = spec.get("names") or {}
    return MigrationPlan(
        crd_name=str(meta.get("name", "")),
        api_version=f"{spec.get('group')}/{version}",
        kind=str(names.get("kind", "")),
        storage_version=version,
        stored_versions=stored,
        resource_version=str(meta.get("resourceVersion", "")),
    )


@dataclass
class MigrationResult:
    """One CRD's pass: objects rewritten, objects someone else had written or deleted."""

    rewritten: int = 0
    skipped: int = 0


async def migrate(client: Client, crd_name: str) -> MigrationResult | None:
    """One pass over one CRD (see the module docs); ``None`` when nothing was needed. Raises
    what the API server answers (the runnable retries); a conflict on the CRD's status patch
    raises :class:`ConflictError` (the CRD changed: start over)."""
    crd = await client.live.get(CRD_API_VERSION, CRD_KIND, name=crd_name)
    plan = plan_migration(crd)
    if plan is None:
        return None
    log.info(
        "migrating %s from stored versions %s to %s",
        crd_name,
        ", ".join(plan.stored_versions),
        plan.storage_version,
    )
    result = MigrationResult()
    for obj in await client.live.list(plan.api_version, plan.kind):
        try:
            await client.update(obj)
        except (ConflictError, NotFoundError):
            result.skipped += 1
        else:
            result.rewritten += 1
    await client.patch_status(
        crd,
        {
            "metadata": {"resourceVersion": plan.resource_version},
            "status": {"storedVersions": [plan.storage_version]},
        },
    )
    log.info(
        "migrated %s: %d objects rewritten in %s, %d already rewritten by others",
        crd_name,
        result.rewritten,
        plan.storage_version,
        result.skipped,
    )
    return result


class StorageVersionMigrator:
    """A leader-only runnable that migrates ``crd_names`` once per start (see the module
    docs). ``done`` is set when every CRD is migrated (or needed nothing).

    Defaults: retries back off from ``initial_delay`` 1 s, doubling, to ``max_delay`` 300 s,
    with jitter."""

    need_leader_election = True

    def __init__(
        self,
        client: Client,
        crd_names: Sequence[str],
        *,
        initial_delay: float = 1.0,
        max_delay: float = 300.0,
    ) -> None:
        self._client = client
        self._crd_names = tuple(crd_names)
        self._initial_delay = initial_delay
        self._max_delay = max_delay
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()
        self.results: dict[str, MigrationResult | None] = {}

    async def start(self) -> None:
        """Start migrating in the background (returns at once: the controllers start beside
        it, reading the objects converted meanwhile)."""
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="storage-version-migration")

    async def _run(self) -> None:
        """Migrate every CRD, retrying each until it succeeds or :meth:`stop` is called."""
        for name in self._crd_names:
            delay = self._initial_delay
            while not self._stopping.is_set():
                try:
                    self.results[name] = await migrate(self._client, name)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    log.warning(
                        "storage migration of %s failed (%s: %s); retrying in %.0f s",
                        name,
                        type(err).__name__,
                        err,
                        delay,
                    )
                    await self._sleep(delay * random.uniform(0.8, 1.2))
                    delay = min(delay * 2, self._max_delay)
            if self._stopping.is_set():
                return
        self.done.set()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def stop(self, drain_timeout: float | None) -> None:
        """Stop: a pass in flight is cancelled (an object PUT half-way is either written or
        not; the next start redoes the pass)."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
