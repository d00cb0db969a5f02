"""A framed connection: the one receive loop both ends of the supervisor socket share."""

from __future__ import annotations

import select
from collections import deque

import trio

from sbxkit.supervisor.wire import FrameReader

RECEIVE_CHUNK = 64 * 1024


class FrameChannel:
    """Whole frames from a stream; ``None`` once the peer is gone (EOF or a broken socket)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._reader = FrameReader()
        self._pending: deque[bytes] = deque()

    async def receive_payload(self) -> bytes | None:
        while not self._pending:
            try:
                data = await self.stream.receive_some(RECEIVE_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return None
            if not data:
                return None
            self._pending.extend(self._reader.feed(data))
        return self._pending.popleft()

    def has_input(self) -> bool:
        """A frame (or part of one) is here to read now, without waiting."""
        if self._pending:
            return True
        readable, _, _ = select.select([self.stream.socket.fileno()], [], [], 0)
        return bool(readable)

    def unread(self, payload: bytes) -> None:
        """Put a received frame back: the next ``receive_payload`` returns it first."""
        self._pending.appendleft(payload)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
