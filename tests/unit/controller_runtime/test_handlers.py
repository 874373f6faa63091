"""Event handlers: which requests each delta produces, at which priority, after predicates."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import pytest

from controller_runtime.handlers import (
    EnqueueRequestForObject,
    EnqueueRequestForOwner,
    EnqueueRequestsFromMapFunc,
    EventHandler,
    request_for,
)
from controller_runtime.predicates import GenerationChanged, LabelSelectorPredicate
from controller_runtime.reconcile import Request
from controller_runtime.workqueue import LOW_PRIORITY, WorkQueue
from informers.store import ADDED, DELETED, MODIFIED, StoreDelta

_names = itertools.count()


class RecordingQueue:
    def __init__(self) -> None:
        self.added: list[tuple[Request, int]] = []

    def add(self, item: Request, *, priority: int = 0) -> None:
        self.added.append((item, priority))


def obj(
    name: str = "a",
    namespace: str | None = "ns",
    *,
    owners: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    generation: int = 1,
    rv: str = "1",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": generation, "resourceVersion": rv}
    if namespace is not None:
        meta["namespace"] = namespace
    if owners is not None:
        meta["ownerReferences"] = owners
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta}


def owner_ref(
    name: str, *, kind: str = "Task", api_version: str = "tasks.crpy.io/v1", controller: bool = True
) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": f"uid-{name}",
        "controller": controller,
    }


def update(old: dict[str, Any], new: dict[str, Any]) -> StoreDelta:
    return StoreDelta(MODIFIED, new, orjson.dumps(old))


def test_request_for() -> None:
    assert request_for(obj("a", "ns")) == Request("ns", "a")
    assert request_for(obj("node-1", None)) == Request("", "node-1")


def test_for_object_priorities_initial_list_low_fresh_changes_zero() -> None:
    q = RecordingQueue()
    handle = EnqueueRequestForObject().bind(q)
    handle(StoreDelta(ADDED, obj("a")), True)
    handle(StoreDelta(ADDED, obj("b")), False)
    handle(update(obj("c"), obj("c", rv="2")), False)
    handle(StoreDelta(DELETED, obj("d")), False)
    handle(StoreDelta(ADDED, obj("n", None)), False)
    assert q.added == [
        (Request("ns", "a"), LOW_PRIORITY),
        (Request("ns", "b"), 0),
        (Request("ns", "c"), 0),
        (Request("ns", "d"), 0),
        (Request("", "n"), 0),
    ]


def test_for_object_applies_predicates() -> None:
    q = RecordingQueue()
    handle = EnqueueRequestForObject().bind(
        q, [GenerationChanged(), LabelSelectorPredicate("app=web")]
    )
    web = {"app": "web"}
    handle(update(obj(labels=web), obj(labels=web, rv="2")), False)  # generation unchanged
    handle(StoreDelta(ADDED, obj("other", labels={"app": "db"})), False)  # selector
    handle(update(obj(labels=web), obj(labels=web, rv="2", generation=2)), False)
    assert q.added == [(Request("ns", "a"), 0)]


def test_generic_bind_matches_specialised_bind() -> None:
    """The base class's bind (used by every other handler) behaves like the fast path."""
    fast, generic = RecordingQueue(), RecordingQueue()
    handler = EnqueueRequestForObject()
    deltas = [
        (StoreDelta(ADDED, obj("a")), True),
        (update(obj("b"), obj("b", rv="2", generation=2)), False),
        (update(obj("c"), obj("c", rv="2")), False),
    ]
    for handle in (
        handler.bind(fast, [GenerationChanged()]),
        EventHandler.bind(handler, generic, [GenerationChanged()]),
    ):
        for delta, initial in deltas:
            handle(delta, initial)
    expected = [(Request("ns", "a"), LOW_PRIORITY), (Request("ns", "b"), 0)]
    assert fast.added == generic.added == expected


def test_owner_enqueues_the_controller_owner_only_by_default() -> None:
    h = EnqueueRequestForOwner("tasks.crpy.io/v1", "Task")
    child = obj(
        "cm",
        owners=[
            owner_ref("not-controller", controller=False),
            owner_ref("other-kind", kind="Job", api_version="batch/v1"),
            owner_ref("the-task"),
        ],
    )
    assert list(h.requests(StoreDelta(ADDED, child))) == [Request("ns", "the-task")]
    every = EnqueueRequestForOwner("tasks.crpy.io/v1", "Task", only_controller=False)
    assert list(every.requests(StoreDelta(ADDED, child))) == [
        Request("ns", "not-controller"),
        Request("ns", "the-task"),
    ]


def test_owner_matches_on_group_and_kind_not_version() -> None:
    h = EnqueueRequestForOwner("tasks.crpy.io/v1", "Task")
    other_version = obj("cm", owners=[owner_ref("t", api_version="tasks.crpy.io/v2")])
    other_group = obj("cm2", owners=[owner_ref("t", api_version="other.io/v1")])
    assert list(h.requests(StoreDelta(ADDED, other_version))) == [Request("ns", "t")]
    assert list(h.requests(StoreDelta(ADDED, other_group))) == []
    # the core group: "v1" has no group part
    core = EnqueueRequestForOwner("v1", "ConfigMap")
    child = obj("x", owners=[owner_ref("cm", kind="ConfigMap", api_version="v1")])
    assert list(core.requests(StoreDelta(ADDED, child))) == [Request("ns", "cm")]
    apps = obj("y", owners=[owner_ref("cm", kind="ConfigMap", api_version="apps/v1")])
    assert list(core.requests(StoreDelta(ADDED, apps))) == []


def test_owner_of_a_cluster_scoped_kind_gets_no_namespace() -> None:
    h = EnqueueRequestForOwner("v1", "Node", owner_namespaced=False)
    child = obj("pod", owners=[owner_ref("node-1", kind="Node", api_version="v1")])
    assert list(h.requests(StoreDelta(ADDED, child))) == [Request("", "node-1")]


def test_owner_update_enqueues_old_and_new_owners_once() -> None:
    q = RecordingQueue()
    handle = EnqueueRequestForOwner("tasks.crpy.io/v1", "Task").bind(q)
    handle(update(obj(owners=[owner_ref("old")]), obj(owners=[owner_ref("new")], rv="2")), False)
    assert q.added == [(Request("ns", "new"), 0), (Request("ns", "old"), 0)]
    q.added.clear()
    handle(update(obj(owners=[owner_ref("same")]), obj(owners=[owner_ref("same")], rv="3")), False)
    assert q.added == [(Request("ns", "same"), 0)]
    q.added.clear()
    handle(StoreDelta(DELETED, obj(owners=[owner_ref("gone")])), False)
    handle(StoreDelta(ADDED, obj("orphan")), True)
    assert q.added == [(Request("ns", "gone"), 0)]


def test_map_func_maps_old_and_new_and_deduplicates() -> None:
    calls: list[Mapping[str, Any]] = []

    def by_label(o: Mapping[str, Any]) -> Iterable[Request]:
        calls.append(o)
        target = (o["metadata"].get("labels") or {}).get("task")
        return [Request("ns", target), Request("ns", target)] if target else []

    q = RecordingQueue()
    handle = EnqueueRequestsFromMapFunc(by_label).bind(q)
    handle(StoreDelta(ADDED, obj(labels={"task": "t1"})), True)
    assert q.added == [(Request("ns", "t1"), LOW_PRIORITY)]
    q.added.clear()
    handle(update(obj(labels={"task": "t1"}), obj(labels={"task": "t2"}, rv="2")), False)
    assert q.added == [(Request("ns", "t2"), 0), (Request("ns", "t1"), 0)]
    q.added.clear()
    handle(StoreDelta(DELETED, obj(labels={"task": "t3"})), False)
    assert q.added == [(Request("ns", "t3"), 0)]
    assert len(calls) == 4
    with pytest.raises(TypeError):
        EnqueueRequestsFromMapFunc("nope")  # type: ignore[arg-type]


def test_handlers_feed_a_real_work_queue_with_dedup_and_priority_raise() -> None:
    q: WorkQueue[Request] = WorkQueue(f"handlers-{next(_names)}", metrics=False)
    handle = EnqueueRequestForObject().bind(q)
    handle(StoreDelta(ADDED, obj("a")), True)
    handle(StoreDelta(ADDED, obj("b")), True)
    handle(update(obj("b"), obj("b", rv="2")), False)  # a fresh change raises b's priority
    assert len(q) == 2
    assert q.get_nowait() == Request("ns", "b")
    assert q.get_nowait() == Request("ns", "a")
