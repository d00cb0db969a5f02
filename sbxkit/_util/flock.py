"""An exclusive lock held for a process's life: a supervisor's instance lock, a runner's."""

from __future__ import annotations

import fcntl
import os


def hold_or_close(fd: int) -> int | None:
    """Take an exclusive ``flock`` on ``fd`` without waiting: ``fd`` once held; None (``fd``
    closed) when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
