"""The state directory's rules: its path, every directory above it, and every entry in it.

The verdicts are pure functions of ``lstat`` facts; ``check_state_path`` and ``scan_entries``
are the thin shells that gather them. Each problem is a ``StorageError`` naming the path and
what is wrong with it, and blocks execution until an operator fixes it (docs/operations.md,
"What is on disk"). The client runs the same checks before it launches a supervisor, so an odd
state directory is reported at once instead of after a launch timeout.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from sbxkit._protocol.address import SOCKET_NAME
from sbxkit._protocol.records import RECORD_SUFFIX
from sbxkit.errors import StorageError

LOCK_NAME = "supervisor.lock"
LOG_NAME = "supervisor.log"
TEMP_PREFIX = ".tmp-"

MAX_SOCKET_PATH = 107
"""Bytes in an AF_UNIX socket path (``sun_path`` is 108 bytes with its NUL on Linux)."""

STARTUP_REFUSAL = "refusing to start:"
"""How a startup failure begins in the supervisor's log; the launching client watches for it."""

Stale = Literal["stale"]


def socket_path_problem(state_dir: Path) -> str | None:
    """Why the control socket cannot live in ``state_dir`` (its path is too long), or None."""
    size = len(os.fsencode(state_dir / SOCKET_NAME))
    if size > MAX_SOCKET_PATH:
        return (
            f"is too long for a Unix socket: {SOCKET_NAME} in it would be a {size}-byte path, "
            f"the limit is {MAX_SOCKET_PATH}; choose a shorter state directory"
        )
    return None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a device or special file"


def ancestor_problem(info: os.stat_result, euid: int) -> str | None:
    """Why a directory above the state directory makes it unsafe, or None.

    A link anywhere on the path means the directory is not where it says it is; a directory
    another account owns or can write (without the sticky bit, as /tmp has) lets that account
    swap the state directory out from under the supervisor."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link; give the state directory by its real path"
    if not stat.S_ISDIR(info.st_mode):
        return f"is {_kind(info.st_mode)}, not a directory"
    if info.st_uid not in (0, euid):
        return f"is owned by uid {info.st_uid}, neither root nor {euid}"
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(info.st_mode)
        return f"has mode {mode:04o}: other users can replace what is in it (no sticky bit)"
    return None


def directory_problem(info: os.stat_result, euid: int) -> str | None:
    """Why the state directory itself is unsafe, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link; use the real directory"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != euid:
        return f"is owned by uid {info.st_uid}, not {euid}"
    if info.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(info.st_mode):04o}; must be 0700"
    return None


_SUPERVISOR_FILES = {
    LOCK_NAME: stat.S_ISREG,
    LOG_NAME: stat.S_ISREG,
    SOCKET_NAME: stat.S_ISSOCK,
}


def entry_problem(name: str, info: os.stat_result, euid: int) -> str | Stale | None:
    """The verdict on one entry: None (expected), ``"stale"`` (a crashed writer's temp file,
    removable under the lock) or the problem. Records (``*.lease``) are judged when read."""
    if name.endswith(RECORD_SUFFIX) and not name.startswith(TEMP_PREFIX):
        return None
    kind = _kind(info.st_mode)
    if name.startswith(TEMP_PREFIX):
        if not stat.S_ISREG(info.st_mode):
            return f"is {kind} named like a journal temp file; only regular files are written so"
        if info.st_uid != euid:
            return f"is owned by uid {info.st_uid}, not {euid}"
        return "stale"
    is_kind = _SUPERVISOR_FILES.get(name)
    if is_kind is None:
        return f"is {kind} the supervisor did not write; the state directory holds only its files"
    if not is_kind(info.st_mode):
        return f"is {kind}; the supervisor's {name} never is"
    if info.st_uid != euid:
        return f"is owned by uid {info.st_uid}, not {euid}"
    if info.st_nlink > 1 and not stat.S_ISSOCK(info.st_mode):
        return f"has {info.st_nlink} links; the supervisor's files have one"
    return None


# -- the shells ---------------------------------------------------------------------------------


def check_state_path(path: Path) -> None:
    """Raise StorageError for the first problem of the path above and at ``path`` (which must
    exist): links anywhere, unsafe ancestors, the directory's own owner and mode, and a socket
    path too long for AF_UNIX."""
    euid = os.geteuid()
    for ancestor in reversed(path.parents):
        problem = ancestor_problem(os.lstat(ancestor), euid)
        if problem is not None:
            raise StorageError(str(ancestor), f"{problem} (above the state directory {path})")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise StorageError(str(path), "does not exist") from None
    problem = directory_problem(info, euid) or socket_path_problem(path)
    if problem is not None:
        raise StorageError(str(path), problem)


def startup_refusal(log_tail: bytes) -> str | None:
    """The supervisor's startup refusal in what its log gained since the launch, or None."""
    for line in log_tail.decode("utf-8", "replace").splitlines():
        _, found, reason = line.partition(STARTUP_REFUSAL)
        if found:
            return reason.strip()
    return None


def read_log_from(log_path: Path, offset: int, limit: int = 64 * 1024) -> bytes:
    """At most ``limit`` bytes of the log from ``offset`` (never following a link)."""
    try:
        fd = os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def log_size(log_path: Path) -> int:
    try:
        return os.lstat(log_path).st_size
    except OSError:
        return 0


def scan_entries(path: Path) -> tuple[list[StorageError], list[str]]:
    """Every odd entry of the state directory as a StorageError, and the stale temp files."""
    euid = os.geteuid()
    problems: list[StorageError] = []
    stale: list[str] = []
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked (a record deleted, a temp file renamed)
            verdict = entry_problem(entry.name, info, euid)
            if verdict == "stale":
                stale.append(entry.name)
            elif verdict is not None:
                problems.append(StorageError(entry.path, verdict))
    return problems, sorted(stale)


__all__ = [
    "LOCK_NAME",
    "LOG_NAME",
    "MAX_SOCKET_PATH",
    "SOCKET_NAME",
    "STARTUP_REFUSAL",
    "TEMP_PREFIX",
    "ancestor_problem",
    "check_state_path",
    "directory_problem",
    "entry_problem",
    "log_size",
    "read_log_from",
    "scan_entries",
    "socket_path_problem",
    "startup_refusal",
]
