"""The pure parts of the benchmark harness: percentiles, the ratio table, the JSON schema, and
the write-heavy stamp. No control plane, no plotting."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.core import core_runs
from bench.runners.stamp import bench_count, stamped
from bench.scrape import Progress, parse


def result(implementation: str, scenario: str = "sync", **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "scenario": scenario,
        "implementation": implementation,
        "objects": 1000,
        "seconds": 2.0,
        "per_second": 500.0,
        "peak_rss_bytes": 100 * 2**20,
        "cpu_seconds": 1.0,
    }
    return base | extra


# -- percentiles -------------------------------------------------------------------------------


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert report.percentile(values, 0) == 1.0
    assert report.percentile(values, 100) == 4.0
    assert report.percentile(values, 50) == pytest.approx(2.5)
    assert report.percentile(values, 99) == pytest.approx(3.97)


def test_percentile_ignores_order_and_handles_one_value() -> None:
    assert report.percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert report.percentile([7.0], 99) == 7.0


def test_percentile_rejects_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        report.percentile([], 50)
    with pytest.raises(ValueError):
        report.percentile([1.0], 101)


def test_quantiles_are_101_monotonic_values_matching_percentile() -> None:
    values = [float(v) for v in range(1000, 0, -7)]
    quantiles = report.quantiles(values)
    assert len(quantiles) == 101
    assert quantiles == sorted(quantiles)
    for q in (0, 50, 99, 100):
        assert quantiles[q] == pytest.approx(report.percentile(values, q))


# -- ratios ------------------------------------------------------------------------------------


def test_ratio_rows_compare_ours_with_each_peer() -> None:
    results = [
        result("ours", per_second=500.0, peak_rss_bytes=100, cpu_seconds=2.0),
        result("go", per_second=1000.0, peak_rss_bytes=50, cpu_seconds=1.0),
        result("kopf", per_second=250.0, peak_rss_bytes=200, cpu_seconds=4.0),
    ]
    rows = {row["versus"]: row for row in report.ratio_rows(results)}
    assert set(rows) == {"go", "kopf"}
    assert rows["go"]["per_second"] == pytest.approx(0.5)
    assert rows["go"]["peak_rss"] == pytest.approx(2.0)
    assert rows["go"]["cpu"] == pytest.approx(2.0)
    assert rows["kopf"]["per_second"] == pytest.approx(2.0)
    assert rows["kopf"]["p99"] is None


def test_ratio_rows_use_p99_and_tolerate_missing_figures() -> None:
    results = [
        result("ours", "churn", p99_seconds=0.2, cpu_seconds=None),
        result("go", "churn", p99_seconds=0.1),
    ]
    (row,) = report.ratio_rows(results)
    assert row["p99"] == pytest.approx(2.0)
    assert row["cpu"] is None


def test_ratio_rows_skip_scenarios_without_ours() -> None:
    assert report.ratio_rows([result("go"), result("kopf")]) == []


def test_core_stages_are_compared_with_decoding_alone() -> None:
    results = [
        result("limit", "core", stage="decode", objects=100, per_second=1000.0),
        result("ours", "core", stage="informer", objects=100, per_second=500.0),
        result("ours", "core", stage="controller", objects=100, per_second=250.0),
    ]
    rows = report.ratio_rows(results)
    assert [(r["stage"], r["versus"]) for r in rows] == [
        ("informer", "limit"),
        ("controller", "limit"),
    ]
    assert [r["per_second"] for r in rows] == [pytest.approx(0.5), pytest.approx(0.25)]


def test_core_stages_are_compared_with_client_go_and_decoding_alone() -> None:
    results = [
        result("limit", "core", stage="decode", objects=100, per_second=1000.0),
        result(
            "ours", "core", stage="informer", objects=100, per_second=600.0, rss_per_object=900.0
        ),
        result(
            "go", "core", stage="informer", objects=100, per_second=400.0, rss_per_object=3000.0
        ),
    ]
    rows = {row["versus"]: row for row in report.ratio_rows(results)}
    assert set(rows) == {"go", "limit"}
    assert rows["go"]["per_second"] == pytest.approx(1.5)
    assert rows["go"]["bytes_per_object"] == pytest.approx(0.3)
    assert rows["go"]["peak_rss"] == pytest.approx(1.0)
    assert rows["limit"]["per_second"] == pytest.approx(0.6)
    # The decode stage keeps nothing and holds the whole body: neither ratio means anything.
    assert rows["limit"]["bytes_per_object"] is None
    assert rows["limit"]["peak_rss"] is None
    assert "| core | informer | 100 | go | 1.50 | 1.00 |" in report.format_table(results)


def test_the_mirror_controller_is_no_peer_of_ours() -> None:
    results = [
        result("ours", "startup", objects=0, seconds=0.4, per_second=2.5),
        result("go", "startup", objects=0, seconds=0.1, per_second=10.0),
        result("mirror", "startup", objects=0, seconds=0.5, per_second=2.0),
    ]
    rows = report.ratio_rows(results)
    assert [(r["versus"], r["per_second"]) for r in rows] == [("go", pytest.approx(0.25))]


def test_import_breakdown_sums_self_time_per_package() -> None:
    from bench.startup import import_breakdown  # noqa: PLC0415

    lines = [
        "import time: self [us] | cumulative | imported package",
        "import time:       100 |        100 |     aiohttp.http",
        "import time:       300 |        400 |   aiohttp",
        "import time:        50 |         50 | orjson",
        "not an importtime line",
    ]
    parts = import_breakdown(lines, top=1)
    assert parts == {
        "aiohttp": pytest.approx(0.0004),
        "(rest)": pytest.approx(0.00005),
        "(total)": pytest.approx(0.00045),
    }


def test_core_runs_rotate_and_decode_has_only_the_limit() -> None:
    first = core_runs(("decode", "informer"), ("ours", "go"), 0)
    assert first == [("decode", "limit"), ("informer", "ours"), ("informer", "go")]
    rounds = [core_runs(("decode", "informer"), ("ours", "go"), r) for r in range(3)]
    assert {tuple(r) for r in rounds} == {tuple(first[i:] + first[:i]) for i in range(3)}
    # Over as many rounds as runs, every run takes every place once.
    for place in range(3):
        assert {r[place] for r in rounds} == set(first)


def test_ratio_of_zero_or_missing_peer_is_none() -> None:
    assert report.ratio(1.0, 0.0) is None
    assert report.ratio(None, 1.0) is None
    assert report.ratio(3.0, 1.5) == 2.0


def test_table_orders_scenarios_and_shows_ratios() -> None:
    results = [
        result("ours", "write-heavy"),
        result("limit", "write-heavy", per_second=1000.0),
        result("ours", "sync"),
        result("kopf", "sync", complete=False, objects_done=10),
    ]
    table = report.format_table(results)
    lines = table.splitlines()
    sync_at = next(i for i, line in enumerate(lines) if line.startswith("| sync |"))
    heavy_at = next(i for i, line in enumerate(lines) if line.startswith("| write-heavy |"))
    assert sync_at < heavy_at
    assert "kopf (incomplete)" in table
    assert "| write-heavy |  | 1000 | limit | 0.50 |" in table


# -- the JSON schema ---------------------------------------------------------------------------


def test_validate_accepts_documented_shape() -> None:
    report.validate(result("ours", "churn", p50_seconds=0.01, p99_seconds=0.1))
    report.validate(result("limit", "core", stage="decode", peak_rss_bytes=None))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("objects", 1.5),
        ("objects", True),
        ("seconds", "2"),
        ("peak_rss_bytes", 1.0),
        ("scenario", None),
    ],
)
def test_validate_rejects_wrong_types(field: str, value: Any) -> None:
    with pytest.raises(report.SchemaError):
        report.validate(result("ours") | {field: value})


def test_validate_rejects_missing_and_wrong_optional_fields() -> None:
    broken = result("ours")
    del broken["cpu_seconds"]
    with pytest.raises(report.SchemaError, match="cpu_seconds"):
        report.validate(broken)
    with pytest.raises(report.SchemaError, match="p99_seconds"):
        report.validate(result("ours", p99_seconds="slow"))
    with pytest.raises(report.SchemaError, match="complete"):
        report.validate(result("ours", complete=1))


def test_json_round_trip(tmp_path: Path) -> None:
    results = [result("ours"), result("go", "churn", p50_seconds=0.01, p99_seconds=0.02)]
    path = tmp_path / "out" / "results.json"
    report.write_json(path, results)
    assert json.loads(path.read_text()) == results
    assert report.read_json(path) == results


def test_write_json_refuses_invalid_results(tmp_path: Path) -> None:
    with pytest.raises(report.SchemaError):
        report.write_json(tmp_path / "x.json", [{"scenario": "sync"}])
    assert not (tmp_path / "x.json").exists()


# -- the write-heavy stamp ---------------------------------------------------------------------


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_stamp_counts_writes_of_this_run_only() -> None:
    first = stamped({}, None, stamp="run1", rounds=2, generation=1, now=NOW)
    assert first is not None
    assert bench_count(first, "run1") == 1
    assert bench_count(first, "run2") == 0
    second = stamped(dict(first), first, stamp="run1", rounds=2, generation=1, now=NOW)
    assert second is not None
    assert bench_count(second, "run1") == 2
    assert stamped({}, second, stamp="run1", rounds=2, generation=1, now=NOW) is None
    again = stamped({}, second, stamp="run2", rounds=2, generation=1, now=NOW)
    assert again is not None
    assert bench_count(again, "run2") == 1


def test_median_of_runs_keeps_the_middle_run_and_all_rates() -> None:
    runs = [
        result("ours", per_second=300.0, seconds=3.0, cpu_seconds=0.7),
        result("go", per_second=100.0),
        result("ours", per_second=100.0, seconds=1.0, cpu_seconds=0.9),
        result("ours", per_second=200.0, seconds=2.0, cpu_seconds=0.8, rss_per_object=800.0),
    ]
    merged = report.median_of_runs(runs)
    assert [r["implementation"] for r in merged] == ["ours", "go"]
    ours = merged[0]
    assert ours["seconds"] == 2.0
    assert ours["runs"] == 3
    assert ours["per_second_runs"] == [300.0, 100.0, 200.0]
    assert ours["cpu_seconds_runs"] == [0.7, 0.9, 0.8]  # every run's, in order
    assert "rss_per_object_runs" not in ours  # not every run has one
    assert "runs" not in merged[1]
    report.validate(ours)


# -- the restart scenario's scrape ------------------------------------------------------------

OURS_EXPOSITION = b"""# HELP workqueue_depth Current depth of workqueue
# TYPE workqueue_depth gauge
workqueue_depth{name="task",controller="task",priority="0"} 3.0
workqueue_depth{name="other",controller="other",priority="0"} 9.0
# HELP controller_runtime_reconcile_total Total number of reconciliations per controller
# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="task",result="success"} 95.0
controller_runtime_reconcile_total{controller="task",result="error"} 5.0
controller_runtime_reconcile_total{controller="task",result="requeue"} 0.0
controller_runtime_reconcile_total{controller="other",result="success"} 1000.0
controller_runtime_reconcile_created{controller="task",result="success"} 1.7e9
cache_fetch_on_miss_total{group="tasks.crpy.io",kind="Task"} 40.0
cache_fetch_on_miss_total{group="",kind="ConfigMap"} 2.0
"""

GO_EXPOSITION = b"""controller_runtime_reconcile_total{controller="task",result="error"} 0
controller_runtime_reconcile_total{controller="task",result="requeue"} 0
controller_runtime_reconcile_total{controller="task",result="requeue_after"} 0
controller_runtime_reconcile_total{controller="task",result="success"} 100
workqueue_depth{controller="task",name="task"} 0
"""


def test_scrape_sums_one_controllers_reconciles_over_results_and_its_queue_depth() -> None:
    progress = parse(OURS_EXPOSITION, "task")
    assert progress == Progress(reconciles=100.0, depth=3.0, started=True, errors=5.0, fetches=42.0)
    assert not progress.done(100)  # items are still queued
    assert parse(GO_EXPOSITION, "task") == Progress(100.0, 0.0, started=True)
    assert parse(GO_EXPOSITION, "task").done(100)
    assert not parse(GO_EXPOSITION, "task").done(101)


def test_scrape_is_not_started_before_the_controllers_counters_exist() -> None:
    # An empty queue of ours has no depth series: that counts as depth 0, but only once the
    # reconcile counters show the controller exists.
    empty = b"# HELP workqueue_depth Current depth of workqueue\n# TYPE workqueue_depth gauge\n"
    assert parse(empty, "task") == Progress(0.0, 0.0, started=False)
    assert not parse(empty, "task").done(0)
    counters = empty + b'controller_runtime_reconcile_total{controller="task",result="success"} 0\n'
    assert parse(counters, "task").done(0)


def test_scrape_rejects_a_broken_value() -> None:
    with pytest.raises(ValueError, match="could not convert"):
        parse(b'workqueue_depth{name="task",controller="task"} many\n', "task")


def test_restart_fields_are_part_of_the_schema() -> None:
    good = result("ours", "restart", empty_rss_bytes=80 * 2**20, setup_seconds=12.5)
    report.validate(good)
    with pytest.raises(report.SchemaError, match="empty_rss_bytes"):
        report.validate(result("ours", "restart", empty_rss_bytes="80 MiB"))
    table = report.format_table([good, result("limit", "restart", list_bytes=10)])
    assert "kopf is left out" in table
    assert "| restart |  | 1000 | limit | 1.00 |" in table
