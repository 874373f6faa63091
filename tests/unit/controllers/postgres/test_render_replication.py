"""The replication parts of the rendered instance: the standby's bootstrap in the entrypoint
and synchronous mode in postgresql.conf."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controllers.postgres import render
from controllers.postgres.api import LABEL_ROLE, ROLE_REPLICA
from controllers.postgres.instance import record_primary


def test_entrypoint_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n"], input=render.ENTRYPOINT, text=True, check=False)
    assert result.returncode == 0


def test_standby_conninfo_bounds_connection_attempts_and_names_the_pod(tmp_path: Path) -> None:
    # Run the entrypoint as pod 1 against stand-ins for the PostgreSQL tools that record
    # their arguments: pg_basebackup must get one conninfo with connect_timeout (so a
    # standby does not hang on the old address of a restarted primary) and the pod's name.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "args"
    (bin_dir / "pg_isready").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "pg_basebackup").write_text(
        f'#!/bin/sh\nmkdir -p "$PGDATA"\nfor a in "$@"; do echo "$a" >> {record}; done\n'
    )
    (bin_dir / "docker-entrypoint.sh").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = render.ENTRYPOINT.replace(render.PGDATA, str(tmp_path / "pgdata"))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOSTNAME": "db-1",
        "PRIMARY_HOST": "db-0.db-headless",
        "REPLICATION_PASSWORD": "secret",
    }
    if shutil.which("bash") is None:
        pytest.fail("bash is needed to run the entrypoint")
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)
    args = record.read_text().splitlines()
    conninfo = args[args.index("-d") + 1]
    assert conninfo.split() == [
        "host=db-0.db-headless",
        "port=5432",
        f"user={render.REPLICATION_USER}",
        f"connect_timeout={render.STANDBY_CONNECT_TIMEOUT}",
        "application_name=db-1",
    ]
    assert "-R" in args and "stream" in args
    assert "secret" not in " ".join(args)  # the password travels in the environment only


def test_synchronous_mode_waits_for_exactly_one_standby() -> None:
    conf = render.postgresql_conf({"replicas": 3, "replication": {"synchronous": {"number": 1}}})
    assert "synchronous_standby_names = 'FIRST 1 (*)'" in conf
    assert "synchronous_standby_names" not in render.postgresql_conf(
        {"replicas": 1, "replication": {"synchronous": {"number": 1}}}
    )


@pytest.mark.parametrize(
    ("replicas", "synchronous", "names"),
    [
        (3, {"number": 2, "method": "First"}, "FIRST 2 (*)"),
        (5, {"number": 2, "method": "Any"}, "ANY 2 (*)"),
        (3, {"number": 8, "method": "Any"}, "ANY 2 (*)"),  # capped at the standbys there are
        (2, {}, "FIRST 1 (*)"),  # the schema's defaults
        (1, {"number": 3}, ""),  # no standby: commits never wait
        (3, None, ""),
    ],
)
def test_synchronous_standby_names_follow_number_and_method(
    replicas: int, synchronous: dict[str, Any] | None, names: str
) -> None:
    replication = {} if synchronous is None else {"synchronous": synchronous}
    spec = {"replicas": replicas, "replication": replication}
    assert render.synchronous_standby_names(spec) == names
    conf = render.postgresql_conf(spec)
    if names:
        assert f"synchronous_standby_names = '{names}'" in conf
    else:
        assert "synchronous_standby_names" not in conf


def test_replicas_service_selects_the_pods_labelled_replica_and_wal_log_hints_is_on() -> None:
    instance: dict[str, Any] = {
        "metadata": {"name": "db", "namespace": "ns"},
        "spec": {"replicas": 3},
    }
    service = render.replicas_service(instance)
    assert service["metadata"]["name"] == "db-replicas"
    assert service["spec"]["selector"][LABEL_ROLE] == ROLE_REPLICA
    assert "wal_log_hints = on" in render.postgresql_conf(instance["spec"])


def test_record_primary_stamps_only_what_changed() -> None:
    status: dict[str, Any] = {}
    record_primary(status, "db-0")
    assert status["currentPrimary"] == status["targetPrimary"] == "db-0"
    status["currentPrimaryTimestamp"] = status["targetPrimaryTimestamp"] = "earlier"
    record_primary(status, "db-0", "pending")
    assert status["currentPrimaryTimestamp"] == "earlier"
    assert status["targetPrimary"] == "pending"
    assert status["targetPrimaryTimestamp"] != "earlier"
