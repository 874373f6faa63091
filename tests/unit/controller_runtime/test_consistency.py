"""The read-your-writes guard and the own-writes overlay, on real stores fed with events (no
network: the informers are built but never started)."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import pytest

from controller_runtime.cache import KindInformers
from controller_runtime.consistency import OwnWritesOverlay, ReadYourWritesGuard
from controller_runtime.reconcile import Request
from informers.shared import SharedInformer
from informers.store import Store
from kubeclient.config import ClusterConfig
from kubeclient.discovery import ResourceInfo
from kubeclient.transport import Transport

CONFIGMAPS = ResourceInfo("", "v1", "ConfigMap", "configmaps", namespaced=True)
NAMESPACES = ResourceInfo("", "v1", "Namespace", "namespaces", namespaced=False)
PARENT = Request("ns", "parent")
OTHER = Request("ns", "other")
DELAY = 0.05


def cm(
    name: str, rv: str, *, ns: str = "ns", uid: str = "uid-1", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": rv, "uid": uid}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


class Source:
    """The part of the cache the guard reads: informers per kind."""

    def __init__(self, *entries: KindInformers) -> None:
        self.entries = list(entries)

    def kinds(self) -> list[KindInformers]:
        return self.entries


_TRANSPORT = Transport(ClusterConfig("https://127.0.0.1:1", ssl.create_default_context()))


def informers(
    resource: ResourceInfo = CONFIGMAPS,
    *,
    namespaces: tuple[str | None, ...] = (None,),
    label_selector: str | None = None,
    field_selector: str | None = None,
    synced: bool = True,
) -> KindInformers:
    entry = KindInformers(resource)
    for namespace in namespaces:
        informer = SharedInformer(
            _TRANSPORT,
            resource,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
        )
        if synced:
            informer.store.mark_synced()
        entry.informers[namespace] = informer
    return entry


def store_of(entry: KindInformers, namespace: str | None = None) -> Store:
    return entry.informers[namespace].store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guard_for(*entries: KindInformers, **kwargs: Any) -> ReadYourWritesGuard:
    return ReadYourWritesGuard("test", Source(*entries), requeue_delay=DELAY, **kwargs)


# ----------------------------------------------------------------------------------- writes


def test_a_write_holds_its_key_back_until_the_store_holds_that_version() -> None:
    entry = informers()
    store = store_of(entry)
    store.apply("ADDED", cm("child", "10"))
    guard = guard_for(entry)
    assert guard.check(PARENT) is None  # nothing recorded yet
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    assert guard.check(PARENT) == DELAY
    assert guard.check(PARENT) == DELAY  # checking does not clear an unobserved record
    assert guard.pending(PARENT) == 1
    store.apply("MODIFIED", cm("child", "11"))
    assert guard.check(PARENT) is None
    assert guard.pending() == 0


def test_records_are_per_request() -> None:
    entry = informers()
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    assert guard.check(OTHER) is None
    assert guard.check(PARENT) == DELAY


def test_a_create_is_observed_when_the_store_has_seen_past_it() -> None:
    entry = informers()
    store = store_of(entry)
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("generated-x7k2p", "20"))
    store.apply("ADDED", cm("unrelated", "19"))
    assert guard.check(PARENT) == DELAY
    # The object was created and deleted again before the reconcile ran: the store never
    # holds it, but it observed a later version, so the cache is not behind the write.
    store.apply("DELETED", cm("unrelated", "21"))
    assert "ns/generated-x7k2p" not in store
    assert guard.check(PARENT) is None


def test_a_bookmark_past_the_write_counts_as_observed() -> None:
    entry = informers()
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "30"))
    store_of(entry).observe_bookmark("29")
    assert guard.check(PARENT) == DELAY
    store_of(entry).observe_bookmark("31")
    assert guard.check(PARENT) is None


def test_the_newest_write_of_an_object_is_what_counts() -> None:
    entry = informers()
    store = store_of(entry)
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "13"))
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "12"))  # a late answer: ignored
    store.apply("ADDED", cm("child", "12"))
    assert guard.check(PARENT) == DELAY
    store.apply("MODIFIED", cm("child", "13"))
    assert guard.check(PARENT) is None


def test_a_store_that_observed_past_a_write_vouches_for_it() -> None:
    entry = informers()
    store = store_of(entry)
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("a", "11"))
    guard.record_write(PARENT, CONFIGMAPS, cm("b", "12"))
    store.apply("ADDED", cm("b", "12"))
    # The store holds "a" at an older version, but events arrive in resourceVersion order:
    # having observed 12, it cannot still be missing 11 of an object it watches.
    store.apply("ADDED", cm("a", "5"))
    assert store.last_observed_resource_version == "12"
    assert guard.check(PARENT) is None


def test_every_written_object_must_be_observed() -> None:
    entry = informers(namespaces=("x", "y"))
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("a", "11", ns="x"))
    guard.record_write(PARENT, CONFIGMAPS, cm("b", "12", ns="y"))
    store_of(entry, "y").apply("ADDED", cm("b", "12", ns="y"))
    assert guard.check(PARENT) == DELAY
    assert guard.pending(PARENT) == 1  # "b" is cleared, "a" is not
    store_of(entry, "x").apply("ADDED", cm("a", "11", ns="x"))
    assert guard.check(PARENT) is None


def test_an_unsynced_store_does_not_vouch_with_its_observed_version() -> None:
    entry = informers(synced=False)
    store = store_of(entry)
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    # During a streaming list, initial events come in no particular order.
    store.apply("ADDED", cm("other", "50"))
    assert guard.check(PARENT) == DELAY
    store.mark_synced()
    assert guard.check(PARENT) is None


def test_every_store_that_would_hold_the_object_must_observe_it() -> None:
    full, metadata_only = informers(), informers()
    guard = guard_for(full, metadata_only)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    store_of(full).apply("ADDED", cm("child", "11"))
    assert guard.check(PARENT) == DELAY
    store_of(metadata_only).apply("ADDED", cm("child", "11"))
    assert guard.check(PARENT) is None


def test_writes_nothing_caches_are_not_recorded() -> None:
    scoped = informers(namespaces=("ns",))
    guard = guard_for(scoped)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11", ns="elsewhere"))
    guard.record_write(PARENT, NAMESPACES, {"metadata": {"name": "ns", "resourceVersion": "3"}})
    assert guard.pending() == 0
    assert guard.check(PARENT) is None
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11", ns="ns"))
    assert guard.check(PARENT) == DELAY


def test_cluster_scoped_objects_are_keyed_by_name() -> None:
    entry = informers(NAMESPACES)
    guard = guard_for(entry)
    ns = {"metadata": {"name": "team-a", "resourceVersion": "7", "uid": "u"}}
    guard.record_write(PARENT, NAMESPACES, ns)
    assert guard.check(PARENT) == DELAY
    store_of(entry).apply("ADDED", ns)
    assert "team-a" in store_of(entry)
    assert guard.check(PARENT) is None


# ---------------------------------------------------------------------------------- deletes


def test_a_delete_is_observed_when_that_uid_is_gone() -> None:
    entry = informers()
    store = store_of(entry)
    store.apply("ADDED", cm("child", "10", uid="old"))
    guard = guard_for(entry)
    guard.record_delete(PARENT, CONFIGMAPS, cm("child", "", uid="old"))
    assert guard.check(PARENT) == DELAY
    store.apply("DELETED", cm("child", "11", uid="old"))
    assert guard.check(PARENT) is None


def test_a_recreated_object_with_a_new_uid_does_not_hold_the_key() -> None:
    entry = informers()
    store = store_of(entry)
    store.apply("ADDED", cm("child", "10", uid="old"))
    guard = guard_for(entry)
    guard.record_delete(PARENT, CONFIGMAPS, cm("child", "", uid="old"))
    store.apply("DELETED", cm("child", "11", uid="old"))
    store.apply("ADDED", cm("child", "12", uid="new"))
    assert guard.check(PARENT) is None


def test_a_delete_without_uid_waits_for_the_name_to_go() -> None:
    entry = informers()
    store = store_of(entry)
    store.apply("ADDED", cm("child", "10", uid="whatever"))
    guard = guard_for(entry)
    guard.record_delete(PARENT, CONFIGMAPS, {"metadata": {"name": "child", "namespace": "ns"}})
    assert guard.check(PARENT) == DELAY
    store.apply("DELETED", cm("child", "11", uid="whatever"))
    assert guard.check(PARENT) is None


def test_a_write_after_a_delete_replaces_the_record() -> None:
    entry = informers()
    store = store_of(entry)
    store.apply("ADDED", cm("child", "10", uid="old"))
    guard = guard_for(entry)
    guard.record_delete(PARENT, CONFIGMAPS, cm("child", "", uid="old"))
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "12", uid="new"))
    store.apply("DELETED", cm("child", "11", uid="old"))
    assert guard.check(PARENT) == DELAY  # the re-create is not in yet
    store.apply("ADDED", cm("child", "12", uid="new"))
    assert guard.check(PARENT) is None


# -------------------------------------------------------------------------------- selectors


def test_a_store_whose_label_selector_excludes_the_object_is_not_waited_on() -> None:
    selected = informers(label_selector="app=web")
    guard = guard_for(selected)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11", labels={"app": "db"}))
    assert guard.check(PARENT) is None
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "12", labels={"app": "web"}))
    assert guard.check(PARENT) == DELAY
    store_of(selected).apply("ADDED", cm("child", "12", labels={"app": "web"}))
    assert guard.check(PARENT) is None


def test_an_object_leaving_the_selector_is_waited_on_until_removed() -> None:
    selected = informers(label_selector="app=web")
    store = store_of(selected)
    store.apply("ADDED", cm("child", "10", labels={"app": "web"}))
    guard = guard_for(selected)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11", labels={"app": "db"}))
    # The store still holds the old, matching copy: a reconcile would read it.
    assert guard.check(PARENT) == DELAY
    store.apply("DELETED", cm("child", "11", labels={"app": "db"}))
    assert guard.check(PARENT) is None


def test_a_field_selector_that_certainly_excludes_the_object_is_skipped() -> None:
    by_name = informers(field_selector="metadata.name=someone-else")
    guard = guard_for(by_name)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    assert guard.check(PARENT) is None
    # A field the object does not carry: the server may default it, so the guard waits.
    unknown = informers(field_selector="spec.nodeName=n1")
    guard = guard_for(unknown)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    assert guard.check(PARENT) == DELAY


# ------------------------------------------------------------------------------ fail open


def test_resource_versions_that_do_not_compare_fail_open_and_say_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entry = informers()
    store = store_of(entry)
    store.apply("ADDED", cm("child", "10"))
    guard = guard_for(entry)
    with caplog.at_level(logging.WARNING, logger="controller_runtime.consistency"):
        guard.record_write(PARENT, CONFIGMAPS, cm("child", "opaque-token"))
        assert guard.check(PARENT) is None
        guard.record_write(PARENT, CONFIGMAPS, cm("other", "another-token"))
        assert guard.check(PARENT) is None
    warnings = [r for r in caplog.records if "not comparable" in r.getMessage()]
    assert len(warnings) == 1


def test_a_record_older_than_max_wait_fails_open_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    entry = informers()
    guard = guard_for(entry, max_wait=30.0, clock=clock)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    clock.now += 29.0
    assert guard.check(PARENT) == DELAY
    clock.now += 2.0
    with caplog.at_level(logging.WARNING, logger="controller_runtime.consistency"):
        assert guard.check(PARENT) is None
    assert any("gives up" in r.getMessage() for r in caplog.records)
    assert guard.pending() == 0


def test_records_of_keys_never_reconciled_again_are_pruned() -> None:
    clock = Clock()
    entry = informers()
    guard = guard_for(entry, max_wait=30.0, clock=clock)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    clock.now += 31.0
    guard.record_write(OTHER, CONFIGMAPS, cm("child", "12"))
    assert guard.pending(PARENT) == 0
    assert guard.pending(OTHER) == 1


def test_forget_and_disabled() -> None:
    entry = informers()
    guard = guard_for(entry)
    guard.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    guard.forget(PARENT)
    assert guard.check(PARENT) is None
    off = guard_for(entry, enabled=False)
    off.record_write(PARENT, CONFIGMAPS, cm("child", "11"))
    off.record_delete(PARENT, CONFIGMAPS, cm("child", "11"))
    assert off.pending() == 0
    assert off.check(PARENT) is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ReadYourWritesGuard("test", Source(), requeue_delay=0)


# ---------------------------------------------------------------------------------- overlay


def test_overlay_returns_the_newer_of_cache_and_own_write() -> None:
    store = Store()
    overlay = OwnWritesOverlay()
    store.apply("ADDED", cm("child", "10"))
    written = cm("child", "11")
    written["metadata"]["managedFields"] = [{"manager": "me"}]
    written["data"] = {"k": "v"}
    overlay.remember_write("v1", "ConfigMap", written)

    def read() -> dict[str, Any] | None:
        return overlay.resolve(
            "v1", "ConfigMap", "ns", "child", cached=store.get("ns/child"), stores=[store]
        )

    got = read()
    assert got is not None and got["data"] == {"k": "v"}
    assert "managedFields" not in got["metadata"]
    got["data"]["k"] = "mutated"  # each read is a fresh copy
    assert (read() or {})["data"] == {"k": "v"}
    store.apply("MODIFIED", cm("child", "12"))
    assert (read() or {})["metadata"]["resourceVersion"] == "12"
    assert len(overlay) == 0  # caught up: the entry is gone


def test_overlay_serves_an_unobserved_create_and_forgets_it_once_seen_past() -> None:
    store = Store()
    overlay = OwnWritesOverlay()
    overlay.remember_write("v1", "ConfigMap", cm("new", "20"))
    got = overlay.resolve("v1", "ConfigMap", "ns", "new", cached=None, stores=[store])
    assert got is not None and got["metadata"]["resourceVersion"] == "20"
    store.observe_bookmark("21")  # seen past it, and it is not there: deleted since
    assert overlay.resolve("v1", "ConfigMap", "ns", "new", cached=None, stores=[store]) is None
    assert len(overlay) == 0


def test_overlay_hides_an_object_it_deleted_until_the_cache_drops_it() -> None:
    store = Store()
    store.apply("ADDED", cm("child", "10", uid="old"))
    overlay = OwnWritesOverlay()
    overlay.remember_delete("v1", "ConfigMap", "ns", "child", "old")
    assert (
        overlay.resolve("v1", "ConfigMap", "ns", "child", cached=store.get("ns/child"), stores=[])
        is None
    )
    recreated = cm("child", "12", uid="new")
    assert (
        overlay.resolve("v1", "ConfigMap", "ns", "child", cached=recreated, stores=[]) == recreated
    )
    assert len(overlay) == 0


def test_overlay_fails_open_to_the_cache_and_is_bounded() -> None:
    overlay = OwnWritesOverlay(maxsize=2)
    overlay.remember_write("v1", "ConfigMap", cm("child", "opaque"))
    cached = cm("child", "10")
    assert overlay.resolve("v1", "ConfigMap", "ns", "child", cached=cached, stores=[]) == cached
    for i in range(5):
        overlay.remember_write("v1", "ConfigMap", cm(f"c{i}", "10"))
    assert len(overlay) == 2
