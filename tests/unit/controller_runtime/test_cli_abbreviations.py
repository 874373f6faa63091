"""The library's command lines take flags whole: an abbreviation is an error (status 2), not
a guess (``--out`` silently meaning ``--output-dir``), as in ``python -m controllers``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from controller_runtime.__main__ import main as scaffold_main
from controller_runtime.crdgen.__main__ import main as crdgen_main
from controller_runtime.envtest.__main__ import _parser as envtest_parser


def envtest_parse(argv: Sequence[str]) -> object:
    return envtest_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("parse", "argv"),
    [
        (scaffold_main, ["manifests", "--che"]),
        (scaffold_main, ["init", "--dom", "example.com", "--name", "x"]),
        (scaffold_main, ["create", "api", "--gr", "shop", "--version", "v1", "--kind", "W"]),
        (
            scaffold_main,
            ["create", "webhook", "--group", "s", "--version", "v1", "--kind", "W", "--def"],
        ),
        (crdgen_main, ["my_operator.api", "--output", "out"]),
        (envtest_parse, ["run", "--stor", "etcd"]),
        (envtest_parse, ["build", "--ki"]),
    ],
    ids=[
        "manifests",
        "init",
        "create-api",
        "create-webhook",
        "crdgen",
        "envtest-run",
        "envtest-build",
    ],
)
def test_an_abbreviated_flag_is_refused_with_status_2(
    parse: Callable[[Sequence[str]], object],
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # were a flag guessed, nothing lands in the checkout
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "required" in err, err


def test_the_whole_flags_still_parse() -> None:
    args = envtest_parser().parse_args(["run", "--storage", "etcd"])
    assert args.storage == "etcd"
    assert envtest_parser().parse_args(["build", "--kine"]).kine
