"""docs/pool.md's plot, ``bench/results/pool.svg``, drawn from the benchmarks' own results.

Three panels: the latency distribution (empirical CDF) of ``bench pool``'s interleaved one-shot
samples — pooled, cold, raw floor —, its throughput at 16 (the burst from a warm pool, the
sustained batch with refills, and that batch's steady state), and ``bench humaneval``'s wall
times (every run a dot, the median a bar). Plain SVG written here, a few lines of text per
shape: no plotting dependency, and the file diffs like the markdown beside it.

``bench pool`` redraws it after a complete run; ``python -m bench.pool_plot [DIR]`` redraws it
from ``DIR/pool.json`` and, when present, ``DIR/humaneval.json`` (default ``bench/results``).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR, say, write_atomically

COLOURS = {
    "pooled": "#1f77b4",
    "pooled_warm": "#17becf",
    "pooled_waiting": "#8c564b",
    "cold": "#ff7f0e",
    "raw": "#2ca02c",
    "docker_py": "#9467bd",
}
TARGET_COLOUR = "#d62728"
POOLED_TARGET = 0.05
"""The pooled run's ceiling, × the raw floor's median (bench/pool.py TARGETS, issue 21)."""
PANEL_W, PANEL_H = 420.0, 330.0
LEFT, RIGHT, TOP, BOTTOM = 52.0, 12.0, 34.0, 78.0
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _num(value: float) -> str:
    """A coordinate, to a tenth of a pixel, without trailing zeros."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _label(value: float) -> str:
    return f"{value:g}"


def text(x: float, y: float, s: str, *, size: int = 11, anchor: str = "start", **attrs: str) -> str:
    extra = "".join(f" {k.replace('_', '-')}='{v}'" for k, v in attrs.items())
    return (
        f"<text x='{_num(x)}' y='{_num(y)}' font-size='{size}' text-anchor='{anchor}'{extra}>"
        f"{escape(s)}</text>"
    )


@dataclass(frozen=True)
class Frame:
    """One panel's plotting area: data ``(x, y)`` in ``[0, x_max] × [0, y_max]`` to pixels."""

    left: float
    top: float
    x_max: float
    y_max: float

    @property
    def width(self) -> float:
        return PANEL_W - LEFT - RIGHT

    @property
    def height(self) -> float:
        return PANEL_H - TOP - BOTTOM

    def x(self, value: float) -> float:
        return self.left + LEFT + value / self.x_max * self.width

    def y(self, value: float) -> float:
        return self.top + TOP + self.height - value / self.y_max * self.height

    def axes(self, title: str, y_ticks: Sequence[float], y_label: str) -> list[str]:
        x0, x1 = self.x(0), self.x(self.x_max)
        out = [text(self.left + PANEL_W / 2, self.top + 18, title, size=12, anchor="middle")]
        for tick in y_ticks:
            y = self.y(tick)
            out.append(
                f"<line x1='{_num(x0)}' y1='{_num(y)}' x2='{_num(x1)}' y2='{_num(y)}' "
                "stroke='#dddddd'/>"
            )
            out.append(text(x0 - 4, y + 4, _label(tick), size=10, anchor="end"))
        out.append(
            f"<line x1='{_num(x0)}' y1='{_num(self.y(0))}' x2='{_num(x0)}' "
            f"y2='{_num(self.y(self.y_max))}' stroke='#333333'/>"
        )
        out.append(
            f"<line x1='{_num(x0)}' y1='{_num(self.y(0))}' x2='{_num(x1)}' "
            f"y2='{_num(self.y(0))}' stroke='#333333'/>"
        )
        cy = self.top + TOP + self.height / 2
        turn = f"rotate(-90 {_num(self.left + 12)} {_num(cy)})"
        out.append(text(self.left + 12, cy, y_label, size=10, anchor="middle", transform=turn))
        return out


def cdf_points(samples: Sequence[float]) -> list[tuple[float, float]]:
    """The empirical CDF as a step line: (value, fraction at or below it)."""
    ordered = sorted(samples)
    n = len(ordered)
    points: list[tuple[float, float]] = []
    for i, value in enumerate(ordered):
        points += [(value, i / n), (value, (i + 1) / n)]
    return points


def latency_panel(report: dict[str, Any], left: float) -> list[str]:
    contenders = report["contenders"]
    keys = [k for k in ("pooled", "cold", "raw") if contenders.get(k, {}).get("samples_ms")]
    high = max(max(contenders[k]["samples_ms"]) for k in keys) if keys else 1.0
    x_ticks = nice_ticks(high)
    frame = Frame(left, 0.0, x_ticks[-1], 1.0)
    rounds = report["config"]["rounds"]
    out = frame.axes(
        f"One-shot true, {rounds} interleaved rounds: CDF",
        [0.0, 0.25, 0.5, 0.75, 1.0],
        "fraction of runs ≤ x",
    )
    for tick in x_ticks:
        out.append(text(frame.x(tick), frame.y(0) + 14, _label(tick), size=10, anchor="middle"))
    out.append(
        text(frame.x(frame.x_max / 2), frame.y(0) + 28, "ms, wall time per run", anchor="middle")
    )
    raw_median = contenders.get("raw", {}).get("total_ms", {}).get("median")
    if raw_median:
        x = frame.x(POOLED_TARGET * raw_median)
        out.append(
            f"<line x1='{_num(x)}' y1='{_num(frame.y(0))}' x2='{_num(x)}' "
            f"y2='{_num(frame.y(1))}' stroke='{TARGET_COLOUR}' stroke-dasharray='4 3'/>"
        )
        out.append(
            text(
                x + 3,
                frame.y(0.06),
                f"target: {POOLED_TARGET:.2f} × raw p50",
                size=9,
                fill=TARGET_COLOUR,
            )
        )
    for row, key in enumerate(keys):
        info = contenders[key]
        path = " ".join(
            f"{_num(frame.x(v))},{_num(frame.y(f))}" for v, f in cdf_points(info["samples_ms"])
        )
        out.append(
            f"<polyline points='{path}' fill='none' stroke='{COLOURS[key]}' stroke-width='2'/>"
        )
        p99 = info.get("p99_ms")
        legend = f"{info['label']}: p50 {info['total_ms']['median']:.1f}" + (
            f", p99 {p99:.1f} ms" if p99 is not None else " ms"
        )
        out.append(legend_entry(frame.x(0), frame.y(0) + 44 + row * 12, COLOURS[key], legend))
    return out


def legend_entry(x: float, y: float, colour: str, label: str) -> str:
    return f"<rect x='{_num(x)}' y='{_num(y - 8)}' width='10' height='8' fill='{colour}'/>" + text(
        x + 14, y, label, size=10
    )


@dataclass(frozen=True)
class Bar:
    key: str
    label: str
    values: list[float]
    """Every measured value (one per round); the bar is their median, a dot each."""


def bar_panel(
    title: str, y_label: str, groups: list[tuple[str, list[Bar]]], left: float
) -> list[str]:
    """Bars at the median, a dot per round, a value label on each bar."""
    everything = [v for _, bars in groups for bar in bars for v in bar.values]
    y_ticks = nice_ticks(max(everything) if everything else 1.0)
    frame = Frame(left, 0.0, float(len(groups)), y_ticks[-1])
    out = frame.axes(title, y_ticks, y_label)
    legend: dict[str, str] = {}
    for index, (name, bars) in enumerate(groups):
        out.append(text(frame.x(index + 0.5), frame.y(0) + 14, name, size=10, anchor="middle"))
        width = 0.8 / max(len(bars), 1)
        for slot, bar in enumerate(bars):
            if not bar.values:
                continue
            legend.setdefault(bar.key, bar.label)
            median = statistics.median(bar.values)
            x_left = index + 0.1 + slot * width
            colour = COLOURS.get(bar.key, "#7f7f7f")
            out.append(
                f"<rect x='{_num(frame.x(x_left))}' y='{_num(frame.y(median))}' "
                f"width='{_num(frame.x(width) - frame.x(0) - 2)}' "
                f"height='{_num(frame.y(0) - frame.y(median))}' fill='{colour}' "
                "fill-opacity='0.75'/>"
            )
            centre = frame.x(x_left + width / 2) - 1
            for value in bar.values:
                out.append(
                    f"<circle cx='{_num(centre)}' cy='{_num(frame.y(value))}' r='2.5' "
                    "fill='#222222'/>"
                )
            top = frame.y(max(bar.values))
            out.append(text(centre, top - 4, f"{median:.3g}", size=9, anchor="middle"))
    for row, (key, label) in enumerate(legend.items()):
        out.append(legend_entry(frame.x(0), frame.y(0) + 30 + row * 12, COLOURS[key], label))
    return out


def throughput_groups(report: dict[str, Any]) -> list[tuple[str, list[Bar]]]:
    groups: list[tuple[str, list[Bar]]] = []
    burst = report.get("burst") or {}
    if burst:
        width = burst["width"]
        groups.append(
            (
                "burst (warm pool)",
                [  # the burst's pool is parked before the clock starts
                    Bar("cold", "cold", [width / w for w in burst["wall_s"]["cold"]]),
                    Bar(
                        "pooled_warm",
                        "pooled, pool filled before the clock",
                        [width / w for w in burst["wall_s"]["pooled"]],
                    ),
                ],
            )
        )
    sustained = report.get("sustained") or {}
    if sustained:
        contenders = sustained["contenders"]
        jobs, width = sustained["jobs"], sustained["width"]
        groups.append(
            (
                f"{jobs} runs",
                [
                    Bar(k, info["label"], [jobs / w for w in info["wall_s"]])
                    for k, info in contenders.items()
                ],
            )
        )
        groups.append(
            (
                "steady state",
                [
                    Bar(
                        k,
                        info["label"],
                        [(jobs - width) / (d[-1] - d[width - 1]) for d in info["done_at_s"]],
                    )
                    for k, info in contenders.items()
                ],
            )
        )
    return groups


def humaneval_groups(report: dict[str, Any]) -> list[tuple[str, list[Bar]]]:
    keys = {"sbxkit": "cold", "sbxkit_pooled": "pooled", "docker_py": "docker_py"}
    bars = [
        Bar(colour_key, info["label"], list(info["samples_wall_s"]))
        for key, colour_key in keys.items()
        if (info := report["contenders"].get(key)) and info.get("samples_wall_s")
    ]
    return [(f"{report['config']['problems']} problems", bars)]


def render_svg(pool: dict[str, Any], humaneval: dict[str, Any] | None) -> str:
    panels = [latency_panel(pool, 0.0)]
    groups = throughput_groups(pool)
    if groups:
        width = (pool.get("sustained") or pool.get("burst") or {}).get("width", 16)
        panels.append(
            bar_panel(
                f"Throughput, {width} at once (bars: median)",
                "runs per second",
                groups,
                PANEL_W * len(panels),
            )
        )
    if humaneval and humaneval.get("contenders"):
        parallel = humaneval["config"]["parallel"]
        panels.append(
            bar_panel(
                f"HumanEval at {parallel} in parallel (bars: median)",
                "wall seconds for all",
                humaneval_groups(humaneval),
                PANEL_W * len(panels),
            )
        )
    total_w = PANEL_W * len(panels)
    machine = pool.get("machine", {})
    note = (
        f"bench pool {machine.get('date', '')}"
        + (f" · bench humaneval {humaneval['machine'].get('date', '')}" if humaneval else "")
        + " · dots: one per round · "
        + (pool.get("config", {}).get("note") or f"{machine.get('nproc', '?')} CPUs")
    )
    body = [element for panel in panels for element in panel]
    body.append(text(6, PANEL_H + 12, note, size=9, fill="#555555"))
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{_num(total_w)}' "
        f"height='{_num(PANEL_H + 18)}' viewBox='0 0 {_num(total_w)} {_num(PANEL_H + 18)}' "
        f"{FONT}>\n<rect width='100%' height='100%' fill='white'/>\n"
        + "\n".join(body)
        + "\n</svg>\n"
    )


def write_plot(directory: Path = RESULTS_DIR) -> Path | None:
    """``DIR/pool.svg`` from ``DIR/pool.json`` (and ``DIR/humaneval.json`` when present)."""
    pool_json = directory / "pool.json"
    if not pool_json.exists():
        say(f"bench.pool_plot: no {pool_json}")
        return None
    pool = json.loads(pool_json.read_text())
    humaneval_json = directory / "humaneval.json"
    humaneval = json.loads(humaneval_json.read_text()) if humaneval_json.exists() else None
    target = directory / "pool.svg"
    write_atomically(target, render_svg(pool, humaneval))
    return target


def main(argv: list[str]) -> int:
    written = write_plot(Path(argv[0]) if argv else RESULTS_DIR)
    if written is not None:
        print(written)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
