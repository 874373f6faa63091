"""The stale-cache fuzzer: runs a controller of this project on the real control plane while a
:class:`~controller_runtime.envtest.watchlag.WatchScheduleTransport` decides what its
informers see and when, and checks invariants after every step and at the end.

A *schedule* is a list of steps (:data:`Step`): workload actions of the scenario (create,
update, delete, re-create an object) interleaved with cache faults (lag per resource, late
deletes, a cut watch, a forced relist, an older resourceVersion replayed after a reconnect)
and waits. hypothesis draws schedules (:func:`schedules`); when one breaks an invariant,
hypothesis shrinks it and the minimal schedule is printed as a ready-to-paste regression test
(:func:`regression_test`).

Invariants (per scenario, :class:`Scenario`): no duplicate external effect, checked after
every step and at the end; convergence within :data:`CONVERGE_WITHIN` seconds once the lag
stops; and the read-your-own-writes promise, checked on every cached read by
:class:`TrackingClient`: no reconcile reads an object older than the version an earlier
reconcile of the same key wrote (with the guard off this is *measured*, not asserted: it is
what the guard prevents).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hypothesis import strategies as st

from controller_runtime.client import Client
from controller_runtime.envtest.watchlag import WatchScheduleTransport
from controller_runtime.manager import Manager, ManagerOptions
from controller_runtime.reconcile import CURRENT_RECONCILE, Request
from informers.resource_version import compare_resource_versions
from kubeclient.config import ClusterConfig
from kubeclient.discovery import ResourceInfo
from kubeclient.errors import ConflictError, InvalidError, NotFoundError
from kubeclient.transport import Transport

Obj = dict[str, Any]
CONVERGE_WITHIN = 45.0
"""Seconds a scenario may take to converge after the last step (lag off, watches healthy).
Generous: the machine is shared and a forced relist backs off up to a few seconds."""


# -- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lag:
    resource: str
    seconds: float


@dataclass(frozen=True)
class DeleteLag:
    resource: str
    seconds: float


@dataclass(frozen=True)
class Cut:
    resource: str


@dataclass(frozen=True)
class Expire:
    resource: str


@dataclass(frozen=True)
class ReplayOlder:
    resource: str
    depth: int


@dataclass(frozen=True)
class Act:
    action: str
    index: int


@dataclass(frozen=True)
class Wait:
    seconds: float


Step = Lag | DeleteLag | Cut | Expire | ReplayOlder | Act | Wait


def schedules(
    resources: Sequence[str], actions: Sequence[str], objects: int, *, max_steps: int = 10
) -> st.SearchStrategy[list[Step]]:
    """Schedules over ``resources`` (watch lags and faults) and ``actions`` on objects
    ``0..objects-1``; actions are drawn twice as often as faults."""
    resource = st.sampled_from(list(resources))
    fault: st.SearchStrategy[Step] = st.one_of(
        st.builds(Lag, resource, st.sampled_from([0.0, 0.3, 1.0, 2.0])),
        st.builds(DeleteLag, resource, st.sampled_from([0.5, 2.0])),
        st.builds(Cut, resource),
        st.builds(Expire, resource),
        st.builds(ReplayOlder, resource, st.sampled_from([2, 8, 32])),
        st.builds(Wait, st.sampled_from([0.1, 0.5, 1.5])),
    )
    act: st.SearchStrategy[Step] = st.builds(
        Act, st.sampled_from(list(actions)), st.integers(0, objects - 1)
    )
    return st.lists(st.one_of(act, act, fault), min_size=1, max_size=max_steps)


def regression_test(scenario: str, guard: bool, schedule: Sequence[Step]) -> str:
    """A pytest function replaying ``schedule``: paste it into ``test_fuzz.py``."""
    steps = ",\n        ".join(repr(step) for step in schedule)
    mode = "guarded" if guard else "unguarded"
    return (
        f"async def test_regression_{scenario}_{mode}_{uuid.uuid4().hex[:6]}(\n"
        f"    admin_config: ClusterConfig, transport: Transport, request: pytest.FixtureRequest\n"
        f") -> None:\n"
        f"    schedule: list[Step] = [\n        {steps},\n    ]\n"
        f"    scenario = make_scenario({scenario!r}, transport, request)\n"
        f"    report = await run_schedule(\n"
        f"        admin_config, scenario, schedule, guard={guard}, transport=transport\n"
        f"    )\n"
        f"    assert not report.failures, report.failures\n"
    )


# -- the read-your-own-writes check ----------------------------------------------------------


@dataclass
class _Written:
    uid: str | None
    rv: str
    reconcile_id: str


@dataclass
class StaleReads:
    """Cached reads, by controllers, of an object older than their own earlier write."""

    reads: int = 0
    violations: list[str] = field(default_factory=list)


class TrackingClient(Client):
    """A :class:`Client` that remembers, per controller and request, the newest version of
    every object a reconcile wrote, and flags a later reconcile of the same request that reads
    an older version of it from the cache (the guard's promise, ``docs/consistency.md``).
    Reads in the reconcile that made the write are not checked (the guard does not cover
    them)."""

    def __init__(self, *args: Any, stale: StaleReads, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stale = stale
        self._written: dict[tuple[str, Request, str, str, str], _Written] = {}

    def _recorded_write(self, resource: ResourceInfo, obj: Mapping[str, Any]) -> None:
        super()._recorded_write(resource, obj)
        context = CURRENT_RECONCILE.get()
        meta = obj.get("metadata") or {}
        if context is None or not meta.get("resourceVersion"):
            return
        key = (
            context.controller,
            context.request,
            resource.kind,
            meta.get("namespace") or "",
            meta.get("name") or "",
        )
        self._written[key] = _Written(
            meta.get("uid"), meta["resourceVersion"], context.reconcile_id
        )

    def _recorded_delete(
        self, resource: ResourceInfo, namespace: str | None, name: str, uid: str | None
    ) -> None:
        super()._recorded_delete(resource, namespace, name, uid)
        context = CURRENT_RECONCILE.get()
        if context is not None:
            key = (context.controller, context.request, resource.kind, namespace or "", name)
            self._written.pop(key, None)

    def _check(self, objs: Sequence[Mapping[str, Any]]) -> None:
        context = CURRENT_RECONCILE.get()
        if context is None:
            return
        for obj in objs:
            self.stale.reads += 1
            meta = obj.get("metadata") or {}
            key = (
                context.controller,
                context.request,
                str(obj.get("kind")),
                meta.get("namespace") or "",
                meta.get("name") or "",
            )
            written = self._written.get(key)
            if written is None or written.reconcile_id == context.reconcile_id:
                continue
            if written.uid and meta.get("uid") != written.uid:
                continue
            order = compare_resource_versions(str(meta.get("resourceVersion")), written.rv)
            if order is not None and order < 0:
                self.stale.violations.append(
                    f"{context.controller} reconciling {context.request} read {key[2]} "
                    f"{key[3]}/{key[4]} at resourceVersion {meta.get('resourceVersion')}, "
                    f"older than its own earlier write {written.rv}"
                )

    async def get(  # type: ignore[override]  # the dict form only
        self,
        api_version: str,
        kind: str,
        key: Request | None = None,
        /,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> Obj:
        obj = await super().get(api_version, kind, key, name=name, namespace=namespace)
        self._check([obj])
        return obj

    async def list(  # type: ignore[override]  # the dict form only
        self, api_version: str, kind: str, **kwargs: Any
    ) -> list[Obj]:
        objs = await super().list(api_version, kind, **kwargs)
        self._check(objs)
        return objs


# -- scenarios --------------------------------------------------------------------------------


class Scenario(Protocol):
    """One controller (or a group that works together) under the fuzzer."""

    @property
    def name(self) -> str: ...

    @property
    def resources(self) -> tuple[str, ...]:
        """Watched resources whose streams the schedule may lag, cut, expire and replay."""

    @property
    def actions(self) -> tuple[str, ...]: ...

    @property
    def objects(self) -> int: ...

    async def setup(self, manager: Manager, client: Client, namespace: str) -> None:
        """Create what the scenario needs and set up its controllers on ``manager``."""

    async def act(self, action: str, index: int) -> None:
        """One workload action on object ``index``."""

    async def violations(self) -> list[str]:
        """Broken safety invariants now (duplicate external effects): empty when none."""

    async def unconverged(self) -> list[str]:
        """What is not yet as it should be: empty once converged."""

    async def teardown(self) -> None:
        """Remove external state (e.g. roles) the scenario created."""


@dataclass
class RunReport:
    """One schedule's run: what was checked, what broke (``failures``, empty when none), and
    what the watch schedule did (``stats``: cuts, relists, replays, delayed events)."""

    scenario: str
    guard: bool
    steps: int
    invariant_checks: int = 0
    stale_reads: int = 0
    reads: int = 0
    converge_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    schedule: list[str] = field(default_factory=list)


async def _create_namespace(transport: Transport) -> str:
    name = f"fz-{uuid.uuid4().hex[:10]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await transport.request("POST", "/api/v1/namespaces", body=body)
    return name


@contextlib.asynccontextmanager
async def _operator(
    config: ClusterConfig, scenario: Scenario, namespace: str, guard: bool, stale: StaleReads
) -> AsyncIterator[tuple[Manager, WatchScheduleTransport]]:
    manager = Manager(
        config,
        ManagerOptions(
            namespaces=[namespace],
            metrics_bind_address=None,
            health_probe_bind_address=None,
            graceful_shutdown_timeout=5,
            read_your_writes=guard,
        ),
    )
    # Only the informers read through the schedule; writes and live reads go straight to the
    # server. No informer exists yet, so every one the controllers create uses it.
    lagging = WatchScheduleTransport(config)
    manager.factory.transport = lagging
    client = TrackingClient(
        manager.transport, manager.cache, field_manager=manager.options.field_manager, stale=stale
    )
    await scenario.setup(manager, client, namespace)
    task = asyncio.create_task(manager.run(), name=f"fuzz-{scenario.name}")
    try:
        yield manager, lagging
    finally:
        lagging.clear()
        manager.request_stop()
        try:
            await asyncio.wait_for(task, 30)
        finally:
            await lagging.close()


async def apply_step(step: Step, scenario: Scenario, lagging: WatchScheduleTransport) -> None:
    if isinstance(step, Lag):
        lagging.set_lag(step.resource, step.seconds)
    elif isinstance(step, DeleteLag):
        lagging.set_delete_lag(step.resource, step.seconds)
    elif isinstance(step, Cut):
        lagging.cut(step.resource)
    elif isinstance(step, Expire):
        lagging.expire(step.resource)
    elif isinstance(step, ReplayOlder):
        lagging.replay_older(step.resource, step.depth)
        replays = lagging.stats.replays[step.resource]
        for _ in range(3):  # a reconnect that starts with a full list does not replay
            reconnect = asyncio.create_task(lagging.reconnected(step.resource))
            await asyncio.sleep(0)  # the waiter is armed before the cut
            lagging.cut(step.resource)  # the reconnect that replays
            if not await reconnect or lagging.stats.replays[step.resource] > replays:
                break
    elif isinstance(step, Act):
        # An action the API server refuses (a closed Task's state) is simply not done.
        with contextlib.suppress(ConflictError, NotFoundError, InvalidError):
            await scenario.act(step.action, step.index)
    else:
        await asyncio.sleep(step.seconds)


async def run_schedule(
    config: ClusterConfig,
    scenario: Scenario,
    schedule: Sequence[Step],
    *,
    guard: bool,
    transport: Transport,
) -> RunReport:
    """Run ``schedule`` against ``scenario``'s controllers; the report lists every broken
    invariant (``failures``) and the stale reads seen (``stale_reads``)."""
    report = RunReport(scenario.name, guard, len(schedule), schedule=[repr(s) for s in schedule])
    stale = StaleReads()
    namespace = await _create_namespace(transport)
    try:
        async with _operator(config, scenario, namespace, guard, stale) as (manager, lagging):
            await manager.cache.wait_for_sync(60)
            for index in range(scenario.objects):  # every schedule starts from live objects
                await scenario.act("create", index)
            for number, step in enumerate(schedule, 1):
                await apply_step(step, scenario, lagging)
                report.invariant_checks += 1
                for problem in await scenario.violations():
                    report.failures.append(f"after step {number} ({step!r}): {problem}")
                if report.failures:
                    break
            lagging.clear()
            started = time.monotonic()
            remaining: list[str] = []
            while not report.failures:
                remaining = await scenario.unconverged()
                report.invariant_checks += 1
                if not remaining or time.monotonic() - started > CONVERGE_WITHIN:
                    break
                await asyncio.sleep(0.25)  # polling the API server for the end state
            report.converge_seconds = time.monotonic() - started
            if remaining:
                report.failures.append(
                    f"not converged {CONVERGE_WITHIN:.0f}s after the last step: "
                    + "; ".join(remaining[:5])
                )
            report.invariant_checks += 1
            report.failures.extend(f"at the end: {p}" for p in await scenario.violations())
            report.stats = {
                "cuts": sum(lagging.stats.cuts.values()),
                "relists": sum(lagging.stats.expiries.values()),
                "replays": sum(lagging.stats.replays.values()),
                "delayed": sum(lagging.stats.delayed.values()),
                "watches": sum(lagging.stats.watches.values()),
                # dependents the scenario deleted in the garbage collector's place
                "collected": getattr(scenario, "collected", 0),
            }
    finally:
        await scenario.teardown()
        with contextlib.suppress(ConflictError, NotFoundError):
            await transport.request("DELETE", f"/api/v1/namespaces/{namespace}")
    report.reads = stale.reads
    report.stale_reads = len(stale.violations)
    if guard:
        report.failures.extend(f"stale read: {v}" for v in stale.violations[:5])
    return report
