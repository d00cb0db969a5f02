"""What every benchmark shares: interleaved rounds, robust statistics, machine facts, output.

Method (see README.md): contenders run round-robin in one process (A, B, C, A, B, C, ...), so
drift in the daemon or the machine affects all of them alike; warm-up rounds are discarded;
each contender is summarised by its median, and contenders are compared by ratios of medians,
never by absolute times.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import sbxkit
from sbxkit.engine.client import Engine

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
SBXKIT_SOURCE = Path(sbxkit.__file__).resolve().parent
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240611

StepTimings = dict[str, float]
"""Seconds per named step of one measured call (may be empty)."""


@dataclass
class Contender:
    """One way of doing the benchmarked thing. ``once`` raises on any failure."""

    key: str
    label: str
    description: str
    once: Callable[[], Awaitable[StepTimings]]
    before: Callable[[], Awaitable[None]] | None = None
    """Untimed, before each ``once``: e.g. wait until a removal the previous run left to its
    owner is done, so it does not load the daemon under the next contender."""
    totals_s: list[float] = field(default_factory=list)
    steps_s: dict[str, list[float]] = field(default_factory=dict)

    def record(self, total_s: float, steps: StepTimings) -> None:
        self.totals_s.append(total_s)
        for name, seconds in steps.items():
            self.steps_s.setdefault(name, []).append(seconds)


class ContenderFailed(Exception):
    """A contender raised; the benchmark stops and reports it (exit status non-zero)."""

    def __init__(self, key: str, round_no: int, error: BaseException) -> None:
        super().__init__(f"{key} failed in round {round_no}: {type(error).__name__}: {error}")
        self.key = key
        self.round_no = round_no


async def run_interleaved(
    contenders: Sequence[Contender],
    *,
    rounds: int,
    warmup: int,
    progress: Callable[[str], None] | None = None,
    progress_every: int = 10,
    shuffle: int | None = None,
) -> None:
    """``warmup`` discarded rounds, then ``rounds`` measured ones, each running every contender
    once in the given order — or, with ``shuffle`` (a seed), in an order drawn afresh for each
    round, so that what runs just before a contender (and what it leaves in the daemon) is
    every other contender as often, not always the same one. Wall time is taken around the
    awaited call (perf_counter)."""
    draw = random.Random(shuffle) if shuffle is not None else None
    for round_no in range(-warmup, rounds):
        order = list(contenders)
        if draw is not None:
            draw.shuffle(order)
        for contender in order:
            if contender.before is not None:
                await contender.before()
            t0 = time.perf_counter()
            try:
                steps = await contender.once()
            except Exception as exc:
                raise ContenderFailed(contender.key, round_no, exc) from exc
            elapsed = time.perf_counter() - t0
            if round_no >= 0:
                contender.record(elapsed, steps)
        done = round_no + 1
        if progress is not None and done > 0 and (done % progress_every == 0 or done == rounds):
            progress(f"{done}/{rounds} rounds")


# --- statistics ------------------------------------------------------------------------------


def summarise_ms(samples_s: Sequence[float]) -> dict[str, float | int]:
    """median, p10, p90 (linear interpolation), min, max in milliseconds, and n."""
    ms = sorted(s * 1000.0 for s in samples_s)
    if not ms:
        return {"n": 0}
    if len(ms) == 1:
        p10 = p90 = ms[0]
    else:
        deciles = statistics.quantiles(ms, n=10, method="inclusive")
        p10, p90 = deciles[0], deciles[8]
    return {
        "median": statistics.median(ms),
        "p10": p10,
        "p90": p90,
        "min": ms[0],
        "max": ms[-1],
        "n": len(ms),
    }


def _round_hints(n: int, statistic: Callable[[Sequence[int]], float]) -> dict[str, Any]:
    """``statistic`` (of the rounds whose indices it gets) over all ``n`` rounds, over each
    half of them, and its 95 % bootstrap interval resampling whole rounds (what was measured
    in one round stays together: it saw the same drift)."""
    half = n // 2
    rng = random.Random(BOOTSTRAP_SEED)
    boots = sorted(
        statistic([rng.randrange(n) for _ in range(n)]) for _ in range(BOOTSTRAP_RESAMPLES)
    )
    return {
        "value": statistic(range(n)),
        "halves": [statistic(range(half)), statistic(range(half, n))] if half >= 1 else [],
        "bootstrap95": [
            boots[int(0.025 * (len(boots) - 1))],
            boots[int(0.975 * (len(boots) - 1))],
        ],
        "n": n,
    }


def ratio_of_medians(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """Median ratio plus two stability hints: the same ratio over each half of the rounds, and
    a 95 % bootstrap interval resampling whole rounds (pairs stay together: they were
    interleaved, so they saw the same drift)."""
    n = min(len(numerator), len(denominator))
    hints = _round_hints(
        n,
        lambda rounds: (
            statistics.median(numerator[i] for i in rounds)
            / statistics.median(denominator[i] for i in rounds)
        ),
    )
    return {"ratio": hints.pop("value"), **hints}


def median_with_hints(values: Sequence[float]) -> dict[str, Any]:
    """The median of per-round values (each from one round's contenders, so the drift they
    saw cancels) with ``ratio_of_medians``'s hints."""
    hints = _round_hints(len(values), lambda rounds: statistics.median(values[i] for i in rounds))
    return {"median": hints.pop("value"), **hints}


# --- machine facts ---------------------------------------------------------------------------


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


async def _git_revision() -> dict[str, Any] | None:
    """The repository's HEAD and whether ``sbxkit/`` differs from it — only when the imported
    sbxkit is this repository's (a run against another checkout says so instead)."""
    root = REPO_ROOT
    if SBXKIT_SOURCE.parent != root:
        return None
    try:
        head = await trio.run_process(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_stdout=True, check=False
        )
        dirty = await trio.run_process(
            ["git", "-C", str(root), "status", "--porcelain", "--", "sbxkit"],
            capture_stdout=True,
            check=False,
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.decode().strip(), "sbxkit_dirty": bool(dirty.stdout.strip())}


async def machine_facts(engine: Engine) -> dict[str, Any]:
    """Where the numbers came from: host, daemon (through the engine), runtimes, versions."""
    version = await engine.version()
    info = await engine.info()
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "nproc": affinity or os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": list(os.getloadavg()),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "sbxkit": _version_of("sbxkit"),
        "trio": _version_of("trio"),
        "h11": _version_of("h11"),
        "msgspec": _version_of("msgspec"),
        "sbxkit_source": str(SBXKIT_SOURCE),
        "git": await _git_revision(),
        "docker_server_version": version.version,
        "docker_server_api": version.api_version,
        "docker_server_min_api": version.min_api_version,
        "docker_kernel": version.kernel_version,
        "api_version_used_by_sbxkit": engine.api_version,
        "default_runtime": info.default_runtime,
        "runtimes": sorted(info.runtimes or {}),
        "cgroup_version": info.cgroup_version,
        "cgroup_driver": info.cgroup_driver,
        "daemon_ncpu": info.ncpu,
        "socket": engine.socket_path,
    }


# --- output ------------------------------------------------------------------------------------


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` through ``path.tmp`` + rename, so a crash never leaves half a result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, data: object) -> None:
    write_atomically(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def fmt_ms(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
