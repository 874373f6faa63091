"""The replication parts of the rendered instance: the entrypoint (the supervisor) and
synchronous mode in postgresql.conf."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from controllers.postgres import render
from controllers.postgres.api import LABEL_ROLE, ROLE_REPLICA
from controllers.postgres.supervisor import SCRIPT as SUPERVISOR


def test_the_supervisor_is_valid_bash() -> None:
    # Its behaviour is tested against real PostgreSQL:
    # tests/integration/postgres/test_ha_members.py.
    result = subprocess.run(["bash", "-n"], input=SUPERVISOR, text=True, check=False)
    assert result.returncode == 0, result.stderr


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
