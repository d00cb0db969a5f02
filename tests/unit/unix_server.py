"""A scripted Unix-socket server for the engine client's unit tests: no daemon, any answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

Handler = Callable[[trio.SocketStream], Awaitable[None]]


@asynccontextmanager
async def unix_server(path: str, handler: Handler) -> AsyncIterator[None]:
    """Serve ``handler``, once per accepted connection, on a socket bound at ``path`` for the
    block. A client that goes away is normal for these scripts: its stream just closes."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(16)

    async def one(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:

        async def accept_loop() -> None:
            while True:
                nursery.start_soon(one, await listener.accept())

        nursery.start_soon(accept_loop)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()
