"""A fault-injection HTTP/1.1 proxy on a Unix socket, in front of the real Docker daemon.

The daemon itself is never stopped or modified: faults are injected between a client (the
supervisor, started with ``--docker-socket PROXY``) and ``/var/run/docker.sock``. The proxy speaks
HTTP/1.1 with h11 on both sides — server role toward the client, client role toward the daemon —
keeps connections alive (several requests per connection, one daemon connection per client
connection), streams response bodies chunk by chunk (the long-lived ``/events`` stream included)
and passes an ``Upgrade`` (attach, exec) through as a raw two-way splice with half-close.

It runs in a background thread with its own trio event loop (``start``/``stop`` or ``with``), so
sync fixtures, trio tests and subprocesses can all use it; ``serve`` runs it as a trio task
instead. Faults can be flipped at run time from any thread.

Requests are classified into *kinds* by method and path regex (searched in the path, query
excluded); the first matching kind wins, anything else is ``other``. Faults attach to a kind:

- ``Delay(seconds)``: hold the request that long, then forward it (even if the client has gone
  meanwhile: the request is "still arriving at the daemon").
- ``DropReply()``: forward, read the daemon's whole reply, then close the client's connection
  without sending any of it (the container exists, the client never learns its id).
- ``Orphan(delay)``: close the client's connection at once without an answer, and only then,
  after ``delay``, forward the request to the daemon (reply discarded). The client's request
  fails before the daemon has seen it, and its effect materialises later.
- ``Fail(status, message)``: answer with ``status`` and ``{"message": ...}`` without forwarding.
- ``DelayReply(seconds)``: forward at once (the daemon acts now), hold the reply that long.
- ``Withhold()``: never forward; hold the request until its client goes away (a client that
  died before its request left it: nothing reaches the daemon).
- ``Rewrite(edit)``: forward the request with its body replaced by ``edit(body)`` (a daemon
  that ignores part of what it was asked).

Counters per kind: ``seen`` (requests received), ``passed`` (forwarded without a fault) and
``faulted`` (a fault applied). ``history`` records every exchange; ``errors`` collects unexpected
proxy failures (a peer closing its connection is expected and not recorded), so a test can tell
a proxy bug from a bug in the code under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType

import h11
import trio

DOCKER_SOCKET = os.environ.get("SBXKIT_TEST_SOCKET", "/var/run/docker.sock")
READ_CHUNK = 64 * 1024
MAX_REQUEST_BODY = 16 * 1024 * 1024
_PEER_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


# -- request kinds and faults -------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A request kind: HTTP method (``None``: any) and a regex searched in the path."""

    name: str
    method: str | None
    pattern: str

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and method.upper() != self.method.upper():
            return False
        return re.search(self.pattern, path) is not None


DEFAULT_KINDS: tuple[Kind, ...] = (
    Kind("ping", None, r"/_ping$"),
    Kind("create", "POST", r"/containers/create$"),
    Kind("remove", "DELETE", r"/containers/[^/]+$"),
    Kind("list", "GET", r"/containers/json$"),
    Kind("inspect", "GET", r"/containers/[^/]+/json$"),
    Kind("start", "POST", r"/containers/[^/]+/start$"),
    Kind("attach", "POST", r"/containers/[^/]+/attach$"),
    Kind("wait", "POST", r"/containers/[^/]+/wait$"),
    Kind("events", "GET", r"/events$"),
    Kind("info", "GET", r"/info$"),
)
OTHER = "other"


@dataclass(frozen=True)
class Delay:
    seconds: float


@dataclass(frozen=True)
class DropReply:
    pass


@dataclass(frozen=True)
class Orphan:
    delay: float


@dataclass(frozen=True)
class Withhold:
    """The request never reaches the daemon: held until its client goes away (a client that
    died after deciding to send it, before it was sent)."""


@dataclass(frozen=True)
class DelayReply:
    seconds: float


@dataclass(frozen=True)
class Fail:
    status: int = 500
    message: str = "injected failure"


@dataclass(frozen=True)
class Answer:
    """Answer for the daemon, never asking it: a lying daemon (``body`` as JSON, 200)."""

    body: bytes


@dataclass(frozen=True)
class Rewrite:
    """Forward the request with its body rewritten: ``edit`` of the raw body."""

    edit: Callable[[bytes], bytes]


Fault = Delay | DropReply | Orphan | Fail | DelayReply | Withhold | Answer | Rewrite


@dataclass
class _Rule:
    fault: Fault
    remaining: int | None  # None: until cleared


@dataclass
class Exchange:
    """One request as the proxy handled it (unix times)."""

    kind: str
    method: str
    target: str
    fault: str | None
    received_at: float
    forwarded_at: float | None = None
    status: int | None = None  # the daemon's status (or the injected one)
    delivered: bool = False  # the client received the reply head


@dataclass
class Counts:
    seen: int = 0
    passed: int = 0
    faulted: int = 0


@dataclass
class _Request:
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    upgrade: bool = field(default=False)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


class _PeerGone(Exception):
    """The client side closed (or broke) its connection."""


# -- the proxy ----------------------------------------------------------------------------------


class FaultProxy:
    """Listen on ``path`` (a fresh private one by default) and forward to ``upstream``."""

    def __init__(self, upstream: str = DOCKER_SOCKET, path: str | None = None) -> None:
        self.upstream = upstream
        self._own_dir: Path | None = None
        if path is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="sbxfp-", dir="/tmp"))
            os.chmod(self._own_dir, 0o700)
            path = str(self._own_dir / "docker.sock")
        self.path = path
        self._lock = threading.Lock()
        self._kinds: list[Kind] = list(DEFAULT_KINDS)
        self._rules: dict[str, list[_Rule]] = {}
        self._counts: dict[str, Counts] = {}
        self.history: list[Exchange] = []
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._startup_error: BaseException | None = None

    # -- control (any thread) -------------------------------------------------------------------

    def define_kind(self, name: str, method: str | None, pattern: str) -> None:
        """Add a request kind, matched before the built-in ones."""
        with self._lock:
            self._kinds.insert(0, Kind(name, method, pattern))

    def add_fault(self, kind: str, fault: Fault, *, times: int | None = None) -> None:
        """Apply ``fault`` to the next ``times`` requests of ``kind`` (None: until cleared)."""
        with self._lock:
            self._rules.setdefault(kind, []).append(_Rule(fault, times))

    def clear_faults(self, kind: str | None = None) -> None:
        with self._lock:
            if kind is None:
                self._rules.clear()
            else:
                self._rules.pop(kind, None)

    def delay_create(self, seconds: float, *, times: int | None = 1) -> None:
        self.add_fault("create", Delay(seconds), times=times)

    def drop_create_reply(self, *, times: int | None = 1) -> None:
        self.add_fault("create", DropReply(), times=times)

    def orphan_create(self, delay: float, *, times: int | None = 1) -> None:
        self.add_fault("create", Orphan(delay), times=times)

    def withhold_create(self, *, times: int | None = 1) -> None:
        self.add_fault("create", Withhold(), times=times)

    def clear_creates(self) -> None:
        self.clear_faults("create")

    def fail_removals(self, status: int = 500, message: str = "injected failure") -> None:
        """Answer every ``DELETE /containers/...`` with an error until ``clear_removals``."""
        self.add_fault("remove", Fail(status, message), times=None)

    def clear_removals(self) -> None:
        self.clear_faults("remove")

    def counts(self, kind: str) -> Counts:
        with self._lock:
            c = self._counts.get(kind, Counts())
            return Counts(c.seen, c.passed, c.faulted)

    def seen(self, kind: str) -> int:
        return self.counts(kind).seen

    def passed(self, kind: str) -> int:
        return self.counts(kind).passed

    def faulted(self, kind: str) -> int:
        return self.counts(kind).faulted

    def exchanges(self, kind: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.history if e.kind == kind]

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> FaultProxy:
        """Serve from a background thread with its own trio loop; return once listening."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._thread_main, name="faultproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"fault proxy did not start listening on {self.path}")
        if self._startup_error is not None:
            raise RuntimeError(f"fault proxy failed to start: {self._startup_error!r}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        if self._token is not None and self._scope is not None:
            # Thread-safe and non-blocking, so ``stop`` works from inside another trio loop too.
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._scope.cancel)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("fault proxy thread did not stop")
        self._thread = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._own_dir is not None:
            with contextlib.suppress(OSError):
                self._own_dir.rmdir()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            trio.run(self.serve)
        except BaseException as exc:
            self._startup_error = exc
            self._record_error(f"proxy loop died: {exc!r}")
        finally:
            self._ready.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (or ``stop``); usable as a trio task with ``nursery.start``."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            await listener.bind(self.path)
        finally:
            os.umask(old_umask)
        listener.listen(128)
        with trio.CancelScope() as scope:
            self._scope = scope
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                self._ready.set()
                await trio.serve_listeners(self._handle, [trio.SocketListener(listener)])

    # -- bookkeeping ----------------------------------------------------------------------------

    def _classify(self, method: str, path: str) -> str:
        with self._lock:
            for kind in self._kinds:
                if kind.matches(method, path):
                    return kind.name
        return OTHER

    def _take_fault(self, kind: str) -> Fault | None:
        with self._lock:
            rules = self._rules.get(kind)
            if not rules:
                return None
            rule = rules[0]
            if rule.remaining is not None:
                rule.remaining -= 1
                if rule.remaining <= 0:
                    rules.pop(0)
            return rule.fault

    def _count(self, kind: str, fault: Fault | None, exchange: Exchange) -> None:
        with self._lock:
            c = self._counts.setdefault(kind, Counts())
            c.seen += 1
            if fault is None:
                c.passed += 1
            else:
                c.faulted += 1
            self.history.append(exchange)

    def _record_error(self, text: str) -> None:
        with self._lock:
            self.errors.append(text)

    # -- one client connection ------------------------------------------------------------------

    async def _handle(self, down: trio.SocketStream) -> None:
        try:
            await _Session(self, down).run()
        except _PeerGone:
            pass
        except Exception:
            self._record_error(traceback.format_exc())
        finally:
            await trio.aclose_forcefully(down)

    async def _forward_later(self, request: _Request, delay: float, exchange: Exchange) -> None:
        """For ``Orphan``: the client is gone; the request reaches the daemon after ``delay``."""
        try:
            await trio.sleep(delay)
            up = await _Upstream.connect(self.upstream)
            try:
                exchange.forwarded_at = time.time()
                await up.send_request(request)
                head = await up.read_head()
                exchange.status = head.status_code
                await up.drain_body()
            finally:
                await up.aclose()
        except Exception:
            self._record_error(traceback.format_exc())


class _Upstream:
    """One connection to the daemon, h11 in the client role."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, path: str) -> _Upstream:
        return cls(await trio.open_unix_socket(path))

    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    async def send(self, *events: h11.Event) -> None:
        await self.stream.send_all(b"".join(self.h11.send(e) or b"" for e in events))

    async def send_request(self, request: _Request) -> None:
        headers = [
            (k, v)
            for k, v in request.headers
            if k.lower() not in (b"content-length", b"transfer-encoding")
        ]
        framed = len(headers) != len(request.headers)
        if request.body or framed:
            headers.append((b"content-length", str(len(request.body)).encode()))
        events: list[h11.Event] = [
            h11.Request(method=request.method, target=request.target, headers=headers)
        ]
        if request.body:
            events.append(h11.Data(data=request.body))
        events.append(h11.EndOfMessage())
        await self.send(*events)

    async def next_event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(READ_CHUNK))
                continue
            return event  # type: ignore[return-value]

    async def read_head(self) -> h11.Response | h11.InformationalResponse:
        while True:
            event = await self.next_event()
            if isinstance(event, h11.InformationalResponse) and event.status_code != 101:
                continue  # 100 Continue and friends: not forwarded
            if isinstance(event, h11.Response | h11.InformationalResponse):
                return event
            raise ConnectionError(f"daemon: expected a response head, got {event!r}")

    async def drain_body(self) -> None:
        while not isinstance(await self.next_event(), h11.EndOfMessage | h11.ConnectionClosed):
            pass

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


class _Session:
    """Requests of one client connection, in order; one daemon connection kept alive beside."""

    def __init__(self, proxy: FaultProxy, down: trio.SocketStream) -> None:
        self.proxy = proxy
        self.down = down
        self.h11 = h11.Connection(h11.SERVER)
        self.up: _Upstream | None = None

    async def run(self) -> None:
        try:
            while True:
                request = await self._read_request()
                if request is None:
                    return
                if not await self._exchange(request):
                    return
                if self.h11.our_state is h11.MUST_CLOSE or self.h11.their_state is h11.MUST_CLOSE:
                    return
                self.h11.start_next_cycle()
        finally:
            if self.up is not None:
                await self.up.aclose()

    # -- client side ----------------------------------------------------------------------------

    async def _down_next(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.down.receive_some(READ_CHUNK)
                except _PEER_GONE as exc:
                    raise _PeerGone from exc
                self.h11.receive_data(data)
                continue
            return event  # type: ignore[return-value]

    async def _down_send(self, *events: h11.Event) -> None:
        data = b"".join(self.h11.send(e) or b"" for e in events)
        try:
            await self.down.send_all(data)
        except _PEER_GONE as exc:
            raise _PeerGone from exc

    async def _read_request(self) -> _Request | None:
        try:
            event = await self._down_next()
        except h11.RemoteProtocolError:
            return None
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise ConnectionError(f"client: expected a request, got {event!r}")
        body = bytearray()
        while True:
            part = await self._down_next()
            if isinstance(part, h11.EndOfMessage):
                break
            if isinstance(part, h11.ConnectionClosed):
                raise _PeerGone
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > MAX_REQUEST_BODY:
                    raise ConnectionError("client: request body too large")
        headers = [(bytes(k), bytes(v)) for k, v in event.headers]
        upgrade = any(k == b"upgrade" for k, _ in headers)
        return _Request(
            method=event.method.decode("ascii"),
            target=event.target.decode("ascii"),
            headers=headers,
            body=bytes(body),
            upgrade=upgrade,
        )

    # -- one exchange ---------------------------------------------------------------------------

    async def _exchange(self, request: _Request) -> bool:
        """Handle one request; False when the client connection must end."""
        proxy = self.proxy
        kind = proxy._classify(request.method, request.path)
        fault = proxy._take_fault(kind)
        exchange = Exchange(
            kind=kind,
            method=request.method,
            target=request.target,
            fault=None if fault is None else type(fault).__name__,
            received_at=time.time(),
        )
        proxy._count(kind, fault, exchange)

        if isinstance(fault, Fail | Answer):
            status = fault.status if isinstance(fault, Fail) else 200
            if isinstance(fault, Fail):
                body = json.dumps({"message": fault.message}).encode()
            else:
                body = fault.body
            exchange.status = status
            await self._down_send(
                h11.Response(
                    status_code=status,
                    headers=[
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                ),
                h11.Data(data=body),
                h11.EndOfMessage(),
            )
            exchange.delivered = True
            return True
        if isinstance(fault, Orphan):
            assert proxy._nursery is not None
            proxy._nursery.start_soon(proxy._forward_later, request, fault.delay, exchange)
            return False  # closes the client's connection without an answer
        if isinstance(fault, Withhold):
            with contextlib.suppress(*_PEER_GONE):
                while await self.down.receive_some(READ_CHUNK):
                    pass  # a client that sends more while it waits is not one this fault is for
            return False
        if isinstance(fault, Delay):
            await trio.sleep(fault.seconds)
        if isinstance(fault, Rewrite):
            request = replace(request, body=fault.edit(request.body))

        up = await self._upstream()
        exchange.forwarded_at = time.time()
        await up.send_request(request)
        if isinstance(fault, DelayReply):
            await trio.sleep(fault.seconds)
        head = await up.read_head()
        exchange.status = head.status_code

        if isinstance(fault, DropReply):
            await up.drain_body()
            return False
        if isinstance(head, h11.InformationalResponse):  # 101: raw from here on
            await self._down_send(
                h11.InformationalResponse(
                    status_code=head.status_code, headers=head.headers, reason=head.reason
                )
            )
            exchange.delivered = True
            await self._splice(up)
            return False
        await self._down_send(
            h11.Response(status_code=head.status_code, headers=head.headers, reason=head.reason)
        )
        exchange.delivered = True
        if not await self._relay_body(up):
            return False
        if up.reusable():
            up.h11.start_next_cycle()
        else:
            await up.aclose()
            self.up = None
        return True

    async def _upstream(self) -> _Upstream:
        if self.up is None:
            self.up = await _Upstream.connect(self.proxy.upstream)
        return self.up

    async def _relay_body(self, up: _Upstream) -> bool:
        """Stream the daemon's body to the client chunk by chunk; False if either side went.

        While the body flows (an ``/events`` stream may flow for ever), the client connection is
        watched: its EOF ends the relay, bytes it sends early are kept for the next request.
        """
        client_gone = False
        completed = False
        async with trio.open_nursery() as nursery:

            async def watch_client() -> None:
                nonlocal client_gone
                while True:
                    try:
                        data = await self.down.receive_some(READ_CHUNK)
                    except _PEER_GONE:
                        data = b""
                    if not data:
                        client_gone = True
                        nursery.cancel_scope.cancel()
                        return
                    self.h11.receive_data(data)

            nursery.start_soon(watch_client)
            try:
                while True:
                    event = await up.next_event()
                    if isinstance(event, h11.Data):
                        await self._down_send(h11.Data(data=event.data))
                    elif isinstance(event, h11.EndOfMessage):
                        await self._down_send(h11.EndOfMessage())
                        completed = True
                        break
                    else:  # the daemon closed mid-body
                        break
            except _PeerGone:
                client_gone = True
            nursery.cancel_scope.cancel()
        return completed and not client_gone

    async def _splice(self, up: _Upstream) -> None:
        """After 101: bytes both parsers already hold first, then raw both ways, half-closes
        propagated (stdin EOF is a write-side shutdown)."""
        up_trailing, _ = up.h11.trailing_data
        down_trailing, _ = self.h11.trailing_data

        async def pump(source: trio.SocketStream, sink: trio.SocketStream, first: bytes) -> None:
            try:
                if first:
                    await sink.send_all(first)
                while data := await source.receive_some(READ_CHUNK):
                    await sink.send_all(data)
                await sink.send_eof()
            except _PEER_GONE:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, up.stream, self.down, bytes(up_trailing))
            nursery.start_soon(pump, self.down, up.stream, bytes(down_trailing))


@contextlib.contextmanager
def fault_proxy(upstream: str = DOCKER_SOCKET) -> Iterator[FaultProxy]:
    """A started proxy in a background thread, stopped on exit."""
    with FaultProxy(upstream) as proxy:
        yield proxy


__all__ = [
    "DEFAULT_KINDS",
    "Counts",
    "Delay",
    "DelayReply",
    "DropReply",
    "Exchange",
    "Fail",
    "FaultProxy",
    "Kind",
    "Orphan",
    "fault_proxy",
]
