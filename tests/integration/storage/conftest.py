"""Fixtures of the storage tests: one control plane per backend (etcd, kine on SQLite, kine on
PostgreSQL), started once per module and parameter, and one PostgreSQL server for every
kine-postgres plane of the session.

``CRPY_STORAGE_BACKENDS=kine-sqlite,kine-postgres`` narrows the backends (default: all).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from controller_runtime.envtest import ControlPlane, use_existing_cluster
from controller_runtime.envtest.storage import (
    BACKENDS,
    KINE_POSTGRES,
    KINE_POSTGRES_CONNECTIONS,
    check_storage,
)
from controllers.postgres.localserver import LocalPostgres, PostgresNotFoundError

SELECTED = tuple(
    check_storage(b.strip())
    for b in os.environ.get("CRPY_STORAGE_BACKENDS", ",".join(BACKENDS)).split(",")
    if b.strip()
)


@pytest.fixture(scope="session")
def storage_postgres() -> Iterator[LocalPostgres]:
    """The PostgreSQL server of every kine-postgres plane here (a database each)."""
    server = LocalPostgres(max_connections=KINE_POSTGRES_CONNECTIONS)
    try:
        server.start()
    except PostgresNotFoundError as err:
        pytest.fail(str(err))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _own_control_planes() -> None:
    """Every storage test starts a control plane of its own (on a chosen storage), which an
    existing cluster cannot be."""
    if use_existing_cluster():
        pytest.skip("the storage tests start control planes of their own")


@pytest.fixture(scope="module", params=SELECTED)
def backend(request: pytest.FixtureRequest) -> str:
    if use_existing_cluster():
        pytest.skip("the storage tests start control planes of their own")
    name: str = request.param
    return name


@contextlib.contextmanager
def plane_on(
    backend: str, request: pytest.FixtureRequest, **options: Any
) -> Iterator[ControlPlane]:
    """A local control plane on ``backend`` (sharing the session's PostgreSQL server)."""
    postgres = request.getfixturevalue("storage_postgres") if backend == KINE_POSTGRES else None
    with ControlPlane(storage=backend, postgres=postgres, **options) as plane:
        yield plane


def args(**flags: str) -> Mapping[str, str]:
    """``args(watch_cache="false")`` -> ``{"--watch-cache": "false"}``."""
    return {"--" + name.replace("_", "-"): value for name, value in flags.items()}
