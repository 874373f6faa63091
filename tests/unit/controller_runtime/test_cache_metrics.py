"""The cache's metrics are per API group and kind (the same Kind in two groups is two
series), and a stopped controller's series can be removed."""

from __future__ import annotations

import asyncio

from controller_runtime import metrics
from controller_runtime.cache import Cache, KindInformers
from controller_runtime.controller import Controller
from controller_runtime.reconcile import Request
from informers.shared import InformerFactory
from kubeclient.discovery import ResourceInfo


class _NoServer:
    """Stands in for a transport: nothing here talks to a server."""


def _bytes(group: str, kind: str) -> float | None:
    return metrics.REGISTRY.get_sample_value("cache_bytes", {"group": group, "kind": kind})


def test_the_same_kind_in_two_groups_has_two_cache_bytes_series() -> None:
    cache = Cache(InformerFactory(_NoServer()))  # type: ignore[arg-type]
    core = ResourceInfo(group="", version="v1", kind="Widget", plural="widgets", namespaced=True)
    other = ResourceInfo(group="shop.example.com", version="v1", kind="Widget",
                         plural="widgets", namespaced=True)  # fmt: skip
    cache.attach("v1", "Widget", KindInformers(core))
    cache.attach("shop.example.com/v1", "Widget", KindInformers(other))
    assert _bytes("", "Widget") == 0.0
    assert _bytes("shop.example.com", "Widget") == 0.0


async def test_removing_a_controllers_series_leaves_none_behind() -> None:
    done = asyncio.Event()

    async def reconcile(request: Request) -> None:
        done.set()

    controller = Controller("series-removed", reconcile)
    await controller.start()
    controller.enqueue(Request("ns", "a"))
    await done.wait()
    await controller.stop()

    def exported() -> set[str]:
        return {
            s.name
            for family in metrics.REGISTRY.collect()
            for s in family.samples
            if "series-removed" in (s.labels.get("controller"), s.labels.get("name"))
        }

    assert "controller_runtime_reconcile_total" in exported()
    assert "workqueue_adds_total" in exported()
    metrics.remove_controller_series(controller.name, controller.queue)
    assert exported() == set()
