"""The proxy's stream work, shared by its tunnels, its plain requests and the broker's
terminated TLS (proxy.py): a request head read and judged for framing, an upstream dialled at
checked addresses, a TLS ClientHello read, bytes spliced under a bound, one request relayed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import h11
import trio

from sbxkit._model.network_names import Destination, IPAddress
from sbxkit.network.clienthello import Hello, HelloProblem, read_client_hello
from sbxkit.network.request import framing_problem

__all__ = [
    "CHUNK",
    "CONNECT_TIMEOUT_S",
    "HEAD_TIMEOUT_S",
    "HELLO_TIMEOUT_S",
    "MAX_HEAD_BYTES",
    "Denied",
    "dial",
    "framing_reason",
    "read_head",
    "read_hello",
    "refusal_response",
    "relay_one",
    "splice",
    "tunnel_opened",
]

HEAD_TIMEOUT_S = 10.0
HELLO_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 64 * 1024
CHUNK = 64 * 1024


_PHRASES = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}


def refusal_response(status: int, reason: str) -> bytes:
    body = f"sbxkit: {reason}\n".encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
        "X-Sbxkit-Denied: 1\r\n\r\n"
    )
    return head.encode("ascii") + body


class Denied(Exception):
    def __init__(self, status: int, reason: str, destination: Destination | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.destination = destination


async def read_head(
    stream: trio.abc.Stream, conn: h11.Connection
) -> tuple[h11.Request, str | None]:
    """The request head parsed by h11, and what is wrong with its framing, judged on the bytes
    as they came (``framing_problem``: h11's normalised headers hide a fold or a repeated
    length)."""
    received = bytearray()  # bounded: h11 refuses a head over MAX_HEAD_BYTES
    with trio.move_on_after(HEAD_TIMEOUT_S):
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                problem = framing_problem(bytes(received))
                reason = f"malformed request: {exc}" if problem is None else framing_reason(problem)
                raise Denied(400, reason) from None
            if isinstance(event, h11.Request):
                return event, framing_problem(bytes(received))
            if event is h11.NEED_DATA:
                data = bytes(await stream.receive_some(CHUNK))
                conn.receive_data(data)
                received += data
                if not data:
                    raise Denied(400, "the connection closed before a request")
                continue
            raise Denied(400, f"unexpected {type(event).__name__}")
    raise Denied(400, f"no request head within {HEAD_TIMEOUT_S:g} s")


def framing_reason(problem: str) -> str:
    return f"ambiguous message framing, refused (RFC 9112 section 6.3): {problem}"


async def dial(addresses: Sequence[IPAddress], port: int) -> tuple[trio.SocketStream, IPAddress]:
    last: Exception | None = None
    for address in addresses:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                return await trio.open_tcp_stream(str(address), port), address
        except (OSError, trio.TooSlowError) as exc:
            last = exc
    raise OSError(f"cannot connect: {last}")


async def splice(
    left: trio.SocketStream, right: trio.SocketStream, limit: int, already: list[int]
) -> bool:
    """Copy both ways until both ends closed; False when ``limit`` bytes were exceeded.
    ``already`` is ``[up, down]`` counted so far, updated in place."""
    exceeded = False

    async def pump(source: trio.SocketStream, sink: trio.SocketStream, index: int) -> None:
        nonlocal exceeded
        try:
            while data := await source.receive_some(CHUNK):
                already[index] += len(data)
                if already[0] + already[1] > limit:
                    exceeded = True
                    nursery.cancel_scope.cancel()
                    return
                await sink.send_all(data)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await sink.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, left, right, 0)
        nursery.start_soon(pump, right, left, 1)
    return not exceeded


async def read_hello(stream: trio.SocketStream, start: bytes) -> tuple[bytes, str | None]:
    buffer = start
    with trio.move_on_after(HELLO_TIMEOUT_S):
        while True:
            outcome = read_client_hello(buffer)
            if isinstance(outcome, Hello):
                return buffer, outcome.sni
            if isinstance(outcome, HelloProblem):
                raise Denied(0, outcome.reason)
            data = await stream.receive_some(CHUNK)
            if not data:
                raise Denied(0, "the tunnel closed before a TLS ClientHello")
            buffer += data
    raise Denied(0, f"no TLS ClientHello within {HELLO_TIMEOUT_S:g} s")


async def relay_one(
    limit: int,
    stream: trio.abc.Stream,
    conn: h11.Connection,
    request: h11.Request,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    upstream: trio.abc.Stream,
    counts: list[int],
    destination: Destination,
) -> bool:
    """Forward the one request ``conn`` read (with ``headers``) and its body upstream, then
    the response back until the upstream closes; False when the byte bound ended it."""
    client = h11.Connection(h11.CLIENT)
    data = client.send(h11.Request(method=request.method, target=target, headers=headers))
    counts[0] += len(data)
    await upstream.send_all(data)
    while True:
        if conn.client_is_waiting_for_100_continue:
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        event = conn.next_event()
        if event is h11.NEED_DATA:
            chunk = bytes(await stream.receive_some(CHUNK))
            conn.receive_data(chunk)
            if not chunk:
                raise Denied(0, "the request ended early", destination)
            continue
        if isinstance(event, h11.Data):
            out = client.send(h11.Data(data=event.data))
        elif isinstance(event, h11.EndOfMessage):
            out = client.send(h11.EndOfMessage())
        else:
            raise Denied(0, f"unexpected {type(event).__name__}", destination)
        counts[0] += len(out or b"")
        if counts[0] > limit:
            return False
        await upstream.send_all(out or b"")
        if isinstance(event, h11.EndOfMessage):
            break
    while reply := await upstream.receive_some(CHUNK):
        counts[1] += len(reply)
        if counts[0] + counts[1] > limit:
            return False
        await stream.send_all(reply)
    return True


@contextlib.asynccontextmanager
async def tunnel_opened(
    stream: trio.SocketStream,
    destination: Destination,
    addresses: Sequence[IPAddress],
    pending: bytes,
) -> AsyncIterator[tuple[trio.SocketStream, IPAddress, bytes]]:
    """A CONNECT's first steps, for a plain tunnel and the broker alike: the upstream dialled
    (502 when it cannot be), the payload told the tunnel is up, its ClientHello read and its
    server name checked against the CONNECT host. Yields the upstream (closed after the
    block), the address it reached and the hello's bytes, which nobody has forwarded yet."""
    try:
        upstream, address = await dial(addresses, destination.port)
    except OSError as exc:
        raise Denied(502, str(exc), destination) from None
    async with upstream:
        await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            hello, sni = await read_hello(stream, pending)
        except Denied as denied:
            raise Denied(0, denied.reason, destination) from None
        wanted = None if destination.is_ip else destination.host
        if sni != wanted and not (destination.is_ip and sni is None):
            raise Denied(
                0,
                f"the TLS server name {sni!r} is not the CONNECT host {destination.host!r}",
                destination,
            )
        yield upstream, address, hello
