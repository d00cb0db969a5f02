"""PNG plots of the suite's results (matplotlib, the ``bench`` extra).

Every suite report carries a ``plot`` section — a grouped bar chart: ``groups`` on the x axis,
one bar per ``series`` (contender) in each group at its median, the whisker spanning the
series' ``low``–``high`` (p10–p90 unless the report says otherwise), and an optional target
line. ``plot_report`` draws one report; ``python -m bench.plot`` redraws every suite report
in ``bench/results`` and the combined ``suite.png`` that docs/benchmarks.md shows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR, say

SUITE = ("throughput", "streaming", "cancel_latency", "client_memory", "humaneval")
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        say("bench.plot: matplotlib is not installed (pip install -e '.[bench]'); no PNG")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(ax: Any, plot: dict[str, Any]) -> None:
    """One grouped bar chart on ``ax`` from a report's ``plot`` section."""
    groups: list[str] = plot["groups"]
    series: list[dict[str, Any]] = plot["series"]
    width = 0.8 / max(len(series), 1)
    for index, entry in enumerate(series):
        xs = [g + (index - (len(series) - 1) / 2) * width for g in range(len(groups))]
        medians = entry["median"]
        lows = [
            m - lo if m is not None and lo is not None else 0
            for m, lo in zip(medians, entry.get("low", medians), strict=True)
        ]
        highs = [
            hi - m if m is not None and hi is not None else 0
            for m, hi in zip(medians, entry.get("high", medians), strict=True)
        ]
        heights = [m if m is not None else 0 for m in medians]
        ax.bar(
            xs,
            heights,
            width,
            yerr=[lows, highs],
            capsize=3,
            label=entry["label"],
            color=COLOURS[index % len(COLOURS)],
        )
        for x, m in zip(xs, medians, strict=True):
            if m is not None:
                ax.annotate(
                    f"{m:.3g}",
                    (x, m),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(plot["ylabel"])
    ax.set_title(plot["title"], fontsize=10)
    target = plot.get("target")
    if target:
        ax.axhline(target["value"], color="#d62728", linestyle="--", linewidth=1)
        ax.annotate(
            target["label"],
            (1.0, target["value"]),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize=7,
            color="#d62728",
        )
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def plot_report(report: dict[str, Any], path: Path) -> bool:
    """Draw ``report``'s plot to ``path`` (PNG); False if there is nothing to draw or no
    matplotlib."""
    plot = report.get("plot")
    if not plot or not plot.get("series"):
        return False
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    draw(ax, plot)
    note = plot.get("note")
    if note:
        fig.text(0.01, 0.01, note, fontsize=6, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return True


def plot_suite(directory: Path = RESULTS_DIR) -> list[Path]:
    """Redraw each suite report found in ``directory`` and the combined ``suite.png``."""
    reports = []
    for name in SUITE:
        path = directory / f"{name}.json"
        if path.exists():
            reports.append(json.loads(path.read_text()))
    written: list[Path] = []
    for report in reports:
        png = directory / f"{report['bench']}.png"
        if plot_report(report, png):
            written.append(png)
    drawable = [r for r in reports if r.get("plot", {}).get("series")]
    plt = _pyplot() if drawable else None
    if plt is not None:
        cols = 2
        rows = (len(drawable) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(13, 4.2 * rows), dpi=100, squeeze=False)
        for ax, report in zip(axes.flat, drawable, strict=False):
            draw(ax, report["plot"])
        for ax in list(axes.flat)[len(drawable) :]:
            ax.set_visible(False)
        date = drawable[0].get("machine", {}).get("date", "")
        fig.suptitle(
            f"sbxkit benchmark suite — medians; whiskers as each y axis says ({date})", fontsize=11
        )
        fig.tight_layout()
        suite = directory / "suite.png"
        fig.savefig(suite)
        plt.close(fig)
        written.append(suite)
    return written


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else RESULTS_DIR
    written = plot_suite(directory)
    for path in written:
        print(path)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
