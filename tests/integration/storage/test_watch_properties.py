"""The informer's watch guarantees, checked on every backend through the fault proxy.

A seeded workload (creates, updates, deletes of ConfigMaps) runs in three phases against one
informer that watches through a :class:`FaultProxy`:

1. cuts: the proxy cuts every connection after every few writes; each re-watch resumes from
   the last resourceVersion the informer saw (no relist);
2. a relist: the informer is frozen off, the workload goes on, the API server is restarted
   (its watch cache is re-filled from the storage: a LIST and a new watch on the backend),
   the workload goes on, and the informer is let through again: its watch is now older than
   anything the new watch cache holds, so it gets 410 and relists;
3. cuts again.

Held at the end, from what the handler saw and what the server answered to each write:

* nothing duplicated: no (name, resourceVersion) reaches the handler twice, and per name the
  resourceVersions only grow (``ADDED`` first, ``DELETED`` last);
* nothing invented: every resourceVersion delivered is one the server gave that object;
* nothing lost while the watch resumes (phases 1 and 3): every version the server made is
  delivered; across the relist (phase 2) intermediate versions may collapse into the latest,
  which must be delivered, and objects deleted meanwhile must be reported deleted;
* no relist during phases 1 and 3, at least one in phase 2;
* the store ends equal to the server's state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane
from controller_runtime.envtest.faultproxy import FaultProxy
from informers.reflector_machine import ReflectorOptions
from informers.resource_version import compare_resource_versions
from informers.shared import SharedInformer
from informers.store import StoreDelta
from kubeclient.config import load_kubeconfig
from kubeclient.discovery import Discovery
from kubeclient.transport import Transport
from tests.integration.storage.conftest import plane_on
from tests.integration.test_informers import configmap, sum_samples

pytestmark = pytest.mark.integration

DEFAULT_SEED = 25
"""The workload is the same every run; ``STORAGE_WORKLOAD_SEED=<n>`` draws another."""
OPS_PER_PHASE = 60
CUT_EVERY = 10
SYNC_TIMEOUT = 90.0
QUICK_RETRIES = ReflectorOptions(backoff_initial=0.05, backoff_cap=0.5, backoff_reset_after=5.0)
"""Every cut counts as a failure and the backoff grows with each (0.8 s doubling, up to
[30, 60) s, reset after 2 min healthy): these cuts test what is resumed, not how long the
reflector waits, so its waits are kept short."""


@pytest.fixture(scope="module")
def restartable_plane(backend: str, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """Default API server flags (watch cache on); this module restarts its API server."""
    with plane_on(backend, request, crd_directory=None) as plane:
        yield plane


@dataclasses.dataclass
class Delivered:
    type: str
    name: str
    rv: str
    phase: int


@dataclasses.dataclass
class Workload:
    """A seeded sequence of writes; remembers every version the server made, per name."""

    transport: Transport
    base: str
    rng: random.Random
    versions: dict[str, list[tuple[int, str]]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )
    alive: set[str] = dataclasses.field(default_factory=set)
    deleted: dict[str, int] = dataclasses.field(default_factory=dict)
    created: int = 0
    newest: int = 0

    @property
    def last_rv(self) -> str:
        """The newest resourceVersion any write got (all are decimal on every backend)."""
        return str(self.newest)

    def _made(self, phase: int, obj: dict[str, Any]) -> None:
        rv = obj["metadata"]["resourceVersion"]
        self.versions[obj["metadata"]["name"]].append((phase, rv))
        self.newest = max(self.newest, int(rv))

    async def step(self, phase: int) -> None:
        roll = self.rng.random()
        if not self.alive or roll < 0.25:
            name = f"cm-{self.created:04d}"
            self.created += 1
            answer = await self.transport.request("POST", self.base, body=configmap(name))
            self.alive.add(name)
            self._made(phase, answer.json())
        elif roll < 0.85:
            name = self.rng.choice(sorted(self.alive))
            answer = await self.transport.request(
                "PATCH",
                f"{self.base}/{name}",
                body={"data": {"v": str(self.rng.random())}},
                content_type="application/merge-patch+json",
            )
            self._made(phase, answer.json())
        else:
            name = self.rng.choice(sorted(self.alive))
            await self.transport.request("DELETE", f"{self.base}/{name}")
            self.alive.discard(name)
            self.deleted[name] = phase


async def test_no_event_lost_duplicated_or_reordered_across_cuts_and_a_relist(
    backend: str, restartable_plane: ControlPlane
) -> None:
    plane = restartable_plane
    config = await load_kubeconfig(plane.kubeconfig)
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    seed = int(os.environ.get("STORAGE_WORKLOAD_SEED") or DEFAULT_SEED)
    print(f"workload seed {seed} on {backend}")
    async with (
        Transport(config) as admin,
        Transport(dataclasses.replace(config, server=proxy.url)) as proxied,
    ):
        ns = f"t-{uuid.uuid4().hex[:8]}"
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        workload = Workload(admin, f"/api/v1/namespaces/{ns}/configmaps", random.Random(seed))
        for _ in range(10):
            await workload.step(0)
        informer = SharedInformer(
            proxied,
            await Discovery(admin).resolve("v1", "ConfigMap"),
            namespace=ns,
            options=QUICK_RETRIES,
        )
        phase = 0
        seen: list[Delivered] = []

        def record(delta: StoreDelta, initial: bool) -> None:
            rv = delta.obj["metadata"]["resourceVersion"]
            seen.append(Delivered(delta.type, delta.key.split("/", 1)[1], rv, phase))

        informer.add_handler(record)
        informer.start()

        async def caught_up() -> None:
            assert await informer.store.wait_for_resource_version(
                workload.last_rv, timeout=SYNC_TIMEOUT
            ), f"the informer never reached {workload.last_rv}"

        def relists() -> float:
            return sum_samples("informer_relists_total", resource="configmaps")

        async def with_cuts(number: int) -> None:
            for i in range(OPS_PER_PHASE):
                await workload.step(number)
                if i % CUT_EVERY == CUT_EVERY - 1:
                    await caught_up()  # every watch delivered something before it is cut
                    proxy.cut_all()
            await caught_up()

        try:
            assert await informer.wait_for_sync(SYNC_TIMEOUT)
            phase = 1
            before = relists()
            await with_cuts(1)
            assert relists() == before, "a cut made the informer relist"

            phase = 2
            before = relists()
            proxy.freeze()
            for _ in range(OPS_PER_PHASE // 2):
                await workload.step(2)
            await asyncio.to_thread(plane.stop_apiserver)
            await asyncio.to_thread(plane.start_apiserver)
            for _ in range(OPS_PER_PHASE // 2):
                await workload.step(2)
            proxy.cut_all()
            proxy.thaw()
            await caught_up()
            assert relists() > before, "the informer resumed a watch older than the new cache"

            phase = 3
            before = relists()
            await with_cuts(3)
            assert relists() == before, "a cut made the informer relist"

            listed = (await admin.request("GET", workload.base)).json()["items"]
            on_server = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in listed}
            in_store = {
                o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                for o in informer.store.list()
            }
            assert in_store == on_server
        finally:
            await informer.stop()
            await proxy.stop()

    check_history(seen, workload)


def check_history(seen: list[Delivered], workload: Workload) -> None:
    by_name: dict[str, list[Delivered]] = defaultdict(list)
    for event in seen:
        by_name[event.name].append(event)
    for name, events in by_name.items():
        made = workload.versions[name]
        made_rvs = {rv for _, rv in made}
        kept = [e for e in events if e.type != "DELETED"]
        rvs = [e.rv for e in kept]
        assert len(rvs) == len(set(rvs)), f"{name}: a version delivered twice: {events}"
        for a, b in itertools.pairwise(kept):
            assert compare_resource_versions(b.rv, a.rv) == 1, f"{name}: reordered: {events}"
        assert kept[0].type == "ADDED", f"{name}: first event {kept[0]}"
        assert all(e.type == "MODIFIED" for e in kept[1:]), f"{name}: {events}"
        invented = [e for e in kept if e.rv not in made_rvs]
        assert not invented, f"{name}: versions the server never made: {invented}"
        deletes = [i for i, e in enumerate(events) if e.type == "DELETED"]
        assert deletes in ([], [len(events) - 1]), f"{name}: DELETED not last, once: {events}"
        if name in workload.deleted:
            assert deletes, f"{name} was deleted but no DELETED reached the handler: {events}"
        else:
            assert not deletes, f"{name} lives but was reported deleted: {events}"
        # While the watch resumes, no version is skipped; the relist may collapse versions
        # made in phase 2 (and those of phase 0, before the first list), never later ones.
        delivered = {e.rv for e in kept}
        lost = [rv for phase, rv in made if phase in (1, 3) and rv not in delivered]
        assert not lost, f"{name}: versions made while the watch resumed, never delivered: {lost}"
        if name not in workload.deleted:
            assert kept[-1].rv == made[-1][1], f"{name}: the latest version was not delivered"
