"""Benchmark ``concurrent_cli``: ``sbxkit run`` as a process vs ``docker run --rm`` (issue 21).

What a shell user, or a harness that forks one CLI per job, waits for. Two phases, both on the
commands of ``bench/cli_processes.py`` (each output checked; every ``sbxkit run`` must have been
handed to the running supervisor — sbxkit/handoff — or the run fails):

``sequential``
    One process at a time, interleaved round-robin: ``sbxkit run --pool 2`` (claimed from the
    supervisor's pool), ``sbxkit run`` (cold, on the kernel path) and ``docker run --rm``, each
    ``echo MARKER``. Wall time from spawn to exit; the background removal and refill an
    ``sbxkit run`` leaves to its supervisor is waited for, untimed, before the next contender.
    Targets: **pooled ≤ 0.25 ×** and **cold ≤ 0.8 × docker run --rm**, ratios of medians.
``concurrent``
    N (16) ``sbxkit run`` (cold) processes started at the same moment vs N ``docker run --rm``;
    jobs/s = N / the wall time until the last exited. Target: **≥ 1.0 ×** docker's jobs/s.

Same image, same bounds; docker skips sbxkit's hardening and its post-create checks, and pays
the Go CLI's start instead of Python's (an editable install's import hook costs each Python
process about 10 ms more than a regular install: ``machine.sbxkit_install``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bench import common
from bench.cli_processes import CPUS, MEMORY, PIDS, CliBench
from bench.harness import (
    ContenderFailed,
    machine_facts,
    ratio_of_medians,
    run_interleaved,
    say,
)
from bench.suite import ActivityWatch, LeakCheck, default_busybox, fmt, percentile, summarise
from sbxkit.engine.client import open_engine

NAME = "concurrent_cli"
SUMMARY = (
    "`sbxkit run` as a process vs `docker run --rm`: one at a time (pooled, cold) and 16 at "
    "once (jobs/s)"
)

POOL_TARGET = 0.25
COLD_TARGET = 0.80
CONCURRENT_TARGET = 1.0
PROCESSES = 16
ROUND_COUNTS = common.RoundCounts(rounds=30, warmup=3, quick_rounds=6, quick_warmup=1)
CONCURRENT_ROUNDS = 5
QUICK_CONCURRENT_ROUNDS = 2
RATIOS = (("sbxkit_pool", "docker_run"), ("sbxkit_cold", "docker_run"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(
        parser, ROUND_COUNTS, default_order="sbxkit_pool,sbxkit_cold,docker_run"
    )
    parser.add_argument(
        "--concurrent-rounds",
        type=int,
        default=None,
        help=f"rounds of the concurrent phase (default {CONCURRENT_ROUNDS}, 0: skip it)",
    )
    parser.add_argument(
        "--processes", type=int, default=PROCESSES, help=f"processes at once (default {PROCESSES})"
    )
    common.add_daemon_arguments(parser, default_busybox())


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    cli = CliBench(args.socket, args.image, NAME)
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await common.require_image(engine, args.image, NAME)
    facts["sbxkit_install"] = sbxkit_install()
    contenders = common.order_contenders(cli.contenders(), args.order, NAME, only=args.only)
    concurrent_rounds = common.pick(
        args.concurrent_rounds, args.quick, QUICK_CONCURRENT_ROUNDS, CONCURRENT_ROUNDS
    )
    times: dict[str, list[float]] = {"sbxkit": [], "docker_run": []}
    paths: dict[str, int] = {}
    await trio.to_thread.run_sync(activity.start)
    cli.compile_bytecode()
    cli.start_supervisor()
    try:
        keys = [c.key for c in contenders]
        say(f"{NAME}: sequential, {warmup} warm-up + {rounds} rounds of {keys}")
        try:
            await run_interleaved(
                contenders, rounds=rounds, warmup=warmup, progress=lambda t: say(f"  {t}")
            )
        except ContenderFailed as exc:
            errors.append(str(exc))
        if not errors and concurrent_rounds > 0:
            say(f"{NAME}: concurrent, {concurrent_rounds} rounds of {args.processes} at once")
            try:
                await measure_concurrent(cli, args.processes, concurrent_rounds, times)
            except ContenderFailed as exc:
                errors.append(str(exc))
        paths = cli.paths_taken()
        if set(paths) - {"handed off"}:
            errors.append(f"a `sbxkit run` did not hand its run off: {paths}")
    finally:
        with trio.CancelScope(shield=True):
            await cli.stop()
            found = await common.stop_and_sweep(facts, activity, leaks)
    facts["paths_taken"] = paths
    return build_report(args, rounds, warmup, contenders, times, facts, errors, found, leaks)


async def measure_concurrent(
    cli: CliBench, n: int, rounds: int, times: dict[str, list[float]]
) -> None:
    """``n`` cold ``sbxkit run`` at once, then ``n`` ``docker run --rm``, per round (one
    discarded warm-up round first); every process must exit 0 with its marker."""
    sbxkit_argv = cli.sbxkit_run("sbxkit", pool=False)
    docker_argv = cli.docker_run("docker_run")
    batches: dict[str, Callable[[], Awaitable[None]]] = {
        "sbxkit": lambda: cli.sbxkit_once(sbxkit_argv, pooled=False),
        "docker_run": lambda: cli.docker_once(docker_argv),
    }
    for round_no in range(-1, rounds):
        for key, once in batches.items():
            await cli.settle()
            t0 = time.perf_counter()
            try:
                async with trio.open_nursery() as nursery:
                    for _ in range(n):
                        nursery.start_soon(once)
            except BaseException as exc:  # a failed process fails the contender
                raise ContenderFailed(key, round_no, exc) from exc
            if round_no >= 0:
                times[key].append(time.perf_counter() - t0)
        say(f"  round {round_no + 1}/{rounds} done" if round_no >= 0 else "  warm-up done")


def sbxkit_install() -> str:
    """``editable`` (an import hook maps the source tree: about 10 ms per process) or
    ``regular``."""
    hooks = [name for name in sys.modules if name.startswith("__editable___sbxkit")]
    return "editable" if hooks else "regular"


def build_report(
    args: argparse.Namespace,
    rounds: int,
    warmup: int,
    contenders: list[Any],
    times: dict[str, list[float]],
    facts: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leak_check: LeakCheck,
) -> dict[str, Any]:
    complete = not errors and all(len(c.totals_s) == rounds for c in contenders)
    ratios = common.interleaved_ratios(contenders, RATIOS, complete)
    n = args.processes
    concurrent_complete = (
        complete and all(times.values()) and len(set(map(len, times.values()))) == 1
    )
    concurrent: dict[str, Any] = {}
    if concurrent_complete:
        concurrent = {
            "processes": n,
            "rounds": len(times["sbxkit"]),
            "jobs_per_s": {k: summarise([n / t for t in v]) for k, v in times.items()},
            "samples_batch_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
            # jobs/s ratio = inverse ratio of batch times (same N, paired rounds)
            "ratio": ratio_of_medians(times["docker_run"], times["sbxkit"]),
        }
    contender_info = common.contender_report(contenders)
    for info in contender_info.values():
        info["p99_ms"] = percentile(info["samples_ms"], 99) if info["samples_ms"] else None
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            **common.interleaving_config(args, rounds, warmup, contenders),
            "image": args.image,
            "limits": {"cpus": CPUS, "memory": MEMORY, "pids": PIDS},
            "settling": "before each call, untimed: sbxkit's background removals and the "
            "pool's refill finished",
            "bytecode": "sbxkit's compiled beforehand (compileall), as an installed package's is",
        },
        "contenders": contender_info,
        "ratios": ratios,
        "concurrent": concurrent,
        "targets": [
            common.ratio_target(
                f"sbxkit run --pool / docker run --rm <= {POOL_TARGET}",
                ratios.get("sbxkit_pool/docker_run"),
                POOL_TARGET,
            ),
            common.ratio_target(
                f"sbxkit run / docker run --rm <= {COLD_TARGET}",
                ratios.get("sbxkit_cold/docker_run"),
                COLD_TARGET,
            ),
            common.ratio_target(
                f"{n} x sbxkit run / {n} x docker run --rm, jobs/s >= {CONCURRENT_TARGET}",
                concurrent.get("ratio"),
                CONCURRENT_TARGET,
                at_most=False,
            ),
        ],
        "plot": plot(contender_info, concurrent, n) if complete else {},
        **common.outcome(errors, leaks, leak_check.leftovers),
    }


def plot(contenders: dict[str, Any], concurrent: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "title": "sbxkit run as a process vs docker run --rm",
        "ylabel": "ms per run (median, whiskers p10–p90)",
        "groups": ["one at a time"],
        "series": [
            {
                "label": info["label"],
                "median": [info["total_ms"].get("median")],
                "low": [info["total_ms"].get("p10")],
                "high": [info["total_ms"].get("p90")],
            }
            for info in contenders.values()
        ],
        "note": (
            f"{n} at once: sbxkit {fmt(concurrent['jobs_per_s']['sbxkit'].get('median'), 1)} "
            f"jobs/s, docker {fmt(concurrent['jobs_per_s']['docker_run'].get('median'), 1)}"
            if concurrent
            else ""
        ),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# {NAME} — `sbxkit run` as a process vs `docker run --rm`",
        "",
        f"{m['date']} · {cfg['rounds']} sequential rounds (+{cfg['warmup']} warm-up), "
        f"interleaved `{' → '.join(cfg['order'])}` · {common.docker_md(m)}"
        + common.git_md(m)
        + f" · sbxkit install: {m.get('sbxkit_install')}",
        "",
        "One process at a time (each `echo MARKER`, output checked; untimed settling between):",
        "",
        *common.ms_table_md(report["contenders"]),
        "",
        "p99 ms: "
        + ", ".join(
            f"{info['label']} {info['p99_ms']:.1f}"
            for info in report["contenders"].values()
            if info.get("p99_ms") is not None
        ),
    ]
    out += common.ratio_table_md(report["ratios"], "ratio of medians", "first half / second half")
    concurrent = report.get("concurrent") or {}
    if concurrent:
        n = concurrent["processes"]
        out += [
            "",
            f"{n} processes at once, {concurrent['rounds']} rounds (+1 warm-up):",
            "",
            "| contender | jobs/s median | p10 | p90 | min | max | n |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, label in (("sbxkit", "sbxkit run"), ("docker_run", "docker run --rm")):
            s = concurrent["jobs_per_s"][key]
            out.append(
                f"| {n} × {label} | {fmt(s.get('median'), 2)} | {fmt(s.get('p10'), 2)} | "
                f"{fmt(s.get('p90'), 2)} | {fmt(s.get('min'), 2)} | {fmt(s.get('max'), 2)} | "
                f"{s['n']} |"
            )
        out += common.ratio_table_md(
            {"sbxkit/docker_run jobs/s": concurrent["ratio"]}, "ratio of medians", "halves"
        )
    out += ["", f"How each `sbxkit` process ran: {m.get('paths_taken')}"]
    for target in report["targets"]:
        out += common.target_md(target)
    out += ["", "What each contender does:", ""]
    out += [f"- **{i['label']}**: {i['description']}" for i in report["contenders"].values()]
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds, warmup = common.rounds_and_warmup(args, NAME, ROUND_COUNTS)
    report = trio.run(measure, args, rounds, warmup)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
