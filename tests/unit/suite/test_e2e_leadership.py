"""The end-to-end upgrade test's check that no two operator replicas led at once, on logs
written here: it must catch an overlap, a missing release, and accept a clean handover."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.operator_logs import Leadership, leadership, overlap


def _log(path: Path, *lines: tuple[str, str]) -> Path:
    path.write_text(
        "\n".join(json.dumps({"ts": f"2026-01-02T10:00:{ts}+00:00", "msg": m}) for ts, m in lines)
        + "\nnot json\n"
    )
    return path


def _leaders(tmp_path: Path, old_released: str | None, new_acquired: str) -> list[Leadership]:
    old = [
        ("01.000", "became leader of crpy-system/lease as old_1"),
        ("05.000", "received SIGTERM: shutting down"),
    ]
    if old_released is not None:
        old.append((old_released, "released the lease crpy-system/lease"))
    new = [
        ("02.000", "caches synced"),
        (new_acquired, "became leader of crpy-system/lease as new_1"),
    ]
    found = [
        leadership("old", _log(tmp_path / "old.log", *old)),
        leadership("new", _log(tmp_path / "new.log", *new)),
        leadership("follower", _log(tmp_path / "f.log", ("03.000", "caches synced"))),
    ]
    return [f for f in found if f is not None]


def test_a_handover_after_the_release_is_accepted(tmp_path: Path) -> None:
    leaders = _leaders(tmp_path, "06.000", "06.300")
    assert [x.pod for x in leaders] == ["old", "new"]
    assert overlap(leaders) is None


def test_a_leader_before_the_release_is_an_overlap(tmp_path: Path) -> None:
    problem = overlap(_leaders(tmp_path, "06.000", "05.500"))
    assert problem is not None and "before pod old released" in problem


def test_a_leader_replaced_without_a_release_is_an_overlap(tmp_path: Path) -> None:
    problem = overlap(_leaders(tmp_path, None, "09.000"))
    assert problem is not None and "never logged the release" in problem
