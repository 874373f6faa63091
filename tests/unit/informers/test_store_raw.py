"""The store fed as the reflector feeds it from a watch: lines decoded partially
(:func:`informers._partial.decode_watch_line`) into :meth:`Store.apply_raw` and
:meth:`Store.prepare_raw`, managedFields in every position of the metadata.

The same stateful test as ``test_store.py`` (the reference model, the deltas, the indexes, no
regression, the observed resourceVersion) runs with each store layout the raw path has: the
built-in indexes computed from the decoded metadata, and a custom index function, which decodes
the stored bytes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import settings

from informers._partial import decode_watch_line
from informers.reflector import strip_managed_fields as strip
from informers.store import Store, StoreDelta
from tests.unit.informers.test_store import StoreMachine, obj, phase_index, until

MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {".": {}}}}]


def watch_line(event_type: str, o: dict[str, Any]) -> bytes:
    """``o`` as an API server would send it, managedFields at a position that varies with its
    resourceVersion (first, anywhere between, last)."""
    items = list(o["metadata"].items())
    at = int(o["metadata"]["resourceVersion"]) % (len(items) + 1)
    items.insert(at, ("managedFields", MANAGED))
    return orjson.dumps({"type": event_type, "object": {**o, "metadata": dict(items)}})


class RawStoreMachine(StoreMachine):
    def store_apply(self, event_type: str, o: dict[str, Any]) -> StoreDelta | None:
        decoded = decode_watch_line(watch_line(event_type, o))
        assert decoded is not None  # what an API server sends is taken
        return self.store.apply_raw(*decoded)

    def store_replace(self, items: list[dict[str, Any]], list_rv: str) -> list[StoreDelta]:
        prepared = []
        for o in items:
            decoded = decode_watch_line(watch_line("ADDED", o))
            assert decoded is not None
            prepared.append(self.store.prepare_raw(decoded[1], decoded[2]))
        return self.store.replace_prepared(prepared, list_rv)


class RawStoreBuiltinIndexesMachine(RawStoreMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = Store(label_index=True)


class RawStoreDefaultMachine(RawStoreMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = Store()  # the owner index alone: the informer's default


_SETTINGS = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestRawStoreCustomIndex = RawStoreMachine.TestCase
TestRawStoreCustomIndex.settings = _SETTINGS
TestRawStoreBuiltinIndexes = RawStoreBuiltinIndexesMachine.TestCase
TestRawStoreBuiltinIndexes.settings = _SETTINGS
TestRawStoreDefault = RawStoreDefaultMachine.TestCase
TestRawStoreDefault.settings = _SETTINGS


def test_a_custom_index_reads_the_object_without_managed_fields() -> None:
    seen: list[dict[str, Any]] = []

    def index(o: Any) -> list[str]:
        seen.append(o)
        return phase_index(o)

    store = Store(indexers={"phase": index})
    decoded = decode_watch_line(watch_line("ADDED", obj("a", "7", phase="Done")))
    assert decoded is not None
    store.apply_raw(*decoded)
    assert store.index_keys("phase", "Done") == ["default/a"]
    assert seen == [obj("a", "7", phase="Done")]


def test_a_live_delta_carries_bytes_and_decodes_the_event_object_once() -> None:
    store = Store()
    decoded = decode_watch_line(watch_line("ADDED", obj("a", "7", phase="Done")))
    assert decoded is not None
    delta = store.apply_raw(*decoded)
    assert delta is not None
    assert delta.obj == obj("a", "7", phase="Done")
    assert delta.obj is delta.obj
    gone = decode_watch_line(watch_line("DELETED", obj("a", "8", phase="Gone")))
    assert gone is not None
    deleted = store.apply_raw(*gone)
    assert deleted is not None and deleted.type == "DELETED"
    assert deleted.obj == obj("a", "8", phase="Gone")  # the event's object, not the cached one
    assert deleted.old == obj("a", "7", phase="Done")


def test_an_update_of_bytes_written_with_spaces_is_no_uid_change() -> None:
    """The cached bytes need not be compact: the UID check decodes them when the compact form
    is not found (it used to report a UID change, and hand handlers a DELETED and an ADDED)."""
    store = Store()
    spaced = b'{"metadata": {"name": "a", "resourceVersion": "7", "uid": "u-1"}}'
    store.apply_raw("ADDED", _meta(spaced), spaced)
    line = (
        b'{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"8","uid":"u-1"}}}'
    )
    decoded = decode_watch_line(line)
    assert decoded is not None
    delta = store.apply_raw(*decoded)
    assert delta is not None
    assert (delta.type, delta.has_old) == ("MODIFIED", True)


def _meta(raw: bytes) -> Any:
    decoded = decode_watch_line(b'{"type":"ADDED","object":' + raw.replace(b" ", b"") + b"}")
    assert decoded is not None
    return decoded[1]


def test_a_streaming_list_past_the_budget_is_buffered_as_metadata_as_by_prepare() -> None:
    """prepare_raw(buffered=True) keeps full bodies while the list's bytes fit the budget and
    metadata stubs after, exactly where prepare(buffered=True) of the decoded objects does."""
    from informers.budget import BodyBudget, EvictedBodyError  # noqa: PLC0415

    objs = [obj(f"t{i}", str(10 + i), phase="Running") for i in range(10)]
    lines = [watch_line("ADDED", o) for o in objs]
    by_raw, by_dict = Store(budget=BodyBudget(600)), Store(budget=BodyBudget(600))
    by_raw.start_list()
    by_dict.start_list()
    raw_items = []
    for line in lines:
        decoded = decode_watch_line(line)
        assert decoded is not None
        raw_items.append(by_raw.prepare_raw(decoded[1], decoded[2], buffered=True))
    dict_items = [
        by_dict.prepare(strip(orjson.loads(line)["object"]), buffered=True) for line in lines
    ]
    assert [p.stub for p in raw_items] == [p.stub for p in dict_items]
    assert any(p.stub for p in raw_items) and not all(p.stub for p in raw_items)
    # The same compact stubs (no apiVersion/kind/name/namespace: see STUBS) as prepare's.
    assert [p.raw for p in raw_items if p.stub] == [p.raw for p in dict_items if p.stub]
    assert all(p.raw[0] == 0 for p in raw_items if p.stub)
    assert [orjson.loads(p.raw) for p in raw_items if not p.stub] == [
        obj for obj in objs[: sum(not p.stub for p in raw_items)]
    ]
    by_raw.replace_prepared(raw_items, "100")
    by_raw.enforce_budget()
    stubbed = [p.key for p in raw_items if p.stub]
    assert all(by_raw.evicted(key) for key in stubbed)
    try:
        by_raw.get(stubbed[0])
    except EvictedBodyError as err:
        assert err.resource_version == raw_items[len(raw_items) - len(stubbed)].rv
    else:
        raise AssertionError("an evicted body was read")
    # Handed out, a stub is put back whole: what the object was, without spec.
    by_key = {f"default/{o['metadata']['name']}": o for o in objs}
    for key in stubbed:
        held = by_raw.held_raw(key)
        assert held is not None
        assert orjson.loads(held) == {k: v for k, v in by_key[key].items() if k != "spec"}
    _, evicted = by_raw.list_held()
    assert sorted(evicted) == sorted(
        (key, by_key[key]["metadata"]["resourceVersion"]) for key in stubbed
    )
    assert by_raw.uid_of(stubbed[0]) == by_key[stubbed[0]]["metadata"]["uid"]


async def test_a_new_object_on_the_watch_path_releases_the_waiters_it_satisfies() -> None:
    store = Store()
    store.observe_bookmark("5")
    reached = asyncio.create_task(store.wait_for_resource_version("10"))
    beyond = asyncio.create_task(store.wait_for_resource_version("11"))
    await until(lambda: store.pending_waiters == 2)
    decoded = decode_watch_line(watch_line("ADDED", obj("a", "10")))
    assert decoded is not None
    store.apply_raw(*decoded)
    assert await asyncio.wait_for(reached, 5) is True
    assert not beyond.done()
    assert store.pending_waiters == 1
    store.observe_bookmark("11")
    assert await asyncio.wait_for(beyond, 5) is True
