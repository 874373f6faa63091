"""The reflector's batched watch path: many events in one chunk.

A real API server writes several events per TCP read under load; the reflector applies the
plain ones of a chunk itself and hands their deltas to the sink in one call. These tests put
whole scripted chunks on a watch and check that the guarantees of the one-event-at-a-time path
still hold inside a chunk: order of changes and sink calls, the resume point never ahead of
the sink, malformed lines relisting, UID changes split, rejected objects skipped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import orjson
import pytest

from informers import metrics
from informers.reflector import Reflector, Transform, strip_managed_fields
from informers.reflector_machine import (
    ReflectorMachine,
    ReflectorOptions,
    ReflectorProtocolError,
    State,
    Transition,
)
from informers.store import Store, StoreDelta
from kubeclient.discovery import ResourceInfo
from kubeclient.transport import Response, Transport

RESOURCE = ResourceInfo("batch.test", "v1", "Thing", "things", True)
OPTIONS = ReflectorOptions(streaming_list=False, backoff_initial=30.0, backoff_cap=30.0)


def thing(name: str, rv: int, uid: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch.test/v1",
        "kind": "Thing",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
            "managedFields": [{"manager": "test"}],
        },
        "spec": {"rv": rv},
    }


def line(event_type: str, obj: Any) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj})


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def readany(self) -> bytes:
        if self._chunks:
            return self._chunks.pop(0)
        await asyncio.Event().wait()  # an idle, open watch
        return b""


class _Answer:
    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)


class ScriptedWatch:
    """An empty LIST at resourceVersion 10, then one watch that delivers ``chunks``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.lists = 0

    async def request(self, method: str, path: str, **_: Any) -> Response:
        self.lists += 1
        return Response(200, {}, orjson.dumps({"metadata": {"resourceVersion": "10"}, "items": []}))

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str], **_: Any
    ) -> AsyncIterator[_Answer]:
        chunks, self.chunks = self.chunks, []
        yield _Answer(chunks)


class Recorder:
    """A sink that records each call: the deltas and the machine's resume point at that time."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[str, str, str]], str]] = []
        self.reflector: Reflector | None = None
        self.changed = asyncio.Event()

    async def __call__(self, deltas: Sequence[StoreDelta], initial: bool) -> None:
        assert self.reflector is not None
        seen = [(str(d.type), d.key, d.obj["metadata"].get("resourceVersion", "")) for d in deltas]
        self.calls.append((seen, self.reflector.machine.resource_version))
        self.changed.set()

    @property
    def deltas(self) -> list[tuple[str, str, str]]:
        return [d for call, _ in self.calls for d in call]


async def run_until(
    chunks: list[bytes],
    done: Any,
    *,
    transform: Transform | None = strip_managed_fields,
    store: Store | None = None,
) -> tuple[Reflector, Recorder, ScriptedWatch]:
    server = ScriptedWatch(chunks)
    recorder = Recorder()
    reflector = Reflector(
        cast(Transport, server),
        RESOURCE,
        store if store is not None else Store(),
        options=OPTIONS,
        sink=recorder,
        transform=transform,
    )
    recorder.reflector = reflector
    task = asyncio.create_task(reflector.run())
    try:
        async with asyncio.timeout(10):
            while not done(reflector, recorder):
                recorder.changed.clear()
                waiter = asyncio.create_task(recorder.changed.wait())
                await asyncio.wait({waiter, task}, timeout=0.05)
                waiter.cancel()
                if task.done():
                    task.result()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return reflector, recorder, server


def _count(what: str) -> float:
    return metrics.MALFORMED_EVENTS.labels(RESOURCE.group_resource, what).value


async def test_a_chunk_of_events_is_one_sink_call_in_order_with_the_resume_point_on_its_last() -> (
    None
):
    chunk = b"\n".join(line("ADDED", thing(f"t{i}", 11 + i)) for i in range(5)) + b"\n"
    reflector, recorder, _ = await run_until([chunk], lambda r, rec: len(rec.deltas) == 5)
    [(deltas, resume_point)] = recorder.calls
    assert deltas == [("ADDED", f"ns/t{i}", str(11 + i)) for i in range(5)]
    assert resume_point == "15"  # the last event handed over, not beyond
    assert reflector.store.get("ns/t0") is not None
    assert "managedFields" not in reflector.store.get("ns/t0")["metadata"]  # type: ignore[index]


async def test_a_line_that_is_not_an_event_flushes_the_batch_before_the_machine_sees_it() -> None:
    bookmark = line("BOOKMARK", {"metadata": {"resourceVersion": "30"}})
    chunk = b"\n".join(
        [
            line("ADDED", thing("a", 11)),
            line("ADDED", thing("b", 12)),
            bookmark,
            line("ADDED", thing("c", 31)),
        ]
    )
    _, recorder, _ = await run_until([chunk + b"\n"], lambda r, rec: len(rec.deltas) == 3)
    # The bookmark moved the resume point between the two sink calls, never before the first.
    assert recorder.calls == [
        ([("ADDED", "ns/a", "11"), ("ADDED", "ns/b", "12")], "12"),
        ([("ADDED", "ns/c", "31")], "31"),
    ]


async def test_a_malformed_line_mid_chunk_delivers_what_came_before_then_relists() -> None:
    before = _count("event")
    chunk = b"\n".join(
        [
            line("ADDED", thing("a", 11)),
            b'{"type": "ADDED", "object": ',
            line("ADDED", thing("c", 13)),
        ]
    )

    def relisting(r: Reflector, rec: Recorder) -> bool:
        return r.machine.last_transition is Transition.RELIST_LATER

    reflector, recorder, _ = await run_until([chunk + b"\n"], relisting)
    assert recorder.calls == [([("ADDED", "ns/a", "11")], "11")]
    assert "ns/c" not in reflector.store  # nothing after the bad line is read
    assert reflector.machine.resource_version == "11"
    assert _count("event") == before + 1


async def test_a_uid_change_inside_a_chunk_is_a_delete_then_an_add() -> None:
    chunk = b"\n".join(
        [line("ADDED", thing("a", 11, uid="first")), line("ADDED", thing("a", 12, uid="second"))]
    )
    _, recorder, _ = await run_until([chunk + b"\n"], lambda r, rec: len(rec.deltas) == 3)
    assert recorder.deltas == [
        ("ADDED", "ns/a", "11"),
        ("DELETED", "ns/a", "11"),
        ("ADDED", "ns/a", "12"),
    ]


async def test_modified_deleted_and_stale_events_in_one_chunk() -> None:
    chunk = b"\n".join(
        [
            line("ADDED", thing("a", 11)),
            line("MODIFIED", thing("a", 12)),
            line("MODIFIED", thing("a", 12)),  # repeated: no change
            line("ADDED", thing("b", 13)),
            line("DELETED", thing("a", 14)),
        ]
    )
    reflector, recorder, _ = await run_until([chunk + b"\n"], lambda r, rec: len(rec.deltas) == 4)
    assert recorder.deltas == [
        ("ADDED", "ns/a", "11"),
        ("MODIFIED", "ns/a", "12"),
        ("ADDED", "ns/b", "13"),
        ("DELETED", "ns/a", "14"),
    ]
    assert reflector.store.keys() == ["ns/b"]
    assert reflector.machine.resource_version == "14"


async def test_objects_the_transform_or_store_reject_are_skipped_and_counted_without_relist() -> (
    None
):
    def picky(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("no thanks")
        return obj

    nameless = thing("x", 13)
    del nameless["metadata"]["name"]
    before = _count("object")
    chunk = b"\n".join(
        [
            line("ADDED", thing("a", 11)),
            line("ADDED", thing("bad", 12)),
            line("ADDED", nameless),
            line("ADDED", thing("b", 14)),
        ]
    )
    _, recorder, server = await run_until(
        [chunk + b"\n"],
        lambda r, rec: len(rec.deltas) == 2 and r.machine.state is State.WATCHING,
        transform=picky,
    )
    assert recorder.calls == [([("ADDED", "ns/a", "11"), ("ADDED", "ns/b", "14")], "14")]
    assert _count("object") == before + 2
    assert server.lists == 1


async def test_an_event_without_resource_version_is_applied_and_keeps_the_resume_point() -> None:
    unversioned = thing("b", 0)
    del unversioned["metadata"]["resourceVersion"]
    chunk = b"\n".join([line("ADDED", thing("a", 11)), line("ADDED", unversioned)])
    reflector, recorder, _ = await run_until([chunk + b"\n"], lambda r, rec: len(rec.deltas) == 2)
    assert [k for _, k, _ in recorder.deltas] == ["ns/a", "ns/b"]
    assert reflector.machine.resource_version == "11"


async def test_a_transform_that_drops_the_resource_version_keeps_the_resume_point() -> None:
    def unversion(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "b":
            del obj["metadata"]["resourceVersion"]
        return obj

    chunk = b"\n".join([line("ADDED", thing("a", 11)), line("ADDED", thing("b", 12))])
    reflector, _, _ = await run_until(
        [chunk + b"\n"], lambda r, rec: len(r.store) == 2, transform=unversion
    )
    assert reflector.machine.resource_version == "11"


async def test_stale_updates_are_not_encoded_or_indexed() -> None:
    calls: list[str] = []

    def by_rv(obj: Mapping[str, Any]) -> list[str]:
        calls.append(obj["metadata"]["resourceVersion"])
        return [obj["metadata"]["resourceVersion"]]

    store = Store(indexers={"rv": by_rv})
    chunk = b"\n".join(
        [
            line("ADDED", thing("a", 12)),
            line("MODIFIED", thing("a", 11)),
            line("ADDED", thing("b", 13)),
        ]
    )
    await run_until([chunk + b"\n"], lambda r, rec: len(rec.deltas) == 2, store=store)
    assert calls == ["12", "13"]
    assert store.index_keys("rv", "12") == ["ns/a"]


def test_machine_refuses_applied_events_without_an_established_watch() -> None:
    machine = ReflectorMachine(OPTIONS)
    assert not machine.takes_applied_events
    with pytest.raises(ReflectorProtocolError):
        machine.watch_events_applied(1, "5")
    machine.start(0.0)
    machine.list_page(0.0, [], "10", "")
    assert not machine.takes_applied_events  # the watch request is out, its 200 is not in
    machine.watch_started(0.0)
    assert machine.takes_applied_events
    machine.watch_events_applied(2, "")
    assert machine.resource_version == "10"
    machine.watch_events_applied(1, "12")
    assert machine.resource_version == "12"
    machine.stop(0.0)
    assert not machine.takes_applied_events
