"""HTTP/1.1 to the Docker daemon over its Unix socket, with h11 as the state machine.

Three shapes of call, each on the right kind of connection:

- ``request``: a short call whose whole response body is read. Keep-alive connections for these
  are pooled; a connection goes back to the pool only after a clean exit (both sides idle, no
  error, no cancellation — urllib3's ``clean_exit`` discipline), and a pooled connection the
  daemon has closed meanwhile is detected before reuse, never retried blindly.
- ``open_stream``: a long call (wait, events) on a dedicated connection; the caller gets the
  status and headers as soon as the daemon sends them, then reads the body at its own pace.
- ``hijack``: attach/exec with ``Connection: Upgrade`` + ``Upgrade: tcp``. After ``101`` the
  bytes h11 already read past the response (``trailing_data``) are replayed before the raw
  socket (httpcore's upgrade stream does the same). ``send_eof`` half-closes the socket, which is
  how stdin EOF reaches the container.

Every call runs under a deadline. trio, OS and h11 exceptions never escape: they are mapped to
``sbxkit.errors``.
"""

from __future__ import annotations

import errno
import functools
import re
import select
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from urllib.parse import quote, urlencode

import h11
import msgspec
import trio

from sbxkit.engine import answers
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

READ_CHUNK = 64 * 1024
# A short call's body is small JSON; a daemon answering with more is broken or hostile.
MAX_SHORT_BODY = 32 * 1024 * 1024
Headers = Sequence[tuple[str, str]]


PERMISSION_HINT = (
    ": this user may not open the daemon's socket; join its group (`sudo usermod -aG docker "
    "$USER`, then log in again), or name a rootless daemon (DOCKER_HOST=unix://...)"
)
"""What a user outside the docker group is told, instead of a bare "Permission denied"."""


class Response(msgspec.Struct, frozen=True):
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _refuse_redirect(method: str, target: str, status: int, headers: dict[str, str]) -> None:
    """A redirect is never followed, nor taken for success (the daemon answers one for a path
    its router cleans, e.g. ``//`` in an image name: it would name another resource)."""
    if status in REDIRECTS:
        location = headers.get("location", "")
        raise EngineProtocolError(
            f"{method} {target}: the daemon redirected ({status}) to {location!r}; "
            "sbxkit does not follow redirects"
        )


def error_for(method: str, path: str, status: int, body: bytes) -> EngineError:
    """Map an error status and the daemon's JSON message to the precise EngineError subclass."""
    cause: object = None
    try:
        reply = msgspec.json.decode(body, type=dict[str, object])
        message, cause = reply.get("message", ""), reply.get("cause")
    except msgspec.DecodeError:
        message = body.decode("utf-8", "replace")
    text = str(message).strip() or f"HTTP {status}"
    hint = PODMAN_HINTS.get(str(cause))
    if hint is not None:
        text = f"{text} ({hint})"
    # Podman answers 500 where Docker says 404 or 409; its ``cause`` says which it means.
    podman = PODMAN_CAUSES.get(str(cause))
    if podman is not None:
        return podman(method, path, status, text)
    return status_error(method, path, status, text)


def status_error(method: str, path: str, status: int, message: str) -> EngineError:
    """The precise EngineError for an error status and the daemon's message (one relayed by
    the supervisor, say: ``Launched``)."""
    return _STATUS_ERRORS.get(status, EngineError)(method, path, status, message)


_STATUS_ERRORS: dict[int, type[EngineError]] = {404: NotFound, 409: Conflict}


PODMAN_CAUSES: dict[str, type[EngineError]] = {
    "no such container": NotFound,  # e.g. an inspect racing a removal
    "container state improper": Conflict,  # e.g. a kill of a stopped container ("not running")
}
"""Podman's ``cause`` for replies Docker gives a precise status."""

PODMAN_HINTS: dict[str, str] = {
    "could not find enough available IDs": (
        "Podman's --userns=auto, a workspace's root on rootful Podman, takes each container's "
        "65536 ids from the `containers` user's range in /etc/subuid and /etc/subgid: it is "
        "missing or in use by other containers (scripts/podman-up provisions one)"
    ),
}
"""What to do about a Podman ``cause`` whose message does not say it."""


_END = h11.EndOfMessage()  # immutable: one for every request
_TARGET = re.compile(rb"[!-~]+")
"""A request target h11 would accept: visible ASCII, no space or control byte."""


@functools.lru_cache(maxsize=32)
def _checked_headers(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """``Host`` and ``headers`` as h11 validates them (it raises ``LocalProtocolError`` on a
    bad name or value), once per distinct set: a call's fixed headers are a handful of
    constants (``Content-Type``, ``Upgrade``)."""
    probe = h11.Request(method="GET", target="/", headers=[("Host", "docker"), *headers])
    return tuple(probe.headers.raw_items())


class _Connection:
    """One socket plus its h11 state machine."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)
        self.eof = False

    def looks_closed(self) -> bool:
        """An idle keep-alive socket that is readable was closed (or spoke out of turn)."""
        poller = select.poll()  # not select(): it refuses descriptors from 1024 on
        try:
            poller.register(self.stream.socket.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except OSError:
            return True

    async def send(self, *events: h11.Event) -> None:
        data = b"".join(self.h11.send(event) or b"" for event in events)
        await self.stream.send_all(data)

    async def next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                if self.eof:  # the daemon hung up mid-response: a lost connection, not garbage
                    raise trio.BrokenResourceError("the daemon closed the connection") from exc
                raise
            if isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("the daemon closed the connection")
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self.stream.receive_some(READ_CHUNK)
            self.eof = not data
            self.h11.receive_data(data)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class StreamResponse:
    """A response whose body is read incrementally from a dedicated connection."""

    def __init__(
        self,
        transport: Transport,
        conn: _Connection,
        method: str,
        path: str,
        status: int,
        headers: dict[str, str],
    ) -> None:
        self._transport = transport
        self._conn = conn
        self._method = method
        self._path = path
        self.status = status
        self.headers = headers
        self._done = False

    async def receive_some(self) -> bytes:
        """The next piece of the body; ``b""`` at its end."""
        if self._done:
            return b""
        with mapped_errors(self._method, self._path):
            event = await self._conn.next_event()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            self._done = True
            return b""
        raise EngineProtocolError(f"{self._method} {self._path}: unexpected {event!r} in body")

    async def read_all(self, limit: int = MAX_SHORT_BODY) -> bytes:
        parts: list[bytes] = []
        size = 0
        while chunk := await self.receive_some():
            size += len(chunk)
            if size > limit:
                raise EngineProtocolError(f"{self._method} {self._path}: body over {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        await self._conn.aclose()


class HijackedStream:
    """The raw bidirectional stream after ``101 UPGRADED``; replays h11's trailing data first."""

    def __init__(self, conn: _Connection, initial: bytes, method: str, path: str) -> None:
        self._stream = conn.stream
        self._pending = initial
        self._method = method
        self._path = path

    async def receive_some(self, max_bytes: int = READ_CHUNK) -> bytes:
        """Up to ``max_bytes`` of the daemon's output; ``b""`` at EOF."""
        if self._pending:
            data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
            return data
        try:
            return bytes(await self._stream.receive_some(max_bytes))
        except (trio.BrokenResourceError, OSError) as exc:
            raise EngineConnectionError(
                self._method, self._path, str(exc) or type(exc).__name__
            ) from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise EngineConnectionError(
                self._method, self._path, str(exc) or type(exc).__name__
            ) from exc

    async def send_eof(self) -> None:
        """Half-close: the daemon sees stdin EOF, the read side stays open for output."""
        try:
            await self._stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise EngineConnectionError(
                self._method, self._path, str(exc) or type(exc).__name__
            ) from exc

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)


class Transport:
    """HTTP/1.1 client for one daemon socket."""

    def __init__(self, socket_path: str, *, max_idle: int = 16) -> None:
        self.socket_path = socket_path
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
        self._closed = False

    # -- plumbing ---------------------------------------------------------------------------

    @asynccontextmanager
    async def _deadline(self, method: str, path: str, seconds: float) -> AsyncIterator[None]:
        try:
            with trio.fail_after(seconds):
                yield
        except trio.TooSlowError:
            raise EngineTimeout(method, path, seconds) from None

    async def _connect(self) -> _Connection:
        try:
            stream = await trio.open_unix_socket(self.socket_path)
        except OSError as exc:
            answers.forget(self.socket_path)  # the next engine asks the daemon again
            reason = exc.strerror or str(exc)
            if exc.errno in (errno.EACCES, errno.EPERM):
                reason += PERMISSION_HINT
            raise EngineUnavailable(self.socket_path, reason) from exc
        return _Connection(stream)

    async def _checkout(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.h11.our_state is h11.IDLE and not conn.looks_closed():
                return conn
            await conn.aclose()
        return await self._connect()

    async def _checkin(self, conn: _Connection) -> None:
        reusable = (
            not self._closed
            and conn.h11.our_state is h11.DONE
            and conn.h11.their_state is h11.DONE
            and len(self._idle) < self._max_idle
        )
        if reusable:
            conn.h11.start_next_cycle()
            self._idle.append(conn)
        else:
            await conn.aclose()

    @staticmethod
    def _request_events(
        method: str, target: str, body: bytes | None, headers: Headers
    ) -> list[h11.Event]:
        # The fixed headers were validated by h11 once (``_checked_headers``). ``_parsed``
        # skips h11's own checks, so the target (which carries names a caller typed) is
        # checked here; the method is one of this module's constants, the length ours.
        raw_target = target.encode("ascii")
        if not _TARGET.fullmatch(raw_target):
            raise h11.LocalProtocolError(f"illegal request target {target!r}")
        length = str(len(body)).encode() if body is not None else b"0"
        request = h11.Request(
            method=method.encode("ascii"),
            target=raw_target,
            headers=[*_checked_headers(tuple(headers)), (b"Content-Length", length)],
            _parsed=True,
        )
        if body:
            return [request, h11.Data(data=body), _END]
        return [request, _END]

    async def _read_head(self, conn: _Connection) -> h11.Response | h11.InformationalResponse:
        event = await conn.next_event()
        if isinstance(event, h11.Response | h11.InformationalResponse):
            return event
        raise EngineProtocolError(f"expected a response head, got {event!r}")

    @staticmethod
    def _headers(event: h11.Response | h11.InformationalResponse) -> dict[str, str]:
        # ``raw_items`` is a list; iterating ``event.headers`` goes item by item through its
        # Sequence methods.
        return {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers.raw_items()
        }

    # -- the three call shapes -----------------------------------------------------------------

    async def request(
        self,
        method: str,
        target: str,
        *,
        body: bytes | None = None,
        headers: Headers = (),
        timeout: float,
    ) -> Response:
        """A short call on a pooled connection; raises the mapped error for status >= 400."""
        # ``_deadline``'s bound and ``mapped_errors``, with no generator-based context manager
        # around them: every daemon call of a lease comes through here.
        with trio.CancelScope(deadline=trio.current_time() + timeout) as bound:
            conn = await self._checkout()
            clean_exit = False
            try:
                try:  # ``mapped_errors``, inline
                    await conn.send(*self._request_events(method, target, body, headers))
                    head = await self._read_head(conn)
                    if not isinstance(head, h11.Response):
                        raise EngineProtocolError(
                            f"{method} {target}: unexpected {head.status_code}"
                        )
                    parts: list[bytes] = []
                    size = 0
                    while True:
                        event = await conn.next_event()
                        if isinstance(event, h11.EndOfMessage):
                            break
                        if not isinstance(event, h11.Data):
                            raise EngineProtocolError(f"{method} {target}: unexpected {event!r}")
                        size += len(event.data)
                        if size > MAX_SHORT_BODY:
                            raise EngineProtocolError(
                                f"{method} {target}: body over {MAX_SHORT_BODY} bytes"
                            )
                        parts.append(bytes(event.data))
                except TRANSPORT_FAILURES as exc:
                    raise mapped_error(exc, method, target) from exc
                clean_exit = True
            finally:
                if clean_exit:
                    await self._checkin(conn)
                else:
                    await conn.aclose()
        if bound.cancelled_caught:
            raise EngineTimeout(method, target, timeout)
        response = Response(head.status_code, self._headers(head), b"".join(parts))
        if response.status >= 400:
            raise error_for(method, target, response.status, response.body)
        _refuse_redirect(method, target, response.status, response.headers)
        return response

    async def open_stream(self, method: str, target: str, *, timeout: float) -> StreamResponse:
        """A long call on its own connection (wait, events: no body, no extra headers); returns
        once the response head has arrived.

        ``timeout`` bounds only the wait for the head. Error statuses are read and raised here.
        """
        conn = await self._connect()
        try:
            async with self._deadline(method, target, timeout):
                with mapped_errors(method, target):
                    await conn.send(*self._request_events(method, target, None, ()))
                    head = await self._read_head(conn)
            if not isinstance(head, h11.Response):
                raise EngineProtocolError(f"{method} {target}: unexpected {head.status_code}")
            stream = StreamResponse(
                self, conn, method, target, head.status_code, self._headers(head)
            )
            if head.status_code >= 400:
                async with self._deadline(method, target, timeout):
                    error_body = await stream.read_all(64 * 1024)
                raise error_for(method, target, head.status_code, error_body)
            _refuse_redirect(method, target, head.status_code, self._headers(head))
        except BaseException:
            await conn.aclose()
            raise
        return stream

    async def hijack(
        self, method: str, target: str, *, json_body: bytes | None = None, timeout: float
    ) -> HijackedStream:
        """Upgrade a call to a raw stream (attach; exec start, whose ``json_body`` says how)."""
        conn = await self._connect()
        upgrade = [("Connection", "Upgrade"), ("Upgrade", "tcp")]
        if json_body is not None:
            upgrade.append(("Content-Type", "application/json"))
        try:
            async with self._deadline(method, target, timeout):
                with mapped_errors(method, target):
                    await conn.send(*self._request_events(method, target, json_body, upgrade))
                    head = await self._read_head(conn)
                    if isinstance(head, h11.Response):
                        error_body = b""
                        while isinstance(event := await conn.next_event(), h11.Data):
                            error_body += bytes(event.data)
                        if head.status_code >= 400:
                            raise error_for(method, target, head.status_code, error_body)
                        raise EngineProtocolError(
                            f"{method} {target}: expected 101 Switching Protocols, "
                            f"got {head.status_code}"
                        )
                    if head.status_code != 101:
                        raise EngineProtocolError(
                            f"{method} {target}: unexpected {head.status_code}"
                        )
            trailing, _closed = conn.h11.trailing_data
            return HijackedStream(conn, bytes(trailing), method, target)
        except BaseException:
            await conn.aclose()
            raise

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.aclose()


TRANSPORT_FAILURES = (
    h11.ProtocolError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    OSError,
)
"""What ``mapped_error`` maps: a call's transport-level failures."""


def mapped_error(exc: BaseException, method: str, path: str) -> SbxError:
    """The sbxkit error for a transport-level failure (one of ``TRANSPORT_FAILURES``)."""
    if isinstance(exc, h11.RemoteProtocolError):
        return EngineProtocolError(f"{method} {path}: {exc}")
    if isinstance(exc, h11.LocalProtocolError):
        return EngineProtocolError(f"{method} {path}: local: {exc}")
    return EngineConnectionError(method, path, str(exc) or type(exc).__name__)


@contextmanager
def mapped_errors(method: str, path: str) -> Iterator[None]:
    """Map transport-level failures inside a call to sbxkit errors."""
    try:
        yield
    except TRANSPORT_FAILURES as exc:
        raise mapped_error(exc, method, path) from exc


def api_path(template: str, *params: str, query: Iterable[tuple[str, str]] = ()) -> str:
    """An Engine API path: every ``{}`` of ``template`` takes one path parameter,
    percent-encoded whole (``/``, ``..``, ``?`` and ``#`` included), so no id, name or image
    reference can change which endpoint is called; then the query."""
    if template.count("{}") != len(params):
        raise ValueError(f"{template!r} takes {template.count('{}')} parameters, got {len(params)}")
    path = template.format(*(quote(str(p), safe="") for p in params))
    return join_query(path, query)


def join_query(path: str, params: Iterable[tuple[str, str]]) -> str:
    """``path?k=v&…`` with percent-encoding; parameters with an empty key are dropped."""
    query = urlencode([(k, v) for k, v in params if k])
    return f"{path}?{query}" if query else path
