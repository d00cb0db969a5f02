"""Typed Engine API calls over the transport, with API version negotiation.

The engine knows nothing of sandboxes: it speaks the endpoints sbxkit needs and returns msgspec
models. ``open_engine`` pings the daemon, reads ``Api-Version`` and uses
``min(server, NEWEST_API)`` for every path; servers older than 1.41 are refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

import msgspec
import trio

from sbxkit._util.public import publish
from sbxkit.engine import models
from sbxkit.engine.discovery import PingResult, answering_socket, parse_api_version
from sbxkit.engine.transport import HijackedStream, StreamResponse, Transport, api_path
from sbxkit.errors import EngineProtocolError, EngineUnavailable, NotFound

INFO_MAX_AGE_S = 30.0
OLDEST_API = (1, 41)  # Docker 20.10, what CI runs
NEWEST_API = (1, 56)  # the newest specification this client was written against

T = TypeVar("T")


class Deadlines(msgspec.Struct, frozen=True, kw_only=True):
    """Per-call deadlines in seconds. Starting a container is the slow step of the daemon."""

    ping: float = 5.0
    inspect: float = 15.0
    create: float = 30.0
    start: float = 60.0
    attach: float = 15.0
    kill: float = 15.0
    remove: float = 30.0
    list: float = 15.0


def negotiate(server: tuple[int, int]) -> str:
    """The API version to speak with a server that announced ``server``."""
    if server < OLDEST_API:
        raise EngineUnavailable(
            "(negotiation)",
            f"API {server[0]}.{server[1]} is older than {OLDEST_API[0]}.{OLDEST_API[1]}, the "
            "oldest sbxkit speaks (Docker 20.10); upgrade the daemon",
        )
    major, minor = min(server, NEWEST_API)
    return f"{major}.{minor}"


class Waiter:
    """A registered ``wait`` call. Its head arrived, so the daemon is watching the container."""

    def __init__(self, stream: StreamResponse, path: str) -> None:
        self._stream = stream
        self._path = path

    async def result(self) -> models.ContainerWaitReply:
        """Block until the condition is met; no deadline here, the caller scopes it."""
        body = await self._stream.read_all(64 * 1024)
        try:
            return msgspec.json.decode(body, type=models.ContainerWaitReply)
        except msgspec.DecodeError as exc:
            raise EngineProtocolError(f"POST {self._path}: malformed wait reply: {exc}") from exc

    async def aclose(self) -> None:
        await self._stream.aclose()


class Engine:
    """One daemon, one negotiated API version, one connection pool."""

    def __init__(
        self, transport: Transport, ping: PingResult, api_version: str, deadlines: Deadlines
    ) -> None:
        self._transport = transport
        self.ping_result = ping
        self.api_version = api_version
        self.deadlines = deadlines
        self._decoders: dict[type[object], msgspec.json.Decoder[object]] = {}
        self._info: tuple[float, models.InfoReply] | None = None
        self._podman_host: models.PodmanHost | None = None

    @property
    def socket_path(self) -> str:
        return self._transport.socket_path

    @property
    def is_podman(self) -> bool:
        """A Podman API service (its ping carries ``Libpod-Api-Version``): bodies adapt."""
        return self.ping_result.is_podman

    def _path(self, path: str) -> str:
        """The versioned target of an ``api_path`` (its parameters already quoted)."""
        return f"/v{self.api_version}{path}"

    def _decode(self, data: bytes, kind: type[T], what: str) -> T:
        decoder = self._decoders.get(kind)
        if decoder is None:
            decoder = self._decoders[kind] = msgspec.json.Decoder(kind)
        try:
            return decoder.decode(data)  # type: ignore[return-value]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EngineProtocolError(f"{what}: malformed reply: {exc}") from exc

    async def _get(self, path: str, kind: type[T], timeout: float) -> T:
        target = self._path(path)
        response = await self._transport.request("GET", target, timeout=timeout)
        return self._decode(response.body, kind, f"GET {target}")

    async def _post(self, path: str, *, body: bytes | None = None, timeout: float) -> bytes:
        return await self.call("POST", path, body=body, timeout=timeout)

    # -- the public call surface (sbxkit.engine.execapi and other endpoint modules) ------------

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout: float,
    ) -> bytes:
        """One short call on a pooled connection; ``path`` from ``api_path``. The reply body."""
        headers = [("Content-Type", content_type)] if body is not None else []
        response = await self._transport.request(
            method, self._path(path), body=body, headers=headers, timeout=timeout
        )
        return response.body

    async def call_json(
        self, method: str, path: str, kind: type[T], *, body: bytes | None = None, timeout: float
    ) -> T:
        """``call``, its reply decoded as ``kind`` (a malformed reply is EngineProtocolError)."""
        reply = await self.call(method, path, body=body, timeout=timeout)
        return self._decode(reply, kind, f"{method} {path}")

    async def hijack(
        self, method: str, path: str, *, body: bytes | None = None, timeout: float
    ) -> HijackedStream:
        """``Upgrade: tcp`` on a dedicated connection (attach, exec start)."""
        return await self._transport.hijack(
            method, self._path(path), json_body=body, timeout=timeout
        )

    async def stream(self, method: str, path: str, *, timeout: float) -> StreamResponse:
        """A streamed response on a dedicated connection (wait, events, archive)."""
        return await self._transport.open_stream(method, self._path(path), timeout=timeout)

    # -- system -------------------------------------------------------------------------------

    async def version(self) -> models.VersionReply:
        return await self._get("/version", models.VersionReply, self.deadlines.inspect)

    async def info(self) -> models.InfoReply:
        return await self._get("/info", models.InfoReply, self.deadlines.inspect)

    async def cached_info(self, max_age_s: float = INFO_MAX_AGE_S) -> models.InfoReply:
        """``/info`` at most ``max_age_s`` old: registered runtimes and CDI devices change only
        with a daemon reconfiguration, and ``/info`` costs several ms on every run otherwise."""
        now = trio.current_time()
        if self._info is None or now - self._info[0] > max_age_s:
            self._info = (now, await self.info())
        return self._info[1]

    async def podman_host(self) -> models.PodmanHost:
        """Podman's own ``/libpod/info`` host section, read once per engine (it changes only
        with the service's configuration)."""
        if self._podman_host is None:
            reply = await self._get("/libpod/info", models.PodmanInfo, self.deadlines.inspect)
            self._podman_host = reply.host
        return self._podman_host

    async def podman_id_mappings(self, container_id: str) -> models.PodmanIdMappings | None:
        """The user namespace maps Podman recorded for a container at its create (its own
        inspect: the compat one reports none before start), or None: it has none of its own."""
        path = api_path("/libpod/containers/{}/json", container_id)
        reply = await self._get(path, models.PodmanContainerInspect, self.deadlines.inspect)
        return reply.host_config.id_mappings

    # -- images ---------------------------------------------------------------------------------

    async def image_inspect(self, name: str) -> models.ImageInspect:
        return await self._get(
            api_path("/images/{}/json", name), models.ImageInspect, self.deadlines.inspect
        )

    async def volume_inspect(self, name: str) -> models.VolumeReply:
        return await self._get(
            api_path("/volumes/{}", name), models.VolumeReply, self.deadlines.inspect
        )

    # -- containers ---------------------------------------------------------------------------

    async def container_create(self, body: models.ContainerCreate, *, name: str) -> str:
        path = api_path("/containers/create", query=[("name", name)])
        reply = await self._post(
            path, body=msgspec.json.encode(body), timeout=self.deadlines.create
        )
        return self._decode(reply, models.ContainerCreateReply, f"POST {path}").id

    async def container_inspect(
        self, container: str, *, size: bool = False
    ) -> models.ContainerInspect:
        """``size``: the daemon also measures what the container wrote (``SizeRw``): a walk
        of its layer, so only when that is wanted."""
        path = api_path("/containers/{}/json", container) + ("?size=1" if size else "")
        return await self._get(path, models.ContainerInspect, self.deadlines.inspect)

    async def container_start(self, container_id: str) -> None:
        await self._post(
            api_path("/containers/{}/start", container_id), timeout=self.deadlines.start
        )

    async def container_attach(self, container_id: str, *, stdin: bool) -> HijackedStream:
        """Hijacked attach to stdout/stderr (and stdin); call before start to lose nothing."""
        path = api_path(
            "/containers/{}/attach",
            container_id,
            query=[
                ("stream", "1"),
                ("stdout", "1"),
                ("stderr", "1"),
                ("stdin", "1" if stdin else "0"),
            ],
        )
        return await self.hijack("POST", path, timeout=self.deadlines.attach)

    async def container_wait(self, container_id: str, condition: str = "next-exit") -> Waiter:
        """Register a wait; returns once the daemon confirmed it by sending the head."""
        path = api_path("/containers/{}/wait", container_id, query=[("condition", condition)])
        stream = await self.stream("POST", path, timeout=self.deadlines.attach)
        return Waiter(stream, path)

    async def container_kill(self, container_id: str, signal: str = "KILL") -> None:
        path = api_path("/containers/{}/kill", container_id, query=[("signal", signal)])
        await self._post(path, timeout=self.deadlines.kill)

    async def container_remove(self, container_id: str) -> bool:
        """Remove with ``force&v``. Returns False when the container was already gone."""
        path = api_path("/containers/{}", container_id, query=[("force", "true"), ("v", "true")])
        try:
            await self.call("DELETE", path, timeout=self.deadlines.remove)
        except NotFound:
            return False
        return True

    async def container_list(
        self, *, label: str | None = None, name: str | None = None
    ) -> list[models.ContainerSummary]:
        """All containers (running or not), optionally filtered by label and name."""
        filters: dict[str, list[str]] = {}
        if label is not None:
            filters["label"] = [label]
        if name is not None:
            filters["name"] = [name]
        params = [("all", "1")]
        if filters:
            params.append(("filters", msgspec.json.encode(filters).decode()))
        return await self._get(
            api_path("/containers/json", query=params),
            list[models.ContainerSummary],
            self.deadlines.list,
        )

    @asynccontextmanager
    async def events(self, filters: dict[str, list[str]]) -> AsyncIterator[EventStream]:
        """Stream daemon events matching ``filters`` from now on (dedicated connection)."""
        path = api_path("/events", query=[("filters", msgspec.json.encode(filters).decode())])
        stream = await self.stream("GET", path, timeout=self.deadlines.attach)
        try:
            yield EventStream(stream, path)
        finally:
            await stream.aclose()

    async def events_between(
        self, since: float, until: float, filters: dict[str, list[str]]
    ) -> list[models.Event]:
        """The daemon's recorded events in ``[since, until]`` (unix seconds) matching
        ``filters``; ``until`` must not be in the future (the daemon would wait for it)."""
        params = [
            ("since", f"{since:.9f}"),
            ("until", f"{until:.9f}"),
            ("filters", msgspec.json.encode(filters).decode()),
        ]
        target = api_path("/events", query=params)
        body = await self.call("GET", target, timeout=self.deadlines.list)
        decoder = EventStream._decoder
        try:
            return [decoder.decode(line) for line in body.splitlines() if line.strip()]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EngineProtocolError(f"GET {target}: malformed event: {exc}") from exc

    async def aclose(self) -> None:
        await self._transport.aclose()


class EventStream:
    """Newline-delimited JSON events, decoded one by one."""

    _decoder = msgspec.json.Decoder(models.Event)

    def __init__(self, stream: StreamResponse, path: str) -> None:
        self._stream = stream
        self._path = path
        self._buffer = b""

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> models.Event:
        while b"\n" not in self._buffer:
            if len(self._buffer) > 1024 * 1024:
                raise EngineProtocolError(f"GET {self._path}: event line over 1 MiB")
            chunk = await self._stream.receive_some()
            if not chunk:
                raise StopAsyncIteration
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return self._decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EngineProtocolError(f"GET {self._path}: malformed event: {exc}") from exc


async def connect(socket_path: str | None = None, *, deadlines: Deadlines | None = None) -> Engine:
    """Find the daemon (explicit path, ``DOCKER_HOST``, standard sockets), ping, negotiate. A
    socket that answered the same question in the last ``RECENT_PING_S`` seconds is not asked
    again while it is the same socket file (``answers.py``)."""
    deadlines = deadlines or Deadlines()
    ping = await answering_socket(socket_path, timeout=deadlines.ping)
    try:
        api_version = negotiate(parse_api_version(ping.api_version))
    except EngineUnavailable as exc:
        raise EngineUnavailable(ping.socket_path, exc.reason) from None
    return Engine(Transport(ping.socket_path), ping, api_version, deadlines)


@asynccontextmanager
async def open_engine(
    socket_path: str | None = None, *, deadlines: Deadlines | None = None
) -> AsyncIterator[Engine]:
    """An engine connection pool for the duration of the block."""
    engine = await connect(socket_path, deadlines=deadlines)
    try:
        yield engine
    finally:
        await engine.aclose()


@asynccontextmanager
async def engine_or_open(engine: Engine | None, socket_path: str | None) -> AsyncIterator[Engine]:
    """``engine`` itself when the caller has one (and keeps owning it), else a pool of our own
    for the duration of the block."""
    if engine is not None:
        yield engine
    else:
        async with open_engine(socket_path) as own:
            yield own


publish(__name__, globals())  # public names show as sbxkit.NAME
