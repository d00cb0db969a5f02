"""``sbxkit batch JOBS.jsonl --parallel N --out RESULTS.jsonl``: harness mode on the command line.

Input: one job per line, a JSON object ``{"id": ..., "image": ..., "command": [...],
"limits": {...}, "env": {...}, "stdin": "..."}`` — ``id`` (a string or an integer, unique in
the file), optional ``stdin`` (text, sent UTF-8 encoded), and otherwise exactly the fields of
``SandboxSpec`` (``limits`` takes ``Limits``' field names or ``sbxkit run``'s, sizes as strings
such as ``"64m"``). ``--profile`` and the limit flags give defaults a line may leave out
(sbxkit/jobs.py). Blank lines are ignored. Every line is decoded and
validated before anything runs; the first bad one is reported with its line number and field,
and the exit status is 2.

Output: one JSON object per line and per job, in completion order — ``id``, ``status``
(``exited``, ``timed_out``, ``output_exceeded``, ``oom_killed``, or ``error``), ``exit_code``,
``stdout``/``stderr`` (UTF-8 with replacement), ``stdout_bytes``/``stderr_bytes`` (the raw byte
counts), ``overflowed``, ``oom_evidence``, ``container_id``, ``lease``, ``timings`` (seconds:
``queued_s``, ``create_s``, ``start_s``, ``run_s``, ``remove_s``, ``elapsed_s``), and ``error``
(``{"type", "message"}``, for jobs that have no run result). Each line is appended with one
unbuffered write as its job completes (a failed write is truncated away, so the file never ends
in half a line); the file is fsynced at the end.

Resume: ids already present in RESULTS are skipped, so re-running the same command after an
interruption runs exactly the jobs without a line. A trailing fragment left by a crash is
dropped; any other line that is not a result object refuses the run.

Progress: on a terminal, one status line redrawn on stderr and cut to its width (done/total,
running, queued, failed, errors, rate, ETA; "running" counts the jobs the batch has started,
some of which may still wait for the host's capacity in the supervisor); nothing while stderr
is not a terminal. A one-line summary is printed at the end either way.

SIGINT/SIGTERM cancel the batch: every sandbox in flight is removed by its own run before the
command exits with 128 + the signal number; jobs that did not finish have no line, and RESULTS
holds only complete lines.

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
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import msgspec
import trio

from sbxkit.argtypes import positive_int
from sbxkit.cli.common import Interrupted, cancel_on_signals, exit_with
from sbxkit.cli.jobs import add_default_flags, defaults_from_args, forget_error_lines, with_defaults
from sbxkit.errors import CleanupError, SpecError
from sbxkit.harness import Job, JobError, JobId, JobResult, run_many
from sbxkit.result import json_fields
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec, parse_size, spec_error_from, validate_spec
from sbxkit.unwrap import plain_async

__all__ = [
    "JobsFileError",
    "ResultLine",
    "ResultsFileError",
    "ResultsWriter",
    "add_batch_parser",
    "cmd_batch",
    "decode_jobs",
    "encode_result",
    "main",
    "scan_results",
]

EXIT_OK = 0
EXIT_JOB_ERRORS = 1
EXIT_REFUSED = 2
EXIT_CLEANUP_FAILED = 74
DEFAULT_PARALLEL = 4
PROGRESS_INTERVAL_S = 0.5


class JobsFileError(SpecError):
    """A line of the jobs file is not a valid job. Raised before anything runs."""

    def __init__(self, source: str, line: int, field: str, rule: str) -> None:
        super().__init__(field, rule)
        self.args = (f"{source} line {line}: {field}: {rule}",)
        self.source = source
        self.line = line


class ResultsFileError(SpecError):
    """The results file holds a line that is not a complete result: it is not ours to extend."""

    def __init__(self, source: str, line: int, rule: str) -> None:
        super().__init__("results", rule)
        self.args = (f"{source} line {line}: {rule}",)
        self.source = source
        self.line = line


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
    if "id" not in data:
        raise SpecError("id", "required field is missing")
    job_id = _job_id(data.pop("id"))
    stdin = data.pop("stdin", None)
    if stdin is not None and not isinstance(stdin, str):
        raise SpecError("stdin", f"must be a string (text) or null, got {type(stdin).__name__}")
    data = with_defaults(data, defaults or {})
    try:
        spec = msgspec.convert(data, SandboxSpec)
    except msgspec.ValidationError as exc:
        raise spec_error_from(exc) from None
    validate_spec(spec, settings)
    return Job(id=job_id, spec=spec, stdin=None if stdin is None else stdin.encode("utf-8"))


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
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError("JOBS", f"cannot read {path}: {exc.strerror}") from None
    return decode_jobs(data, str(path), settings, defaults)


# --- output --------------------------------------------------------------------------------------


class ResultLine(msgspec.Struct, kw_only=True):
    """One line of RESULTS."""

    id: JobId
    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    overflowed: str | None = None
    oom_evidence: str | None = None
    kill_evidence: str | None = None
    usage: dict[str, Any] | None = None
    container_id: str | None = None
    lease: str | None = None
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    error: JobError | None = None


_ENCODER = msgspec.json.Encoder()


def result_line(done: JobResult) -> ResultLine:
    timings = {"queued_s": done.queued_s}
    result = done.result
    if result is None:
        assert done.error is not None
        timings["elapsed_s"] = done.elapsed_s
        return ResultLine(
            id=done.id,
            status="error",
            container_id=done.error.container_id,
            lease=done.error.lease,
            timings=timings,
            error=done.error,
        )
    fields = json_fields(result)
    fields["timings"] = {
        **timings,
        **msgspec.structs.asdict(result.timings),
        "elapsed_s": done.elapsed_s,
    }
    return ResultLine(id=done.id, **fields)  # type: ignore[arg-type]


def encode_result(done: JobResult) -> bytes:
    """The complete line for one job, newline included (JSON escapes any newline inside)."""
    return _ENCODER.encode(result_line(done)) + b"\n"


class _Seen(msgspec.Struct):
    id: JobId
    status: str = ""


_SEEN = msgspec.json.Decoder(_Seen)


class ResultsScan(msgspec.Struct, frozen=True):
    """What a results file already holds: the ids done, and how much of the file to keep."""

    done: set[JobId]
    errors: set[JobId]
    """The ids whose line is an ``error`` line (the job never ran)."""
    keep_bytes: int
    """Length of the valid prefix; a crash's trailing fragment lies beyond it."""
    needs_newline: bool
    """The last record is complete but lost its newline: add one before appending."""


def scan_results(data: bytes, source: str = "results") -> ResultsScan:
    """Pure: the ids of every complete result line; a trailing fragment is to be dropped.

    A complete line (newline-terminated) that is not a result object refuses the file: it is
    not something this command wrote, and appending to it would hide that.
    """
    done: set[JobId] = set()
    errors: set[JobId] = set()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" when the file ends in one
    offset = 0
    for number, raw in enumerate(lines, start=1):
        offset += len(raw) + 1
        if not raw.strip():
            continue
        try:
            seen = _SEEN.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ResultsFileError(source, number, f"not a result line ({exc})") from None
        done.add(seen.id)
        if seen.status == "error":
            errors.add(seen.id)
    if tail.strip():
        try:
            seen = _SEEN.decode(tail)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return ResultsScan(done, errors, offset, needs_newline=False)  # a crash's half line
        done.add(seen.id)
        if seen.status == "error":
            errors.add(seen.id)
        return ResultsScan(done, errors, len(data), needs_newline=True)
    return ResultsScan(done, errors, len(data), needs_newline=False)


def prepare_results(path: Path) -> ResultsScan:
    """Read RESULTS (absent: nothing done) and drop a trailing fragment left by a crash."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ResultsScan(set(), set(), 0, needs_newline=False)
    except OSError as exc:
        raise SpecError("--out", f"cannot read {path}: {exc.strerror}") from None
    scan = scan_results(data, str(path))
    if scan.keep_bytes < len(data) or scan.needs_newline:
        with open(path, "r+b") as handle:
            handle.truncate(scan.keep_bytes)
            if scan.needs_newline:
                handle.seek(0, os.SEEK_END)
                handle.write(b"\n")
    return scan


def pending_jobs(jobs: Sequence[Job], scan: ResultsScan) -> list[Job]:
    """The jobs without a line in RESULTS, in input order (resume)."""
    return [job for job in jobs if job.id not in scan.done]


WriteFn = Callable[[int, bytes], int]


class ResultsWriter:
    """Appends whole lines: one unbuffered write each, truncated back if the write fails."""

    def __init__(self, path: Path, *, write: WriteFn = os.write) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd = os.open(path, flags, 0o644)
        self._write = write
        self.lines = 0

    def append(self, line: bytes) -> None:
        if not line.endswith(b"\n") or b"\n" in line[:-1]:
            raise ValueError("a result line is one line ending in a newline")
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(line)
            while view:
                written = self._write(self._fd, bytes(view))
                view = view[written:]
        except BaseException:
            os.ftruncate(self._fd, start)
            raise
        self.lines += 1

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


# --- progress ------------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_progress(
    *,
    done: int,
    total: int,
    failed: int,
    errors: int,
    ran: int,
    elapsed_s: float,
    running: int = 0,
    width: int | None = None,
) -> str:
    """Running and queued jobs, ``done/total``, failures, this session's rate and the ETA —
    cut to ``width`` columns by dropping the least telling parts from the end."""
    rate = ran / elapsed_s if elapsed_s > 0 and ran else 0.0
    left = total - done
    eta = _clock(left / rate) if rate > 0 else "?"
    if left == 0:
        eta = "0:00"
    parts = [
        f"{done}/{total} done",
        f"{running} running",
        f"{max(left - running, 0)} queued",
        f"{failed} failed",
        f"{errors} errors",
        f"{rate:.2f} jobs/s",
        f"ETA {eta}",
    ]
    line = parts[0]
    for part in parts[1:]:
        candidate = f"{line} · {part}"
        if width is not None and len(candidate) > width:
            break
        line = candidate
    return line[:width] if width is not None else line


def is_failure(done: JobResult) -> bool:
    return done.result is not None and not done.result.ok


class Progress:
    """The status line: drawn with ``\\r`` on a terminal, silent otherwise."""

    def __init__(
        self,
        total: int,
        already: int,
        stream: TextIO,
        *,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = already
        self.running = 0
        self.ran = 0
        self.failed = 0
        self.errors = 0
        self.cleanup_errors = 0
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._clock = clock
        self._began = clock()

    def start(self, job_id: JobId) -> None:
        """A job was admitted by the batch (it may still wait for the host's capacity)."""
        self.running += 1

    def record(self, done: JobResult) -> None:
        self.done += 1
        self.ran += 1
        self.running = max(self.running - 1, 0)
        if done.error is not None:
            self.errors += 1
            if done.error.type == CleanupError.__name__:
                self.cleanup_errors += 1
        elif is_failure(done):
            self.failed += 1
        self.draw()

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._began

    def line(self) -> str:
        return format_progress(
            done=self.done,
            total=self.total,
            failed=self.failed,
            errors=self.errors,
            ran=self.ran,
            elapsed_s=self.elapsed_s,
            running=self.running,
            width=shutil.get_terminal_size().columns - 1 if self.enabled else None,
        )

    def draw(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()


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
        default=DEFAULT_PARALLEL,
        metavar="N",
        help=f"at most N sandboxes at once (default {DEFAULT_PARALLEL})",
    )
    parser.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="this batch's share: summed memory of its jobs in flight, e.g. 8g (default: no "
        "cap of its own; the supervisor admits against the host's budget)",
    )
    parser.add_argument(
        "--cpu-budget",
        metavar="CPUS",
        help="this batch's share: summed CPUs of its jobs in flight (default: no cap; CPU "
        "quotas are ceilings, not reservations)",
    )
    parser.add_argument("--socket", help="Docker socket path (default: discovered)")
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
        description=(__doc__ or "").split("\n\n")[0],
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
            cpus = float(args.cpu_budget)
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
    parallel: int,
    memory_budget: int | None,
    cpu_budget: float | None,
    socket_path: str | None,
    settings: Settings | None,
) -> None:
    """Run the jobs, writing each result as it completes; SIGINT/SIGTERM cancel the batch
    (every run removes its container first) and raise Interrupted."""

    def on_result(done: JobResult) -> None:
        writer.append(encode_result(done))
        progress.record(done)

    async def tick() -> None:
        while True:
            await trio.sleep(PROGRESS_INTERVAL_S)
            progress.draw()

    async def work() -> None:
        await run_many(
            jobs,
            parallel=parallel,
            host_memory_bytes=memory_budget,
            host_cpus=cpu_budget,
            on_result=on_result,
            on_start=progress.start,
            settings=settings,
            socket_path=socket_path,
        )

    await cancel_on_signals(work, *([tick] if progress.enabled else []))


def cmd_batch(args: argparse.Namespace) -> int:
    defaults, settings = defaults_from_args(args)
    jobs = load_jobs(args.jobs, settings, defaults)
    memory_budget, cpu_budget = _budgets(args)
    if args.retry_errors:
        forget_error_lines(args.out, {job.id for job in jobs})
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
    try:
        progress.draw()
        trio.run(
            functools.partial(
                run_batch,
                pending,
                writer,
                progress,
                parallel=args.parallel,
                memory_budget=memory_budget,
                cpu_budget=cpu_budget,
                socket_path=args.socket,
                settings=settings,
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
            writer.sync()
        finally:
            writer.close()
    progress.finish()
    print(
        f"sbxkit batch: {progress.ran} jobs ran in {_clock(progress.elapsed_s)} "
        f"({skipped} already done): {progress.failed} failed, {progress.errors} errors; "
        f"results in {args.out}",
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
        prog="sbxkit batch", description=(__doc__ or "").split("\n\n")[0]
    )
    configure(parser)
    exit_with(cmd_batch, parser.parse_args(argv))


if __name__ == "__main__":
    main()
