"""A controller whose work is split over the slots a :class:`~controller_runtime.sharding.ShardRing`
gives this replica.

Per owned slot it runs one informer (asking the API server for that slot's hash range only)
and one :class:`~controller_runtime.controller.Controller` (work queue and workers) named
``<name>-slot<N>``, so a slot is started and stopped as a whole:

* :meth:`ShardedController.start_slot` starts the slot's informer and returns once the slot's
  cache is synced and its workers run;
* :meth:`ShardedController.stop_slot` stops taking work for the slot, lets in-flight
  reconciles finish for up to the drain timeout (then cancels them), and stops the informer.

Reads of the sharded kind through the manager's cache and client see the objects of the slots
this replica owns (and nothing else: a read of an object of another slot is a "not found").
The cache's namespace scope (``namespaces``, or ``by_object`` for the kind) applies: one
informer per slot and namespace. So does its memory budget (``ByObject(memory_limit=)`` for
the kind, else the cache's overall one): one budget spans every slot of the kind, and the
client fetches an evicted body as for an unsharded kind.
``max_concurrent_reconciles`` applies per slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from controller_runtime.builder import GuardFactory
from controller_runtime.cache import Cache, KindInformers
from controller_runtime.controller import Controller, ControllerOptions
from controller_runtime.handlers import EnqueueRequestForObject
from controller_runtime.predicates import PredicateLike
from controller_runtime.reconcile import ReconcileFunc, Reconciler
from controller_runtime.sharding import ShardRing, slot_selector
from informers import metrics as informer_metrics
from informers.shared import SharedInformer
from informers.store import Store

__all__ = ["ShardedController"]


class ShardedKindInformers(KindInformers):
    """A kind cached by the slots this replica owns: one informer per slot, any namespace."""

    @property
    def has_synced(self) -> bool:
        return all(i.has_synced for i in self.informers.values())

    def covers(self, namespace: str | None) -> bool:
        return True

    def informer_for(self, namespace: str | None) -> SharedInformer | None:
        return None  # no single informer holds a namespace: objects are spread over slots

    def stores_for(self, namespace: str | None) -> list[Store]:
        return [i.store for i in self.informers.values()]

    def informers_for(self, namespace: str | None) -> list[SharedInformer]:
        return list(self.informers.values())


class ShardedController:
    """Reconciles ``kind`` for the slots ``ring`` gives this replica (a ring listener).

    Built by :meth:`ControllerBuilder.complete_sharded
    <controller_runtime.builder.ControllerBuilder.complete_sharded>`; started and stopped by
    the ring (not by the manager directly).
    """

    def __init__(
        self,
        name: str,
        reconciler: ReconcileFunc | Reconciler,
        *,
        ring: ShardRing,
        cache: Cache,
        entry: ShardedKindInformers,
        api_version: str,
        kind: str,
        predicates: Sequence[PredicateLike] = (),
        options: ControllerOptions | None = None,
        guard_factory: GuardFactory | None = None,
    ) -> None:
        self.name = name
        self.reconciler = reconciler
        self.ring = ring
        self.cache = cache
        self.entry = entry
        self.api_version = api_version
        self.kind = kind
        self.predicates = list(predicates)
        self.options = dataclasses.replace(
            options or ControllerOptions(), skip_name_validation=True
        )
        self.guard_factory = guard_factory
        self.controllers: dict[int, Controller] = {}

    @property
    def has_synced(self) -> bool:
        """True when the caches of every slot this replica works on are synced."""
        return self.entry.has_synced

    @property
    def slots(self) -> list[int]:
        return sorted(self.controllers)

    def _namespaces(self) -> list[str | None]:
        """The cache's scope for this kind: its namespaces (``by_object`` first, then the
        cache's), or ``[None]`` for all namespaces and cluster-scoped kinds."""
        if not self.entry.resource.namespaced:
            return [None]
        options = self.cache.by_object.get((self.api_version, self.kind))
        scope = (options.namespaces if options is not None else None) or self.cache.namespaces
        return list(scope) if scope else [None]

    async def start_slot(self, slot: int) -> None:
        config = self.ring.config
        selector = slot_selector(slot, config.slots, config.shard_field)
        name = f"{self.name}-slot{slot}"
        guard = self.guard_factory(name) if self.guard_factory is not None else None
        controller = Controller(
            name,
            self.reconciler,
            options=self.options,
            guard=guard,
            fence=self.ring.slot_fence(slot),
        )
        self.controllers[slot] = controller
        budget = self.cache.budget_for(self.api_version, self.kind)
        for namespace in self._namespaces():
            informer = await self.cache.factory.informer(
                self.api_version,
                self.kind,
                namespace=namespace,
                shard_selector=selector,
                budget=budget,
            )
            self.entry.informers[_informer_key(slot, namespace)] = informer
            controller.watch(informer, EnqueueRequestForObject(), self.predicates)
        self._count_all_slots()
        await controller.start()

    async def stop_slot(self, slot: int, drain_timeout: float | None) -> None:
        controller = self.controllers.pop(slot, None)
        if controller is not None:
            await controller.stop(drain_timeout)
        prefix = _informer_key(slot, None).split("/")[0] + "/"
        for key in [k for k in self.entry.informers if k and k.startswith(prefix)]:
            informer = self.entry.informers.pop(key)
            await self.cache.factory.discard(informer)
        self._count_all_slots()

    def _count_all_slots(self) -> None:
        # Each reflector points informer_store_objects at its own store; for a sharded kind
        # the series should count every slot's (and must not keep a stopped slot's alive).
        entry = self.entry
        informer_metrics.STORE_OBJECTS.labels(entry.resource.group_resource).set_function(
            lambda: sum(len(i.store) for i in list(entry.informers.values()))
        )


def _informer_key(slot: int, namespace: str | None) -> str:
    return f"slot-{slot}/{namespace or ''}"
