"""Stdio workers: a long-lived sandboxed process speaking over its stdin and stdout.

For MCP servers, parsers, language servers: the host application gets the worker's stdout as
a ``trio.abc.ReceiveStream`` and its stdin as a ``trio.abc.SendStream`` with ``send_eof``.
Attach is non-TTY and happens before start (nothing is lost); the multiplexed stream is
demultiplexed as it is read, stdout going to the application and stderr into a capped buffer.

Limits, as for every sandbox: ``spec.limits.timeout_s`` is the worker's whole life (the owner's
lifetime deadline; reading or waiting past it kills the worker: ``timed_out``), and
``spec.limits.output_bytes`` caps stdout and stderr each over that life — exactly N bytes
pass, byte N + 1 kills the worker (``output_exceeded``). However the block ends, the container
is removed through the owner (the supervisor by default) before ``open_stdio_worker`` returns.

Read stdout to EOF before ``wait()``: as with a subprocess pipe, a worker whose output nobody
reads blocks on its next write (stderr travels on the same connection).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Unpack

import trio

from sbxkit._consumers.session import OwnedView
from sbxkit._lifecycle.output import CappedBuffer
from sbxkit._lifecycle.owned import ContainerProcess, OwnedContainer, SandboxExit, attached
from sbxkit._model.result import Status, Stream
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.public import publish
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerOptions, docker_backend
from sbxkit.engine.frames import STDIN, STDOUT, Demuxer
from sbxkit.engine.transport import READ_CHUNK, HijackedStream

__all__ = ["StdioWorker", "WorkerStdin", "WorkerStdout", "open_stdio_worker"]


class _Channel:
    """The shared attach connection: demuxing, caps, the time limit."""

    def __init__(self, box: OwnedContainer, attach: HijackedStream, process: ContainerProcess):
        self.box = box
        self.attach = attach
        self.process = process
        self.demuxer = Demuxer()
        self.pending: list[bytes] = []
        self.stdout_seen = 0
        self.stderr = CappedBuffer(box.output_bytes)
        self.overflowed: Stream | None = None
        self.eof = False

    async def _end(self, status: Status, stream: Stream | None = None) -> None:
        if stream is not None and self.overflowed is None:
            self.overflowed = stream
        await self.process.end(status)
        self.eof = True

    async def fill(self, max_bytes: int) -> None:
        """Read until some stdout is pending or the stream ended."""
        while not self.pending and not self.eof:
            chunk = b""
            with trio.move_on_at(self.box.deadline):
                chunk = await self.attach.receive_some(max(max_bytes, READ_CHUNK))
                if not chunk:
                    self.demuxer.close()
                    self.eof = True
                    return
            if not chunk:
                await self._end("timed_out")
                return
            for stream_id, data in self.demuxer.feed(chunk):
                if stream_id in (STDOUT, STDIN):
                    room = self.box.output_bytes - self.stdout_seen
                    if len(data) > room:
                        if room:
                            self.pending.append(data[:room])
                        self.stdout_seen += room
                        await self._end("output_exceeded", "stdout")
                        return
                    self.stdout_seen += len(data)
                    self.pending.append(data)
                elif self.stderr.add(data):
                    await self._end("output_exceeded", "stderr")
                    return


class WorkerStdout(trio.abc.ReceiveStream):
    """The worker's standard output; ``b""`` once it ended (or was ended: see ``wait``)."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._busy = False
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the worker's stdout was closed")
        if self._busy:
            raise trio.BusyResourceError("another task is reading the worker's stdout")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        self._busy = True
        try:
            channel = self._channel
            await channel.fill(max_bytes or READ_CHUNK)
            if not channel.pending:
                await trio.lowlevel.checkpoint()
                return b""
            data = channel.pending.pop(0)
            if max_bytes is not None and len(data) > max_bytes:
                channel.pending.insert(0, data[max_bytes:])
                data = data[:max_bytes]
            return data
        finally:
            self._busy = False

    async def aclose(self) -> None:
        self._closed = True
        await trio.lowlevel.checkpoint()


class WorkerStdin(trio.abc.SendStream):
    """The worker's standard input. ``send_eof`` (or ``aclose``) closes it: the worker reads
    EOF while its stdout stays readable."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._busy = False
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the worker's stdin was closed")
        if self._busy:
            raise trio.BusyResourceError("another task is writing the worker's stdin")
        self._busy = True
        try:
            if trio.current_time() >= self._channel.box.deadline:
                await self._channel.process.end("timed_out")
            await self._channel.attach.send_all(bytes(data))
        finally:
            self._busy = False

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        await self._channel.attach.send_eof()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        await self.send_eof()


class StdioWorker(OwnedView):
    """A running stdio worker: ``stdin``, ``stdout``, ``stderr`` (captured) and ``wait``."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._box = channel.box
        self.stdin = WorkerStdin(channel)
        self.stdout = WorkerStdout(channel)

    @property
    def stderr(self) -> bytes:
        """Standard error received so far (the first ``output_bytes``)."""
        return self._channel.stderr.value()

    async def wait(self) -> SandboxExit:
        """How the worker ended (killing it at the time limit). Read stdout to EOF first."""
        verdict, exit_code = await self._channel.process.wait()
        return SandboxExit(
            status=verdict.status,
            exit_code=exit_code,
            stderr=self.stderr,
            overflowed=self._channel.overflowed,
            oom_evidence=verdict.oom_evidence,
            kill_evidence=verdict.kill_evidence,
        )


@asynccontextmanager
async def open_stdio_worker(
    spec: SandboxSpec | CheckedSpec,
    *,
    backend: Backend | None = None,
    **docker: Unpack[DockerOptions],
) -> AsyncIterator[StdioWorker]:
    """Start ``spec.command`` in a fresh sandbox with its stdin and stdout connected to the
    caller. Removal, placement and refusal as for ``open_pty``."""
    chosen = docker_backend(backend, **docker)
    async with chosen.own(spec, "stdio") as box, attached(box) as (attach, waiter):
        yield StdioWorker(_Channel(box, attach, ContainerProcess(box, waiter)))


publish(__name__, globals())  # public names show as sbxkit.NAME
