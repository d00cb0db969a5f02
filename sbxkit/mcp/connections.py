"""Connection limits for ``sbxkit mcp --http``: what uvicorn does not bound on its own.

uvicorn gives a connection that never sends a request no deadline, and counts such
connections against ``limit_concurrency`` like any other — so another local account holding
open a thousand silent connections either exhausts the server's file descriptors or, with a
limit, gets every newcomer answered 503. ``ConnectionGuard`` wraps uvicorn's h11 protocol:

- **head deadline**: a connection must deliver a complete request head (up to the blank line)
  within ``HEAD_TIMEOUT_S`` of being accepted, however slowly it trickles bytes, or it is
  dropped. The gate (``sbxkit.mcp.gate``) answers a head without a valid token at once and
  closes the connection, so a connection that lives past its head is an authenticated
  client's.
- **connection limit**: at most ``limit`` connections at once (well under the file-descriptor
  limit). When a newcomer finds them all taken, the oldest connection still waiting for its
  head makes room: a real client sends its head at once, so only silent connections are ever
  dropped; when every connection is an authenticated request under way, the newcomer is
  closed.
- **keep-alive**: uvicorn closes a connection idle ``KEEP_ALIVE_S`` after its last response.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("sbxkit.mcp")

HEAD_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 256
MAX_HEAD_BYTES = 16 * 1024
"""h11's bound on a request head (its default): a longer one is refused (400)."""
HEAD_END = b"\r\n\r\n"
LISTEN_QUEUE = 4096
"""The kernel's queue of connections not yet accepted (capped by net.core.somaxconn): a
burst waits there, holding none of the server's descriptors."""


def connection_limit(open_files_limit: int, most: int = MAX_CONNECTIONS) -> int:
    """How many connections to serve at once: ``most``, but at most a quarter of the
    process's file-descriptor limit. Connections never hold more than half of it
    (``accept_backlog``); the rest is for Docker, the supervisor and the sandboxes."""
    return max(8, min(most, open_files_limit // 4))


def accept_backlog(limit: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one turn."""
    return max(8, limit // 2)


class ConnectionGuard:
    """The connections of one server: those still waiting for their request head, oldest
    first, and those past it."""

    def __init__(
        self,
        limit: int,
        head_timeout: float = HEAD_TIMEOUT_S,
        warn: Callable[[Callable[[], str]], None] | None = None,
    ) -> None:
        self.limit = limit
        self.head_timeout = head_timeout
        self.warn = warn or (lambda message: logger.warning("%s", message()))
        self.waiting: dict[GuardedConnection, None] = {}
        self.past_head: set[GuardedConnection] = set()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.past_head)

    def admit(self, connection: GuardedConnection) -> bool:
        if len(self) >= self.limit:
            if not self.waiting:
                self.warn(
                    lambda: (
                        f"refused a connection from {connection.peer}: all {self.limit} "
                        "connections are requests under way"
                    )
                )
                return False
            oldest = next(iter(self.waiting))
            self.warn(
                lambda: (
                    f"dropped a connection from {oldest.peer} that had sent no complete "
                    f"request: the limit of {self.limit} connections was reached"
                )
            )
            oldest.drop()
        self.waiting[connection] = None
        return True

    def head_arrived(self, connection: GuardedConnection) -> None:
        if connection in self.waiting:
            del self.waiting[connection]
            self.past_head.add(connection)

    def forget(self, connection: GuardedConnection) -> None:
        self.waiting.pop(connection, None)
        self.past_head.discard(connection)

    def protocol(self) -> type[asyncio.Protocol]:
        """A uvicorn ``http`` protocol class whose connections this guard admits."""
        guard = self

        class Guarded(GuardedConnection):
            def __init__(self, **kwargs: Any) -> None:
                super().__init__(guard, H11Protocol(**kwargs))

        return Guarded


class GuardedConnection(asyncio.Protocol):
    """One connection: uvicorn's h11 protocol, with the guard's deadline in front of it."""

    def __init__(self, guard: ConnectionGuard, inner: H11Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.peer = "an unknown peer"
        self.admitted = False
        self.head_seen = False
        self.tail = b""
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"{peer[0]}:{peer[1]}"
        if not self.guard.admit(self):
            transport.abort()
            return
        self.admitted = True
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(self.guard.head_timeout, self._too_slow)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.head_seen:
            seen = self.tail + data
            if HEAD_END in seen:
                self.head_seen = True
                self._cancel_deadline()
                self.guard.head_arrived(self)
            else:
                self.tail = seen[-(len(HEAD_END) - 1) :]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        self.inner.eof_received()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.guard.forget(self)
        if self.admitted:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def drop(self) -> None:
        """Close at once (no request is under way: nothing to finish)."""
        self._cancel_deadline()
        self.guard.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def _too_slow(self) -> None:
        self.deadline = None
        if not self.head_seen:
            self.guard.warn(
                lambda: (
                    f"dropped a connection from {self.peer}: no complete request head "
                    f"within {self.guard.head_timeout:g} s"
                )
            )
            self.drop()

    def _cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
