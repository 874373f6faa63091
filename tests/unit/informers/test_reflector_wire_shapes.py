"""Any bytes from the wire: a watch line of any shape never stops an informer.

The reflector reads from a scripted list+watch server in this process (the only way to put
arbitrary JSON on a watch: a real API server never sends it). Each example syncs an informer,
injects one line into its open watch, then changes objects on the server and checks that
the informer is still running on the same reflector task (the line was an input of the
state machine, not a crash) and that its store converged to the server's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from informers import metrics
from informers.reflector_machine import INITIAL_EVENTS_END_ANNOTATION, ReflectorOptions
from informers.shared import SharedInformer
from informers.store import StoreDelta
from kubeclient.discovery import ResourceInfo
from kubeclient.transport import Response, Transport

RESOURCE = ResourceInfo("", "v1", "ConfigMap", "configmaps", True)
NAMESPACE = "ns"
FAST = dict(backoff_initial=0.01, backoff_cap=0.05)


class _Content:
    def __init__(self, queue: asyncio.Queue[bytes], server: ScriptedServer) -> None:
        self._queue = queue
        self._server = server

    async def readany(self) -> bytes:
        if self._queue.empty():
            self._server.take_failure("read")
        return await self._queue.get()


class _Response:
    def __init__(self, queue: asyncio.Queue[bytes], server: ScriptedServer) -> None:
        self.content = _Content(queue, server)


class ScriptedServer:
    """Just enough of an API server for one namespaced resource: LIST, watch from an RV,
    streaming lists, and :meth:`inject` to put any line on every open watch."""

    def __init__(self, names: list[str]) -> None:
        self.rv = 1000
        self.objects: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, bytes]] = []
        self.watches: set[asyncio.Queue[bytes]] = set()
        self.failed = asyncio.Event()
        self._failure: tuple[str, BaseException] | None = None
        for name in names:
            self.write(name)

    def write(self, name: str) -> None:
        self.rv += 1
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": f"uid-{name}",
                "resourceVersion": str(self.rv),
                "labels": {"app": "x"},
            },
            "data": {"rv": str(self.rv)},
        }
        kind = "MODIFIED" if name in self.objects else "ADDED"
        self.objects[name] = obj
        line = orjson.dumps({"type": kind, "object": obj}) + b"\n"
        self.history.append((self.rv, line))
        for queue in self.watches:
            queue.put_nowait(line)

    def fail_once(self, where: str, error: BaseException) -> None:
        """Raise ``error`` from the next LIST (``"list"``) or watch read (``"read"``)."""
        self._failure = (where, error)

    def take_failure(self, where: str) -> None:
        if self._failure is not None and self._failure[0] == where:
            error = self._failure[1]
            self._failure = None
            self.failed.set()
            raise error

    def inject(self, line: bytes) -> None:
        for queue in self.watches:
            queue.put_nowait(line + b"\n")

    async def request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None, **_: Any
    ) -> Response:
        assert method == "GET"
        self.take_failure("list")
        body = {
            "metadata": {"resourceVersion": str(self.rv)},
            "items": [copy.deepcopy(o) for o in self.objects.values()],
        }
        return Response(200, {}, orjson.dumps(body))

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str], *, headers: Any = None
    ) -> AsyncIterator[_Response]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        if params.get("sendInitialEvents") == "true":
            for obj in self.objects.values():
                queue.put_nowait(orjson.dumps({"type": "ADDED", "object": obj}) + b"\n")
            end = {
                "metadata": {
                    "resourceVersion": str(self.rv),
                    "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
                }
            }
            queue.put_nowait(orjson.dumps({"type": "BOOKMARK", "object": end}) + b"\n")
        else:
            since = params.get("resourceVersion", "")
            start = int(since) if since.isdigit() else 0
            for rv, line in self.history:
                if rv > start:
                    queue.put_nowait(line)
        self.watches.add(queue)
        try:
            yield _Response(queue, self)
        finally:
            self.watches.discard(queue)


# -- lines of every shape ------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _template(event_type: str) -> dict[str, Any]:
    """A well-formed event of ``event_type`` about an object the server does not have, at an
    RV older than any the server gave: whatever survives of it cannot disturb real keys."""
    if event_type == "ERROR":
        obj: dict[str, Any] = {
            "kind": "Status",
            "code": 410,
            "reason": "Expired",
            "message": "too old",
            "details": {"retryAfterSeconds": 1, "causes": [{"reason": "x"}]},
        }
    elif event_type == "BOOKMARK":
        obj = {
            "metadata": {
                "resourceVersion": "99",
                "annotations": {INITIAL_EVENTS_END_ANNOTATION: "true"},
            }
        }
    else:
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "zz-phantom",
                "namespace": NAMESPACE,
                "uid": "uid-phantom",
                "resourceVersion": "99",
                "labels": {"app": "x"},
                "annotations": {"a": "b"},
                "ownerReferences": [{"uid": "owner", "kind": "X", "name": "o"}],
                "managedFields": [{"manager": "m"}],
            },
            "data": {"k": "v"},
        }
    return {"type": event_type, "object": obj}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_events(draw: st.DrawFn) -> bytes:
    """A well-formed event with one position (the whole event included) replaced by any
    JSON value."""
    event = _template(
        draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "OTHER"]))
    )
    path = draw(st.sampled_from(_paths(event)))
    value = draw(JSON)
    if not path:
        return json.dumps(value).encode()
    target: Any = event
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return json.dumps(event).encode()  # not orjson: integers beyond 64 bits are JSON too


BAD_LINES = mutated_events() | st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" "))


# -- the property -----------------------------------------------------------------------------


def _converged(informer: SharedInformer, server: ScriptedServer) -> bool:
    store = informer.store
    return all(
        store.resource_version_of(f"{NAMESPACE}/{name}") == obj["metadata"]["resourceVersion"]
        for name, obj in server.objects.items()
    )


async def _survives(line: bytes, streaming: bool) -> None:
    server = ScriptedServer(["a", "b", "c"])
    informer = SharedInformer(
        cast(Transport, server),
        RESOURCE,
        namespace=NAMESPACE,
        options=ReflectorOptions(streaming_list=streaming, **FAST),  # type: ignore[arg-type]
    )
    seen: list[StoreDelta] = []
    changed = asyncio.Event()

    def record(delta: StoreDelta, initial: bool) -> None:
        seen.append(delta)
        changed.set()

    informer.add_handler(record)
    restarts = metrics.REFLECTOR_RESTARTS.labels(RESOURCE.group_resource)
    before = restarts.value
    informer.start()
    try:
        assert await informer.wait_for_sync(10)
        task = informer._task
        server.inject(line)
        server.write("a")
        server.write("c")
        async with asyncio.timeout(10):
            while not _converged(informer, server):  # every store change reaches `record`
                changed.clear()
                await changed.wait()
        assert restarts.value == before, "the reflector crashed instead of handling the line"
        assert informer._task is task and informer.running and informer.healthy
        for name, obj in server.objects.items():
            assert informer.store.get(f"{NAMESPACE}/{name}") == obj
        # The namespace index agrees with the keys.
        assert set(informer.store.index_keys("namespace", NAMESPACE)) == {
            key for key in list(informer.store.keys()) if key.startswith(f"{NAMESPACE}/")
        }
        # Handlers saw the server's latest state of every object last.
        latest = {d.key: d for d in seen if d.type != "DELETED"}
        for name, obj in server.objects.items():
            assert latest[f"{NAMESPACE}/{name}"].obj == obj
    finally:
        await informer.stop()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(line=BAD_LINES, streaming=st.booleans())
def test_any_json_in_any_position_of_a_watch_event_never_stops_the_informer(
    line: bytes, streaming: bool
) -> None:
    asyncio.run(_survives(line, streaming))


@pytest.mark.parametrize(
    "line",
    [
        b'{"type": "ADDED", "object": null}',
        b'{"type": "MODIFIED", "object": "text"}',
        b'{"type": "ADDED", "object": {"metadata": "text"}}',
        b'{"type": {"a": 1}, "object": {}}',
        b'{"type": 7, "object": {}}',
        b'{"type": "BOOKMARK", "object": null}',
        b'{"type": "ERROR", "object": null}',
        b'{"type": "ERROR", "object": [1, 2]}',
        b'{"type": "ADDED", "object": {"metadata": {"name": "x", "labels": [1]}}}',
        b'{"type": "ADDED", "object": {"metadata": {"name": "x", "resourceVersion": 5}}}',
        b"[]",
        b"not json",
    ],
)
def test_each_shape_seen_in_the_field_is_survived(line: bytes) -> None:
    asyncio.run(_survives(line, streaming=True))


def test_a_malformed_line_relists_and_is_counted() -> None:
    async def scenario() -> None:
        label = RESOURCE.group_resource
        malformed = metrics.MALFORMED_EVENTS.labels(label, "event")
        relists = metrics.RELISTS.labels(label, "malformed watch event")
        before = (malformed.value, relists.value)
        await _survives(b'{"type": "ADDED", "object": null}', streaming=False)
        assert malformed.value == before[0] + 1
        assert relists.value == before[1] + 1

    asyncio.run(scenario())


@pytest.mark.parametrize("on", ["list", "read"])
@pytest.mark.parametrize(
    "error",
    [RuntimeError("File descriptor 9 is used by transport"), OSError(113, "No route to host")],
)
def test_connection_errors_of_any_type_are_retried_never_fatal(
    on: str, error: BaseException
) -> None:
    """uvloop's fd-reuse RuntimeError or a bare OSError from a LIST or from reading a watch:
    a connection failure (backoff, retry), never the end of the reflector."""

    async def scenario() -> None:
        server = ScriptedServer(["a"])
        server.fail_once(on, error)
        informer = SharedInformer(
            cast(Transport, server),
            RESOURCE,
            namespace=NAMESPACE,
            options=ReflectorOptions(streaming_list=False, **FAST),  # type: ignore[arg-type]
        )
        changed = asyncio.Event()
        informer.add_handler(lambda delta, initial: changed.set())
        restarts = metrics.REFLECTOR_RESTARTS.labels(RESOURCE.group_resource)
        before = restarts.value
        informer.start()
        try:
            assert await informer.wait_for_sync(10)
            async with asyncio.timeout(10):
                await server.failed.wait()
            server.write("a")
            async with asyncio.timeout(10):
                while not _converged(informer, server):
                    changed.clear()
                    await changed.wait()
            assert restarts.value == before
            assert informer.healthy
        finally:
            await informer.stop()

    asyncio.run(scenario())
