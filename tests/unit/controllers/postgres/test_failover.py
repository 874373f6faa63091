"""Tests of the high-availability state machine (controllers/postgres/failover.py).

The example tests walk one failover, one switchover and the zero-loss refusals by hand. The
property test drives :func:`decide` against a simulated instance (members with roles, timelines
and LSNs, a client committing through the primary Service, the entrypoint's rules, crashes,
frozen and partitioned nodes, Pod deletions, switchover requests, clock steps) and checks after
every step: never two members that can acknowledge a commit, no acknowledged commit lost in
zero-loss synchronous mode, the state's own invariants, and that once every fault heals the
instance ends with a writable primary that every other member follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controllers.postgres.failover import (
    PENDING,
    Decision,
    HAConfig,
    HAState,
    MemberObservation,
    Observation,
    Phase,
    Role,
    SyncPolicy,
    choose_candidate,
    decide,
    instance_status_fields,
    state_from_instance_status,
    state_from_status,
)

MEMBERS = ("db-0", "db-1", "db-2")


def primary(name: str, lsn: int = 100, timeline: int = 1, **kw: object) -> MemberObservation:
    return MemberObservation(
        name,
        reachable=True,
        role=Role.PRIMARY,
        timeline=timeline,
        received_lsn=lsn,
        **kw,  # type: ignore[arg-type]
    )


def standby(
    name: str, lsn: int = 100, timeline: int = 1, source: str | None = "db-0", **kw: object
) -> MemberObservation:
    return MemberObservation(
        name,
        reachable=True,
        role=Role.STANDBY,
        timeline=timeline,
        received_lsn=lsn,
        replay_lsn=lsn,
        streaming_from=source,
        **kw,  # type: ignore[arg-type]
    )


def down(name: str, **kw: object) -> MemberObservation:
    return MemberObservation(name, reachable=False, **kw)  # type: ignore[arg-type]


def observe(now: float, *members: MemberObservation) -> Observation:
    return Observation(now, {m.name: m for m in members})


def healthy_state() -> HAState:
    config = HAConfig(MEMBERS)
    state = decide(HAState(), observe(0, primary("db-0"), standby("db-1")), config).state
    assert state.phase == Phase.HEALTHY and state.current_primary == "db-0"
    return state


# ---- examples ------------------------------------------------------------------------------


def test_bootstrap_names_the_first_member_and_waits_for_it() -> None:
    config = HAConfig(MEMBERS)
    first = decide(HAState(), observe(0, down("db-0")), config)
    assert first.state.phase == Phase.BOOTSTRAP and first.state.target_primary == "db-0"
    assert first.waiting
    second = decide(first.state, observe(1, primary("db-0")), config)
    assert second.state.phase == Phase.HEALTHY and second.state.current_primary == "db-0"
    assert second.state.current_since == 1


def test_failover_fences_waits_for_the_fence_then_promotes_the_most_advanced() -> None:
    config = HAConfig(MEMBERS, synchronous=True)
    state = healthy_state()
    lost = decide(
        state, observe(10, down("db-0"), standby("db-1", 90), standby("db-2", 95)), config
    )
    assert lost.state.phase == Phase.FENCING
    assert lost.state.target_primary == PENDING and "db-0" in lost.state.fenced
    assert [e.reason for e in lost.events] == ["FailoverStarted"]
    # db-0 does not answer: it may serve until isolation_bound after its fence.
    waiting = decide(
        lost.state,
        observe(
            19, down("db-0"), standby("db-1", 90, source=None), standby("db-2", 95, source=None)
        ),
        config,
    )
    assert waiting.state.phase == Phase.FENCING and "fence of db-0" in waiting.waiting
    later = decide(
        waiting.state,
        observe(
            20, down("db-0"), standby("db-1", 90, source=None), standby("db-2", 95, source=None)
        ),
        config,
    )
    assert later.state.phase == Phase.PROMOTING and later.state.target_primary == "db-2"
    assert [e.reason for e in later.events] == ["Promoting"]
    done = decide(
        later.state,
        observe(
            23, down("db-0"), standby("db-1", 90, source=None), primary("db-2", 95, timeline=2)
        ),
        config,
    )
    assert done.state.phase == Phase.HEALTHY and done.state.current_primary == "db-2"
    assert done.state.failovers == 1 and done.state.last_transition_seconds == 13
    assert done.state.timeline == 2
    assert done.state.fenced == {"db-0"}  # until it streams from db-2
    rejoined = decide(
        done.state,
        observe(
            30, standby("db-0", 95, timeline=2, source="db-2"), primary("db-2", 96, timeline=2)
        ),
        config,
    )
    assert rejoined.state.fenced == frozenset() and rejoined.state.fenced_at == {}


def test_a_pod_gone_is_fenced_at_once() -> None:
    config = HAConfig(MEMBERS)
    lost = decide(
        healthy_state(),
        observe(10, down("db-0", pod_exists=False), standby("db-1", source=None)),
        config,
    )
    after = decide(
        lost.state,
        observe(
            10.5,
            down("db-0", pod_exists=False),
            standby("db-1", source=None),
            standby("db-2", source=None),
        ),
        config,
    )
    assert after.state.phase == Phase.PROMOTING and after.state.target_primary == "db-1"


def test_no_promotion_while_a_standby_still_streams_from_the_old_primary() -> None:
    config = HAConfig(MEMBERS)
    state = replace(healthy_state(), last_seen={"db-0": 0.0})
    lost = decide(state, observe(1, down("db-0", node_lost=True), standby("db-1")), config).state
    # The node is lost but db-0 was seen 1 s ago: it may still accept commits.
    assert (
        decide(
            lost, observe(5, down("db-0", node_lost=True), standby("db-1", source=None)), config
        ).state.phase
        == Phase.FENCING
    )
    streaming = decide(lost, observe(11, down("db-0", node_lost=True), standby("db-1")), config)
    assert streaming.state.phase == Phase.FENCING and "stop receiving" in streaming.waiting
    ok = decide(
        lost, observe(11, down("db-0", node_lost=True), standby("db-1", source=None)), config
    )
    assert ok.state.phase == Phase.PROMOTING and ok.state.target_primary == "db-1"


def test_zero_loss_waits_for_every_standby_that_may_be_synchronous() -> None:
    config = HAConfig(MEMBERS, synchronous=True)
    state = replace(
        healthy_state(),
        phase=Phase.FENCING,
        old_primary="db-0",
        fenced=frozenset({"db-0"}),
        target_primary=PENDING,
    )
    obs = observe(
        50, down("db-0", pod_exists=False), standby("db-1", 90, source=None), down("db-2")
    )
    chosen, why = choose_candidate(state, obs, config)
    assert chosen is None and "db-2" in why
    degrade = replace(config, sync_policy=SyncPolicy.DEGRADE_TO_ASYNC)
    chosen, _ = choose_candidate(state, obs, degrade)
    assert chosen is not None and chosen.name == "db-1"
    # A restarting member reports the WAL on its volume: behind the candidate, it does not block;
    # ahead of it, it may hold acknowledged commits the candidate lacks.
    behind = MemberObservation(
        "db-2", reachable=True, role=Role.STARTING, timeline=1, received_lsn=80
    )
    chosen, _ = choose_candidate(
        state, replace(obs, members={**obs.members, "db-2": behind}), config
    )
    assert chosen is not None and chosen.name == "db-1"
    ahead = replace(behind, received_lsn=95)
    chosen, why = choose_candidate(
        state, replace(obs, members={**obs.members, "db-2": ahead}), config
    )
    assert chosen is None and "db-2" in why


def test_a_fenced_primary_that_reports_its_final_lsn_lets_any_caught_up_standby_take_over() -> None:
    config = HAConfig(MEMBERS, synchronous=True)
    state = replace(
        healthy_state(),
        phase=Phase.FENCING,
        old_primary="db-0",
        fenced=frozenset({"db-0"}),
        target_primary=PENDING,
    )
    fenced = MemberObservation(
        "db-0", reachable=True, role=Role.FENCED, timeline=1, received_lsn=120
    )
    obs = observe(5, fenced, standby("db-1", 120, source=None), down("db-2"))
    chosen, _ = choose_candidate(state, obs, config)
    assert chosen is not None and chosen.name == "db-1"
    # Behind the final LSN: nobody is promoted, and the intact old primary resumes.
    behind = observe(
        5, fenced, standby("db-1", 110, source=None), standby("db-2", 100, source=None)
    )
    decision = decide(state, behind, config)
    assert decision.state.phase == Phase.PROMOTING and decision.state.target_primary == "db-0"
    assert [e.reason for e in decision.events] == ["PrimaryResuming"]
    resumed = decide(decision.state, observe(6, primary("db-0", 120), standby("db-1", 120)), config)
    assert resumed.state.phase == Phase.HEALTHY and resumed.state.current_primary == "db-0"
    assert resumed.state.failovers == 0


def test_pod_deletion_is_a_switchover_to_a_caught_up_standby() -> None:
    config = HAConfig(MEMBERS, synchronous=True)
    state = healthy_state()
    obs = observe(
        3, primary("db-0", 100, pod_deleting=True), standby("db-1", 99), standby("db-2", 100)
    )
    decision = decide(state, obs, config)
    assert decision.state.phase == Phase.FENCING and decision.state.switchover
    assert decision.state.preferred == "db-2"  # the most advanced of the caught-up standbys
    assert [e.reason for e in decision.events] == ["SwitchoverStarted"]


def test_requested_switchover_promotes_the_named_standby_and_counts_it() -> None:
    config = HAConfig(MEMBERS, synchronous=True, switchover_to="db-2")
    state = healthy_state()
    start = decide(
        state, observe(1, primary("db-0", 100), standby("db-1", 100), standby("db-2", 100)), config
    )
    assert start.state.phase == Phase.FENCING and start.state.preferred == "db-2"
    fenced = MemberObservation(
        "db-0", reachable=True, role=Role.FENCED, timeline=1, received_lsn=101
    )
    step = decide(
        start.state,
        observe(2, fenced, standby("db-1", 101, source=None), standby("db-2", 101, source=None)),
        config,
    )
    assert step.state.target_primary == "db-2"
    done = decide(
        step.state,
        observe(3, fenced, standby("db-1", 101, source=None), primary("db-2", 101, timeline=2)),
        config,
    )
    assert done.state.current_primary == "db-2" and done.state.switchovers == 1
    assert done.state.failovers == 0


def test_state_round_trips_through_the_status() -> None:
    state = replace(healthy_state(), fenced=frozenset({"db-2"}), failovers=3, failing_since=4.5)
    assert state_from_status(state.to_status()) == state
    assert state_from_status(None) == HAState()
    assert state_from_status({"phase": "Nonsense", "fenced": [1, "db-1"]}).fenced == {"db-1"}


def test_a_primary_that_does_not_accept_connections_is_failed_over() -> None:
    # A restarted primary recovering its WAL answers as primary, not ready: it is failed
    # over (after failover_delay) and its fence is confirmed only once it stops.
    config = HAConfig(MEMBERS)
    recovering = primary("db-0", ready=False)
    lost = decide(healthy_state(), observe(1, recovering, standby("db-1")), config)
    assert lost.state.phase == Phase.FENCING and "db-0" in lost.state.fenced
    still = decide(lost.state, observe(2, recovering, standby("db-1", source=None)), config)
    assert still.state.phase == Phase.FENCING and "fence of db-0" in still.waiting
    delayed = HAConfig(MEMBERS, failover_delay=5)
    waiting = decide(healthy_state(), observe(1, recovering, standby("db-1")), delayed)
    assert waiting.state.phase == Phase.HEALTHY and "failoverDelay" in waiting.waiting


def test_a_member_whose_position_is_unknown_is_waited_for_in_zero_loss_mode() -> None:
    config = HAConfig(MEMBERS, synchronous=True)
    state = replace(
        healthy_state(),
        phase=Phase.FENCING,
        old_primary="db-0",
        fenced=frozenset({"db-0"}),
        target_primary=PENDING,
    )
    replaying = MemberObservation(
        "db-2", reachable=True, role=Role.STANDBY, timeline=1, position_known=False
    )
    obs = observe(5, down("db-0", pod_exists=False), standby("db-1", 90, source=None), replaying)
    chosen, why = choose_candidate(state, obs, config)
    assert chosen is None and "db-2" in why
    # Asynchronous: it is no candidate, but nobody waits for it.
    chosen, _ = choose_candidate(state, obs, HAConfig(MEMBERS))
    assert chosen is not None and chosen.name == "db-1"


def test_silence_does_not_confirm_the_fence_of_a_member_with_an_unbounded_lease() -> None:
    # db-0 last read a one-replica instance: alone, it keeps serving when it cannot read.
    config = HAConfig(MEMBERS)
    alone = decide(HAState(), observe(0, primary("db-0", lease_bounded=False)), config).state
    assert alone.unbounded == {"db-0"}
    lost = decide(alone, observe(1, down("db-0"), standby("db-1", source=None)), config).state
    later = decide(
        lost,
        observe(100, down("db-0"), standby("db-1", source=None), standby("db-2", source=None)),
        config,
    )
    assert later.state.phase == Phase.FENCING and "fence of db-0" in later.waiting
    # Once it reports a bounded lease, the rule holds again.
    bounded = replace(healthy_state(), unbounded=frozenset({"db-0"}))
    seen = decide(bounded, observe(1, primary("db-0"), standby("db-1")), config).state
    assert seen.unbounded == frozenset()


def test_the_instance_status_holds_the_state_in_its_documented_places() -> None:
    state = replace(
        healthy_state(),
        fenced=frozenset({"db-2"}),
        fenced_at={"db-2": 3.0},
        failovers=2,
        switchovers=1,
        last_transition_seconds=4.5,
        current_since=0.0,
        target_since=86400.5,
    )
    status = instance_status_fields(state)
    assert status["currentPrimary"] == "db-0" and status["targetPrimary"] == "db-0"
    assert status["currentPrimaryTimestamp"] == "1970-01-01T00:00:00Z"
    assert status["targetPrimaryTimestamp"] == "1970-01-02T00:00:00Z"
    assert (status["failovers"], status["switchovers"]) == (2, 1)
    assert status["lastTransitionSeconds"] == 4.5
    assert status["ha"]["phase"] == "Healthy" and status["ha"]["fenced"] == ["db-2"]
    assert status["ha"]["state"]["fencedAt"] == {"db-2": 3.0}
    assert state_from_instance_status(status) == state
    assert state_from_instance_status({}) == HAState()
    assert state_from_instance_status({"currentPrimary": "db-0"}) == HAState()


# ---- the simulated instance ---------------------------------------------------------------


@dataclass
class Member:
    name: str
    role: Role = Role.STARTING
    timeline: int = 1
    lsn: int = 0
    history: tuple[tuple[int, int], ...] = ()
    """(timeline, LSN where it ended) of the timelines before this one."""
    source: str | None = None
    prior: Role = Role.STARTING
    """The role before the last restart (a standby restarted as target promotes)."""
    alive: bool = True
    frozen_since: float | None = None
    partitioned_since: float | None = None
    pod_exists: bool = True
    deleting: bool = False
    ready: bool = True
    """A primary accepts connections (not while it recovers after a restart)."""
    recovering: bool = False
    """Restarted and replaying its own WAL: its position is not known yet."""
    created: float = 0.0


@dataclass
class World:
    config: HAConfig
    grace: float
    now: float = 0.0
    members: dict[str, Member] = field(default_factory=dict)
    state: HAState = field(default_factory=HAState)
    acked: int = 0
    """The highest acknowledged LSN (of the lineage the primary Service served)."""
    acked_timeline: int = 1
    acked_history: tuple[tuple[int, int], ...] = ()
    """The timelines before ``acked_timeline`` in the acknowledged lineage, as in ``Member``."""
    lost_acks: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in self.config.members:
            self.members[name] = Member(name)

    # -- what each member's entrypoint and agent do ------------------------------------------

    def cut_off(self, m: Member) -> bool:
        return m.frozen_since is not None or m.partitioned_since is not None

    def can_ack(self, m: Member) -> bool:
        """Whether ``m`` could acknowledge a commit now (a partitioned primary stops by
        itself within the isolation bound)."""
        if not (
            m.alive
            and m.pod_exists
            and m.role == Role.PRIMARY
            and m.ready
            and m.frozen_since is None
        ):
            return False
        if m.partitioned_since is not None:
            return self.now - m.partitioned_since < self.config.isolation_bound
        return True

    def agents(self) -> None:
        """The entrypoint's and the agent's rules, as each member applies them when it can
        read the operator's word: the target runs as primary (promoting itself if it was a
        standby); a primary that is not the target stops; the others follow the current
        primary, and only once the operator has confirmed it (phase Healthy)."""
        target = self.state.target_primary
        fenced = self.state.fenced
        follow = self.state.current_primary if self.state.phase == Phase.HEALTHY else None
        for m in self.members.values():
            if not (m.alive and m.pod_exists) or self.cut_off(m):
                continue
            if m.recovering:  # one step to replay its own WAL
                m.recovering, m.ready = False, True
                continue
            if m.role == Role.PRIMARY and target != m.name:
                m.role, m.source = Role.FENCED, None
            elif target == m.name and m.role != Role.PRIMARY:
                was = m.prior if m.role == Role.STARTING else m.role
                if was == Role.STANDBY:  # promotion: a new timeline
                    m.history += ((m.timeline, m.lsn),)
                    m.timeline = max(x.timeline for x in self.members.values()) + 1
                else:  # a former primary starts again: it recovers before it serves
                    m.ready = False
                    m.recovering = True
                m.role, m.source = Role.PRIMARY, None
                self.check_promotion(m)
            elif m.role == Role.STARTING:  # the entrypoint: fenced stays down, others stand by
                m.role, m.source = (Role.FENCED if m.name in fenced else Role.STANDBY), None
            if m.role in (Role.FENCED, Role.STANDBY) and follow not in (None, m.name):
                assert follow is not None
                self.follow(m, self.members[follow])
            elif m.role == Role.STANDBY:
                src = self.members.get(m.source or "")
                if src is None or src.role != Role.PRIMARY or not self.linked(m, src):
                    m.source = None

    def linked(self, a: Member, b: Member) -> bool:
        return not (self.cut_off(a) or self.cut_off(b)) and a.alive and b.alive and b.pod_exists

    def follow(self, m: Member, p: Member) -> None:
        if p.role != Role.PRIMARY or not self.linked(m, p):
            if m.role == Role.STANDBY:
                m.source = None
            return
        if m.timeline != p.timeline:
            # pg_rewind: back to where the timelines forked, then the primary's timeline.
            fork = next((lsn for tl, lsn in p.history if tl == m.timeline), None)
            m.lsn = min(m.lsn, fork if fork is not None else 0)
            m.timeline = p.timeline
            m.history = p.history
        m.lsn = min(m.lsn, p.lsn)
        m.role = Role.STANDBY
        m.source = p.name

    def check_promotion(self, m: Member) -> None:
        """A promoted member must hold every acknowledged commit (zero-loss mode): its lineage
        and the acknowledged one must agree up to the last acknowledged LSN. Two lineages agree
        up to the end of the newest timeline they share, on both (timelines are never
        reused: each promotion takes a new number)."""
        mine = {**dict(m.history), m.timeline: m.lsn}
        acked = {**dict(self.acked_history), self.acked_timeline: self.acked}
        shared = mine.keys() & acked.keys()
        end = min(mine[max(shared)], acked[max(shared)]) if shared else 0
        if end < self.acked:
            self.lost_acks.append(f"{m.name} promoted at {end} < acked {self.acked}")
        self.acked = min(self.acked, end)
        self.acked_timeline, self.acked_history = m.timeline, m.history

    # -- faults and traffic ---------------------------------------------------------------------

    def service_primary(self) -> Member | None:
        if self.state.phase != Phase.HEALTHY or self.state.current_primary is None:
            return None
        return self.members[self.state.current_primary]

    def commit(self) -> None:
        p = self.service_primary()
        if p is None or not self.can_ack(p):
            return
        p.lsn += 1
        if not self.config.synchronous:
            self.ack(p)
            return
        streaming = [
            s
            for s in self.members.values()
            if s.role == Role.STANDBY
            and s.source == p.name
            and self.linked(s, p)
            and s.timeline == p.timeline
        ]
        if streaming or self.config.sync_policy == SyncPolicy.DEGRADE_TO_ASYNC:
            if streaming:
                streaming[0].lsn = p.lsn  # the synchronous standby flushed it
            self.ack(p)

    def ack(self, p: Member) -> None:
        if p.timeline == self.acked_timeline:
            self.acked = max(self.acked, p.lsn)
        else:
            self.acked, self.acked_timeline, self.acked_history = p.lsn, p.timeline, p.history

    def replicate(self, index: int, amount: int) -> None:
        s = list(self.members.values())[index % len(self.members)]
        p = self.members.get(s.source or "")
        if (
            s.role == Role.STANDBY
            and p is not None
            and self.linked(s, p)
            and s.timeline == p.timeline
        ):
            s.lsn = min(p.lsn, s.lsn + amount)

    def observe(self) -> Observation:
        out = {}
        for m in self.members.values():
            reachable = m.alive and m.pod_exists and not self.cut_off(m)
            since = m.frozen_since if m.frozen_since is not None else m.partitioned_since
            if not reachable:  # nothing is known of a member that does not answer
                out[m.name] = MemberObservation(
                    m.name,
                    pod_exists=m.pod_exists,
                    pod_deleting=m.deleting,
                    node_lost=since is not None and self.now - since >= self.grace,
                    pod_created=m.created,
                )
                continue
            out[m.name] = MemberObservation(
                m.name,
                reachable=reachable,
                role=m.role,
                timeline=m.timeline,
                received_lsn=m.lsn,
                replay_lsn=m.lsn,
                streaming_from=m.source if m.role == Role.STANDBY else None,
                pod_exists=m.pod_exists,
                pod_deleting=m.deleting,
                node_lost=since is not None and self.now - since >= self.grace,
                pod_created=m.created,
                ready=m.ready,
                position_known=m.role == Role.PRIMARY or not m.recovering,
            )
        return Observation(self.now, out)

    def operator(self) -> Decision:
        decision = decide(self.state, self.observe(), self.config)
        self.check_state(decision.state)
        # The driver keeps the state in the instance's status: it must come back whole.
        assert state_from_instance_status(instance_status_fields(decision.state)) == decision.state
        self.state = decision.state
        return decision

    def check_state(self, state: HAState) -> None:
        assert state.target_primary in (None, PENDING, *self.config.members)
        if state.phase == Phase.HEALTHY:
            assert state.target_primary == state.current_primary
        if self.state.target_primary not in (None, PENDING) and state.target_primary not in (
            None,
            PENDING,
            self.state.target_primary,
        ):
            pytest.fail(
                f"target moved {self.state.target_primary} -> {state.target_primary} "
                "without passing through pending"
            )

    def delete_pod(self, name: str) -> None:
        m = self.members[name]
        if m.pod_exists and m.frozen_since is None and m.partitioned_since is None:
            m.deleting = True

    def step(self, action: tuple[str, int, int]) -> None:
        kind, index, amount = action
        m = list(self.members.values())[index % len(self.members)]
        if kind == "tick":
            self.now += amount / 2
        elif kind == "commit":
            for _ in range(amount % 4 + 1):
                self.commit()
        elif kind == "replicate":
            self.replicate(index, amount)
        elif kind == "crash":  # postmaster SIGKILL: the container restarts
            self.restart(m)
        elif kind == "freeze":
            m.frozen_since = self.now if m.frozen_since is None else m.frozen_since
        elif kind == "partition":
            m.partitioned_since = self.now if m.partitioned_since is None else m.partitioned_since
        elif kind == "heal":
            self.heal(m)
        elif kind == "delete":
            self.delete_pod(m.name)
        elif kind == "terminate":  # a deleting Pod's grace period ends: gone, then recreated
            if m.deleting:
                self.restart(m)
                m.pod_exists, m.deleting = False, False
        elif kind == "recreate":
            if not m.pod_exists:
                m.pod_exists, m.created = True, self.now
        elif kind == "switchover":
            self.config = replace(self.config, switchover_to=m.name)
        elif kind == "operator":
            self.operator()
        self.agents()
        self.check_primaries()

    def restart(self, m: Member) -> None:
        if m.role != Role.STARTING:
            m.prior = m.role
        m.role, m.source = Role.STARTING, None
        m.recovering = True

    def heal(self, m: Member) -> None:
        m.frozen_since = m.partitioned_since = None
        # Back on the network: the agent reads the target before anything else.
        if m.role == Role.PRIMARY and self.state.target_primary != m.name:
            m.role, m.source = Role.FENCED, None

    def check_primaries(self) -> None:
        acking = [m.name for m in self.members.values() if self.can_ack(m)]
        assert len(acking) <= 1, f"two primaries can acknowledge commits: {acking}"


ACTIONS = st.tuples(
    st.sampled_from(
        [
            "tick",
            "tick",
            "commit",
            "commit",
            "replicate",
            "replicate",
            "crash",
            "freeze",
            "partition",
            "heal",
            "delete",
            "terminate",
            "recreate",
            "switchover",
            "operator",
            "operator",
            "operator",
        ]
    ),
    st.integers(0, 2),
    st.integers(1, 30),
)


def settle(world: World) -> None:
    """Every fault heals; the operator and the members run until things stop changing."""
    world.config = replace(world.config, switchover_to=None)
    for m in world.members.values():
        world.heal(m)
        if m.deleting:
            world.restart(m)
            m.deleting = False
        if not m.pod_exists:
            m.pod_exists, m.created = True, world.now
        m.alive = True
    for _ in range(60):
        world.now += 5
        world.operator()
        world.agents()
        for i in range(len(world.members)):
            world.replicate(i, 10**6)
        world.check_primaries()


def run_world(
    actions: list[tuple[str, int, int]],
    synchronous: bool,
    policy: SyncPolicy,
    grace: float,
    delay: float,
) -> None:
    config = HAConfig(MEMBERS, synchronous=synchronous, sync_policy=policy, failover_delay=delay)
    world = World(config, grace)
    world.operator()
    world.agents()  # db-0 starts as primary, the others clone it
    world.operator()
    world.agents()
    zero_loss = synchronous and policy == SyncPolicy.ZERO_LOSS
    for action in actions:
        world.step(action)
        if zero_loss:
            assert world.lost_acks == []
    settle(world)
    state = world.state
    assert state.phase == Phase.HEALTHY, (state, world.observe())
    p = world.members[state.current_primary or ""]
    assert world.can_ack(p)
    followers = [
        m.name
        for m in world.members.values()
        if m.name != p.name and (m.role != Role.STANDBY or m.source != p.name)
    ]
    assert followers == [], world.observe()
    if zero_loss:
        assert world.lost_acks == []


@settings(max_examples=300, deadline=None)
@given(
    actions=st.lists(ACTIONS, max_size=60),
    synchronous=st.booleans(),
    policy=st.sampled_from(list(SyncPolicy)),
    grace=st.sampled_from([0.0, 5.0, 40.0]),
    delay=st.sampled_from([0.0, 3.0]),
)
def test_simulated_instance_keeps_the_guarantees(
    actions: list[tuple[str, int, int]],
    synchronous: bool,
    policy: SyncPolicy,
    grace: float,
    delay: float,
) -> None:
    run_world(actions, synchronous, policy, grace, delay)


TRAFFIC = st.tuples(st.sampled_from(["commit", "replicate"]), st.integers(0, 2), st.integers(1, 30))
FAULT = st.tuples(
    st.sampled_from(["crash", "freeze", "partition", "delete", "terminate", "switchover"]),
    st.integers(0, 2),
    st.just(1),
)
ROUND = st.tuples(
    st.sampled_from(["operator", "operator", "tick", "heal", "recreate", "commit", "replicate"]),
    st.integers(0, 2),
    st.integers(1, 30),
)


@st.composite
def fault_scenarios(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Traffic, then one to three faults at once, then operator rounds as time passes: the
    shape of a failover, which the free-form sequences reach only rarely."""
    actions: list[tuple[str, int, int]] = []
    for _ in range(draw(st.integers(1, 3))):
        actions += draw(st.lists(TRAFFIC, max_size=12))
        actions += draw(st.lists(FAULT, min_size=1, max_size=3))
        actions += draw(st.lists(ROUND, min_size=3, max_size=16))
    return actions


@settings(max_examples=300, deadline=None)
@example(  # the synchronous standby frozen, then the primary's Pod deleted
    actions=[("commit", 0, 1), ("freeze", 1, 1), ("delete", 0, 1)] + [("operator", 0, 1)] * 3,
    synchronous=True,
    policy=SyncPolicy.ZERO_LOSS,
    grace=0.0,
)
@example(  # the synchronous standby frozen, then the primary's node lost
    actions=[
        ("commit", 0, 1),
        ("freeze", 1, 1),
        ("freeze", 0, 1),
        ("operator", 0, 1),
        ("tick", 0, 30),
        ("operator", 0, 1),
        ("operator", 0, 1),
        ("operator", 0, 1),
    ],
    synchronous=True,
    policy=SyncPolicy.ZERO_LOSS,
    grace=0.0,
)
@example(  # the primary partitioned, the operator's rounds right after
    actions=[("tick", 0, 20), ("partition", 0, 1), ("operator", 0, 1), ("operator", 0, 1)],
    synchronous=False,
    policy=SyncPolicy.ZERO_LOSS,
    grace=0.0,
)
@given(
    actions=fault_scenarios(),
    synchronous=st.booleans(),
    policy=st.sampled_from(list(SyncPolicy)),
    grace=st.sampled_from([0.0, 5.0, 40.0]),
)
def test_simulated_failovers_keep_the_guarantees(
    actions: list[tuple[str, int, int]], synchronous: bool, policy: SyncPolicy, grace: float
) -> None:
    run_world(actions, synchronous, policy, grace, 0.0)


def test_a_pod_created_after_its_fence_is_confirmed_at_once() -> None:
    config = HAConfig(MEMBERS)
    lost = decide(healthy_state(), observe(10, down("db-0"), standby("db-1", source=None)), config)
    assert lost.state.fenced_at == {"db-0": 10}
    same_pod = observe(
        12,
        down("db-0", pod_created=5.0),
        standby("db-1", source=None),
        standby("db-2", source=None),
    )
    assert decide(lost.state, same_pod, config).state.phase == Phase.FENCING
    new_pod = observe(
        12,
        down("db-0", pod_created=11.5),
        standby("db-1", source=None),
        standby("db-2", source=None),
    )
    assert decide(lost.state, new_pod, config).state.phase == Phase.PROMOTING
