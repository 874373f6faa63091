"""The agent's rules (controllers/postgres/standing.py): grants, leases, following, rewinds,
the DegradeToAsync override and the reports; a property test drives reads, reports and
supervisor states in any order and checks rules 1-4 after every step."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.postgres.failover import PENDING, Role, SyncPolicy
from controllers.postgres.standing import (
    CRASH_HOLD,
    ISOLATION_BOUND,
    LEASE_MARGIN,
    REWIND_AFTER,
    AgentState,
    Desired,
    Postgres,
    Replica,
    Standing,
    SupervisorState,
    decide,
    format_lsn,
    parse_lsn,
    report,
    report_of,
    standing_of,
    supervisor_state,
)

ME = "db-1"
ADDRESSES = {f"db-{i}": f"db-{i}.db-headless 5432" for i in range(3)}
HOSTS = {f"db-{i}.db-headless 5432": f"db-{i}" for i in range(3)}
HEALTHY = Standing(target="db-0", current="db-0", phase="Healthy", replicas=3, timeline=1)
MINE = replace(HEALTHY, target=ME, current=ME)
STOPPED = SupervisorState()
STANDBY_RUNNING = SupervisorState(mode="standby", running=True, data="standby")
STREAMING = Postgres(
    in_recovery=True,
    timeline=1,
    received_lsn=100,
    replay_lsn=90,
    receiver_host="db-0.db-headless 5432",
    receiver_status="streaming",
    local_wal_replayed=True,
)


def round_(
    state: AgentState,
    standing: Standing | None,
    at: float,
    supervisor: SupervisorState = STANDBY_RUNNING,
    postgres: Postgres | None = STREAMING,
) -> AgentState:
    return decide(
        state,
        me=ME,
        standing=standing,
        read_started=at,
        now=at + 0.01,
        supervisor=supervisor,
        postgres=postgres,
        address_of=ADDRESSES,
    )


def answer(
    state: AgentState,
    at: float,
    supervisor: SupervisorState = STANDBY_RUNNING,
    postgres: Postgres | None = STREAMING,
) -> tuple[Role, AgentState]:
    got, after = report(
        state, me=ME, now=at, supervisor=supervisor, postgres=postgres, member_of_host=HOSTS
    )
    return got.role, after


def test_standing_is_read_from_the_spec_and_status() -> None:
    instance = {
        "spec": {
            "replicas": 3,
            "replication": {
                "synchronous": {"number": 5, "method": "Any"},
                "syncPolicy": "DegradeToAsync",
                "failoverDelay": 4,
            },
        },
        "status": {
            "targetPrimary": "pending",
            "currentPrimary": "db-0",
            "ha": {"phase": "Fencing", "fenced": ["db-0", 3], "timeline": 2},
        },
    }
    standing = standing_of(instance)
    assert standing == Standing(
        target=PENDING,
        current="db-0",
        phase="Fencing",
        fenced=frozenset({"db-0"}),
        timeline=2,
        replicas=3,
        sync_number=2,
        sync_method="ANY",
        sync_policy=SyncPolicy.DEGRADE_TO_ASYNC,
        failover_delay=4.0,
    )
    assert standing_of({}) == Standing()
    assert standing_of({"spec": {"replicas": "x"}, "status": {"ha": "x"}}).replicas == 1


def test_the_target_is_granted_the_role_with_a_lease_from_the_start_of_its_read() -> None:
    state = round_(AgentState(), MINE, at=100)
    assert state.intent_primary and state.desired.mode == "primary"
    assert state.desired.grant == 1
    assert math.isclose(state.desired.lease, ISOLATION_BOUND - LEASE_MARGIN - 0.01)
    # Without a reading the lease runs down and nothing new is granted.
    later = decide(
        state,
        me=ME,
        standing=None,
        read_started=105,
        now=106,
        supervisor=STANDBY_RUNNING,
        postgres=STREAMING,
        address_of=ADDRESSES,
    )
    assert later.desired.mode == "primary"
    assert math.isclose(later.desired.lease, 100 + ISOLATION_BOUND - LEASE_MARGIN - 106)
    expired = decide(
        later,
        me=ME,
        standing=None,
        read_started=120,
        now=120,
        supervisor=STANDBY_RUNNING,
        postgres=STREAMING,
        address_of=ADDRESSES,
    )
    assert expired.desired.lease == 0


def test_a_lone_instance_holds_an_unbounded_lease_and_says_so() -> None:
    alone = replace(MINE, replicas=1)
    state = round_(AgentState(), alone, at=1)
    assert state.desired.lease == math.inf
    assert "lease_cs=-1" in state.desired.render(1)
    got, _ = report(
        state, me=ME, now=2, supervisor=STANDBY_RUNNING, postgres=STREAMING, member_of_host=HOSTS
    )
    assert not got.lease_bounded
    got, _ = report(
        round_(AgentState(), MINE, at=1),
        me=ME,
        now=2,
        supervisor=STANDBY_RUNNING,
        postgres=STREAMING,
        member_of_host=HOSTS,
    )
    assert got.lease_bounded


def test_no_grant_from_a_read_that_started_before_a_non_primary_report() -> None:
    role, state = answer(AgentState(), at=10)
    assert role == Role.STANDBY and state.last_nonprimary_report == 10
    stale = round_(state, MINE, at=9.5)  # the read started before that report
    assert not stale.intent_primary and stale.desired.mode == "standby"
    fresh = round_(stale, MINE, at=10.5)
    assert fresh.intent_primary and fresh.desired.mode == "primary"
    role, _ = answer(fresh, at=11)  # still a standby for the server: but granted
    assert role == Role.PRIMARY


def test_a_fence_withdraws_the_role_and_the_lease() -> None:
    granted = round_(AgentState(), MINE, at=1)
    fenced = round_(granted, replace(MINE, target=PENDING, fenced=frozenset({ME})), at=2)
    assert not fenced.intent_primary
    assert fenced.desired == Desired(mode="standby", grant=1, lease=0.0)
    # The supervisor still runs it as primary: the report says primary until it stopped.
    running = SupervisorState(mode="primary", running=True, data="primary")
    primary_postgres = Postgres(in_recovery=False, timeline=1, current_lsn=500)
    role, _ = answer(fenced, at=3, supervisor=running, postgres=primary_postgres)
    assert role == Role.PRIMARY
    stopped = SupervisorState(
        mode="none", data="primary", clean=True, final_lsn=520, final_timeline=1
    )
    got, _ = report(fenced, me=ME, now=4, supervisor=stopped, postgres=None, member_of_host=HOSTS)
    assert (got.role, got.received_lsn, got.timeline, got.position_known) == (
        Role.FENCED,
        520,
        1,
        True,
    )
    crashed = replace(stopped, clean=False)
    got, _ = report(fenced, me=ME, now=4, supervisor=crashed, postgres=None, member_of_host=HOSTS)
    assert got.role == Role.STARTING and not got.position_known


def test_standbys_keep_their_upstream_while_fencing_follow_nobody_while_promoting() -> None:
    following = round_(AgentState(), HEALTHY, at=1)
    assert following.desired.upstream == "db-0.db-headless 5432"
    fencing = replace(HEALTHY, phase="Fencing", target=PENDING)
    # The fenced primary keeps its standbys until it stops: they get all of its WAL.
    kept = round_(following, fencing, at=2)
    assert kept.desired.upstream == "db-0.db-headless 5432"
    assert round_(kept, fencing, at=3).desired.upstream == "db-0.db-headless 5432"
    assert round_(AgentState(), fencing, at=2).desired.upstream == ""
    # Once a target is named, nobody: a thawing old primary finds no standby to confirm.
    promoting = replace(HEALTHY, phase="Promoting", target="db-2")
    assert round_(kept, promoting, at=4).desired.upstream == ""
    assert round_(following, promoting, at=4).desired.upstream == ""
    assert (
        round_(
            AgentState(), replace(HEALTHY, phase="Bootstrap", current=None), at=1
        ).desired.upstream
        == ""
    )
    moved = replace(HEALTHY, current="db-2", target="db-2")
    assert round_(following, moved, at=3).desired.upstream == "db-2.db-headless 5432"
    assert round_(following, MINE, at=3).desired.upstream == ""  # I am the primary now


def test_no_rewind_is_asked_for_while_no_primary_is_healthy() -> None:
    idle = replace(STREAMING, receiver_status=None, receiver_host=None)
    following = round_(AgentState(), HEALTHY, at=0)
    fencing = replace(HEALTHY, phase="Fencing", target=PENDING)
    state = following
    for t in range(1, 100, 10):
        state = round_(state, fencing, at=t, postgres=idle)
        assert state.desired.rewind == 0 and state.not_streaming_since is None


def test_a_crashed_primary_waits_for_the_failover_unless_delayed_or_alone() -> None:
    crashed = SupervisorState(data="primary", stopped_by="crash", stopped_for=1, grant=4)
    held = round_(AgentState(), MINE, at=1, supervisor=crashed, postgres=None)
    assert not held.intent_primary
    late = replace(crashed, stopped_for=CRASH_HOLD)
    assert round_(AgentState(), MINE, at=1, supervisor=late, postgres=None).intent_primary
    delayed = replace(MINE, failover_delay=5)
    again = round_(AgentState(), delayed, at=1, supervisor=crashed, postgres=None)
    assert again.intent_primary and again.desired.grant == 5  # past the supervisor's
    alone = replace(MINE, replicas=1)
    assert round_(AgentState(), alone, at=1, supervisor=crashed, postgres=None).intent_primary


def test_a_standby_that_does_not_stream_from_its_primary_is_rewound_now_and_then() -> None:
    idle = replace(STREAMING, receiver_status=None, receiver_host=None)
    state = round_(AgentState(), HEALTHY, at=0, postgres=idle)
    assert state.not_streaming_since == 0.01 and state.desired.rewind == 0
    state = round_(state, HEALTHY, at=REWIND_AFTER - 1, postgres=idle)
    assert state.desired.rewind == 0
    state = round_(state, HEALTHY, at=REWIND_AFTER, postgres=idle)
    assert state.desired.rewind == 1
    state = round_(state, HEALTHY, at=REWIND_AFTER * 2 + 1, postgres=idle)
    assert state.desired.rewind == 1  # at most once a minute
    state = round_(state, HEALTHY, at=100, postgres=STREAMING)
    assert state.not_streaming_since is None
    # Streaming from another member than the primary counts as not streaming.
    cascading = replace(STREAMING, receiver_host="db-2.db-headless 5432")
    state = round_(state, HEALTHY, at=101, postgres=cascading)
    assert state.not_streaming_since == 101.01


def test_degrade_to_async_waits_for_the_standbys_that_stream() -> None:
    wanting = replace(MINE, sync_number=2, sync_policy=SyncPolicy.DEGRADE_TO_ASYNC)
    primary = SupervisorState(mode="primary", running=True, data="primary")

    def override(*states: str) -> str | None:
        rows = tuple(Replica(f"db-{i}", s, "sync", 0, 0, None) for i, s in enumerate(states))
        postgres = Postgres(in_recovery=False, replicas=rows)
        return round_(AgentState(), wanting, 1, primary, postgres).desired.sync_names

    assert override() == ""
    assert override("catchup") == ""
    assert override("streaming") == "FIRST 1 (*)"
    assert override("streaming", "streaming") is None
    zero_loss = replace(wanting, sync_policy=SyncPolicy.ZERO_LOSS)
    postgres = Postgres(in_recovery=False)
    assert round_(AgentState(), zero_loss, 1, primary, postgres).desired.sync_names is None
    assert "sync=-" in Desired().render(1)
    assert "sync=\n" in Desired(sync_names="").render(1)


def test_reports_round_trip_and_name_the_source() -> None:
    got, _ = report(
        AgentState(),
        me=ME,
        now=1,
        supervisor=STANDBY_RUNNING,
        postgres=STREAMING,
        member_of_host=HOSTS,
    )
    assert got.role == Role.STANDBY and got.streaming_from == "db-0"
    assert got.received_lsn == 100 and got.replay_lsn == 90 and got.position_known
    assert report_of(got.to_json()) == got
    replaying = replace(STREAMING, receiver_status=None, local_wal_replayed=False)
    got, _ = report(
        AgentState(),
        me=ME,
        now=1,
        supervisor=STANDBY_RUNNING,
        postgres=replaying,
        member_of_host=HOSTS,
    )
    assert got.role == Role.STANDBY and not got.position_known and got.streaming_from is None


def test_supervisor_state_and_lsns_parse() -> None:
    text = (
        "mode=primary\nrunning=1\ndata=primary\nclean=0\nfinal=0/3000028\nfinal_tli=2\n"
        "grant=3\nstopped_by=crash\nstopped_for_cs=250\nterminating=1\nphase=running\n"
        "error=a=b\nnonsense\n"
    )
    parsed = supervisor_state(text)
    assert parsed == SupervisorState(
        mode="primary",
        running=True,
        data="primary",
        clean=False,
        final_lsn=0x3000028,
        final_timeline=2,
        grant=3,
        stopped_by="crash",
        stopped_for=2.5,
        terminating=True,
        phase="running",
        error="a=b",
    )
    assert supervisor_state("") == SupervisorState()
    assert parse_lsn("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert parse_lsn(format_lsn(123456789012)) == 123456789012
    assert parse_lsn("garbage") == 0 and parse_lsn(None) == 0


# ---- rules 1-4 under any interleaving ------------------------------------------------------

STANDINGS = st.sampled_from(
    [
        None,
        MINE,
        HEALTHY,
        replace(MINE, fenced=frozenset({ME})),
        replace(HEALTHY, target=PENDING, phase="Fencing"),
        replace(MINE, phase="Promoting"),
    ]
)
SUPERVISORS = st.sampled_from(
    [
        STOPPED,
        STANDBY_RUNNING,
        SupervisorState(mode="primary", running=True, data="primary"),
        SupervisorState(mode="primary", running=False, data="primary"),
        SupervisorState(data="primary", clean=True, final_lsn=10, final_timeline=1),
        SupervisorState(data="primary", stopped_by="crash", stopped_for=20),
    ]
)
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "report"]),
        STANDINGS,
        SUPERVISORS,
        st.floats(0.0, 3.0),  # how long before "now" the read started
        st.floats(0.01, 2.0),  # time passing
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_grants_follow_reads_that_postdate_every_non_primary_report(
    steps: list[tuple[str, Standing | None, SupervisorState, float, float]],
) -> None:
    state = AgentState()
    now = 0.0
    for kind, standing, supervisor, lag, step in steps:
        now += step
        if kind == "report":
            got, state = report(
                state,
                me=ME,
                now=now,
                supervisor=supervisor,
                postgres=None,
                member_of_host=HOSTS,
            )
            # Rule 4: "not primary" only when nothing grants or runs the role.
            if got.role != Role.PRIMARY:
                assert not state.intent_primary and supervisor.mode != "primary"
            continue
        read_started = max(0.0, now - lag)
        before = state
        state = decide(
            state,
            me=ME,
            standing=standing,
            read_started=read_started,
            now=now,
            supervisor=supervisor,
            postgres=None,
            address_of=ADDRESSES,
        )
        if state.intent_primary and not before.intent_primary:
            # Rule 3: a new grant comes from a fresh read that postdates every report of
            # "not primary" and shows this member as the unfenced target.
            assert standing is not None and standing.target == ME
            assert ME not in standing.fenced
            assert read_started > before.last_nonprimary_report
            assert state.desired.grant > before.desired.grant
        if standing is not None and (standing.target != ME or ME in standing.fenced):
            assert state.desired.mode == "standby" and state.desired.lease == 0  # rule 1
        if state.desired.lease > 0 and not math.isinf(state.desired.lease):
            # Rule 2: the lease ends at most bound - margin after the confirming read began.
            assert state.confirmed_at is not None
            assert now + state.desired.lease <= state.confirmed_at + ISOLATION_BOUND - LEASE_MARGIN
