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
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11
import trio

from sbxkit._model.network_allow import AllowEntry, entry_text, matching_entry
from sbxkit._model.network_audit import Decision, Kind
from sbxkit._model.network_inject import InjectTerms
from sbxkit._model.network_names import Destination, IPAddress, destination_text
from sbxkit._model.network_terms import CallbackTerms, is_callback_destination
from sbxkit.network.addresses import address_problem
from sbxkit.network.broker import Broker, inject_headers
from sbxkit.network.relay import (
    CONNECT_TIMEOUT_S,
    HELLO_TIMEOUT_S,
    MAX_HEAD_BYTES,
    tunnel_opened,
)
from sbxkit.network.relay import Denied as _Denied
from sbxkit.network.relay import dial as _dial
from sbxkit.network.relay import framing_reason as _framing
from sbxkit.network.relay import read_head as _head
from sbxkit.network.relay import refusal_response as _refusal_response
from sbxkit.network.relay import relay_one as _relay
from sbxkit.network.relay import splice as _splice
from sbxkit.network.request import (
    ProxyRequest,
    Refusal,
    decide_request,
    forward_headers,
)

__all__ = [
    "ProxyContext",
    "Resolver",
    "forward_connection",
    "proxy_connection",
    "serve_listener",
    "system_resolver",
]

RESOLVE_TIMEOUT_S = 10.0
HTTPS_PORT = 443
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
    broker: Broker | None = None
    """The sandbox's inject rules and CA (broker.py), when it has rules."""
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
        injected: str | None = None,
    ) -> None:
        """The decision of a connection that went through, once it ended."""
        self.decide(
            destination,
            kind,
            verdict="allowed",
            rule=rule,
            injected=injected,
            address=str(address),
            bytes_up=counts[0],
            bytes_down=counts[1],
            reason=None if within else "the connection's byte limit ended it",
        )


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


async def _connect(
    ctx: ProxyContext,
    stream: trio.SocketStream,
    destination: Destination,
    rule: str,
    addresses: list[IPAddress],
    pending: bytes,
) -> None:
    async with tunnel_opened(stream, destination, addresses, pending) as (upstream, address, hello):
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
    inject: InjectTerms | None = None,
) -> None:
    if inject is not None and destination.port == HTTPS_PORT:
        # A payload must not make the proxy send the secret in clear to the port a rule's
        # host serves TLS on (where anyone on the path could read it).
        raise _Denied(
            403,
            f"plain HTTP to port {HTTPS_PORT} of {destination.host}, which has an inject rule: "
            "use https://",
            destination,
        )
    try:
        upstream, address = await _dial(addresses, destination.port)
    except OSError as exc:
        raise _Denied(502, str(exc), destination) from None
    counts = [0, 0]
    headers = forward_headers(request.headers)
    if inject is not None:
        headers = inject_headers(headers, inject)
    async with upstream:
        within = await _relay(
            ctx.max_connection_bytes,
            stream,
            conn,
            request,
            target,
            headers,
            upstream,
            counts,
            destination,
        )
    label = None if inject is None else inject.label
    ctx.allowed(destination_text(destination), kind, address, counts, within, rule, label)


class _Prefixed(trio.abc.Stream):
    """``stream`` with ``first`` (bytes already read from it: the ClientHello) received first."""

    def __init__(self, stream: trio.SocketStream, first: bytes) -> None:
        self.stream = stream
        self.first = first

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.first:
            data, self.first = self.first, b""
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _tls_reason(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__ or exc
    return str(cause) or type(cause).__name__


async def _intercept(
    ctx: ProxyContext,
    broker: Broker,
    inject: InjectTerms,
    stream: trio.SocketStream,
    destination: Destination,
    rule: str,
    addresses: list[IPAddress],
    pending: bytes,
) -> None:
    """A CONNECT to a rule's host: the payload's TLS ends here (a leaf from the sandbox's CA),
    the upstream's is this process's own, verified; the one request goes across with the
    rule's header set (the payload's own of that name dropped), then the response."""
    async with tunnel_opened(stream, destination, addresses, pending) as (tcp, address, hello):
        inside = trio.SSLStream(
            _Prefixed(stream, hello),
            broker.server_context(destination.host),
            server_side=True,
            https_compatible=True,
        )
        try:
            with trio.fail_after(HELLO_TIMEOUT_S):
                await inside.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            raise _Denied(
                0, f"the payload's TLS with the broker failed: {_tls_reason(exc)}", destination
            ) from None
        upstream = trio.SSLStream(
            tcp,
            broker.client_context(inject),
            server_hostname=destination.host,
            https_compatible=True,
        )
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                await upstream.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError) as exc:
            reason = f"the upstream's TLS was refused: {_tls_reason(exc)}"
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await inside.send_all(_refusal_response(502, reason))
                await inside.aclose()
            raise _Denied(0, reason, destination) from None
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        problem: str | None
        try:
            request, framing = await _head(inside, conn)
            problem = None if framing is None else _framing(framing)
        except _Denied as denied:
            request, problem = None, denied.reason
        if request is not None and problem is None:
            problem = _origin_problem(request, destination)
        if problem is not None or request is None:
            reason = problem or "no request"
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await inside.send_all(_refusal_response(400, reason))
            raise _Denied(0, reason, destination)
        counts = [0, 0]
        headers = inject_headers(forward_headers(request.headers), inject)
        within = await _relay(
            ctx.max_connection_bytes,
            inside,
            conn,
            request,
            request.target,
            headers,
            upstream,
            counts,
            destination,
        )
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await inside.aclose()
    ctx.allowed(
        destination_text(destination), "connect", address, counts, within, rule, inject.label
    )


def _origin_problem(request: h11.Request, destination: Destination) -> str | None:
    """Inside a broker's TLS the request must be origin-form and its ``Host`` the CONNECT
    host: the rule's secret goes to that one service, never to another a shared front (a CDN)
    would route to by ``Host``."""
    if not request.target.startswith(b"/"):
        return "inside the broker's TLS a request must be origin-form (/path)"
    hosts = [value for name, value in request.headers if name == b"host"]
    allowed = {destination.host, destination_text(destination)}
    if destination.is_ip and ":" in destination.host:
        allowed = {f"[{destination.host}]", destination_text(destination)}
    if len(hosts) != 1 or hosts[0].decode("ascii", "replace").lower() not in allowed:
        return f"the Host header must be the CONNECT host {destination_text(destination)}"
    return None


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
            broker = ctx.broker
            inject = None if broker is None else broker.rule_for(destination.host)
            if decided.kind == "connect":
                pending = bytes(conn.trailing_data[0])
                if broker is not None and inject is not None:
                    await _intercept(
                        ctx, broker, inject, stream, destination, rule, addresses, pending
                    )
                else:
                    await _connect(ctx, stream, destination, rule, addresses, pending)
            else:
                await _http(
                    ctx,
                    stream,
                    conn,
                    request,
                    decided.target,
                    destination,
                    rule,
                    addresses,
                    inject=inject,
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
