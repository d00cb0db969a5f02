"""A framed connection: the one receive loop both ends of the supervisor socket share."""

from __future__ import annotations

import array
import contextlib
import os
import socket
from collections import deque

import trio

from sbxkit._protocol.wire import FrameReader
from sbxkit._util.readiness import readable_now

RECEIVE_CHUNK = 64 * 1024
MAX_FDS = 4
FD_SIZE = array.array("i").itemsize


class FrameChannel:
    """Whole frames from a stream; ``None`` once the peer is gone (EOF or a broken socket).

    ``accept_fds``: read with ``recvmsg`` and keep the file descriptors that ride with a
    message (``SCM_RIGHTS``, a claimed kernel path sandbox's ends) in ``fds``, in order; a
    plain read would drop them (the kernel closes what no one received)."""

    def __init__(self, stream: trio.SocketStream, *, accept_fds: bool = False) -> None:
        self.stream = stream
        self._reader = FrameReader()
        self._pending: deque[bytes] = deque()
        self._accept_fds = accept_fds
        self.fds: list[int] = []

    async def receive_payload(self) -> bytes | None:
        while not self._pending:
            try:
                data = await self._receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return None
            if not data:
                return None
            self._pending.extend(self._reader.feed(data))
        return self._pending.popleft()

    async def _receive(self) -> bytes:
        if not self._accept_fds:
            return await self.stream.receive_some(RECEIVE_CHUNK)
        data, ancillary, flags, _ = await self.stream.socket.recvmsg(
            RECEIVE_CHUNK, socket.CMSG_SPACE(MAX_FDS * FD_SIZE)
        )
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % FD_SIZE
                self.fds.extend(array.array("i", payload[:usable]))
        if flags & socket.MSG_CTRUNC:
            self.close_fds()
            raise OSError("more file descriptors came than a claim carries")
        return data

    def take_fds(self, count: int) -> list[int]:
        """The first ``count`` descriptors received, now the caller's to close."""
        taken, self.fds = self.fds[:count], self.fds[count:]
        return taken

    def close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def has_input(self) -> bool:
        """A frame (or part of one) is here to read now, without waiting."""
        if self._pending or self._reader.pending:
            return True
        return readable_now(self.stream.socket.fileno())

    def unread(self, payload: bytes) -> None:
        """Put a received frame back: the next ``receive_payload`` returns it first."""
        self._pending.appendleft(payload)

    async def aclose(self) -> None:
        self.close_fds()
        await trio.aclose_forcefully(self.stream)
