"""``sbxkit batch``'s results file: one JSON line per job, appended whole, resumable.

A line is appended with one unbuffered write as its job completes (a failed write is
truncated away, so the file never ends in half a line); ``scan_lines`` reads back which ids
are done. Only lines of the results schema count (every key a result line has, no other), so a
jobs file or any other JSONL is refused, never taken for results; a crash's torn last line of
ours is moved aside to a side file, and a torn line that is not ours refuses the file.
"""

from __future__ import annotations

import io
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, get_args

import msgspec

from sbxkit._consumers.harness import Job, JobId, JobResult
from sbxkit._grammar.result_doc import (
    ErrorDoc,
    ErrorResultDoc,
    OutputEncoding,
    ResultDoc,
    result_doc,
)
from sbxkit._model.result import Status
from sbxkit._util.bounded_read import file_kind_problem
from sbxkit.errors import ResultsFileError, SpecError

# --- output --------------------------------------------------------------------------------------


ResultLine = ResultDoc
"""A result's line of RESULTS: the shape ``sbxkit run --json`` prints too (an error's line is
an ``ErrorResultDoc``; sbxkit/_grammar/result_doc.py)."""

_ENCODER = msgspec.json.Encoder()


def result_line(
    done: JobResult, *, cluster: bool = False, encoding: OutputEncoding = "utf-8"
) -> ResultDoc | ErrorResultDoc:
    """``cluster``: the line says which node and attempt (a lost attempt is a ``lost`` line);
    ``encoding``: the output's (``--output-encoding``)."""
    timings = {"queued_s": done.queued_s}
    result = done.result
    line: ResultDoc | ErrorResultDoc
    if result is None:
        assert done.error is not None
        timings["elapsed_s"] = done.elapsed_s
        error = done.error
        line = ErrorResultDoc(
            status="lost" if done.lost else "error",
            container_id=error.container_id,
            lease=error.lease,
            timings=timings,
            error=ErrorDoc(type=error.type, message=error.message, field=error.field),
        )
    else:
        line = result_doc(result, encoding)
        line.timings = {**timings, **line.timings, "elapsed_s": done.elapsed_s}
    line.id = done.id
    if cluster:
        line.node, line.attempt = done.node, done.attempt
    return line


def encode_result(
    done: JobResult, *, cluster: bool = False, encoding: OutputEncoding = "utf-8"
) -> bytes:
    """The complete line for one job, newline included (JSON escapes any newline inside)."""
    return _ENCODER.encode(result_line(done, cluster=cluster, encoding=encoding)) + b"\n"


RESULT_STATUSES = (*get_args(Status), "error", "lost")
LOST = "lost"
"""A cluster batch's attempt whose node was lost mid-run: recorded, but the job is not done
(it was retried, or a resume runs it)."""


_LINE_KEYS = frozenset(ResultDoc.__struct_fields__) | frozenset(ErrorResultDoc.__struct_fields__)
_REQUIRED_KEYS = frozenset({"id", "status", "timings"})
"""The schema a line must match to count as a result: the keys of ``ResultDoc`` or
``ErrorResultDoc`` (sbxkit/_grammar/result_doc.py; an older line's keys are among them), no
other, and ``id``, ``status`` and ``timings``, which every line of ours has. A jobs file or any
other JSONL with ``id`` fields fails it, and is never taken for results."""
_LINE = msgspec.json.Decoder(dict[str, Any])
_OWN_ID = re.compile(rb'\{"id":(?:"(?:[^"\\]|\\.)*"|-?[0-9]+)')
_OWN_ID_CUT = re.compile(rb'\{"id":(?:"(?:[^"\\]|\\.)*\\?|-?[0-9]*)')
_OWN_NEXT = b',"status":"'


def is_own_torn_line(fragment: bytes, *, after_results: bool) -> bool:
    """Whether an unterminated last line is the start of a line sbxkit writes: msgspec's
    compact ``ResultLine`` always begins ``{"id":ID,"status":"``. A fragment cut inside the id
    counts only after complete result lines (a lone ``{"id":"a`` may be anybody's)."""
    match = _OWN_ID.match(fragment)
    if match is None:
        cut = _OWN_ID_CUT.fullmatch(fragment) is not None or b'{"id":'.startswith(fragment)
        return after_results and cut
    rest = fragment[match.end() :]
    if len(rest) < len(_OWN_NEXT):
        return after_results and _OWN_NEXT.startswith(rest)
    return rest.startswith(_OWN_NEXT)


def _result_line(raw: bytes) -> tuple[JobId, str]:
    """The id and status of a result line; ``msgspec.ValidationError`` for any other line."""
    data = _LINE.decode(raw)
    unknown = sorted(set(data) - _LINE_KEYS)
    if unknown:
        raise msgspec.ValidationError(f"unknown key {unknown[0]!r}")
    missing = sorted(_REQUIRED_KEYS - set(data))
    if missing:
        raise msgspec.ValidationError(f"missing key {missing[0]!r}")
    status = data["status"]
    if status not in RESULT_STATUSES:
        raise msgspec.ValidationError(f"unknown status {status!r}")
    seen: ResultDoc | ErrorResultDoc
    if status in ("error", LOST):
        seen = msgspec.convert(data, ErrorResultDoc)
    else:
        seen = msgspec.convert(data, ResultDoc)
    assert not isinstance(seen.id, msgspec.UnsetType)  # a required key
    return seen.id, status


class ResultsScan(msgspec.Struct, frozen=True):
    """What a results file already holds: the ids done, and how much of the file to keep."""

    done: set[JobId]
    errors: set[JobId]
    """The ids whose line is an ``error`` line (the job never ran)."""
    keep_bytes: int
    """Length of the valid prefix; a crash's torn last line lies beyond it."""
    needs_newline: bool
    """The last record is complete but lost its newline: add one before appending."""
    moved_to: str | None = None
    """Where ``prepare_results`` moved a torn last line aside (None: there was none)."""
    lost: dict[JobId, int] = msgspec.field(default_factory=dict)
    """Each id's ``lost`` lines (cluster attempts whose node was lost): they do not make the
    job done; a resumed cluster batch numbers its next attempt after them."""


def scan_lines(lines: Iterable[bytes], source: str = "results") -> ResultsScan:
    """Pure: read a results file line by line (newlines kept), without keeping it in memory.

    Every complete line must be a result line (``_LINE_KEYS``): anything else refuses
    the file, as it is not something this command wrote. A last line without its newline is a
    complete record that lost it, or a crash's torn half of one of ours (beyond
    ``keep_bytes``, to be moved aside); a torn line that is not ours refuses the file too.
    """
    done: set[JobId] = set()
    errors: set[JobId] = set()
    lost: dict[JobId, int] = {}
    offset = 0
    for number, raw in enumerate(lines, start=1):
        complete = raw.endswith(b"\n")
        body = raw[:-1] if complete else raw
        if not body.strip():
            offset += len(raw)
            continue
        try:
            job_id, status = _result_line(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if complete:
                raise ResultsFileError(source, number, f"not a result line ({exc})") from None
            if not is_own_torn_line(body, after_results=bool(done)):
                raise ResultsFileError(
                    source,
                    number,
                    "the last line is incomplete and is not a line sbxkit writes; the file is "
                    "left as it is",
                ) from None
            return ResultsScan(done, errors, offset, needs_newline=False, lost=lost)  # torn
        if status == LOST:
            lost[job_id] = lost.get(job_id, 0) + 1
        else:
            done.add(job_id)
        if status == "error":
            errors.add(job_id)
        offset += len(raw)
        if not complete:
            return ResultsScan(done, errors, offset, needs_newline=True, lost=lost)
    return ResultsScan(done, errors, offset, needs_newline=False, lost=lost)


def scan_results(data: bytes, source: str = "results") -> ResultsScan:
    """``scan_lines`` over a whole document in memory."""
    return scan_lines(io.BytesIO(data), source)


def open_results(path: Path) -> BinaryIO | None:
    """RESULTS opened for reading, or None when absent; anything but a regular file is refused
    by kind (``--out /dev/zero`` would never end, a FIFO would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        try:  # a socket cannot be opened at all (ENXIO): say what it is
            problem = file_kind_problem(os.stat(path).st_mode)
        except OSError:
            problem = None
        if problem is not None:
            raise SpecError("--out", f"{path} {problem}; results go to a regular file") from None
        raise SpecError("--out", f"cannot read {path}: {exc.strerror}") from None
    problem = file_kind_problem(os.fstat(fd).st_mode)
    if problem is not None:
        os.close(fd)
        raise SpecError("--out", f"{path} {problem}; results go to a regular file")
    return os.fdopen(fd, "rb")


def prepare_results(path: Path) -> ResultsScan:
    """Read RESULTS (absent: nothing done), refusing a file that is not ours. A crash's torn
    last line is moved aside, never deleted: copied (fsynced) to ``RESULTS.torn-STAMP`` beside
    it, then cut from RESULTS; a complete last record that lost its newline gets one."""
    handle = open_results(path)
    if handle is None:
        return ResultsScan(set(), set(), 0, needs_newline=False)
    with handle:
        scan = scan_lines(handle, str(path))
        size = os.fstat(handle.fileno()).st_size
        torn = b""
        if scan.keep_bytes < size:
            handle.seek(scan.keep_bytes)
            torn = handle.read()
    if torn:
        side = _move_aside(path, torn)
        scan = msgspec.structs.replace(scan, moved_to=str(side))
    if torn or scan.needs_newline:
        with open(path, "r+b") as out:
            out.truncate(scan.keep_bytes)
            if scan.needs_newline:
                out.seek(0, os.SEEK_END)
                out.write(b"\n")
    return scan


def _move_aside(path: Path, torn: bytes) -> Path:
    """Write ``torn`` to a new side file next to ``path`` (never over an existing one)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for attempt in range(100):
        side = path.with_name(f"{path.name}.torn-{stamp}" + (f"-{attempt}" if attempt else ""))
        try:
            fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        except OSError as exc:
            raise SpecError(
                "--out", f"cannot move a torn last line aside: {exc.strerror}"
            ) from None
        try:
            view = memoryview(torn)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        return side
    raise SpecError("--out", f"cannot move a torn last line aside: {path.name}.torn-* exist")


def pending_jobs(jobs: Sequence[Job], scan: ResultsScan) -> list[Job]:
    """The jobs without a line in RESULTS, in input order (resume)."""
    return [job for job in jobs if job.id not in scan.done]


class InputOrder:
    """``--order input``: releases lines in the jobs' order. A line is held only while a job
    before it has none: what is held is the lines completed ahead of the earliest job still
    running, fewer than the batch's ``ahead`` (``run_many``: 4 × ``--parallel`` locally)."""

    def __init__(self, ids: Iterable[JobId]) -> None:
        self._next: deque[JobId] = deque(ids)
        self._held: dict[JobId, bytes] = {}

    def add(self, job_id: JobId, line: bytes) -> list[bytes]:
        """The lines ``job_id``'s completion releases, in order (none while an earlier one
        runs)."""
        self._held[job_id] = line
        released = []
        while self._next and self._next[0] in self._held:
            released.append(self._held.pop(self._next.popleft()))
        return released

    def drain(self) -> list[bytes]:
        """The lines still held, in input order (an interrupted batch keeps them: a resume
        skips their jobs)."""
        held = [self._held.pop(job_id) for job_id in self._next if job_id in self._held]
        self._next.clear()
        return held

    @property
    def held(self) -> int:
        return len(self._held)


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
