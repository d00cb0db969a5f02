"""A process's exit status from the kernel: ``pidfd_open`` and ``PIDFD_GET_INFO`` (Linux ≥ 6.15).

Any holder of a pidfd — parent or not — can ask the kernel how the process ended, once it has
been reaped: ``ioctl(pidfd, PIDFD_GET_INFO, struct pidfd_info)`` with ``PIDFD_INFO_EXIT`` in
the request mask answers the wait status (``exit_code``, offset 60 of the 64-byte struct) and
sets bit 3 of ``mask``. The pidfd becomes readable when the process exits; its reaper (the
container's shim) collects it a moment later, and then the pidfd also reports a hang-up (Linux
≥ 6.9): that is the event to wait for (``reap_watch``, ``wait_reaped``) before the ioctl.
The status is the kernel's own record: nothing the process writes can change it.

No trio here: callers wait for readability themselves (``trio.lowlevel.wait_readable``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import struct
import time

from sbxkit._util.readiness import readable_now

__all__ = [
    "PIDFD_GET_INFO",
    "PIDFD_INFO_EXIT",
    "ExitInfoUnsupported",
    "exit_status",
    "open_pidfd",
    "reap_watch",
    "status_code",
    "still_running",
    "wait_reaped",
    "zombie_status",
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
    return not readable_now(pidfd)


def reap_watch(pidfd: int) -> select.epoll:
    """An epoll that becomes readable once the exited process was reaped: it asks for the
    pidfd's hang-up alone (always reported, so no event bit is set), once. A timer's wait would
    round up to the event loop's millisecond; this wakes at the reap."""
    watch = select.epoll()
    try:
        watch.register(pidfd, select.EPOLLONESHOT)
    except BaseException:
        watch.close()
        raise
    return watch


def wait_reaped(pidfd: int, timeout_s: float) -> None:
    """Block until the exited process was reaped (its pidfd hangs up) or ``timeout_s``
    passed."""
    poller = select.poll()
    poller.register(pidfd, 0)  # the hang-up alone: poll reports it whatever is asked
    if poller.poll(max(1, round(timeout_s * 1000))):
        time.sleep(0.0001)  # hung up: reaped, so the next ask answers (never a busy loop)


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


def zombie_status(pid: int, pidfd: int) -> int | None:
    """The wait status of the exited process ``pidfd`` holds while it still waits for its
    reaper: ``/proc/PID/stat``'s ``exit_code`` (field 52), the same record the reap hands on.
    Taken only from a zombie that is still unreaped after the read, so ``pid`` was not another
    process's; and only as root (for others the kernel shows 0 there). None otherwise: wait for
    the reap."""
    if pid <= 0 or os.geteuid() != 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # fields[0] is field 3, the state
    if len(fields) < 50 or fields[0] != b"Z":
        return None
    if exit_status(pidfd) is not None:  # reaped meanwhile: the reap's record answers
        return None
    return int(fields[49])


def status_code(status: int) -> int:
    """A wait status as the shell and Docker spell it: the exit code, or 128 + the signal."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
