"""``sbxkit batch``'s results file: one JSON line per job, appended whole, resumable.

A line is appended with one unbuffered write as its job completes (a failed write is
truncated away, so the file never ends in half a line); ``scan_results`` reads back which ids
are done, drops a crash's trailing fragment and refuses any other line that is not a result.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from sbxkit.errors import SpecError
from sbxkit.harness import Job, JobError, JobId, JobResult
from sbxkit.result import json_fields


class ResultsFileError(SpecError):
    """The results file holds a line that is not a complete result: it is not ours to extend."""

    def __init__(self, source: str, line: int, rule: str) -> None:
        super().__init__("results", rule)
        self.args = (f"{source} line {line}: {rule}",)
        self.source = source
        self.line = line


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
    pooled: bool = False
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
