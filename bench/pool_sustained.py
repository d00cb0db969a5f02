"""``bench pool``'s sustained phase: ``jobs`` one-shot ``true`` runs, ``width`` at a time, with
and without a pool that refills, in interleaved rounds.

The burst phase claims ``width`` runs from a pool parked beforehand (its refill untimed). This
phase asks the issue's question instead, "throughput at 16 with and without the pool (not
worse)", with refills in the timed window. Contenders, one whole batch each, round-robin:

``cold``
    ``width`` workers draining ``jobs`` runs through ``sbxkit.run``.
``pooled``
    ``open_pool(spec, size=width)`` opened inside the timed window: the clock runs from opening
    the pool to the last result, so the initial fill is paid (claims that find nothing parked
    run cold, as ``pool.run`` does). Closing the pool (removing what is still parked) is
    timed separately and reported, not counted in the rate.
``pooled_warm``
    The same pool filled before the clock starts (``wait_ready``, untimed): the steady state
    of a pool that is already open, refills still in the window.
``pooled_waiting``
    ``pooled`` (opened in the window) with each claim first awaiting a parked container
    (``await pool.wait_ready(1)``, then ``pool.run``) instead of running cold when the pool is
    empty: what the issue's "claims never wait for a refill unless the pool is empty" would
    give. It keeps the daemon's work at ``width`` containers in flight, where ``pooled``
    adds up to ``width`` cold runs to ``width`` refills.

Per batch: runs/s (``jobs`` / wall time) and the steady-state rate, ``jobs - width`` runs over
the time from the ``width``-th result to the last (the first ``width`` are a burst a parked
pool absorbs; the rest are bounded by what the daemon creates and starts, on every path).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from bench.harness import ratio_of_medians, say
from sbxkit._consumers.runner import run
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit.backends.docker import DockerBackend
from sbxkit.pool import open_pool

CONTENDERS = ("cold", "pooled", "pooled_warm", "pooled_waiting")
LABELS = {
    "cold": "cold (sbxkit.run)",
    "pooled": "pooled, pool opened in the window",
    "pooled_warm": "pooled, pool filled before the clock",
    "pooled_waiting": "pooled, each claim waits for a parked one",
}
TARGET_RATIO = 1.0
"""pooled / cold runs/s (issue 13: throughput at 16 with the pool not worse than without)."""
BATCH_TIMEOUT_S = 600.0


@dataclass
class Batch:
    """One contender's batch: its wall time, when each result came (seconds after the clock
    started), how many ran pooled, and (pooled contenders) how long the pool's close took."""

    wall_s: float
    done_at_s: list[float]
    pooled_runs: int
    close_s: float | None = None


@dataclass
class Tally:
    batches: dict[str, list[Batch]] = field(default_factory=lambda: {k: [] for k in CONTENDERS})


async def drain(
    jobs: int, width: int, one: Callable[[], Awaitable[RunResult]], t0: float
) -> tuple[list[float], int]:
    """``width`` workers run ``one`` until ``jobs`` ran; every run must exit 0. Returns each
    result's time after ``t0`` (sorted) and how many ran pooled."""
    left = [jobs]
    done_at: list[float] = []
    pooled = [0]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            result = await one()
            if not result.ok:
                raise RuntimeError(f"a run ended {result.status} {result.exit_code}")
            done_at.append(time.perf_counter() - t0)
            pooled[0] += result.pooled

    async with trio.open_nursery() as nursery:
        for _ in range(width):
            nursery.start_soon(worker)
    return sorted(done_at), pooled[0]


async def one_batch(
    key: str, backend: DockerBackend, spec: SandboxSpec, jobs: int, width: int
) -> Batch:
    if key == "cold":
        t0 = time.perf_counter()
        done_at, pooled = await drain(jobs, width, lambda: run(spec, backend=backend), t0)
        return Batch(time.perf_counter() - t0, done_at, pooled)
    t0 = time.perf_counter()
    async with open_pool(spec, size=width, backend=backend) as pool:
        if key == "pooled_warm":
            await pool.wait_ready()
            t0 = time.perf_counter()

        async def claim() -> RunResult:
            if key == "pooled_waiting":
                await pool.wait_ready(1)  # pool.run takes it before any other task runs
            return await pool.run(spec)

        done_at, pooled = await drain(jobs, width, claim, t0)
        wall = time.perf_counter() - t0
        t_close = time.perf_counter()
    return Batch(wall, done_at, pooled, close_s=time.perf_counter() - t_close)


async def measure_sustained(
    backend: DockerBackend,
    spec: SandboxSpec,
    *,
    jobs: int,
    width: int,
    rounds: int,
    warmup: int,
) -> dict[str, Any]:
    """``warmup`` discarded and ``rounds`` measured rounds, each running every contender's
    batch once in ``CONTENDERS`` order."""
    tally = Tally()
    for round_no in range(-warmup, rounds):
        for key in CONTENDERS:
            with trio.fail_after(BATCH_TIMEOUT_S):
                batch = await one_batch(key, backend, spec, jobs, width)
            say(
                f"  sustained round {round_no + 1} {key:<12} {batch.wall_s:6.2f} s "
                f"({jobs / batch.wall_s:.1f} runs/s, {batch.pooled_runs} pooled)"
            )
            if round_no >= 0:
                tally.batches[key].append(batch)
    return sustained_report(tally, jobs=jobs, width=width, rounds=rounds, warmup=warmup)


def steady_s(batch: Batch, width: int) -> float:
    """Seconds from the ``width``-th result to the last."""
    return batch.done_at_s[-1] - batch.done_at_s[width - 1]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def sustained_report(
    tally: Tally, *, jobs: int, width: int, rounds: int, warmup: int
) -> dict[str, Any]:
    """Rates per contender (median, min, max over rounds), ratios against cold from the same
    rounds (paired: a ratio of median wall times is the inverse ratio of median rates), and
    the target verdict on the pooled contender that opens its pool in the window."""
    contenders: dict[str, Any] = {}
    for key, batches in tally.batches.items():
        closes = [b.close_s for b in batches if b.close_s is not None]
        contenders[key] = {
            "label": LABELS[key],
            "runs_per_s": _spread([jobs / b.wall_s for b in batches]),
            "steady_runs_per_s": _spread([(jobs - width) / steady_s(b, width) for b in batches]),
            "wall_s": [round(b.wall_s, 3) for b in batches],
            "pooled_runs": [b.pooled_runs for b in batches],
            "pool_close_s": [round(c, 3) for c in closes] or None,
            "done_at_s": [[round(t, 4) for t in b.done_at_s] for b in batches],
        }
    cold = tally.batches["cold"]
    ratios: dict[str, Any] = {}
    for key in ("pooled", "pooled_warm", "pooled_waiting"):
        mine = tally.batches[key]
        ratios[f"{key}/cold runs/s"] = ratio_of_medians(
            [b.wall_s for b in cold], [b.wall_s for b in mine]
        )
        ratios[f"{key}/cold steady runs/s"] = ratio_of_medians(
            [steady_s(b, width) for b in cold], [steady_s(b, width) for b in mine]
        )
    measured = ratios["pooled/cold runs/s"]["ratio"]
    return {
        "jobs": jobs,
        "width": width,
        "rounds": rounds,
        "warmup": warmup,
        "order": list(CONTENDERS),
        "contenders": contenders,
        "ratios": ratios,
        "target": {
            "expression": f"pooled/cold runs/s >= {TARGET_RATIO:.2f} "
            f"({jobs} runs, {width} at once)",
            "ratio": measured,
            "met": measured >= TARGET_RATIO,
        },
    }


def sustained_lines(sustained: dict[str, Any]) -> list[str]:
    """The phase as plain text (``sustained_md`` renders it as tables)."""
    if not sustained:
        return []
    lines = [
        f"sustained, {sustained['jobs']} runs at {sustained['width']} at once "
        f"({sustained['rounds']} rounds, interleaved {' → '.join(sustained['order'])}):"
    ]
    for info in sustained["contenders"].values():
        rate, steady = info["runs_per_s"], info["steady_runs_per_s"]
        lines.append(
            f"  {info['label']:<38} {rate['median']:5.1f} runs/s "
            f"({rate['min']:.1f}–{rate['max']:.1f}), steady {steady['median']:5.1f} runs/s, "
            f"pooled runs {info['pooled_runs']}"
        )
    for name, r in sustained["ratios"].items():
        low, high = r["bootstrap95"]
        lines.append(f"  {name:<30} {r['ratio']:.3f}   bootstrap95 {low:.3f}–{high:.3f}")
    return lines


def sustained_md(sustained: dict[str, Any]) -> list[str]:
    if not sustained:
        return []
    out = [
        "",
        f"Sustained: {sustained['jobs']} runs, {sustained['width']} at once, "
        f"{sustained['rounds']} rounds (+{sustained['warmup']} warm-up) interleaved "
        f"`{' → '.join(sustained['order'])}`; steady = the runs after the first "
        f"{sustained['width']}, from the {sustained['width']}th result to the last.",
        "",
        "| contender | runs/s median | min | max | steady runs/s median | pooled runs per round "
        "| pool close s |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for info in sustained["contenders"].values():
        rate, steady = info["runs_per_s"], info["steady_runs_per_s"]
        closes = info["pool_close_s"]
        out.append(
            f"| {info['label']} | {rate['median']:.1f} | {rate['min']:.1f} | {rate['max']:.1f} | "
            f"{steady['median']:.1f} | {', '.join(str(n) for n in info['pooled_runs'])} | "
            + (", ".join(f"{c:.2f}" for c in closes) if closes else "-")
            + " |"
        )
    out += ["", "| ratio (of median rates) | value | bootstrap 95 % |", "|---|---:|---:|"]
    for name, r in sustained["ratios"].items():
        low, high = r["bootstrap95"]
        out.append(f"| {name} | {r['ratio']:.3f} | {low:.3f}–{high:.3f} |")
    return out
