"""The harness's side of the API: creating Tasks, loading changes, and watching from outside.

Everything the harness measures about an implementation it sees the same way for all of them:
through its own watch of the namespace (:class:`TaskObserver`), never through what the
implementation says about itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.runners.stamp import bench_count
from kubeclient.errors import ApiError
from kubeclient.transport import Transport

GROUP_PATH = "/apis/tasks.crpy.io/v1"
Progress = Callable[[str], None]


def tasks_path(namespace: str) -> str:
    return f"{GROUP_PATH}/namespaces/{namespace}/tasks"


def task_name(i: int) -> str:
    return f"task-{i:07d}"


def task_body(i: int) -> dict[str, Any]:
    """The i-th benchmark Task: the same in every namespace. Priorities 1-3 (no deadline, so
    no deadline wake-ups: see docs/benchmarks.md), one in ten InProgress."""
    return {
        "apiVersion": "tasks.crpy.io/v1",
        "kind": "Task",
        "metadata": {"name": task_name(i), "labels": {"app": "bench", "shard": str(i % 16)}},
        "spec": {
            "priority": 1 + i % 3,
            "details": f"benchmark task number {i}: do the work, then mark it done",
            "taskState": "InProgress" if i % 10 == 0 else "Pending",
        },
    }


async def create_namespace(transport: Transport, namespace: str) -> None:
    try:
        await transport.request(
            "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
        )
    except ApiError as err:
        if err.status != 409:
            raise


async def create_tasks(
    transport: Transport,
    namespace: str,
    n: int,
    *,
    concurrency: int = 64,
    progress: Progress | None = None,
) -> float:
    """POST N Tasks with ``concurrency`` requests in flight; seconds taken."""
    await create_namespace(transport, namespace)
    path = tasks_path(namespace)
    numbers = iter(range(n))
    done = 0
    started = time.monotonic()
    last = started

    async def worker() -> None:
        nonlocal done, last
        for i in numbers:
            try:
                await transport.request("POST", path, body=task_body(i))
            except ApiError as err:
                if err.status != 409:
                    raise
            done += 1
            now = time.monotonic()
            if progress is not None and (now - last >= 5 or done == n):
                last = now
                progress(f"  {namespace}: created {done}/{n} ({done / (now - started):.0f}/s)")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


async def create_reconciled_tasks(
    transport: Transport,
    namespace: str,
    n: int,
    *,
    concurrency: int = 64,
    progress: Progress | None = None,
) -> float:
    """POST N Tasks and give each the status the Task controller would derive (one status
    merge patch each, from the POST's answer), so that a controller starting on the namespace
    finds every Task reconciled and has nothing to write. Seconds taken."""
    from controllers.task import derive_status, utcnow  # noqa: PLC0415

    await create_namespace(transport, namespace)
    path = tasks_path(namespace)
    numbers = iter(range(n))
    done = 0
    started = time.monotonic()
    last = started

    async def worker() -> None:
        nonlocal done, last
        for i in numbers:
            try:
                answer = await transport.request("POST", path, body=task_body(i))
                task = orjson.loads(answer.body)
            except ApiError as err:
                if err.status != 409:
                    raise
                task = await transport.get_json(f"{path}/{task_name(i)}")
            status, _ = derive_status(task, utcnow())
            if status != (task.get("status") or {}):
                await transport.request(
                    "PATCH",
                    f"{path}/{task_name(i)}/status",
                    body={"status": status},
                    content_type="application/merge-patch+json",
                )
            done += 1
            now = time.monotonic()
            if progress is not None and (now - last >= 5 or done == n):
                last = now
                progress(
                    f"  {namespace}: {done}/{n} created and reconciled "
                    f"({done / (now - started):.0f}/s)"
                )

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


@dataclass
class Seen:
    """What the observer knows about one Task."""

    generation: int = 0
    observed_generation: int = 0
    bench: int = 0
    first_reconciled: dict[int, float] = field(default_factory=dict)
    """observedGeneration value -> when the observer first saw the status reach it."""


class TaskObserver:
    """LIST then WATCH the Tasks of one namespace, recording per object when its status
    reached each generation (``status.observedGeneration``) and how many write-heavy stamps it
    carries. Times are ``time.monotonic()`` at decoding.
    """

    def __init__(
        self, transport: Transport, namespace: str, *, stamp: str = "", rounds: int = 1
    ) -> None:
        self.transport = transport
        self.namespace = namespace
        self.stamp = stamp
        self.rounds = rounds
        self.fully_stamped = 0
        """Objects carrying all ``rounds`` stamps of ``stamp``."""
        self.objects: dict[str, Seen] = {}
        self.reconciled = 0
        """Objects whose status describes their current generation."""
        self.stamped_writes = 0
        self.first_stamp_at: float | None = None
        self.last_stamp_at: float | None = None
        self.events = 0
        self._resource_version = ""
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()

    async def start(self) -> None:
        answer = await self.transport.get_json(tasks_path(self.namespace))
        now = time.monotonic()
        for obj in answer["items"]:
            self._apply(obj, now)
        self._resource_version = answer["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._watch(), name=f"observe-{self.namespace}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _apply(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        seen = self.objects.get(name)
        if seen is None:
            seen = self.objects[name] = Seen()
        was_current = seen.observed_generation >= seen.generation > 0
        seen.generation = meta.get("generation") or 0
        status = obj.get("status") or {}
        observed = status.get("observedGeneration") or 0
        if observed != seen.observed_generation:
            seen.observed_generation = observed
            seen.first_reconciled.setdefault(observed, now)
        is_current = seen.observed_generation >= seen.generation > 0
        self.reconciled += int(is_current) - int(was_current)
        if self.stamp:
            count = bench_count(status, self.stamp)
            if count > seen.bench:
                self.stamped_writes += count - seen.bench
                if seen.bench < self.rounds <= count:
                    self.fully_stamped += 1
                seen.bench = count
                if self.first_stamp_at is None:
                    self.first_stamp_at = now
                self.last_stamp_at = now

    async def _watch(self) -> None:
        while True:
            params = {
                "watch": "true",
                "resourceVersion": self._resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "1800",
            }
            try:
                async with self.transport.stream(tasks_path(self.namespace), params) as response:
                    buffer = b""
                    async for chunk in response.content.iter_any():
                        buffer += chunk
                        if b"\n" not in chunk:
                            continue
                        *lines, buffer = buffer.split(b"\n")
                        now = time.monotonic()
                        for line in lines:
                            if line:
                                self._event(orjson.loads(line), now)
                        self.changed.set()
            except ApiError as err:
                if err.status == 410:
                    raise RuntimeError("the observer's watch expired (410); rerun") from err
                await asyncio.sleep(0.5)

    def _event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise RuntimeError(f"watch error: {obj}")
        self._resource_version = obj.get("metadata", {}).get(
            "resourceVersion", self._resource_version
        )
        if kind in ("ADDED", "MODIFIED"):
            self.events += 1
            self._apply(obj, now)

    async def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` (checked after each batch of events) or ``timeout`` seconds.
        True if done."""
        deadline = time.monotonic() + timeout
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))
        return True


@dataclass
class LoadResult:
    sent_at: dict[str, float]
    target_generation: dict[str, int]
    first_sent: float
    last_sent: float
    failures: int


async def churn(
    transport: Transport,
    namespace: str,
    names: list[str],
    *,
    rate: float,
    in_flight: int = 64,
    progress: Progress | None = None,
) -> LoadResult:
    """Patch ``spec.details`` of each named Task once, at ``rate`` updates/s (open loop: an
    update is sent at its scheduled time whatever happened to the previous ones, with at most
    ``in_flight`` requests outstanding). Records each send time and the generation the server
    gave the object."""
    path = tasks_path(namespace)
    sent_at: dict[str, float] = {}
    target: dict[str, int] = {}
    failures = 0
    limit = asyncio.Semaphore(in_flight)
    started = time.monotonic()
    last_report = started

    async def update(i: int, name: str) -> None:
        nonlocal failures
        async with limit:
            body = {"spec": {"details": f"churn update {i}: the details changed"}}
            sent_at[name] = time.monotonic()
            try:
                answer = await transport.request(
                    "PATCH",
                    f"{path}/{name}",
                    body=body,
                    content_type="application/merge-patch+json",
                )
            except ApiError:
                failures += 1
                return
            target[name] = orjson.loads(answer.body)["metadata"]["generation"]

    tasks = []
    for i, name in enumerate(names):
        due = started + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(update(i, name)))
        now = time.monotonic()
        if progress is not None and now - last_report >= 5:
            last_report = now
            progress(f"  churn: sent {i + 1}/{len(names)} ({(i + 1) / (now - started):.0f}/s)")
    await asyncio.gather(*tasks)
    return LoadResult(sent_at, target, min(sent_at.values()), max(sent_at.values()), failures)
