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
