"""PTY sessions: a sandboxed process on a terminal, as a trio byte stream.

``open_pty`` creates the hardened body of a one-shot run with two fields changed — ``Tty=true``
and ``StdinOnce=false`` (``msgspec.structs.replace``; the post-create verification still runs
against that body) — attaches before start (a TTY's stream is raw: no frame headers), registers
the exit wait, starts, and applies the initial terminal size with ``/containers/{id}/resize``.

Limits, as for every sandbox: the owner's lifetime deadline and the session's time limit are
``spec.limits.timeout_s`` (reading or waiting past it kills the process: ``timed_out``), and
the terminal's output is capped at ``spec.limits.output_bytes`` for the whole session (exactly
N bytes are delivered; byte N + 1 kills the process: ``output_exceeded``). However the block
ends — the process exiting, EOF, an error, cancellation — the container is removed through the
owner (the supervisor by default) before ``open_pty`` returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Unpack

import trio

from sbxkit._consumers.session import OwnedView
from sbxkit._lifecycle.owned import ContainerProcess, OwnedContainer, SandboxExit, attached
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.public import publish
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerOptions, docker_backend
from sbxkit.engine.execapi import container_resize
from sbxkit.engine.transport import READ_CHUNK, HijackedStream
from sbxkit.errors import SbxError

__all__ = ["PtySession", "open_pty"]


class PtySession(OwnedView, trio.abc.Stream):
    """The terminal of a sandboxed process: ``send_all`` types, ``receive_some`` reads the
    screen bytes (``b""`` once the process ended or was ended), ``resize`` and ``wait``.

    One task may receive while another sends. Errors are ``SbxError``s, except trio's own
    ``BusyResourceError``/``ClosedResourceError`` for misuse of the stream contract.
    """

    def __init__(self, box: OwnedContainer, attach: HijackedStream, process: ContainerProcess):
        self._box = box
        self._attach = attach
        self._process = process
        self._delivered = 0
        self._eof = False
        self._closed = False
        self._receiving = False
        self._sending = False

    def _check(self, busy: bool) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the PTY session was closed")
        if busy:
            raise trio.BusyResourceError("another task is using this direction of the PTY")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        self._check(self._receiving)
        if self._eof:
            await trio.lowlevel.checkpoint()
            return b""
        self._receiving = True
        try:
            data = b""
            with trio.move_on_at(self._box.deadline):
                data = await self._attach.receive_some(max_bytes or READ_CHUNK)
                if not data:
                    self._eof = True
                    return b""
            if not data:  # the time limit passed while reading
                await self._process.end("timed_out")
                self._eof = True
                return b""
            room = self._box.output_bytes - self._delivered
            if len(data) > room:
                data = data[:room]
                await self._process.end("output_exceeded")
                self._eof = True
            self._delivered += len(data)
            return data
        finally:
            self._receiving = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._check(self._sending)
        self._sending = True
        try:
            if trio.current_time() >= self._box.deadline:
                await self._process.end("timed_out")
            await self._attach.send_all(bytes(data))
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def resize(self, rows: int, columns: int) -> None:
        """Set the remote terminal's size (``SIGWINCH`` reaches the process). After EOF there
        is no terminal left: a no-op."""
        if self._eof:
            await trio.lowlevel.checkpoint()
            return
        await container_resize(self._box.engine, self._box.container_id, rows, columns)

    async def wait(self) -> SandboxExit:
        """How the process ended (killing it at the time limit)."""
        verdict, exit_code = await self._process.wait()
        return SandboxExit(
            status=verdict.status,
            exit_code=exit_code,
            oom_evidence=verdict.oom_evidence,
            kill_evidence=verdict.kill_evidence,
        )

    async def aclose(self) -> None:
        """Close the terminal connection (the container is removed when the block ends)."""
        self._closed = True
        await self._attach.aclose()


@asynccontextmanager
async def open_pty(
    spec: SandboxSpec | CheckedSpec,
    *,
    size: tuple[int, int] | None = None,
    backend: Backend | None = None,
    **docker: Unpack[DockerOptions],
) -> AsyncIterator[PtySession]:
    """Run ``spec.command`` on a terminal of ``size`` (rows, columns) in a fresh sandbox,
    removed through its owner however the block ends (a removal failure raises
    ``CleanupError``). It runs where ``backend`` or the Docker keywords say, as for ``run``;
    the sbx runtime refuses PTYs before anything is created."""
    chosen = docker_backend(backend, **docker)
    async with (
        chosen.own(spec, "pty", body_overrides={"tty": True, "stdin_once": False}) as box,
        attached(box) as (attach, waiter),
    ):
        session = PtySession(box, attach, ContainerProcess(box, waiter))
        if size is not None:
            # A process that already exited has no terminal to resize; anything else the
            # caller sees at its next read.
            with contextlib.suppress(SbxError):
                await session.resize(*size)
        yield session


publish(__name__, globals())  # public names show as sbxkit.NAME
