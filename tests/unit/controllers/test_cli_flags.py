"""The operator's flags are taken whole: an abbreviation is an error, not a guess."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from controllers.cli import parser, settings_from
from controllers.dev import dev_parser


@pytest.mark.parametrize("make", [parser, dev_parser], ids=["controllers", "controllers.dev"])
@pytest.mark.parametrize(
    "argv",
    [
        ["--metrics-bind", "1"],  # once silently --metrics-bind-address 1
        ["--health-probe", "0"],
        ["--namespace=a", "--leader-el"],
        ["--kube", "/tmp/x"],
    ],
)
def test_an_abbreviated_flag_is_refused_with_status_2(
    make: Callable[[], argparse.ArgumentParser], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        settings_from(argv, p=make())
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("make", [parser, dev_parser], ids=["controllers", "controllers.dev"])
def test_the_whole_flags_still_work(make: Callable[[], argparse.ArgumentParser]) -> None:
    settings = settings_from(
        ["--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address=0"],
        p=make(),
    )
    assert settings.metrics_bind_address == "127.0.0.1:0"
    assert settings.health_probe_bind_address in (None, "0")


@pytest.mark.parametrize("argv", [["--kube", "/tmp/x"], ["--time", "5"], ["--cont", "c"]])
def test_the_migration_job_refuses_abbreviations_too(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from controllers.migrate import main  # noqa: PLC0415

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err
