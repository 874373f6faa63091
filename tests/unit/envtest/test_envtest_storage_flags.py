"""``python -m controller_runtime.envtest run --storage ... --storage-override ...``: what the
command line accepts and what it refuses, before anything is started."""

from __future__ import annotations

import pytest

from controller_runtime.envtest.__main__ import _parser, main


def test_the_storage_and_its_overrides_are_parsed() -> None:
    args = _parser().parse_args(
        [
            "run",
            "--storage",
            "kine-sqlite",
            "--storage-override",
            "/events=kine-postgres",
            "--storage-override",
            "coordination.k8s.io/leases=etcd",
        ]
    )
    assert args.storage == "kine-sqlite"
    assert dict(args.storage_overrides) == {
        "/events": "kine-postgres",
        "coordination.k8s.io/leases": "etcd",
    }
    assert _parser().parse_args(["run"]).storage is None  # $CRPY_ENVTEST_STORAGE or etcd


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--storage", "mysql"], "invalid choice"),
        (["run", "--storage-override", "events=kine-sqlite"], "GROUP/RESOURCE"),
        (["run", "--storage-override", "/events=mysql"], "GROUP/RESOURCE"),
        (["run", "--storage-override", "/events"], "GROUP/RESOURCE"),
    ],
)
def test_a_bad_storage_flag_is_refused_with_what_to_write(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_the_node_cluster_keeps_etcd(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--node", "--storage", "kine-sqlite"])
    assert "not supported with --node" in capsys.readouterr().err
