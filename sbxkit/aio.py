"""sbxkit for asyncio callers: await a sandboxed run, or hold a sandbox, from asyncio code.

    import asyncio, sbxkit.aio

    async def main() -> None:
        task = asyncio.create_task(sbxkit.aio.run(spec))
        ...
        task.cancel()          # the container is removed before the task finishes cancelling

        async with sbxkit.aio.open_sandbox(spec) as sandbox:
            print((await sandbox.exec(["echo", "hi"])).stdout)
            shell = await sandbox.start(["sh"])
            await shell.write(b"echo hi\\n")
            print(await shell.read(0, wait=5))          # (b'hi\\n', 3, False)

    asyncio.run(main())

sbxkit is trio code. Calling it as ``asyncio.to_thread(trio.run, sbxkit.run, spec)`` works but
leaks the sandbox's lifetime: cancelling the asyncio task abandons the thread, and the container
runs on until its payload ends. Here each call runs in a trio thread (``sbxkit._util.portal``), and
cancelling the awaiting task cancels the trio call and waits for its cleanup — the container's
removal — before ``CancelledError`` propagates. ``asyncio.timeout`` works the same way.

``open_sandbox`` holds the sandbox in a trio task of its own portal for the block (as
``sbxkit.blocking.open_sandbox`` does); each method is one portal call, so cancelling an
awaited ``exec`` kills that exec's process group and leaves the sandbox usable, and leaving
the block however it ends — cancellation included — removes the container before the block's
exception propagates.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import trio

from sbxkit._consumers import interpreter, oneshot, reattach, session
from sbxkit._consumers.facade import HeldInterpreter, HeldProcess, HeldSandbox
from sbxkit._consumers.handle import SandboxHandle
from sbxkit._consumers.harness import Job, JobResult
from sbxkit._consumers.harness import run_many as _harness_run_many
from sbxkit._consumers.interp_frames import CodeResult
from sbxkit._consumers.process_log import ProcessExit
from sbxkit._lifecycle.metrics import DEFAULT_INTERVAL_S, check_interval
from sbxkit._model.network_ports import PortForward
from sbxkit._model.result import Metrics, RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._util.portal import Portal
from sbxkit._util.unwrap import plain_async

_run_many = plain_async(_harness_run_many)

__all__ = [
    "AioInterpreter",
    "AioProcess",
    "AioSandbox",
    "attach_sandbox",
    "call",
    "open_interpreter",
    "open_sandbox",
    "run",
    "run_many",
]

T = TypeVar("T")
H = TypeVar("H")
W = TypeVar("W")


async def call(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` where ``fn`` is trio code (any sbxkit coroutine function, or your
    own that uses ``sbxkit.open_sandbox``); cancellation reaches it as trio cancellation."""
    with Portal() as portal:
        return await portal.acall(fn, *args)


async def run(spec: SandboxSpec, stdin: bytes | None = None, **options: Any) -> RunResult:
    """``sbxkit.run`` for asyncio; ``options`` are its keyword arguments."""
    return await call(functools.partial(oneshot.run, spec, stdin, **options))


async def run_many(jobs: Sequence[Job], **options: Any) -> list[JobResult]:
    """``sbxkit.run_many`` for asyncio; ``options`` are its keyword arguments."""
    return await call(functools.partial(_run_many, jobs, **options))


class AioSandbox(HeldSandbox):
    """A long-lived sandbox driven from asyncio (see ``sbxkit.Sandbox``); every method runs in
    the portal's trio thread, and cancelling one cancels it there."""

    @property
    def user(self) -> str:
        """``UID:GID`` every command in it runs as."""
        return self._sandbox.user

    @property
    def usable(self) -> bool:
        """False once the sandbox closed, expired or was detached."""
        return self._sandbox._unusable is None

    async def exec(
        self, argv: Sequence[str], stdin: bytes | None = None, **options: Any
    ) -> RunResult:
        """``Sandbox.exec``: the exec's process group dies on timeout, overflow or cancel."""
        return await self._call(self._sandbox.exec, argv, stdin, **options)

    async def ports(self) -> tuple[PortForward, ...]:
        """``Sandbox.ports``: its inbound ports as the host reaches them."""
        return await self._call(self._sandbox.ports)

    async def put_files(
        self, files: Mapping[str, bytes], dest_dir: str = ".", **options: Any
    ) -> None:
        """``Sandbox.put_files``: write files under the file root (``/tmp`` by default)."""
        await self._call(self._sandbox.put_files, files, dest_dir, **options)

    async def get_files(self, paths: Sequence[str], **options: Any) -> dict[str, bytes]:
        """``Sandbox.get_files``: read regular files back."""
        return await self._call(self._sandbox.get_files, paths, **options)

    async def put_dir(self, local_dir: str | os.PathLike[str], dest: str, **options: Any) -> None:
        """``Sandbox.put_dir``: copy a host directory tree into the sandbox, streamed."""
        await self._call(self._sandbox.put_dir, local_dir, dest, **options)

    async def get_dir(self, src: str, local_dir: str | os.PathLike[str], **options: Any) -> None:
        """``Sandbox.get_dir``: copy a sandbox directory tree into a new or empty host one."""
        await self._call(self._sandbox.get_dir, src, local_dir, **options)

    async def start(self, argv: Sequence[str], **options: Any) -> AioProcess:
        """``Sandbox.start``: a background process, ended at the latest with the block."""
        process = await self._call(self._sandbox.start, argv, **options)
        return AioProcess(self._portal, process)

    async def detach(self, keep_s: float) -> SandboxHandle:
        """``Sandbox.detach``: the supervisor keeps the sandbox past the block for at most
        ``keep_s`` seconds; ``attach_sandbox(handle)`` continues it, once."""
        return await self._call(self._sandbox.detach, keep_s)

    async def metrics(self, interval_s: float = DEFAULT_INTERVAL_S) -> AsyncIterator[Metrics]:
        """``Sandbox.metrics``: a reading from the sandbox's cgroup on the host every
        ``interval_s`` seconds, until the sandbox is gone."""
        interval_s = check_interval(interval_s)
        reader = await self._call(self._sandbox.metrics_reader)
        while (sample := reader.read()) is not None:
            yield sample
            await asyncio.sleep(interval_s)

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **options: Any) -> T:
        return await self._portal.acall(functools.partial(fn, *args, **options))


class AioProcess(HeldProcess):
    """A background process driven from asyncio (see ``sbxkit.Process``)."""

    async def write(self, data: bytes) -> None:
        await self._portal.acall(self._process.write, data)

    async def close_stdin(self) -> None:
        await self._portal.acall(self._process.close_stdin)

    async def read(self, cursor: int = 0, **options: Any) -> tuple[bytes, int, bool]:
        """``Process.read``: ``(output from cursor, next cursor, done)``."""
        return await self._portal.acall(functools.partial(self._process.read, cursor, **options))

    async def wait(self, timeout: float | None = None) -> ProcessExit:
        """How it ended; cancelling the wait leaves the process running."""
        return await self._portal.acall(self._process.wait, timeout)

    async def signal(self, sig: int | str) -> None:
        await self._portal.acall(self._process.signal, sig)

    async def kill(self) -> ProcessExit:
        return await self._portal.acall(self._process.kill)

    async def resize(self, rows: int, columns: int) -> None:
        await self._portal.acall(self._process.resize, rows, columns)


@asynccontextmanager
async def open_sandbox(spec: SandboxSpec, **options: Any) -> AsyncIterator[AioSandbox]:
    """``sbxkit.open_sandbox`` as an ``async with`` block for asyncio; ``options`` are its
    keyword arguments.

    The sandbox lives in a trio task in the portal's thread until the block ends; leaving the
    block — normally, by an exception, or cancelled — ends that task, which removes the
    container (through the supervisor by default) before anything propagates. Cancelled
    while it opens, it is removed before ``CancelledError`` propagates. What ended the sandbox
    itself (``SandboxExpired``, ``CleanupError``) is raised after a normal exit, or chained
    over the block's exception.
    """
    async with _held(lambda: session.open_sandbox(spec, **options), AioSandbox) as sandbox:
        yield sandbox


class AioInterpreter(HeldInterpreter):
    """An interpreter session driven from asyncio (see ``sbxkit.Interpreter``). An
    ``on_output`` callback runs in sbxkit's trio thread, not in the event loop."""

    async def run_code(self, code: str, **options: Any) -> CodeResult:
        """``Interpreter.run_code``: ``options`` are its keyword arguments."""
        call = functools.partial(self._interpreter.run_code, code, **options)
        return await self._portal.acall(call)

    async def restart(self) -> None:
        """``Interpreter.restart``: a fresh interpreter, its state gone."""
        await self._portal.acall(self._interpreter.restart)


@asynccontextmanager
async def open_interpreter(spec: SandboxSpec, **options: Any) -> AsyncIterator[AioInterpreter]:
    """``sbxkit.open_interpreter`` as an ``async with`` block for asyncio; ``options`` are its
    keyword arguments. The sandbox is held and removed as ``open_sandbox``'s is."""
    opener = lambda: interpreter.open_interpreter(spec, **options)  # noqa: E731
    async with _held(opener, AioInterpreter) as held:
        yield held


@asynccontextmanager
async def attach_sandbox(handle: SandboxHandle) -> AsyncIterator[AioSandbox]:
    """``sbxkit.attach_sandbox`` as an ``async with`` block for asyncio: a detached sandbox
    continued here, once; the block's end removes it, as ``open_sandbox``'s does."""
    async with _held(lambda: reattach.attach_sandbox(handle), AioSandbox) as sandbox:
        yield sandbox


@asynccontextmanager
async def _held(
    opener: Callable[[], AbstractAsyncContextManager[H]],
    wrap: Callable[[Portal, H], W],
) -> AsyncIterator[W]:
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[H] = loop.create_future()
    release = trio.Event()

    def hand_over(sandbox: H) -> None:
        if not opened.done():
            opened.set_result(sandbox)

    async def hold() -> None:
        async with opener() as sandbox:
            loop.call_soon_threadsafe(hand_over, sandbox)
            await release.wait()

    with Portal() as portal:
        holder = asyncio.ensure_future(portal.acall(hold))
        either: set[asyncio.Future[Any]] = {holder, opened}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while opening: remove it first
            holder.cancel()
            await _finish(holder)
            raise
        if not opened.done():
            holder.result()  # raises why it did not open
            raise AssertionError("the sandbox's holder ended before it opened")
        try:
            yield wrap(portal, opened.result())
        except BaseException as exc:
            portal.run_sync(release.set)
            await _finish(holder)
            error = holder.exception() if not holder.cancelled() else None
            if error is not None:
                raise error from exc
            raise
        portal.run_sync(release.set)
        await _finish(holder)
        holder.result()


async def _finish(holder: asyncio.Future[None]) -> None:
    """Wait for the holder's end — the container's removal — even when cancelled meanwhile
    (again and again): cleanup first, then the cancellation goes on."""
    cancelled = False
    while not holder.done():
        try:
            await asyncio.shield(holder)
        except asyncio.CancelledError:
            if not holder.done():
                cancelled = True
        except BaseException:
            break  # the holder's own failure: the caller reads it from the future
    if cancelled:
        raise asyncio.CancelledError
