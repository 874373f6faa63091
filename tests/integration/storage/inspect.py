"""Reading a backend's own data, to check from outside where the API server put an object and
what compaction it asked for. Only for verification: nothing here drives the tests."""

from __future__ import annotations

import base64
import sqlite3
from typing import Any

import aiohttp
import psycopg

from controller_runtime.envtest.storage import ETCD, KINE_SQLITE, StorageProcess


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _etcd_range(process: StorageProcess, key: str, *, prefix: bool) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        end = key[:-1] + chr(ord(key[-1]) + 1)
        body |= {"range_end": _b64(end)}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{process.url}/v3/kv/range", json=body) as answer,
    ):
        assert answer.status == 200, await answer.text()
        kvs: list[dict[str, Any]] = (await answer.json()).get("kvs", [])
        return kvs


def _sql(process: StorageProcess, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if process.backend == KINE_SQLITE:
        with sqlite3.connect(process.data_dir / "state.db", timeout=30) as conn:
            return conn.execute(query, params).fetchall()
    assert process.postgres is not None
    pg = process.postgres
    with psycopg.connect(
        host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname=process.database
    ) as conn:
        return conn.execute(query.replace("?", "%s"), params).fetchall()


async def stored_keys(process: StorageProcess, prefix: str) -> set[str]:
    """Keys this backend holds, or held, under ``prefix`` (kine keeps a row per revision)."""
    if process.backend == ETCD:
        return {
            base64.b64decode(kv["key"]).decode()
            for kv in await _etcd_range(process, prefix, prefix=True)
        }
    rows = _sql(process, "SELECT DISTINCT name FROM kine WHERE name LIKE ?", (prefix + "%",))
    return {str(name) for (name,) in rows}


async def requested_compaction(process: StorageProcess) -> int:
    """The revision the API server last asked this backend to compact to (0: none yet).

    The API server records it under ``compact_rev_key`` before it compacts; kine keeps the
    API server's copy under ``compact_rev_key_apiserver`` as ``version|revision``.
    """
    if process.backend == ETCD:
        kvs = await _etcd_range(process, "compact_rev_key", prefix=False)
        return int(base64.b64decode(kvs[0]["value"])) if kvs else 0
    rows = _sql(
        process,
        "SELECT value FROM kine WHERE name = ? ORDER BY id DESC LIMIT 1",
        ("compact_rev_key_apiserver",),
    )
    if not rows:
        return 0
    value = bytes(rows[0][0]).decode()
    return int(value.rpartition("|")[2] or 0)
