"""Benchmark ``cluster_parallel``: a cluster batch at ``parallel=64`` on nodes with 2 CPUs and
64 advertised sandboxes, against the same batch run locally — and the Ray workers it starts.

Issue 43 found ``--parallel 64`` on a 2-core node starting 28 Ray workers and running 5× slower
than a local batch: every relay in flight was a Ray worker process of its own (relays asked for
no CPU, and the nodes advertised 64 sandboxes). The cluster is the cluster tier's
(tests/cluster/cluster.py), its two worker nodes restarted as ``sbxkit cluster resources``
would declare them by default (``sbxkit_sandboxes: 64``) with Ray's default CPUs (this machine's
count). One driver process inside the namespace runs, interleaved round-robin, one batch of
``--jobs`` one-shot ``true`` jobs per contender:

``local``
    ``run_many(jobs, parallel=64)`` straight on node A's daemon (its own supervisor state dir).
``ray``
    ``run_many(jobs, parallel=64, cluster=RayCluster(address))``: both nodes.

Reported, after ``--warmup`` discarded rounds (the first batch on fresh nodes pays Ray's
first workers and the agents' start): each contender's batch time (median), ``ray/local``, and
the most Ray worker processes (``ray::…``) seen on each node during the ray batches, warm-up
included (sampled every 0.1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from bench import common
from bench.cluster import add_cluster_arguments, on_cluster, prepare_driver, ratio_rows
from bench.harness import ratio_of_medians, say
from bench.suite import fmt, label_of, summarise

NAME = "cluster_parallel"
SUMMARY = "a cluster batch at parallel 64 on 2-CPU nodes vs local; the Ray workers it starts"
CONTENDERS = ("local", "ray")
PARALLEL = 64
WIDE = {"sbxkit_sandboxes": 64, "sbxkit_memory_mib": 8192}
DEFAULT_JOBS, DEFAULT_ROUNDS, QUICK_ROUNDS = 64, 3, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument(
        "--warmup", type=int, default=1, help="discarded rounds (default 1): Ray's first workers"
    )
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="per batch (default 64)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} round")
    add_cluster_arguments(parser, NAME)


def main(args: argparse.Namespace) -> int:
    if args.measure is not None:
        return _measure(json.loads(args.measure))
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    cpus = os.cpu_count() or 1
    load = os.getloadavg()  # before the cluster starts

    def wide_nodes(cluster: Any) -> None:  # as `sbxkit cluster resources` declares a node
        for name in ("raya", "rayb"):
            cluster.stop_node(name)
            cluster.start_node(name, resources=WIDE, cpus=cpus)

    ran = on_cluster(
        NAME, args, {"jobs": args.jobs, "rounds": rounds, "warmup": args.warmup}, wide_nodes
    )
    if ran is None:
        return 2
    measured, errors, found = ran
    report = _report(rounds, args, cpus, load, measured, errors, found)
    return common.publish(args, NAME, report, _render(report))


# --- the driver, inside the namespace ---------------------------------------------------------


def _measure(config: dict[str, Any]) -> int:
    import msgspec
    import ray
    import trio

    import sbxkit

    spec = prepare_driver(config)
    times: dict[str, list[float]] = {key: [] for key in CONTENDERS}
    most = dict.fromkeys(config["sockets"], 0)
    errors: list[str] = []

    from tests.cluster.cluster import ray_workers

    def sample(stop: threading.Event) -> None:
        while not stop.wait(0.1):
            for name, socket in config["sockets"].items():
                most[name] = max(most[name], len(ray_workers(socket)))

    async def batch(key: str) -> tuple[float, list[Any]]:
        labelled = msgspec.structs.replace(spec, labels=label_of(NAME, key))
        jobs = [sbxkit.Job(id=i, spec=labelled) for i in range(config["jobs"])]
        t0 = time.perf_counter()
        if key == "local":
            results = await sbxkit.run_many(
                jobs, parallel=PARALLEL, socket_path=config["local_socket"]
            )
        else:
            stop = threading.Event()
            sampler = threading.Thread(target=sample, args=(stop,), daemon=True)
            sampler.start()
            try:
                cluster = sbxkit.RayCluster(config["address"])
                results = await sbxkit.run_many(jobs, parallel=PARALLEL, cluster=cluster)
            finally:
                stop.set()
                sampler.join()
        return time.perf_counter() - t0, results

    async def rounds() -> None:
        for round_no in range(-config["warmup"], config["rounds"]):
            walls = {}
            for key in CONTENDERS:
                walls[key], results = await batch(key)
                bad = [r for r in results if not r.ok]
                if bad:
                    errors.append(f"{key}: {len(bad)} jobs failed: {bad[0].error or bad[0].result}")
                    return
                if round_no >= 0:
                    times[key].append(walls[key])
            kind = f"round {round_no + 1}/{config['rounds']}" if round_no >= 0 else "warm-up"
            say(f"  {kind}: local {walls['local']:.1f} s, Ray {walls['ray']:.1f} s")

    trio.run(rounds)
    ray.shutdown()
    print(json.dumps({"times": times, "most_workers": most, "errors": errors}))
    return 0


# --- the report --------------------------------------------------------------------------------


def _report(
    rounds: int,
    args: argparse.Namespace,
    cpus: int,
    load: tuple[float, float, float],
    measured: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
) -> dict[str, Any]:
    times: dict[str, list[float]] = measured.get("times", {})
    complete = not errors and all(len(times.get(k, [])) == rounds for k in CONTENDERS)
    ratios: dict[str, Any] = {}
    if complete:
        ratios["batch time ray/local"] = ratio_of_medians(times["ray"], times["local"])
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "ok": complete and not leaks,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "jobs_per_batch": args.jobs,
            "parallel": PARALLEL,
            "node_resources": WIDE,
            "node_cpus": cpus,
            "image": args.image,
            "command": "true",
            "order": "per round: local, ray",
            "loadavg_at_start": list(load),
        },
        "batch_s": {key: summarise(times.get(key, [])) if complete else {} for key in CONTENDERS},
        "most_ray_workers": measured.get("most_workers", {}),
        "ratios": ratios,
        "errors": errors,
        "leaks": leaks,
    }


def _render(report: dict[str, Any]) -> str:
    config = report["config"]
    out = [
        f"# {NAME}: {SUMMARY}",
        "",
        f"{config['jobs_per_batch']} one-shot `true` jobs a batch at parallel "
        f"{config['parallel']}, {config['rounds']} rounds interleaved (+{config['warmup']} "
        "warm-up); nodes with "
        f"{config['node_cpus']} CPUs and {config['node_resources']} "
        f"(load at start {config['loadavg_at_start'][0]:.2f}).",
        "",
        "| contender | batch s (median) |",
        "|---|---:|",
    ]
    for key, summary in report["batch_s"].items():
        out.append(f"| {key} | {fmt(summary.get('median'), 2)} |")
    out += ["", f"Most Ray worker processes on a node: {report['most_ray_workers']}", ""]
    out += ratio_rows(report["ratios"])
    out += [f"- error: {e}" for e in report["errors"]]
    out += [f"- leaked: {leak}" for leak in report["leaks"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    from bench.suite import standalone

    raise SystemExit(standalone(NAME, SUMMARY, add_arguments, main))
