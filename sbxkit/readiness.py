"""Whether a file descriptor can be read now, without waiting.

``poll``, never ``select``: ``select`` refuses descriptors from 1024 on (``FD_SETSIZE``), and a
process running many sandboxes at once holds that many (each kernel path run alone holds its
three FIFO ends and its init's pidfd)."""

from __future__ import annotations

import select


def readable_now(fd: int) -> bool:
    """Data, an end of file or a hang-up is waiting on ``fd`` (an exited process's pidfd is
    readable); False if a read would block."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
