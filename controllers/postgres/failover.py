"""The high-availability decisions of a replicated PostgresInstance, as a sans-IO state machine.

:func:`decide` takes what the operator believes (:class:`HAState`, kept in the instance's
status so a new leader resumes where the old one stopped), what it observed this round
(:class:`Observation`: each member's role, timeline and LSNs as the member reports them, its Pod
and its node) and the settings (:class:`HAConfig`), and returns the next state and the Events to
record. Nothing here does I/O or reads a clock, so the same rules run in the operator and under
hypothesis against a simulated cluster (``tests/unit/controllers/postgres/test_failover.py``).

The driver turns the state into the cluster's configuration, declaratively:

- ``target_primary`` is what every Pod's entrypoint reads: the member it names runs as primary
  (promoting itself if it was a standby); every other member follows it. ``PENDING`` names no
  one: nobody may become primary.
- ``fenced``: members that must not serve as primary (their postmaster is stopped, or demoted).
- The ``primary`` Pod label (and so the ``<name>-primary`` Service) is on ``current_primary`` only
  while the phase is :attr:`Phase.HEALTHY`: a fenced or failing primary leaves the Service at once.

The driver is :mod:`controllers.postgres.ha` (the operator's side: observations from each Pod's
agent, the state in the instance's status through :func:`instance_status_fields`); the members'
side is :mod:`controllers.postgres.standing` (the agent's rules) and
:mod:`controllers.postgres.supervisor` (the container's entrypoint).

Phases and transitions::

    BOOTSTRAP   the first member reports role primary                     -> HEALTHY
    HEALTHY     the primary is unhealthy for failover_delay (failover)    -> FENCING
    HEALTHY     a switchover is asked for, or the primary's Pod is        -> FENCING
                being deleted, and a caught-up standby exists (switchover)
    FENCING     the old primary is confirmed fenced (or silent for
                isolation_bound after its fence), no standby streams from
                it, and an eligible candidate exists                      -> PROMOTING
    FENCING     no candidate is eligible (or, in a switchover, none caught
                up within switchover_timeout), and the old primary reports
                it is fenced and intact (it holds every commit): resume   -> PROMOTING
    PROMOTING   the target reports role primary on a newer timeline (or,
                resuming, the old primary on its own)                     -> HEALTHY
    PROMOTING   the target is unreachable for promote_timeout: fence it   -> FENCING

Guarantees (each attacked by the property test):

- **Never two primaries.** A member is promoted only when every other member that may run as
  primary is confirmed fenced: it reports a role other than primary, its Pod is gone, or its
  fence was written at least ``isolation_bound`` seconds ago and it does not answer (the bound
  within which a primary that cannot read its own standing stops accepting commits by itself:
  :func:`fence_confirmed`). Only one target exists at a time, and it changes only through
  ``PENDING``.
- **Zero loss in synchronous mode** (``SyncPolicy.ZERO_LOSS``): every acknowledged commit is
  flushed on at least one standby that held the synchronous role, so a candidate is eligible only
  when it has received at least the old primary's final LSN (when the fenced primary reports it)
  or, otherwise, when every standby that may have held the synchronous role reports and the
  candidate is the most advanced of them. With ``FIRST 1 (*)`` any streaming standby may become
  the synchronous one, so that is every member but the old primary (a restarting one included:
  its WAL is on its volume). Failing that, no one is promoted (the instance waits: availability
  is given up for the data).
- ``SyncPolicy.DEGRADE_TO_ASYNC`` and asynchronous mode promote the most advanced standby that
  reports; what the others had beyond it is lost (bounded by their replication lag).
- Candidates are standbys of the old primary's timeline, not being deleted, not fenced, on a
  node that is not lost, whose WAL position is known (``position_known``: a member replaying
  its own WAL after a restart cannot tell yet, and zero-loss mode waits for it); ties break on
  replayed LSN, then the name.
- A primary that answers but does not accept connections (``ready=False``: restarting,
  recovering) is unhealthy; its fence is confirmed only once it reports another role.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

PENDING = "pending"
"""``target_primary`` while a failover or switchover has fenced the old primary and has not
named the new one: no member may run as primary."""


class Role(enum.StrEnum):
    """What a member reports it is."""

    PRIMARY = "primary"
    STANDBY = "standby"
    FENCED = "fenced"
    """Its postmaster is stopped on the operator's request (it serves nothing)."""
    STARTING = "starting"
    """Cloning, recovering or restarting: not yet a primary or a standby."""


class Phase(enum.StrEnum):
    BOOTSTRAP = "Bootstrap"
    HEALTHY = "Healthy"
    FENCING = "Fencing"
    PROMOTING = "Promoting"


class SyncPolicy(enum.StrEnum):
    """What synchronous replication gives up when the standbys it needs are missing."""

    ZERO_LOSS = "ZeroLoss"
    """Commits wait for a standby; failover promotes only a standby that has every acknowledged
    commit (or waits). The default."""
    DEGRADE_TO_ASYNC = "DegradeToAsync"
    """Commits go on without standbys, and failover promotes the most advanced standby that
    reports: availability first, what was not replicated is lost."""


@dataclass(frozen=True, slots=True)
class HAConfig:
    """The instance's settings, from its spec."""

    members: tuple[str, ...]
    """Every member's name, in ordinal order (the first one bootstraps as primary)."""
    synchronous: bool = False
    sync_policy: SyncPolicy = SyncPolicy.ZERO_LOSS
    failover_delay: float = 0.0
    """Seconds the primary must be unhealthy before failover starts."""
    isolation_bound: float = 10.0
    """Seconds within which a primary that cannot confirm it is still the target stops
    accepting commits by itself; a silent fenced member counts as fenced this long after its
    fence was written."""
    promote_timeout: float = 30.0
    """Seconds a promoted target may stay unreachable before it is fenced in turn."""
    switchover_timeout: float = 30.0
    """Seconds a switchover waits for a standby to catch up with the fenced primary's final
    LSN before the old primary resumes (the switchover is then abandoned)."""
    switchover_to: str | None = None
    """A planned switchover's target (the spec's), or ``None``."""
    max_switchover_lag: int = 16 * 1024 * 1024
    """A switchover starts only towards a standby at most this many bytes behind the primary."""


@dataclass(frozen=True, slots=True)
class MemberObservation:
    """One member as observed in one round. A member that did not answer has
    ``reachable=False`` and its other data fields are meaningless."""

    name: str
    reachable: bool = False
    role: Role = Role.STARTING
    timeline: int = 0
    received_lsn: int = 0
    """A standby's last received and flushed LSN; a primary's (or a fenced one's) current or
    final LSN."""
    replay_lsn: int = 0
    streaming_from: str | None = None
    """The primary this standby's WAL receiver streams from, ``None`` when it does not."""
    pod_exists: bool = True
    pod_deleting: bool = False
    node_lost: bool = False
    """Its node is not Ready (the control plane's node-monitor grace period passed)."""
    pod_created: float | None = None
    """When its current Pod was created: a Pod created after the member's fence was written
    read that fence when it started, so it is not the Pod that served as primary."""
    ready: bool = True
    """A primary accepts connections (``False`` while it starts, recovers or stops: it is, or
    may become, a primary, but serves nothing yet)."""
    position_known: bool = True
    """``received_lsn`` is where the member's WAL really ends. ``False`` for a member that
    answers but cannot tell yet (restarting, cloning, replaying its own WAL, stopped after a
    crash): it is no candidate, and zero-loss mode waits for it as for a silent member."""
    lease_bounded: bool = True
    """The member's own rule holds for it: were it primary, it would stop accepting commits
    within ``isolation_bound`` of its last confirmed reading. ``False`` while its last reading
    was of a single-replica instance (a lone primary keeps serving when it cannot read)."""


@dataclass(frozen=True, slots=True)
class Observation:
    now: float
    members: Mapping[str, MemberObservation]

    def get(self, name: str | None) -> MemberObservation:
        if name is None:
            return MemberObservation("")
        return self.members.get(name) or MemberObservation(name, pod_exists=False)


@dataclass(frozen=True, slots=True)
class HAState:
    """What the operator believes; kept in the instance's status."""

    phase: Phase = Phase.BOOTSTRAP
    current_primary: str | None = None
    target_primary: str | None = None
    timeline: int = 0
    """The current primary's timeline, as last reported."""
    fenced: frozenset[str] = frozenset()
    fenced_at: Mapping[str, float] = field(default_factory=dict)
    """When each fenced member's fence was written."""
    old_primary: str | None = None
    """During FENCING and PROMOTING: the primary being replaced."""
    switchover: bool = False
    """The running transition is a switchover (planned), not a failover."""
    preferred: str | None = None
    """A switchover's wanted target."""
    failing_since: float | None = None
    transition_started: float | None = None
    last_seen: Mapping[str, float] = field(default_factory=dict)
    """When each member last answered."""
    failovers: int = 0
    switchovers: int = 0
    last_transition_seconds: float | None = None
    """Duration of the last completed failover or switchover (start to new primary)."""
    current_since: float | None = None
    target_since: float | None = None
    unbounded: frozenset[str] = frozenset()
    """Members whose last report said their lease is unbounded (``lease_bounded=False``):
    silence does not confirm their fence."""

    def to_status(self) -> dict[str, Any]:
        """A JSON-ready form (see :func:`state_from_status`)."""
        return {
            "phase": str(self.phase),
            "currentPrimary": self.current_primary,
            "targetPrimary": self.target_primary,
            "timeline": self.timeline,
            "fenced": sorted(self.fenced),
            "fencedAt": {n: self.fenced_at[n] for n in sorted(self.fenced_at)},
            "oldPrimary": self.old_primary,
            "switchover": self.switchover,
            "preferred": self.preferred,
            "failingSince": self.failing_since,
            "transitionStarted": self.transition_started,
            "lastSeen": dict(sorted(self.last_seen.items())),
            "failovers": self.failovers,
            "switchovers": self.switchovers,
            "lastTransitionSeconds": self.last_transition_seconds,
            "currentSince": self.current_since,
            "targetSince": self.target_since,
            "unbounded": sorted(self.unbounded),
        }


def state_from_status(data: Mapping[str, Any] | None) -> HAState:
    """The state :meth:`HAState.to_status` wrote; a fresh state for ``None`` or garbage."""
    if not isinstance(data, Mapping):
        return HAState()
    try:
        phase = Phase(str(data.get("phase", Phase.BOOTSTRAP)))
    except ValueError:
        phase = Phase.BOOTSTRAP

    def opt_str(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) and value else None

    def opt_float(key: str) -> float | None:
        value = data.get(key)
        return float(value) if isinstance(value, int | float) else None

    seen = data.get("lastSeen")
    fenced_at = data.get("fencedAt")
    return HAState(
        phase=phase,
        current_primary=opt_str("currentPrimary"),
        target_primary=opt_str("targetPrimary"),
        timeline=int(data.get("timeline") or 0),
        fenced=frozenset(str(n) for n in data.get("fenced") or () if isinstance(n, str)),
        old_primary=opt_str("oldPrimary"),
        switchover=bool(data.get("switchover")),
        preferred=opt_str("preferred"),
        failing_since=opt_float("failingSince"),
        transition_started=opt_float("transitionStarted"),
        fenced_at={
            str(k): float(v)
            for k, v in (fenced_at.items() if isinstance(fenced_at, Mapping) else ())
            if isinstance(v, int | float)
        },
        last_seen={
            str(k): float(v)
            for k, v in (seen.items() if isinstance(seen, Mapping) else ())
            if isinstance(v, int | float)
        },
        failovers=int(data.get("failovers") or 0),
        switchovers=int(data.get("switchovers") or 0),
        last_transition_seconds=opt_float("lastTransitionSeconds"),
        current_since=opt_float("currentSince"),
        target_since=opt_float("targetSince"),
        unbounded=frozenset(str(n) for n in data.get("unbounded") or () if isinstance(n, str)),
    )


_TOP_LEVEL = ("currentPrimary", "targetPrimary", "failovers", "switchovers")
_HA_LEVEL = ("phase", "fenced", "timeline")


def instance_status_fields(state: HAState) -> dict[str, Any]:
    """The state as a PostgresInstance's status holds it: ``currentPrimary`` and
    ``targetPrimary`` (each with an RFC 3339 ``…Timestamp`` of when it last changed),
    ``failovers``, ``switchovers`` and ``lastTransitionSeconds`` at the top; ``ha.phase``,
    ``ha.fenced`` and ``ha.timeline``; the rest of the record in ``ha.state``. Read back
    with :func:`state_from_instance_status`."""
    flat = state.to_status()
    top: dict[str, Any] = {key: flat.pop(key) for key in _TOP_LEVEL}
    top["lastTransitionSeconds"] = flat.pop("lastTransitionSeconds")
    top["currentPrimaryTimestamp"] = _rfc3339(state.current_since)
    top["targetPrimaryTimestamp"] = _rfc3339(state.target_since)
    ha: dict[str, Any] = {key: flat.pop(key) for key in _HA_LEVEL}
    ha["state"] = flat
    top["ha"] = ha
    return top


def state_from_instance_status(status: Mapping[str, Any] | None) -> HAState:
    """The state :func:`instance_status_fields` wrote into ``status`` (a fresh state when it
    holds none)."""
    if not isinstance(status, Mapping):
        return HAState()
    ha = status.get("ha")
    if not isinstance(ha, Mapping) or not ha.get("phase"):
        return HAState()
    inner = ha.get("state")
    flat: dict[str, Any] = dict(inner) if isinstance(inner, Mapping) else {}
    flat.update({key: status.get(key) for key in _TOP_LEVEL})
    flat["lastTransitionSeconds"] = status.get("lastTransitionSeconds")
    flat.update({key: ha.get(key) for key in _HA_LEVEL})
    return state_from_status(flat)


def _rfc3339(when: float | None) -> str | None:
    if when is None:
        return None
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Event:
    """An Event to record on the instance (``type`` Normal or Warning)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    state: HAState
    events: tuple[Event, ...] = ()
    waiting: str = ""
    """Why the transition in progress cannot go on yet (empty when it is not stuck); the
    driver puts it in a condition."""


def healthy_primary(member: MemberObservation) -> bool:
    """The member answers as a primary that accepts connections, its Pod is not being
    deleted and its node is up."""
    return (
        member.reachable
        and member.role == Role.PRIMARY
        and member.ready
        and member.pod_exists
        and not member.pod_deleting
        and not member.node_lost
    )


def fence_confirmed(
    member: MemberObservation, state: HAState, config: HAConfig, now: float
) -> bool:
    """The member cannot accept commits: it reports it is not a primary, its Pod is gone, or
    its fence was written at least ``isolation_bound`` seconds ago and it does not answer.

    The last rule rests on the members' own rule: a primary accepts commits only while it has
    read, within the last ``isolation_bound`` seconds, that it is the unfenced target (or every
    peer confirms it follows it). Its last such read came before the fence was written, so
    ``isolation_bound`` after the fence it has stopped, whether it reads the fence, is cut off,
    or is frozen (a frozen process commits nothing, and re-checks when it thaws). When it was
    last *seen* says nothing: it may have served unobserved until the fence. A Pod created
    after the fence is confirmed at once: it read the fence at start. Silence confirms
    nothing for a member whose last report said its lease is unbounded (a lone primary's)."""
    if not member.pod_exists:
        return True
    if member.reachable:
        return member.role != Role.PRIMARY
    written = state.fenced_at.get(member.name)
    if written is None:
        return False
    if member.pod_created is not None and member.pod_created > written + 1:
        return True  # a new Pod (the creation time has whole seconds: one more to be sure)
    if member.name in state.unbounded:
        return False
    return now - written >= config.isolation_bound


def _fence(state: HAState, name: str, now: float) -> HAState:
    at = dict(state.fenced_at)
    at.setdefault(name, now)
    return replace(state, fenced=state.fenced | {name}, fenced_at=at)


def _unfence(state: HAState, names: Iterable[str]) -> HAState:
    gone = set(names)
    return replace(
        state,
        fenced=state.fenced - gone,
        fenced_at={n: t for n, t in state.fenced_at.items() if n not in gone},
    )


def position(member: MemberObservation) -> tuple[int, int]:
    """How far a member's WAL goes: timeline first (a newer timeline was forked from a member
    that had every acknowledged commit), then the received LSN."""
    return (member.timeline, member.received_lsn)


def _intact(member: MemberObservation) -> bool:
    return (
        member.reachable
        and member.position_known
        and member.pod_exists
        and not member.pod_deleting
        and not member.node_lost
    )


def candidates(state: HAState, obs: Observation, config: HAConfig) -> list[MemberObservation]:
    """Members that could take over, best first: reachable, not going away, stopped (fenced)
    or standing by, at the current timeline or a newer one. Best is the furthest WAL
    (:func:`position`), then the replayed LSN, then a switchover's wanted target, then any
    member but the old primary (handing over rather than restarting in place), then the name."""
    found = [
        m
        for name in config.members
        if _intact(m := obs.get(name))
        and m.role in (Role.STANDBY, Role.FENCED)
        and m.timeline >= state.timeline
    ]

    def key(m: MemberObservation) -> tuple[int, int, int, bool, bool, str]:
        return (
            -m.timeline,
            -m.received_lsn,
            -m.replay_lsn,
            m.name != state.preferred,
            m.name == state.old_primary,
            m.name,
        )

    return sorted(found, key=key)


def choose_candidate(
    state: HAState, obs: Observation, config: HAConfig
) -> tuple[MemberObservation | None, str]:
    """The member to make primary now, or ``None`` and why not (see the module docs' rules)."""
    ranked = candidates(state, obs, config)
    if not ranked:
        return None, "no member of the current timeline can take over"
    best = ranked[0]
    old = obs.get(state.old_primary)
    final = position(old) if old.reachable and old.role == Role.FENCED else None
    if final is None and config.synchronous and config.sync_policy == SyncPolicy.ZERO_LOSS:
        # Any acknowledged commit is on some standby; only the most advanced of all of them
        # (candidates or not: a restarting standby still has its WAL) surely has it.
        others = [obs.get(n) for n in config.members if n != state.old_primary]
        missing = [m.name for m in others if not (m.reachable and m.position_known)]
        if missing:
            return None, (
                "zero-loss: waiting for member(s) that may hold acknowledged commits to "
                "report: " + ", ".join(missing)
            )
        ahead = [m.name for m in others if position(m) > position(best)]
        if ahead:
            return None, (
                "zero-loss: " + ", ".join(ahead) + " received more WAL than any member "
                "that can take over"
            )
    zero_loss = config.synchronous and config.sync_policy == SyncPolicy.ZERO_LOSS
    if final is not None and position(best) < final and (zero_loss or state.switchover):
        # The old primary (stopped, but going away: were it intact it would rank first) has
        # WAL no one else has: wait for a standby to receive it, or for it to be gone.
        return None, f"waiting for a member to reach the old primary's final position {final}"
    return best, ""


def decide(state: HAState, obs: Observation, config: HAConfig) -> Decision:
    """The next state and the Events of this round (see the module docs)."""
    now = obs.now
    seen = dict(state.last_seen)
    unbounded = set(state.unbounded)
    for name, m in obs.members.items():
        if m.reachable:
            seen[name] = now
            if m.lease_bounded:
                unbounded.discard(name)
            else:
                unbounded.add(name)
    state = replace(state, last_seen=seen, unbounded=frozenset(unbounded))
    if state.phase == Phase.BOOTSTRAP:
        return _bootstrap(state, obs, config)
    if state.phase == Phase.HEALTHY:
        return _healthy(state, obs, config)
    if state.phase == Phase.FENCING:
        return _fencing(state, obs, config)
    return _promoting(state, obs, config)


def _bootstrap(state: HAState, obs: Observation, config: HAConfig) -> Decision:
    first = config.members[0] if config.members else None
    if state.target_primary is None and first is not None:
        state = replace(state, target_primary=first, target_since=obs.now)
    target = obs.get(state.target_primary)
    if state.target_primary and healthy_primary(target):
        state = replace(
            state,
            phase=Phase.HEALTHY,
            current_primary=state.target_primary,
            current_since=obs.now,
            timeline=target.timeline,
        )
        return Decision(state, (Event("Normal", "PrimaryReady", f"{target.name} is the primary"),))
    return Decision(state, waiting=f"waiting for {state.target_primary} to start as primary")


def _healthy(state: HAState, obs: Observation, config: HAConfig) -> Decision:
    primary = obs.get(state.current_primary)
    now = obs.now
    if healthy_primary(replace(primary, pod_deleting=False)) and primary.pod_deleting:
        # A drain, an eviction, a rolling update: hand over before the primary stops.
        ranked = _caught_up_standbys(state, obs, config, primary)
        if ranked:
            why = f"{primary.name}'s Pod is being deleted"
            return _start(state, now, now, switchover=True, preferred=ranked[0].name, why=why)
    if healthy_primary(primary):
        return _serving(state, obs, config, primary)
    failing_since = state.failing_since if state.failing_since is not None else now
    state = replace(state, failing_since=failing_since)
    if len(config.members) < 2:
        return Decision(state, waiting="the primary is unhealthy and there is no standby")
    if now - failing_since < config.failover_delay:
        return Decision(state, waiting="the primary is unhealthy: waiting out failoverDelay")
    why = _unhealthy_reason(primary)
    return _start(state, failing_since, now, switchover=False, preferred=None, why=why)


def _serving(
    state: HAState, obs: Observation, config: HAConfig, primary: MemberObservation
) -> Decision:
    """The primary is healthy: members that follow it again are unfenced; a planned
    switchover starts once its target (or, for a primary no longer a member, any standby)
    has caught up."""
    state = replace(state, failing_since=None, timeline=max(state.timeline, primary.timeline))
    state = _unfence(
        state, [n for n in state.fenced if _rejoined(obs.get(n), state.current_primary)]
    )
    wanted = _switchover_wanted(state, primary, config)
    if wanted is None:
        return Decision(state)
    target, why = wanted
    ranked = _caught_up_standbys(state, obs, config, primary)
    chosen = [m for m in ranked if target is None or m.name == target]
    if not chosen:
        return Decision(state, waiting=f"switchover ({why}): no caught-up standby")
    now = obs.now
    return _start(state, now, now, switchover=True, preferred=chosen[0].name, why=why)


def _caught_up_standbys(
    state: HAState, obs: Observation, config: HAConfig, primary: MemberObservation
) -> list[MemberObservation]:
    return [
        m
        for m in candidates(replace(state, old_primary=primary.name), obs, config)
        if _caught_up(m, primary, config)
    ]


def _switchover_wanted(
    state: HAState, primary: MemberObservation, config: HAConfig
) -> tuple[str | None, str] | None:
    if (
        config.switchover_to
        and config.switchover_to != primary.name
        and config.switchover_to in config.members
    ):
        return config.switchover_to, f"requested to {config.switchover_to}"
    if primary.name not in config.members:
        return None, f"{primary.name} is no longer a member"
    return None


def _caught_up(standby: MemberObservation, primary: MemberObservation, config: HAConfig) -> bool:
    return (
        standby.reachable
        and standby.role == Role.STANDBY
        and standby.streaming_from == primary.name
        and standby.timeline == primary.timeline
        and standby.pod_exists
        and not standby.pod_deleting
        and not standby.node_lost
        and primary.received_lsn - standby.received_lsn <= config.max_switchover_lag
    )


def _rejoined(member: MemberObservation, primary: str | None) -> bool:
    """A fenced member that now streams from the current primary is fenced no more."""
    return member.reachable and member.role == Role.STANDBY and member.streaming_from == primary


def _unhealthy_reason(member: MemberObservation) -> str:
    if not member.pod_exists:
        return f"the primary {member.name}'s Pod is gone"
    if member.node_lost:
        return f"the primary {member.name}'s node is lost"
    if not member.reachable:
        return f"the primary {member.name} does not answer"
    return f"the primary {member.name} reports role {member.role}"


def _start(
    state: HAState,
    started: float,
    now: float,
    *,
    switchover: bool,
    preferred: str | None,
    why: str,
) -> Decision:
    old = state.current_primary
    assert old is not None
    state = _fence(state, old, now)
    kind = "switchover" if switchover else "failover"
    state = replace(
        state,
        phase=Phase.FENCING,
        old_primary=old,
        target_primary=PENDING,
        target_since=now,
        switchover=switchover,
        preferred=preferred,
        transition_started=started,
    )
    reason = "SwitchoverStarted" if switchover else "FailoverStarted"
    event = Event(
        "Normal" if switchover else "Warning",
        reason,
        f"{kind} from {old} ({why}): {old} fenced, leaving the primary Service",
    )
    return Decision(state, (event,))


def _fencing(state: HAState, obs: Observation, config: HAConfig) -> Decision:
    now = obs.now
    unconfirmed = [
        name
        for name in sorted(state.fenced | ({state.old_primary} if state.old_primary else set()))
        if not fence_confirmed(obs.get(name), state, config, now)
    ]
    if unconfirmed:
        return Decision(state, waiting="waiting for the fence of " + ", ".join(unconfirmed))
    still = [
        m.name
        for m in obs.members.values()
        if m.reachable and m.streaming_from is not None and m.streaming_from in state.fenced
    ]
    if still:
        return Decision(
            state,
            waiting="waiting for standby(s) to stop receiving from the old primary: "
            + ", ".join(sorted(still)),
        )
    primaries = sorted(
        m.name for m in obs.members.values() if m.reachable and m.role == Role.PRIMARY
    )
    if primaries:
        return Decision(state, waiting="waiting for " + ", ".join(primaries) + " to stop")
    chosen, why = choose_candidate(state, obs, config)
    if chosen is None:
        return Decision(state, waiting=why)
    started = state.transition_started if state.transition_started is not None else now
    if (
        state.switchover
        and chosen.name != state.preferred
        and now - started < config.switchover_timeout
    ):
        # Give the wanted standby time to receive the fenced primary's last WAL.
        return Decision(state, waiting=f"switchover: waiting for {state.preferred} to catch up")
    state = replace(
        _unfence(state, [chosen.name]),
        phase=Phase.PROMOTING,
        target_primary=chosen.name,
        target_since=now,
    )
    if chosen.name == state.old_primary:
        event = Event(
            "Normal", "PrimaryResuming", f"{chosen.name} resumes as primary: it has the most WAL"
        )
    else:
        event = Event(
            "Normal",
            "Promoting",
            f"promoting {chosen.name} (timeline {chosen.timeline}, received LSN "
            f"{chosen.received_lsn})",
        )
    return Decision(state, (event,))


def _promoting(state: HAState, obs: Observation, config: HAConfig) -> Decision:
    now = obs.now
    target = obs.get(state.target_primary)
    resumed = state.target_primary == state.old_primary
    if healthy_primary(target) and target.timeline >= state.timeline:
        started = state.transition_started if state.transition_started is not None else now
        duration = now - started
        kind = "switchover" if state.switchover else "failover"
        if resumed:
            kind = "resume"
        state = replace(
            state,
            phase=Phase.HEALTHY,
            current_primary=target.name,
            current_since=now,
            timeline=target.timeline,
            old_primary=None,
            preferred=None,
            switchover=False,
            failing_since=None,
            transition_started=None,
            last_transition_seconds=duration,
            failovers=state.failovers + (kind == "failover"),
            switchovers=state.switchovers + (kind == "switchover"),
        )
        event = Event(
            "Normal",
            "PrimaryResumed" if resumed else "Promoted",
            f"{target.name} is the primary on timeline {target.timeline} "
            f"({kind} took {duration:.1f} s)",
        )
        return Decision(state, (event,))
    last = state.last_seen.get(target.name)
    since = state.target_since if state.target_since is not None else now
    gone = not target.pod_exists or target.pod_deleting or target.node_lost
    silent = now - max(since, last or since) >= config.promote_timeout
    if gone or silent:
        assert state.target_primary is not None
        state = replace(
            _fence(state, state.target_primary, now),
            phase=Phase.FENCING,
            target_primary=PENDING,
            target_since=now,
        )
        # It was not in the primary Service yet: it acknowledged nothing of its own. Once it
        # reports again (stopped), it is a candidate like any other.
        event = Event(
            "Warning",
            "PromotionFailed",
            f"{target.name} did not become primary; fenced, choosing another standby",
        )
        return Decision(state, (event,))
    return Decision(state, waiting=f"waiting for {target.name} to report role primary")


def members_named(prefix: str, replicas: int) -> tuple[str, ...]:
    """The members of an instance whose Pods are ``<prefix>-<ordinal>``."""
    return tuple(f"{prefix}-{i}" for i in range(replicas))


def fenced_of(names: Iterable[str]) -> str:
    """The fenced members as the entrypoint reads them: names separated by spaces."""
    return " ".join(sorted(names))
