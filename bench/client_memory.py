"""Benchmark ``client_memory``: the client's memory per concurrent sandbox, 64 in flight.

Each measurement is a fresh child process (``python -m bench.client_memory --child KEY``) so
contenders never share a heap. The child opens its client, runs one warm-up sandbox (pools,
the supervisor connection, imports), collects garbage and reads its baseline; then it opens 64
``sleep`` sandboxes at once, waits until the daemon reports all 64 running (through the
standard-library witness), collects garbage, reads again, and ends them. Per sandbox =
(in flight − baseline) / 64.

Two modes, in separate children (tracemalloc's own bookkeeping would inflate the RSS):

``rss``
    ``VmRSS`` of the whole client process from ``/proc/self/status``: Python objects, thread
    stacks actually touched, buffers, C libraries' allocations — what the machine pays.
``tracemalloc``
    ``tracemalloc`` started at the baseline: Python-heap bytes allocated since and still live.

Contenders:

``sbxkit``
    ``sbxkit._consumers.harness.run_many(64 jobs, parallel=64, engine=engine)``, default owner (the
    supervisor: one Unix-socket connection per lease). Ended by cancelling the batch.
``docker_py``
    64 threads of a ``ThreadPoolExecutor`` on one ``DockerClient`` (pool 64), each
    create → start → wait → remove. Ended by killing the containers (the waits return).
``aiodocker``
    64 asyncio tasks on one ``aiodocker.Docker``, each create → start → wait → delete.

Limits: cpus 0.03 (64 × 0.03 = 1.92 fits the daemon's 2-CPU budget that the supervisor and
run_many admit against; 0.05 would not), memory 16 MiB, pids 16. The payload sleeps long enough
to outlast the ramp (starting 64 containers on 2 cores takes longer than 5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import secrets
import sys
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import trio

from bench import common
from bench.harness import machine_facts, ratio_of_medians, say
from bench.rawapi import RawEngine
from bench.suite import (
    ActivityWatch,
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
from sbxkit._consumers.runner import run
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.engine.client import open_engine

NAME = "client_memory"
SUMMARY = "client memory per concurrent sandbox at 64 in flight: sbxkit vs docker-py vs aiodocker"

IN_FLIGHT = 64
CPUS = 0.03
MEMORY_BYTES = 16 * MiB
PIDS = 16
SLEEP_S = 300
RAMP_DEADLINE_S = 150.0
DEFAULT_ROUNDS = 2
QUICK_ROUNDS = 1
MODES = ("rss", "tracemalloc")
CONTENDERS = ("sbxkit", "docker_py", "aiodocker")
LABELS = {
    "sbxkit": "sbxkit run_many",
    "docker_py": "docker-py, 64 threads",
    "aiodocker": "aiodocker, 64 tasks",
}
SAMPLE_LABEL = "sbxkit.bench.sample"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} round")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="discarded rounds (default 0: each child warms itself up before its baseline)",
    )
    parser.add_argument("--n", type=int, default=IN_FLIGHT, help="sandboxes in flight")
    common.add_contenders_argument(parser, CONTENDERS)
    common.add_daemon_arguments(parser, default_busybox())
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="rss", choices=MODES, help=argparse.SUPPRESS)


# --- the child -----------------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Probe:
    """Baseline and in-flight readings of this process, in the child's mode."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.baseline = 0
        self.in_flight = 0

    def read(self) -> int:
        gc.collect()
        if self.mode == "tracemalloc":
            return tracemalloc.get_traced_memory()[0]
        return rss_bytes()

    def begin(self) -> None:
        gc.collect()
        if self.mode == "tracemalloc":
            tracemalloc.start()
        self.baseline = self.read()

    def end(self) -> None:
        self.in_flight = self.read()


def running(witness: RawEngine, sample: str) -> int:
    found = witness.containers(label=f"{SAMPLE_LABEL}={sample}")
    return sum(1 for c in found if c.get("State") == "running")


def wait_running(witness: RawEngine, sample: str, n: int) -> float:
    t0 = time.monotonic()
    while running(witness, sample) < n:
        if time.monotonic() - t0 > RAMP_DEADLINE_S:
            raise RuntimeError(f"fewer than {n} running after {RAMP_DEADLINE_S:g} s")
        time.sleep(0.25)
    return time.monotonic() - t0


def kill_all(witness: RawEngine, sample: str) -> None:
    for container in witness.containers(label=f"{SAMPLE_LABEL}={sample}"):
        try:
            witness.call("POST", f"/containers/{container['Id']}/kill", ok=(204, 404, 409))
        except Exception as exc:  # the wait returning is what matters; removal follows
            print(f"kill {container['Id'][:12]}: {exc}", file=sys.stderr)


def sleep_spec(image: str, key: str, sample: str) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["sleep", str(SLEEP_S)],
        limits=Limits(
            cpus=CPUS, memory_bytes=MEMORY_BYTES, pids=PIDS, output_bytes=MiB, timeout_s=SLEEP_S
        ),
        labels={**label_of(NAME, key), SAMPLE_LABEL: sample},
    )


def peer_sleep_body(image: str, key: str, sample: str, command: list[str]) -> dict[str, Any]:
    return peer_body(
        image,
        command,
        {**label_of(NAME, key), SAMPLE_LABEL: sample},
        cpus=CPUS,
        memory_bytes=MEMORY_BYTES,
        pids=PIDS,
    )


async def child_sbxkit(args: argparse.Namespace, probe: Probe, sample: str) -> float:
    witness = RawEngine(args.socket)
    async with open_engine(args.socket) as engine:
        warm = sleep_spec(args.image, "sbxkit", sample + "-warm")
        warm.command = ["true"]
        await run(warm, engine=engine)
        probe.begin()
        jobs = [Job(id=i, spec=sleep_spec(args.image, "sbxkit", sample)) for i in range(args.n)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(run_many, jobs, parallel=args.n, engine=engine))
            ramp = await trio.to_thread.run_sync(wait_running, witness, sample, args.n)
            probe.end()
            nursery.cancel_scope.cancel()
    witness.close()
    return ramp


def child_dockerpy(args: argparse.Namespace, probe: Probe, sample: str) -> float:
    witness = RawEngine(args.socket)
    client = dockerpy_client(args.socket, args.n)
    dockerpy_one_shot(client, peer_sleep_body(args.image, "docker_py", sample + "-warm", ["true"]))
    body = peer_sleep_body(args.image, "docker_py", sample, ["sleep", str(SLEEP_S)])
    probe.begin()
    with ThreadPoolExecutor(args.n, "sbxbench-dockerpy") as pool:
        futures = [pool.submit(dockerpy_one_shot, client, body) for _ in range(args.n)]
        try:
            ramp = wait_running(witness, sample, args.n)
            probe.end()
        finally:
            kill_all(witness, sample)
        for future in futures:
            future.result()
    client.close()
    witness.close()
    return ramp


async def child_aiodocker(args: argparse.Namespace, probe: Probe, sample: str) -> float:
    witness = RawEngine(args.socket)
    docker = aiodocker_client(args.socket)
    try:
        await aiodocker_one_shot(
            docker, peer_sleep_body(args.image, "aiodocker", sample + "-warm", ["true"])
        )
        body = peer_sleep_body(args.image, "aiodocker", sample, ["sleep", str(SLEEP_S)])
        probe.begin()
        tasks = [asyncio.ensure_future(aiodocker_one_shot(docker, body)) for _ in range(args.n)]
        try:
            ramp = await asyncio.to_thread(wait_running, witness, sample, args.n)
            probe.end()
        finally:
            await asyncio.to_thread(kill_all, witness, sample)
            await asyncio.gather(*tasks)
    finally:
        await docker.close()
        witness.close()
    return ramp


def child_main(args: argparse.Namespace) -> int:
    probe = Probe(args.mode)
    sample = secrets.token_hex(8)
    runners: dict[str, Callable[[], float]] = {
        "sbxkit": lambda: trio.run(child_sbxkit, args, probe, sample),
        "docker_py": lambda: child_dockerpy(args, probe, sample),
        "aiodocker": lambda: asyncio.run(child_aiodocker(args, probe, sample)),
    }
    ramp = runners[args.child]()
    print(
        json.dumps(
            {
                "key": args.child,
                "mode": args.mode,
                "n": args.n,
                "baseline_bytes": probe.baseline,
                "in_flight_bytes": probe.in_flight,
                "per_sandbox_bytes": (probe.in_flight - probe.baseline) / args.n,
                "ramp_s": ramp,
                "threads_at_end": len(os.listdir("/proc/self/task")),
            }
        )
    )
    return 0


# --- the parent ----------------------------------------------------------------------------------


async def run_child(args: argparse.Namespace, key: str, mode: str) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "bench.client_memory",
        "--child",
        key,
        "--mode",
        mode,
        "--n",
        str(args.n),
        "--socket",
        args.socket,
        "--image",
        args.image,
    ]
    done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{key}/{mode} child exited {done.returncode}: "
            f"{done.stderr.decode(errors='replace')[-800:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


async def measure(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    keys = [k.strip() for k in args.contenders.split(",") if k.strip()]
    if set(keys) - set(CONTENDERS):
        raise SystemExit(f"bench {NAME}: unknown contenders {sorted(set(keys) - set(CONTENDERS))}")
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {k: {m: [] for m in MODES} for k in keys}
    errors: list[str] = []
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
    say(f"{NAME}: {rounds} rounds × modes {MODES} × {keys}, {args.n} in flight, one child each")
    await trio.to_thread.run_sync(activity.start)
    try:
        for round_no in range(-args.warmup, rounds):
            for mode in MODES:
                for key in keys:
                    sample = await run_child(args, key, mode)
                    if round_no < 0:
                        continue
                    samples[key][mode].append(sample)
                    say(
                        f"  round {round_no + 1} {mode:<11} {key:<10} "
                        f"{sample['per_sandbox_bytes'] / 1024:8.1f} KiB/sandbox "
                        f"(ramp {sample['ramp_s']:.1f} s)"
                    )
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        with trio.CancelScope(shield=True):
            found = await common.stop_and_sweep(facts, activity, leaks)
    return build_report(args, rounds, keys, samples, facts, errors, found, leaks.leftovers)


def build_report(
    args: argparse.Namespace,
    rounds: int,
    keys: list[str],
    samples: dict[str, dict[str, list[dict[str, Any]]]],
    facts: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[str],
) -> dict[str, Any]:
    complete = not errors and all(len(samples[k][m]) == rounds for k in keys for m in MODES)
    per_kib = {
        k: {m: [s["per_sandbox_bytes"] / 1024 for s in samples[k][m]] for m in MODES} for k in keys
    }
    contenders = {
        k: {
            "label": LABELS[k],
            **{f"{m}_kib_per_sandbox": summarise(per_kib[k][m]) for m in MODES},
            "baseline_rss_mib": summarise([s["baseline_bytes"] / MiB for s in samples[k]["rss"]]),
            "ramp_s": summarise([s["ramp_s"] for m in MODES for s in samples[k][m]]),
            "samples": samples[k],
        }
        for k in keys
    }
    ratios: dict[str, Any] = {}
    if complete:
        for other in ("docker_py", "aiodocker"):
            if "sbxkit" in keys and other in keys:
                for m in MODES:
                    ratios[f"sbxkit/{other} {m} per sandbox"] = ratio_of_medians(
                        per_kib["sbxkit"][m], per_kib[other][m]
                    )
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "quick": bool(args.quick),
            "in_flight": args.n,
            "modes": list(MODES),
            "order": "per round: for mode in modes, for contender in order; one child each",
            "contenders": keys,
            "image": args.image,
            "payload": ["sleep", str(SLEEP_S)],
            "limits": {"cpus": CPUS, "memory_bytes": MEMORY_BYTES, "pids": PIDS},
            "kib": "1024 bytes",
        },
        "contenders": contenders,
        "ratios": ratios,
        "targets": [],
        "plot": {
            "title": f"client memory per sandbox, {args.n} in flight",
            "ylabel": "KiB per sandbox (median, whiskers min–max)",
            "groups": ["RSS delta / n", "tracemalloc delta / n"],
            "series": [
                common.min_max_series(
                    LABELS[k], [contenders[k][f"{m}_kib_per_sandbox"] for m in MODES]
                )
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
        f"# client_memory — client memory per sandbox, {cfg['in_flight']} in flight",
        "",
        f"{m['date']} · {cfg['rounds']} rounds per mode, one child process per measurement · "
        f"`{' '.join(cfg['payload'])}`, cpus {cfg['limits']['cpus']}, memory 16 MiB · "
        f"{common.docker_md(m)} · KiB = 1024 bytes",
        "",
        "| contender | RSS KiB/sandbox median | min | max | tracemalloc KiB/sandbox median | "
        "min | max | baseline RSS MiB | ramp s | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for info in report["contenders"].values():
        r, t = info["rss_kib_per_sandbox"], info["tracemalloc_kib_per_sandbox"]
        out.append(
            f"| {info['label']} | {fmt(r.get('median'))} | {fmt(r.get('min'))} | "
            f"{fmt(r.get('max'))} | {fmt(t.get('median'))} | {fmt(t.get('min'))} | "
            f"{fmt(t.get('max'))} | {fmt(info['baseline_rss_mib'].get('median'))} | "
            f"{fmt(info['ramp_s'].get('median'))} | {r['n']} |"
        )
    out += common.ratio_table_md(report["ratios"], halves_title=None)
    out += ["", "No target was set for this benchmark; lower is better."]
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    if args.child is not None:
        return child_main(args)
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    report = trio.run(measure, args, rounds)
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
