"""Reading an input file the way a hostile path cannot abuse: regular files only, size-capped,
under a deadline.

``sbxkit batch /dev/zero`` read until MemoryError, and ``--profile FIFO`` blocked forever. Here a
path is opened without blocking (``O_NONBLOCK``: opening a FIFO does not wait for a writer) and
without becoming a controlling terminal, its kind is checked on the open descriptor (so a swap
between check and read cannot slip a device in), anything but a regular file is refused by
kind, at most ``limit + 1`` bytes are read, and the whole open-and-read runs in a worker thread
the caller waits on for ``deadline_s`` at most (a hung network or FUSE mount cannot hold the
command: it is refused and the thread is left to finish on its own).

``file_kind_problem`` is the pure core: a mode in, the refusal (or None) out.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from sbxkit.errors import SpecError

__all__ = ["READ_DEADLINE_S", "file_kind_problem", "read_bounded"]

READ_DEADLINE_S = 30.0
"""How long an input file may take to open and read; a local file takes milliseconds."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind_problem(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read as input (only regular files are), or None."""
    if stat.S_ISREG(mode):
        return None
    for test, name in _KINDS:
        if test(mode):
            return f"is {name}, not a regular file"
    return "is not a regular file"


class _KindError(Exception):
    pass


def _kind_of(path: Path) -> str | None:
    try:
        return file_kind_problem(os.stat(path).st_mode)
    except OSError:
        return None


def _read(path: Path, limit: int) -> bytes:
    """Open without blocking, refuse by kind, read at most ``limit + 1`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        kind = _kind_of(path)  # a socket cannot be opened at all (ENXIO): say what it is
        if kind is not None:
            raise _KindError(kind) from None
        raise
    try:
        problem = file_kind_problem(os.fstat(fd).st_mode)
        if problem is not None:
            raise _KindError(problem)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bounded(
    path: str | Path,
    *,
    field: str,
    limit: int,
    deadline_s: float = READ_DEADLINE_S,
    reader: Callable[[Path, int], bytes] = _read,
) -> bytes:
    """The whole content of the regular file at ``path``; SpecError naming ``field`` when it
    is not a regular file, cannot be read, exceeds ``limit`` bytes or takes over
    ``deadline_s``. ``reader`` is the open-and-read (a test's stand-in for a hung mount)."""
    outcome: list[bytes | BaseException] = []

    def work() -> None:
        try:
            outcome.append(reader(Path(path), limit))
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append(exc)

    worker = threading.Thread(target=work, name=f"read {field}", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if not outcome:
        raise SpecError(field, f"{path}: not read within {deadline_s:g} s (a hung mount?)")
    result = outcome[0]
    if isinstance(result, _KindError):
        raise SpecError(field, f"{path} {result}")
    if isinstance(result, OSError):
        raise SpecError(field, f"cannot read {path}: {result.strerror or result}")
    if isinstance(result, ValueError):  # a NUL in the path
        raise SpecError(field, f"cannot read {path!r}: {result}")
    if isinstance(result, BaseException):
        raise result
    if len(result) > limit:
        raise SpecError(field, f"{path} is larger than {limit} bytes")
    return result
