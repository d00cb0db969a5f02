"""``sbxkit mcp``'s two transports: stdio on trio, streamable HTTP on loopback (asyncio).

**stdio** (what MCP clients launch): the SDK's ``stdio_server`` on trio, reading and writing
private duplicates of fd 0 and fd 1 through trio (``StdinLines``, ``StdoutWriter``). The
SDK's own streams block worker threads in ``readline`` and ``write``, which no cancellation
can interrupt (SIGTERM with the client still attached would hang), and a write to a client
that died raises out of its writer task and ends the server mid-cleanup; here a dead client's
pipe only drops what is left to say. While serving, fd 0 is ``/dev/null`` and fd 1 is stderr,
so nothing but the server writes on the wire. The client closing stdin (or dying) ends the
server: every sandbox is removed, then it exits 0. SIGINT/SIGTERM do the same, then exit
128 + the signal.

**HTTP**: the SDK's streamable HTTP app served by uvicorn, bound to a loopback address only
(``sbxkit._grammar.mcp_options.parse_http_address``) with the SDK's DNS-rebinding checks on, behind
the gate (``sbxkit.mcp.gate``: a bearer token on every request, identity from it and from the
session the server issued) and the connection guard (``sbxkit.mcp.connections``: a deadline for
request heads, a connection limit that drops silent connections first). Request bodies may be as
large as ``max_file_bytes`` needs (``sbxkit._grammar.mcp_options.request_body_limit``). uvicorn is
asyncio-only, so the hub runs in a portal's trio thread (``sbxkit.mcp.server.PortalCalls``). A
session the client ends (``DELETE``) has its sandboxes removed at once; sessions and sandboxes left
idle end after ``mcp.idle_timeout``; stopping the server removes everything.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
from typing import cast

import anyio
import trio
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from sbxkit._grammar.common import cancel_on_signals
from sbxkit._grammar.mcp_options import request_body_limit
from sbxkit.errors import SpecError
from sbxkit.mcp.connections import (
    KEEP_ALIVE_S,
    LISTEN_QUEUE,
    MAX_HEAD_BYTES,
    ConnectionGuard,
    accept_backlog,
    connection_limit,
)
from sbxkit.mcp.gate import Gate, RateLimitedLog
from sbxkit.mcp.hub import Caller, Hub
from sbxkit.mcp.policy import McpPolicy
from sbxkit.mcp.server import PortalCalls, TrioCalls, build_server
from sbxkit.mcp.token_files import remove_token_file, write_generated_token
from sbxkit.mcp.tokens import Credentials

MAX_LINE_BYTES = 64 * 1024 * 1024
"""A JSON-RPC message longer than this is not one: the connection ends instead of buffering
without bound."""
READ_CHUNK = 64 * 1024
GRACEFUL_SHUTDOWN_S = 5
"""How long uvicorn waits for open HTTP streams before cancelling them (their sandboxes are
removed either way)."""


def claim_fd(fd: int, replacement: int) -> trio.lowlevel.FdStream:
    """A trio stream on a private duplicate of ``fd``; ``fd`` itself now points at
    ``replacement`` (``/dev/null`` for stdin, stderr for stdout)."""
    wire = os.dup(fd)
    os.dup2(replacement, fd)
    return trio.lowlevel.FdStream(wire)


class StdinLines:
    """The lines of the wire's stdin, read through trio (cancellable). Iterated by the SDK's
    ``stdio_server`` as its stdin."""

    def __init__(self) -> None:
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            self._stream = claim_fd(0, null)
        finally:
            os.close(null)
        self._buffer = bytearray()
        self._eof = False

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line.decode("utf-8", "replace")
            if self._eof:
                if self._buffer:
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    return line.decode("utf-8", "replace")
                await self._stream.aclose()
                raise StopAsyncIteration
            if len(self._buffer) > MAX_LINE_BYTES:
                print(
                    f"sbxkit mcp: a message over {MAX_LINE_BYTES} bytes; closing the connection",
                    file=sys.stderr,
                )
                self._buffer.clear()
                self._eof = True
                continue
            chunk = await self._stream.receive_some(READ_CHUNK)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True


class StdoutWriter:
    """The wire's stdout, written through trio; once the client is gone (EPIPE), what is
    left to write is dropped instead of raised. Written by the SDK's ``stdio_server``."""

    def __init__(self) -> None:
        self._stream = claim_fd(1, 2)
        self.broken = False

    async def write(self, text: str) -> None:
        if self.broken:
            return
        try:
            await self._stream.send_all(text.encode("utf-8"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.broken = True

    async def flush(self) -> None:
        return None


def serve_stdio(policy: McpPolicy, socket_path: str | None) -> int:
    """Serve one client over stdin/stdout until it leaves or a signal arrives."""
    return trio.run(_serve_stdio, policy, socket_path)


async def _serve_stdio(policy: McpPolicy, socket_path: str | None) -> int:
    hub = Hub(policy, socket_path=socket_path)
    server = build_server(policy, hub, TrioCalls())

    async def serve() -> int:
        stdin = cast("anyio.AsyncFile[str]", StdinLines())
        stdout = cast("anyio.AsyncFile[str]", StdoutWriter())
        async with stdio_server(stdin, stdout) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        return 0

    # SIGINT/SIGTERM cancel the server; its lifespan removes every sandbox (shielded) before
    # Interrupted leaves, and the CLI exits 128 + the signal.
    return await cancel_on_signals(serve)


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_QUEUE)
    except OSError as exc:
        sock.close()
        raise SpecError("--http", f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def rebinding_checks(host: str, port: int) -> TransportSecuritySettings:
    """Only requests addressed to this loopback server (Host) and, from a browser, pages of
    loopback origins are served: a web page cannot drive it through DNS rebinding."""
    shown = f"[{host}]" if ":" in host else host
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{shown}:{port}", f"localhost:{port}"],
        allowed_origins=[f"http://{shown}:{port}", f"http://localhost:{port}"],
    )


def serve_http(
    policy: McpPolicy,
    host: str,
    port: int,
    socket_path: str | None,
    credentials: Credentials | None = None,
) -> int:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp`` until SIGINT/SIGTERM, to clients
    with a bearer token: ``credentials`` (the operator's ``--token-file``), or one generated
    here and written to a file only this account can read (its path is printed; the token
    never is)."""
    sock = listening_socket(host, port)
    port = sock.getsockname()[1]
    token_path = None
    try:
        if credentials is None:
            token_path, credentials = write_generated_token(host, port)
        return _serve_http(policy, sock, host, port, socket_path, credentials, token_path)
    finally:
        sock.close()
        if token_path is not None:
            remove_token_file(token_path)


def _serve_http(
    policy: McpPolicy,
    sock: socket.socket,
    host: str,
    port: int,
    socket_path: str | None,
    credentials: Credentials,
    token_path: str | None,
) -> int:
    import uvicorn

    hub = Hub(policy, socket_path=socket_path)
    calls = PortalCalls()
    server = build_server(policy, hub, calls)
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        host=host,
        transport_security=rebinding_checks(host, port),
        session_idle_timeout=policy.options.idle_timeout,
        max_request_body_size=request_body_limit(policy.file_bytes),
    )
    log = RateLimitedLog()

    async def close_client(caller: Caller) -> None:
        await calls.call(hub.close_client, caller)

    gate = Gate(app, credentials, close_client, log)
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    guard = ConnectionGuard(
        connection_limit(open_files if open_files != resource.RLIM_INFINITY else 1 << 20),
        warn=log.warning,
    )
    shown = f"[{host}]" if ":" in host else host
    if token_path is not None:
        print(
            f"sbxkit mcp: bearer token in {token_path} (readable by this account only; "
            "removed when the server stops)",
            file=sys.stderr,
        )
    else:
        names = ", ".join(credentials.names)
        print(f"sbxkit mcp: clients: {names} (--token-file)", file=sys.stderr)
    print(f"sbxkit mcp: serving http://{shown}:{port}/mcp", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        gate,
        http=guard.protocol(),
        lifespan="on",
        # uvicorn warns of every malformed request, before any token is checked: a stream of
        # them from anyone would flood stderr. The gate's and the guard's own refusals are
        # logged, rate-limited.
        log_level="error",
        ws="none",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        # A backstop only: the guard keeps connections under its own limit, dropping silent
        # ones first, where uvicorn would answer every newcomer 503. uvicorn counts a dropped
        # connection until the loop's next turn, so its limit sits past the guard's by two
        # accept batches: it never refuses a request the guard admitted.
        limit_concurrency=guard.limit + 2 * accept_backlog(guard.limit) + 1,
        # asyncio accepts up to a backlog of connections before any of them runs, and a
        # dropped one lets go of its descriptor only on the next turn of the loop: at most
        # limit + 2 * backlog descriptors, half the file limit, even under a flood.
        backlog=accept_backlog(guard.limit),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            # asyncio listened with the accept batch as backlog; the kernel's queue may be
            # longer, so that a burst of connections waits there (using no descriptor of
            # ours) instead of being refused.
            for listening in sockets or []:
                listening.listen(LISTEN_QUEUE)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().shutdown(sockets)
            finally:
                # uvicorn re-raises a stopping signal once it has shut down: the token goes
                # with the server, before that.
                if token_path is not None:
                    remove_token_file(token_path)

    Server(config).run(sockets=[sock])
    return 0
