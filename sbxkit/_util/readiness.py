"""Whether a file descriptor can be read now, without waiting.

``poll``, never ``select``: ``select`` refuses descriptors from 1024 on (``FD_SETSIZE``), and a
process running many sandboxes at once holds that many (each kernel path run alone holds its
three FIFO ends and its init's pidfd). Standard library only: ``sbxkit run``'s hand-off uses
it too. The engine layer keeps its own three lines (it imports nothing outside ``engine/``)."""

from __future__ import annotations

import math
import select
from collections.abc import Iterable


def readable(fds: Iterable[int], wait_s: float | None) -> set[int]:
    """Those of ``fds`` on which data, an end of file or a hang-up is waiting (an exited
    process's pidfd is readable), waiting up to ``wait_s`` for one (None: until one is)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    timeout_ms = None if wait_s is None else math.ceil(wait_s * 1000)
    return {fd for fd, _ in poller.poll(timeout_ms)}


def readable_now(fd: int) -> bool:
    """``fd`` is readable now; False if a read would block."""
    return bool(readable([fd], 0))
