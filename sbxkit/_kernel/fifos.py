"""The host side of a sandbox's FIFOs: one private directory per lease, its three FIFOs, and
the host's ends of them.

The FIFO root is a sibling of the supervisor's state directory (``io_root``): both the caller
and the supervisor find it from the state directory alone, and the supervisor removes a
lease's directory when it removes the lease's container, whoever made it (a killed caller
leaves none behind). The root is ``0700`` and owned by this account, checked without following
links before every use; each lease's directory and FIFOs belong to the sandbox user (it must
open them from inside), ``0700``/``0600``, so no other host account can reach them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sbxkit._kernel.scripts import io_root
from sbxkit.errors import IoDirError

__all__ = [
    "FIFO_NAMES",
    "HostEnds",
    "IoDirError",
    "io_dir_problem",
    "io_root",
    "make_io_dir",
    "open_host_ends",
    "remove_io_dir",
    "sandbox_ids",
    "stale_io_dirs",
]

FIFO_NAMES = ("in", "out", "err")


def _checked_root(root: Path) -> None:
    os.makedirs(root.parent, mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode):
        raise IoDirError(f"{root} is not a directory")
    if info.st_uid != os.geteuid():
        raise IoDirError(f"{root} is owned by uid {info.st_uid}, not {os.geteuid()}")
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise IoDirError(f"{root} has mode {stat.S_IMODE(info.st_mode):o}, not 700")


def sandbox_ids(user: str | None) -> tuple[int, int]:
    """The numeric ``uid:gid`` a hardened body runs as (policy always sets both)."""
    uid, _, gid = (user or "").partition(":")
    if not (uid.isdigit() and gid.isdigit()):
        raise IoDirError(f"the sandbox user {user!r} is not a numeric uid:gid")
    return int(uid), int(gid)


def make_io_dir(root: Path, lease: str, uid: int, gid: int) -> Path:
    """The lease's directory with its three FIFOs, all the sandbox user's."""
    _checked_root(root)
    leaf = root / lease
    os.mkdir(leaf, 0o700)
    try:
        for name in FIFO_NAMES:
            path = leaf / name
            os.mkfifo(path, 0o600)
            os.chmod(path, 0o600, follow_symlinks=False)  # whatever the umask was
            os.chown(path, uid, gid, follow_symlinks=False)
        os.chown(leaf, uid, gid, follow_symlinks=False)
    except BaseException:
        remove_io_dir(root, lease)
        raise
    return leaf


def remove_io_dir(root: Path, lease: str) -> None:
    """Remove a lease's FIFO directory (gone already is fine)."""
    leaf = root / lease
    for name in FIFO_NAMES:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(leaf / name)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(leaf)


def stale_io_dirs(root: Path, *, older_than_s: float, now: float) -> list[str]:
    """The names of the lease directories under ``root`` last changed more than
    ``older_than_s`` before ``now`` (wall clock); none when there is no root yet."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    stale = []
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_mtime < now - older_than_s:
            stale.append(entry.name)
    return sorted(stale)


@dataclass
class HostEnds:
    """The host's ends of a sandbox's FIFOs, non-blocking: ``stdin`` read-write (so it never
    blocks opening and the container's ``open`` of ``in`` completes), ``stdout`` and
    ``stderr`` read-only. Opened before the container starts."""

    stdin: int
    stdout: int
    stderr: int

    def fds(self) -> list[int]:
        return [self.stdin, self.stdout, self.stderr]

    def close(self) -> None:
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)


def open_host_ends(leaf: Path) -> HostEnds:
    flags = os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
    opened: list[int] = []
    try:
        for name, mode in (("in", os.O_RDWR), ("out", os.O_RDONLY), ("err", os.O_RDONLY)):
            fd = os.open(leaf / name, mode | flags)
            opened.append(fd)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise IoDirError(f"{leaf / name} is not a FIFO")
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    return HostEnds(*opened)


def io_dir_problem(directory: str, uid: int, gid: int) -> str | None:
    """Why ``directory`` is not a lease's FIFO directory as ``make_io_dir`` leaves it (the
    supervisor's re-check of a kernel path bind), or None: a real directory of the sandbox
    user holding exactly ``in``, ``out`` and ``err``, each a FIFO of that user, ``0600``."""
    try:
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or (info.st_uid, info.st_gid) != (uid, gid):
            return f"{directory} is not a directory of the sandbox user {uid}:{gid}"
        if sorted(os.listdir(directory)) != sorted(FIFO_NAMES):
            return f"{directory} holds more or less than its three FIFOs"
        for name in FIFO_NAMES:
            fifo = os.lstat(os.path.join(directory, name))
            if not stat.S_ISFIFO(fifo.st_mode) or (fifo.st_uid, fifo.st_gid) != (uid, gid):
                return f"{directory}/{name} is not a FIFO of the sandbox user"
            if stat.S_IMODE(fifo.st_mode) != 0o600:
                return f"{directory}/{name} has mode {stat.S_IMODE(fifo.st_mode):o}, not 600"
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    return None
