"""Benchmark ``supervised``: what the supervisor costs a one-shot run, and its fsyncs per lease.

Contenders, interleaved round-robin in one trio program (see README.md for the method), both on
one engine opened up front and the same spec as ``oneshot`` (busybox ``true``, cpus 1, memory
64 MiB, pids 64, output 1 MiB, timeout 30 s; only the bench label's value differs):

``sbxkit_supervised``
    ``await run(spec, engine=engine, owner=SupervisedOwner(engine, state_dir=DIR))``, a new
    owner per run as the runner makes by default, with ``DIR`` a fresh private (0700) directory
    under ``/tmp``: this run's own supervisor, which no other client (a test run, another
    sbxkit version) shares or disturbs. It is launched by the warm-up and exits by itself
    (idle) after the run; the directory is then removed.
``sbxkit_inprocess``
    ``await run(spec, engine=engine, owner=InProcessOwner(engine))``.

Target (the issue): supervised ≤ 1.15 × in-process, as a ratio of medians from one run. A
missed target is reported, not fatal; a failing contender, a leaked container, a lease record
left in the journal or an fsync count that could not be measured is (exit status 1).

Fsyncs per lease are *measured*: the supervisor's own counters (``Service.stats``, read through
the operator ``Recover`` request) are read after the warm-up and after the measured rounds;
fsyncs per lease = Δ journal fsyncs / Δ leases admitted. The design's figure is 4: the
``creating`` record written before the create (file + directory fsync), the ``created`` record
with the container id (2); the record's deletion once the daemon removed the container has no
fsync of its own (the next write's directory fsync makes its unlink durable).

The phase medians (sbxkit's ``RunResult.timings``) and the paired per-round differences say
where the difference goes: ``create`` and ``remove`` carry the supervisor (the connection and
handshake, the two journal writes, its own post-create inspection, the IPC hops; the journal
delete), ``start`` and ``run`` should not differ. The owner's ``create``/``remove`` (and, for the
supervised owner, its ``connect``: socket + Hello/Welcome) are timed by wrapping the owner
instance's methods bench-side, and the journal's write/delete pattern is timed on the state
directory's filesystem, to estimate the disk's share.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
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
    fmt_ms,
    machine_facts,
    ratio_of_medians,
    run_interleaved,
    say,
    summarise_ms,
)
from bench.oneshot import (
    BENCH_LABEL,
    _names,
    default_image,
    default_socket,
    fsync_probe,
    sbxkit_spec,
)
from bench.rawapi import RawEngine
from bench.suite import ActivityWatch
from sbxkit._consumers.runner import run as sbxkit_run
from sbxkit._lifecycle import leases_admin as admin
from sbxkit._lifecycle.owner import InProcessOwner, Owner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.spec import LEASE_LABEL, SandboxSpec
from sbxkit._protocol.journal import LOG_NAME, StateDir
from sbxkit._protocol.records import RECORD_SUFFIX
from sbxkit._protocol.wire import Recover
from sbxkit.engine.client import Engine, open_engine
from sbxkit.errors import SbxError

NAME = "supervised"
SUMMARY = "one-shot `true`: supervised vs in-process owner (ratio of medians), fsyncs per lease"

TARGET_RATIO = 1.15
"""sbxkit_supervised / sbxkit_inprocess, ratio of medians (the issue's target)."""

DEFAULT_ROUNDS = 40
QUICK_ROUNDS = 5
DEFAULT_WARMUP = 3
QUICK_WARMUP = 1
ROUND_COUNTS = common.RoundCounts(DEFAULT_ROUNDS, DEFAULT_WARMUP, QUICK_ROUNDS, QUICK_WARMUP)

SUPERVISED = "sbxkit_supervised"
INPROCESS = "sbxkit_inprocess"
PHASES = ("create", "start", "run", "remove")

EXPECTED_FSYNCS = {
    "write 'creating' record (file + directory)": 2,
    "write 'created' record (file + directory)": 2,
    "delete record (none: the next write's directory fsync covers its unlink)": 0,
}
"""The design's journal traffic for one lease that is created, run and removed."""
EXPECTED_FSYNCS_PER_LEASE = sum(EXPECTED_FSYNCS.values())

STATS_LINE = re.compile(
    r"leases admitted: (?P<leases>\d+), journal fsyncs: (?P<fsyncs>\d+), records: (?P<records>\d+)"
)
LOG_START = re.compile(r"sbxkit-supervisor\[(?P<pid>\d+)\]: listening on ")
LOG_EXIT = re.compile(r"sbxkit-supervisor\[(?P<pid>\d+)\]: idle and record-free; exiting \((.*)\)")
SUPERVISOR_EXIT_WAIT_S = 30.0
"""How long to wait, after the run, for the private supervisor's idle exit (10 s by default)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(parser, ROUND_COUNTS, f"{SUPERVISED},{INPROCESS}")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="supervisor state directory (absolute, 0700, used by no other supervisor; kept "
        "afterwards). Default: a fresh private directory under /tmp, removed afterwards",
    )
    parser.add_argument("--socket", default=default_socket(), help="daemon socket")
    parser.add_argument("--image", default=default_image(), help="busybox image (local)")
    common.add_out_argument(parser, "supervised.json / supervised.md")


# --- contenders --------------------------------------------------------------------------------


def time_methods(obj: object, names: Sequence[str], calls: dict[str, float]) -> None:
    """Replace ``obj.NAME`` (async methods) on the instance by wrappers that store each call's
    wall time in ``calls["owner.NAME"]`` (the last call wins; each is called once per run)."""
    for name in names:
        method: Callable[..., Awaitable[Any]] = getattr(obj, name)

        def timed(
            method: Callable[..., Awaitable[Any]], label: str
        ) -> Callable[..., Awaitable[Any]]:
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await method(*args, **kwargs)
                finally:
                    calls[label] = time.perf_counter() - t0

            return wrapper

        setattr(obj, name, timed(method, "owner." + name))


def run_contender(
    engine: Engine,
    spec: SandboxSpec,
    leases: list[str],
    *,
    key: str,
    label: str,
    make_owner: Callable[[], Owner],
    owner_text: str,
    timed: Sequence[str],
) -> Contender:
    """``run(spec, engine=engine, owner=make_owner())``. Steps: sbxkit's phase timings,
    ``outside`` (wall time in no phase: validation, image check, the exit inspect), and the
    owner calls (nested in the phases, so not part of ``outside``'s sum)."""

    async def once() -> StepTimings:
        owner = make_owner()
        calls: dict[str, float] = {}
        time_methods(owner, timed, calls)
        t0 = time.perf_counter()
        result = await sbxkit_run(spec, engine=engine, owner=owner)
        elapsed = time.perf_counter() - t0
        leases.append(result.lease)
        if not result.ok:
            raise RuntimeError(
                f"{key}: status {result.status}, exit {result.exit_code}, "
                f"stderr {result.stderr[:200]!r}"
            )
        t = result.timings
        phases = {"create": t.create_s, "start": t.start_s, "run": t.run_s, "remove": t.remove_s}
        return {**phases, "outside": elapsed - sum(phases.values()), **calls}

    return Contender(
        key,
        label,
        "await sbxkit._consumers.runner.run(spec, engine=engine, "
        f"owner={owner_text}), a new owner per run; engine opened once",
        once,
    )


# --- leaks and the shared daemon -------------------------------------------------------------


def bench_label(key: str) -> dict[str, str]:
    """``sbxkit.bench=supervised:<contender>``: the suite's convention, so that this run's leak
    check never takes (and never removes) another benchmark's containers, and theirs not ours."""
    return {BENCH_LABEL: f"{NAME}:{key}"}


def ours(labels: dict[str, str], leases: Sequence[str] = ()) -> bool:
    """Made by this benchmark: our bench label (carried by every sandbox this benchmark asks
    for, even one whose run raised before returning its lease) or one of our leases."""
    mine = labels.get(BENCH_LABEL, "").startswith(NAME + ":")
    return mine or labels.get(LEASE_LABEL) in set(leases)


def sweep_leaks(
    witness: RawEngine, before: set[str], leases: Sequence[str]
) -> list[dict[str, Any]]:
    """Containers this run made that still exist; each is reported, then removed."""
    leaks = []
    for container in witness.containers():
        labels = container.get("Labels") or {}
        if container["Id"] in before or not ours(labels, leases):
            continue
        removed = witness.remove(container["Id"])
        leaks.append(
            {
                "id": container["Id"][:12],
                "names": _names(container),
                "labels": labels,
                "state": container.get("State"),
                "removed_by_bench": removed,
            }
        )
    return leaks


# --- the supervisor's counters and life ------------------------------------------------------


async def supervisor_stats(state_dir: Path) -> dict[str, Any]:
    """The live supervisor's counters, through the operator ``Recover`` request (which launches
    it if absent; with no orphan records it changes nothing)."""
    report = await admin.request(state_dir, Recover())
    for line in report.lines:
        match = STATS_LINE.search(line)
        if match:
            return {
                "leases_admitted": int(match["leases"]),
                "journal_fsyncs": int(match["fsyncs"]),
                "records": int(match["records"]),
                "remaining": report.remaining,
                "line": line,
            }
    raise RuntimeError(f"no stats line in the supervisor's report: {report.lines!r}")


def read_log(state_dir: Path) -> list[str]:
    try:
        return (state_dir / LOG_NAME).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []


def launches(lines: Sequence[str]) -> list[int]:
    """Pids of the supervisors this state directory's log saw start, in order."""
    return [int(m["pid"]) for m in (LOG_START.search(line) for line in lines) if m]


def wait_for_exit(state_dir: Path, timeout_s: float) -> bool:
    """Block until no supervisor holds the state directory's lock (it exited); blocking."""
    state = StateDir(state_dir)
    deadline = time.monotonic() + timeout_s
    while True:
        fd = state.try_lock()
        if fd is not None:
            os.close(fd)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def record_files(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.glob("*" + RECORD_SUFFIX))


def fsync_measurement(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    rounds: int,
    launches_between: int | None,
) -> dict[str, Any]:
    """Δ journal fsyncs / Δ leases admitted over the measured rounds, next to the design's."""
    out: dict[str, Any] = {
        "expected_per_lease": EXPECTED_FSYNCS_PER_LEASE,
        "expected_breakdown": EXPECTED_FSYNCS,
        "before": before,
        "after": after,
        "supervisor_launches_during_measurement": launches_between,
        "per_lease": None,
        "matches_expected": None,
        "problem": None,
    }
    if before is None or after is None:
        out["problem"] = "the supervisor's counters could not be read before and after"
        return out
    if launches_between:
        out["problem"] = (
            f"the supervisor restarted {launches_between} time(s) during the measured rounds; "
            "its counters were reset, so the difference means nothing"
        )
        return out
    leases = after["leases_admitted"] - before["leases_admitted"]
    fsyncs = after["journal_fsyncs"] - before["journal_fsyncs"]
    out["delta_leases"] = leases
    out["delta_fsyncs"] = fsyncs
    if leases <= 0:
        out["problem"] = f"no lease admitted during the measured rounds (Δ {leases})"
        return out
    out["per_lease"] = fsyncs / leases
    out["matches_expected"] = fsyncs == EXPECTED_FSYNCS_PER_LEASE * leases
    if leases != rounds:
        out["note"] = (
            f"{leases} leases admitted for {rounds} supervised runs: another client used this "
            "state directory"
        )
    return out


# --- the run -----------------------------------------------------------------------------------


async def measure(
    args: argparse.Namespace, rounds: int, warmup: int, state_dir: Path
) -> dict[str, Any]:
    spec = sbxkit_spec(args.image)
    specs = {
        key: msgspec.structs.replace(spec, labels=bench_label(key))
        for key in (SUPERVISED, INPROCESS)
    }
    witness = RawEngine(args.socket)
    errors: list[str] = []
    leases: list[str] = []
    leaks: list[dict[str, Any]] = []
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    launches_between: int | None = None
    started_before = 0
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await common.require_image(engine, args.image, NAME)
        snapshot = await trio.to_thread.run_sync(witness.containers)
        known = {c["Id"] for c in snapshot}
        leftovers = [
            {"id": c["Id"][:12], "names": _names(c)}
            for c in snapshot
            if ours(c.get("Labels") or {})
        ]
        probe = await trio.to_thread.run_sync(fsync_probe, state_dir.parent)
        contenders = [
            run_contender(
                engine,
                specs[SUPERVISED],
                leases,
                key=SUPERVISED,
                label="supervised",
                make_owner=lambda: SupervisedOwner(engine, state_dir=state_dir),
                owner_text=f"SupervisedOwner(engine, state_dir={state_dir})",
                timed=("create", "connect", "remove"),
            ),
            run_contender(
                engine,
                specs[INPROCESS],
                leases,
                key=INPROCESS,
                label="in-process",
                make_owner=lambda: InProcessOwner(engine),
                owner_text="InProcessOwner(engine)",
                timed=("create", "remove"),
            ),
        ]
        contenders = common.order_contenders(contenders, args.order, NAME, only=args.only)
        say(
            f"supervised: {warmup} warm-up + {rounds} measured rounds of "
            + " → ".join(c.key for c in contenders)
            + f"; supervisor state dir {state_dir}"
        )
        # Container creations the daemon saw during the run, ours (our bench label) and other
        # clients' (a test run, another benchmark): another tenant loads the daemon unevenly.
        activity = ActivityWatch(args.socket, NAME)
        await trio.to_thread.run_sync(activity.start)
        try:
            # Warm-up (launches the supervisor), the counters, the measured rounds, the counters.
            await run_interleaved(contenders, rounds=0, warmup=warmup)
            before = await supervisor_stats(state_dir)
            started_before = len(launches(read_log(state_dir)))
            await run_interleaved(
                contenders, rounds=rounds, warmup=0, progress=lambda text: say(f"  {text}")
            )
        except ContenderFailed as exc:
            errors.append(str(exc))
        except (SbxError, RuntimeError) as exc:
            errors.append(f"supervisor stats before the measured rounds: {exc}")
        finally:
            with trio.CancelScope(shield=True):
                try:
                    after = await supervisor_stats(state_dir)
                    if before is not None:
                        launches_between = len(launches(read_log(state_dir))) - started_before
                except (SbxError, RuntimeError) as exc:
                    errors.append(f"supervisor stats after the run: {exc}")
                watch_result = await trio.to_thread.run_sync(activity.stop)
                leaks = await trio.to_thread.run_sync(sweep_leaks, witness, known, leases)
                facts["daemon_activity_during_run"] = watch_result
                witness.close()
        facts["loadavg_at_end"] = list(os.getloadavg())
    say(f"waiting for the supervisor's idle exit (up to {SUPERVISOR_EXIT_WAIT_S:g} s)")
    exited = await trio.to_thread.run_sync(wait_for_exit, state_dir, SUPERVISOR_EXIT_WAIT_S)
    log_lines = read_log(state_dir)
    exits = [m for m in (LOG_EXIT.search(line) for line in log_lines) if m]
    lifetime = STATS_LINE.search(exits[-1][2]) if exits else None
    left_records = record_files(state_dir)
    supervisor = {
        "state_dir": str(state_dir),
        "pids": launches(log_lines),
        "exited": exited,
        "exit_stats": None
        if lifetime is None
        else {
            "leases_admitted": int(lifetime["leases"]),
            "journal_fsyncs": int(lifetime["fsyncs"]),
            "records": int(lifetime["records"]),
        },
        "record_files_at_end": left_records,
        "log_tail": log_lines[-6:],
    }
    fsyncs = fsync_measurement(before, after, rounds, launches_between)
    if fsyncs["problem"]:
        errors.append(f"fsyncs per lease: {fsyncs['problem']}")
    records_at_end = after["records"] if after is not None else None
    if records_at_end:
        leaks.append({"supervisor_records": records_at_end, "state_dir": str(state_dir)})
    if left_records:
        leaks.append({"journal_record_files": left_records, "state_dir": str(state_dir)})
    return build_report(
        args=args,
        rounds=rounds,
        warmup=warmup,
        facts=facts,
        contenders=contenders,
        spec=spec,
        probe=probe,
        fsyncs=fsyncs,
        supervisor=supervisor,
        errors=errors,
        leaks=leaks,
        leftovers=leftovers,
    )


# --- the report --------------------------------------------------------------------------------


def _median_ms(values: Sequence[float]) -> float | None:
    return statistics.median(values) * 1000.0 if values else None


def attribution(sup: Contender, inp: Contender, probe: dict[str, Any]) -> dict[str, Any]:
    """Per phase: both medians and the median of the paired per-round differences."""
    steps: dict[str, Any] = {}
    present = {*sup.steps_s, *inp.steps_s}
    for name in [*PHASES, "outside", "owner.create", "owner.connect", "owner.remove"]:
        if name not in present:
            continue
        a, b = sup.steps_s.get(name, []), inp.steps_s.get(name, [])
        paired = [x - y for x, y in zip(a, b, strict=False)]
        steps[name] = {
            "supervised_ms": _median_ms(a),
            "inprocess_ms": _median_ms(b),
            "paired_delta_ms": _median_ms(paired),
        }
    total = [x - y for x, y in zip(sup.totals_s, inp.totals_s, strict=False)]
    journal_ms = 2 * probe["write_median_ms"] + probe["delete_median_ms"]
    return {
        "steps_ms": steps,
        "total_paired_delta_ms": _median_ms(total),
        "total_median_delta_ms": (
            None
            if not sup.totals_s or not inp.totals_s
            else (statistics.median(sup.totals_s) - statistics.median(inp.totals_s)) * 1000.0
        ),
        "journal_fsync_probe": probe,
        "journal_estimate_ms": {
            "create": 2 * probe["write_median_ms"],
            "remove": probe["delete_median_ms"],
            "total": journal_ms,
        },
        "note": "paired_delta_ms = median over rounds of (supervised − in-process) in the same "
        "round; owner.* are nested in the phases (create ⊃ owner.create ⊃ owner.connect; "
        "remove ⊃ owner.remove); journal_estimate_ms = 2 durable writes + 1 delete timed on "
        "the state directory's filesystem by the bench (the supervisor's own are not timed)",
    }


def build_report(
    *,
    args: argparse.Namespace,
    rounds: int,
    warmup: int,
    facts: dict[str, Any],
    contenders: Sequence[Contender],
    spec: SandboxSpec,
    probe: dict[str, Any],
    fsyncs: dict[str, Any],
    supervisor: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[dict[str, Any]],
) -> dict[str, Any]:
    by_key = {c.key: c for c in contenders}
    sup, inp = by_key[SUPERVISED], by_key[INPROCESS]
    complete = not errors and all(len(c.totals_s) == rounds for c in contenders)
    ratios: dict[str, Any] = {}
    if complete:
        ratios[f"{SUPERVISED}/{INPROCESS}"] = ratio_of_medians(sup.totals_s, inp.totals_s)
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            **common.interleaving_config(args, rounds, warmup, contenders),
            "image": args.image,
            "sbxkit_spec": msgspec.to_builtins(spec),
            "labels": {c.key: bench_label(c.key) for c in contenders},
            "supervisor_state_dir": supervisor["state_dir"],
            "state_dir_private": args.state_dir is None,
        },
        "contenders": {
            c.key: {
                "label": c.label,
                "description": c.description,
                "total_ms": summarise_ms(c.totals_s),
                "steps_median_ms": {
                    name: statistics.median(values) * 1000.0
                    for name, values in c.steps_s.items()
                    if values
                },
                "samples_ms": [round(s * 1000.0, 3) for s in c.totals_s],
                "steps_samples_ms": {
                    name: [round(s * 1000.0, 3) for s in values]
                    for name, values in c.steps_s.items()
                },
            }
            for c in contenders
        },
        "ratios": ratios,
        "target": common.ratio_target(
            f"{SUPERVISED}/{INPROCESS} <= {TARGET_RATIO:.2f}",
            ratios.get(f"{SUPERVISED}/{INPROCESS}"),
            TARGET_RATIO,
        ),
        "attribution": attribution(sup, inp, probe),
        "fsyncs": fsyncs,
        "supervisor": supervisor,
        **common.outcome(errors, leaks, leftovers),
    }


# --- presentation ------------------------------------------------------------------------------


def _fsync_text(f: dict[str, Any]) -> str:
    if f["per_lease"] is None:
        return f"fsyncs per lease: not measured ({f['problem']})"
    verdict = (
        "matches the design"
        if f["matches_expected"]
        else f"DIFFERS from the design's {f['expected_per_lease']}"
    )
    return (
        f"fsyncs per lease: {f['per_lease']:.2f} measured ({f['delta_fsyncs']} journal fsyncs / "
        f"{f['delta_leases']} leases admitted over the measured rounds); expected "
        f"{f['expected_per_lease']} (creating 2 + created 2 + delete 1): {verdict}"
    )


def _target_text(target: dict[str, Any]) -> str | None:
    lines = common.target_lines(target)
    return lines[0] if lines else None


def _fmt_delta(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def render_text(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"supervised — {cfg['rounds']} rounds (+{cfg['warmup']} warm-up), interleaved "
        + " → ".join(cfg["order"]),
        *common.ms_table_text(report["contenders"], 14),
        "(ms, wall time per one-shot run)",
        *common.ratio_lines_text(report["ratios"]),
    ]
    target_text = _target_text(report["target"])
    if target_text:
        lines.append(target_text)
    att = report["attribution"]
    lines.append(f"{'median ms':<14} {'supervised':>10} {'in-process':>10} {'paired Δ':>9}")
    for name, row in att["steps_ms"].items():
        lines.append(
            f"  {name:<12} {fmt_ms(row['supervised_ms']):>10} {fmt_ms(row['inprocess_ms']):>10} "
            f"{_fmt_delta(row['paired_delta_ms']):>9}"
        )
    lines.append(f"  {'total':<12} {'':>10} {'':>10} {_fmt_delta(att['total_paired_delta_ms']):>9}")
    est = att["journal_estimate_ms"]
    probe = att["journal_fsync_probe"]
    lines.append(
        f"journal on {probe['directory']}: durable write {probe['write_median_ms']:.2f} ms, "
        f"delete {probe['delete_median_ms']:.2f} ms → ~{est['create']:.1f} ms of create, "
        f"~{est['remove']:.1f} ms of remove per lease"
    )
    lines.append(_fsync_text(report["fsyncs"]))
    if report["fsyncs"].get("note"):
        lines.append(f"note: {report['fsyncs']['note']}")
    sup = report["supervisor"]
    if sup["exit_stats"] is not None:
        s = sup["exit_stats"]
        lines.append(
            f"supervisor (pid {', '.join(map(str, sup['pids']))}) exited idle: lifetime "
            f"{s['leases_admitted']} leases, {s['journal_fsyncs']} fsyncs, {s['records']} records"
        )
    elif not sup["exited"]:
        lines.append(f"note: the supervisor in {sup['state_dir']} had not exited yet")
    activity = report["machine"].get("daemon_activity_during_run") or {}
    if activity.get("foreign"):
        lines.append(
            f"WARNING: the daemon was shared — {activity['foreign']} containers created by "
            f"other clients during the run (ours: {activity['ours']}); figures are noisier"
        )
    return "\n".join(lines + common.errors_text(report))


def render_markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    m = report["machine"]
    out = [
        "# supervised — one-shot `true`, supervised vs in-process owner",
        "",
        f"{m['date']} · {cfg['rounds']} measured rounds (+{cfg['warmup']} warm-up), interleaved "
        f"`{' → '.join(cfg['order'])}` · "
        + common.docker_md(m, runtime=m["default_runtime"], kernel=True)
        + common.git_md(m)
        + f" · private supervisor state dir `{cfg['supervisor_state_dir']}`",
        "",
        *common.ms_table_md(report["contenders"]),
    ]
    out += common.ratio_table_md(report["ratios"], "ratio of medians", "first half / second half")
    out += common.target_md(report["target"])
    att = report["attribution"]
    out += [
        "",
        "Where the difference goes (median ms; paired Δ = median over rounds of supervised − "
        "in-process; `owner.*` are nested in the phases):",
        "",
        "| step | supervised | in-process | paired Δ |",
        "|---|---:|---:|---:|",
    ]
    for name, row in att["steps_ms"].items():
        out.append(
            f"| {name} | {fmt_ms(row['supervised_ms'])} | {fmt_ms(row['inprocess_ms'])} | "
            f"{_fmt_delta(row['paired_delta_ms'])} |"
        )
    out.append(f"| **total** | | | {_fmt_delta(att['total_paired_delta_ms'])} |")
    est = att["journal_estimate_ms"]
    probe = att["journal_fsync_probe"]
    out += [
        "",
        f"Journal pattern timed on `{probe['directory']}`: durable write "
        f"{probe['write_median_ms']:.2f} ms, delete {probe['delete_median_ms']:.2f} ms (median "
        f"of {probe['repeats']}) → about {est['create']:.1f} ms of the supervised create and "
        f"{est['remove']:.1f} ms of its remove are the disk.",
        "",
        _fsync_text(report["fsyncs"]) + ".",
    ]
    if report["fsyncs"].get("note"):
        out += ["", f"Note: {report['fsyncs']['note']}."]
    sup = report["supervisor"]
    if sup["exit_stats"] is not None:
        s = sup["exit_stats"]
        out += [
            "",
            f"The supervisor (pid {', '.join(map(str, sup['pids']))}) exited idle afterwards "
            f"with lifetime counters: {s['leases_admitted']} leases admitted (warm-up "
            f"included), {s['journal_fsyncs']} journal fsyncs, {s['records']} records.",
        ]
    activity = m.get("daemon_activity_during_run") or {}
    if activity.get("foreign"):
        out += [
            "",
            f"**Shared daemon:** {activity['foreign']} containers were created by other clients "
            f"during the run (ours: {activity['ours']}); the figures are noisier for it.",
        ]
    return common.md(out + common.errors_md(report))


def main(args: argparse.Namespace) -> int:
    rounds, warmup = common.rounds_and_warmup(args, NAME, ROUND_COUNTS)
    private = args.state_dir is None
    if private:
        # mkdtemp: a fresh directory, mode 0700, owned by us — what the supervisor requires.
        state_dir = Path(tempfile.mkdtemp(prefix="sbxbench-supervisor-", dir="/tmp"))
    else:
        state_dir = args.state_dir.resolve()
    try:
        report = trio.run(measure, args, rounds, warmup, state_dir)
    finally:
        if private and wait_for_exit(state_dir, 0.0):
            with contextlib.suppress(OSError):
                shutil.rmtree(state_dir)
    report["supervisor"]["state_dir_removed"] = private and not state_dir.exists()
    print(render_text(report))
    common.write_report(args.out, NAME, report, render_markdown)
    return 0 if report["ok"] else 1
