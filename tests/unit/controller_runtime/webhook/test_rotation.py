"""The certificate rotation's decisions, driven through arbitrary schedules: leader checks at
random times, replicas reloading at random times within their interval, API servers that see
a new bundle late. Whatever the schedule, no replica ever serves a certificate that is expired
or that some API server's current bundle does not trust, and the CA does rotate."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller_runtime.webhook.rotation import (
    Authority,
    Leaf,
    RotationPolicy,
    RotationState,
    Step,
    next_check,
    plan,
    transition,
)

POLICY = RotationPolicy(
    ca_validity=1000.0,
    ca_renew_before=200.0,
    serving_validity=300.0,
    serving_renew_before=100.0,
    overlap=30.0,
)
RELOAD = 10.0
CHECK = 5.0
API_LAG = 3.0
HOSTS = frozenset({"hooks.system.svc"})


@dataclass
class World:
    """The Secret's state, the bundles injected over time, and what each replica serves."""

    state: RotationState | None = None
    injected: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    serving: dict[int, tuple[Leaf, float]] = field(default_factory=dict)  # leaf, next reload
    steps: list[Step] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def authority(self, not_after: float) -> Authority:
        return Authority(f"ca-{next(self.ids)}", not_after)

    def leaf(self, ca: Authority, not_after: float, hosts: frozenset[str]) -> Leaf:
        return Leaf(f"leaf-{next(self.ids)}", ca.id, not_after, hosts)

    def check(self, now: float) -> None:
        """One pass of the leader's loop: plan, write, inject, record the injection."""
        step = plan(self.state, now, POLICY, HOSTS)
        self.steps.append(step)
        written = transition(
            self.state,
            step,
            now,
            POLICY,
            HOSTS,
            new_authority=self.authority,
            new_leaf=self.leaf,
        )
        if written is not None:
            self.state = written
        assert self.state is not None
        if self.state.bundle_injected_at is None:
            self.injected.append((now, self.state.bundle))
            self.state = dataclasses.replace(self.state, bundle_injected_at=now)

    def bundles_possible_at(self, now: float) -> list[tuple[str, ...]]:
        """The bundles an API server may hold at ``now``: any injected within the lag, and
        the last one before it."""
        recent = [b for t, b in self.injected if now - API_LAG < t <= now]
        settled = [b for t, b in self.injected if t <= now - API_LAG]
        return recent + settled[-1:]


@settings(max_examples=60)
@given(
    checks=st.lists(st.floats(0.05, CHECK), min_size=1, max_size=2000),
    reloads=st.lists(st.floats(0.05, RELOAD), min_size=1, max_size=2000),
    replicas=st.integers(1, 3),
)
def test_no_replica_serves_what_an_api_server_does_not_trust(
    checks: list[float], reloads: list[float], replicas: int
) -> None:
    world = World()
    world.check(0.0)
    horizon = 3 * POLICY.ca_validity
    events: list[tuple[float, str, int]] = []
    now, gaps = 0.0, itertools.cycle(checks)
    while now < horizon:
        now += next(gaps)
        events.append((now, "check", 0))
    reload_gaps = itertools.cycle(reloads)
    for replica in range(replicas):
        now = next(reload_gaps) / 2
        while now < horizon:
            events.append((now, "reload", replica))
            now += next(reload_gaps)
    events.sort()
    for now, what, replica in events:
        if what == "check":
            world.check(now)
        else:
            assert world.state is not None
            world.serving[replica] = (world.state.serving, now + RELOAD)
        for leaf, until in world.serving.values():
            # Valid until the replica's next reload at the latest, and trusted everywhere.
            assert leaf.not_after > min(until, now + RELOAD), (now, leaf)
            for bundle in world.bundles_possible_at(now):
                assert leaf.issuer in bundle, (now, leaf, bundle)
    assert world.steps.count(Step.ADD_CA) >= 2, "the CA rotated"
    assert world.steps.count(Step.SWITCH) == world.steps.count(Step.ADD_CA)
    assert Step.RENEW_SERVING in world.steps
    assert world.steps.count(Step.CREATE) == 1, "never started over"


def test_a_quiet_state_waits_until_the_next_due_step() -> None:
    world = World()
    world.check(0.0)
    assert world.state is not None
    wake = next_check(world.state, 0.0, POLICY, interval=1e9)
    assert wake == pytest.approx(POLICY.serving_validity - POLICY.serving_renew_before)
    assert plan(world.state, wake - 1, POLICY, HOSTS) is Step.NONE
    assert plan(world.state, wake, POLICY, HOSTS) is Step.RENEW_SERVING


def test_a_new_host_name_renews_the_serving_certificate() -> None:
    world = World()
    world.check(0.0)
    assert plan(world.state, 1.0, POLICY, HOSTS | {"hooks.system.svc.cluster.local"}) is (
        Step.RENEW_SERVING
    )


def test_an_expired_signer_starts_over() -> None:
    world = World()
    world.check(0.0)
    assert plan(world.state, POLICY.ca_validity + 1, POLICY, HOSTS) is Step.CREATE


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"overlap": 15.0}, "reload interval"),
        ({"ca_renew_before": 80.0}, "three overlaps"),
        ({"serving_renew_before": 20.0}, "serving_renew_before"),
    ],
)
def test_the_policy_refuses_timings_that_break_the_guarantee(
    changes: dict[str, float], message: str
) -> None:
    values = {**POLICY.__dict__, **changes}
    with pytest.raises(ValueError, match=message):
        RotationPolicy(**values).check(RELOAD)
    POLICY.check(RELOAD)
