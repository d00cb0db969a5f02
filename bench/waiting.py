"""Benchmark ``waiting``: a batch of jobs that mostly wait, at a fixed 8 and at the adaptive limit.

HumanEval is CPU-bound on two cores: its wall time is flat from 3 to 16 in flight (docs/
benchmarks.md), so no limit, adaptive or fixed, beats another there. What the adaptive limit
(``run_many`` without ``parallel``; sbxkit/_consumers/pacing.py) is for is the other kind of
batch — jobs that spend their time waiting (on a network, a test's sleep, a slow tool) — where
a fixed 8 leaves the cores idle. Here each job is ``sleep --sleep`` in busybox; alternating
whole runs:

``fixed``
    ``run_many(jobs, parallel=8, engine=engine)``: the fixed default of before (8 on 2 cores).
``adaptive``
    ``run_many(jobs, engine=engine, pacing=...)``: no ``parallel``; the limits it went through,
    window by window, are reported.

Measured: each run's wall time (median over runs) and ``adaptive/fixed`` with a bootstrap
interval over the paired runs. Every job must exit 0. There is no target: benchmarks measure.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from bench import common
from bench.harness import ContenderFailed, machine_facts, ratio_of_medians, say
from bench.suite import ActivityWatch, LeakCheck, default_busybox, fmt, label_of, summarise
from sbxkit._consumers.harness import Job, run_many
from sbxkit._consumers.paced import Pacing
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.engine.client import open_engine

NAME = "waiting"
SUMMARY = "a batch of sleeping jobs: run_many at a fixed 8 vs the adaptive limit"
CONTENDERS = ("fixed", "adaptive")
PARALLEL = 8
DEFAULT_JOBS, DEFAULT_SLEEP_S = 256, 1.0
DEFAULT_ROUNDS, QUICK_ROUNDS = 3, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} run each")
    parser.add_argument("--warmup", type=int, default=0, help="discarded whole runs (default 0)")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help=f"default {DEFAULT_JOBS}")
    parser.add_argument(
        "--sleep",
        type=float,
        default=DEFAULT_SLEEP_S,
        help=f"seconds a job waits (default {DEFAULT_SLEEP_S})",
    )
    common.add_daemon_arguments(parser, default_busybox())


def _spec(image: str, sleep_s: float, key: str) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["sleep", f"{sleep_s:g}"],
        limits=Limits(
            cpus=0.5, memory_bytes=32 * MiB, pids=16, output_bytes=MiB, timeout_s=sleep_s + 60
        ),
        labels=label_of(NAME, key),
    )


async def measure(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    walls: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    limits: list[list[int]] = []
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await trio.to_thread.run_sync(activity.start)

        async def batch(key: str) -> None:
            jobs = [Job(id=i, spec=_spec(args.image, args.sleep, key)) for i in range(args.jobs)]
            if key == "fixed":
                results = await run_many(jobs, parallel=PARALLEL, engine=engine)
            else:
                seen: list[int] = []
                limits.append(seen)
                pacing = Pacing(on_window=lambda step: seen.append(step.after))
                results = await run_many(jobs, engine=engine, pacing=pacing)
            bad = [r for r in results if not r.ok]
            if bad:
                raise RuntimeError(f"{len(bad)} jobs failed: {bad[0].error or bad[0].result}")

        try:
            for round_no in range(-args.warmup, rounds):
                for key in CONTENDERS:
                    t0 = time.perf_counter()
                    try:
                        await batch(key)
                    except Exception as exc:
                        raise ContenderFailed(key, round_no, exc) from exc
                    if round_no >= 0:
                        walls[key].append(time.perf_counter() - t0)
                        say(f"  run {round_no + 1} {key:<9} {walls[key][-1]:6.1f} s")
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            with trio.CancelScope(shield=True):
                found = await common.stop_and_sweep(facts, activity, leaks)
    complete = not errors and all(len(w) == rounds for w in walls.values())
    wall_s = {k: summarise(walls[k]) for k in CONTENDERS}
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "jobs": args.jobs,
            "sleep_s": args.sleep,
            "fixed_parallel": PARALLEL,
            "image": args.image,
            "order": "alternating whole runs: " + " → ".join(CONTENDERS),
        },
        "wall_s": wall_s,
        "samples_wall_s": {k: [round(w, 3) for w in walls[k]] for k in CONTENDERS},
        "adaptive_limits_per_run": limits[-rounds:] if complete else limits,
        "ratios": (
            {"adaptive/fixed wall time": ratio_of_medians(walls["adaptive"], walls["fixed"])}
            if complete
            else {}
        ),
        "plot": {
            "title": f"{args.jobs} jobs of sleep {args.sleep:g}: fixed {PARALLEL} vs adaptive",
            "ylabel": "wall seconds for the batch (median, whiskers min–max)",
            "groups": [f"{args.jobs} jobs"],
            "series": [common.min_max_series(key, [wall_s[key]]) for key in CONTENDERS]
            if complete
            else [],
        },
        **common.outcome(errors, found, leaks.leftovers),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# {NAME} — {cfg['jobs']} jobs of `sleep {cfg['sleep_s']:g}`",
        "",
        f"{m['date']} · {cfg['rounds']} runs per contender, {cfg['order']} · "
        f"`{cfg['image']}` · {common.docker_md(m)}",
        "",
        "| contender | wall s median | min | max | wall s of each run | n |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for key in CONTENDERS:
        w = report["wall_s"][key]
        runs = " · ".join(f"{s:.2f}" for s in report["samples_wall_s"][key])
        label = f"fixed {cfg['fixed_parallel']}" if key == "fixed" else "adaptive"
        out.append(
            f"| {label} | {fmt(w.get('median'), 2)} | {fmt(w.get('min'), 2)} | "
            f"{fmt(w.get('max'), 2)} | {runs} | {w.get('n', 0)} |"
        )
    out += ["", "Adaptive limits, window by window, per measured run:", ""]
    out += [
        f"- {' '.join(str(n) for n in run) or '(no window judged)'}"
        for run in report["adaptive_limits_per_run"]
    ]
    out += common.ratio_table_md(report["ratios"])
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    report = trio.run(measure, args, rounds)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
