"""The shard ring's decisions without I/O: who is live, which slots to release, claim and start.

:class:`RingMember` holds one replica's view of the ring (the members' Leases as last listed,
its own claims, the slots it works on) and decides; its :meth:`RingMember.step` and
:meth:`RingMember.leave` are generators that *yield* the I/O they need as effects
(:class:`Observe`, :class:`Publish`, :class:`StopSlots`, :class:`StartSlots`,
:class:`Handover`) and receive each effect's outcome. :class:`~controller_runtime.sharding.
ShardRing` performs them against the API server; the unit tests perform them against a model
of Leases and time, interleaving replicas as they please, and check that no two replicas ever
work on one slot.

Times are this process's clock (monotonic seconds); no other member's clock is ever read.

Safety rests on three rules, each kept here:

* a slot is worked on only after a published claim of it was written *and* a later listing
  showed no other live member claiming it (:meth:`RingMember.step`);
* a slot being lost is stopped before the claims without it are written, and a member cut off
  stops every slot, drops every claim and abandons its step once ``renew_deadline`` passed
  since the last renewal that succeeded was *sent* (:meth:`RingMember.fence_due`). A member
  paused past that moment (its watchdog did not run) checks the deadline again at each point
  that matters before the watchdog fences it: no slot is started and no Lease write carrying
  claims is sent (:meth:`RingMember.claims_to_publish`), and the sharded controller's workers
  and writes check it too (:mod:`controller_runtime.fencing`);
* another member counts as gone only when its Lease has not changed for ``lease_duration``,
  measured from when this process *received* the listing that showed the change, up to when
  it *sent* the listing that says the Lease is unchanged (:meth:`RingMember.see`). Both ends
  err on the side of "still live": a listing delayed in the network or by a busy event loop
  never makes a member look expired sooner.
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
    """One member Lease as listed: holder, resourceVersion, duration (s), claimed slots."""

    holder: str
    resource_version: str
    duration: float
    claims: frozenset[int]


@dataclass(frozen=True)
class Observation:
    """A listing: the Leases, when the request was sent and when its answer was received."""

    leases: tuple[LeaseRecord, ...]
    sent_at: float
    received_at: float


@dataclass(frozen=True)
class Publish:
    """Write this member's Lease with its claims as they are when the write is *sent* (writes
    of one member never overlap). Reply: ``True`` when the write succeeded (the driver has then
    called :meth:`RingMember.published_claims`), else ``False``."""


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


Effect = Observe | Publish | StopSlots | StartSlots | Handover
Steps = Generator[Effect, Any, None]


@dataclass
class _Seen:
    lease: LeaseRecord
    changed_at: float


class RingMember:
    """One replica's view of the ring and its decisions (see the module docs).

    Attributes: :attr:`members` (live members as last listed, this one included), :attr:`claims`
    (slots claimed, including those being drained), :attr:`active` (slots worked on),
    :attr:`published` (the claims of the last write that succeeded) and :attr:`last_renew`
    (when that write was sent).
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
        self.last_renew = -float("inf")
        self._others: dict[str, _Seen] = {}
        self._view_at = -float("inf")

    # -- what the driver reports --------------------------------------------------------------

    def published_claims(self, claims: frozenset[int], sent_at: float) -> None:
        """A write of ``claims`` sent at ``sent_at`` succeeded."""
        self.last_renew = max(self.last_renew, sent_at)
        self.published = claims

    def see(self, observation: Observation) -> None:
        """Take in a listing of the ring's Leases (this member's own Lease is ignored)."""
        seen: dict[str, _Seen] = {}
        for lease in observation.leases:
            if not lease.holder or lease.holder == self.identity:
                continue
            previous = self._others.get(lease.holder)
            changed_at = observation.received_at
            if previous is not None and previous.lease.resource_version == lease.resource_version:
                changed_at = previous.changed_at
            seen[lease.holder] = _Seen(lease, changed_at)
        self._others = seen
        self._view_at = observation.sent_at
        live = (h for h, s in seen.items() if self._view_at < s.changed_at + s.lease.duration)
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
        """Every slot was stopped (fence or restart): nothing is worked on or claimed."""
        self.active.clear()
        self.claims.clear()

    # -- decisions ----------------------------------------------------------------------------

    def target(self) -> frozenset[int]:
        """The slots the division gives this member among the live members."""
        return assign_slots(self.members or [self.identity], self.slots).get(
            self.identity, frozenset()
        )

    def claimed_by_other(self, slot: int) -> bool:
        """Whether some other member, live as of the last listing, claims ``slot``."""
        return any(
            slot in s.lease.claims and self._view_at < s.changed_at + s.lease.duration
            for s in self._others.values()
        )

    def step(self) -> Steps:
        """One round: list the ring; release what the division took away (stop first, then
        write); claim what it gave if no live member claims it, list again, and start only
        what is still uncontested and was in a successful write."""
        observation = yield Observe()
        if observation is None:
            return
        self.see(observation)
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
        # Only slots claimed now *and* in the last write that succeeded: a withdrawal whose
        # write failed leaves a slot published but no longer claimed.
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
        if self.published:
            yield Publish()
