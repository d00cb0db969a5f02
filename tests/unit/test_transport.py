"""Protocol conformance of sbxkit's HTTP/1.1 layer against scripted trio Unix-socket servers.

No daemon here: each test's server speaks exactly the bytes the test needs (a reply split or
coalesced a particular way, garbage, a close mid-body), which the real daemon cannot be made to
do. What the daemon really does is covered by tests/engine/.
"""

from __future__ import annotations

import random
import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import sbxkit.engine.transport as transport_module
from sbxkit.engine.transport import HijackedStream, Transport, api_path, error_for, join_query
from sbxkit.errors import (
    Conflict,
    EngineConnectionError,
    EngineError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    NotFound,
    SbxError,
)
from tests.unit.unix_server import Handler, unix_server


class Server:
    """A scripted Unix-socket server; ``handler`` runs once per accepted connection."""

    def __init__(self, path: str, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []  # every request head read by read_head()

    async def read_head(self, stream: trio.SocketStream) -> bytes | None:
        """Read one request head (our client sends no bodies in these tests); None at EOF."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return None
            data += chunk
        head = data.split(b"\r\n\r\n", 1)[0]
        self.requests.append(head)
        return head


@asynccontextmanager
async def serving(tmp_path: Path, handler: Handler) -> AsyncIterator[Server]:
    """Serve ``handler`` on a fresh socket in ``tmp_path`` for the duration of the block."""
    server = Server(str(tmp_path / "engine.sock"), handler)

    async def counted(stream: trio.SocketStream) -> None:
        server.connections += 1
        await handler(stream)

    async with unix_server(server.path, counted):
        yield server


@asynccontextmanager
async def client_of(server: Server) -> AsyncIterator[Transport]:
    """A transport to the scripted server, closed however the block ends."""
    transport = Transport(server.path)
    try:
        yield transport
    finally:
        await transport.aclose()


def reply(status: int, body: bytes = b"", reason: str = "X", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
    )


def keep_alive(*responses: bytes) -> Callable[[Server], Handler]:
    """A handler answering each request on a connection with the next canned response."""

    def make(server_box: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            index = 0
            while await server_box.read_head(stream) is not None:
                await stream.send_all(responses[min(index, len(responses) - 1)])
                index += 1

        return handler

    return make


@asynccontextmanager
async def serving_with(tmp_path: Path, make: Callable[[Server], Handler]) -> AsyncIterator[Server]:
    """Like ``serving`` for handlers that need the Server (to read request heads)."""
    box: list[Server] = []

    async def handler(stream: trio.SocketStream) -> None:
        await make(box[0])(stream)

    async with serving(tmp_path, handler) as server:
        box.append(server)
        yield server


async def once(server: Server, stream: trio.SocketStream, data: bytes) -> None:
    """Read one request, answer ``data``, then keep the connection open until the peer leaves."""
    await server.read_head(stream)
    await stream.send_all(data)
    while await stream.receive_some(65536):
        pass


def scripted(data: bytes) -> Callable[[Server], Handler]:
    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await once(server, stream, data)

        return handler

    return make


# -- pure helpers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "kind", "message"),
    [
        (404, b'{"message":"No such image: x:y"}', NotFound, "No such image: x:y"),
        (409, b'{"message":"removal in progress"}', Conflict, "removal in progress"),
        (500, b'{"message":"boom"}', EngineError, "boom"),
        (400, b'{"message":"  padded  "}', EngineError, "padded"),
        (404, b"page not found\n", NotFound, "page not found"),
        (502, b"<html>bad \xff gateway</html>", EngineError, "<html>bad \ufffd gateway</html>"),
        (503, b"", EngineError, "HTTP 503"),
        (500, b'{"other":"field"}', EngineError, "HTTP 500"),
        (500, b'{"message":""}', EngineError, "HTTP 500"),
        (500, b"[1, 2]", EngineError, "[1, 2]"),
    ],
)
def test_error_for(status: int, body: bytes, kind: type[EngineError], message: str) -> None:
    error = error_for("DELETE", "/v1.41/containers/abc", status, body)
    assert type(error) is kind
    assert error.method == "DELETE"
    assert error.path == "/v1.41/containers/abc"
    assert error.status == status
    assert error.message == message
    assert str(error) == f"DELETE /v1.41/containers/abc -> {status}: {message}"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ([], "/p"),
        ([("", "dropped")], "/p"),
        ([("name", "sbxkit-abc")], "/p?name=sbxkit-abc"),
        ([("force", "true"), ("v", "true")], "/p?force=true&v=true"),
        ([("a", "x y&z=1/é")], "/p?a=x+y%26z%3D1%2F%C3%A9"),
        (
            [("filters", '{"label":["sbxkit.lease=1"]}')],
            "/p?filters=%7B%22label%22%3A%5B%22sbxkit.lease%3D1%22%5D%7D",
        ),
        ([("k", "")], "/p?k="),
    ],
)
def test_join_query(params: list[tuple[str, str]], expected: str) -> None:
    assert join_query("/p", params) == expected


# -- short calls --------------------------------------------------------------------------------


async def test_request_sends_and_decodes(tmp_path: Path) -> None:
    body = b'{"Id":"abc"}'
    canned = reply(201, body, "Created", "Content-Type: application/json\r\nX-Mixed-Case: Yes\r\n")
    async with (
        serving_with(tmp_path, keep_alive(canned)) as server,
        client_of(server) as transport,
    ):
        response = await transport.request(
            "POST",
            "/v1.41/containers/create?name=n",
            body=b'{"Image":"x"}',
            headers=[("Content-Type", "application/json")],
            timeout=5,
        )
    assert response.status == 201
    assert response.body == body
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-mixed-case"] == "Yes"
    head = server.requests[0].lower()
    assert head.startswith(b"post /v1.41/containers/create?name=n http/1.1\r\n")
    assert b"\r\nhost: docker" in head
    assert b"\r\ncontent-length: 13" in head
    assert b"\r\ncontent-type: application/json" in head


async def test_request_error_status_raises_mapped_error(tmp_path: Path) -> None:
    canned = reply(404, b'{"message":"No such container: c1"}', "Not Found")
    async with (
        serving_with(tmp_path, keep_alive(canned)) as server,
        client_of(server) as transport,
    ):
        with pytest.raises(NotFound) as caught:
            await transport.request("GET", "/v1.41/containers/c1/json", timeout=5)
        # The error reply was read completely, so its connection went back to the pool.
        with pytest.raises(NotFound):
            await transport.request("GET", "/v1.41/containers/c1/json", timeout=5)
    assert caught.value.message == "No such container: c1"
    assert caught.value.path == "/v1.41/containers/c1/json"
    assert server.connections == 1


async def test_keep_alive_connections_are_pooled(tmp_path: Path) -> None:
    async with (
        serving_with(tmp_path, keep_alive(reply(200, b"OK"))) as server,
        client_of(server) as transport,
    ):
        for _ in range(5):
            assert (await transport.request("GET", "/_ping", timeout=5)).body == b"OK"
    assert server.connections == 1
    assert len(server.requests) == 5


async def test_connection_close_reply_is_not_pooled(tmp_path: Path) -> None:
    canned = reply(200, b"OK", extra="Connection: close\r\n")
    async with (
        serving_with(tmp_path, keep_alive(canned)) as server,
        client_of(server) as transport,
    ):
        for _ in range(3):
            assert (await transport.request("GET", "/_ping", timeout=5)).body == b"OK"
    assert server.connections == 3


async def test_cancelled_call_does_not_return_its_connection(tmp_path: Path) -> None:
    """urllib3's clean_exit: a call cancelled mid-body leaves an unusable connection behind;
    reusing it would hand the rest of the old body to the next call."""
    release = trio.Event()

    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            if server.connections == 1:
                await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
                await release.wait()
                await stream.send_all(b"-rest")
            else:
                await stream.send_all(reply(200, b"second"))
            while await server.read_head(stream) is not None:
                await stream.send_all(reply(200, b"again"))

        return handler

    async with serving_with(tmp_path, make) as server, client_of(server) as transport:
        with trio.move_on_after(0.2) as scope:
            await transport.request("GET", "/slow", timeout=5)
        assert scope.cancelled_caught
        release.set()
        response = await transport.request("GET", "/next", timeout=5)
    assert response.body == b"second"
    assert server.connections == 2


async def test_idle_connection_closed_by_server_is_not_reused(tmp_path: Path) -> None:
    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(reply(200, f"conn {server.connections}".encode()))
            # then close while the client holds the connection idle in its pool

        return handler

    async with serving_with(tmp_path, make) as server, client_of(server) as transport:
        assert (await transport.request("GET", "/a", timeout=5)).body == b"conn 1"
        await trio.sleep(0.05)  # let the close arrive
        assert (await transport.request("GET", "/b", timeout=5)).body == b"conn 2"
    assert server.connections == 2


GARBAGE = [
    pytest.param(b"garbage\r\n\r\n", id="not-http"),
    pytest.param(b"\x00\x01\x02\x03\r\n\r\n", id="binary"),
    pytest.param(b"HTTP/1.1 abc OK\r\n\r\n", id="bad-status"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", id="bad-length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", id="bad-header"),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", id="bad-chunk-size"
    ),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", id="two-lengths"
    ),
    pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000, id="endless-head"),
    pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n", id="informational"),
]


@pytest.mark.parametrize("data", GARBAGE)
async def test_garbage_reply_is_protocol_error(tmp_path: Path, data: bytes) -> None:
    async with serving_with(tmp_path, scripted(data)) as server, client_of(server) as transport:
        with pytest.raises(EngineProtocolError):
            await transport.request("GET", "/v1.41/version", timeout=5)


async def read_whole_stream(transport: Transport, target: str) -> bytes:
    stream = await transport.open_stream("POST", target, timeout=5)
    try:
        return await stream.read_all()
    finally:
        await stream.aclose()


@pytest.mark.parametrize("data", GARBAGE)
async def test_garbage_reply_on_stream_and_hijack(tmp_path: Path, data: bytes) -> None:
    async with serving_with(tmp_path, scripted(data)) as server:
        transport = Transport(server.path)
        with pytest.raises(EngineProtocolError):
            await read_whole_stream(transport, "/wait")
        with pytest.raises(EngineProtocolError):
            await transport.hijack("POST", "/attach", timeout=5)


async def test_random_replies_never_leak_foreign_exceptions(tmp_path: Path) -> None:
    """h11's fuzz invariant, one layer up: whatever bytes come back, a call returns a Response
    or raises an SbxError — never an h11, trio or OS exception."""
    rng = random.Random(20240611)
    valid = reply(200, b'{"ApiVersion":"1.41"}', "OK", "Content-Type: application/json\r\n")
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    cases: list[bytes] = []
    for _ in range(150):
        base = bytearray(rng.choice([valid, chunked]))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            pos = rng.randrange(len(base))
            if op == 0:
                base[pos] = rng.randrange(256)
            elif op == 1:
                base.insert(pos, rng.choice(b"\r\n :0123456789\x00\xff"))
            else:
                del base[pos]
        cases.append(bytes(base[: rng.randint(0, len(base))]))
    cases += [rng.randbytes(rng.randint(0, 300)) for _ in range(50)]

    pending: list[bytes] = []

    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(pending.pop())
            # close: a truncated reply must fail on EOF, not hang

        return handler

    outcomes: dict[str, int] = {}
    async with serving_with(tmp_path, make) as server:
        for data in cases:
            pending.append(data)
            transport = Transport(server.path)
            try:
                await transport.request("GET", "/v1.41/version", timeout=5)
                name = "ok"
            except EngineTimeout as exc:  # pragma: no cover - a hang is a failure
                raise AssertionError(f"hung on {data!r}") from exc
            except SbxError as exc:
                name = type(exc).__name__
            finally:
                await transport.aclose()
            outcomes[name] = outcomes.get(name, 0) + 1
    assert sum(outcomes.values()) == len(cases)
    assert outcomes.get("EngineProtocolError", 0) > 0


EOF_BUG = (
    "sbxkit bug: h11 reports EOF before/inside a response as RemoteProtocolError, which "
    "mapped_errors turns into EngineProtocolError; errors.py says a connection that broke "
    "mid-call is EngineConnectionError (Transport._read_head's ConnectionClosed branch is "
    "unreachable)"
)


async def test_close_before_reply_is_connection_error(tmp_path: Path) -> None:
    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)

        return handler

    async with serving_with(tmp_path, make) as server, client_of(server) as transport:
        with pytest.raises(SbxError) as caught:
            await transport.request("GET", "/v1.41/info", timeout=5)
    assert isinstance(caught.value, EngineConnectionError), repr(caught.value)
    assert caught.value.method == "GET"
    assert caught.value.path == "/v1.41/info"


@pytest.mark.parametrize(
    "partial",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part", id="length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\nonly-part", id="chunked"
        ),
    ],
)
async def test_close_mid_body_is_connection_error(tmp_path: Path, partial: bytes) -> None:
    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(partial)  # then close: the daemon went away mid-reply

        return handler

    async with serving_with(tmp_path, make) as server, client_of(server) as transport:
        with pytest.raises(SbxError) as caught:
            await transport.request("GET", "/v1.41/info", timeout=5)
    assert isinstance(caught.value, EngineConnectionError), repr(caught.value)
    assert caught.value.path == "/v1.41/info"


async def test_reset_mid_body_is_connection_error(tmp_path: Path) -> None:
    """A reset (the peer closes with our request still unread) breaks the call: ECONNRESET."""

    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await stream.receive_some(10)  # leave most of the request unread
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
            await trio.sleep(0.05)
            stream.socket.close()  # unread data in our receive queue: the peer sees a reset

        return handler

    async with serving_with(tmp_path, make) as server, client_of(server) as transport:
        with pytest.raises(EngineConnectionError) as caught:
            await transport.request("GET", "/v1.41/info", timeout=5)
    assert (caught.value.method, caught.value.path) == ("GET", "/v1.41/info")
    assert "reset" in caught.value.reason.lower()


async def test_body_over_cap_is_protocol_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_module, "MAX_SHORT_BODY", 16)
    exact = reply(200, b"x" * 16)
    over = reply(200, b"x" * 17)
    async with (
        serving_with(tmp_path, keep_alive(exact, over)) as server,
        client_of(server) as transport,
    ):
        assert (await transport.request("GET", "/a", timeout=5)).body == b"x" * 16
        with pytest.raises(EngineProtocolError, match="body over 16 bytes"):
            await transport.request("GET", "/b", timeout=5)


async def test_chunked_body_over_cap_is_protocol_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport_module, "MAX_SHORT_BODY", 16)

    # An endless chunked body: the cap, not the end of the body, must stop the read.
    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                await stream.send_all(b"8\r\nxxxxxxxx\r\n")
                await trio.sleep(0.001)

        return handler

    async with serving_with(tmp_path, make) as server, client_of(server) as transport:
        with pytest.raises(EngineProtocolError, match="body over 16 bytes"):
            await transport.request("GET", "/events", timeout=5)


async def test_missing_socket_is_engine_unavailable(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.sock")
    transport = Transport(path)
    with pytest.raises(EngineUnavailable) as caught:
        await transport.request("GET", "/_ping", timeout=5)
    assert caught.value.socket_path == path
    with pytest.raises(EngineUnavailable):
        await transport.open_stream("GET", "/events", timeout=5)
    with pytest.raises(EngineUnavailable):
        await transport.hijack("POST", "/attach", timeout=5)


async def test_dead_socket_and_plain_file_are_engine_unavailable(tmp_path: Path) -> None:
    dead = tmp_path / "dead.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(dead))
    sock.close()  # the file stays, nobody listens
    plain = tmp_path / "plain"
    plain.write_text("not a socket")
    for path in (dead, plain):
        with pytest.raises(EngineUnavailable) as caught:
            await Transport(str(path)).request("GET", "/_ping", timeout=5)
        assert caught.value.socket_path == str(path)


async def test_stalled_server_raises_engine_timeout(tmp_path: Path) -> None:
    async def handler(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with serving(tmp_path, handler) as server, client_of(server) as transport:
        t0 = trio.current_time()
        with pytest.raises(EngineTimeout) as caught:
            await transport.request("GET", "/v1.41/info", timeout=0.3)
        assert 0.25 < trio.current_time() - t0 < 2
        with pytest.raises(EngineTimeout):
            await transport.open_stream("POST", "/v1.41/wait", timeout=0.1)
        with pytest.raises(EngineTimeout):
            await transport.hijack("POST", "/v1.41/attach", timeout=0.1)
    assert (caught.value.method, caught.value.path, caught.value.seconds) == (
        "GET",
        "/v1.41/info",
        0.3,
    )


# -- long calls ---------------------------------------------------------------------------------


async def test_open_stream_returns_at_the_head(tmp_path: Path) -> None:
    """A wait or events call hands over the status as soon as the head arrives, long before
    the body (which, for wait, comes when the container exits)."""
    send_body = trio.Event()

    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            await send_body.wait()
            await stream.send_all(b"10\r\n" + b'{"StatusCode":7}' + b"\r\n0\r\n\r\n")
            while await stream.receive_some(100):
                pass

        return handler

    async with serving_with(tmp_path, make) as server:
        transport = Transport(server.path)
        with trio.fail_after(5):
            stream = await transport.open_stream("POST", "/v1.41/containers/c/wait", timeout=5)
        try:
            assert stream.status == 200
            assert stream.headers["content-type"] == "application/json"
            assert not send_body.is_set()
            send_body.set()
            with trio.fail_after(5):
                assert msgspec.json.decode(await stream.read_all()) == {"StatusCode": 7}
                assert await stream.receive_some() == b""
        finally:
            await stream.aclose()
    assert server.connections == 1


async def test_open_stream_error_status_raises_with_message(tmp_path: Path) -> None:
    canned = reply(404, b'{"message":"No such container: c"}', "Not Found")
    async with serving_with(tmp_path, scripted(canned)) as server:
        with pytest.raises(NotFound) as caught:
            await Transport(server.path).open_stream("POST", "/v1.41/containers/c/wait", timeout=5)
    assert caught.value.message == "No such container: c"
    assert caught.value.method == "POST"


# -- hijack -------------------------------------------------------------------------------------

UPGRADE_HEAD = (
    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)


async def test_hijack_replays_bytes_that_came_with_the_101(tmp_path: Path) -> None:
    first = b"\x01\x00\x00\x00\x00\x00\x00\x06hello\n"
    later = b"\x02\x00\x00\x00\x00\x00\x00\x04err\n"
    received_by_server: list[bytes] = []
    server_saw_eof = trio.Event()
    send_later = trio.Event()

    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(UPGRADE_HEAD + first)  # one write, one packet
            while chunk := await stream.receive_some(100):
                received_by_server.append(chunk)
            server_saw_eof.set()  # the client's half-close; our send side is still open
            await send_later.wait()
            await stream.send_all(later)

        return handler

    async with serving_with(tmp_path, make) as server:
        transport = Transport(server.path)
        with trio.fail_after(5):
            hijacked = await transport.hijack(
                "POST", "/v1.41/containers/c/attach?stream=1", timeout=5
            )
            try:
                assert await hijacked.receive_some() == first
                await hijacked.send_all(b"stdin bytes")
                await hijacked.send_eof()
                await server_saw_eof.wait()
                send_later.set()
                assert await hijacked.receive_some() == later
                assert await hijacked.receive_some() == b""
            finally:
                await hijacked.aclose()
    assert b"".join(received_by_server) == b"stdin bytes"
    head = server.requests[0].lower()
    assert b"\r\nconnection: upgrade" in head
    assert b"\r\nupgrade: tcp" in head


async def test_hijack_replay_honours_max_bytes(tmp_path: Path) -> None:
    trailing = bytes(range(40))
    async with serving_with(tmp_path, scripted(UPGRADE_HEAD + trailing)) as server:
        transport = Transport(server.path)
        hijacked = await transport.hijack("POST", "/attach", timeout=5)
        try:
            with trio.fail_after(5):
                assert await hijacked.receive_some(16) == trailing[:16]
                assert await hijacked.receive_some(16) == trailing[16:32]
                assert await hijacked.receive_some(16) == trailing[32:]
        finally:
            await hijacked.aclose()


async def test_hijack_without_trailing_bytes_reads_the_socket(tmp_path: Path) -> None:
    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(UPGRADE_HEAD)
            await trio.sleep(0.05)
            await stream.send_all(b"after")

        return handler

    async with serving_with(tmp_path, make) as server:
        hijacked = await Transport(server.path).hijack("POST", "/attach", timeout=5)
        try:
            with trio.fail_after(5):
                assert await hijacked.receive_some() == b"after"
                assert await hijacked.receive_some() == b""
        finally:
            await hijacked.aclose()


@pytest.mark.parametrize(("status", "kind"), [(500, EngineError), (404, NotFound), (409, Conflict)])
async def test_hijack_error_status_raises_with_message(
    tmp_path: Path, status: int, kind: type[EngineError]
) -> None:
    canned = reply(status, b'{"message":"container c is not running"}', "Err")
    async with serving_with(tmp_path, scripted(canned)) as server:
        with pytest.raises(kind) as caught:
            await Transport(server.path).hijack("POST", "/v1.41/containers/c/attach", timeout=5)
    assert type(caught.value) is kind
    assert caught.value.status == status
    assert caught.value.message == "container c is not running"
    assert caught.value.path == "/v1.41/containers/c/attach"


async def test_hijack_refused_upgrade_is_protocol_error(tmp_path: Path) -> None:
    async with serving_with(tmp_path, scripted(reply(200, b"{}", "OK"))) as server:
        with pytest.raises(EngineProtocolError, match="expected 101"):
            await Transport(server.path).hijack("POST", "/attach", timeout=5)


async def flood(hijacked: HijackedStream) -> None:
    """Write until the broken peer makes a send fail (the first ones may still be buffered)."""
    for _ in range(1000):
        await hijacked.send_all(b"x" * 65536)
        await trio.lowlevel.checkpoint()


async def test_hijack_send_after_peer_reset_is_connection_error(tmp_path: Path) -> None:
    """A broken raw stream surfaces as EngineConnectionError, not as an OS error."""

    def make(server: Server) -> Handler:
        async def handler(stream: trio.SocketStream) -> None:
            await server.read_head(stream)
            await stream.send_all(UPGRADE_HEAD)
            await stream.receive_some(1)  # leave the rest of the client's bytes unread
            stream.socket.close()

        return handler

    async with serving_with(tmp_path, make) as server:
        hijacked = await Transport(server.path).hijack("POST", "/attach", timeout=5)
        try:
            with trio.fail_after(5):
                with pytest.raises(EngineConnectionError):
                    await flood(hijacked)
        finally:
            await hijacked.aclose()


@pytest.mark.parametrize(
    ("param", "expected"),
    [
        ("abc123", "/containers/abc123/json"),
        ("sbxkit-test/busybox:latest", "/containers/sbxkit-test%2Fbusybox%3Alatest/json"),
        ("../../images/x", "/containers/..%2F..%2Fimages%2Fx/json"),
        ("a?b#c d", "/containers/a%3Fb%23c%20d/json"),
    ],
)
def test_api_path_quotes_every_path_parameter_whole(param: str, expected: str) -> None:
    assert api_path("/containers/{}/json", param) == expected


@given(st.text(min_size=1, max_size=40))
def test_no_parameter_changes_which_endpoint_is_called(param: str) -> None:
    path = api_path("/containers/{}/json", param, query=[("x", "1")])
    route, _, query = path.partition("?")
    segments = route.split("/")
    assert segments[:2] == ["", "containers"]
    assert segments[3:] == ["json"]
    assert urllib.parse.unquote(segments[2]) == param
    assert query == "x=1"


def test_api_path_needs_one_parameter_per_placeholder() -> None:
    with pytest.raises(ValueError, match="takes 1 parameters, got 0"):
        api_path("/containers/{}/json")
