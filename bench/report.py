"""The pure half of the harness: result records, percentiles, the ratio table, the JSON file.

A result is a plain dict (so that it is its own JSON). Required fields:

``scenario`` (str), ``implementation`` (str), ``objects`` (int), ``seconds`` (float),
``per_second`` (float), ``peak_rss_bytes`` (int or ``None``), ``cpu_seconds`` (float or
``None``).

Optional: ``p50_seconds``/``p99_seconds`` (float, churn lag), ``stage`` (str, core),
``complete`` (bool; false when a run timed out, then ``objects_done`` says how far it got),
``server_cpu_seconds`` (API server + etcd during the measured window), ``lag_quantiles``
(101 floats: the lag at 0, 1, ..., 100 %), ``rss_per_object``/``json_per_object`` (core;
``heap_per_object`` for the Go core peer: its live heap after a forced GC, over N),
``concurrency``/``workers``, ``version``, ``note``, ``runs``, ``per_second_runs`` and
``cpu_seconds_runs`` (when a result is the median of several runs: how many, and each run's
``per_second`` and ``cpu_seconds``, in the order they ran; ``rss_per_object_runs`` too where
the runs have it). The restart
scenario adds ``empty_rss_bytes`` (the process's RSS on an empty namespace; ``rss_per_object``
is then peak minus that, over N), ``reconcile_errors`` (of the reconciles counted, those with
``result="error"``, from the last scrape), ``memory_limit`` and ``fetches_on_miss`` (the
``ours-budget`` row's budget, and its ``cache_fetch_on_miss_total`` at the end),
``setup_seconds`` (creating the N reconciled Tasks, not
measured), ``apiserver_rss_bytes``/``etcd_rss_bytes`` (at the end of the row), for its
limit ``list_bytes`` (the LIST's bytes on the wire), ``listed``, ``pages`` and
``page_seconds`` (first, p50, max; with ``--restart-limit-seconds`` the list may stop early),
and for ``ours-sharded`` ``replicas``, ``replica_peak_rss_bytes`` and ``settle``. ``cores``
says how ``--split-cores`` pinned the run. The startup
scenario: ``seconds`` from exec to the first reconcile (to ready at 0 objects; ``per_second``
is its inverse), ``ready_seconds``, ``first_reconcile_seconds``, ``all_reconciled_seconds``,
at 0 objects ``idle_rss_bytes`` and ``reconcile_after_create_seconds``, and for the Python
programs ``import_seconds`` (``python -X importtime`` summed per top-level package).

Ratios are always ours / peer of the same figure, so their reading depends on the figure:
for ``per_second`` above 1 means ours is faster; for seconds, RSS, CPU and lag below 1 means
ours is better.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Result = dict[str, Any]

OURS = "ours"
"""The implementation name of this project's runtime in every scenario."""

NOT_PEERS = ("mirror", "ours-sharded", "ours-echoes")
"""Rows of ours beside ours (the startup scenario's docs mirror controller, the restart
scenario's sharded replicas): no ratio of ours to them."""

REQUIRED: dict[str, tuple[type, ...]] = {
    "scenario": (str,),
    "implementation": (str,),
    "objects": (int,),
    "seconds": (int, float),
    "per_second": (int, float),
    "peak_rss_bytes": (int, type(None)),
    "cpu_seconds": (int, float, type(None)),
}
OPTIONAL: dict[str, tuple[type, ...]] = {
    "p50_seconds": (int, float),
    "p99_seconds": (int, float),
    "stage": (str,),
    "complete": (bool,),
    "objects_done": (int,),
    "reconcile_errors": (int,),
    "fetches_on_miss": (int,),
    "server_cpu_seconds": (int, float, type(None)),
    "lag_quantiles": (list,),
    "rss_per_object": (int, float),
    "json_per_object": (int, float),
    "concurrency": (int,),
    "workers": (int,),
    "rounds": (int,),
    "version": (str,),
    "note": (str,),
    "runs": (int,),
    "per_second_runs": (list,),
    "cpu_seconds_runs": (list,),
    "rss_per_object_runs": (list,),
    "empty_rss_bytes": (int,),
    "list_bytes": (int,),
    "setup_seconds": (int, float),
    "heap_per_object": (int, float),
    "ready_seconds": (int, float),
    "first_reconcile_seconds": (int, float),
    "all_reconciled_seconds": (int, float),
    "idle_rss_bytes": (int,),
    "reconcile_after_create_seconds": (int, float),
    "import_seconds": (dict,),
    "replicas": (int,),
    "replica_peak_rss_bytes": (list,),
    "replica_cached_objects": (list,),
    "etcd_rss_bytes": (int,),
    "apiserver_rss_bytes": (int,),
    "cores": (str,),
    "listed": (int,),
    "pages": (int, type(None)),
    "page_seconds": (dict, type(None)),
    "settle": (int, float, type(None)),
}

SCENARIO_ORDER = ("sync", "churn", "write-heavy", "restart", "startup", "core")

RESTART_NOTE = (
    "restart: kopf is left out (it serves no reconcile counter, and with nothing to write "
    "nothing outside shows it is done; at ~80 KiB/object it would need ~8 GiB at 100k). "
    "limit = a plain paginated LIST (500/page) decoded with orjson."
)


class SchemaError(ValueError):
    """A result does not have the documented shape."""


def validate(result: Mapping[str, Any]) -> None:
    """Raise :class:`SchemaError` unless ``result`` has every required field with the
    right type, and optional fields (when present) of the right type. Unknown extra fields
    are allowed."""
    for name, types in REQUIRED.items():
        if name not in result:
            raise SchemaError(f"missing field {name!r} in {dict(result)!r}")
        value = result[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise SchemaError(f"field {name!r} has type {type(value).__name__}")
    for name, types in OPTIONAL.items():
        if name in result and not (
            isinstance(result[name], types)
            and (bool in types or not isinstance(result[name], bool))
        ):
            raise SchemaError(f"field {name!r} has type {type(result[name]).__name__}")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default). Raises ``ValueError`` for no values or ``q`` outside 0..100."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def quantiles(values: Sequence[float]) -> list[float]:
    """The 101 percentiles 0, 1, ..., 100 of ``values`` (for CDF plots), in one sort."""
    ordered = sorted(values)
    out = []
    for q in range(101):
        position = (len(ordered) - 1) * q / 100
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
    return out


def ratio(ours: float | None, peer: float | None) -> float | None:
    """ours / peer, or ``None`` when either is missing or the peer is zero."""
    if ours is None or peer is None or peer == 0:
        return None
    return ours / peer


def median_of_runs(results: Iterable[Mapping[str, Any]]) -> list[Result]:
    """One result per (scenario, stage, objects, implementation): the run with the median
    ``per_second`` (the lower middle one of an even count), with ``runs``,
    ``per_second_runs`` and ``cpu_seconds_runs`` (and ``rss_per_object_runs`` where every run
    has it) added when there was more than one. Order of first appearance."""
    runs: dict[tuple[str, str | None, int, str], list[Result]] = {}
    for result in results:
        runs.setdefault((*_key(result), result["implementation"]), []).append(dict(result))
    out = []
    for members in runs.values():
        if len(members) == 1:
            out.append(members[0])
            continue
        ordered = sorted(members, key=lambda r: r["per_second"])
        chosen = dict(ordered[(len(ordered) - 1) // 2])
        chosen["runs"] = len(members)
        chosen["per_second_runs"] = [r["per_second"] for r in members]
        # CPU seconds are the steadier figure on a loaded machine: every run's, not only the
        # median-rate run's.
        chosen["cpu_seconds_runs"] = [r["cpu_seconds"] for r in members]
        if all("rss_per_object" in r for r in members):
            chosen["rss_per_object_runs"] = [r["rss_per_object"] for r in members]
        out.append(chosen)
    return out


def _key(result: Mapping[str, Any]) -> tuple[str, str | None, int]:
    return (result["scenario"], result.get("stage"), result["objects"])


def group(results: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str | None, int], list[Result]]:
    """Results by (scenario, stage, objects), in scenario order, then first appearance."""
    groups: dict[tuple[str, str | None, int], list[Result]] = {}
    for result in results:
        groups.setdefault(_key(result), []).append(dict(result))

    def order(key: tuple[str, str | None, int]) -> tuple[int, int]:
        scenario = key[0]
        rank = SCENARIO_ORDER.index(scenario) if scenario in SCENARIO_ORDER else len(SCENARIO_ORDER)
        return rank, key[2]

    return {key: groups[key] for key in sorted(groups, key=order)}


def ratio_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each (scenario, stage, objects) with an ``ours`` result: one row per other
    implementation with the ratios ours / it of per_second, peak RSS, CPU seconds and (when
    both have it) p99 lag."""
    rows: list[dict[str, Any]] = []
    by_core_objects: dict[int, Result] = {}
    for result in results:
        if result["scenario"] == "core" and result.get("stage") == "decode":
            by_core_objects[result["objects"]] = dict(result)
    for (scenario, stage, objects), members in group(results).items():
        ours = [m for m in members if m["implementation"] == OURS]
        if not ours:
            continue
        mine = ours[0]
        peers = [m for m in members if m["implementation"] not in (OURS, *NOT_PEERS)]
        if scenario == "core" and objects in by_core_objects:
            peers.append(by_core_objects[objects])  # every core stage against orjson alone
        for peer in peers:
            rows.append(
                {
                    "scenario": scenario,
                    "stage": stage,
                    "objects": objects,
                    "versus": peer["implementation"],
                    "per_second": ratio(mine["per_second"], peer["per_second"]),
                    # The decode stage's peak RSS is mostly the body it holds.
                    "peak_rss": None
                    if peer.get("stage") == "decode"
                    else ratio(mine["peak_rss_bytes"], peer["peak_rss_bytes"]),
                    "cpu": ratio(mine["cpu_seconds"], peer["cpu_seconds"]),
                    "p99": ratio(mine.get("p99_seconds"), peer.get("p99_seconds")),
                    "bytes_per_object": ratio(
                        mine.get("rss_per_object") or None, peer.get("rss_per_object") or None
                    ),
                }
            )
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """The results table and the ratio table, as fixed-width text (Markdown-compatible)."""
    lines = [
        "| scenario | stage | impl | objects | seconds | per second | p50 ms | p99 ms "
        "| peak RSS MiB | CPU s | server CPU s | B/object | runs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for members in group(results).values():
        for r in members:
            mark = "" if r.get("complete", True) else " (incomplete)"
            lines.append(
                f"| {r['scenario']} | {r.get('stage') or ''} | {r['implementation']}{mark} "
                f"| {r['objects']} | {r['seconds']:.2f} | {r['per_second']:,.0f} "
                f"| {_ms(r.get('p50_seconds'))} | {_ms(r.get('p99_seconds'))} "
                f"| {_mib(r['peak_rss_bytes'])} | {_fmt(r['cpu_seconds'], '.2f')} "
                f"| {_fmt(r.get('server_cpu_seconds'), '.2f')} "
                f"| {_fmt(r.get('rss_per_object') or None, '.0f')} | {r.get('runs', 1)} |"
            )
    if any(r["scenario"] == "restart" for r in results):
        lines += ["", RESTART_NOTE]
    rows = ratio_rows(results)
    if rows:
        lines += [
            "",
            "Ratios ours / peer (per second: >1 = ours faster; RSS, CPU, p99: <1 = ours better)",
            "",
            "| scenario | stage | objects | ours / | per second | peak RSS | CPU s | p99 lag "
            "| B/object |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            lines.append(
                f"| {row['scenario']} | {row['stage'] or ''} | {row['objects']} "
                f"| {row['versus']} | {_fmt(row['per_second'], '.2f')} "
                f"| {_fmt(row['peak_rss'], '.2f')} | {_fmt(row['cpu'], '.2f')} "
                f"| {_fmt(row['p99'], '.2f')} | {_fmt(row['bytes_per_object'], '.2f')} |"
            )
    return "\n".join(lines)


def write_json(path: Path, results: Sequence[Mapping[str, Any]]) -> None:
    """Validate every result, then write the list (indented, keys in insertion order)."""
    for result in results:
        validate(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(results), indent=2) + "\n")


def read_json(path: Path) -> list[Result]:
    """Read and validate a results file."""
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise SchemaError("a results file holds a JSON list")
    for result in data:
        validate(result)
    return data
