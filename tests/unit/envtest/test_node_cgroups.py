"""The cluster's cleanup touches only what is its own: network namespaces and cgroup trees
named like its nodes (a fake /run/netns and a fake cgroup v1 hierarchy; no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller_runtime.envtest.node import cgroups, network

NOT_OURS = ("crpy-node-x", "crpy-netx", "crpy-node-1-old", "system.slice", "other")


def test_only_our_network_namespaces_are_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network, "NETNS_DIR", tmp_path)
    assert network.namespaces() == [] and not network.exists()
    for name in ("crpy-net", "crpy-node", "crpy-node-1", "crpy-node-12", *NOT_OURS):
        (tmp_path / name).touch()
    assert network.namespaces() == ["crpy-net", "crpy-node", "crpy-node-1", "crpy-node-12"]


@pytest.fixture
def hierarchy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake cgroup v1 root with a ``freezer`` and a ``memory`` hierarchy."""
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    for name in ("freezer", "memory"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text("1\n")
    return tmp_path


def _cgroup(path: Path, *pids: int) -> None:
    path.mkdir(parents=True)
    (path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))


def test_node_trees_are_found_by_name_and_only_theirs(hierarchy: Path) -> None:
    _cgroup(hierarchy / "memory" / "crpy-node-1" / "kubepods" / "pod-a", 10, 11)
    _cgroup(hierarchy / "memory" / "crpy-node-2" / "kubepods" / "pod-b", 20)
    _cgroup(hierarchy / "memory" / "kubepods" / "pod-c", 30)  # an earlier single-node layout
    for name in NOT_OURS:
        _cgroup(hierarchy / "memory" / name, 99)
    assert cgroups.pids_under("crpy-node-1") == [10, 11]
    assert cgroups.pids_under() == [10, 11, 20, 30]
    tops = {path.name for path in cgroups.trees()}
    assert tops == {"crpy-node-1", "crpy-node-2", "kubepods"}
    deepest = cgroups.cgroups("crpy-node-1")
    assert deepest[0].name == "pod-a" and deepest[-1].name == "crpy-node-1"


def test_a_node_is_frozen_and_thawed_through_its_freezer(hierarchy: Path) -> None:
    cgroups.create_root("crpy-node-3")
    assert (hierarchy / "memory" / "crpy-node-3").is_dir()
    state = hierarchy / "freezer" / "crpy-node-3" / "freezer.state"
    state.write_text("THAWED")
    cgroups.freeze("crpy-node-3", timeout=1)
    assert state.read_text() == "FROZEN" and cgroups.is_frozen("crpy-node-3")
    cgroups.thaw_all()
    assert state.read_text() == "THAWED" and not cgroups.is_frozen("crpy-node-3")
    with pytest.raises(cgroups.CgroupError, match="crpy-node-4"):
        cgroups.freeze("crpy-node-4", timeout=1)
