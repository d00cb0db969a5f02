"""A payload's stdin streamed from a file, with back-pressure, under the run's time limit.

``run(spec, stdin=...)`` takes bytes or a ``trio.abc.ReceiveStream``; ``FileStdin`` is such a
stream over a path or an open file descriptor (``sbxkit run --stdin FILE`` and ``--stdin -``).
Nothing is read whole: each chunk is read when the sandbox's attach socket has taken the last
one, so a 300 MB file costs one chunk of memory and ``/dev/zero`` streams until the payload
stops reading or the time limit ends the run.

Opening happens at the first read, inside the run: a FIFO without a writer (whose ``open``
blocks) waits at most the run's time limit, like everything else the run does. Regular files
(which epoll cannot watch) and the open are served by worker threads, abandoned on
cancellation (a thread stuck in ``open`` on a writer-less FIFO ends with the process);
pipes, FIFOs, terminals and character devices are read through trio's non-blocking
``FdStream``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable

import trio

from sbxkit.errors import SpecError

__all__ = ["STDIN_CHUNK", "FileStdin", "Prefixed", "StdinSource", "write_stdin"]

STDIN_CHUNK = 64 * 1024

StdinSource = bytes | trio.abc.ReceiveStream
"""What a run's ``stdin`` may be: all of it as bytes, or a stream read as the payload takes it."""


class FileStdin(trio.abc.ReceiveStream):
    """The bytes of ``path`` (or of the open descriptor ``fd``, which this stream then owns),
    opened at the first read. ``field`` names the input in errors (``--stdin``)."""

    def __init__(self, path: str | None = None, *, fd: int | None = None, field: str) -> None:
        if (path is None) == (fd is None):
            raise ValueError("give exactly one of path and fd")
        self._path = path
        self._fd = fd
        self._field = field
        self._stream: trio.lowlevel.FdStream | None = None
        self._opened = False
        self._closed = False

    async def _open(self) -> None:
        if self._fd is None:
            assert self._path is not None
            path = self._path
            try:
                self._fd = await trio.to_thread.run_sync(
                    lambda: os.open(path, os.O_RDONLY | os.O_CLOEXEC), abandon_on_cancel=True
                )
            except OSError as exc:
                raise SpecError(self._field, f"cannot read {path}: {exc.strerror}") from None
        mode = os.fstat(self._fd).st_mode
        if stat.S_ISDIR(mode):
            raise SpecError(self._field, f"{self._path or 'stdin'} is a directory")
        if not stat.S_ISREG(mode):
            self._stream = trio.lowlevel.FdStream(self._fd)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("stdin was closed")
        if not self._opened:
            await self._open()
            self._opened = True
        size = max_bytes or STDIN_CHUNK
        try:
            if self._stream is not None:
                return await self._stream.receive_some(size)
            fd = self._fd
            assert fd is not None
            return await trio.to_thread.run_sync(os.read, fd, size, abandon_on_cancel=True)
        except OSError as exc:
            raise SpecError(self._field, f"cannot read {self._path or 'stdin'}: {exc}") from None

    async def aclose(self) -> None:
        self._closed = True
        if self._stream is not None:
            await self._stream.aclose()
        elif self._fd is not None:
            os.close(self._fd)
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint()
        self._fd = None


class Prefixed(trio.abc.ReceiveStream):
    """``prefix``, then the run's own stdin (bytes or a stream), closed with it: what releases
    a parked shell (a pool's claim line) or a gated one (a governed network's newline)."""

    def __init__(self, prefix: bytes, stdin: StdinSource | None) -> None:
        self._pending = prefix + (stdin if isinstance(stdin, bytes) else b"")
        self._rest = stdin if isinstance(stdin, trio.abc.ReceiveStream) else None

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._pending:
            size = max_bytes or len(self._pending)
            chunk, self._pending = self._pending[:size], self._pending[size:]
            await trio.lowlevel.checkpoint()
            return chunk
        if self._rest is None:
            await trio.lowlevel.checkpoint()
            return b""
        return await self._rest.receive_some(max_bytes)

    async def aclose(self) -> None:
        if self._rest is not None:
            await self._rest.aclose()
        else:
            await trio.lowlevel.checkpoint()


async def write_stdin(
    send_all: Callable[[bytes | bytearray], Awaitable[None]], stdin: StdinSource | None
) -> None:
    """Write ``stdin`` through ``send_all``: a stream a chunk at a time, each read once the
    last was taken (back-pressure), and closed at the end; bytes in chunks of the same size."""
    if isinstance(stdin, trio.abc.ReceiveStream):
        async with stdin:
            while chunk := await stdin.receive_some(STDIN_CHUNK):
                await send_all(chunk)
    elif stdin:
        view = memoryview(stdin)
        for offset in range(0, len(view), STDIN_CHUNK):
            await send_all(bytes(view[offset : offset + STDIN_CHUNK]))
