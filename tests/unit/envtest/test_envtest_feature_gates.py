"""Feature gates of the local control plane: the API server flag and the command line."""

from __future__ import annotations

import pytest

from controller_runtime.envtest.__main__ import _parser
from controller_runtime.envtest.controlplane import feature_gate_args


def test_gates_become_one_sorted_feature_gates_flag() -> None:
    assert feature_gate_args({}) == {}
    assert feature_gate_args({"ShardedListAndWatch": True, "AnotherGate": False}) == {
        "--feature-gates": "AnotherGate=false,ShardedListAndWatch=true"
    }


def test_the_command_line_takes_repeated_gates() -> None:
    args = _parser().parse_args(
        ["run", "--feature-gate", "ShardedListAndWatch=true", "--feature-gate", "X=False"]
    )
    assert dict(args.feature_gates) == {"ShardedListAndWatch": True, "X": False}


@pytest.mark.parametrize("bad", ["ShardedListAndWatch", "=true", "Gate=yes"])
def test_a_malformed_gate_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--feature-gate", bad])
    assert "NAME=true or NAME=false" in capsys.readouterr().err
