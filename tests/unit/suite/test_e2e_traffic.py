"""The end-to-end application's log, read back (tests/e2e/traffic.py): acknowledgements,
errors and samples; the write gap around a fault; samples with two writable members. Also:
the application's script compiles."""

from __future__ import annotations

from tests.e2e.traffic import SCRIPT, double_primaries, errors_between, parse, write_gap

LOG = """\
ack 1 100.000
ack 2 100.100
sample 100.150 db-0
err 100.300 terminating connection due to administrator command
ack 4 102.800
sample 102.900 db-0,db-1
partial line
ack 5 10
ack x 1.0
ack 6 103.000
sample 103.100
"""


def test_the_log_is_read_back() -> None:
    log = parse(LOG)
    assert log.acks == [(1, 100.0), (2, 100.1), (4, 102.8), (5, 10.0), (6, 103.0)]
    assert log.errors == [(100.3, "terminating connection due to administrator command")]
    assert log.samples == [(100.15, ("db-0",)), (102.9, ("db-0", "db-1")), (103.1, ())]
    assert log.acked_ids() == {1, 2, 4, 5, 6}
    assert log.acked_after(100.05) == 3


def test_the_write_gap_runs_from_the_last_ack_before_the_fault() -> None:
    log = parse(LOG)
    assert abs(write_gap(log, 100.2) - 2.7) < 1e-9  # 100.1 -> 102.8
    assert abs(write_gap(log, 100.2, until=102.5) - 0.0) < 1e-9
    assert abs(write_gap(parse(""), 5.0)) < 1e-9
    assert abs(write_gap(parse("ack 1 7.5"), 5.0) - 2.5) < 1e-9  # nothing before: from the fault


def test_two_writable_members_in_one_sample_are_found() -> None:
    assert double_primaries(parse(LOG)) == [(102.9, ("db-0", "db-1"))]
    assert errors_between(parse(LOG), 100, 101) == {
        "terminating connection due to administrator command": 1
    }


def test_the_application_script_compiles() -> None:
    compile(SCRIPT, "app", "exec")
