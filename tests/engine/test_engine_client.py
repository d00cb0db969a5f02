"""The engine client against the real daemon, with faults injected only in front of it.

``Proxy`` is a small trio Unix-socket forwarder placed between sbxkit and the real daemon. It
counts the connections it accepts and can drop every live connection, stall new ones (accept
and never answer) or coalesce a ``101`` response head with the first bytes that follow it into
one write. It never answers on the daemon's behalf.
"""

from __future__ import annotations

import os
import struct
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.plan import new_lease_id
from sbxkit._plan.policy import build_create_body, container_name
from sbxkit.engine.client import Deadlines, Engine, open_engine
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import EngineProtocolError, EngineTimeout, NotFound
from tests.engine.engines import EngineFacts
from tests.witness import LEASE_LABEL, Witness

HEAD_END = b"\r\n\r\n"


class Proxy:
    """Forwards each accepted connection to the daemon's socket."""

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream = upstream
        self.path = path
        self.accepted = 0
        self.stall = False
        self.coalesce_upgrade = False
        self.upgrade_seen = trio.Event()
        # For each coalesced 101: how many bytes after the head went out in the same write.
        self.coalesced_trailing: list[int] = []
        self._live: dict[int, tuple[trio.CancelScope, trio.Event]] = {}

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(self.path)
        sock.listen(128)
        async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:
            task_status.started()
            while True:
                stream = await listener.accept()
                self.accepted += 1
                nursery.start_soon(self._handle, stream, self.accepted)

    async def drop_all(self) -> None:
        """Close every live connection (both sides) and wait until they are closed."""
        links = list(self._live.values())
        for scope, _ in links:
            scope.cancel()
        for _, done in links:
            await done.wait()

    async def _handle(self, downstream: trio.SocketStream, number: int) -> None:
        scope, done = trio.CancelScope(), trio.Event()
        self._live[number] = (scope, done)
        try:
            with scope:
                if self.stall:
                    await trio.sleep_forever()
                upstream = await trio.open_unix_socket(self.upstream)
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump_up, downstream, upstream)
                        nursery.start_soon(self._pump_down, upstream, downstream)
                finally:
                    await trio.aclose_forcefully(upstream)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # either side went away: so does the link
        finally:
            await trio.aclose_forcefully(downstream)
            del self._live[number]
            done.set()

    async def _pump_up(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        async for chunk in source:
            await sink.send_all(chunk)
        await sink.send_eof()  # the client's half-close (stdin EOF) reaches the daemon

    async def _pump_down(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        held = b""
        async for chunk in source:
            if self.coalesce_upgrade and (held or chunk.startswith(b"HTTP/1.1 101")):
                held += chunk
                self.upgrade_seen.set()
                end = held.find(HEAD_END)
                if end < 0 or len(held) == end + len(HEAD_END):
                    continue  # hold the head until output follows it
                self.coalesced_trailing.append(len(held) - end - len(HEAD_END))
                chunk, held = held, b""
            await sink.send_all(chunk)
        if held:
            await sink.send_all(held)
        await sink.send_eof()


@asynccontextmanager
async def running_proxy(witness: Witness, tmp_path: Path) -> AsyncIterator[Proxy]:
    proxy = Proxy(witness.socket_path, str(tmp_path / "proxy.sock"))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        try:
            yield proxy
        finally:
            await proxy.drop_all()
            nursery.cancel_scope.cancel()


# -- the daemon as it is ------------------------------------------------------------------------


@pytest.mark.engine_cell
async def test_open_engine_negotiates_the_daemons_api_version(
    witness: Witness, engine_facts: EngineFacts
) -> None:
    async with open_engine(witness.socket_path) as engine:
        assert engine.api_version == engine_facts.api_version  # 1.41 on 20.10, 1.45 on 26.1
        assert engine.socket_path == witness.socket_path
        assert engine.ping_result.api_version == engine_facts.api_version
        assert not engine.ping_result.is_podman
        assert engine.ping_result.os_type == "linux"


@pytest.mark.engine_cell
async def test_version_and_info_decode(
    engine: Engine, witness: Witness, engine_facts: EngineFacts
) -> None:
    version = await engine.version()
    expected = witness.get("/version")
    assert version.api_version == expected["ApiVersion"] == engine_facts.api_version
    assert version.version == expected["Version"]
    assert version.version.startswith(engine_facts.server_version_prefix)
    assert version.min_api_version == expected["MinAPIVersion"]
    assert version.os == "linux"
    info = await engine.info()
    assert info.runtimes is not None
    assert {"runc", "crun"} <= set(info.runtimes)
    assert info.runtimes["crun"].path == witness.get("/info")["Runtimes"]["crun"]["path"]
    assert info.server_version == version.version
    assert info.ncpu >= 1
    assert info.mem_total > 0
    assert info.cdi_spec_dirs == engine_facts.cdi_spec_dirs  # absent on 20.10, [] on 26.1
    for alias in engine_facts.runc_aliases:
        assert info.runtimes[alias].path == info.runtimes["runc"].path


@pytest.mark.engine_cell
async def test_missing_image_is_not_found_with_context(engine: Engine, witness: Witness) -> None:
    image = "sbxkit-test/definitely-not-here:never"
    assert not witness.image_exists(image)
    with pytest.raises(NotFound) as caught:
        await engine.image_inspect(image)
    error = caught.value
    assert error.method == "GET"
    # The path parameter travels percent-encoded whole (api_path): the path as sent.
    assert error.path == f"/v{engine.api_version}/images/{urllib.parse.quote(image, safe='')}/json"
    assert error.status == 404
    assert "No such image" in error.message
    assert image in error.message
    assert "404" in str(error)
    assert error.path in str(error)


async def test_remove_unknown_container_returns_false(engine: Engine) -> None:
    assert await engine.container_remove("f" * 64) is False
    assert await engine.container_remove("sbxkit-no-such-lease") is False


async def test_concurrent_list_calls(engine: Engine, witness: Witness, busybox: str) -> None:
    """20 list calls at once, each filtered to one lease (other users of the daemon may be
    creating containers meanwhile, so only a filtered answer is predictable)."""
    lease = new_lease_id()
    body = build_create_body(sandbox_spec(busybox, ["true"]), lease)
    container_id = await engine.container_create(body, name=container_name(lease))
    try:
        results: list[list[str]] = []

        async def one() -> None:
            listed = await engine.container_list(label=f"{LEASE_LABEL}={lease}")
            results.append([c.id for c in listed])

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(one)
        assert results == [[container_id]] * 20
    finally:
        with trio.CancelScope(shield=True):
            await engine.container_remove(container_id)


async def test_list_filters_by_label(engine: Engine, witness: Witness, busybox: str) -> None:
    lease = new_lease_id()
    body = build_create_body(sandbox_spec(busybox, ["true"]), lease)
    container_id = await engine.container_create(body, name=container_name(lease))
    try:
        found = await engine.container_list(label=f"{LEASE_LABEL}={lease}")
        assert [c.id for c in found] == [container_id]
        assert found[0].names == [f"/{container_name(lease)}"]
        assert found[0].labels is not None
        assert found[0].labels[LEASE_LABEL] == lease
        assert found[0].state == "created"
        assert await engine.container_list(label=f"{LEASE_LABEL}={new_lease_id()}") == []
    finally:
        with trio.CancelScope(shield=True):
            assert await engine.container_remove(container_id) is True
    assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []


# -- connection pool, through the proxy -------------------------------------------------------


async def test_pooled_connection_is_reused(
    witness: Witness, tmp_path: Path, engine_facts: EngineFacts
) -> None:
    async with running_proxy(witness, tmp_path) as proxy, open_engine(proxy.path) as engine:
        before = proxy.accepted  # the ping used its own connection
        fds_before = len(os.listdir("/proc/self/fd"))
        for _ in range(50):
            version = await engine.version()
            assert version.api_version == engine_facts.api_version
        opened = proxy.accepted - before
        assert opened == 1, f"50 sequential calls opened {opened} connections"
        # Our own process did not accumulate sockets either (a leak would show 50 more).
        assert len(os.listdir("/proc/self/fd")) - fds_before < 10


async def test_idle_connection_closed_by_peer_is_not_reused(
    witness: Witness, tmp_path: Path, engine_facts: EngineFacts
) -> None:
    async with running_proxy(witness, tmp_path) as proxy, open_engine(proxy.path) as engine:
        await engine.version()
        pooled = proxy.accepted
        await proxy.drop_all()  # the pooled connection is now closed on the far side
        assert proxy._live == {}
        version = await engine.version()  # must not be sent into the dead socket
        assert version.api_version == engine_facts.api_version
        assert proxy.accepted == pooled + 1
        # And the fresh connection is pooled in turn.
        await engine.version()
        assert proxy.accepted == pooled + 1


async def test_stalled_daemon_raises_engine_timeout(
    witness: Witness, tmp_path: Path, engine_facts: EngineFacts
) -> None:
    deadlines = Deadlines(ping=5.0, inspect=0.5)
    async with (
        running_proxy(witness, tmp_path) as proxy,
        open_engine(proxy.path, deadlines=deadlines) as engine,
    ):
        proxy.stall = True  # accept, never answer
        t0 = time.monotonic()
        with pytest.raises(EngineTimeout) as caught:
            await engine.image_inspect("sbxkit-test/busybox:latest")
        elapsed = time.monotonic() - t0
        assert 0.45 <= elapsed < 3.0
        error = caught.value
        assert error.method == "GET"
        path = f"/v{engine_facts.api_version}/images/sbxkit-test%2Fbusybox%3Alatest/json"
        assert error.path == path
        assert error.seconds == 0.5
        assert f"GET {path}" in str(error)
        assert "0.5 s" in str(error)
        # The stalled connection was not pooled: once the daemon answers again, calls work.
        proxy.stall = False
        await proxy.drop_all()
        assert (await engine.version()).api_version == engine_facts.api_version


# -- attach hijack ----------------------------------------------------------------------------


def sandbox_spec(image: str, command: list[str]) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=command,
        limits=Limits(cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=30),
    )


def demux(data: bytes) -> dict[int, bytes]:
    """Docker's 8-byte-header framing, parsed independently of sbxkit's demuxer."""
    out: dict[int, bytes] = {}
    offset = 0
    while offset < len(data):
        stream_id, size = struct.unpack(">BxxxI", data[offset : offset + 8])
        payload = data[offset + 8 : offset + 8 + size]
        assert len(payload) == size, f"truncated frame at byte {offset}"
        out[stream_id] = out.get(stream_id, b"") + payload
        offset += 8 + size
    return out


async def read_to_eof(stream: HijackedStream) -> bytes:
    parts: list[bytes] = []
    while chunk := await stream.receive_some():
        parts.append(chunk)
    return b"".join(parts)


async def test_attach_replays_bytes_sent_with_the_101_head(
    witness: Witness, tmp_path: Path, busybox: str, engine: Engine
) -> None:
    """The proxy holds the daemon's ``101`` until the payload's first output arrives and sends
    both in one write, so h11 reads the output as part of the response: it must be replayed."""
    line = b"KNOWN-LINE 0123456789\n"
    lease = new_lease_id()
    body = build_create_body(sandbox_spec(busybox, ["echo", line.decode().strip()]), lease)
    container_id = await engine.container_create(body, name=container_name(lease))
    try:
        async with running_proxy(witness, tmp_path) as proxy, open_engine(proxy.path) as proxied:
            proxy.coalesce_upgrade = True
            with trio.fail_after(15):
                async with trio.open_nursery() as nursery:
                    attached: list[HijackedStream] = []

                    async def attach() -> None:
                        attached.append(await proxied.container_attach(container_id, stdin=False))

                    nursery.start_soon(attach)
                    # The daemon sent 101, so it is attached; the proxy still holds the head.
                    await proxy.upgrade_seen.wait()
                    assert not attached
                    await engine.container_start(container_id)
                stream = attached[0]
                try:
                    output = await read_to_eof(stream)
                finally:
                    await stream.aclose()
            assert proxy.coalesced_trailing
            assert proxy.coalesced_trailing[0] > 0
        assert demux(output) == {1: line}
    finally:
        with trio.CancelScope(shield=True):
            await engine.container_remove(container_id)


async def test_cached_info_reuses_a_recent_answer_and_refreshes_an_old_one(engine: Engine) -> None:
    first = await engine.cached_info()
    assert await engine.cached_info() is first  # within the window: no second /info call
    fresh = await engine.cached_info(max_age_s=0.0)
    assert fresh is not first
    assert "runc" in (fresh.runtimes or {})


async def test_a_redirect_from_the_daemon_is_an_error_not_a_reply(engine: Engine) -> None:
    """The daemon's router cleans ``//`` in a path and answers 301 to another URL; taken for
    success, the redirect's body was decoded as an image ("malformed reply")."""
    with pytest.raises(EngineProtocolError) as caught:
        await engine.image_inspect("hidden//busybox:1")
    assert "redirected (301)" in str(caught.value)
    assert (await engine.version()).api_version  # the connection pool is still usable
