"""A scripted Unix-socket server for the engine client's unit tests: no daemon, any answer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
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


async def answer_heads(
    stream: trio.SocketStream, answer: Callable[[bytes], Awaitable[bytes]]
) -> None:
    """Read each request head on the connection in turn (these clients send no bodies) and send
    what ``answer`` makes of it, until the client goes away."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        await stream.send_all(await answer(head))


def response(status: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """``HTTP/1.1 STATUS`` with ``headers``, a Content-Length and ``body``."""
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
