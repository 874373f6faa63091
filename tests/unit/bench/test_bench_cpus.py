"""``--split-cores``: the parsing of SERVER:CLIENT and the pinning of every thread."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.cpus import CoreSplit, parse_split, pin, threads_of
from bench.harness import settings_from

AVAILABLE = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(AVAILABLE) < 2, reason="needs two usable cores")


@needs_two
def test_a_split_names_both_sides() -> None:
    first, second = AVAILABLE[0], AVAILABLE[1]
    split = parse_split(f"{first}:{second}")
    assert split == CoreSplit(frozenset({first}), frozenset({second}))
    assert split.describe() == f"server on cores {first}, clients on cores {second}"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "expected SERVER:CLIENT"),
        ("0:", "both sides need at least one core"),
        (":1", "both sides need at least one core"),
        ("a:1", "cores are integers"),
        ("0:0", "the sides share [0]"),
        ("0:4096", "cores [4096] are not available here"),
    ],
)
def test_a_bad_split_says_what_is_wrong(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match="--split-cores") as raised:
        parse_split(value)
    assert problem in str(raised.value)


def test_the_command_line_refuses_a_bad_split_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        settings_from(["--split-cores", "0:0"])
    assert "the sides share" in capsys.readouterr().err


@needs_two
def test_pinning_reaches_every_thread_of_a_process() -> None:
    """A process with a second thread already running: both end on the given core."""
    code = (
        "import threading, sys\n"
        "e = threading.Event()\n"
        "threading.Thread(target=e.wait, daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        tids = threads_of(child.pid)
        assert len(tids) == 2
        core = frozenset({AVAILABLE[-1]})
        pin([child.pid], core)
        assert [os.sched_getaffinity(t) for t in tids] == [set(core)] * 2
    finally:
        child.communicate("\n")


def test_pinning_skips_a_process_that_is_gone() -> None:
    """A server process that exited between the listing and the pinning is not an error."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    assert threads_of(gone.pid) == [gone.pid]
    pin([gone.pid], frozenset(AVAILABLE[:1]))
