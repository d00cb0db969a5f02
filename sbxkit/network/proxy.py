"""The allow-list proxy and the callback forwarder: what serves a governed sandbox's listeners.

The I/O shell around the pure decisions (request.py, allow.py, addresses.py, clienthello.py).
For each connection the sandbox opens to its ``127.0.0.1:3128``:

1. read the request head (h11, bounded in size and time), refuse an ambiguous framing (both
   ``Content-Length`` and ``Transfer-Encoding``, a repeated or listed length, a coding other
   than chunked, a folded line: RFC 9112 §6.3) and decide what it asks for;
2. match the *name* against the allow-list — no match, no lookup: a refused name is never
   resolved, so it cannot carry data out through DNS;
3. resolve the name here (the sandbox has no resolver that reaches anything), refuse the
   results in the refused ranges unless the entry is that literal address, and connect to a
   checked address itself (pinned: nothing is resolved twice);
4. CONNECT: answer 200, read the TLS ClientHello, require its SNI to be the CONNECT host, then
   splice; plain HTTP: forward exactly one request (origin-form, ``Connection: close``), then
   the response;
5. bound the sandbox's connections at once and each connection's bytes; record one decision.

The callback forwarder splices each connection to the operator's endpoint without judging it
(the endpoint is the operator's own choice, reached from the host). A proxy request for the
callback — ``$SBXKIT_ENDPOINT``'s host, ``localhost`` or ``127.0.0.1`` at its port, what the
forwarder answers when dialled directly — goes the same way: a client that ignores
``NO_PROXY`` (busybox wget) reaches the endpoint, and nothing else, through the proxy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import h11
import trio

from sbxkit._model.network_allow import AllowEntry, entry_text, matching_entry
from sbxkit._model.network_audit import Decision, Kind
from sbxkit._model.network_names import Destination, IPAddress, destination_text
from sbxkit._model.network_terms import CallbackTerms, is_callback_destination
from sbxkit.network.addresses import address_problem
from sbxkit.network.clienthello import Hello, HelloProblem, read_client_hello
from sbxkit.network.request import (
    ProxyRequest,
    Refusal,
    decide_request,
    forward_headers,
    framing_problem,
)

__all__ = [
    "ProxyContext",
    "Resolver",
    "forward_connection",
    "proxy_connection",
    "serve_listener",
    "splice",
    "system_resolver",
]

HEAD_TIMEOUT_S = 10.0
HELLO_TIMEOUT_S = 10.0
RESOLVE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 64 * 1024
CHUNK = 64 * 1024
ACCEPT_BACKOFF_S = 0.1

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]
"""``(name, port) -> addresses``: the system's resolver, or a test's table."""


async def system_resolver(name: str, port: int) -> list[IPAddress]:
    """The host's resolver (``getaddrinfo``), addresses in its order, each once."""
    infos = await trio.socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in found:
            found.append(address)
    return found


@dataclass(eq=False)
class ProxyContext:
    """One sandbox's proxy: its rules, its bounds, where its decisions go."""

    lease: str
    entries: tuple[AllowEntry, ...]
    record: Callable[[Decision], None]
    max_connections: int
    max_connection_bytes: int
    resolver: Resolver = system_resolver
    clock: Callable[[], float] = time.time
    callback: CallbackTerms | None = None
    """The callback a proxy request may name (``is_callback_destination``)."""
    active: int = 0

    def decide(self, destination: str, kind: Kind, **fields: object) -> Decision:
        decision = Decision(
            time=self.clock(),
            sandbox=self.lease,
            destination=destination,
            kind=kind,
            **fields,  # type: ignore[arg-type]
        )
        self.record(decision)
        return decision

    def allowed(
        self,
        destination: str,
        kind: Kind,
        address: IPAddress,
        counts: list[int],
        within: bool,
        rule: str | None = None,
    ) -> None:
        """The decision of a connection that went through, once it ended."""
        self.decide(
            destination,
            kind,
            verdict="allowed",
            rule=rule,
            address=str(address),
            bytes_up=counts[0],
            bytes_down=counts[1],
            reason=None if within else "the connection's byte limit ended it",
        )


_PHRASES = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}


def _refusal_response(status: int, reason: str) -> bytes:
    body = f"sbxkit: {reason}\n".encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
        "X-Sbxkit-Denied: 1\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Denied(Exception):
    def __init__(self, status: int, reason: str, destination: Destination | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.destination = destination


async def _head(stream: trio.SocketStream, conn: h11.Connection) -> tuple[h11.Request, str | None]:
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
                reason = f"malformed request: {exc}" if problem is None else _framing(problem)
                raise _Denied(400, reason) from None
            if isinstance(event, h11.Request):
                return event, framing_problem(bytes(received))
            if event is h11.NEED_DATA:
                data = await stream.receive_some(CHUNK)
                conn.receive_data(data)
                received += data
                if not data:
                    raise _Denied(400, "the connection closed before a request")
                continue
            raise _Denied(400, f"unexpected {type(event).__name__}")
    raise _Denied(400, f"no request head within {HEAD_TIMEOUT_S:g} s")


def _framing(problem: str) -> str:
    return f"ambiguous message framing, refused (RFC 9112 section 6.3): {problem}"


async def _addresses(
    ctx: ProxyContext, entry: AllowEntry, destination: Destination
) -> list[IPAddress]:
    if destination.is_ip:
        return [ipaddress.ip_address(destination.host)]  # the entry is that literal address
    try:
        with trio.fail_after(RESOLVE_TIMEOUT_S):
            found = await ctx.resolver(destination.host, destination.port)
    except (OSError, trio.TooSlowError) as exc:
        raise _Denied(502, f"cannot resolve {destination.host}: {exc}", destination) from None
    usable = [address for address in found if address_problem(address) is None]
    if not usable:
        problems = [address_problem(address) for address in found]
        why = problems[0] if problems else "no address"
        raise _Denied(
            403,
            f"{destination.host} resolved to a refused address ({why}); only an entry that is "
            "the literal address reaches it",
            destination,
        )
    return usable


async def _dial(addresses: Sequence[IPAddress], port: int) -> tuple[trio.SocketStream, IPAddress]:
    last: Exception | None = None
    for address in addresses:
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                return await trio.open_tcp_stream(str(address), port), address
        except (OSError, trio.TooSlowError) as exc:
            last = exc
    raise OSError(f"cannot connect: {last}")


async def _splice(
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


splice = _splice
"""Both ways, bounded (inbound ports splice with it too)."""


async def _hello(stream: trio.SocketStream, start: bytes) -> tuple[bytes, str | None]:
    buffer = start
    with trio.move_on_after(HELLO_TIMEOUT_S):
        while True:
            outcome = read_client_hello(buffer)
            if isinstance(outcome, Hello):
                return buffer, outcome.sni
            if isinstance(outcome, HelloProblem):
                raise _Denied(0, outcome.reason)
            data = await stream.receive_some(CHUNK)
            if not data:
                raise _Denied(0, "the tunnel closed before a TLS ClientHello")
            buffer += data
    raise _Denied(0, f"no TLS ClientHello within {HELLO_TIMEOUT_S:g} s")


async def _connect(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    destination: Destination,
    rule: str,
    addresses: list[IPAddress],
    pending: bytes,
) -> None:
    try:
        upstream, address = await _dial(addresses, destination.port)
    except OSError as exc:
        raise _Denied(502, str(exc), destination) from None
    async with upstream:
        await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            hello, sni = await _hello(stream, pending)
        except _Denied as denied:
            raise _Denied(0, denied.reason, destination) from None
        wanted = None if destination.is_ip else destination.host
        if sni != wanted and not (destination.is_ip and sni is None):
            raise _Denied(
                0,
                f"the TLS server name {sni!r} is not the CONNECT host {destination.host!r}",
                destination,
            )
        counts = [len(hello), 0]
        if counts[0] > ctx.max_connection_bytes:
            raise _Denied(0, "the connection's byte limit", destination)
        await upstream.send_all(hello)
        within = await _splice(stream, upstream, ctx.max_connection_bytes, counts)
    ctx.allowed(destination_text(destination), "connect", address, counts, within, rule)


async def _http(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    conn: h11.Connection,
    request: h11.Request,
    target: bytes,
    destination: Destination,
    rule: str | None,
    addresses: list[IPAddress],
    kind: Kind = "http",
) -> None:
    try:
        upstream, address = await _dial(addresses, destination.port)
    except OSError as exc:
        raise _Denied(502, str(exc), destination) from None
    counts = [0, 0]
    within = True
    async with upstream:
        client = h11.Connection(h11.CLIENT)
        head = h11.Request(
            method=request.method, target=target, headers=forward_headers(request.headers)
        )
        data = client.send(head)
        counts[0] += len(data)
        await upstream.send_all(data)
        while True:
            if conn.client_is_waiting_for_100_continue:
                await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            event = conn.next_event()
            if event is h11.NEED_DATA:
                chunk = await stream.receive_some(CHUNK)
                conn.receive_data(chunk)
                if not chunk:
                    raise _Denied(0, "the request ended early", destination)
                continue
            if isinstance(event, h11.Data):
                out = client.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                out = client.send(h11.EndOfMessage())
            else:
                raise _Denied(0, f"unexpected {type(event).__name__}", destination)
            counts[0] += len(out or b"")
            if counts[0] > ctx.max_connection_bytes:
                within = False
                break
            await upstream.send_all(out or b"")
            if isinstance(event, h11.EndOfMessage):
                break
        while within and (reply := await upstream.receive_some(CHUNK)):
            counts[1] += len(reply)
            if counts[0] + counts[1] > ctx.max_connection_bytes:
                within = False
                break
            await stream.send_all(reply)
    ctx.allowed(destination_text(destination), kind, address, counts, within, rule)


async def _callback(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    conn: h11.Connection,
    request: h11.Request,
    decided: ProxyRequest,
    callback: CallbackTerms,
) -> None:
    """A proxy request for the callback, served as its forwarder serves a direct connection:
    the endpoint reached from the host, the bytes unjudged — plain HTTP as the one request
    (origin-form, as the client sends it directly), CONNECT spliced after ``200`` so TLS and
    the endpoint's client certificate stay end to end."""
    target = Destination(callback.host, callback.port, callback.is_ip)
    try:
        addresses = await _callback_addresses(callback.host, callback.port)
    except (OSError, trio.TooSlowError) as exc:
        raise _Denied(502, f"cannot reach the callback: {exc}", target) from None
    if decided.kind == "http":
        await _http(ctx, stream, conn, request, decided.target, target, None, addresses, "callback")
        return
    try:
        upstream, address = await _dial(addresses, callback.port)
    except OSError as exc:
        raise _Denied(502, str(exc), target) from None
    pending = bytes(conn.trailing_data[0])
    counts = [len(pending), 0]
    async with upstream:
        await stream.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        within = counts[0] <= ctx.max_connection_bytes
        if within:
            await upstream.send_all(pending)
            within = await _splice(stream, upstream, ctx.max_connection_bytes, counts)
    ctx.allowed(destination_text(target), "callback", address, counts, within)


async def proxy_connection(ctx: ProxyContext, stream: trio.SocketStream) -> None:
    """Serve one connection to the allow-list proxy; every outcome is one decision."""
    async with stream:
        if ctx.active >= ctx.max_connections:
            reason = f"the sandbox holds {ctx.max_connections} connections already"
            ctx.decide("?", "request", verdict="denied", reason=reason)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(_refusal_response(503, reason))
            return
        ctx.active += 1
        destination: Destination | None = None
        kind: Kind = "request"
        try:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
            request, framing = await _head(stream, conn)
            decided = decide_request(request.method, request.target, request.headers)
            if isinstance(decided, Refusal):
                raise _Denied(decided.status, decided.reason, decided.destination)
            destination, kind = decided.destination, decided.kind
            if framing is not None:  # never forwarded: an upstream could read two requests
                raise _Denied(400, _framing(framing), destination)
            if ctx.callback is not None and is_callback_destination(ctx.callback, destination):
                kind = "callback"
                await _callback(ctx, stream, conn, request, decided, ctx.callback)
                return
            entry = matching_entry(ctx.entries, destination)
            if entry is None:
                raise _Denied(403, "not on the allow-list", destination)
            addresses = await _addresses(ctx, entry, destination)
            rule = entry_text(entry)
            if decided.kind == "connect":
                pending = bytes(conn.trailing_data[0])
                await _connect(ctx, stream, destination, rule, addresses, pending)
            else:
                await _http(
                    ctx, stream, conn, request, decided.target, destination, rule, addresses
                )
        except _Denied as denied:
            named = denied.destination or destination
            where = destination_text(named) if named is not None else "?"
            ctx.decide(where, kind, verdict="denied", reason=denied.reason)
            if denied.status:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(_refusal_response(denied.status, denied.reason))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError):
            pass  # the sandbox or the upstream went away mid-connection
        finally:
            ctx.active -= 1


async def forward_connection(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    host: str,
    port: int,
    kind: Kind = "callback",
    rule: str | None = None,
) -> None:
    """Splice one connection to the callback endpoint, or to the host's service a loopback
    allow entry names (``kind`` ``connect``, ``rule`` the entry): resolved and reached from
    the host."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    async with stream:
        if ctx.active >= ctx.max_connections:
            ctx.decide(where, kind, verdict="denied", reason="too many connections")
            return
        ctx.active += 1
        try:
            await _forward(ctx, stream, host, port, where, kind, rule)
        finally:
            ctx.active -= 1


async def _forward(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    host: str,
    port: int,
    where: str,
    kind: Kind,
    rule: str | None,
) -> None:
    try:
        upstream, address = await _dial(await _callback_addresses(host, port), port)
    except (OSError, trio.TooSlowError) as exc:
        ctx.decide(where, kind, verdict="denied", reason=f"cannot reach it: {exc}")
        return
    counts = [0, 0]
    async with upstream:
        within = await _splice(stream, upstream, ctx.max_connection_bytes, counts)
    ctx.allowed(where, kind, address, counts, within, rule)


async def _callback_addresses(host: str, port: int) -> list[IPAddress]:
    """The endpoint's addresses as the host reaches it (an address as given, a name by the
    host's resolver: the endpoint is the operator's, so no range is refused)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        with trio.fail_after(RESOLVE_TIMEOUT_S):
            return await system_resolver(host, port)


Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def serve_listener(sock: socket.socket, handler: Handler, errors: list[str]) -> None:
    """Accept on ``sock`` (closed when this returns) and serve each connection in its own
    task; a connection's failure is noted in ``errors``, never raised into the owner."""

    async def guarded(stream: trio.SocketStream) -> None:
        try:
            await handler(stream)
        except Exception as exc:  # one connection must never take the listener down
            errors.append(repr(exc))

    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    async with listener, trio.open_nursery() as nursery:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: wait, then accept again
                errors.append(repr(exc))
                await trio.sleep(ACCEPT_BACKOFF_S)
                continue
            nursery.start_soon(guarded, stream)
