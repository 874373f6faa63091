"""Sharded controllers: a ring of replicas over Leases, each reconciling its own slice of the
objects, with a handover that never lets two replicas reconcile one object at once.

**Slots.** The 64-bit hash space of ``metadata.uid`` (or ``metadata.namespace``) is cut into
``slots`` equal ranges (16 by default). A slot is the unit of ownership and handover: each
owned slot gets its own informer, asking the API server for that range only
(:mod:`informers.sharding`), and its own work queue and workers.

**Membership.** Each replica holds one Lease of its own, ``<ring>-<hash of identity>``, in
the ring's namespace, labelled ``crpy.io/shard-ring=<ring>``, renewed every retry period
like leader election (same timings and validation: lease 15 s, renew deadline 10 s,
retry 2 s). Every write of it is conditional on the resourceVersion this replica last knew
(a merge patch carrying ``metadata.resourceVersion``; a create when it knows none): a write it
gave up on can never overwrite a later one. A member is live while its Lease has a holder
and has changed (judged by its resourceVersion, on this process's clock) within its lease
duration; a Lease this replica has never seen change is judged, for the division only, by
the age its ``renewTime`` shows on this process's wall clock, so a newcomer does not count a
long-dead member. A Lease that expired is deleted by whichever member sees it so first,
conditioned on its uid and resourceVersion (a Lease renewed meanwhile is never deleted).

**Division: bounded-load rendezvous hashing over slots** (:func:`assign_slots`). Every
(member, slot) pair gets a score (BLAKE2b of both); pairs are taken best score first, a slot
going to the first member that still has room under its quota (``slots // members``, one more
for the first ``slots % members`` members in sorted order). Why: the result depends only on
the set of live members (every replica computes the same answer without talking), it is
balanced to one slot, and a join or leave moves few slots beyond the ones that must move
(the tests measure it), where equal contiguous ranges over sorted members would move about
half of the space on every change.

**Handover.** Each replica records the slots it *claims* in its Lease (annotation
``crpy.io/shard-claims``). It works on a slot only while claiming it, and:

* *losing* a slot: it stops taking work for the slot, lets in-flight reconciles finish for up
  to ``drain_timeout`` and cancels the rest, stops the slot's informer, and only then writes
  its claims without the slot;
* *gaining* a slot: it claims it only when no live member claims it (a member whose Lease
  expired counts as gone), writes the claim, lists the ring again with a consistent read, and
  starts the slot only if still no other live member claims it (else it withdraws). Of two
  replicas racing for a slot, the later writer always sees the earlier claim; at worst both
  withdraw and retry a period later;
* *cut off* from the API server (or paused): when no renewal has succeeded for
  ``renew_deadline`` (counted from when the last successful renewal was *sent*) while it
  works on or claims slots, the replica cancels every in-flight reconcile, drops all its
  slots and claims and abandons the step in progress, by itself; then it deletes its Lease
  (conditioned, as above) and is no member until its back-off ends: it writes nothing in
  between. Its Lease, if the delete did not get through, expires for the others only
  ``lease_duration`` after they last saw it change (judged as of when they sent the listing
  that shows it unchanged), which is later, so they never start a slot it may still be
  working on.

The decisions are in :mod:`controller_runtime.shard_protocol` (no I/O, checked against a
model); this module performs the requests they ask for.

Caveats (the same as leader election's): this is not fencing. A write sent just before a
replica stopped may reach the server after another replica began; make writes conditional
(resourceVersion) and effects idempotent. Clocks may be skewed but must run at about the same
rate (a skewed wall clock only makes a newcomer misjudge, for a retry period, who shares the
division). Every replica of a ring must use the same ``slots`` and shard field. A create of
the own Lease given up on may still land after the Lease was deleted (on a clean leave): the
Lease then claims what the create said until it expires and is deleted (no slot is worked
on twice; those slots wait a lease duration).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp

from controller_runtime.fencing import FencedError
from controller_runtime.leaderelection import (
    JITTER,
    LeaderElectionConfig,
    _micro_time,
    default_identity,
)
from controller_runtime.metrics import TASK_FAILURES
from controller_runtime.shard_metrics import ring_metrics
from controller_runtime.shard_protocol import (
    Effect,
    Handover,
    LeaseRecord,
    Observation,
    Observe,
    Publish,
    RingMember,
    StartSlots,
    Steps,
    StopSlots,
    Sweep,
    assign_slots,
)
from informers.sharding import HashRange, ShardField, ShardSelector, split_hash_space
from kubeclient.errors import ApiError, ConflictError, NotFoundError
from kubeclient.transport import Transport

__all__ = [
    "CLAIMS_ANNOTATION",
    "RING_LABEL",
    "ShardRing",
    "ShardRingConfig",
    "SlotListener",
    "assign_slots",
    "slot_selector",
]

log = logging.getLogger(__name__)

_EXPECTED = (ApiError, TimeoutError, OSError, aiohttp.ClientError)
"""Failures of a renewal or a listing that the network or the server explain."""

RING_LABEL: Final = "crpy.io/shard-ring"
"""Label on every member Lease: the ring's name."""
CLAIMS_ANNOTATION: Final = "crpy.io/shard-claims"
"""Annotation on a member Lease: the slots it claims, comma-separated (``""``: none)."""
SLOTS_ANNOTATION: Final = "crpy.io/shard-slots"
"""Annotation on a member Lease: how many slots the member divides the hash space into."""


@dataclass(frozen=True)
class ShardRingConfig:
    """A ring: its name, where its Leases live, and the timings (seconds).

    Timings and their validation are leader election's (lease 15 s, renew deadline 10 s,
    retry period 2 s). ``slots`` (16) must be the same on every replica; more slots balance
    better and hand over in smaller pieces, at the cost of one watch per owned slot.
    ``drain_timeout`` (10 s) bounds how long in-flight reconciles of a slot being handed
    over may run before they are cancelled. ``shard_field`` is what objects are hashed by.
    ``settle`` (default: two retry periods) is how long a replica that just joined waits,
    its Lease already written, before it claims slots *while no other member claims any* (a
    ring starting up): replicas started together (a rollout of a stopped ring, a restart)
    then see each other first, instead of the first one listing every object and handing
    most slots over again a moment later. A replica joining a ring that is up claims what is
    handed over to it at once. After its renew deadline passed (fenced), a replica deletes its
    Lease and waits ``settle`` x 2, x 4 ... (up to x 32 while fences come within a minute of
    each other), a member of nothing and writing nothing, before it joins again, so an
    overloaded replica does not take the same load straight back.
    """

    name: str
    namespace: str
    identity: str = field(default_factory=default_identity)
    slots: int = 16
    shard_field: ShardField = ShardField.UID
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    drain_timeout: float = 10.0
    settle: float | None = None

    @property
    def settle_seconds(self) -> float:
        return 2 * self.retry_period if self.settle is None else self.settle

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 40:
            raise ValueError(f"a ring name must have 1 to 40 characters, got {self.name!r}")
        if not 1 <= self.slots <= 1024:
            raise ValueError(f"slots must be between 1 and 1024, got {self.slots}")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout}")
        _ = self.timings  # validates like leader election (raises ValueError)

    @property
    def timings(self) -> LeaderElectionConfig:
        """This member's Lease as leader election would describe it (name and timings)."""
        digest = hashlib.blake2b(self.identity.encode(), digest_size=6).hexdigest()
        return LeaderElectionConfig(
            namespace=self.namespace,
            name=f"{self.name}-{digest}",
            identity=self.identity,
            lease_duration=self.lease_duration,
            renew_deadline=self.renew_deadline,
            retry_period=self.retry_period,
        )


def slot_range(slot: int, slots: int) -> HashRange:
    return split_hash_space(slots)[slot]


def slot_selector(slot: int, slots: int, shard_field: ShardField = ShardField.UID) -> ShardSelector:
    """The shard selector of one slot."""
    return ShardSelector(shard_field, [slot_range(slot, slots)])


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "no answer in time (is the API server overloaded, or this process starved?)"
    return str(err) or type(err).__name__


class SlotListener(Protocol):
    """What a ring drives: start work on a slot, stop it (draining up to a timeout)."""

    async def start_slot(self, slot: int) -> None: ...

    async def stop_slot(self, slot: int, drain_timeout: float | None) -> None: ...


def _parse_claims(text: str | None) -> frozenset[int]:
    if not text:
        return frozenset()
    return frozenset(int(part) for part in text.split(",") if part.strip().isdigit())


@dataclass(frozen=True, slots=True)
class SlotFence:
    """One slot's fence: see :meth:`ShardRing.slot_fence`."""

    ring: ShardRing
    slot: int

    def holds(self) -> bool:
        return self.ring.holds_slot(self.slot)

    def describe(self) -> str:
        return f"slot {self.slot} of shard ring {self.ring.config.name}"


class ShardRing:
    """One replica's membership in a ring, and the handover of its slots.

    :meth:`run` (or the manager, which runs it as a runnable) keeps the Lease and moves slots;
    :meth:`leave` hands every slot over cleanly and deletes the Lease. Listeners (sharded
    controllers) are told to start and stop slots; all listeners of a ring share its slots.

    Attributes worth reading: :attr:`members` (live, as last seen), :attr:`active` (slots
    being worked on), :attr:`claims` (slots claimed, including those being drained).
    """

    need_leader_election = False

    def __init__(
        self,
        transport: Transport,
        config: ShardRingConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.transport = transport
        self.config = config
        self.lease = config.timings
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{config.namespace}/leases"
        self._path = f"{self._collection}/{self.lease.name}"
        self.listeners: list[SlotListener] = []
        self.protocol = RingMember(
            config.identity,
            config.slots,
            lease_duration=config.lease_duration,
            renew_deadline=config.renew_deadline,
            drain_timeout=config.drain_timeout,
            clock=clock,
        )
        self._renew_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.handovers = 0
        self._backing_off = False
        self._fences_in_row = 0
        self._last_fence = -float("inf")
        self._names: dict[str, str] = {}  # holder -> Lease name, as listed
        self._m = ring_metrics(config.name)

    @property
    def members(self) -> list[str]:
        """Live members as last listed (this replica included)."""
        return self.protocol.members

    @property
    def active(self) -> set[int]:
        """Slots being worked on."""
        return self.protocol.active

    @property
    def claims(self) -> set[int]:
        """Slots claimed, including those being drained."""
        return self.protocol.claims

    # -- lifecycle --------------------------------------------------------------------------

    def add_listener(self, listener: SlotListener) -> None:
        """Have ``listener`` started and stopped with this replica's slots (add before
        :meth:`start`)."""
        self.listeners.append(listener)

    async def start(self) -> None:
        """Join the ring in the background (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"shard-ring-{self.config.name}"
            )

    async def stop(self, drain_timeout: float | None) -> object:
        """Leave the ring: see :meth:`leave`."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.leave(drain_timeout)
        return None

    async def run(self) -> None:
        """Keep the Lease and move slots until cancelled. A missed renew deadline drops every
        slot at once (in-flight reconciles cancelled), then the replica rejoins."""
        while True:
            stepping = asyncio.create_task(self._loop(), name=f"shard-ring-{self.config.name}")
            failed = False
            try:
                await self._watchdog(stepping)
            except Exception:
                # A bug in a step: never keep working without the loop that renews and
                # watches the deadline. Drop everything, then start over.
                failed = True
                TASK_FAILURES.labels("shard-ring").inc()
                log.exception(
                    "shard ring %s: the ring's loop failed; dropping every slot and rejoining",
                    self.config.name,
                )
            finally:
                stepping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stepping
            await self._fence()
            if failed:
                await asyncio.sleep(self.config.retry_period)

    async def leave(self, drain_timeout: float | None) -> None:
        """Stop every slot (draining up to ``drain_timeout``), record that nothing is claimed,
        and delete this replica's Lease so the others take over at their next step."""
        await self._perform_all(self.protocol.leave(drain_timeout))
        await self._withdraw()
        self.protocol.members = []
        self._m.members.set(0)
        log.info("left shard ring %s as %s", self.config.name, self.config.identity)

    def slot_fence(self, slot: int) -> SlotFence:
        """The fence of ``slot``'s work (:mod:`controller_runtime.fencing`): held while the
        slot is worked on and the renew deadline lies ahead on this process's clock."""
        return SlotFence(self, slot)

    def holds_slot(self, slot: int) -> bool:
        """Whether this replica works on ``slot`` and its renew deadline lies ahead."""
        return slot in self.protocol.active and not self.protocol.fence_due(self._clock())

    @property
    def has_synced(self) -> bool:
        """True when every listener's caches of the active slots are synced."""
        return all(getattr(listener, "has_synced", True) for listener in self.listeners)

    # -- the loop ---------------------------------------------------------------------------

    async def _watchdog(self, stepping: asyncio.Task[None]) -> None:
        """Return when the renew deadline passed with slots active or claimed (or raise what
        the loop raised)."""
        deadline = self.config.renew_deadline
        while True:
            # Not holding anything: look again soon, as a step may claim at any moment.
            holding = self.active or self.claims
            wait = max(self.protocol.fence_at() - self._clock(), 0.0) if holding else 0.25
            done, _ = await asyncio.wait({stepping}, timeout=max(wait, 0.05))
            if stepping in done:
                stepping.result()
                return
            if self.protocol.fence_due(self._clock()):
                log.error(
                    "shard ring %s: no renewal for %.1fs (deadline %.0fs); dropping slots %s "
                    "and cancelling their reconciles",
                    self.config.name,
                    self._clock() - self.protocol.last_renew,
                    deadline,
                    sorted(self.active),
                )
                return

    async def _fence(self) -> None:
        self._m.fenced.inc()
        await self._stop_slots(set(self.active), 0)
        self.protocol.fenced()
        # Back off before claiming again: a replica fenced because it was overloaded (every
        # slot relisting at once) would otherwise take the same load on at once, miss its
        # deadline again, and never settle. Doubles while fences come within a minute.
        now = self._clock()
        recent = now - self._last_fence < 60.0
        self._fences_in_row = min(self._fences_in_row + 1, 5) if recent else 1
        self._last_fence = now
        self._backing_off = True

    def _jittered_period(self) -> float:
        return self.config.retry_period * (1 + self._rng.random() * (JITTER - 1))

    async def _loop(self) -> None:
        if self._backing_off:
            await self._back_off(self.config.settle_seconds * 2**self._fences_in_row)
            self._backing_off = False
        self.protocol.joining(self._clock(), self.config.settle_seconds)
        await self._renew()  # the Lease first: the others see this member before it claims
        # Renewals run beside the steps: a step may wait for a slot to drain or a cache to
        # sync for longer than the renew deadline.
        renewing = asyncio.create_task(self._renew_forever(), name="shard-ring-renew")
        try:
            while True:
                await self._step()
                await asyncio.sleep(self._jittered_period())
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing

    async def _back_off(self, seconds: float) -> None:
        """After a fence: no member for ``seconds``. The Lease is deleted first (retried
        every retry period until it is gone: renewals sent before the fence may still land
        and renew it), so that the others take its slots at their next step instead of
        handing slots to this replica that it would not claim before the back-off ends.
        Nothing else is written meanwhile."""
        until = self._clock() + seconds
        log.info(
            "shard ring %s: no member for %.1fs (fenced %d times in a row)",
            self.config.name,
            seconds,
            self._fences_in_row,
        )
        withdrawn = False
        while True:
            withdrawn = withdrawn or await self._withdraw()
            left = until - self._clock()
            if left <= 0:
                return
            await asyncio.sleep(left if withdrawn else min(self.config.retry_period, left))

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.retry_period)
            await self._renew()

    async def _step(self) -> None:
        await self._perform_all(self.protocol.step())

    async def _perform_all(self, steps: Steps) -> None:
        """Drive one of the protocol's generators, performing each effect it yields."""
        reply: object = None
        while True:
            try:
                effect = steps.send(reply)
            except StopIteration:
                return
            reply = await self._perform(effect)

    async def _perform(self, effect: Effect) -> object:
        match effect:
            case Observe():
                return await self._observe()
            case Publish():
                return await self._renew()
            case Sweep(leases):
                await self._sweep(leases)
                return None
            case StopSlots(slots, drain):
                await self._stop_slots(set(slots), drain)
                return None
            case StartSlots(slots):
                ordered = sorted(slots)
                ok = await asyncio.gather(*(self._start_slot(slot) for slot in ordered))
                return frozenset(s for s, good in zip(ordered, ok, strict=True) if not good)
            case Handover(kind, slots, seconds):
                self._handover(kind, slots, seconds)
                return None
        raise AssertionError(f"unknown effect {effect!r}")  # pragma: no cover

    def _handover(self, kind: str, slots: frozenset[int], seconds: float) -> None:
        self.handovers += len(slots)
        self._m.handover(kind, len(slots), seconds)
        log.info(
            "shard ring %s: %s slots %s in %.2fs; active %s",
            self.config.name,
            "released" if kind == "release" else "acquired",
            sorted(slots),
            seconds,
            sorted(self.active),
        )

    async def _start_slot(self, slot: int) -> bool:
        """Start ``slot`` with every listener; on a failure stop it again and return False."""
        self._m.owned.set(len(self.active))
        for listener in self.listeners:
            try:
                await listener.start_slot(slot)
            except Exception:
                log.exception("shard ring %s: starting slot %d failed", self.config.name, slot)
                await self._stop_slots({slot}, 0)
                return False
        return True

    async def _stop_slots(self, slots: set[int], drain_timeout: float | None) -> None:
        if not slots:
            return

        async def stop(listener: SlotListener, slot: int) -> None:
            try:
                await listener.stop_slot(slot, drain_timeout)
            except Exception:
                log.exception("shard ring %s: stopping slot %d failed", self.config.name, slot)

        await asyncio.gather(*(stop(li, s) for li in self.listeners for s in slots))
        self.active.difference_update(slots)
        self._m.owned.set(len(self.active))

    # -- the Leases -------------------------------------------------------------------------

    def _body(self, claims: frozenset[int]) -> dict[str, Any]:
        now = _micro_time()
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.lease.name,
                "namespace": self.config.namespace,
                "labels": {RING_LABEL: self.config.name},
                "annotations": {
                    CLAIMS_ANNOTATION: ",".join(str(s) for s in sorted(claims)),
                    SLOTS_ANNOTATION: str(self.config.slots),
                },
            },
            "spec": {
                "holderIdentity": self.config.identity,
                "leaseDurationSeconds": int(self.config.lease_duration),
                "renewTime": now,
            },
        }

    @property
    def _attempt_timeout(self) -> float:
        return max(self.config.renew_deadline / 2, 1.0)

    async def _renew(self) -> bool:
        """Write this member's Lease with its current claims. True on success, and then the
        claims are published as of the moment the request was sent."""
        async with self._renew_lock:
            sent = self._clock()
            publishable = self.protocol.claims_to_publish(sent)
            if publishable is None:
                # Resumed after a pause past the renew deadline, before the watchdog ran: the
                # others may hold these slots by now; write nothing until fenced.
                log.warning(
                    "shard ring %s: renew deadline passed; not renewing %s until the slots "
                    "are dropped",
                    self.config.name,
                    self.lease.name,
                )
                return False
            claims = publishable
            try:
                async with asyncio.timeout(self._attempt_timeout):
                    version, uid = await self._write_lease(claims)
            except FencedError as err:
                log.warning("shard ring %s: %s", self.config.name, err)
                return False
            except _EXPECTED as err:
                log.warning(
                    "shard ring %s: renewing %s failed: %s",
                    self.config.name,
                    self.lease.name,
                    _describe(err),
                )
                return False
            except Exception:  # a bug or a failure of the stack under us: still a failed renewal
                TASK_FAILURES.labels("shard-ring").inc()
                log.exception("shard ring %s: renewing %s failed", self.config.name, self._path)
                return False
            self.protocol.published_claims(claims, sent, version, uid)
            return True

    def _may_send(self, claims: frozenset[int]) -> Callable[[], None]:
        """The check right before each send of a Lease write carrying ``claims``: none is
        sent past the renew deadline (a pause may fall between two attempts)."""

        def check() -> None:
            if claims and self._clock() >= self.protocol.fence_at():
                raise FencedError(
                    f"not sent: the claims of {self.lease.name} (slots {sorted(claims)}); the "
                    "renew deadline passed, the slots are dropped first"
                )

        return check

    async def _write_lease(self, claims: frozenset[int]) -> tuple[str, str]:
        """Write the Lease conditioned on the resourceVersion last known (create it when none
        is); on a conflict read it again, on "not found" create it, and try again (three
        attempts). Returns the new resourceVersion and the uid."""
        check = self._may_send(claims)
        attempts = 3
        for attempt in range(1, attempts + 1):
            version = self.protocol.lease_version
            body = self._body(claims)
            self.protocol.sending(claims)  # from now on it may land, even if given up on
            try:
                if version is None:
                    body["spec"]["acquireTime"] = body["spec"]["renewTime"]
                    answer = await self.transport.request(
                        "POST", self._collection, body=body, before_send=check
                    )
                else:
                    body["metadata"]["resourceVersion"] = version
                    answer = await self.transport.request(
                        "PATCH",
                        self._path,
                        body=body,
                        content_type="application/merge-patch+json",
                        before_send=check,
                    )
            except NotFoundError:
                self.protocol.lease_gone()
                if attempt == attempts:
                    raise
                continue
            except ConflictError:  # a stale version, or a create of a Lease that exists
                self.protocol.lease_read(await self._read_own())
                if attempt == attempts:
                    raise
                continue
            meta = (answer.json() or {}).get("metadata") or {}
            return str(meta.get("resourceVersion") or ""), str(meta.get("uid") or "")
        raise AssertionError("unreachable")  # pragma: no cover

    async def _read_own(self) -> LeaseRecord | None:
        """This member's Lease as the server has it now (a consistent list by name: the
        ring's Role allows ``list``, not ``get``), or ``None``."""
        answer = await self.transport.get_json(
            self._collection, {"fieldSelector": f"metadata.name={self.lease.name}"}
        )
        for item in answer.get("items") or ():
            return self._record(item)
        return None

    async def _withdraw(self) -> bool:
        """Delete this member's Lease, conditioned on its uid and the resourceVersion this
        member knows (on a conflict: read it again and try once more), so that a delete given
        up on can never remove a Lease written after it. True when the Lease is gone.
        Failures are logged: the Lease then expires and another member deletes it."""
        try:
            async with self._renew_lock, asyncio.timeout(self._attempt_timeout):
                for _ in range(2):
                    if self.protocol.lease_version is None:
                        self.protocol.lease_read(await self._read_own())
                        if self.protocol.lease_version is None:
                            return True  # nothing to delete
                    if await self._delete_own():
                        return True
        except _EXPECTED as err:  # it expires by itself; the others then take over
            log.warning(
                "shard ring %s: deleting %s failed: %s",
                self.config.name,
                self.lease.name,
                _describe(err),
            )
        except Exception:
            TASK_FAILURES.labels("shard-ring").inc()
            log.exception("shard ring %s: deleting %s failed", self.config.name, self._path)
        return False

    async def _delete_own(self) -> bool:
        """One conditioned delete; True when the Lease is gone."""
        version = self.protocol.lease_version
        assert version is not None
        preconditions = {"resourceVersion": version}
        if self.protocol.lease_uid:
            preconditions["uid"] = self.protocol.lease_uid
        self.protocol.sending(frozenset())
        try:
            await self.transport.request("DELETE", self._path, body=_delete_options(preconditions))
        except NotFoundError:
            pass
        except ConflictError:
            self.protocol.lease_read(await self._read_own())
            return self.protocol.lease_version is None
        self.protocol.lease_gone()
        return True

    async def _sweep(self, leases: tuple[LeaseRecord, ...]) -> None:
        """Delete other members' Leases that expired, each conditioned on its uid and
        resourceVersion as listed (a Lease renewed or re-created since stays)."""
        for lease in leases:
            name = self._lease_name(lease)
            preconditions = {"resourceVersion": lease.resource_version}
            if lease.uid:
                preconditions["uid"] = lease.uid
            try:
                async with asyncio.timeout(self._attempt_timeout):
                    await self.transport.request(
                        "DELETE", f"{self._collection}/{name}", body=_delete_options(preconditions)
                    )
            except (NotFoundError, ConflictError):
                continue  # gone already, or renewed meanwhile
            except _EXPECTED as err:
                log.warning(
                    "shard ring %s: deleting the expired Lease of %s failed: %s",
                    self.config.name,
                    lease.holder,
                    _describe(err),
                )
                continue
            log.info(
                "shard ring %s: deleted the expired Lease %s of %s (unchanged for %.0fs)",
                self.config.name,
                name,
                lease.holder,
                lease.duration,
            )

    def _lease_name(self, lease: LeaseRecord) -> str:
        return (
            self._names.get(lease.holder)
            or ShardRingConfig(
                self.config.name, self.config.namespace, identity=lease.holder
            ).timings.name
        )

    def _record(self, lease: dict[str, Any]) -> LeaseRecord:
        meta = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        annotations = meta.get("annotations") or {}
        if holder and meta.get("name"):
            self._names[holder] = str(meta["name"])
        return LeaseRecord(
            holder,
            str(meta.get("resourceVersion") or ""),
            float(spec.get("leaseDurationSeconds") or self.config.lease_duration),
            _parse_claims(annotations.get(CLAIMS_ANNOTATION)),
            str(meta.get("uid") or ""),
            _parse_micro_time(spec.get("renewTime")),
        )

    async def _observe(self) -> Observation | None:
        """List the ring's Leases (a consistent read); None when that failed."""
        sent = self._clock()
        try:
            async with asyncio.timeout(self._attempt_timeout):
                answer = await self.transport.get_json(
                    self._collection, {"labelSelector": f"{RING_LABEL}={self.config.name}"}
                )
        except _EXPECTED as err:
            log.warning(
                "shard ring %s: listing members failed: %s", self.config.name, _describe(err)
            )
            return None
        except Exception:  # try again next period, but say so loudly
            TASK_FAILURES.labels("shard-ring").inc()
            log.exception("shard ring %s: listing members failed", self.config.name)
            return None
        received = self._clock()
        wall = self._wall_clock()
        leases = []
        for item in answer.get("items") or ():
            record = self._record(item)
            slots = ((item.get("metadata") or {}).get("annotations") or {}).get(SLOTS_ANNOTATION)
            if (
                slots
                and slots != str(self.config.slots)
                and record.holder
                not in (
                    "",
                    self.config.identity,
                )
            ):
                log.error(
                    "shard ring %s: member %s divides into %s slots, this replica into %d; "
                    "every replica of a ring must use the same number of slots",
                    self.config.name,
                    record.holder,
                    slots,
                    self.config.slots,
                )
            leases.append(record)
        observation = Observation(tuple(leases), sent, received, wall)
        before = list(self.protocol.members)
        self.protocol.see(observation)
        if self.protocol.members != before:
            log.info("shard ring %s: members %s", self.config.name, self.protocol.members)
        self._m.members.set(len(self.protocol.members))
        return observation


def _delete_options(preconditions: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}


def _parse_micro_time(text: object) -> float | None:
    """A Lease's ``renewTime`` (RFC 3339, microseconds) as POSIX seconds, or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
