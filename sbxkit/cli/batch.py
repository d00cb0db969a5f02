"""``sbxkit batch JOBS.jsonl --parallel N --out RESULTS.jsonl``: harness mode on the command line.

Input: one job per line, a JSON object ``{"id": ..., "image": ..., "command": [...],
"limits": {...}, "env": {...}, "stdin": "..."}`` — ``id`` (a string or an integer, unique in
the file), optional ``stdin`` (text, sent UTF-8 encoded), and otherwise exactly the fields of
``SandboxSpec`` (``limits`` takes ``Limits``' field names or ``sbxkit run``'s, sizes as strings
such as ``"64m"``). ``--profile`` and the limit flags give defaults a line may leave out
(sbxkit/jobs.py). Blank lines are ignored. Every line is decoded and
validated before anything runs; the first bad one is reported with its line number and field,
and the exit status is 2.

Output: one JSON object per line and per job, in completion order (``--order input``: in the
jobs' order, a line held while a job before it runs; locally no job starts more than 4 ×
``--parallel`` places after the earliest one running, 4 × ``PARALLEL_CAP`` without it, which
bounds what is held) — the shape
``sbxkit run --json`` prints, ``id`` first (sbxkit/_grammar/result_doc.py, docs/cli.md):
``status`` (``exited``, ``timed_out``, ``output_exceeded``, ``oom_killed``, ``killed``,
``disk_exceeded``, or ``error``), ``exit_code``, ``stdout``/``stderr`` (UTF-8 with replacement;
``--output-encoding base64``: ``stdout_base64``/``stderr_base64``, the bytes exactly), the byte
counts, evidence, ``container_id``, ``lease``, ``timings`` (seconds: ``queued_s``, ``create_s``,
``start_s``, ``run_s``, ``remove_s``, ``elapsed_s``), and ``error`` (``{"type", "message",
"field"}``, for jobs that have no run result). Each line is appended with one unbuffered write
as its job completes (or is released in order; a failed write is truncated away, so the file
never ends in half a line); the file is fsynced at the end.

Resume: ids already present in RESULTS are skipped, so re-running the same command after an
interruption runs exactly the jobs without a line. Only result lines count (a result line's keys,
no other): any other line refuses the run and leaves the file as it is, and so does
``--out`` naming the jobs or profile file. A torn last line of ours left by a crash is moved
aside to ``RESULTS.torn-<UTC time>``, never deleted (docs/operations.md).

Input: the jobs file must be a regular file of at most 256 MiB, read within 30 s (a FIFO or a
device is refused by kind).

Progress: on a terminal, one status line redrawn on stderr and cut to its width (done/total,
running, queued, failed, errors, rate, ETA; "running" counts the jobs the batch has started,
some of which may still wait for the host's capacity in the supervisor); nothing while stderr
is not a terminal. A one-line summary is printed at the end either way.

SIGINT/SIGTERM cancel the batch: every sandbox in flight is removed by its own run before the
command exits with 128 + the signal number; jobs that did not finish have no line, and RESULTS
holds only complete lines.

Cluster: ``--ray ADDRESS`` runs the batch on a Ray cluster, each job on a node's own engine and
supervisor (docs/cluster.md). Its lines add ``node`` and ``attempt``; an attempt whose node was
lost mid-run gets a line of its own with the status ``lost`` (the job is retried elsewhere up
to ``--retries`` times, and a resume runs it: a ``lost`` line does not make a job done). A node
refused when it joins is named on stderr; with no node accepted the exit status is 69, and so
it is for a cluster that does not enforce Ray's token authentication (nothing is sent to it).
The driver needs Ray's token (``RAY_AUTH_MODE=token``) and the cluster secret
(``SBXKIT_CLUSTER_SECRET_FILE``; refused with exit status 2 when missing or readable by others).

Exit status: 0 when every job ran (whatever the payloads did: read ``status`` and
``exit_code``); 1 when some job could not run and has an ``error`` line instead (the line stays,
so a resume does not retry it: ``--retry-errors`` does, replacing the line); 2 for bad input
(jobs file, results file, budgets, a job larger than the budget); 69 engine unavailable; 74
when a sandbox's removal failed (its lease is kept: see ``sbxkit leases``); 128 + N when
interrupted by signal N.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import trio

from sbxkit._consumers.harness import (
    PARALLEL_CAP,
    PARALLEL_PER_CORE,
    Job,
    JobId,
    JobResult,
    default_parallel,
    run_many,
)
from sbxkit._grammar.backend_choice import cli_backend
from sbxkit._grammar.common import Interrupted, cancel_on_signals, exit_with
from sbxkit._grammar.profile import PoolOptions, Profile, load_profile, sandbox_options
from sbxkit._grammar.profile_files import check_host_files
from sbxkit._grammar.result_doc import OutputEncoding
from sbxkit._grammar.run_grammar import add_output_encoding
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec, decoded_as, parse_size
from sbxkit._plan.plan import check_spec
from sbxkit._util.argtypes import ascii_float, non_negative_int, positive_int
from sbxkit._util.bounded_read import read_bounded
from sbxkit._util.unwrap import plain_async
from sbxkit.backends.base import Backend, open_backend
from sbxkit.backends.docker import DockerBackend
from sbxkit.cli.jobs import (
    add_default_flags,
    add_valued_flags,
    defaults_from_args,
    forget_error_lines,
    with_defaults,
)
from sbxkit.cli.progress import Progress, counted, format_clock, format_progress
from sbxkit.cli.results import (
    InputOrder,
    ResultLine,
    ResultsWriter,
    encode_result,
    pending_jobs,
    prepare_results,
    scan_results,
)
from sbxkit.cluster import NodeRefusal, RayCluster
from sbxkit.cluster.options import DEFAULT_RETRIES
from sbxkit.errors import JobsFileError, ResultsFileError, SpecError
from sbxkit.pool.shapes import PoolPerShape

__all__ = [
    "JobsFileError",
    "Progress",
    "ResultLine",
    "ResultsFileError",
    "ResultsWriter",
    "add_batch_parser",
    "cmd_batch",
    "decode_jobs",
    "encode_result",
    "format_progress",
    "main",
    "pending_jobs",
    "prepare_results",
    "scan_results",
]

EXIT_OK = 0
EXIT_JOB_ERRORS = 1
EXIT_REFUSED = 2
EXIT_CLEANUP_FAILED = 74
CLUSTER_PARALLEL = 1_000_000
"""``--ray`` without ``--parallel``: no cap of the batch's own (the nodes' resources bound it)."""
MAX_JOBS_BYTES = 256 * 1024 * 1024
"""Every job is decoded before anything runs, so the jobs file is held in memory: 256 MiB."""
PROGRESS_INTERVAL_S = 0.5
ORDER_AHEAD = 4
"""``--order input``: no job starts more than 4 × ``--parallel`` (without it, 4 ×
``PARALLEL_CAP``: the adaptive limit may climb that far) places after the earliest one still
running, so at most that many lines wait for it (a local batch's bound)."""
DESCRIPTION = (
    "Run a JSONL file of jobs in parallel, one result line per job appended to RESULTS; ids "
    "already there are skipped, so the same command resumes."
)
EPILOG = (
    "exit status: 0 every job ran (whatever its payload did: read each line's status and "
    "exit_code); 1 some job could not run (its line is an error; --retry-errors re-runs it); "
    "2 refused input, before anything runs; 69 engine unavailable (with --ray: no node of the "
    "cluster can run the batch, or it does not enforce token authentication); 74 a sandbox's "
    "removal failed; 128+N interrupted by signal N"
)
"""``--help``'s own words: the module doc is reStructuredText, not terminal text."""


# --- input ---------------------------------------------------------------------------------------

_OBJECT = msgspec.json.Decoder(dict[str, Any])


def _job_id(value: object) -> JobId:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SpecError("id", f"must be a string or an integer, got {type(value).__name__}")
    if isinstance(value, str) and not value:
        raise SpecError("id", "must not be empty")
    return value


def decode_job(
    raw: bytes, settings: Settings | None = None, defaults: Mapping[str, Any] | None = None
) -> Job:
    """One line to a validated Job over ``defaults`` (sbxkit/jobs.py); every refusal is a
    SpecError naming the field."""
    try:
        data = _OBJECT.decode(raw)
    except msgspec.ValidationError:
        raise SpecError("(line)", "must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise SpecError("(line)", f"invalid JSON: {exc}") from None
    except RecursionError:  # msgspec's decoder recurses once per nested array or object
        raise SpecError("(line)", "nests arrays or objects too deeply to be a job") from None
    if "id" not in data:
        raise SpecError("id", "required field is missing")
    job_id = _job_id(data.pop("id"))
    stdin = data.pop("stdin", None)
    if stdin is not None and not isinstance(stdin, str):
        raise SpecError("stdin", f"must be a string (text) or null, got {type(stdin).__name__}")
    data = with_defaults(data, defaults or {})
    spec = decoded_as(data, SandboxSpec)
    checked = check_spec(spec, settings)  # the run does not validate it again
    return Job(id=job_id, spec=checked, stdin=None if stdin is None else stdin.encode("utf-8"))


def decode_jobs(
    data: bytes,
    source: str = "jobs",
    settings: Settings | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> list[Job]:
    """Every job of a JSONL document, or JobsFileError for the first bad line (1-based)."""
    jobs: list[Job] = []
    first_line: dict[JobId, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            job = decode_job(raw, settings, defaults)
        except SpecError as exc:
            raise JobsFileError(source, number, exc.field, exc.rule) from None
        if job.id in first_line:
            raise JobsFileError(
                source, number, "id", f"{job.id!r} repeats the id of line {first_line[job.id]}"
            )
        first_line[job.id] = number
        jobs.append(job)
    return jobs


def load_jobs(
    path: Path, settings: Settings | None = None, defaults: Mapping[str, Any] | None = None
) -> list[Job]:
    """A regular file of at most ``MAX_JOBS_BYTES``, read within the input deadline; a FIFO,
    a device or a directory is refused by kind (sbxkit/_util/bounded_read.py)."""
    data = read_bounded(path, field="JOBS", limit=MAX_JOBS_BYTES)
    return decode_jobs(data, str(path), settings, defaults)


def check_out_path(out: Path, inputs: Mapping[str, Path | str | None]) -> None:
    """Refuse ``--out`` naming one of the command's input files (``inputs``: flag → path):
    its lines would be read as results, and results appended to it."""
    try:
        out_stat = os.stat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SpecError("--out", f"cannot read {out}: {exc.strerror}") from None
    for flag, given in inputs.items():
        if given is None:
            continue
        try:
            same = os.path.samestat(out_stat, os.stat(given))
        except OSError:
            continue  # reading the input reports it
        if same:
            raise SpecError("--out", f"{out} is the {flag} file; results need a file of their own")


# --- the command ---------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jobs", type=Path, metavar="JOBS.jsonl", help="one job per line")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="RESULTS.jsonl",
        help="results, one line per job, appended; ids already there are skipped (resume)",
    )
    parser.add_argument(
        "--parallel",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"at most N sandboxes at once, fixed (default: adaptive, from "
        f"{PARALLEL_PER_CORE} per core of this host, {default_parallel()} here, moving with "
        f"the host's CPU busy share and the batch's throughput between one per core and "
        f"{PARALLEL_CAP}; with --ray: as many as the accepted nodes advertise)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the batch on the Ray cluster whose head is at ADDRESS (HOST:PORT), each job "
        "on a node's own engine and supervisor (docs/cluster.md; needs sbxkit[ray], Ray's token "
        "authentication and SBXKIT_CLUSTER_SECRET_FILE)",
    )
    parser.add_argument(
        "--retries",
        type=non_negative_int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help=f"with --ray: retry a job whose node was lost mid-run up to N times on another "
        f"(default {DEFAULT_RETRIES}); every attempt gets a line",
    )
    parser.add_argument(
        "--pool",
        action="store_true",
        help="pre-start sandboxes for the jobs about to start, of each job's shape, at most "
        "--parallel in all, and claim them (docs/pool.md; a profile's [sandbox.docker.pool] "
        "sets the size per shape and the idle TTL). Docker only",
    )
    add_valued_flags(
        parser,
        (
            "--memory-budget",
            "SIZE",
            "this batch's share: summed memory of its jobs in flight, e.g. 8g (default: no "
            "cap of its own; the supervisor admits against the host's budget)",
        ),
        (
            "--cpu-budget",
            "CPUS",
            "this batch's share: summed CPUs of its jobs in flight (default: no cap; CPU "
            "quotas are ceilings, not reservations)",
        ),
        ("--socket", None, "Docker socket path (default: discovered)"),
    )
    parser.add_argument(
        "--order",
        choices=("completion", "input"),
        default="completion",
        help="completion (default): each line as its job completes; input: in the jobs' "
        f"order (a line waits while an earlier job runs; no job starts more than "
        f"{ORDER_AHEAD} x --parallel, or {ORDER_AHEAD} x {PARALLEL_CAP} without it, places "
        "after the earliest one running)",
    )
    add_output_encoding(parser)
    parser.add_argument(
        "--no-progress", action="store_true", help="no status line, even on a terminal"
    )
    add_default_flags(parser)


def add_batch_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add ``batch`` to the ``sbxkit`` subcommands (``subparsers`` from add_subparsers)."""
    parser = subparsers.add_parser(
        "batch",
        help="run a JSONL file of jobs in parallel, one result line per job (resumable)",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    configure(parser)
    parser.set_defaults(handler=cmd_batch)
    return parser


def _budgets(args: argparse.Namespace) -> tuple[int | None, float | None]:
    memory = (
        None if args.memory_budget is None else parse_size(args.memory_budget, "--memory-budget")
    )
    cpus: float | None = None
    if args.cpu_budget is not None:
        try:
            cpus = ascii_float(args.cpu_budget)
        except ValueError:
            raise SpecError("--cpu-budget", f"not a number: {args.cpu_budget!r}") from None
        if not math.isfinite(cpus) or cpus <= 0:
            raise SpecError("--cpu-budget", "must be a finite number > 0")
    return memory, cpus


@plain_async
async def run_batch(
    jobs: Sequence[Job],
    writer: ResultsWriter,
    progress: Progress,
    *,
    parallel: int | None,
    memory_budget: int | None,
    cpu_budget: float | None,
    backend: Backend | None,
    pool_options: PoolOptions | None = None,
    cluster: RayCluster | None = None,
    settings: Settings | None = None,
    order: InputOrder | None = None,
    encoding: OutputEncoding = "utf-8",
) -> None:
    """Run the jobs on ``backend``, writing each result as it completes; SIGINT/SIGTERM cancel
    the batch (every run removes its container first) and raise Interrupted. ``pool_options``
    pre-start containers of each shape of the batch to claim, ``size`` per shape at most and
    ``parallel`` in all (docs/pool.md). ``cluster`` runs them on a Ray cluster instead (every
    attempt gets a line, docs/cluster.md). ``parallel`` None: ``run_many``'s adaptive limit
    (locally; a cluster needs one). ``order`` writes the lines in the jobs' order
    (``--order input``); ``encoding`` is the output's in them (``--output-encoding``)."""

    def on_result(done: JobResult) -> None:
        line = encode_result(done, cluster=cluster is not None, encoding=encoding)
        if order is None or done.lost:  # a lost attempt's line completes no job
            writer.append(line)
        else:
            for released in order.add(done.id, line):
                writer.append(released)
        progress.record(done)

    async def tick() -> None:
        while True:
            await trio.sleep(PROGRESS_INTERVAL_S)
            progress.draw()

    pool: PoolPerShape | None = None
    if pool_options is not None and isinstance(backend, DockerBackend):
        pool = PoolPerShape(
            size=pool_options.size,
            idle_ttl_s=pool_options.idle_ttl,
            max_timeout_s=pool_options.max_timeout,
        )

    async def work() -> None:
        if cluster is not None:
            await run_many(
                jobs,
                parallel=parallel,
                on_result=on_result,
                on_start=progress.start,
                settings=settings,
                cluster=cluster,
            )
            return
        assert backend is not None
        async with open_backend(backend):
            await run_many(
                jobs,
                parallel=parallel,
                host_memory_bytes=memory_budget,
                host_cpus=cpu_budget,
                on_result=on_result,
                on_start=progress.start,
                backend=backend,
                pool=pool,
                ahead=None if order is None else ORDER_AHEAD * (parallel or PARALLEL_CAP),
            )

    await cancel_on_signals(work, *([tick] if progress.enabled else []))


def batch_pool(args: argparse.Namespace, profile: Profile | None) -> PoolOptions | None:
    """The profile's ``[sandbox.docker.pool]``, or ``--pool`` (a pool of ``--parallel``; without
    it, of the batch's limit in force, which moves: ``PARALLEL_CAP`` per shape at most)."""
    configured = profile.sandbox.docker.pool if profile is not None else None
    if configured is not None:
        return configured
    return PoolOptions(size=args.parallel or PARALLEL_CAP) if args.pool else None


def refuse_beside_ray(args: argparse.Namespace, profile: Profile | None) -> None:
    """``--ray`` runs every job on a node's own engine and supervisor: the local flags have
    nothing to apply to (refused before anything runs, exit 2)."""
    local = {
        "--pool": args.pool or (profile is not None and profile.sandbox.docker.pool is not None),
        "--socket": args.socket is not None,
        "--memory-budget": args.memory_budget is not None,
        "--cpu-budget": args.cpu_budget is not None,
    }
    given = [flag for flag, present in local.items() if present]
    if given:
        raise SpecError(
            "--ray", f"runs each job on a node's own engine; {', '.join(given)} cannot be given"
        )
    if profile is not None and sandbox_options(profile) is not None:
        raise SpecError("--ray", "runs Docker sandboxes on the nodes, not the sbx runtime")


def batch_cluster(args: argparse.Namespace, lost: Mapping[JobId, int]) -> RayCluster | None:
    """``--ray``'s cluster: refused nodes said on stderr, the attempt count resumed."""
    if args.ray is None:
        return None

    def on_refused(refusal: NodeRefusal) -> None:
        print(f"sbxkit batch: {refusal}", file=sys.stderr)

    return RayCluster(args.ray, retries=args.retries, on_refused=on_refused, previous_attempts=lost)


def cmd_batch(args: argparse.Namespace) -> int:
    check_out_path(args.out, {"JOBS": args.jobs, "--profile": args.profile})
    profile = load_profile(args.profile) if args.profile is not None else None
    defaults, settings = defaults_from_args(args, profile)
    if args.ray is not None:
        refuse_beside_ray(args, profile)
        backend: Backend | None = None
    else:
        if profile is not None:
            check_host_files(profile)  # else every line would fail on it, one by one
        # --parallel (or the adaptive limit) bounds the containers that exist, as run_many's
        # own backend does; and a batch that printed its summary has left nothing behind.
        backend = cli_backend(
            profile, socket_path=args.socket, settings=settings, wait_for_removal=True
        )
    jobs = load_jobs(args.jobs, settings, defaults)
    memory_budget, cpu_budget = _budgets(args)
    scan = prepare_results(args.out)  # refuses a file that is not ours before any change
    if scan.moved_to is not None:
        print(
            f"sbxkit batch: the last line of {args.out} was cut short by a crash; it was moved "
            f"to {scan.moved_to}",
            file=sys.stderr,
        )
    if args.retry_errors and forget_error_lines(args.out, {job.id for job in jobs}):
        scan = prepare_results(args.out)
    pending = pending_jobs(jobs, scan)
    skipped = len(jobs) - len(pending)
    earlier_errors = sum(1 for job in jobs if job.id in scan.errors)
    progress = Progress(len(jobs), skipped, sys.stderr, enabled=False if args.no_progress else None)
    if not pending:
        print(
            f"sbxkit batch: nothing to do: all {len(jobs)} jobs have a line in {args.out}",
            file=sys.stderr,
        )
        return EXIT_JOB_ERRORS if earlier_errors else EXIT_OK
    writer = ResultsWriter(args.out)
    order = InputOrder(job.id for job in pending) if args.order == "input" else None
    try:
        progress.draw()
        trio.run(
            functools.partial(
                run_batch,
                pending,
                writer,
                progress,
                parallel=(args.parallel or CLUSTER_PARALLEL)
                if args.ray is not None
                else args.parallel,
                memory_budget=memory_budget,
                cpu_budget=cpu_budget,
                backend=backend,
                pool_options=batch_pool(args, profile) if args.ray is None else None,
                cluster=batch_cluster(args, scan.lost),
                settings=settings,
                order=order,
                encoding=args.output_encoding,
            )
        )
    except (Interrupted, KeyboardInterrupt) as exc:
        # KeyboardInterrupt: a repeated Ctrl-C, redelivered by trio after the cleanup ran.
        progress.finish()
        print(
            f"sbxkit batch: interrupted by {str(exc) or 'SIGINT'}; every sandbox in flight was "
            "removed; "
            f"{progress.done} of {len(jobs)} jobs have a line in {args.out} "
            "(run the same command again to resume)",
            file=sys.stderr,
        )
        return getattr(exc, "exit_code", 128 + signal.SIGINT)
    finally:
        try:
            for line in order.drain() if order is not None else ():
                writer.append(line)  # completed jobs keep their lines, whatever stopped it
            writer.sync()
        finally:
            writer.close()
    progress.finish()
    print(
        f"sbxkit batch: {counted(progress.ran, 'job')} ran in {format_clock(progress.elapsed_s)} "
        f"({skipped} already done): {progress.failed} failed, {counted(progress.errors, 'error')}"
        + (f", {progress.lost} attempts lost and retried" if progress.lost else "")
        + f"; results in {args.out}",
        file=sys.stderr,
    )
    if progress.cleanup_errors:
        print(
            f"sbxkit batch: {progress.cleanup_errors} sandboxes could not be removed; their "
            "leases are kept (see `sbxkit leases`)",
            file=sys.stderr,
        )
        return EXIT_CLEANUP_FAILED
    return EXIT_JOB_ERRORS if progress.errors or earlier_errors else EXIT_OK


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m sbxkit.cli.batch`` (the same as ``sbxkit batch``)."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="sbxkit batch", description=DESCRIPTION, epilog=EPILOG
    )
    configure(parser)
    exit_with(cmd_batch, parser.parse_args(argv))


if __name__ == "__main__":
    main()
