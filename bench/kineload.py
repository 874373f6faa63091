"""Reconciled Tasks written straight into kine's table: the storage ladder's million-object rung.

Through the API server, kine-postgres creates 114-172 Tasks/s on this machine: a million would
take two hours, and giving each its status as long again. The ladder's top rung only needs the
Tasks to exist, each as the API server would have stored it, so with ``--storage-load direct``
the harness writes them where kine keeps them: one row each in its ``kine`` table, as kine's
own create inserts it (``name`` the key ``/registry/<group>/<plural>/<namespace>/<name>``,
``created`` 1, ``deleted`` 0, no previous revision, no lease, ``value`` the object's JSON with
``metadata.resourceVersion`` left out: kine reports the row's ``id`` as its revision).

kine learns of rows by polling its table for ids above the last one it delivered, and treats
an id that is missing for a second as dropped (it fills the gap). So rows must become visible
in id order with no holes: SQLite gives that by itself (one writer at a time, and kine opens
it with ``_txlock=immediate``); on PostgreSQL each batch takes an ``EXCLUSIVE`` lock on the
table first, so kine's own inserts (the API server keeps writing its lease) wait for the batch
to commit and take the ids after it. Reads go on meanwhile.

The API server learns of the rows through kine's watch, like any change; the loader returns
once its watch cache has reached the last id written (``bench.etcdload.wait_until_served``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from bench.etcdload import PREFIX, stored_task, wait_until_served
from controller_runtime.envtest.storage import KINE_POSTGRES, KINE_SQLITE, StorageProcess

BATCH = 5_000
"""Rows per transaction: a PostgreSQL batch holds kine's writers back for well under the
second after which kine would fill a gap."""

INSERT = (
    "INSERT INTO kine (name, created, deleted, create_revision, prev_revision, lease, value, "
    "old_value) VALUES ({p}, 1, 0, 0, 0, 0, {p}, NULL)"
)


def rows(namespace: str, first: int, stop: int, created: str) -> Iterator[tuple[str, bytes]]:
    """(key, value) of the reconciled Tasks ``first`` .. ``stop - 1``."""
    for i in range(first, stop):
        task = stored_task(i, namespace, created)
        yield f"{PREFIX}/{namespace}/{task['metadata']['name']}", orjson.dumps(task)


def _write_sqlite(
    process: StorageProcess, namespace: str, first: int, n: int, say: Callable[[str], None]
) -> int:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    db = sqlite3.connect(process.data_dir / "state.db", timeout=60, isolation_level=None)
    try:
        last_id = 0
        for start in range(first, n, BATCH):
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                INSERT.format(p="?"), rows(namespace, start, min(start + BATCH, n), created)
            )
            (last_id,) = db.execute("SELECT MAX(id) FROM kine").fetchone()
            db.execute("COMMIT")
            _progress(say, namespace, start + BATCH - first, n - first)
        return int(last_id)
    finally:
        db.close()


def _write_postgres(
    process: StorageProcess, namespace: str, first: int, n: int, say: Callable[[str], None]
) -> int:
    import psycopg  # noqa: PLC0415 (the operator's extra; only this backend needs it)

    assert process.postgres is not None
    server = process.postgres
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with psycopg.connect(
        host=server.host,
        port=server.port,
        user=server.user,
        password=server.password,
        dbname=process.database,
        autocommit=True,  # each batch is one explicit transaction
    ) as db:
        last_id = 0
        for start in range(first, n, BATCH):
            with db.transaction():
                db.execute("LOCK TABLE kine IN EXCLUSIVE MODE")
                with db.cursor() as cursor:
                    cursor.executemany(
                        INSERT.format(p="%s"),
                        rows(namespace, start, min(start + BATCH, n), created),
                    )
                    cursor.execute("SELECT MAX(id) FROM kine")
                    found = cursor.fetchone()
                    assert found is not None
                    last_id = int(found[0])
            _progress(say, namespace, start + BATCH - first, n - first)
        return last_id


def _progress(say: Callable[[str], None], namespace: str, written: int, total: int) -> None:
    if written >= total or written % (20 * BATCH) == 0:
        say(f"  {namespace}: {min(written, total)}/{total} written to kine's table")


async def load_reconciled_tasks(
    process: StorageProcess,
    transport: Any,
    namespace: str,
    n: int,
    *,
    first: int = 0,
    progress: Callable[[str], None] = lambda _: None,
    serve_timeout: float | None = None,
) -> float:
    """Write reconciled Tasks ``first`` .. ``n - 1`` of ``namespace`` into kine's table and
    wait until the API server serves ``n`` Tasks there (``wait_until_served``); seconds
    taken."""
    from bench.kube import create_namespace  # noqa: PLC0415

    started = time.monotonic()
    await create_namespace(transport, namespace)
    if process.backend == KINE_SQLITE:
        write = _write_sqlite
    elif process.backend == KINE_POSTGRES:
        write = _write_postgres
    else:
        raise ValueError(f"not a kine backend: {process.backend}")
    last_id = await asyncio.to_thread(write, process, namespace, first, n, progress)
    await wait_until_served(transport, namespace, n, last_id, timeout=serve_timeout)
    return time.monotonic() - started
