"""A process's exit status from the kernel: ``pidfd_open`` and ``PIDFD_GET_INFO`` (Linux ≥ 6.15).

Any holder of a pidfd — parent or not — can ask the kernel how the process ended, once it has
been reaped: ``ioctl(pidfd, PIDFD_GET_INFO, struct pidfd_info)`` with ``PIDFD_INFO_EXIT`` in
the request mask answers the wait status (``exit_code``, offset 60 of the 64-byte struct) and
sets bit 3 of ``mask``. The pidfd becomes readable when the process exits; its reaper (the
container's shim) collects it a moment later, so the ioctl is repeated until the bit is set.
The status is the kernel's own record: nothing the process writes can change it.

No trio here: callers wait for readability themselves (``trio.lowlevel.wait_readable``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import struct

__all__ = [
    "PIDFD_GET_INFO",
    "PIDFD_INFO_EXIT",
    "ExitInfoUnsupported",
    "exit_status",
    "open_pidfd",
    "status_code",
    "still_running",
]

_INFO = struct.Struct("=QQ11Ii")  # mask, cgroupid, pid .. fsgid (11 x u32), exit_code
PIDFD_INFO_EXIT = 1 << 3
# _IOWR(0xFF, 11, struct pidfd_info): direction 3 (read|write), size 64, type 0xFF, number 11.
PIDFD_GET_INFO = (3 << 30) | (_INFO.size << 16) | (0xFF << 8) | 11


class ExitInfoUnsupported(OSError):
    """The kernel has no ``PIDFD_GET_INFO`` with exit information (Linux < 6.15)."""


def open_pidfd(pid: int) -> int:
    """A pidfd for ``pid`` (close it with ``os.close``); ``ProcessLookupError`` if it is gone."""
    return os.pidfd_open(pid)


def still_running(pidfd: int) -> bool:
    """The process has not exited (its pidfd is not readable yet)."""
    readable, _, _ = select.select([pidfd], [], [], 0)
    return not readable


def exit_status(pidfd: int) -> int | None:
    """The raw wait status of the exited and reaped process, or None while it is not reaped
    yet (or still running). ``ExitInfoUnsupported`` on kernels without the ioctl."""
    buffer = bytearray(_INFO.size)
    struct.pack_into("=Q", buffer, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buffer)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
            raise ExitInfoUnsupported(exc.errno, "PIDFD_GET_INFO is not supported") from exc
        if exc.errno == errno.ESRCH:
            return None
        raise
    mask, *_ids, status = _INFO.unpack(buffer)
    return int(status) if mask & PIDFD_INFO_EXIT else None


def status_code(status: int) -> int:
    """A wait status as the shell and Docker spell it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
