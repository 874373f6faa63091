"""A ring member's Leases against the real API server: a write of its own Lease it gave up on
that reaches the server late never overwrites a later one; an expired Lease is deleted by
another member only if nobody renewed it meanwhile; a fenced member deletes its own Lease; a
newcomer does not count a member whose Lease expired before it came."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller_runtime.leaderelection import _micro_time
from controller_runtime.sharding import CLAIMS_ANNOTATION, RING_LABEL, ShardRing, ShardRingConfig
from kubeclient.errors import ConflictError
from kubeclient.transport import Response, Transport

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases"


class HoldingTransport:
    """The admin transport, except that while :attr:`holding` is set the next Lease write is
    held back: its caller gives up on it (a timeout), and it reaches the server only when
    :attr:`release` is set -- a write that lands long after it was given up on."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.holding = False
        self.release = asyncio.Event()
        self.held: asyncio.Task[Response] | None = None
        self.sent: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Response:
        self.sent.append((method, path))
        if self.holding and method in ("PATCH", "PUT", "POST") and "/leases" in path:
            self.holding = False

            async def late() -> Response:
                await self.release.wait()
                return await self.inner.request(method, path, **kwargs)

            self.held = asyncio.create_task(late())
            return await asyncio.shield(self.held)  # the caller's timeout leaves it running
        return await self.inner.request(method, path, **kwargs)

    async def get_json(self, path: str, params: Any = None, **kwargs: Any) -> Any:
        return await self.inner.get_json(path, params, **kwargs)


async def claims_on_server(transport: Transport, namespace: str, name: str) -> frozenset[int]:
    lease = await transport.get_json(f"{LEASES.format(namespace)}/{name}")
    text = lease["metadata"]["annotations"][CLAIMS_ANNOTATION]
    return frozenset(int(s) for s in text.split(",") if s)


def config(namespace: str, identity: str, ring: str) -> ShardRingConfig:
    return ShardRingConfig(
        ring,
        namespace,
        identity=identity,
        slots=4,
        lease_duration=6,
        renew_deadline=4,
        retry_period=1,
    )


@pytest.fixture
async def holding(transport: Transport) -> AsyncIterator[HoldingTransport]:
    held = HoldingTransport(transport)
    yield held
    held.release.set()
    if held.held is not None:
        with contextlib.suppress(Exception):
            await held.held


async def test_a_given_up_write_of_the_own_lease_never_overwrites_a_later_one(
    transport: Transport, namespace: str, holding: HoldingTransport
) -> None:
    """The member publishes all 4 slots; then writes claims {0, 1} but gives up on that
    write (held back); then publishes all 4 again. When the old write reaches the server, it
    must be refused: else the Lease says {0, 1} while the member works on all 4, and another
    member takes 2 and 3 too."""
    ring = ShardRing(holding, config(namespace, "a", f"r-{uuid.uuid4().hex[:6]}"))  # type: ignore[arg-type]
    member = ring.protocol
    assert await ring._renew()  # joined, claiming nothing
    member.claims = {0, 1, 2, 3}
    assert await ring._renew()
    assert member.published == frozenset({0, 1, 2, 3})

    member.claims = {0, 1}
    holding.holding = True
    assert not await ring._renew()  # given up on after the attempt timeout (2 s)
    assert holding.held is not None and not holding.held.done()

    member.claims = {0, 1, 2, 3}
    assert await ring._renew()
    assert member.published == frozenset({0, 1, 2, 3})

    holding.release.set()  # the old write reaches the server now
    with pytest.raises(ConflictError):
        await holding.held
    assert await claims_on_server(transport, namespace, ring.lease.name) == {0, 1, 2, 3}
    assert member.published <= await claims_on_server(transport, namespace, ring.lease.name)


async def test_an_expired_lease_is_deleted_only_while_unchanged_and_a_fenced_member_withdraws(
    transport: Transport, namespace: str
) -> None:
    """b's Lease stops changing; a, which has seen it unchanged for the lease duration (on
    a clock the test moves), deletes it -- but not after b renewed it once more. A fenced
    member deletes its own Lease (conditioned), so that the others need not wait for it to
    expire."""
    name = f"r-{uuid.uuid4().hex[:6]}"
    now = [0.0]
    a = ShardRing(transport, config(namespace, "a", name), clock=lambda: now[0])
    b = ShardRing(transport, config(namespace, "b", name), clock=lambda: now[0])
    assert await a._renew() and await b._renew()
    assert await a._observe() is not None
    now[0] += 6.5  # b's Lease unchanged for longer than its duration, in a's view
    observation = await a._observe()
    assert observation is not None
    expired = a.protocol.expired()
    assert [lease.holder for lease in expired] == ["b"]
    assert await b._renew()  # b renews before a's delete arrives
    await a._sweep(expired)
    listed = await transport.get_json(
        LEASES.format(namespace), {"labelSelector": f"{RING_LABEL}={name}"}
    )
    assert {item["spec"]["holderIdentity"] for item in listed["items"]} == {"a", "b"}

    await a._observe()
    now[0] += 6.5
    await a._observe()
    await a._sweep(a.protocol.expired())
    listed = await transport.get_json(
        LEASES.format(namespace), {"labelSelector": f"{RING_LABEL}={name}"}
    )
    assert {item["spec"]["holderIdentity"] for item in listed["items"]} == {"a"}

    # a is fenced: it deletes its own Lease, conditioned on what it knows of it.
    assert await a._renew()
    a.protocol.claims = {1}
    assert await a._renew()
    await a._fence()
    await a._back_off(0.0)
    listed = await transport.get_json(
        LEASES.format(namespace), {"labelSelector": f"{RING_LABEL}={name}"}
    )
    assert listed["items"] == []
    assert a.protocol.lease_version is None and not a.protocol.published


async def test_a_newcomer_does_not_count_a_member_whose_lease_expired_before_it_came(
    transport: Transport, namespace: str
) -> None:
    """A Lease of a member that died a minute ago (nobody deleted it yet): a newcomer that
    never saw it renew leaves it out of the division at once, but still respects its claims
    until it has seen it unchanged for the lease duration itself."""
    name = f"r-{uuid.uuid4().hex[:6]}"
    dead = ShardRing(transport, config(namespace, "dead", name))
    body = dead._body(frozenset({3}))
    body["spec"]["renewTime"] = body["spec"]["acquireTime"] = _micro_time(
        datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=60)
    )
    await transport.request("POST", LEASES.format(namespace), body=body)
    live = ShardRing(transport, config(namespace, "live", name))
    assert await live._renew()
    newcomer = ShardRing(transport, config(namespace, "new", name))
    assert await newcomer._observe() is not None
    assert newcomer.members == ["live", "new"]
    assert newcomer.protocol.claimed_by_other(3)
