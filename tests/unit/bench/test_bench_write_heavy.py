"""The pure parts of the write-heavy scenario: the order of its runs (every run takes every
position once over as many repeats as there are runs, since the API server slows down as a run
goes on) and the request-trace summary (requests in flight over time)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.harness import settings_from, write_heavy_order
from bench.request_trace import in_flight, summarise


def test_write_heavy_order_puts_every_run_in_every_position_once() -> None:
    runs = write_heavy_order(["ours", "go"], [16, 64], 0, limit_watch=32)
    assert sorted(runs, key=str) == sorted(
        [("ours", None), ("go", None), ("limit", 16), ("limit", 64), ("limit-watch", 32)],
        key=str,
    )
    positions: dict[tuple[str, int | None], Counter[int]] = {run: Counter() for run in runs}
    for repeat in range(len(runs)):
        order = write_heavy_order(["ours", "go"], [16, 64], repeat, limit_watch=32)
        assert sorted(order, key=str) == sorted(runs, key=str)
        for position, run in enumerate(order):
            positions[run][position] += 1
    for run, seen in positions.items():
        assert seen == Counter(range(len(runs))), run


def test_write_heavy_order_has_no_limit_watch_unless_asked() -> None:
    order = write_heavy_order(["ours"], [16, 64], 1)
    assert order == [("limit", 16), ("limit", 64), ("ours", None)]


def test_limit_watch_is_off_by_default_and_a_flag_turns_it_on() -> None:
    assert not settings_from(["--scenarios", "write-heavy"]).limit_watch
    assert settings_from(["--scenarios", "write-heavy", "--limit-watch"]).limit_watch


def record(start: float, answered: float, **extra: Any) -> dict[str, Any]:
    return {
        "start": start,
        "answered": answered,
        "kind": "PATCH status",
        "method": "PATCH",
        "status": 200,
        "new_connection": False,
        "sent": 400,
        "received": 1600,
    } | extra


def test_in_flight_weights_each_count_by_its_time() -> None:
    # 0-1 s: one request; 1-2 s: two; 2-3 s: one; 3-4 s: none; 4-5 s: one.
    stats = in_flight(
        [record(0.0, 2.0), record(1.0, 3.0), record(4.0, 5.0)],
    )
    assert stats.window == pytest.approx(5.0)
    assert stats.mean == pytest.approx((1 + 2 + 1 + 0 + 1) / 5)
    assert stats.histogram[2] == pytest.approx(1_000_000, abs=1)
    assert stats.histogram[1] == pytest.approx(3_000_000, abs=1)
    assert stats.histogram[0] == pytest.approx(1_000_000, abs=1)


def test_summary_counts_kinds_connections_and_the_write_rate(tmp_path: Path) -> None:
    trace = tmp_path / "ours-1.jsonl"
    records = [record(i * 0.01, i * 0.01 + 0.02, new_connection=i < 2) for i in range(100)]
    records.append(record(0.0, 0.1, kind="GET", method="GET"))
    trace.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    text = summarise(trace)
    assert "101 requests" in text
    assert "PATCH status 100, GET 1" in text
    assert "new connections: 2" in text
    # 100 writes from 0.00 s to 1.01 s.
    assert "99/s" in text
    assert "in flight, time-weighted mean: 2.0" in text
