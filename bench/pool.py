"""Benchmark ``pool``: a one-shot ``true`` claimed from a warm pool vs a cold run vs the floor.

Contenders, interleaved round-robin in one trio program:

``pooled``
    ``await pool.run(spec)`` on an ``open_pool(spec, size=2)``: the user-visible latency of a
    claim (the claim line, the payload, its exit judged); the container's removal goes on in
    the pool under its owner, and the pool refills in the background between rounds. On this
    host's kernel path (sbxkit/kernel): the claim goes into the parked sandbox's FIFO, the
    exit is its init's pidfd.
``pooled_daemon``
    The same on the daemon's path (``Settings(evidence="daemon")``): the claim line on the
    attach stream, the exit the daemon's ``wait``.
``cold``
    ``await sbxkit.run(spec)``: plan, create, verify, start, run on the kernel path; returns at
    the payload's exit, the removal going on under the supervisor.
``cold_daemon``
    The same on the daemon's path: attach, wait, start, run, wait's reply, remove.
``raw``
    The raw Engine API floor of ``bench oneshot``: create, start, wait, delete of a ``true``
    with the same limits and no hardening (stdlib HTTP over the socket, in a worker thread).
``raw_kernel``
    The kernel path's daemon and kernel work without sbxkit (bench/kernel_floor.py): sbxkit's
    own kernel path body through the raw client, timed from the create to the init's exit
    status on its pidfd. ``raw_kernel/raw`` is the best ``cold/raw`` the kernel path allows on
    the day's daemon; ``cold/raw_kernel`` how much sbxkit's client and supervisor add to it.

Both sbxkit contenders use the default owner, the supervisor (``--state-dir`` for a private
one). Targets (issue 21): **pooled ≤ 0.05 × the cold floor** (``pooled/raw``) and **cold ≤
0.80 × it** (``cold/raw``), as ratios of medians from one run; p99 is reported beside the
medians.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from bench import common
from bench.harness import (
    Contender,
    ContenderFailed,
    StepTimings,
    machine_facts,
    median_with_hints,
    run_interleaved,
    say,
)
from bench.kernel_floor import KernelFloorRun
from bench.oneshot import raw_contender, raw_create_body
from bench.pool_plot import write_plot
from bench.pool_sustained import measure_sustained, sustained_lines, sustained_md
from bench.rawapi import RawEngine
from bench.suite import default_busybox, default_socket, percentile
from sbxkit._consumers.runner import run
from sbxkit._lifecycle.leases_admin import pools_request
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._protocol.records import record_filename
from sbxkit._protocol.wire import ListPools
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import open_engine
from sbxkit.pool import Pool, open_pool
from sbxkit.pool.held import HeldPool, PooledBackend

NAME = "pool"
SUMMARY = "one-shot `true`: claimed from a warm pool vs a cold sbxkit run vs the raw floor"

TARGETS = (("pooled/raw", 0.05), ("cold/raw", 0.80))
"""Ratios of medians and their ceilings (issue 21; issue 13's was pooled/raw <= 0.20)."""

DEFAULT_ROUNDS = 30
QUICK_ROUNDS = 5
DEFAULT_WARMUP = 3
QUICK_WARMUP = 1
ROUND_COUNTS = common.RoundCounts(DEFAULT_ROUNDS, DEFAULT_WARMUP, QUICK_ROUNDS, QUICK_WARMUP)
DEFAULT_ORDER = (
    "pooled",
    "pooled_daemon",
    "held",
    "cold",
    "cold_daemon",
    "raw",
    "raw_kernel",
    "cli_held",
    "cli_cold",
)
BENCH_LABEL = "sbxkit.bench-pool"
RATIOS = (
    ("pooled", "raw"),
    ("pooled_daemon", "raw"),
    ("pooled", "cold"),
    ("cold_daemon", "raw"),
    ("cold", "cold_daemon"),
    ("held", "raw"),
    ("held", "cold"),
    ("cold", "raw"),
    ("raw_kernel", "raw"),
    ("cold", "raw_kernel"),
    ("cli_held", "cli_cold"),
)
POOL_SIZE = 2
SUSTAINED_JOBS = 160
QUICK_SUSTAINED_JOBS = 32
SUSTAINED_ROUNDS = 3
DEFAULT_SHUFFLE_SEED = 1
"""Rounds are shuffled unless ``--fixed-order``: a fixed order moved the cold ratio from 0.781
to 0.820 at the same code on the same morning (bench/README.md, Method), so a verdict taken in
one would be the order's."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(parser, ROUND_COUNTS, default_order=",".join(DEFAULT_ORDER))
    parser.add_argument("--socket", default=default_socket(), help="daemon socket")
    parser.add_argument("--image", default=default_busybox(), help="busybox image (local)")
    parser.add_argument(
        "--state-dir", help="supervisor state dir (default: a private temporary one)"
    )
    parser.add_argument(
        "--burst",
        type=int,
        default=16,
        metavar="N",
        help="throughput phase: N runs at once, cold vs pooled (0: skip; default 16)",
    )
    parser.add_argument("--burst-rounds", type=int, default=3, metavar="R")
    parser.add_argument(
        "--sustained",
        type=int,
        default=None,
        metavar="N",
        help="sustained phase: N runs at --sustained-width at once, cold vs pooled with "
        f"refills (0: skip; default {SUSTAINED_JOBS}, {QUICK_SUSTAINED_JOBS} with --quick)",
    )
    parser.add_argument("--sustained-width", type=int, default=16, metavar="W")
    parser.add_argument(
        "--sustained-rounds",
        type=int,
        default=None,
        metavar="R",
        help=f"default {SUSTAINED_ROUNDS}, 1 with --quick",
    )
    parser.add_argument("--sustained-warmup", type=int, default=0, metavar="R")
    order = parser.add_mutually_exclusive_group()
    order.add_argument(
        "--shuffle",
        type=int,
        default=DEFAULT_SHUFFLE_SEED,
        metavar="SEED",
        help="draw each round's order afresh from this seed, so what runs just before a "
        f"contender varies instead of favouring one (default: seed {DEFAULT_SHUFFLE_SEED})",
    )
    order.add_argument(
        "--fixed-order",
        dest="shuffle",
        action="store_const",
        const=None,
        help="run every round in the same order (--order's): to see what position does",
    )
    parser.add_argument(
        "--note", default="", help="said beside the figures (e.g. what else loads the machine)"
    )
    common.add_out_argument(parser, "pool.json / .md")


def true_spec(image: str) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["true"],
        limits=Limits(cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=30),
        labels={BENCH_LABEL: NAME},
    )


class Settling:
    """The containers whose removal a run left to its owner (it returned at the payload's
    exit), and the pools a claim left to refill; ``settle`` waits, untimed, until the daemon
    has removed the one and every pool is full again, so neither a contender's background
    removal nor a pool's refill (a create and a start) loads the daemon under the next one's
    measured run. With ``records`` (the supervisor's state directory) it also waits until the
    owner has closed each such lease, its record deleted: the daemon's answer comes before
    the record's deletion, whose fsync would otherwise meet the next run's first record."""

    def __init__(self, witness: RawEngine, records: Path | None = None) -> None:
        self.witness = witness
        self.records = records
        self.pending: set[str] = set()
        self.leases: set[str] = set()
        self.refills: list[Callable[[], Awaitable[object]]] = []
        """Each waits until its pool has all its containers parked again."""
        self.chores: list[Callable[[], Awaitable[object]]] = []
        """Untimed work a run left to be done once (``raw_kernel``'s wait and DELETE)."""

    def left(self, result: RunResult) -> RunResult:
        self.pending.add(result.container_id)
        if self.records is not None:
            self.leases.add(result.lease)
        return result

    async def settle(self) -> None:
        with trio.fail_after(60):
            await self.do_chores()
            while self.pending:
                listed = await trio.to_thread.run_sync(self.witness.containers, BENCH_LABEL)
                self.pending &= {c["Id"] for c in listed}
                if self.pending:
                    await trio.sleep(0.005)
            while self.leases:
                self.leases = {lease for lease in self.leases if self._recorded(lease)}
                if self.leases:
                    await trio.sleep(0.002)
            for refilled in self.refills:
                await refilled()

    async def do_chores(self) -> None:
        while self.chores:
            await self.chores.pop(0)()

    def _recorded(self, lease: str) -> bool:
        assert self.records is not None
        return (self.records / record_filename(lease)).exists()


async def supervisor_pools_full(state_dir: Path) -> None:
    """Wait until every pool the supervisor of ``state_dir`` holds has all its parks."""
    while True:
        pools = (await pools_request(state_dir, ListPools())).pools
        if all(p.parked >= p.size for p in pools):
            return
        await trio.sleep(0.01)


def settled(contender: Contender, settling: Settling) -> Contender:
    contender.before = settling.settle
    return contender


def claimed_contender(
    key: str,
    label: str,
    what: str,
    ready: Callable[[], Awaitable[object]],
    claimed_run: Callable[[], Awaitable[RunResult]],
    settling: Settling,
) -> Contender:
    """A contender whose run must be claimed from a pool; ``ready`` (untimed, in ``before``)
    waits until a container is parked, off the measured path."""

    async def before() -> None:
        await settling.settle()
        with trio.fail_after(60):
            await ready()

    async def once() -> StepTimings:
        t0 = time.perf_counter()
        result = settling.left(await claimed_run())
        elapsed = time.perf_counter() - t0
        if not (result.ok and result.pooled):
            raise RuntimeError(f"{key}: {result.status} {result.exit_code} pooled={result.pooled}")
        return {"run": result.timings.run_s, "outside": elapsed - result.timings.run_s}

    return Contender(key, label, what, once, before)


def pooled_contender(
    pool: Pool, spec: SandboxSpec, settling: Settling, key: str = "pooled"
) -> Contender:
    path = "the daemon's path: attach, wait" if key.endswith("daemon") else "the kernel path"
    return claimed_contender(
        key,
        f"sbxkit, pooled ({path.split(':')[0]})",
        f"await pool.run(spec) on open_pool(spec, size={POOL_SIZE}), {path}: claim line, "
        "payload, exit judged; removal continues in the pool",
        lambda: pool.wait_ready(1),
        lambda: pool.run(spec),
        settling,
    )


def held_contender(backend: PooledBackend, spec: SandboxSpec, settling: Settling) -> Contender:
    return claimed_contender(
        "held",
        "sbxkit, held by the supervisor",
        f"await sbxkit.run(spec, backend=PooledBackend(pool=HeldPool(size={POOL_SIZE}))): "
        "plan the shape, claim from the supervisor, attach, claim line, payload, exit judged; "
        "removal continues under the supervisor",
        lambda: backend.warm(spec),
        lambda: run(spec, backend=backend),
        settling,
    )


def cli_contenders(args: argparse.Namespace, state_dir: str, settling: Settling) -> list[Contender]:
    """``sbxkit run`` as a process (what a shell or an agent's tool call waits for), cold and
    claiming from the supervisor's pool; both talk to the bench's supervisor."""
    env = {**os.environ, "SBXKIT_STATE_DIR": state_dir, "SBXKIT_LABELS": f"{BENCH_LABEL}={NAME}"}
    base = [sys.executable, "-m", "sbxkit", "run", "--json", "--socket", args.socket]
    limits = [
        "--stdin",
        "none",
        "--cpus",
        "1",
        "--memory",
        "64m",
        "--pids",
        "64",
        "--timeout",
        "30",
    ]
    tail = [args.image, "--", "true"]

    def contender(key: str, label: str, command: list[str]) -> Contender:
        async def once() -> StepTimings:
            done = await trio.run_process(
                command, capture_stdout=True, capture_stderr=True, env=env, check=False
            )
            if done.returncode != 0:
                stderr = done.stderr.decode(errors="replace").strip()
                raise RuntimeError(f"{label} exited {done.returncode}: {stderr}")
            settling.pending.add(msgspec.json.decode(done.stdout)["container_id"])
            return {}

        return Contender(key, label, "subprocess: " + " ".join(command), once, settling.settle)

    return [
        contender("cli_held", "sbxkit run --pool", [*base, "--pool", "2", *limits, *tail]),
        contender("cli_cold", "sbxkit run", [*base, *limits, *tail]),
    ]


def cold_contender(
    backend: DockerBackend, spec: SandboxSpec, settling: Settling, key: str = "cold"
) -> Contender:
    evidence = "daemon" if key.endswith("daemon") else "kernel"

    async def once() -> StepTimings:
        result = settling.left(await run(spec, backend=backend))
        if not result.ok or result.evidence != evidence:
            raise RuntimeError(f"{key}: {result.status} {result.exit_code} {result.evidence}")
        t = result.timings
        return {"create": t.create_s, "start": t.start_s, "run": t.run_s, "remove": t.remove_s}

    what = (
        "await sbxkit.run(spec) on the daemon's path: the whole lifecycle, removal included"
        if evidence == "daemon"
        else "await sbxkit.run(spec) on the kernel path: returns at the payload's exit"
    )
    return Contender(key, f"sbxkit, cold ({evidence})", what, once, settling.settle)


def raw_kernel_contender(
    api: RawEngine, spec: SandboxSpec, root: Path, settling: Settling
) -> Contender:
    """``bench/kernel_floor.py``'s run: made ready after the settling, finished (its wait and
    DELETE) in the next one — both untimed."""
    ready: list[KernelFloorRun] = []

    async def before() -> None:
        await settling.settle()
        ready.append(await trio.to_thread.run_sync(KernelFloorRun, api, spec, root))

    async def once() -> StepTimings:
        floor = ready.pop()
        t0 = time.perf_counter()
        try:
            steps = await trio.to_thread.run_sync(floor.timed)
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(floor.finish)
            raise
        elapsed = time.perf_counter() - t0
        settling.chores.append(functools.partial(trio.to_thread.run_sync, floor.finish))
        return {**steps, "outside": elapsed - sum(steps.values())}

    return Contender(
        "raw_kernel",
        "raw, the kernel path's body",
        "stdlib http.client over AF_UNIX in a worker thread, sbxkit's kernel path body "
        "(bench/kernel_floor.py): POST create, POST start timed to the shell's byte on its "
        "stderr FIFO, the init found in its cgroup and held as a pidfd, the go line, its exit "
        "status from the pidfd; then, untimed, the start's answer, POST wait and DELETE",
        once,
        before,
    )


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    witness = RawEngine(args.socket)
    kernel_api = RawEngine(args.socket)
    errors: list[str] = []
    contenders: list[Contender] = []
    spec = true_spec(args.image)
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="sbxbench-pool-")
    settling = Settling(RawEngine(args.socket), Path(state_dir) / "leases")
    settings = Settings(supervisor_state_dir=str(Path(state_dir) / "leases"))
    on_daemon = msgspec.structs.replace(settings, evidence="daemon")
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await common.require_image(engine, args.image, NAME)
        backend = DockerBackend(engine=engine, settings=settings)
        daemon_backend = DockerBackend(engine=engine, settings=on_daemon)
        held = PooledBackend(pool=HeldPool(size=POOL_SIZE), engine=engine, settings=settings)
        async with (
            open_pool(spec, size=POOL_SIZE, backend=backend) as pool,
            open_pool(spec, size=POOL_SIZE, backend=daemon_backend) as daemon_pool,
        ):
            leases = str(Path(state_dir) / "leases")
            # The held pools (held, cli_held) and the in-process ones refill between runs.
            settling.refills = [
                pool.wait_ready,
                daemon_pool.wait_ready,
                lambda: supervisor_pools_full(Path(leases)),
            ]
            contenders = common.order_contenders(
                [
                    pooled_contender(pool, spec, settling),
                    pooled_contender(daemon_pool, spec, settling, "pooled_daemon"),
                    held_contender(held, spec, settling),
                    cold_contender(backend, spec, settling),
                    cold_contender(daemon_backend, spec, settling, "cold_daemon"),
                    settled(
                        raw_contender(
                            witness,
                            raw_create_body(args.image, label="pool-raw"),
                            key="raw",
                            label="raw floor",
                            what="the floor's body",
                        ),
                        settling,
                    ),
                    raw_kernel_contender(
                        kernel_api, spec, Path(state_dir) / "raw-kernel.io", settling
                    ),
                    *cli_contenders(args, leases, settling),
                ],
                args.order,
                NAME,
                only=args.only,
            )
            say(
                f"{NAME}: {warmup} warm-up + {rounds} measured rounds of "
                + common.order_words(
                    {"order": [c.key for c in contenders], "shuffle": args.shuffle}
                )
            )
            try:
                await run_interleaved(
                    contenders,
                    rounds=rounds,
                    warmup=warmup,
                    progress=lambda t: say(f"  {t}"),
                    shuffle=args.shuffle,
                )
            except ContenderFailed as exc:
                errors.append(str(exc))
            with trio.CancelScope(shield=True):
                await settling.do_chores()  # the last round's raw_kernel container
                await held.end(spec)  # the supervisor's pool of the shape, removed now
        burst: dict[str, Any] = {}
        if not errors and args.burst > 0:
            try:
                burst = await measure_burst(backend, spec, args.burst, args.burst_rounds)
            except Exception as exc:  # reported, like a failing contender
                errors.append(f"burst: {type(exc).__name__}: {exc}")
        sustained: dict[str, Any] = {}
        jobs = common.pick(args.sustained, args.quick, QUICK_SUSTAINED_JOBS, SUSTAINED_JOBS)
        if jobs and jobs < 2 * args.sustained_width:
            errors.append("sustained: --sustained must be 0 or at least twice --sustained-width")
        elif not errors and jobs > 0:
            say(f"{NAME}: sustained, {jobs} runs at {args.sustained_width} at once")
            try:
                sustained = await measure_sustained(
                    backend,
                    spec,
                    jobs=jobs,
                    width=args.sustained_width,
                    rounds=common.pick(args.sustained_rounds, args.quick, 1, SUSTAINED_ROUNDS),
                    warmup=args.sustained_warmup,
                )
            except Exception as exc:  # reported, like a failing contender
                errors.append(f"sustained: {type(exc).__name__}: {exc}")
    leaks = await trio.to_thread.run_sync(witness.containers, f"{BENCH_LABEL}={NAME}")
    leaks += await trio.to_thread.run_sync(witness.containers, "sbxkit.bench=pool-raw")
    witness.close()
    kernel_api.close()
    settling.witness.close()
    facts["loadavg_at_end"] = list(os.getloadavg())
    report = build_report(args, rounds, warmup, facts, contenders, errors, leaks)
    report["burst"] = burst
    report["sustained"] = sustained
    return report


async def measure_burst(
    backend: DockerBackend, spec: SandboxSpec, width: int, rounds: int
) -> dict[str, Any]:
    """Throughput: ``width`` one-shot ``true`` runs at once, cold vs claimed from a pool of
    ``width`` parked beforehand, alternating. The pool's refill between rounds is not timed:
    this is a burst a warm pool absorbs, not a sustained rate (which the daemon's create and
    start rate bounds on both paths)."""
    walls: dict[str, list[float]] = {"cold": [], "pooled": []}
    async with open_pool(spec, size=width, backend=backend) as pool:
        for _ in range(rounds):
            for path in ("cold", "pooled"):
                if path == "pooled":
                    with trio.fail_after(120):
                        await pool.wait_ready()
                results: list[Any] = []

                async def one(pooled: bool, results: list[Any] = results) -> None:
                    ran = await (pool.run(spec) if pooled else run(spec, backend=backend))
                    results.append(ran)

                t0 = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for _ in range(width):
                        nursery.start_soon(one, path == "pooled")
                walls[path].append(time.perf_counter() - t0)
                if not all(r.ok for r in results):
                    raise RuntimeError(f"burst {path}: a run did not exit 0")
    return {
        "width": width,
        "rounds": rounds,
        "runs_per_s": {path: width / statistics.median(values) for path, values in walls.items()},
        "wall_s": walls,
    }


def build_report(
    args: argparse.Namespace,
    rounds: int,
    warmup: int,
    facts: dict[str, Any],
    contenders: Sequence[Contender],
    errors: list[str],
    leaks: list[dict[str, Any]],
) -> dict[str, Any]:
    complete = not errors and all(len(c.totals_s) == rounds for c in contenders)
    ratios = common.interleaved_ratios(contenders, RATIOS, complete)
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            **common.interleaving_config(args, rounds, warmup, contenders),
            "image": args.image,
            "pool_size": POOL_SIZE,
            "note": args.note,
            "spec_limits": msgspec.to_builtins(true_spec(args.image))["limits"],
        },
        "contenders": {
            key: {
                **info,
                "p99_ms": percentile(info["samples_ms"], 99) if info["samples_ms"] else None,
            }
            for key, info in common.contender_report(contenders).items()
        },
        "ratios": ratios,
        "beyond_floor": beyond_floor(contenders, complete),
        "targets": [
            common.ratio_target(f"{name} <= {ceiling:.2f}", ratios.get(name), ceiling)
            for name, ceiling in TARGETS
        ],
        "errors": errors,
        "leaks": [{"id": c["Id"][:12], "names": c.get("Names")} for c in leaks],
        "ok": not errors and not leaks,
    }


COLD_CEILING = dict(TARGETS)["cold/raw"]


def beyond_floor(contenders: Sequence[Contender], complete: bool) -> dict[str, Any] | None:
    """What sbxkit's cold run takes beyond the floor's own create and start, in ms — the part
    of the cold ratio sbxkit controls, whatever the daemon's speed — and the room the cold
    target leaves for it: per round, ``cold − (raw create + raw start)`` and
    ``0.80 × raw − (raw create + raw start)``, each summarised with its hints. None unless both
    ran every round."""
    by_key = {c.key: c for c in contenders}
    cold, raw = by_key.get("cold"), by_key.get("raw")
    if not complete or cold is None or raw is None:
        return None
    own = [c + s for c, s in zip(raw.steps_s["create"], raw.steps_s["start"], strict=True)]
    return {
        "sbxkit_ms": median_with_hints(
            [(total - floor) * 1000 for total, floor in zip(cold.totals_s, own, strict=True)]
        ),
        "room_ms": median_with_hints(
            [
                (COLD_CEILING * total - floor) * 1000
                for total, floor in zip(raw.totals_s, own, strict=True)
            ]
        ),
        "ceiling": COLD_CEILING,
    }


def beyond_floor_lines(beyond: dict[str, Any] | None) -> list[str]:
    """One line: sbxkit's part of a cold run and the room the target leaves, in ms."""
    if beyond is None:
        return []
    took, room = beyond["sbxkit_ms"], beyond["room_ms"]
    low, high = took["bootstrap95"]
    return [
        f"cold beyond the floor's own create and start: {took['median']:.1f} ms "
        f"(bootstrap95 {low:.1f}–{high:.1f}); the room cold/raw <= {beyond['ceiling']:.2f} "
        f"leaves: {room['median']:.1f} ms"
    ]


def burst_lines(burst: dict[str, Any]) -> list[str]:
    if not burst:
        return []
    rate = burst["runs_per_s"]
    return [
        f"throughput, {burst['width']} at once (median of {burst['rounds']}): "
        f"cold {rate['cold']:.1f} runs/s, pooled {rate['pooled']:.1f} runs/s "
        f"(pooled/cold {rate['pooled'] / rate['cold']:.2f})"
    ]


def render_text(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"{NAME} — {cfg['rounds']} rounds (+{cfg['warmup']} warm-up), interleaved "
        + common.order_words(cfg),
        *common.ms_table_text(report["contenders"], 20),
        "(ms, wall time per one-shot run)",
        *[
            f"  {info['label']:<20} p99 {info['p99_ms']:.1f} ms"
            for info in report["contenders"].values()
            if info["p99_ms"] is not None
        ],
        *common.ratio_lines_text(report["ratios"], 26),
        *beyond_floor_lines(report.get("beyond_floor")),
        *burst_lines(report.get("burst") or {}),
        *sustained_lines(report.get("sustained") or {}),
    ]
    for target in report["targets"]:
        lines += common.target_lines(target)
    if report.get("sustained"):
        lines += common.target_lines(report["sustained"]["target"])
    return "\n".join(lines + common.errors_text(report))


def render_markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    m = report["machine"]
    out = [
        f"# {NAME} — one-shot `true`, pooled vs cold",
        "",
        f"{m['date']} · {cfg['rounds']} measured rounds (+{cfg['warmup']} warm-up), interleaved "
        f"`{common.order_words(cfg)}`, pool of {cfg['pool_size']} · "
        + common.docker_md(m, runtime=m["default_runtime"], kernel=True)
        + common.git_md(m),
        *(["", f"Note: {cfg['note']}"] if cfg.get("note") else []),
        "",
        *common.ms_table_md(report["contenders"]),
        "",
        "p99 ms: "
        + ", ".join(
            f"{info['label']} {info['p99_ms']:.1f}"
            for info in report["contenders"].values()
            if info["p99_ms"] is not None
        ),
    ]
    out += common.ratio_table_md(report["ratios"], "ratio of medians", "first half / second half")
    out += ["", *beyond_floor_lines(report.get("beyond_floor"))]
    out += ["", *burst_lines(report.get("burst") or {})]
    out += sustained_md(report.get("sustained") or {})
    for target in report["targets"]:
        out += common.target_md(target)
    if report.get("sustained"):
        out += common.target_md(report["sustained"]["target"])
    out += ["", "What each contender does:", ""]
    out += [f"- **{i['label']}**: {i['description']}" for i in report["contenders"].values()]
    if report["ok"]:
        out += ["", "![pool: latency CDF, throughput, HumanEval](pool.svg)"]
    return common.md(out + common.errors_md(report))


def main(args: argparse.Namespace) -> int:
    rounds, warmup = common.rounds_and_warmup(args, NAME, ROUND_COUNTS)
    report = trio.run(measure, args, rounds, warmup)
    print(render_text(report))
    common.write_report(args.out, NAME, report, render_markdown)
    if report["ok"] and str(args.out) != "-":
        say(f"wrote {write_plot(args.out)}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
