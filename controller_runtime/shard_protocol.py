"""The shard ring's decisions without I/O: who is live, which slots to release, claim and start.

:class:`RingMember` holds one replica's view of the ring (the members' Leases as last listed,
its own claims, the slots it works on, what its own Lease on the server may say) and decides;
its :meth:`RingMember.step` and :meth:`RingMember.leave` are generators that *yield* the I/O
they need as effects (:class:`Observe`, :class:`Publish`, :class:`Sweep`, :class:`StopSlots`,
:class:`StartSlots`, :class:`Handover`) and receive each effect's outcome.
:class:`~controller_runtime.sharding.ShardRing` performs them against the API server; the unit
tests perform them against a model of Leases and time, interleaving replicas as they please,
and check that no two replicas ever work on one slot.

Times are this process's monotonic clock; no other member's clock is ever read for a decision
that safety rests on (a Lease's ``renewTime`` only helps a newcomer divide, see below).

Safety rests on four rules, each kept here:

* a slot is worked on only after a claim of it is on the server in *every* state the member's
  own Lease may be in, *and* a later listing showed no other live member claiming it
  (:meth:`RingMember.step`). Writes of the own Lease are conditional on the resourceVersion
  last known (:attr:`RingMember.lease_version`; a create when none is known), so a write the
  member gave up on can land later only if nothing else was written since: after a write that
  succeeded, no older one can overwrite it. What the Lease may say is tracked
  (:attr:`RingMember.published`): a write being sent narrows it to what both it and the last
  known state claim (:meth:`RingMember.sending`: it may land at any moment, also after it
  was given up on), a write that succeeded sets it, a conflict is answered by re-reading the
  Lease (:meth:`RingMember.lease_read`);
* a slot being lost is stopped before the claims without it are written, and a member cut off
  stops every slot, drops every claim and abandons its step once ``renew_deadline`` passed
  since the last renewal that succeeded was *sent* (:meth:`RingMember.fence_due`). A member
  paused past that moment (its watchdog did not run) checks the deadline again at each point
  that matters before the watchdog fences it: no slot is started and no Lease write carrying
  claims is sent (:meth:`RingMember.claims_to_publish`), and the sharded controller's workers
  and writes check it too (:mod:`controller_runtime.fencing`);
* another member's claims count until its Lease has not changed for ``lease_duration``,
  measured from when this process *received* the listing that showed the change, up to when
  it *sent* the listing that says the Lease is unchanged (:meth:`RingMember.see`). Both ends
  err on the side of "still live": a listing delayed in the network or by a busy event loop
  never makes a member look expired sooner;
* a Lease expired by that rule is deleted by whoever sees it so (:class:`Sweep`), conditioned
  on its uid and resourceVersion: a Lease renewed meanwhile is never deleted, and by the rule
  above its holder is past its renew deadline (fenced) when it is.

Membership (who shares the *division*, :meth:`RingMember.target`) is judged like the claims,
with one difference for a Lease this member has never seen change: its age is estimated from
the holder's ``renewTime`` on this process's wall clock, so a newcomer does not count a
long-dead member for a whole lease duration. A wrong estimate (skewed clocks) only changes
which slots this member *wants* until it sees that Lease change (a retry period); whether a
slot is free is never judged by it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Effect",
    "Handover",
    "LeaseRecord",
    "Observation",
    "Observe",
    "Publish",
    "RingMember",
    "StartSlots",
    "StopSlots",
    "Sweep",
    "assign_slots",
]


def _score(member: str, slot: int) -> int:
    digest = hashlib.blake2b(f"{member}\x00{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign_slots(members: Iterable[str], slots: int) -> dict[str, frozenset[int]]:
    """Which slots each member owns: bounded-load rendezvous hashing.

    Every (member, slot) pair gets a score (BLAKE2b of both); pairs are taken best first and a
    slot goes to the first member with room left under its quota (``slots // members``, one
    more for the first ``slots % members`` members in sorted order). Deterministic in the
    *set* of members; every slot goes to exactly one member; loads differ by at most one.
    """
    ordered = sorted(set(members))
    if not ordered:
        return {}
    base, extra = divmod(slots, len(ordered))
    room = {m: base + (1 if i < extra else 0) for i, m in enumerate(ordered)}
    pairs = sorted(
        ((_score(m, s), m, s) for m in ordered for s in range(slots)),
        key=lambda p: (-p[0], p[1], p[2]),
    )
    owner: dict[int, str] = {}
    for _, member, slot in pairs:
        if slot not in owner and room[member] > 0:
            owner[slot] = member
            room[member] -= 1
    out: dict[str, set[int]] = {m: set() for m in ordered}
    for slot, member in owner.items():
        out[member].add(slot)
    return {m: frozenset(s) for m, s in out.items()}


# -- effects: what the protocol asks its driver to do -------------------------------------------


@dataclass(frozen=True)
class Observe:
    """List the ring's Leases with a consistent read. Reply: an :class:`Observation`, or
    ``None`` when the listing failed."""


@dataclass(frozen=True)
class LeaseRecord:
    """One member Lease as listed: holder, resourceVersion, duration (s), claimed slots, uid,
    and the holder's ``renewTime`` as POSIX seconds of the holder's wall clock (``None`` when
    absent)."""

    holder: str
    resource_version: str
    duration: float
    claims: frozenset[int]
    uid: str = ""
    renewed_at: float | None = None


@dataclass(frozen=True)
class Observation:
    """A listing: the Leases, when the request was sent and when its answer was received
    (monotonic clock), and this process's wall clock (POSIX seconds) when it was received
    (``None``: not known, no Lease's age is estimated)."""

    leases: tuple[LeaseRecord, ...]
    sent_at: float
    received_at: float
    wall_at: float | None = None


@dataclass(frozen=True)
class Publish:
    """Write this member's Lease with its claims as they are when the write is *sent*
    (:meth:`RingMember.claims_to_publish`), conditioned on :attr:`RingMember.lease_version`
    (a create when ``None``); writes of one member never overlap. The driver reports the
    write to the member before it is sent (:meth:`~RingMember.sending`) and the outcome after
    (:meth:`~RingMember.published_claims`, :meth:`~RingMember.lease_read`,
    :meth:`~RingMember.lease_gone`). Reply: ``True`` when the write succeeded, else
    ``False``."""


@dataclass(frozen=True)
class Sweep:
    """Delete these Leases of other members, each conditioned on its uid and resourceVersion
    (a Lease renewed or replaced meanwhile stays): they expired in this member's view. Reply:
    ``None`` (failures do not matter: the next listing shows what is left)."""

    leases: tuple[LeaseRecord, ...]


@dataclass(frozen=True)
class StopSlots:
    """Stop work on ``slots``: stop taking work, let in-flight work finish for up to ``drain``
    seconds (``None``: no limit), cancel the rest. Reply: ``None``, once stopped."""

    slots: frozenset[int]
    drain: float | None


@dataclass(frozen=True)
class StartSlots:
    """Start work on ``slots`` (they count as worked on from now). Reply: the slots that
    failed to start, already stopped again by the driver."""

    slots: frozenset[int]


@dataclass(frozen=True)
class Handover:
    """For metrics and logs: ``slots`` were released or acquired (``kind``), in ``seconds``.
    Reply: ``None``."""

    kind: str
    slots: frozenset[int]
    seconds: float


Effect = Observe | Publish | Sweep | StopSlots | StartSlots | Handover
Steps = Generator[Effect, Any, None]


@dataclass
class _Seen:
    lease: LeaseRecord
    changed_at: float
    """When this member first received a listing with this resourceVersion (its claims
    count until ``changed_at + duration``)."""
    member_since: float
    """The same, or earlier for a Lease never seen to change: its age estimated from its
    ``renewTime`` (it shares the division until ``member_since + duration``)."""


class RingMember:
    """One replica's view of the ring and its decisions (see the module docs).

    Attributes: :attr:`members` (live members as last listed, this one included), :attr:`claims`
    (slots claimed, including those being drained), :attr:`active` (slots worked on),
    :attr:`published` (slots claimed in every state the own Lease may be in on the server),
    :attr:`lease_version` (the own Lease's resourceVersion as last known, ``None``: to be
    created) and :attr:`last_renew` (when the last write that succeeded was sent).
    """

    def __init__(
        self,
        identity: str,
        slots: int,
        *,
        lease_duration: float,
        renew_deadline: float,
        drain_timeout: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.identity = identity
        self.drain_timeout = drain_timeout
        self.slots = slots
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self._clock = clock
        self.members: list[str] = []
        self.claims: set[int] = set()
        self.active: set[int] = set()
        self.published: frozenset[int] = frozenset()
        self.lease_version: str | None = None
        self.lease_uid = ""
        self.last_renew = -float("inf")
        self.settle_until = -float("inf")
        self._others: dict[str, _Seen] = {}
        self._view_at = -float("inf")

    # -- what the driver reports --------------------------------------------------------------

    def joining(self, now: float, settle: float) -> None:
        """The member (re)joins at ``now``: until ``now + settle`` it claims nothing unless
        another live member already claims slots (a ring being started all at once sees
        its members first; a ring already up hands over at once)."""
        self.settle_until = now + settle

    def published_claims(
        self, claims: frozenset[int], sent_at: float, version: str, uid: str = ""
    ) -> None:
        """A write of ``claims`` sent at ``sent_at`` succeeded; the Lease now has
        resourceVersion ``version``. No write sent before can land after it (they were
        conditioned on an older version), so the Lease claims exactly ``claims``."""
        self.last_renew = max(self.last_renew, sent_at)
        self.published = claims
        self.lease_version = version
        if uid:
            self.lease_uid = uid

    def sending(self, claims: frozenset[int]) -> None:
        """A write of ``claims`` (a delete of the own Lease: ``frozenset()``) is about to be
        sent. From now on it may land at any moment, also after its answer was given up on
        (a timeout, a broken connection): only what both it and the last known state claim
        counts as published, until a write succeeds or the Lease is read again."""
        self.published = self.published & claims

    def lease_read(self, lease: LeaseRecord | None) -> None:
        """The own Lease as read (a consistent read) after a write was refused for a stale
        version, or ``None`` when it does not exist. Every write in flight was conditioned on
        an older version and can no longer land: the Lease says exactly this."""
        if lease is None:
            self.lease_gone()
            return
        self.lease_version = lease.resource_version
        self.lease_uid = lease.uid
        self.published = lease.claims

    def lease_gone(self) -> None:
        """The own Lease does not exist (a write was answered "not found", or it was
        deleted): the next write creates it; nothing counts as published."""
        self.lease_version = None
        self.lease_uid = ""
        self.published = frozenset()

    def see(self, observation: Observation) -> None:
        """Take in a listing of the ring's Leases (this member's own Lease is ignored)."""
        seen: dict[str, _Seen] = {}
        for lease in observation.leases:
            if not lease.holder or lease.holder == self.identity:
                continue
            previous = self._others.get(lease.holder)
            if previous is not None and (
                previous.lease.resource_version == lease.resource_version
                and previous.lease.uid == lease.uid
            ):
                seen[lease.holder] = _Seen(lease, previous.changed_at, previous.member_since)
                continue
            changed_at = observation.received_at
            member_since = changed_at
            if previous is None:
                member_since = changed_at - _age(lease, observation)
            seen[lease.holder] = _Seen(lease, changed_at, member_since)
        self._others = seen
        self._view_at = observation.sent_at
        live = (h for h, s in seen.items() if self._view_at < s.member_since + s.lease.duration)
        self.members = sorted({*live, self.identity})

    def fence_due(self, now: float) -> bool:
        """True when slots are worked on *or claimed* and no renewal sent in the last
        ``renew_deadline`` succeeded: the driver must then stop every slot at once, abandon
        the step in progress and call :meth:`fenced`.

        Claims count too: a member whose renewals stalled past its lease is gone for the
        others, who may take what it claimed; a step of its own that began before the stall
        must not start those slots on an answer that arrives after it."""
        return bool(self.active or self.claims) and now >= self.fence_at()

    def fence_at(self) -> float:
        """When the renew deadline passes: ``last_renew + renew_deadline``. A watchdog that
        wakes at this time finds :meth:`fence_due` true (both use this one sum, so floating-
        point rounding never leaves a wake-up just short of the deadline)."""
        return self.last_renew + self.renew_deadline

    def claims_to_publish(self, now: float) -> frozenset[int] | None:
        """What a write of this member's Lease sent at ``now`` may say it claims: its claims,
        or ``None`` when the renew deadline passed while it holds something (a process paused
        past its deadline): then nothing is written until the watchdog fenced it, so a
        resumed member never republishes claims the others may already have taken over."""
        if self.fence_due(now):
            return None
        return frozenset(self.claims)

    def fenced(self) -> None:
        """Every slot was stopped (fence or restart): nothing is worked on or claimed, and
        nothing counts as published any more (past the renew deadline, another member may
        delete the Lease as expired at any moment)."""
        self.active.clear()
        self.claims.clear()
        self.published = frozenset()

    # -- decisions ----------------------------------------------------------------------------

    def target(self) -> frozenset[int]:
        """The slots the division gives this member among the live members."""
        return assign_slots(self.members or [self.identity], self.slots).get(
            self.identity, frozenset()
        )

    def _claims_live(self, seen: _Seen) -> bool:
        return self._view_at < seen.changed_at + seen.lease.duration

    def claimed_by_other(self, slot: int) -> bool:
        """Whether some other member, live as of the last listing, claims ``slot``."""
        return any(slot in s.lease.claims and self._claims_live(s) for s in self._others.values())

    def expired(self) -> tuple[LeaseRecord, ...]:
        """Other members' Leases unchanged for their lease duration as of the last listing:
        their holders are past their renew deadlines; they may be deleted (conditioned on
        uid and resourceVersion)."""
        return tuple(s.lease for s in self._others.values() if not self._claims_live(s))

    def _ring_is_up(self) -> bool:
        return any(s.lease.claims and self._claims_live(s) for s in self._others.values())

    def step(self) -> Steps:
        """One round: list the ring; delete Leases that expired; release what the division
        took away (stop first, then write); claim what it gave if no live member claims it,
        list again, and start only what is still uncontested and claimed in every state the
        own Lease may be in."""
        observation = yield Observe()
        if observation is None:
            return
        self.see(observation)
        expired = self.expired()
        if expired:
            yield Sweep(expired)
        target = self.target()
        lost = frozenset(self.claims - target)
        if lost:
            started = self._clock()
            stopping = frozenset(lost & self.active)
            if stopping:
                yield StopSlots(stopping, self.drain_timeout)
                self.active -= stopping
            self.claims -= lost
            yield Publish()
            yield Handover("release", lost, self._clock() - started)
        pending = target - self.active
        if not pending:
            return
        if self._clock() < self.settle_until and not self._ring_is_up():
            return  # a ring starting up: wait to see the members started with this one
        free = {s for s in pending if not self.claimed_by_other(s)}
        if free - self.claims:
            self.claims |= free
            if not (yield Publish()):
                return
        observation = yield Observe()
        if observation is None:
            return
        self.see(observation)
        conflict = {s for s in pending & self.claims if self.claimed_by_other(s)}
        if conflict:
            self.claims -= conflict
            yield Publish()
        # Only slots claimed now *and* in every state the Lease may be in: a withdrawal whose
        # write failed leaves a slot published but no longer claimed, and a write that failed
        # may still land and overwrite the last one that succeeded.
        gained = frozenset((pending & self.claims & self.published) - conflict)
        if gained and self.fence_due(self._clock()):
            # The step outlived the deadline (a pause): start nothing; the watchdog fences.
            return
        if gained:
            started = self._clock()
            self.active |= gained
            failed = yield StartSlots(gained)
            self.active -= failed
            self.claims -= failed
            yield Handover("acquire", gained - failed, self._clock() - started)

    def leave(self, drain: float | None) -> Steps:
        """Hand every slot over cleanly: stop them (draining up to ``drain``), then write
        that nothing is claimed. (Deleting the Lease afterwards is the driver's.)"""
        if self.active:
            stopping = frozenset(self.active)
            yield StopSlots(stopping, drain)
            self.active -= stopping
        self.claims.clear()
        if self.published or self.lease_version is not None:
            yield Publish()


def _age(lease: LeaseRecord, observation: Observation) -> float:
    """How long ago ``lease`` was renewed, by its ``renewTime`` on this process's wall clock
    when the listing arrived (0 when either is unknown or the Lease looks fresher)."""
    if lease.renewed_at is None or observation.wall_at is None:
        return 0.0
    return max(0.0, observation.wall_at - lease.renewed_at)
