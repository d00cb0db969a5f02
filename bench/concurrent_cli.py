"""Benchmark ``concurrent_cli``: N ``sbxkit run`` processes at once vs N ``docker run --rm``.

What a shell user or a harness that forks one CLI per job sees: every process starts at the
same moment, each runs one sandbox of ``true`` and exits; jobs/s = N / the wall time until the
last one exited. Rounds interleave the contenders (README.md's method).

``sbxkit``
    N × ``python -m sbxkit run --json --cpus C --memory M --pids P IMAGE -- true``, sharing the
    run's supervisor (admission queues what does not fit; nothing may fail).
``docker_run``
    N × ``docker run --rm --network none --cpus C --memory M --pids-limit P IMAGE true``.

Every process must exit 0 (a refused or failed run fails the contender: the point of issue 10
is that concurrency never turns into errors). Same image, same bounds; docker skips sbxkit's
hardening and its post-create checks, and pays the Go CLI's start instead of Python's.

Target: sbxkit ≥ 1.0 × docker jobs/s at N = 16, as a ratio of medians from one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bench import common
from bench.harness import ContenderFailed, machine_facts, ratio_of_medians, say
from bench.suite import BENCH_LABEL, ActivityWatch, LeakCheck, default_busybox, fmt, summarise
from sbxkit.engine.client import open_engine

NAME = "concurrent_cli"
SUMMARY = "16 concurrent `sbxkit run` processes vs 16 concurrent `docker run --rm`: jobs/s"

TARGET_RATIO = 1.0
PROCESSES = 16
DEFAULT_ROUNDS = 5
QUICK_ROUNDS = 2
CPUS = "0.5"
MEMORY = "64m"
PIDS = "64"
CONTENDERS = ("sbxkit", "docker_run")
LABELS = {
    "sbxkit": f"{PROCESSES} × sbxkit run",
    "docker_run": f"{PROCESSES} × docker run --rm",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--warmup", type=int, default=1, help="discarded rounds (default 1)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds")
    parser.add_argument(
        "--processes", type=int, default=PROCESSES, help=f"processes at once (default {PROCESSES})"
    )
    common.add_contenders_argument(parser, CONTENDERS)
    common.add_daemon_arguments(parser, default_busybox())


Batch = Callable[[int], Awaitable[None]]


def commands(args: argparse.Namespace, docker: str) -> dict[str, list[str]]:
    label = f"{BENCH_LABEL}={NAME}:"
    return {
        "sbxkit": [
            sys.executable,
            "-m",
            "sbxkit",
            "run",
            "--json",
            "--stdin",
            "none",  # the bench's pipe is not meant for the payload
            "--socket",
            args.socket,
            "--cpus",
            CPUS,
            "--memory",
            MEMORY,
            "--pids",
            PIDS,
            "--label",
            label + "sbxkit",
            args.image,
            "--",
            "true",
        ],
        "docker_run": [
            docker,
            "run",
            "--rm",
            "--network",
            "none",
            "--cpus",
            CPUS,
            "--memory",
            MEMORY,
            "--pids-limit",
            PIDS,
            "--label",
            label + "docker_run",
            args.image,
            "true",
        ],
    }


def make_batch(key: str, argv: list[str], env: dict[str, str]) -> Batch:
    async def batch(n: int) -> None:
        failures: list[str] = []

        async def one() -> None:
            done = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False, env=env
            )
            if done.returncode != 0:
                failures.append(f"exit {done.returncode}: {done.stderr.decode(errors='replace')}")

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        if failures:
            raise RuntimeError(f"{key}: {len(failures)} of {n} failed, first: {failures[0]}")

    return batch


async def measure(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    docker = shutil.which("docker")
    if docker is None:
        raise SystemExit(f"bench {NAME}: no `docker` on PATH (needed for the docker run baseline)")
    keys = [k.strip() for k in args.contenders.split(",") if k.strip()]
    unknown = set(keys) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"bench {NAME}: unknown contenders {sorted(unknown)}")
    env = dict(os.environ, DOCKER_HOST=f"unix://{args.socket}")
    argv = commands(args, docker)
    batches = {key: make_batch(key, argv[key], env) for key in keys}
    times: dict[str, list[float]] = {key: [] for key in keys}
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await common.require_image(engine, args.image, NAME)
    say(f"{NAME}: {args.warmup} warm-up + {rounds} rounds of {keys}, {args.processes} at once")
    await trio.to_thread.run_sync(activity.start)
    try:
        for round_no in range(-args.warmup, rounds):
            for key in keys:
                t0 = time.perf_counter()
                try:
                    await batches[key](args.processes)
                except Exception as exc:
                    raise ContenderFailed(key, round_no, exc) from exc
                if round_no >= 0:
                    times[key].append(time.perf_counter() - t0)
            say(f"  round {round_no + 1}/{rounds} done" if round_no >= 0 else "  warm-up done")
    except ContenderFailed as exc:
        errors.append(str(exc))
    finally:
        with trio.CancelScope(shield=True):
            found = await common.stop_and_sweep(facts, activity, leaks)
    return build_report(args, rounds, keys, times, facts, errors, found, leaks.leftovers)


def build_report(
    args: argparse.Namespace,
    rounds: int,
    keys: list[str],
    times: dict[str, list[float]],
    facts: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[str],
) -> dict[str, Any]:
    n = args.processes
    complete = not errors and all(len(times[k]) == rounds for k in keys)
    contenders = {
        key: {
            "label": LABELS[key],
            "jobs_per_s": summarise([n / t for t in times[key]]),
            "batch_s": summarise(times[key]),
            "samples_batch_s": [round(t, 4) for t in times[key]],
        }
        for key in keys
    }
    ratios: dict[str, Any] = {}
    if complete and {"sbxkit", "docker_run"} <= set(keys):
        # jobs/s ratio = inverse ratio of batch times (same N, paired rounds)
        ratios["sbxkit/docker_run"] = ratio_of_medians(times["docker_run"], times["sbxkit"])
    measured = ratios.get("sbxkit/docker_run", {}).get("ratio")
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "quick": bool(args.quick),
            "processes": n,
            "order": "per round: every contender's whole batch, in order",
            "contenders": keys,
            "image": args.image,
            "limits": {"cpus": CPUS, "memory": MEMORY, "pids": PIDS},
            "clock": "time.perf_counter from the first spawn to the last exit",
        },
        "contenders": contenders,
        "ratios": ratios,
        "targets": [
            {
                "expression": f"sbxkit/docker_run jobs/s at {n} processes >= {TARGET_RATIO}",
                "ratio": measured,
                "met": None if measured is None else measured >= TARGET_RATIO,
            }
        ],
        "plot": {
            "title": f"{n} concurrent CLI processes, one sandbox each",
            "ylabel": "jobs/s (median, whiskers p10–p90)",
            "groups": [f"{n} at once"],
            "series": [
                {
                    "label": LABELS[k],
                    "median": [contenders[k]["jobs_per_s"].get("median")],
                    "low": [contenders[k]["jobs_per_s"].get("p10")],
                    "high": [contenders[k]["jobs_per_s"].get("p90")],
                }
                for k in keys
            ]
            if complete
            else [],
        },
        **common.outcome(errors, leaks, leftovers),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# concurrent_cli — {cfg['processes']} CLI processes at once",
        "",
        f"{m['date']} · {cfg['rounds']} rounds (+{cfg['warmup']} warm-up) · {common.docker_md(m)}",
        "",
        "| contender | jobs/s median | p10 | p90 | min | max | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for info in report["contenders"].values():
        s = info["jobs_per_s"]
        out.append(
            f"| {info['label']} | {fmt(s.get('median'), 2)} | {fmt(s.get('p10'), 2)} | "
            f"{fmt(s.get('p90'), 2)} | {fmt(s.get('min'), 2)} | {fmt(s.get('max'), 2)} | "
            f"{s['n']} |"
        )
    out += common.ratio_table_md(report["ratios"], "jobs/s ratio (of medians)")
    for target in report["targets"]:
        out += common.target_md(target)
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    report = trio.run(measure, args, rounds)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
