"""Benchmark ``cluster``: one batch on one Ray node vs two, and what Ray adds per job.

The cluster is the cluster tier's (tests/cluster/cluster.py): a head and two worker nodes on
this machine, in a network namespace with only loopback, each worker bound to its own Docker
daemon (``--sockets``, default ``SBXKIT_TEST_CLUSTER_SOCKETS``; scripts/cluster-engines-up
provisions two). One driver process inside the namespace runs the contenders interleaved,
round-robin (README.md's method); one measured call is one whole batch of ``--jobs`` one-shot
``true`` jobs (the python image: its content is the same on every daemon of this machine), and
jobs/s = N / its wall time:

``local``
    ``run_many(jobs, parallel=4)`` straight on node A's daemon (its own supervisor state dir):
    the baseline, no Ray.
``ray_one``
    ``run_many(jobs, cluster=RayCluster(address, nodes=["raya"]))``: the same daemon and the
    same 4 slots (the node advertises ``sbxkit_sandboxes: 4``), through Ray: a relay task per
    job placed by resources, the node's agent, its supervisor.
``ray_two``
    ``RayCluster(address)``: both nodes, 8 slots.

Each cluster batch pays a fixed cost first — its agents start and join (``setup_s``: from the
call to the first job handed to Ray) — so the per-job overhead is given both whole and after
that setup: ``ray_one/local`` of batch times (same N) and of (batch − setup).

**What a 2-core machine shares between the two daemons**: both daemons, both containerds, the
three raylets and every sandbox run on the same two cores and the same disk, so two nodes here
cannot be twice one node; the ratio shows how much of a second host's capacity sbxkit and Ray
can use when the CPUs are not the bottleneck, not what two real hosts give.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.harness import ratio_of_medians, say
from bench.suite import LeakCheck, default_python, fmt, label_of, summarise

NAME = "cluster"
SUMMARY = "one Ray node vs two on the same batch (jobs/s); Ray's per-job overhead vs run_many"
CONTENDERS = ("local", "ray_one", "ray_two")
LABELS = {
    "local": "run_many on one daemon (no Ray)",
    "ray_one": "Ray, one node (same daemon, same 4 slots)",
    "ray_two": "Ray, two nodes (8 slots)",
}
DEFAULT_JOBS, QUICK_JOBS = 32, 16
DEFAULT_ROUNDS, QUICK_ROUNDS = 5, 2
SLOTS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--warmup", type=int, default=1, help="discarded rounds (default 1)")
    parser.add_argument(
        "--jobs", type=int, default=None, help=f"per batch (default {DEFAULT_JOBS})"
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 16 jobs")
    add_cluster_arguments(parser, NAME)


def add_cluster_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """What every benchmark on the test cluster takes: the nodes' daemons, image, output."""
    parser.add_argument(
        "--sockets",
        default=os.environ.get("SBXKIT_TEST_CLUSTER_SOCKETS", ""),
        help="the two worker nodes' Docker sockets, comma-separated "
        "(default: $SBXKIT_TEST_CLUSTER_SOCKETS)",
    )
    parser.add_argument("--image", default=default_python())
    common.add_out_argument(parser, name)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the driver inside the namespace


def main(args: argparse.Namespace) -> int:
    if args.measure is not None:
        return _measure(json.loads(args.measure))
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    jobs = args.jobs or (QUICK_JOBS if args.quick else DEFAULT_JOBS)
    config = {"jobs": jobs, "rounds": rounds, "warmup": args.warmup}
    ran = on_cluster(NAME, args, config, lambda cluster: None)
    if ran is None:
        return 2
    measured, errors, found = ran
    report = _report(args, rounds, jobs, measured, errors, found)
    return common.publish(args, NAME, report, _render(report))


def on_cluster(
    name: str, args: argparse.Namespace, config: dict[str, Any], shape: Callable[[Any], None]
) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]] | None:
    """Start the test cluster on ``args.sockets``, let ``shape`` restart its nodes as the
    benchmark wants, run benchmark ``name``'s driver with ``config`` (plus the cluster's
    address, image, node A's socket, the nodes' sockets and a local state dir), stop it all.
    Returns what the driver measured, the errors, and the containers leaked; None (said why)
    without two sockets."""
    sockets = [s.strip() for s in args.sockets.split(",") if s.strip()]
    if len(sockets) != 2:
        say(f"bench {name}: --sockets must name two Docker sockets (scripts/cluster-engines-up)")
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.cluster.cluster import ADDRESS, LocalCluster

    root = Path(tempfile.mkdtemp(prefix="sbxr-", dir="/tmp"))
    leaks = [LeakCheck(socket, name) for socket in sockets]
    names = ("raya", "rayb")
    cluster = LocalCluster(root, dict(zip(names, sockets, strict=True)))
    measured: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        cluster.start()
        shape(cluster)
        say(f"{name}: cluster up in {time.perf_counter() - t0:.1f} s")
        measured = drive(
            cluster,
            name,
            {
                **config,
                "address": ADDRESS,
                "image": args.image,
                "local_socket": sockets[0],
                "sockets": dict(zip(names, sockets, strict=True)),
                "state_dir": str(root / "state-local"),
            },
        )
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    found = [leak for check in leaks for leak in check.sweep()]
    return measured, list(measured.get("errors", [])), found


def drive(cluster: Any, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Run benchmark ``name``'s driver (``--measure config``) inside ``cluster``'s namespace;
    its last stdout line, parsed (``errors`` says what went wrong)."""
    from tests.cluster.cluster import REPO

    done = subprocess.run(
        cluster.in_ns([sys.executable, "-m", "bench", name, "--measure", json.dumps(config)]),
        cwd=REPO,
        env=cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        return {"errors": [f"the driver exited {done.returncode}"]}
    measured: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return measured


def ratio_rows(ratios: dict[str, Any]) -> list[str]:
    """The markdown table of ``ratio_of_medians`` results, by name."""
    out = ["| ratio | median | halves | bootstrap 95 % |", "|---|---:|---|---|"]
    for name, ratio in ratios.items():
        halves = ", ".join(f"{h:.3f}" for h in ratio["halves"])
        low, high = ratio["bootstrap95"]
        out.append(f"| {name} | {ratio['ratio']:.3f} | {halves} | {low:.3f}–{high:.3f} |")
    return out


# --- the driver, inside the namespace ---------------------------------------------------------


def prepare_driver(config: dict[str, Any]) -> Any:
    """The driver's start: joins the cluster, points the local contender's supervisor at its
    state dir; returns the one-shot ``true`` spec every job runs."""
    import ray

    import sbxkit

    os.environ["SBXKIT_STATE_DIR"] = config["state_dir"]
    ray.init(address=config["address"], logging_level="ERROR", log_to_driver=False)
    return sbxkit.SandboxSpec(
        image=config["image"],
        command=["true"],
        limits=sbxkit.Limits(
            cpus=0.1, memory_bytes=32 * sbxkit.MiB, pids=32, output_bytes=sbxkit.MiB, timeout_s=60
        ),
    )


def _measure(config: dict[str, Any]) -> int:
    import msgspec
    import ray
    import trio

    import sbxkit

    spec = prepare_driver(config)
    times: dict[str, list[float]] = {key: [] for key in CONTENDERS}
    setups: dict[str, list[float]] = {key: [] for key in CONTENDERS}
    placed: dict[str, dict[str, int]] = {key: {} for key in CONTENDERS}
    errors: list[str] = []

    async def batch(key: str) -> tuple[float, float, list[Any]]:
        labelled = msgspec.structs.replace(spec, labels=label_of(NAME, key))
        jobs = [sbxkit.Job(id=i, spec=labelled) for i in range(config["jobs"])]
        first: list[float] = []
        t0 = time.perf_counter()

        def started(_: object) -> None:
            if not first:
                first.append(time.perf_counter() - t0)

        if key == "local":
            results = await sbxkit.run_many(
                jobs, parallel=SLOTS, socket_path=config["local_socket"], on_start=started
            )
        else:
            nodes = ["raya"] if key == "ray_one" else None
            cluster = sbxkit.RayCluster(config["address"], nodes=nodes)
            results = await sbxkit.run_many(
                jobs, parallel=1_000_000, cluster=cluster, on_start=started
            )
        return time.perf_counter() - t0, first[0] if first else 0.0, results

    async def rounds() -> None:
        for round_no in range(-config["warmup"], config["rounds"]):
            for key in CONTENDERS:
                wall, setup, results = await batch(key)
                bad = [r for r in results if not r.ok]
                if bad:
                    errors.append(f"{key}: {len(bad)} jobs failed: {bad[0].error or bad[0].result}")
                    return
                if round_no >= 0:
                    times[key].append(wall)
                    setups[key].append(setup)
                    for r in results:
                        placed[key][r.node or "local"] = placed[key].get(r.node or "local", 0) + 1
            say(f"  round {round_no + 1}/{config['rounds']}" if round_no >= 0 else "  warm-up")

    trio.run(rounds)
    ray.shutdown()
    print(json.dumps({"times": times, "setups": setups, "placed": placed, "errors": errors}))
    return 0


# --- the report --------------------------------------------------------------------------------


def _report(
    args: argparse.Namespace,
    rounds: int,
    jobs: int,
    measured: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
) -> dict[str, Any]:
    times: dict[str, list[float]] = measured.get("times", {})
    setups: dict[str, list[float]] = measured.get("setups", {})
    complete = not errors and all(len(times.get(k, [])) == rounds for k in CONTENDERS)
    contenders = {
        key: {
            "label": LABELS[key],
            "jobs_per_s": summarise([jobs / t for t in times.get(key, [])]) if complete else {},
            "batch_s": summarise(times.get(key, [])) if complete else {},
            "setup_s": summarise(setups.get(key, [])) if complete else {},
            "placed": measured.get("placed", {}).get(key, {}),
        }
        for key in CONTENDERS
    }
    ratios: dict[str, Any] = {}
    if complete:
        # jobs/s of two nodes over one = one's batch time over two's (same N, paired rounds)
        ratios["jobs_per_s ray_two/ray_one"] = ratio_of_medians(times["ray_one"], times["ray_two"])
        ratios["jobs_per_s ray_two/local"] = ratio_of_medians(times["local"], times["ray_two"])
        ratios["per-job time ray_one/local"] = ratio_of_medians(times["ray_one"], times["local"])
        after_setup = [t - s for t, s in zip(times["ray_one"], setups["ray_one"], strict=True)]
        ratios["per-job time after setup ray_one/local"] = ratio_of_medians(
            after_setup, times["local"]
        )
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "ok": complete and not leaks,
        "config": {
            "rounds": rounds,
            "warmup": args.warmup,
            "jobs_per_batch": jobs,
            "slots_per_node": SLOTS,
            "image": args.image,
            "command": "true",
            "order": "per round: local, ray_one, ray_two",
            "nproc": os.cpu_count(),
            "loadavg_at_start": list(os.getloadavg()),
        },
        "contenders": contenders,
        "ratios": ratios,
        "errors": errors,
        "leaks": leaks,
    }


def _render(report: dict[str, Any]) -> str:
    out = [
        f"# {NAME}: {SUMMARY}",
        "",
        f"{report['config']['jobs_per_batch']} one-shot `true` jobs a batch, "
        f"{report['config']['rounds']} rounds interleaved, {report['config']['nproc']} CPUs "
        f"(load at start {report['config']['loadavg_at_start'][0]:.2f}).",
        "",
        "| contender | jobs/s (median) | batch s (median) | setup s (median) | placed |",
        "|---|---:|---:|---:|---|",
    ]
    for contender in report["contenders"].values():
        out.append(
            f"| {contender['label']} | {fmt(contender['jobs_per_s'].get('median'), 2)} | "
            f"{fmt(contender['batch_s'].get('median'), 2)} | "
            f"{fmt(contender['setup_s'].get('median'), 2)} | {contender['placed']} |"
        )
    out += ["", *ratio_rows(report["ratios"])]
    out += [
        "",
        "Both daemons, both containerds, the three raylets and every sandbox share this "
        "machine's CPUs and disk: two nodes here cannot be twice one node.",
    ]
    out += [f"- error: {e}" for e in report["errors"]]
    out += [f"- leaked: {leak}" for leak in report["leaks"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    from bench.suite import standalone

    raise SystemExit(standalone(NAME, SUMMARY, add_arguments, main))
