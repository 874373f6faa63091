"""The storage comparison's command line and tables (no control plane)."""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.etcdload import cache_lag
from bench.harness import settings_from
from bench.storage import StorageSettings, format_table, plane_for, restarts_at

LADDER_ROW = {
    "scenario": "storage-ladder",
    "objects": 1000,
    "create_per_second": 500.0,
    "list_seconds": 1.5,
    "page_p50_seconds": 0.01,
    "page_p99_seconds": 0.05,
    "apiserver_rss_bytes": 300 * 2**20,
    "storage_rss_bytes": 100 * 2**20,
    "postgres_pss_bytes": None,
    "disk_bytes": 50 * 2**20,
}


def test_storage_flags() -> None:
    s = settings_from(["--storage", "etcd,kine-sqlite", "--storage-sizes", "10,20"])
    assert s.storage == ("etcd", "kine-sqlite")
    assert s.storage_sizes == (10, 20)
    assert s.etcd_quota == 2 * 2**30
    quick = settings_from(["--storage", "kine-postgres", "--quick"])
    assert quick.storage_sizes == (1000, 5000)
    assert settings_from([]).storage_sizes == (10_000, 100_000, 1_000_000)


def test_an_unknown_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from(["--storage", "etcd,mysql"])
    assert "unknown: mysql" in capsys.readouterr().err


def test_the_tables_show_each_backend_and_the_error_that_stopped_it() -> None:
    ladder = LADDER_ROW
    rows = [
        ladder | {"backend": "etcd", "error": "500 mvcc: database space exceeded"},
        ladder | {"backend": "kine-postgres", "postgres_pss_bytes": 200 * 2**20},
        {
            "scenario": "storage-watch",
            "backend": "etcd",
            "updates": 10,
            "rate": 100.0,
            "delivered": 10,
            "p50_seconds": 0.004,
            "p99_seconds": 0.02,
        },
    ]
    table = format_table(rows)
    assert "| etcd | 1,000 | 500 | 1.50 | 10 | 50 | 300 | 100 | 50 | 500 mvcc" in table
    assert "100 + 200 (PostgreSQL PSS)" in table
    assert "| etcd | 10 | 100 | 10 | 4 | 20 |" in table


def test_the_restart_runs_on_the_rung_of_its_size_not_on_the_largest() -> None:
    ladder = [(10_000, False), (100_000, False), (1_000_000, True)]
    chosen = [have for have, last in ladder if restarts_at(have, last=last, wanted=100_000)]
    assert chosen[0] == 100_000
    # a backend that stopped short (its quota) restarts on what it reached
    assert restarts_at(42_000, last=True, wanted=100_000)
    assert not restarts_at(42_000, last=False, wanted=100_000)


def test_a_direct_load_and_a_bounded_list_are_flagged_and_shown() -> None:
    s = settings_from(
        [
            "--storage",
            "kine-sqlite",
            "--storage-load",
            "direct",
            "--storage-list-limit-seconds",
            "60",
        ]
    )
    assert (s.storage_load, s.storage_list_limit_seconds) == ("direct", 60.0)
    assert settings_from([]).storage_load == "api"
    row = LADDER_ROW | {
        "backend": "kine-sqlite",
        "objects": 1_000_000,
        "load": "direct",
        "create_per_second": 4000.0,
        "list_seconds": 120.4,
        "list_objects": 250_000,
        "list_complete": False,
        "page_p50_seconds": 0.2,
        "page_p99_seconds": 1.0,
    }
    assert (
        "| kine-sqlite | 1,000,000 | direct (4,000) | 120.40 (250,000 listed) | 200 | 1000 |"
        in (format_table([row]))
    )


def test_kines_poll_batch_size_reaches_both_kine_backends_and_not_etcd() -> None:
    assert settings_from([]).kine_poll_batch_size is None
    s = settings_from(["--storage", "kine-sqlite", "--kine-poll-batch-size", "10000"])
    assert s.kine_poll_batch_size == 10_000
    storage = StorageSettings(
        backends=("kine-sqlite",),
        sizes=(10,),
        churn=0,
        churn_rate=1.0,
        etcd_quota=2**30,
        restart_objects=0,
        implementations=(),
        timeout=1.0,
        json_path=Path("storage.json"),
        plots_dir=Path("."),
        kine_poll_batch_size=10_000,
    )
    args = plane_for("kine-sqlite", storage).storage_args
    assert args["kine-sqlite"] == args["kine-postgres"] == ["--poll-batch-size=10000"]
    assert args["etcd"] == ["--quota-backend-bytes=1073741824"]
    default = plane_for("kine-postgres", dataclasses.replace(storage, kine_poll_batch_size=None))
    assert default.storage_args["kine-postgres"] == []


class _OneAnswer:
    """A transport whose every watch answers ``body`` (the shape ``cache_lag`` reads)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.asked: dict[str, str] = {}

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: dict[str, str]) -> AsyncIterator[Any]:
        del path
        self.asked = params
        answer = types.SimpleNamespace(content=types.SimpleNamespace(read=self._read))
        yield answer

    async def _read(self) -> bytes:
        return self.body


def _error(code: int, message: str) -> bytes:
    status = {"kind": "Status", "code": code, "message": message}
    return orjson.dumps({"type": "ERROR", "object": status}) + b"\n"


def _event(resource_version: str) -> bytes:
    task = {"kind": "Task", "metadata": {"name": "t", "resourceVersion": resource_version}}
    return orjson.dumps({"type": "ADDED", "object": task}) + b"\n"


@pytest.mark.parametrize(
    ("body", "lag"),
    [
        (_event("9"), None),  # the Task written at 9 came at once: the cache has it
        (_event("12"), None),
        (b"", "has not reached revision 9"),  # a second of silence: not there yet
        (_error(410, "too old resource version: 8 (20)"), None),  # rebuilt past it
        (_error(504, "Too large resource version: 9, current: 5"), "Too large resource version"),
        (_error(500, "internal error"), "internal error"),
    ],
)
async def test_the_cache_has_reached_a_revision_when_it_sends_what_was_written_there(
    body: bytes, lag: str | None
) -> None:
    transport = _OneAnswer(body)
    found = await cache_lag(transport, "ns", 9)
    assert transport.asked == {"watch": "1", "resourceVersion": "8", "timeoutSeconds": "1"}
    if lag is None:
        assert found is None
    else:
        assert found is not None and lag in found
