"""What a member of a replicated PostgresInstance does, decided from its standing: the rules
of the agent that runs beside PostgreSQL in every Pod, as pure functions.

Each Pod runs two processes that share a directory (``/run/crpy-ha``):

- the **agent** (:mod:`controllers.postgres.agent`, a sidecar in the operator's image) reads
  the instance from the API server every second with the Pod's own ServiceAccount, turns what
  the operator wrote there into a :class:`Desired` for the supervisor (:func:`decide`), and
  answers the operator's ``GET /status`` with a :class:`Report` (:func:`report`);
- the **supervisor** (:mod:`controllers.postgres.supervisor`, the postgres container's
  entrypoint) starts, stops, promotes, clones and rewinds PostgreSQL as :class:`Desired`
  says, and stops a primary at once when its lease runs out.

What the operator wrote (:class:`Standing`, from the instance's status): ``targetPrimary``
(``pending`` while nobody may be primary), ``ha.fenced``, ``ha.phase``, ``currentPrimary``
and ``ha.timeline``; from the spec, the replica count and the synchronous settings.

The rules, which the failover machine (:mod:`controllers.postgres.failover`) relies on:

1. **Leave when not the unfenced target.** A read that shows this member is not the target,
   or is fenced, withdraws the primary role: a running primary is stopped (fast shutdown, so
   its standbys receive every WAL record before it exits).
2. **Serve only while confirmed.** A primary keeps a lease: ``isolation_bound - margin``
   seconds (default 10 - 2.5) from the *start* of its last read that confirmed it is the
   unfenced target. The supervisor stops a primary whose lease ran out (immediate shutdown),
   whether the agent cannot reach the API server, hangs, or is gone. So
   ``isolation_bound`` after the operator wrote a fence, the old primary accepts no commit.
   A lone instance (one replica) holds an unbounded lease and says so
   (``Report.lease_bounded``): it has nobody to fail over to, so an API server outage does
   not stop it; the machine never counts on silence for a member that last said so.
3. **Become primary only after a fresh confirmation.** Starting as primary or promoting needs
   a grant from a read that started *after* the last report in which this member said it is
   not a primary. A member the operator saw as "not primary" after writing a fence therefore
   cannot turn primary on a reading older than that fence.
4. **Say "primary" while it may be one.** The report's role is primary whenever the agent
   has granted the role or the supervisor runs (or starts) PostgreSQL as primary, ready or
   not; any other role means the member is not and will not be primary without rule 3.
5. **Follow only a confirmed primary.** A standby re-points to ``currentPrimary`` while the
   phase is Healthy. While the old primary is being fenced (Fencing) it keeps the upstream it
   had, so a primary being fenced keeps its standbys until it stops: they receive all of its
   WAL, its shutdown checkpoint included (cutting them off first could leave the standby that
   gets promoted one record short of the others). Once a target is named (Promoting, the
   fence confirmed) it follows nobody until the new primary is healthy: a frozen old primary
   that thaws then finds no standby to acknowledge a commit for it. A standby that does not
   stream from the
   healthy primary for :data:`REWIND_AFTER` seconds is rewound (``pg_rewind``, which does
   nothing but restart it when the timelines did not diverge), at most once every
   :data:`REWIND_EVERY` seconds.
6. **A crashed primary waits.** With ``failoverDelay`` 0 and standbys to fail over to, a
   primary whose PostgreSQL died is not restarted in place for :data:`CRASH_HOLD` seconds:
   the operator fails over instead. With ``failoverDelay`` > 0, or alone, it restarts at once.
7. **Degrade only when asked.** With ``syncPolicy: DegradeToAsync`` the primary waits for as
   many synchronous standbys as are streaming (``synchronous_standby_names`` overridden), none
   when none is; with ``ZeroLoss`` (default) the configured number always, so commits wait.

Clocks: every time here is the agent's monotonic clock (``CLOCK_BOOTTIME``); the lease goes
to the supervisor as a remaining duration, which it measures on its own clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controllers.postgres.failover import PENDING, Phase, Role, SyncPolicy

ISOLATION_BOUND = 10.0
"""Seconds after its last confirming read within which a primary stops accepting commits
(the failover machine's ``HAConfig.isolation_bound``)."""
LEASE_MARGIN = 2.5
"""Seconds of the bound kept for the supervisor to notice (it checks five times a second)
and stop PostgreSQL, and for the status write of a fence to complete."""
REWIND_AFTER = 15.0
REWIND_EVERY = 60.0
CRASH_HOLD = 10.0
STREAMING_STATES = frozenset({"streaming", "catchup"})
"""WAL receiver (and sender) states of a connected standby."""


@dataclass(frozen=True, slots=True)
class Standing:
    """What the operator wrote, as read from the instance."""

    target: str | None = None
    current: str | None = None
    phase: str | None = None
    fenced: frozenset[str] = frozenset()
    timeline: int = 0
    replicas: int = 1
    sync_number: int = 0
    """Synchronous standbys wanted (0: asynchronous), capped at replicas - 1."""
    sync_method: str = "FIRST"
    sync_policy: SyncPolicy = SyncPolicy.ZERO_LOSS
    failover_delay: float = 0.0

    @property
    def healthy(self) -> bool:
        return self.phase == Phase.HEALTHY and self.current is not None


def standing_of(instance: Mapping[str, Any]) -> Standing:
    """The standing an instance's spec and status give (garbage reads as "nothing written")."""
    spec = instance.get("spec") or {}
    status = instance.get("status") or {}
    found = status.get("ha")
    ha: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    replication = spec.get("replication") or {}
    synchronous = replication.get("synchronous")
    replicas = _int(spec.get("replicas"), 1)
    number = 0
    if isinstance(synchronous, Mapping) and replicas > 1:
        number = max(1, min(_int(synchronous.get("number"), 1), replicas - 1))
    try:
        policy = SyncPolicy(str(replication.get("syncPolicy") or SyncPolicy.ZERO_LOSS))
    except ValueError:
        policy = SyncPolicy.ZERO_LOSS
    method = (
        "ANY"
        if isinstance(synchronous, Mapping) and synchronous.get("method") == "Any"
        else "FIRST"
    )
    return Standing(
        target=_str(status.get("targetPrimary")),
        current=_str(status.get("currentPrimary")),
        phase=_str(ha.get("phase")),
        fenced=frozenset(n for n in ha.get("fenced") or () if isinstance(n, str)),
        timeline=_int(ha.get("timeline"), 0),
        replicas=replicas,
        sync_number=number,
        sync_method=method,
        sync_policy=policy,
        failover_delay=float(replication.get("failoverDelay") or 0),
    )


@dataclass(frozen=True, slots=True)
class SupervisorState:
    """What the supervisor last wrote (its ``state`` file)."""

    mode: str = "none"
    """``primary`` (runs, starts or promotes PostgreSQL as primary), ``standby`` or ``none``."""
    running: bool = False
    data: str = "empty"
    """What the data directory holds: ``empty``, ``primary`` or ``standby``."""
    clean: bool = False
    """Stopped, and the data directory says it was shut down cleanly."""
    final_lsn: int = 0
    """A cleanly stopped primary's last WAL record (its shutdown checkpoint)."""
    final_timeline: int = 0
    grant: int = 0
    """The last grant it acted on."""
    stopped_by: str = ""
    """Why PostgreSQL last stopped: ``crash``, ``lease``, ``request``, or empty."""
    stopped_for: float = 0.0
    """Seconds since it stopped (as the supervisor measured when it wrote the file)."""
    terminating: bool = False
    phase: str = ""
    error: str = ""


def supervisor_state(text: str) -> SupervisorState:
    """Parse the supervisor's ``key=value`` lines (unknown keys and bad values ignored)."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return SupervisorState(
        mode=values.get("mode", "none") or "none",
        running=values.get("running") == "1",
        data=values.get("data", "empty") or "empty",
        clean=values.get("clean") == "1",
        final_lsn=parse_lsn(values.get("final", "")),
        final_timeline=_int(values.get("final_tli"), 0),
        grant=_int(values.get("grant"), 0),
        stopped_by=values.get("stopped_by", ""),
        stopped_for=_int(values.get("stopped_for_cs"), 0) / 100,
        terminating=values.get("terminating") == "1",
        phase=values.get("phase", ""),
        error=values.get("error", ""),
    )


@dataclass(frozen=True, slots=True)
class Replica:
    """One row of ``pg_stat_replication`` on a primary."""

    name: str
    state: str
    sync_state: str
    flush_lsn: int
    replay_lsn: int
    replay_lag: float | None


@dataclass(frozen=True, slots=True)
class Postgres:
    """What the local server says over its socket (one query)."""

    in_recovery: bool
    timeline: int = 0
    """The primary's current timeline, or the timeline a standby last received."""
    current_lsn: int = 0
    received_lsn: int = 0
    replay_lsn: int = 0
    receiver_host: str | None = None
    """``host port`` of the WAL receiver's upstream."""
    receiver_status: str | None = None
    local_wal_replayed: bool = False
    """A standby's startup process waits for more WAL: it replayed what it had."""
    replay_age: float | None = None
    """Seconds since the last transaction a standby replayed committed."""
    replicas: tuple[Replica, ...] = ()
    sync_names: str = ""


@dataclass(frozen=True, slots=True)
class Desired:
    """What the supervisor must do (its ``desired`` file)."""

    mode: str = "standby"
    """``primary`` or ``standby``."""
    upstream: str = ""
    """``host port`` of the primary to stream from, or empty."""
    grant: int = 0
    lease: float = 0.0
    """Seconds the primary lease has left when written; ``inf``: unbounded; 0: none."""
    sync_names: str | None = None
    """Override of ``synchronous_standby_names`` (``None``: the configuration's value)."""
    rewind: int = 0
    """Incremented to ask for a rewind of this standby."""
    hold: bool = True
    """A primary whose Pod is deleted keeps serving a while for a switchover (``False`` for
    a lone instance: nobody can take over, so it stops at once)."""

    def render(self, seq: int) -> str:
        lease = -1 if math.isinf(self.lease) else max(0, int(self.lease * 100))
        sync = "-" if self.sync_names is None else self.sync_names
        return (
            f"seq={seq}\nmode={self.mode}\nupstream={self.upstream}\ngrant={self.grant}\n"
            f"lease_cs={lease}\nsync={sync}\nrewind={self.rewind}\nhold={int(self.hold)}\n"
        )


@dataclass(frozen=True, slots=True)
class AgentState:
    """The agent's memory between rounds."""

    grant: int = 0
    intent_primary: bool = False
    """The agent granted the primary role and has not withdrawn it."""
    confirmed_at: float | None = None
    """Start of the last read that confirmed this member is the unfenced target."""
    last_nonprimary_report: float = -math.inf
    standing: Standing | None = None
    """The last standing read (``None`` before the first read)."""
    upstream: str = ""
    not_streaming_since: float | None = None
    rewind: int = 0
    last_rewind: float = -math.inf
    received_timeline: int = 0
    """The timeline a standby's WAL receiver last reported (kept when it stops)."""
    desired: Desired = field(default_factory=Desired)


def decide(
    state: AgentState,
    *,
    me: str,
    standing: Standing | None,
    read_started: float,
    now: float,
    supervisor: SupervisorState,
    postgres: Postgres | None,
    address_of: Mapping[str, str],
) -> AgentState:
    """The agent's next state after a round; ``standing`` is ``None`` when the read failed.
    ``address_of`` maps a member to its ``host port``. The supervisor's instructions are
    ``result.desired``."""
    if postgres is not None and postgres.in_recovery and postgres.receiver_status:
        state = replace(state, received_timeline=postgres.timeline)
    if (
        state.intent_primary
        and supervisor.grant >= state.grant
        and supervisor.mode != "primary"
        and not supervisor.running
    ):
        # The supervisor acted on the grant and PostgreSQL has stopped since (its lease ran
        # out, it crashed, the container restarted): the grant is spent.
        state = replace(state, intent_primary=False)
    if standing is None:
        # No fresh reading: nothing is granted and the lease is not renewed (rule 2).
        lease = _lease_left(state, now)
        return replace(state, desired=replace(state.desired, lease=lease))
    state = replace(state, standing=standing)
    allowed = standing.target == me and me not in standing.fenced
    if allowed:
        state = _confirm(state, standing, read_started, supervisor)
    else:
        state = replace(state, intent_primary=False, confirmed_at=None)
    upstream = state.upstream if standing.phase == Phase.FENCING else ""  # rule 5
    if standing.healthy and standing.current not in (None, me, PENDING):
        upstream = address_of.get(standing.current or "", "")
    state = replace(state, upstream=upstream)
    state = _rewind(state, now, supervisor, postgres, upstream if standing.healthy else "")
    desired = Desired(
        mode="primary" if state.intent_primary else "standby",
        upstream=upstream,
        grant=state.grant,
        lease=_lease_left(state, now),
        sync_names=_sync_override(standing, postgres),
        rewind=state.rewind,
        hold=standing.replicas > 1,
    )
    return replace(state, desired=desired)


def _confirm(
    state: AgentState, standing: Standing, read_started: float, supervisor: SupervisorState
) -> AgentState:
    """A read confirmed this member is the unfenced target: renew the lease, and grant the
    role if it is not granted and rules 3 and 6 allow."""
    state = replace(state, confirmed_at=read_started)
    if state.intent_primary:
        return state
    if read_started <= state.last_nonprimary_report:
        return state  # rule 3: wait for a read that starts after that report
    crashed = supervisor.data == "primary" and supervisor.stopped_by == "crash"
    if (
        crashed
        and standing.failover_delay <= 0
        and standing.replicas > 1
        and supervisor.stopped_for < CRASH_HOLD
    ):
        return state  # rule 6: the operator fails over
    return replace(state, intent_primary=True, grant=max(state.grant, supervisor.grant) + 1)


def _lease_left(state: AgentState, now: float) -> float:
    if not state.intent_primary or state.confirmed_at is None:
        return 0.0
    if state.standing is not None and state.standing.replicas <= 1:
        return math.inf
    return max(0.0, state.confirmed_at + ISOLATION_BOUND - LEASE_MARGIN - now)


def _rewind(
    state: AgentState,
    now: float,
    supervisor: SupervisorState,
    postgres: Postgres | None,
    upstream: str,
) -> AgentState:
    """Rule 5: ask for a rewind of a running standby that does not stream from the healthy
    primary (``upstream``; empty while there is none)."""
    streaming = (
        postgres is not None
        and postgres.in_recovery
        and postgres.receiver_status in STREAMING_STATES
        and postgres.receiver_host == upstream
    )
    if not upstream or state.intent_primary or not supervisor.running or streaming:
        return replace(state, not_streaming_since=None)
    since = state.not_streaming_since if state.not_streaming_since is not None else now
    state = replace(state, not_streaming_since=since)
    if now - since >= REWIND_AFTER and now - state.last_rewind >= REWIND_EVERY:
        state = replace(state, rewind=state.rewind + 1, last_rewind=now, not_streaming_since=None)
    return state


def _sync_override(standing: Standing, postgres: Postgres | None) -> str | None:
    """Rule 7: ``synchronous_standby_names`` for a DegradeToAsync primary that has fewer
    synchronous candidates streaming than it wants; ``None`` leaves the configuration's."""
    if standing.sync_number == 0 or standing.sync_policy != SyncPolicy.DEGRADE_TO_ASYNC:
        return None
    if postgres is None or postgres.in_recovery:
        return None
    streaming = sum(1 for r in postgres.replicas if r.state == "streaming")
    if streaming >= standing.sync_number:
        return None
    if streaming == 0:
        return ""
    return f"{standing.sync_method} {streaming} (*)"


@dataclass(frozen=True, slots=True)
class Report:
    """What the agent answers on ``GET /status`` (the operator's observation of a member)."""

    name: str
    role: Role
    ready: bool = False
    timeline: int = 0
    received_lsn: int = 0
    replay_lsn: int = 0
    position_known: bool = False
    streaming_from: str | None = None
    lease_bounded: bool = True
    replay_age: float | None = None
    replicas: tuple[Replica, ...] = ()
    supervisor_phase: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": str(self.role),
            "ready": self.ready,
            "timeline": self.timeline,
            "receivedLsn": self.received_lsn,
            "replayLsn": self.replay_lsn,
            "positionKnown": self.position_known,
            "streamingFrom": self.streaming_from,
            "leaseBounded": self.lease_bounded,
            "replayAgeSeconds": self.replay_age,
            "replication": [
                {
                    "name": r.name,
                    "state": r.state,
                    "syncState": r.sync_state,
                    "flushLsn": r.flush_lsn,
                    "replayLsn": r.replay_lsn,
                    "replayLagSeconds": r.replay_lag,
                }
                for r in self.replicas
            ],
            "supervisor": self.supervisor_phase,
            "error": self.error,
        }


def report_of(data: Mapping[str, Any]) -> Report:
    """A report as :meth:`Report.to_json` wrote it (``ValueError`` when it is not one)."""
    try:
        role = Role(str(data["role"]))
        replicas = tuple(
            Replica(
                name=str(r.get("name", "")),
                state=str(r.get("state", "")),
                sync_state=str(r.get("syncState", "")),
                flush_lsn=int(r.get("flushLsn") or 0),
                replay_lsn=int(r.get("replayLsn") or 0),
                replay_lag=_float(r.get("replayLagSeconds")),
            )
            for r in data.get("replication") or ()
            if isinstance(r, Mapping)
        )
        return Report(
            name=str(data["name"]),
            role=role,
            ready=bool(data.get("ready")),
            timeline=int(data.get("timeline") or 0),
            received_lsn=int(data.get("receivedLsn") or 0),
            replay_lsn=int(data.get("replayLsn") or 0),
            position_known=bool(data.get("positionKnown")),
            streaming_from=_str(data.get("streamingFrom")),
            lease_bounded=bool(data.get("leaseBounded", True)),
            replay_age=_float(data.get("replayAgeSeconds")),
            replicas=replicas,
            supervisor_phase=str(data.get("supervisor") or ""),
            error=str(data.get("error") or ""),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"not a member report: {err}") from err


def report(
    state: AgentState,
    *,
    me: str,
    now: float,
    supervisor: SupervisorState,
    postgres: Postgres | None,
    member_of_host: Mapping[str, str],
) -> tuple[Report, AgentState]:
    """The report to answer now, and the agent's state after answering it (rule 4: a report
    that says "not primary" is remembered, for rule 3). ``member_of_host`` maps a WAL
    receiver's host back to a member's name."""
    bounded = state.standing is None or state.standing.replicas > 1
    phase = supervisor.phase
    primary = (
        state.intent_primary
        or supervisor.mode == "primary"
        or (postgres is not None and not postgres.in_recovery)
    )
    if primary:
        ready = postgres is not None and not postgres.in_recovery and supervisor.running
        answer = Report(
            me,
            Role.PRIMARY,
            ready=ready,
            timeline=postgres.timeline if postgres is not None and ready else 0,
            received_lsn=postgres.current_lsn if postgres is not None and ready else 0,
            position_known=ready,
            lease_bounded=bounded,
            replicas=postgres.replicas if postgres is not None else (),
            supervisor_phase=phase,
            error=supervisor.error,
        )
        return answer, state
    if postgres is not None and postgres.in_recovery and supervisor.running:
        connected = postgres.receiver_status in STREAMING_STATES
        source = member_of_host.get(postgres.receiver_host or "") if connected else None
        answer = Report(
            me,
            Role.STANDBY,
            ready=True,
            timeline=max(state.received_timeline, postgres.timeline),
            received_lsn=max(postgres.received_lsn, postgres.replay_lsn),
            replay_lsn=postgres.replay_lsn,
            position_known=postgres.local_wal_replayed or connected,
            streaming_from=source,
            lease_bounded=bounded,
            replay_age=postgres.replay_age,
            supervisor_phase=phase,
            error=supervisor.error,
        )
    elif not supervisor.running and supervisor.data == "primary" and supervisor.clean:
        answer = Report(
            me,
            Role.FENCED,
            timeline=supervisor.final_timeline,
            received_lsn=supervisor.final_lsn,
            replay_lsn=supervisor.final_lsn,
            position_known=supervisor.final_lsn > 0,
            lease_bounded=bounded,
            supervisor_phase=phase,
            error=supervisor.error,
        )
    else:
        answer = Report(
            me, Role.STARTING, lease_bounded=bounded, supervisor_phase=phase, error=supervisor.error
        )
    return answer, replace(state, last_nonprimary_report=now)


def parse_lsn(text: str | None) -> int:
    """``16/B374D848`` as an integer (0 for anything else)."""
    if not text or "/" not in text:
        return 0
    high, _, low = text.strip().partition("/")
    try:
        return (int(high, 16) << 32) + int(low, 16)
    except ValueError:
        return 0


def format_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def _int(value: object, default: int) -> int:
    try:
        return int(value)  # type: ignore[call-overload,no-any-return]
    except (TypeError, ValueError):
        return default


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
