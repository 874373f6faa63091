"""``python -m controller_runtime.envtest run --node -- COMMAND``: the command line and the
command's environment (the cluster itself is started by ``make test-existing``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller_runtime.envtest.__main__ import _parser, command_env, main


def test_the_command_after_the_separator_is_kept_whole() -> None:
    args = _parser().parse_args(["run", "--node", "--", "env", "X=1", "pytest", "-m", "not slow"])
    assert args.node and args.command_line[-5:] == ["env", "X=1", "pytest", "-m", "not slow"]
    assert _parser().parse_args(["run", "--node"]).command_line == []


def test_a_command_needs_the_node(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--", "pytest"])
    assert "needs --node" in capsys.readouterr().err


def test_the_command_gets_the_kubeconfig_and_kubectl_first_on_the_path() -> None:
    env = command_env(
        Path("/work/kubeconfig"), Path("/cache/bin/kubectl"), {"PATH": "/usr/bin", "A": "b"}
    )
    assert env == {"PATH": "/cache/bin:/usr/bin", "A": "b", "KUBECONFIG": "/work/kubeconfig"}
    assert command_env(Path("k"), Path("/x/kubectl"), {})["PATH"] == "/x"


def test_nodes_counts_from_one_to_the_plans_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert _parser().parse_args(["run", "--node"]).nodes == 1
    assert _parser().parse_args(["run", "--node", "--nodes", "3"]).nodes == 3
    for wrong in ("0", "17", "three"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["run", "--node", "--nodes", wrong])
        assert "number of nodes from 1 to 16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--nodes", "3"])
    assert "--nodes needs --node" in capsys.readouterr().err
