"""kine-postgres's database, handled by the library alone: a real throwaway PostgreSQL server
(:class:`controller_runtime.envtest.postgres.LocalPostgres`), kine's database measured and
dropped with ``psql``, no PostgreSQL driver imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller_runtime.envtest.postgres import LocalPostgres, psql
from controller_runtime.envtest.storage import KINE_POSTGRES, StorageProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[LocalPostgres]:
    with LocalPostgres() as running:
        yield running


def databases(server: LocalPostgres) -> set[str]:
    listed = psql(
        host=server.host,
        port=server.port,
        user=server.user,
        password=server.password,
        sql="SELECT datname FROM pg_database",
    )
    return set(listed.split())


def test_kines_database_is_measured_and_dropped_with_psql(
    server: LocalPostgres, tmp_path: Path
) -> None:
    process = StorageProcess(KINE_POSTGRES, tmp_path, Path("/nonexistent/kine"), postgres=server)
    name = process.database
    psql(
        host=server.host,
        port=server.port,
        user=server.user,
        password=server.password,
        sql=f'CREATE DATABASE "{name}"',
    )
    assert name in databases(server)
    assert process.disk_bytes() > 1_000_000  # an empty PostgreSQL database is about 7 MiB
    process.remove()
    assert name not in databases(server)
    assert process.database == ""


def test_a_failing_statement_says_what_psql_said(server: LocalPostgres) -> None:
    with pytest.raises(RuntimeError, match=r"psql failed .*does_not_exist"):
        psql(
            host=server.host,
            port=server.port,
            user=server.user,
            password=server.password,
            sql="SELECT * FROM does_not_exist",
        )


def test_the_storage_module_imports_no_driver_and_nothing_of_the_operator() -> None:
    probe = (
        "import sys, controller_runtime.envtest.storage, controller_runtime.envtest.postgres;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'controllers')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    assert out.stdout.strip() == "[]"
