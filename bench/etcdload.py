"""N reconciled Tasks written straight into etcd: the restart scenario at a million objects.

Through the API server, creating a reconciled Task costs a POST and a status PATCH (≈ 76
Tasks/s on this machine while other work runs: 1M would take ≈ 4 hours). The restart
scenario only needs the Tasks to exist, each with the status the controller would derive, so
with ``--restart-load etcd`` the harness writes them into the control plane's etcd itself,
the way the API server stores a custom resource: JSON under
``/registry/<group>/<plural>/<namespace>/<name>``, with ``metadata.resourceVersion`` left out
(the server fills it in from the key's revision). Writes go through etcd's JSON gateway
(``/v3/kv/txn``), ``BATCH`` puts per transaction (etcd's default ``--max-txn-ops``), a few
transactions in flight.

The API server learns about them through its etcd watch, like any change; the loader returns
once its watch cache has reached the last revision written (:func:`wait_until_served`). Every
object is what the API server would have stored after the same POST and status patch, less
``managedFields`` (which the informers strip anyway).
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

BATCH = 128
IN_FLIGHT = 4
PREFIX = "/registry/tasks.crpy.io/tasks"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def stored_task(i: int, namespace: str, created: str) -> dict[str, Any]:
    """The i-th benchmark Task as the API server stores it once reconciled."""
    from bench.kube import task_body  # noqa: PLC0415
    from controllers.task import derive_status, parse_time  # noqa: PLC0415

    task = task_body(i)
    task["metadata"] |= {
        "namespace": namespace,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{i}")),
        "generation": 1,
        "creationTimestamp": created,
    }
    task["status"], _ = derive_status(task, parse_time(created))
    return task


async def load_reconciled_tasks(
    etcd_url: str,
    transport: Any,
    namespace: str,
    n: int,
    *,
    first: int = 0,
    progress: Callable[[str], None] | None = None,
    serve_timeout: float | None = None,
) -> float:
    """Write reconciled Tasks ``first`` .. ``n - 1`` of ``namespace`` into etcd and wait until
    the API server serves ``n`` Tasks there (:func:`wait_until_served`); seconds taken."""
    from bench.kube import create_namespace  # noqa: PLC0415

    started = time.monotonic()
    await create_namespace(transport, namespace)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    batches = iter(range(first, n, BATCH))
    written = 0
    revision = 0
    last = started

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal written, revision, last
        for start in batches:
            puts = []
            for i in range(start, min(start + BATCH, n)):
                task = stored_task(i, namespace, created)
                key = f"{PREFIX}/{namespace}/{task['metadata']['name']}".encode()
                puts.append({"requestPut": {"key": _b64(key), "value": _b64(orjson.dumps(task))}})
            async with session.post(f"{etcd_url}/v3/kv/txn", json={"success": puts}) as answer:
                body = await answer.json(content_type=None)
                if answer.status != 200:
                    raise RuntimeError(f"etcd refused a transaction ({answer.status}): {body}")
            revision = max(revision, int(body["header"]["revision"]))
            written += len(puts)
            now = time.monotonic()
            if progress is not None and (now - last >= 5 or written == n - first):
                last = now
                rate = written / (now - started)
                progress(f"  {namespace}: {written}/{n - first} written to etcd ({rate:.0f}/s)")

    async with aiohttp.ClientSession(json_serialize=lambda o: orjson.dumps(o).decode()) as session:
        await asyncio.gather(*(worker(session) for _ in range(IN_FLIGHT)))
    await wait_until_served(transport, namespace, n, revision, timeout=serve_timeout)
    return time.monotonic() - started


class NotServedError(RuntimeError):
    """The API server's watch cache did not catch up with a direct load in time."""


async def cache_lag(transport: Any, namespace: str, revision: int) -> str | None:
    """``None`` once the API server's watch cache of Tasks has reached ``revision``, else
    what keeps it from saying so. ``revision`` must be that of a Task of ``namespace`` (the
    loaders pass the last one they wrote).

    Asked with a one-second watch from the version before ``revision``: a cache that has
    reached it sends that Task at once; one that has not stays silent (or refuses with a
    504, "Too large resource version"); one rebuilt from a later list answers 410, too old,
    and is past it. Neither a watch from ``revision`` itself (silent both when the cache is
    there and when it is not) nor a LIST (answered by the storage while the cache is still
    being built) can tell."""
    from bench.kube import tasks_path  # noqa: PLC0415
    from kubeclient.errors import ApiError  # noqa: PLC0415

    params = {"watch": "1", "resourceVersion": str(revision - 1), "timeoutSeconds": "1"}
    try:
        async with transport.stream(tasks_path(namespace), params) as answer:
            body = await answer.content.read()
    except ApiError as err:
        return str(err)
    for line in body.splitlines():
        event = orjson.loads(line)
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            return None if obj.get("code") == 410 else str(obj.get("message", event))
        seen = (obj.get("metadata") or {}).get("resourceVersion", "")
        if seen.isdigit() and int(seen) >= revision:
            return None
    return f"the watch cache has not reached revision {revision}"


async def wait_until_served(
    transport: Any, namespace: str, n: int, revision: int, *, timeout: float | None = None
) -> None:
    """Until the API server's watch cache has reached ``revision`` (the last one written,
    :func:`cache_lag`) and holds ``n`` Tasks of ``namespace``; :class:`NotServedError` after
    ``timeout`` seconds, with the server's word on how far the cache got."""
    from bench.kube import tasks_path  # noqa: PLC0415
    from kubeclient.errors import ServerTimeoutError  # noqa: PLC0415

    began = time.monotonic()
    while True:
        lag = await cache_lag(transport, namespace, revision)
        if lag is None:
            # Counted by the watch cache, one item and the count of the rest. At "0" the
            # cache ignores ``limit`` and sends every Task (21 s for 400k on kine-sqlite).
            params = {
                "resourceVersion": str(revision),
                "resourceVersionMatch": "NotOlderThan",
                "limit": "1",
            }
            try:
                listed = await transport.get_json(tasks_path(namespace), params=params)
            except ServerTimeoutError as err:  # 504: the cache fell behind again
                lag = str(err)
            else:
                meta = listed["metadata"]
                served = len(listed["items"]) + int(meta.get("remainingItemCount", 0))
                if served >= n:
                    return
                lag = f"{served} of {n} Tasks listed"
        if timeout is not None and time.monotonic() - began > timeout:
            raise NotServedError(
                f"not served {timeout:.0f}s after the load (last written {revision}): {lag}"[:300]
            )
        await asyncio.sleep(1)
