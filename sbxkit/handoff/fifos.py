"""A handed-off run on its FIFOs, watched by the command line (standard library only).

The parallel of ``sbxkit._lifecycle.kernel_watch.supervise_kernel`` in a process without trio: the
line that lets the payload go, then stdin, into the ``in`` FIFO; ``out`` and ``err`` read under
the per-stream cap until their EOF; the exit seen on the init's pidfd (readable once it exited);
all within the time limit, counted from the hand-off. After the exit, output is drained at most
``drain_s`` (it ends at once: the init's exit tears its PID namespace down, and every writer
with it). The exit *status* and what it means are the supervisor's to read and judge
(``RunEnded``): it holds its own pidfd of the init and the sandbox's OOM watch.

stdin is written only as the FIFO takes it, a chunk at a time, and read from its source only
when the FIFO has room (writing it all before reading output would deadlock on the 64 KiB
pipe buffers). The caller's stdin descriptor is polled, never switched to non-blocking: it may
be a terminal shared with the shell that started us.
"""

from __future__ import annotations

import contextlib
import os
import select
import time

from sbxkit._util.capped import CappedBuffer

TYPE_CHECKING = False  # typing and dataclasses are not loaded here: each costs a few ms
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Ends", "Watched", "watch"]

READ_CHUNK = 256 * 1024
STDIN_CHUNK = 64 * 1024
_IN = select.POLLIN | select.POLLPRI
_OUT = select.POLLOUT


class Ends:
    """The sandbox's ends as they came with ``RunStarted``: ``stdin`` is the ``in`` FIFO
    (read-write, non-blocking), ``stdout``/``stderr`` its read ends, ``pidfd`` its init."""

    def __init__(self, stdin: int, stdout: int, stderr: int, pidfd: int) -> None:
        self.stdin, self.stdout, self.stderr, self.pidfd = stdin, stdout, stderr, pidfd
        self.closed: set[int] = set()

    def close(self, fd: int) -> None:
        if fd not in self.closed:
            self.closed.add(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_all(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr, self.pidfd):
            self.close(fd)


class Watched:
    """How the run ended as the command line saw it (``status``: ``exited``, ``timed_out``,
    ``output_exceeded``, or ``interrupted`` — a signal came), and the output it kept."""

    def __init__(self, status: str, stdout: CappedBuffer, stderr: CappedBuffer) -> None:
        self.status, self.stdout, self.stderr = status, stdout, stderr
        self.overflowed: str | None = None


class _Feed:
    """``line``, then the source's bytes, into the ``in`` FIFO as it takes them; EOF after."""

    def __init__(self, poller: select.poll, ends: Ends, line: bytes, source: int | None) -> None:
        self.poller, self.ends, self.source = poller, ends, source
        self.pending = line
        self.reading = False  # waiting for the source (else for room in the FIFO)
        self.done = False
        self.poller.register(ends.stdin, _OUT)
        if not line:
            self._next()

    def writable(self) -> None:
        try:
            sent = os.write(self.ends.stdin, self.pending[:STDIN_CHUNK])
        except BlockingIOError:
            return
        self.pending = self.pending[sent:]
        if not self.pending:
            self._next()

    def readable(self) -> None:
        assert self.source is not None
        try:
            chunk = os.read(self.source, STDIN_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""  # an unreadable source ends the payload's input
        self.poller.unregister(self.source)
        self.reading = False
        if not chunk:
            self.source = None
            self._next()
            return
        self.pending = chunk
        self.poller.register(self.ends.stdin, _OUT)

    def _next(self) -> None:
        """The pending bytes went out: read more, or close the FIFO (the payload's EOF)."""
        _unregister(self.poller, self.ends.stdin)
        if self.source is None:
            self.stop()
            return
        self.reading = True
        self.poller.register(self.source, _IN)

    def stop(self) -> None:
        """No more input: the payload exited, or its input ended (close: its EOF)."""
        if self.done:
            return
        self.done = True
        self.reading = False  # a source event in the same poll is no longer ours to read
        for fd in (self.ends.stdin, self.source):
            if fd is not None:
                _unregister(self.poller, fd)
        self.ends.close(self.ends.stdin)


def _unregister(poller: select.poll, fd: int) -> None:
    with contextlib.suppress(KeyError):
        poller.unregister(fd)


def watch(
    ends: Ends,
    line: bytes,
    source: int | None,
    output_bytes: int,
    timeout_s: float,
    drain_s: float,
    wakeup_fd: int,
    signalled: Callable[[], bool],
) -> Watched:
    """Run the handed-off payload to its end on its FIFOs (see the module's docstring).
    ``wakeup_fd`` becomes readable when a signal arrives; ``signalled()`` says one did."""
    capture = {ends.stdout: CappedBuffer(output_bytes), ends.stderr: CappedBuffer(output_bytes)}
    names = {ends.stdout: "stdout", ends.stderr: "stderr"}
    watched = Watched("exited", capture[ends.stdout], capture[ends.stderr])
    poller = select.poll()
    for fd in (ends.stdout, ends.stderr, ends.pidfd, wakeup_fd):
        poller.register(fd, _IN)
    feed = _Feed(poller, ends, line, source)
    open_outputs = {ends.stdout, ends.stderr}
    deadline = time.monotonic() + timeout_s
    exited_at: float | None = None
    while True:
        if signalled():
            watched.status = "interrupted"
            break
        if exited_at is not None and not open_outputs:
            break
        until = deadline if exited_at is None else min(deadline, exited_at + drain_s)
        left = until - time.monotonic()
        if left <= 0:
            if exited_at is None:
                watched.status = "timed_out"
            break
        for fd, _event in poller.poll(max(1, int(left * 1000) + 1)):
            if fd in open_outputs:
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    poller.unregister(fd)
                    open_outputs.discard(fd)
                elif capture[fd].add(data):  # the first byte past the cap
                    watched.status, watched.overflowed = "output_exceeded", names[fd]
                    feed.stop()
                    return watched
            elif fd == ends.pidfd and exited_at is None:
                exited_at = time.monotonic()
                poller.unregister(fd)
                feed.stop()  # nothing reads stdin any more
            elif fd == ends.stdin and not feed.done:
                feed.writable()
            elif fd == feed.source and feed.reading:
                feed.readable()
            elif fd == wakeup_fd:
                with contextlib.suppress(OSError):
                    os.read(wakeup_fd, 64)
    feed.stop()
    return watched
