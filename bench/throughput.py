"""Benchmark ``throughput``: jobs/s for batches of one-shot ``true`` at 1, 4 and 16 in parallel.

Contenders, interleaved round-robin in one trio program (README.md's method); one measured
call is one whole batch of N jobs at parallelism P, and jobs/s = N / its wall time:

``sbxkit`` ``await sbxkit._consumers.harness.run_many(jobs, parallel=P, engine=engine)`` — harness
mode with the runner's default owner (the supervisor) and admission against the daemon's budget.
``sbxkit_inproc`` The same with ``owner_factory=InProcessOwner``: the supervisor's share of the
cost. ``docker_py`` A ``concurrent.futures.ThreadPoolExecutor(P)`` over one ``docker.DockerClient``
(pool sized for P): per job ``containers.create`` → ``start`` → ``wait`` → ``remove(force, v)``,
what ``containers.run(..., remove=True)`` does without following logs. ``aiodocker``
``asyncio.gather`` under an ``asyncio.Semaphore(P)`` on one ``aiodocker.Docker``, on a persistent
asyncio loop in its own thread: create → start → wait → delete(force, v).

All run the same image and command with the same bounds (cpus 0.1 so 16 fit the daemon's
2-CPU budget, memory 32 MiB, pids 64) and no network (``NetworkDisabled``, as sbxkit sends);
the peers skip sbxkit's hardening and post-create checks.

Target (the issue): sbxkit ≥ 1.2 × docker-py jobs/s at 16 in parallel, as a ratio of medians
from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from bench import common
from bench.harness import (
    ContenderFailed,
    machine_facts,
    ratio_of_medians,
    say,
)
from bench.suite import (
    ActivityWatch,
    AsyncioThread,
    LeakCheck,
    aiodocker_client,
    aiodocker_one_shot,
    default_busybox,
    dockerpy_client,
    dockerpy_one_shot,
    fmt,
    label_of,
    peer_body,
    summarise,
)
from sbxkit._consumers.harness import Job, run_many
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.engine.client import Engine, open_engine

NAME = "throughput"
SUMMARY = "jobs/s at 1, 4 and 16 in parallel: sbxkit run_many vs docker-py threads vs aiodocker"

TARGET_RATIO = 1.2
TARGET_PARALLEL = 16
PARALLELS = (1, 4, 16)
JOBS = {1: 8, 4: 16, 16: 32}
QUICK_JOBS = {1: 4, 4: 8, 16: 16}
DEFAULT_ROUNDS = 5
QUICK_ROUNDS = 2
CPUS = 0.1
MEMORY_BYTES = 32 * MiB
PIDS = 64
CONTENDERS = ("sbxkit", "sbxkit_inproc", "docker_py", "aiodocker")
LABELS = {
    "sbxkit": "sbxkit run_many",
    "sbxkit_inproc": "sbxkit run_many, in-process owner",
    "docker_py": "docker-py, thread pool",
    "aiodocker": "aiodocker, asyncio",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--warmup", type=int, default=1, help="discarded rounds (default 1)")
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds, half-size batches"
    )
    common.add_contenders_argument(parser, CONTENDERS)
    parser.add_argument("--runtime", default=None, help="OCI runtime for every contender")
    common.add_daemon_arguments(parser, default_busybox())


def sbxkit_jobs(image: str, n: int, key: str, runtime: str | None) -> list[Job]:
    spec = SandboxSpec(
        image=image,
        command=["true"],
        limits=Limits(
            cpus=CPUS, memory_bytes=MEMORY_BYTES, pids=PIDS, output_bytes=MiB, timeout_s=60
        ),
        labels=label_of(NAME, key),
        runtime=runtime,
    )
    return [Job(id=i, spec=spec) for i in range(n)]


Batch = Callable[[int, int], Awaitable[None]]
"""(jobs, parallel) → run the whole batch; raise on any failure."""


def make_batches(
    keys: list[str], engine: Engine, args: argparse.Namespace, peers: dict[str, Any]
) -> dict[str, Batch]:
    batches: dict[str, Batch] = {}

    async def sbxkit_batch(n: int, parallel: int, key: str, inproc: bool) -> None:
        results = await run_many(
            sbxkit_jobs(args.image, n, key, args.runtime),
            parallel=parallel,
            engine=engine,
            owner_factory=InProcessOwner if inproc else None,
        )
        bad = [r for r in results if not r.ok]
        if bad:
            raise RuntimeError(
                f"{key}: {len(bad)} jobs failed, first: {bad[0].error or bad[0].result}"
            )

    if "sbxkit" in keys:
        batches["sbxkit"] = lambda n, p: sbxkit_batch(n, p, "sbxkit", False)
    if "sbxkit_inproc" in keys:
        batches["sbxkit_inproc"] = lambda n, p: sbxkit_batch(n, p, "sbxkit_inproc", True)
    if "docker_py" in keys:
        client = peers["docker_py"] = dockerpy_client(args.socket, max(PARALLELS))
        body = peer_body(
            args.image,
            ["true"],
            label_of(NAME, "docker_py"),
            cpus=CPUS,
            memory_bytes=MEMORY_BYTES,
            pids=PIDS,
            runtime=args.runtime,
        )
        pools: dict[int, ThreadPoolExecutor] = {}
        peers["docker_py_pools"] = pools

        def threaded(n: int, parallel: int) -> None:
            pool = pools.setdefault(parallel, ThreadPoolExecutor(parallel, "sbxbench-dockerpy"))
            codes = list(pool.map(lambda _: dockerpy_one_shot(client, body)[0], range(n)))
            if any(code != 0 for code in codes):
                raise RuntimeError(f"docker_py: exit codes {codes}")

        async def dockerpy_batch(n: int, parallel: int) -> None:
            await trio.to_thread.run_sync(threaded, n, parallel)

        batches["docker_py"] = dockerpy_batch
    if "aiodocker" in keys:
        loop = peers["aiodocker_loop"] = AsyncioThread()
        docker = peers["aiodocker"] = loop.call(lambda: _aiodocker(args.socket))
        body = peer_body(
            args.image,
            ["true"],
            label_of(NAME, "aiodocker"),
            cpus=CPUS,
            memory_bytes=MEMORY_BYTES,
            pids=PIDS,
            runtime=args.runtime,
        )

        async def gathered(n: int, parallel: int) -> None:
            gate = asyncio.Semaphore(parallel)

            async def one() -> int:
                async with gate:
                    return await aiodocker_one_shot(docker, body)

            codes = await asyncio.gather(*(one() for _ in range(n)))
            if any(code != 0 for code in codes):
                raise RuntimeError(f"aiodocker: exit codes {codes}")

        async def aiodocker_batch(n: int, parallel: int) -> None:
            await trio.to_thread.run_sync(loop.call, lambda: gathered(n, parallel))

        batches["aiodocker"] = aiodocker_batch
    return batches


async def _aiodocker(socket_path: str) -> Any:
    return aiodocker_client(socket_path)


def close_peers(peers: dict[str, Any]) -> None:
    for pool in peers.get("docker_py_pools", {}).values():
        pool.shutdown(wait=True)
    if "docker_py" in peers:
        peers["docker_py"].close()
    if "aiodocker" in peers:
        peers["aiodocker_loop"].call(peers["aiodocker"].close)
        peers["aiodocker_loop"].close()


async def measure(args: argparse.Namespace, rounds: int, jobs: dict[int, int]) -> dict[str, Any]:
    keys = [k.strip() for k in args.contenders.split(",") if k.strip()]
    unknown = set(keys) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"bench {NAME}: unknown contenders {sorted(unknown)}")
    errors: list[str] = []
    times: dict[str, dict[int, list[float]]] = {k: {p: [] for p in PARALLELS} for k in keys}
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    peers: dict[str, Any] = {}
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        batches = make_batches(keys, engine, args, peers)
        say(
            f"{NAME}: {args.warmup} warm-up + {rounds} rounds of {keys} at P={PARALLELS} (N={jobs})"
        )
        await trio.to_thread.run_sync(activity.start)
        try:
            for round_no in range(-args.warmup, rounds):
                for parallel in PARALLELS:
                    for key in keys:
                        t0 = time.perf_counter()
                        try:
                            await batches[key](jobs[parallel], parallel)
                        except Exception as exc:
                            raise ContenderFailed(f"{key}@{parallel}", round_no, exc) from exc
                        elapsed = time.perf_counter() - t0
                        if round_no >= 0:
                            times[key][parallel].append(elapsed)
                say(f"  round {round_no + 1}/{rounds} done" if round_no >= 0 else "  warm-up done")
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(close_peers, peers)
                found = await common.stop_and_sweep(facts, activity, leaks)
    return build_report(args, rounds, jobs, keys, times, facts, errors, found, leaks.leftovers)


def build_report(
    args: argparse.Namespace,
    rounds: int,
    jobs: dict[int, int],
    keys: list[str],
    times: dict[str, dict[int, list[float]]],
    facts: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[str],
) -> dict[str, Any]:
    complete = not errors and all(len(times[k][p]) == rounds for k in keys for p in PARALLELS)
    contenders: dict[str, Any] = {}
    for key in keys:
        contenders[key] = {"label": LABELS[key], "by_parallel": {}}
        for p in PARALLELS:
            rates = [jobs[p] / t for t in times[key][p]]
            contenders[key]["by_parallel"][str(p)] = {
                "jobs": jobs[p],
                "jobs_per_s": summarise(rates),
                "batch_s": summarise(times[key][p]),
                "samples_batch_s": [round(t, 4) for t in times[key][p]],
            }
    ratios: dict[str, Any] = {}
    if complete:
        for p in PARALLELS:
            for num in keys:
                for den in keys:
                    if (
                        num != den
                        and den in ("docker_py", "aiodocker")
                        and num.startswith("sbxkit")
                    ):
                        # jobs/s ratio = inverse ratio of batch times (same N, paired rounds)
                        ratios[f"{num}/{den}@{p}"] = ratio_of_medians(times[den][p], times[num][p])
            if "sbxkit" in keys and "sbxkit_inproc" in keys:
                ratios[f"sbxkit/sbxkit_inproc@{p}"] = ratio_of_medians(
                    times["sbxkit_inproc"][p], times["sbxkit"][p]
                )
    measured = ratios.get(f"sbxkit/docker_py@{TARGET_PARALLEL}", {}).get("ratio")
    report: dict[str, Any] = {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "quick": bool(args.quick),
            "parallels": list(PARALLELS),
            "jobs_per_batch": {str(p): n for p, n in jobs.items()},
            "order": "per round: for P in parallels, for contender in order",
            "contenders": keys,
            "image": args.image,
            "runtime": args.runtime or "daemon default",
            "limits": {"cpus": CPUS, "memory_bytes": MEMORY_BYTES, "pids": PIDS},
            "clock": "time.perf_counter around each whole batch",
        },
        "contenders": contenders,
        "ratios": ratios,
        "targets": [
            {
                "expression": f"sbxkit/docker_py jobs/s at {TARGET_PARALLEL} >= {TARGET_RATIO}",
                "ratio": measured,
                "met": None if measured is None else measured >= TARGET_RATIO,
            }
        ],
        "plot": {
            "title": "throughput: one-shot `true` batches",
            "ylabel": "jobs/s (median, whiskers p10–p90)",
            "groups": [f"{p} in parallel" for p in PARALLELS],
            "series": [
                {
                    "label": LABELS[k],
                    "median": [
                        contenders[k]["by_parallel"][str(p)]["jobs_per_s"].get("median")
                        for p in PARALLELS
                    ],
                    "low": [
                        contenders[k]["by_parallel"][str(p)]["jobs_per_s"].get("p10")
                        for p in PARALLELS
                    ],
                    "high": [
                        contenders[k]["by_parallel"][str(p)]["jobs_per_s"].get("p90")
                        for p in PARALLELS
                    ],
                }
                for k in keys
            ]
            if complete
            else [],
        },
        **common.outcome(errors, leaks, leftovers),
    }
    return report


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        "# throughput — one-shot `true` batches",
        "",
        f"{m['date']} · {cfg['rounds']} rounds (+{cfg['warmup']} warm-up) · batches of "
        + ", ".join(f"{n} jobs at P={p}" for p, n in cfg["jobs_per_batch"].items())
        + f" · {common.docker_md(m, runtime=cfg['runtime'])}",
        "",
        "| contender | P | jobs/s median | p10 | p90 | min | max | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for info in report["contenders"].values():
        for p, entry in info["by_parallel"].items():
            s = entry["jobs_per_s"]
            out.append(
                f"| {info['label']} | {p} | {fmt(s.get('median'), 2)} | {fmt(s.get('p10'), 2)} | "
                f"{fmt(s.get('p90'), 2)} | {fmt(s.get('min'), 2)} | {fmt(s.get('max'), 2)} | "
                f"{s['n']} |"
            )
    out += common.ratio_table_md(report["ratios"], "jobs/s ratio (of medians)")
    for target in report["targets"]:
        out += common.target_md(target)
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    jobs = QUICK_JOBS if args.quick else JOBS
    report = trio.run(measure, args, rounds, jobs)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
