"""PNG plots of a results list (matplotlib, Agg backend: no display needed).

- ``<scenario>.png`` for sync, churn and write-heavy: per implementation, bars of per second,
  peak RSS and CPU seconds;
- ``churn-lag-cdf.png``: the distribution of churn lag per implementation (log time axis);
- ``core.png``: events per second and RSS per cached object of each core stage and size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

COLOURS = {"ours": "#1f77b4", "go": "#2ca02c", "kopf": "#d62728", "limit": "#7f7f7f"}


def _bars(ax: Any, labels: Sequence[str], values: Sequence[float], title: str) -> None:
    colours = [COLOURS.get(label.split(" ")[0], "#9467bd") for label in labels]
    bars = ax.bar(labels, values, color=colours)
    ax.set_title(title)
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(
            f"{value:,.0f}" if value >= 10 else f"{value:.2f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )


def _scenario_plot(scenario: str, results: Sequence[Mapping[str, Any]], path: Path) -> None:
    labels = [r["implementation"] for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    unit = {"sync": "Tasks/s", "churn": "updates/s", "write-heavy": "writes/s"}[scenario]
    _bars(axes[0], labels, [r["per_second"] for r in results], f"{unit} (higher is better)")
    _bars(
        axes[1],
        labels,
        [(r["peak_rss_bytes"] or 0) / 2**20 for r in results],
        "peak RSS, MiB",
    )
    _bars(axes[2], labels, [r["cpu_seconds"] or 0 for r in results], "CPU seconds")
    objects = results[0]["objects"]
    fig.suptitle(f"{scenario}, {objects} Tasks, one process per implementation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _lag_cdf(results: Sequence[Mapping[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        quantiles = r.get("lag_quantiles")
        if not quantiles:
            continue
        name = r["implementation"]
        ax.plot(
            [max(q, 1e-4) for q in quantiles],
            [i / 100 for i in range(len(quantiles))],
            label=name,
            color=COLOURS.get(name),
        )
    ax.set_xscale("log")
    ax.set_xlabel("lag from the loader's write to the status written, seconds")
    ax.set_ylabel("fraction of updates")
    ax.set_title("churn: reconcile lag (CDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _core_plot(results: Sequence[Mapping[str, Any]], path: Path) -> None:
    labels = [f"{r.get('stage')}\n{r['objects']:,}" for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    colours = [COLOURS.get(r["implementation"], "#9467bd") for r in results]
    axes[0].bar(labels, [r["per_second"] for r in results], color=colours)
    axes[0].set_title("events/s (decode = orjson alone, the limit)")
    axes[1].bar(labels, [r.get("rss_per_object", 0) for r in results], color=colours)
    axes[1].set_title("RSS per cached object, bytes")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle("core: decode -> store -> queue -> no-op reconcile, in process")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(results: Sequence[Mapping[str, Any]], directory: Path) -> list[Path]:
    """Write every plot the results allow into ``directory``; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for scenario in ("sync", "churn", "write-heavy"):
        members = [r for r in results if r["scenario"] == scenario]
        if members:
            path = directory / f"{scenario}.png"
            _scenario_plot(scenario, members, path)
            written.append(path)
    churned = [r for r in results if r["scenario"] == "churn" and r.get("lag_quantiles")]
    if churned:
        path = directory / "churn-lag-cdf.png"
        _lag_cdf(churned, path)
        written.append(path)
    core = [r for r in results if r["scenario"] == "core"]
    if core:
        path = directory / "core.png"
        _core_plot(core, path)
        written.append(path)
    return written


STORAGE_COLOURS = {"etcd": "#1f77b4", "kine-sqlite": "#ff7f0e", "kine-postgres": "#9467bd"}


def write_storage_plots(results: Sequence[Mapping[str, Any]], directory: Path) -> list[Path]:
    """``storage.png``: per backend against the object count, the create rate, the LIST time,
    the page p99, memory (API server, storage) and disk; ``storage-watch-lag-cdf.png``: the
    watch latency under churn. The paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ladder = [r for r in results if r["scenario"] == "storage-ladder"]
    if ladder:
        panels = [
            ("create_per_second", "creates per second", 1.0),
            ("list_seconds", "paginated LIST, seconds", 1.0),
            ("page_p99_seconds", "LIST page p99, ms", 1000.0),
            ("apiserver_rss_bytes", "API server RSS, MiB", 1 / 2**20),
            ("storage_total_bytes", "storage memory, MiB", 1 / 2**20),
            ("disk_bytes", "disk, MiB", 1 / 2**20),
        ]
        fig, axes = plt.subplots(2, 3, figsize=(14, 7))
        for ax, (field, title, scale) in zip(axes.flat, panels, strict=True):
            for backend in dict.fromkeys(r["backend"] for r in ladder):
                rows = [r for r in ladder if r["backend"] == backend]
                xs = [r["objects"] for r in rows]
                if field == "storage_total_bytes":
                    ys = [
                        ((r["storage_rss_bytes"] or 0) + (r["postgres_pss_bytes"] or 0)) * scale
                        for r in rows
                    ]
                else:
                    ys = [(r[field] or 0) * scale for r in rows]
                ax.plot(xs, ys, marker="o", label=backend, color=STORAGE_COLOURS.get(backend))
                if field == "disk_bytes" and all(r.get("db_bytes") is not None for r in rows):
                    ax.plot(
                        xs,
                        [r["db_bytes"] * scale for r in rows],
                        marker="o",
                        linestyle="--",
                        label=f"{backend} (bbolt file)",
                        color=STORAGE_COLOURS.get(backend),
                    )
                    ax.legend(fontsize=7)
            ax.set_xscale("log")
            ax.set_title(title)
            ax.set_xlabel("Tasks")
        axes.flat[0].legend()
        fig.tight_layout()
        path = directory / "storage.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    lagged = [r for r in results if r["scenario"] == "storage-watch" and r.get("lag_quantiles")]
    if lagged:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in lagged:
            qs = r["lag_quantiles"]
            ax.plot(
                [q * 1000 for q in qs],
                range(len(qs)),
                label=r["backend"],
                color=STORAGE_COLOURS.get(r["backend"]),
            )
        ax.set_xscale("log")
        ax.set_xlabel("PATCH sent to watch event, ms")
        ax.set_ylabel("percentile")
        ax.set_title("watch latency under churn")
        ax.legend()
        fig.tight_layout()
        path = directory / "storage-watch-lag-cdf.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
