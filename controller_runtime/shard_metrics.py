"""Prometheus metrics of sharded controllers (in :data:`controller_runtime.metrics.REGISTRY`).

Every series carries ``ring`` (the ring's name):

* ``shard_ring_members`` — live members as this replica last saw them (itself included);
* ``shard_ring_owned_slots`` — slots this replica works on now;
* ``shard_ring_handovers_total{kind}`` — slots released (``release``) or acquired
  (``acquire``);
* ``shard_ring_handover_duration_seconds{kind}`` — how long one release (draining in-flight
  reconciles, recording it in the Lease) or one acquisition (starting informers and workers
  until their caches synced) took;
* ``shard_ring_fenced_total`` — times the renew deadline passed and every slot was dropped.
"""

from __future__ import annotations

from typing import NamedTuple

from controller_runtime.metrics import REGISTRY
from informers.fastmetrics import Counter, CounterChild, Gauge, GaugeChild, Histogram

RING_MEMBERS = Gauge(
    "shard_ring_members", "Live members of the ring, as last seen.", ("ring",), registry=REGISTRY
)
OWNED_SLOTS = Gauge(
    "shard_ring_owned_slots", "Slots this replica works on.", ("ring",), registry=REGISTRY
)
HANDOVERS = Counter(
    "shard_ring_handovers_total",
    "Slots released or acquired by this replica.",
    ("ring", "kind"),
    registry=REGISTRY,
)
HANDOVER_SECONDS = Histogram(
    "shard_ring_handover_duration_seconds",
    "Duration of one release (drain + record) or acquisition (start + cache sync).",
    ("ring", "kind"),
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0),
    registry=REGISTRY,
)
FENCED = Counter(
    "shard_ring_fenced_total",
    "Times the renew deadline passed and every slot was dropped at once.",
    ("ring",),
    registry=REGISTRY,
)


class RingMetrics(NamedTuple):
    members: GaugeChild
    owned: GaugeChild
    ring: str
    fenced: CounterChild

    def handover(self, kind: str, slots: int, seconds: float) -> None:
        HANDOVERS.labels(self.ring, kind).inc(slots)
        HANDOVER_SECONDS.labels(self.ring, kind).observe(seconds)


def ring_metrics(ring: str) -> RingMetrics:
    """The children of one ring's series."""
    return RingMetrics(
        RING_MEMBERS.labels(ring), OWNED_SLOTS.labels(ring), ring, FENCED.labels(ring)
    )
