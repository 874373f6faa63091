"""The shard ring's protocol against a model of Leases, time and an unreliable network.

The replicas here run the real decisions (:class:`controller_runtime.shard_protocol.RingMember`,
its ``step`` and ``leave`` generators); the I/O is modelled as
:class:`~controller_runtime.sharding.ShardRing` performs it: a store of Leases with
resourceVersions and uids whose writes are conditional (a write of a member's own Lease names
the resourceVersion the member last knew, or creates it; a delete names uid and
resourceVersion), one shared monotonic clock (the replicas' clocks run at the same rate, as the
protocol assumes) and per-replica wall clocks that may be skewed (only a newcomer's estimate
of a Lease's age reads them), and requests whose answers come late, never, or fail while the
request still lands (a timed-out write or delete may reach the server long after). A conflict
is answered by re-reading the Lease and trying again, as the driver does. After its renew
deadline a replica is fenced: its slots stop, it deletes its Lease (conditioned) and waits out
a back-off without writing, then joins again.

Hypothesis interleaves the replicas' requests, the passing of time, whole-process pauses,
crashes, network cuts, joins and clean leaves as it pleases. Checked after every step:

* **no slot is worked on by two replicas** (working: from a start until the stop finished, or
  the replica was fenced or died, and only while its renew deadline lies ahead: past it, the
  sharded controller's workers and writes refuse to act, ``controller_runtime.fencing``);
* a replica works only on slots its Lease *on the server* claims, and everything it counts as
  published is claimed there (while its renew deadline lies ahead).

The one assumption the protocol states is kept: a replica's watchdog stops its slots as soon
as its renew deadline passes (a fence takes no time) -- except for a replica whose whole
process is *paused* (a GC pause, SIGSTOP): its watchdog does not run during the pause, and
after it, its pending answers and timers may come before the watchdog.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from controller_runtime.shard_protocol import (
    Effect,
    Handover,
    LeaseRecord,
    Observation,
    Observe,
    Publish,
    RingMember,
    StartSlots,
    StopSlots,
    Sweep,
    assign_slots,
)

SLOTS = 8
LEASE, DEADLINE, RETRY = 15.0, 10.0, 2.0  # the default timings
SETTLE = 2 * RETRY
BACKOFF = 2 * SETTLE  # the back-off after a first fence: settle x 2
WRITE_ATTEMPTS = 3  # the driver's: a patch, then a create or a re-read and a patch again


@dataclass
class Stored:
    """A Lease in the model's API server."""

    rv: int
    uid: int
    claims: frozenset[int]
    duration: float
    renewed_wall: float


class Server:
    """The Leases of one ring, with a resourceVersion bumped by every write and a uid per
    creation; writes and deletes honour their preconditions."""

    def __init__(self) -> None:
        self.leases: dict[str, Stored] = {}
        self.rv = 0
        self.uids = 0

    def write(self, holder: str, claims: frozenset[int], version: str | None, wall: float) -> str:
        """A create (``version`` None) or a write conditioned on ``version``: ``"ok"``,
        ``"exists"``, ``"missing"`` or ``"conflict"``."""
        current = self.leases.get(holder)
        if version is None:
            if current is not None:
                return "exists"
            self.uids += 1
            uid = self.uids
        elif current is None:
            return "missing"
        elif str(current.rv) != version:
            return "conflict"
        else:
            uid = current.uid
        self.rv += 1
        self.leases[holder] = Stored(self.rv, uid, claims, LEASE, wall)
        return "ok"

    def delete(self, holder: str, version: str, uid: str) -> str:
        current = self.leases.get(holder)
        if current is None:
            return "missing"
        if str(current.rv) != version or (uid and str(current.uid) != uid):
            return "conflict"
        del self.leases[holder]
        return "ok"

    def record(self, holder: str) -> LeaseRecord | None:
        s = self.leases.get(holder)
        if s is None:
            return None
        return LeaseRecord(holder, str(s.rv), s.duration, s.claims, str(s.uid), s.renewed_wall)

    def listing(self) -> tuple[LeaseRecord, ...]:
        return tuple(r for h in self.leases if (r := self.record(h)) is not None)

    def claims(self, holder: str) -> frozenset[int]:
        s = self.leases.get(holder)
        return s.claims if s is not None else frozenset()


@dataclass
class Write:
    """A write of the own Lease (``version`` None: a create), as sent."""

    claims: frozenset[int]
    version: str | None
    sent_at: float
    wall: float
    attempt: int = 1
    outcome: str | None = None  # set when the server handled it
    produced: str = ""  # the resourceVersion a write that succeeded produced


@dataclass
class Delete:
    """A delete conditioned on uid and resourceVersion (a sweep, or the own withdrawal)."""

    holder: str
    version: str
    uid: str
    outcome: str | None = None


@dataclass
class Listing:
    sent_at: float
    leases: tuple[LeaseRecord, ...] | None = None  # read by the server (not yet delivered)


@dataclass
class Replica:
    """One replica process: its protocol state and what it is waiting for."""

    name: str
    member: RingMember
    skew: float  # its wall clock minus the model's
    steps: Generator[Effect, Any, None] | None = None
    waiting: Effect | None = None  # the effect the generator waits on
    write: Write | None = None  # the one write in flight (a member's writes never overlap)
    write_for_step: bool = False  # the step waits on that write (else it is a renewal)
    withdrawal: Delete | None = None  # deleting its own Lease after a fence
    sweeps: list[Delete] = field(default_factory=list)
    listing: Listing | None = None
    leaving: bool = False
    back_off_until: float | None = None  # fenced: not a member (no write) until then
    working: set[int] = field(default_factory=set)


class RingModel(RuleBasedStateMachine):
    """Up to four replicas (crashed ones replaced by new ones) over one model API server.

    Each replica's protocol generator waits on one effect at a time; the rules decide when
    its request is read or landed by the server, answered, failed or given up on, and when
    time passes (the watchdog fencing at the renew deadline, as the protocol asks)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.server = Server()
        self.live: dict[str, Replica] = {}
        self.connected: set[str] = set()
        self.orphans: list[tuple[str, Write | Delete]] = []  # given up on; may still land
        self.started = 0

    # -- replicas ---------------------------------------------------------------------------

    def _spawn(self, skew: float = 0.0) -> str:
        self.started += 1
        name = f"r{self.started}"
        member = RingMember(
            name,
            SLOTS,
            lease_duration=LEASE,
            renew_deadline=DEADLINE,
            drain_timeout=10.0,
            clock=lambda: self.now,
        )
        member.joining(self.now, SETTLE)
        self.live[name] = Replica(name, member, skew)
        self.connected.add(name)
        return name

    def _wall(self, r: Replica) -> float:
        return self.now + r.skew

    def _advance(self, r: Replica, reply: object) -> None:
        """Feed ``reply`` to the replica's generator and run it to the next effect that needs
        the model (a request or a stop); a start takes effect at once, a sweep's deletes are
        sent (they land when the rules say)."""
        assert r.steps is not None
        while True:
            try:
                effect = r.steps.send(reply)
            except StopIteration:
                r.steps, r.waiting = None, None
                if r.leaving:
                    self._gone(r, delete=True)
                return
            reply = None
            if isinstance(effect, Handover):
                continue
            if isinstance(effect, Sweep):
                for lease in effect.leases:
                    assert lease.holder != r.name
                    r.sweeps.append(Delete(lease.holder, lease.resource_version, lease.uid))
                continue
            if isinstance(effect, StartSlots):
                assert not r.member.fence_due(self.now), (
                    f"{r.name} starts slots {sorted(effect.slots)} past its renew deadline "
                    f"(t={self.now}, last renewal sent at {r.member.last_renew})"
                )
                r.working |= effect.slots
                reply = frozenset()
                continue
            r.waiting = effect
            if isinstance(effect, Observe):
                r.listing = Listing(self.now)
            return

    def _orphan_requests(self, r: Replica) -> None:
        """Every request of ``r`` in flight is given up on (it may still land)."""
        if r.write is not None and r.write.outcome is None:
            self.orphans.append((r.name, r.write))
        r.write, r.write_for_step = None, False
        for delete in r.sweeps:
            self.orphans.append((r.name, delete))
        r.sweeps = []

    def _gone(self, r: Replica, *, delete: bool) -> None:
        self._orphan_requests(r)
        if r.withdrawal is not None and r.withdrawal.outcome is None:
            self.orphans.append((r.name, r.withdrawal))
        if delete and r.name in self.connected:
            # The driver deletes its Lease conditioned on what it knows; on a conflict it
            # reads the Lease again and deletes that (a clean leave holds nothing).
            record = self.server.record(r.name)
            if record is not None:
                self.server.delete(r.name, record.resource_version, record.uid)
        r.working.clear()
        del self.live[r.name]
        self.connected.discard(r.name)

    def _fence(self, r: Replica) -> None:
        """The watchdog: every slot stopped, the loop (and its requests) abandoned; then the
        replica deletes its own Lease (conditioned) and backs off without writing."""
        r.working.clear()
        r.member.fenced()
        if r.steps is not None:
            r.steps.close()
        r.steps, r.waiting, r.listing = None, None, None
        self._orphan_requests(r)
        if r.leaving:
            self._gone(r, delete=False)
            return
        version = r.member.lease_version
        if version is not None and r.withdrawal is None:
            r.member.sending(frozenset())
            r.withdrawal = Delete(r.name, version, r.member.lease_uid)
        r.back_off_until = self.now + BACKOFF

    def _pick(self, i: int) -> str | None:
        names = sorted(self.live)
        return names[i % len(names)] if names else None

    def _member(self, name: str) -> Replica | None:
        """The replica, if it is a member (not backing off after a fence)."""
        r = self.live.get(name)
        if r is None or r.back_off_until is not None:
            return None
        return r

    @initialize(
        skews=st.lists(st.sampled_from([0.0, 0.0, 1.5, -1.5, 30.0]), min_size=1, max_size=3)
    )
    def start_ring(self, skews: list[float]) -> None:
        for skew in skews:
            self._spawn(skew)

    @rule(skew=st.sampled_from([0.0, 0.0, 1.5, -1.5, 30.0]))
    @precondition(lambda self: len(self.live) < 4)
    def join(self, skew: float) -> None:
        self._spawn(skew)

    @rule(i=st.integers(0, 3), times=st.integers(1, 16))
    def get_on(self, i: int, times: int) -> None:
        """The replica does the next ``times`` things it would do on a network that answers,
        renewing its Lease when a retry period passed since the last renewal."""
        for _ in range(times):
            name = self._pick(i)
            r = self.live.get(name or "")
            if r is None:
                return
            self.rejoin(r.name)
            if (
                r.back_off_until is None
                and r.write is None
                and self.now - r.member.last_renew >= RETRY
            ):
                self.begin_renewal(r.name)
            self.progress(r.name)

    @rule(order=st.lists(st.integers(0, 3), min_size=2, max_size=40))
    def interleave(self, order: list[int]) -> None:
        """Replicas take turns, one thing each, in the order given."""
        for i in order:
            self.get_on(i, 1)

    @rule(
        i=st.integers(0, 3),
        what=st.sampled_from(
            [
                "fail_write",
                "fail_listing",
                "begin_renewal",
                "crash",
                "cut_off",
                "reconnect",
                "leave",
                "renew",
            ]
        ),
    )
    def disturb(self, i: int, what: str) -> None:
        """A request fails (a write may still land later), a stray renewal, a crash, a cut or
        healed connection, a clean leave, or a renewal that goes through at once."""
        name = self._pick(i)
        if name is not None:
            getattr(self, what)(name)

    @rule(i=st.integers(0, 3), landed=st.booleans())
    def a_request_times_out(self, i: int, landed: bool) -> None:
        """The replica gives up on its write in flight (after the server wrote it, or
        before: then it may still land, much later) or on its listing."""
        name = self._pick(i)
        r = self.live.get(name or "")
        if r is None:
            return
        if r.write is not None:
            if landed:
                self.land_write(r.name)
            self.fail_write(r.name)
        elif r.listing is not None:
            self.fail_listing(r.name)

    def progress(self, name: str) -> None:
        """The next thing the replica would do on a network that answers: land a sweep, have
        its request read, landed or answered, finish a stop, or begin a step."""
        r = self.live.get(name)
        if r is None:
            return
        if r.sweeps:
            self.land_sweep(name)
        elif r.withdrawal is not None:
            self.progress_withdrawal(name)
        elif r.write is not None:
            if r.write.outcome is not None:
                self.answer_write(name)
            else:
                self.land_write(name)
        elif r.listing is not None:
            if r.listing.leases is None:
                self.server_reads_listing(name)
            else:
                self.answer_listing(name)
        elif isinstance(r.waiting, Publish):
            self.send_step_write(name)
        elif isinstance(r.waiting, StopSlots):
            self.finish_stop(name)
        elif r.steps is None:
            self.begin_step(name)

    def rejoin(self, name: str) -> None:
        """A fenced replica whose back-off is over joins again (an unanswered withdrawal is
        given up on first: the driver's wait for it is capped)."""
        r = self.live.get(name)
        if r is None or r.back_off_until is None or self.now < r.back_off_until:
            return
        if r.withdrawal is not None:
            if r.withdrawal.outcome is None:
                self.orphans.append((r.name, r.withdrawal))
            r.withdrawal = None
        r.back_off_until = None
        r.member.joining(self.now, SETTLE)

    def progress_withdrawal(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or r.withdrawal is None:
            return
        withdrawal = r.withdrawal
        if withdrawal.outcome is None:
            if name in self.connected:
                withdrawal.outcome = self.server.delete(name, withdrawal.version, withdrawal.uid)
            return
        r.withdrawal = None
        if withdrawal.outcome == "conflict":
            # An older write landed meanwhile: read the Lease again and delete that.
            r.member.lease_read(self.server.record(name))
            version = r.member.lease_version
            if version is not None and withdrawal.version != version:
                r.member.sending(frozenset())
                r.withdrawal = Delete(name, version, r.member.lease_uid)
            return
        r.member.lease_gone()

    def renew(self, name: str) -> None:
        """A renewal that goes through at once (when no write is in flight)."""
        r = self._member(name)
        if r is None or r.write is not None or name not in self.connected:
            return
        self.begin_renewal(name)
        for _ in range(WRITE_ATTEMPTS):
            if r.write is None:
                return
            self.land_write(name)
            self.answer_write(name)

    def begin_step(self, name: str) -> None:
        r = self._member(name)
        if r is None or r.steps is not None or r.leaving:
            return
        r.steps = r.member.step()
        self._advance(r, None)

    def begin_renewal(self, name: str) -> None:
        r = self._member(name)
        if r is None or r.write is not None:
            return
        claims = r.member.claims_to_publish(self.now)  # what the driver asks before it sends
        if claims is None:
            return  # past the deadline: nothing is sent until the watchdog fenced
        self._send(r, claims, for_step=False)

    def send_step_write(self, name: str) -> None:
        r = self._member(name)
        if r is None or not isinstance(r.waiting, Publish) or r.write is not None:
            return
        claims = r.member.claims_to_publish(self.now)
        if claims is None:
            self._advance(r, False)  # the driver's renewal fails without sending
            return
        self._send(r, claims, for_step=True)

    def _send(
        self, r: Replica, claims: frozenset[int], *, for_step: bool, attempt: int = 1
    ) -> None:
        self._check_claims_sent(r, claims)
        r.member.sending(claims)
        r.write = Write(claims, r.member.lease_version, self.now, self._wall(r), attempt)
        r.write_for_step = for_step

    def _check_claims_sent(self, r: Replica, claims: frozenset[int]) -> None:
        assert r.back_off_until is None, f"{r.name} writes its Lease while backing off"
        assert not (claims and r.member.fence_due(self.now)), (
            f"{r.name} sends claims {sorted(claims)} past its renew deadline (t={self.now}, "
            f"last renewal sent at {r.member.last_renew})"
        )

    def land_write(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or r.write is None or r.write.outcome is not None:
            return
        if name not in self.connected:
            return
        w = r.write
        w.outcome = self.server.write(name, w.claims, w.version, w.wall)
        w.produced = str(self.server.rv)

    def answer_write(self, name: str) -> None:
        """The answer arrives: success, or a refusal the driver handles as it does (a
        conflict: read the Lease again, then retry; not found: create)."""
        r = self.live.get(name)
        if r is None or r.write is None or r.write.outcome is None:
            return
        write, r.write = r.write, None
        for_step, r.write_for_step = r.write_for_step, False
        ok = write.outcome == "ok"
        if ok:
            r.member.published_claims(write.claims, write.sent_at, write.produced)
        else:
            if write.outcome == "missing":
                r.member.lease_gone()
            else:  # conflict or exists: read it again
                r.member.lease_read(self.server.record(name))
            if write.attempt < WRITE_ATTEMPTS:
                claims = r.member.claims_to_publish(self.now)
                if claims is not None:
                    # The driver retries with the claims and send time of the first attempt.
                    self._send(r, write.claims, for_step=for_step, attempt=write.attempt + 1)
                    assert r.write is not None
                    r.write.sent_at = write.sent_at
                    return
        if for_step:
            self._advance(r, ok)

    def fail_write(self, name: str) -> None:
        """A timeout or a broken connection: the write may still land later, or never."""
        r = self.live.get(name)
        if r is None or r.write is None:
            return
        write, r.write = r.write, None
        if write.outcome is None:
            self.orphans.append((name, write))
        if r.write_for_step:
            r.write_for_step = False
            self._advance(r, False)

    def land_sweep(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or not r.sweeps or name not in self.connected:
            return
        delete = r.sweeps.pop(0)
        self.server.delete(delete.holder, delete.version, delete.uid)

    @rule(data=st.data())
    @precondition(lambda self: bool(self.orphans))
    def a_given_up_request_lands_late(self, data: st.DataObject) -> None:
        name, request = self.orphans.pop(data.draw(st.integers(0, len(self.orphans) - 1)))
        if not data.draw(st.booleans()):  # or it is lost for good
            return
        if isinstance(request, Write):
            self.server.write(name, request.claims, request.version, request.wall)
        else:
            self.server.delete(request.holder, request.version, request.uid)

    def server_reads_listing(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or r.listing is None or r.listing.leases is not None:
            return
        if name in self.connected:
            r.listing.leases = self.server.listing()

    def answer_listing(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or r.listing is None or r.listing.leases is None:
            return
        leases, sent_at = r.listing.leases, r.listing.sent_at
        r.listing = None
        self._advance(r, Observation(leases, sent_at, self.now, self._wall(r)))

    def fail_listing(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or r.listing is None:
            return
        r.listing = None
        self._advance(r, None)

    def finish_stop(self, name: str) -> None:
        r = self.live.get(name)
        if r is None or not isinstance(r.waiting, StopSlots):
            return
        r.working -= r.waiting.slots
        self._advance(r, None)

    def crash(self, name: str) -> None:
        r = self.live.get(name)
        if r is not None:
            self._gone(r, delete=False)

    def cut_off(self, name: str) -> None:
        self.connected.discard(name)

    def reconnect(self, name: str) -> None:
        if name in self.live:
            self.connected.add(name)

    def leave(self, name: str) -> None:
        r = self._member(name)
        if r is None or r.steps is not None or r.leaving:
            return
        r.leaving = True
        r.steps = r.member.leave(10.0)
        self._advance(r, None)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 2.0, 4.0, 6.0, 11.0, 16.0]))
    def time_passes(self, dt: float) -> None:
        self._time_passes(dt, paused=None)

    @rule(i=st.integers(0, 3), dt=st.sampled_from([3.0, 9.0, 11.0, 16.0, 30.0]))
    def process_paused(self, i: int, dt: float) -> None:
        """The whole process of one replica is paused for ``dt`` seconds (SIGSTOP, a GC
        pause): its watchdog does not run; the others go on. Its requests already sent are
        still read and landed by the server; it handles their answers, and its timers, only
        after the pause, in any order the other rules pick -- before its watchdog runs at the
        next passing of time."""
        name = self._pick(i)
        self._time_passes(dt, paused=name)

    def _time_passes(self, dt: float, paused: str | None) -> None:
        end = self.now + dt
        while True:
            # The watchdog wakes at the deadline and asks the protocol whether to fence.
            due = [
                (at, r)
                for r in self.live.values()
                if r.name != paused
                and (at := max(self.now, r.member.fence_at())) <= end
                and r.member.fence_due(at)
            ]
            if not due:
                break
            at, r = min(due, key=lambda d: d[0])
            self.now = at
            self._fence(r)
        self.now = end

    # -- what must hold -----------------------------------------------------------------------

    def _acting(self) -> list[Replica]:
        """Replicas whose renew deadline lies ahead (past it, a paused replica's workers and
        writes refuse to act)."""
        return [r for r in self.live.values() if not r.member.fence_due(self.now)]

    @invariant()
    def no_slot_is_worked_on_by_two_replicas(self) -> None:
        holders: dict[int, str] = {}
        for r in self._acting():
            for slot in r.working:
                assert slot not in holders, (
                    f"slot {slot} worked on by {holders[slot]} and {r.name} at t={self.now}"
                )
                holders[slot] = r.name

    @invariant()
    def a_replica_works_only_on_slots_its_lease_claims(self) -> None:
        for r in self._acting():
            on_server = self.server.claims(r.name)
            assert r.working <= on_server, (
                f"{r.name} works on {sorted(r.working)} but its Lease claims "
                f"{sorted(on_server)} at t={self.now}"
            )

    @invariant()
    def what_counts_as_published_is_on_the_server(self) -> None:
        for r in self.live.values():
            if self.now >= r.member.fence_at():
                continue  # past its deadline another member may delete its Lease
            on_server = self.server.claims(r.name)
            assert r.member.published <= on_server, (
                f"{r.name} counts {sorted(r.member.published)} as published; its Lease "
                f"claims {sorted(on_server)} at t={self.now}"
            )

    @invariant()
    def the_protocol_knows_what_it_works_on(self) -> None:
        for r in self.live.values():
            assert r.working == r.member.active, (r.name, r.working, r.member.active)


TestRingModel = RingModel.TestCase
TestRingModel.settings = settings(max_examples=500, stateful_step_count=80)


# -- progress, with a network that answers --------------------------------------------------------


def _run_round(members: dict[str, RingMember], server: Server, now: float) -> None:
    """One step of every member, each request answered at once."""
    for name, member in members.items():
        steps = member.step()
        reply: object = None
        while True:
            try:
                effect = steps.send(reply)
            except StopIteration:
                break
            reply = None
            if isinstance(effect, Observe):
                reply = Observation(server.listing(), now, now, now)
            elif isinstance(effect, Publish):
                claims = frozenset(member.claims)
                member.sending(claims)
                assert server.write(name, claims, member.lease_version, now) == "ok"
                member.published_claims(claims, now, str(server.rv))
                reply = True
            elif isinstance(effect, Sweep):
                for lease in effect.leases:
                    server.delete(lease.holder, lease.resource_version, lease.uid)
            elif isinstance(effect, StartSlots):
                reply = frozenset()


def _member(name: str, clock: list[float]) -> RingMember:
    return RingMember(
        name,
        SLOTS,
        lease_duration=LEASE,
        renew_deadline=DEADLINE,
        drain_timeout=1.0,
        clock=lambda: clock[0],
    )


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_a_quiet_ring_converges_to_the_division_in_a_few_rounds(count: int) -> None:
    clock = [0.0]
    server = Server()
    names = [f"m{i}" for i in range(count)]
    members = {n: _member(n, clock) for n in names}
    for n, m in members.items():
        assert server.write(n, frozenset(), None, 0.0) == "ok"
        m.published_claims(frozenset(), 0.0, str(server.rv))
    for _ in range(4):
        _run_round(members, server, clock[0])
        clock[0] += 2.0
    division = assign_slots(names, SLOTS)
    assert {n: frozenset(m.active) for n, m in members.items()} == division
    assert sorted(s for m in members.values() for s in m.active) == list(range(SLOTS))


def test_a_member_whose_lease_stopped_changing_is_gone_only_after_the_lease_duration() -> None:
    member = _member("a", [0.0])
    other = (LeaseRecord("b", "7", LEASE, frozenset({1})),)
    member.see(Observation(other, sent_at=0.0, received_at=3.0))  # changed as of 3.0
    member.see(Observation(other, sent_at=17.9, received_at=30.0))  # sent before 3 + 15
    assert member.members == ["a", "b"] and member.claimed_by_other(1)
    assert member.expired() == ()
    member.see(Observation(other, sent_at=18.0, received_at=18.1))
    assert member.members == ["a"] and not member.claimed_by_other(1)
    assert member.expired() == other


def test_a_newcomer_does_not_count_a_member_whose_lease_expired_before_it_came() -> None:
    """A newcomer lists a Lease last renewed 20 s ago by the holder's wall clock (its
    holder died). It is no member of the newcomer's division at once, but its claims still
    count until the newcomer has seen it unchanged for the lease duration itself (or someone
    deletes it): a wrong clock may move the division, never make a slot look free."""
    newcomer = _member("new", [100.0])
    dead = LeaseRecord("dead", "7", LEASE, frozenset({1, 2}), "u1", renewed_at=1_000.0)
    live = LeaseRecord("live", "9", LEASE, frozenset({3}), "u2", renewed_at=1_019.5)
    newcomer.see(Observation((dead, live), sent_at=100.0, received_at=100.1, wall_at=1_020.0))
    assert newcomer.members == ["live", "new"]
    assert newcomer.claimed_by_other(1) and newcomer.claimed_by_other(3)
    assert newcomer.expired() == ()  # deleting needs the newcomer's own 15 s
    # The live member's Lease changes every retry period: a member whatever its renewTime
    # (here its clock runs 2 minutes late).
    renewed = LeaseRecord("live", "10", LEASE, frozenset({3}), "u2", renewed_at=900.0)
    newcomer.see(Observation((dead, renewed), sent_at=115.1, received_at=115.2, wall_at=1_035.1))
    assert newcomer.members == ["live", "new"]
    assert not newcomer.claimed_by_other(1) and newcomer.claimed_by_other(3)
    assert newcomer.expired() == (dead,)


def test_a_step_that_outlived_a_renewal_stall_never_starts_what_it_claimed() -> None:
    """Found by the model: r4 claims every slot, its confirming listing is read at once but
    answered only after r4 went 15 s without a renewal (no slot worked on yet, so the renew
    deadline seemed not to matter); r3 meanwhile saw r4's Lease expire and took every slot.
    The stale answer must not start anything: claims lapse at the renew deadline like work."""
    model = RingModel()
    model.start_ring(skews=[0.0, 0.0, 0.0])
    model.join(0.0)
    model.time_passes(SETTLE)
    for name in ("r1", "r2", "r3", "r4"):
        model.renew(name)
    model.crash("r1")
    model.crash("r2")  # r3 and r4 see their Leases until they expire
    model.time_passes(2.0)
    model.renew("r4")
    model.begin_step("r4")
    model.server_reads_listing("r4")
    model.answer_listing("r4")  # r4 claims its half
    model.send_step_write("r4")
    model.land_write("r4")
    model.answer_write("r4")
    model.server_reads_listing("r4")  # the confirming listing, read at once...
    for _ in range(10):  # ...r4 does nothing for 20 s (its watchdog runs); r3 goes on
        model.time_passes(2.0)
        model.get_on(i=2, times=12)
        assert not model.live["r4"].working
    assert not model.live["r4"].member.claims  # fenced by its watchdog meanwhile
    model.answer_listing("r4")  # the stale answer, if it still came, starts nothing
    model.get_on(i=2, times=20)  # r3: r1, r2 and r4 expired; takes every slot
    assert model.live["r3"].working == set(range(SLOTS))
    model.no_slot_is_worked_on_by_two_replicas()
    assert not model.live["r4"].working


def test_a_claim_whose_write_failed_is_not_worked_on_until_a_write_publishes_it() -> None:
    """r1 claims every slot but the write fails; its next step finds nothing to write (the
    claims are unchanged) and must not start them: the Lease says r1 claims nothing, so r2,
    which sees both members, takes its half meanwhile."""
    model = RingModel()
    model.start_ring(skews=[0.0, 0.0])
    model.time_passes(SETTLE)

    def answered(name: str) -> None:
        model.server_reads_listing(name)
        model.answer_listing(name)

    model.renew("r1")
    model.begin_step("r1")
    answered("r1")  # r1 does not see r2 yet: claims all 8 slots
    model.send_step_write("r1")
    model.fail_write("r1")  # and never lands
    model.begin_step("r1")
    answered("r1")
    answered("r1")
    assert model.live["r1"].member.claims == set(range(SLOTS))
    assert not model.live["r1"].working
    model.renew("r2")
    model.begin_step("r2")
    answered("r2")  # r2 sees r1 (claiming nothing) and itself
    model.send_step_write("r2")
    model.land_write("r2")
    model.answer_write("r2")
    answered("r2")
    assert len(model.live["r2"].working) == SLOTS // 2
    model.no_slot_is_worked_on_by_two_replicas()


def test_the_watchdog_fences_at_the_deadline_despite_floating_point_rounding() -> None:
    """Found by the model: two members renewed at t=11.3 and the watchdog woke at
    ``11.3 + 10.0``, where ``now - last_renew`` rounds to 9.999999999999998, so neither was
    fenced; 16 s later both still worked on their slots, each seeing the other expired. The
    deadline and the check now use one sum (:meth:`RingMember.fence_at`)."""
    now = 11.299999999999999
    member = _member("a", [now])
    member.claims = {1}
    member.published_claims(frozenset({1}), now, "1")
    assert now + DEADLINE - now < DEADLINE  # the rounding that hid the deadline
    assert not member.fence_due(member.fence_at() - 1e-9)
    assert member.fence_due(member.fence_at())


def test_a_replica_resumed_after_a_pause_past_its_deadline_starts_and_claims_nothing() -> None:
    """r1 claims every slot and publishes it; its confirming listing is read by the server,
    then its process is paused for 11 s (past the 10 s renew deadline; its watchdog does not
    run). On resuming, the listing's answer comes before the watchdog: no slot may start; a
    renewal due meanwhile must not write the old claims either (the others may take them over
    at the lease duration)."""
    model = RingModel()
    model.start_ring(skews=[0.0])
    model.time_passes(SETTLE)
    model.renew("r1")
    model.begin_step("r1")
    model.server_reads_listing("r1")
    model.answer_listing("r1")  # alone: claims every slot
    model.send_step_write("r1")
    model.land_write("r1")
    model.answer_write("r1")
    assert model.live["r1"].member.published == frozenset(range(SLOTS))
    model.server_reads_listing("r1")  # the confirming listing, read at once
    model.process_paused(i=0, dt=11.0)
    model.answer_listing("r1")  # handled before the watchdog
    assert not model.live["r1"].working
    model.begin_renewal("r1")  # the renewal timer, also due
    assert model.live["r1"].write is None, "the old claims were written after the pause"
    model.time_passes(0.1)  # the watchdog runs: fenced, and it withdraws its Lease
    assert not model.live["r1"].member.claims
    model.progress_withdrawal("r1")
    model.progress_withdrawal("r1")
    assert "r1" not in model.server.leases
    model.begin_renewal("r1")
    assert model.live["r1"].write is None, "a replica backing off wrote its Lease"


class UnconditionalServer(Server):
    """What the ring did before its writes were conditional: a write of a member's Lease
    replaced whatever was there."""

    def write(self, holder: str, claims: frozenset[int], version: str | None, wall: float) -> str:
        current = self.leases.get(holder)
        return super().write(holder, claims, None if current is None else str(current.rv), wall)


@pytest.mark.parametrize("conditional", [True, False])
def test_a_given_up_write_of_the_own_lease_never_overwrites_a_later_one(
    conditional: bool,
) -> None:
    """The schedule behind the model's first counterexample, without a pause: r1 releases
    half its slots to a newcomer but gives up on that write (it may still land); the newcomer
    leaves; r1 claims every slot again, publishes it and starts them; then the old write lands.
    Conditioned on the resourceVersion r1 knew when it sent it, it is refused, and a third
    replica finds every slot claimed. Unconditioned (as the ring wrote before), it replaced
    r1's Lease: r1 worked on slots its Lease no longer claimed, and the third replica took
    them too."""
    model = RingModel()
    if not conditional:
        model.server = UnconditionalServer()
    model.start_ring(skews=[0.0])

    def listed(name: str) -> None:
        model.server_reads_listing(name)
        model.answer_listing(name)

    def written(name: str) -> None:
        model.send_step_write(name)
        model.land_write(name)
        model.answer_write(name)

    model.renew("r1")
    model.time_passes(SETTLE)
    model.renew("r1")
    model.begin_step("r1")
    listed("r1")
    written("r1")
    listed("r1")
    assert model.live["r1"].working == set(range(SLOTS))
    model.join(0.0)  # r2
    model.renew("r2")
    model.time_passes(RETRY)
    model.renew("r1")
    model.begin_step("r1")
    listed("r1")  # r1 sees r2: stops the half it loses...
    model.finish_stop("r1")
    model.send_step_write("r1")  # ...and writes its claims without it:
    model.fail_write("r1")  # given up on, still on its way
    kept = frozenset(model.live["r1"].working)
    assert len(kept) == SLOTS // 2
    model.leave("r2")  # r2 leaves cleanly before claiming anything
    written("r2")
    assert "r2" not in model.server.leases
    model.time_passes(RETRY)
    model.renew("r1")
    model.begin_step("r1")
    listed("r1")
    written("r1")  # r1 claims every slot again
    listed("r1")
    assert model.live["r1"].working == set(range(SLOTS))
    assert len(model.orphans) == 1
    model.orphans[0][1].outcome = None
    name, late = model.orphans.pop()
    try:
        model.server.write(name, late.claims, late.version, late.wall)  # type: ignore[union-attr]
        model.join(0.0)  # r3
        model.time_passes(RETRY)
        model.renew("r3")
        model.begin_step("r3")
        listed("r3")
        written("r3")
        listed("r3")
        model.no_slot_is_worked_on_by_two_replicas()
        model.a_replica_works_only_on_slots_its_lease_claims()
    except AssertionError as err:
        assert not conditional, err
        assert "worked on by r1 and r3" in str(err), err
        return
    assert conditional, "the late write went unnoticed"
    assert model.server.claims("r1") == frozenset(range(SLOTS))
    assert not model.live["r3"].working


def test_an_expired_lease_is_deleted_only_if_it_did_not_change_since_it_was_listed() -> None:
    """r2 stops renewing (cut off) and r1 sees its Lease expire; r1's delete is delayed
    while r2 reconnects and renews: it must not delete the renewed Lease. A second listing
    shows r2 alive; when r2 really is gone, its Lease is deleted."""
    model = RingModel()
    model.start_ring(skews=[0.0, 0.0])
    model.renew("r1")
    model.renew("r2")
    model.get_on(i=0, times=3)  # r1 lists: sees r2's Lease change
    model.cut_off("r2")
    for _ in range(9):
        model.time_passes(RETRY)
        model.renew("r1")
    model.begin_step("r1")
    model.server_reads_listing("r1")
    model.answer_listing("r1")  # r2's Lease unchanged for 18 s: expired
    assert [d.holder for d in model.live["r1"].sweeps] == ["r2"]
    model.reconnect("r2")
    model.renew("r2")
    model.land_sweep("r1")  # the delete arrives after the renewal
    assert "r2" in model.server.leases, "a renewed Lease was deleted"
    model.crash("r2")
    for _ in range(9):
        model.time_passes(RETRY)
        model.get_on(i=0, times=12)
    assert "r2" not in model.server.leases
    assert model.live["r1"].working == set(range(SLOTS))


def test_a_fenced_replica_is_no_member_until_its_back_off_ends() -> None:
    """r2 is paused past its renew deadline; when its watchdog fences it, it deletes its own
    Lease and writes nothing until the back-off ends: r1 takes every slot at its next step
    (no lease duration to wait), and r2 takes its half back after the back-off."""
    model = RingModel()
    model.start_ring(skews=[0.0, 0.0])
    model.time_passes(SETTLE)
    for _ in range(3):
        model.get_on(i=0, times=12)
        model.get_on(i=1, times=12)
        model.time_passes(RETRY)
    assert len(model.live["r2"].working) == SLOTS // 2
    for _ in range(6):  # r2 is paused for 12 s; r1 goes on renewing
        model.process_paused(i=1, dt=RETRY)
        model.renew("r1")
    model.time_passes(0.1)  # r2's watchdog
    assert not model.live["r2"].working
    model.get_on(i=1, times=5)  # its withdrawal goes through; nothing else is sent
    assert "r2" not in model.server.leases
    assert model.live["r2"].write is None and model.live["r2"].back_off_until is not None
    model.get_on(i=0, times=20)
    assert model.live["r1"].working == set(range(SLOTS))
    model.time_passes(BACKOFF)
    for _ in range(4):
        model.get_on(i=1, times=12)
        model.get_on(i=0, times=12)
        model.time_passes(RETRY)
    assert len(model.live["r2"].working) == SLOTS // 2


def test_a_ring_starting_up_waits_to_settle_but_a_newcomer_to_a_ring_that_is_up_does_not() -> None:
    model = RingModel()
    model.start_ring(skews=[0.0])
    model.get_on(i=0, times=12)
    assert not model.live["r1"].member.claims, "claimed before the ring settled"
    model.time_passes(SETTLE)
    model.get_on(i=0, times=12)
    assert model.live["r1"].working == set(range(SLOTS))
    model.join(0.0)
    model.get_on(i=1, times=3)  # r2 writes its Lease and lists: r1 holds everything
    model.time_passes(RETRY)
    model.get_on(i=0, times=12)  # r1 releases r2's half
    model.get_on(i=1, times=12)  # r2 claims it at once, well within its settle time
    assert model.now < model.live["r2"].member.settle_until
    assert len(model.live["r2"].working) == SLOTS // 2
