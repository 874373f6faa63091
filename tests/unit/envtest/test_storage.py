"""The storage backends' pure parts: names, overrides, and the command lines they start."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_runtime.envtest import storage
from controller_runtime.envtest.storage import (
    BACKENDS,
    StorageError,
    StorageProcess,
    check_overrides,
    check_storage,
    default_storage,
    is_built_in_group,
    servers_overrides_flag,
)


class _Postgres:
    host = "127.0.0.1"
    port = 5432
    user = "postgres"
    password = "s3cret-not-on-the-command-line"


def test_backends_and_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert BACKENDS == ("etcd", "kine-sqlite", "kine-postgres")
    monkeypatch.delenv(storage.STORAGE_ENV, raising=False)
    assert default_storage() == "etcd"
    monkeypatch.setenv(storage.STORAGE_ENV, "kine-sqlite")
    assert default_storage() == "kine-sqlite"
    monkeypatch.setenv(storage.STORAGE_ENV, "mysql")
    with pytest.raises(StorageError, match="expected one of etcd, kine-sqlite, kine-postgres"):
        default_storage()
    with pytest.raises(StorageError, match="unknown storage 'kine'"):
        check_storage("kine")


def test_overrides_of_built_in_resources_become_the_flag() -> None:
    checked = check_overrides({"/events": "kine-postgres", "coordination.k8s.io/leases": "etcd"})
    assert checked == {"/events": "kine-postgres", "coordination.k8s.io/leases": "etcd"}
    flag = servers_overrides_flag(
        {"/events": "http://127.0.0.1:1", "coordination.k8s.io/leases": "http://127.0.0.1:2"}
    )
    assert flag == "/events#http://127.0.0.1:1,coordination.k8s.io/leases#http://127.0.0.1:2"


@pytest.mark.parametrize("key", ["events", "/", "a/b/c", "/events#x", "/a,b", "apps/ x"])
def test_malformed_overrides_say_the_expected_shape(key: str) -> None:
    with pytest.raises(StorageError, match="expected 'group/resource'"):
        check_overrides({key: "kine-sqlite"})


def test_an_override_of_a_custom_resource_is_refused_with_the_reason() -> None:
    with pytest.raises(StorageError) as err:
        check_overrides({"tasks.crpy.io/tasks": "kine-postgres"})
    message = str(err.value)
    assert "only to resources compiled into it" in message
    assert "storage='kine-postgres'" in message
    with pytest.raises(StorageError, match="unknown storage"):
        check_overrides({"/events": "sqlite"})


@pytest.mark.parametrize(
    ("group", "built_in"),
    [
        ("", True),
        ("apps", True),
        ("batch", True),
        ("coordination.k8s.io", True),
        ("rbac.authorization.k8s.io", True),
        ("tasks.crpy.io", False),
        ("postgres.crpy.io", False),
        ("k8s.io.example.com", False),
        ("metrics", False),
    ],
)
def test_built_in_groups(group: str, built_in: bool) -> None:
    assert is_built_in_group(group) is built_in


@given(st.sampled_from(BACKENDS))
def test_every_listener_is_on_loopback_and_no_password_is_on_the_command_line(
    backend: str,
) -> None:
    postgres = _Postgres() if backend == "kine-postgres" else None
    process = StorageProcess(backend, Path("/tmp/x"), Path("/bin/true"), postgres=postgres)
    command, env = process.command()
    text = " ".join(command)
    assert _Postgres.password not in text
    addresses = [
        arg.split("=", 1)[1]
        for arg in command
        if arg.startswith(("--listen-", "--advertise-", "--metrics-bind-address"))
    ]
    assert addresses, command
    for address in addresses:
        host = address.removeprefix("http://").rsplit(":", 1)[0]
        assert host == "127.0.0.1", (address, command)
    if backend == "etcd":
        assert "--unsafe-no-fsync=true" in command
    else:
        # kine's defaults are 0.0.0.0:2379 and :8080: both flags must be given.
        assert any(a.startswith("--listen-address=127.0.0.1:") for a in command)
        assert any(a.startswith("--metrics-bind-address=127.0.0.1:") for a in command)
    if backend == "kine-postgres":
        assert env["PGPASSWORD"] == _Postgres.password
        assert f"/{process.database}?" in text
        assert process.database.startswith("kine_")
    if backend == "kine-sqlite":
        assert "sqlite:///tmp/x/kine-sqlite/state.db?" in text


def test_kine_postgres_without_a_server_is_an_error() -> None:
    with pytest.raises(StorageError, match="needs a PostgreSQL server"):
        StorageProcess("kine-postgres", Path("/tmp/x"), Path("/bin/true"))


def test_directory_bytes_counts_allocated_blocks(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_bytes(b"x" * 10_000)
    assert storage.directory_bytes(tmp_path) >= 10_000
    assert storage.directory_bytes(tmp_path / "missing") == 0
