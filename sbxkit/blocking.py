"""sbxkit for scripts and notebooks: the same runs and sandboxes, as plain blocking calls.

    import sbxkit.blocking

    result = sbxkit.blocking.run(spec, stdin=b"hello")
    results = sbxkit.blocking.run_many(jobs, parallel=8)
    with sbxkit.blocking.open_sandbox(spec) as sandbox:
        sandbox.put_files({"in.txt": b"3 4\\n"})
        print(sandbox.exec(["wc", "-w", "/tmp/in.txt"]).stdout)
        shell = sandbox.start(["sh"])           # a background process
        shell.write(b"echo hi\\n")
        print(shell.read(0, wait=5))           # (b'hi\\n', 3, False)

Each call runs sbxkit's trio code in a worker thread (``sbxkit._util.portal``), so it works from any
thread, with or without an event loop running (Jupyter included). Ctrl-C while a call waits
cancels it: the sandbox is removed, then a plain ``KeyboardInterrupt`` is raised (pressing it
again waits for the same removal). Leaving a ``with open_sandbox`` block — normally or by an
exception — removes the container before the block's exception (or nothing) propagates.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
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

H = TypeVar("H")
W = TypeVar("W")

__all__ = [
    "BlockingInterpreter",
    "BlockingProcess",
    "BlockingSandbox",
    "attach_sandbox",
    "open_interpreter",
    "open_sandbox",
    "run",
    "run_many",
]


def run(spec: SandboxSpec, stdin: bytes | None = None, **options: Any) -> RunResult:
    """``sbxkit.run`` as a blocking call; ``options`` are its keyword arguments."""
    with Portal() as portal:
        return portal.call(functools.partial(oneshot.run, spec, stdin, **options))


def run_many(jobs: Sequence[Job], **options: Any) -> list[JobResult]:
    """``sbxkit.run_many`` as a blocking call; ``options`` are its keyword arguments."""
    with Portal() as portal:
        return portal.call(functools.partial(_run_many, jobs, **options))


class BlockingSandbox(HeldSandbox):
    """A long-lived sandbox driven from blocking code (see ``sbxkit.Sandbox``)."""

    def exec(self, argv: Sequence[str], stdin: bytes | None = None, **options: Any) -> RunResult:
        """``Sandbox.exec``: the exec's process group dies on timeout, overflow or Ctrl-C."""
        return self._portal.call(functools.partial(self._sandbox.exec, argv, stdin, **options))

    def ports(self) -> tuple[PortForward, ...]:
        """``Sandbox.ports``: its inbound ports as the host reaches them."""
        return self._portal.call(self._sandbox.ports)

    def put_files(self, files: Mapping[str, bytes], dest_dir: str = ".", **options: Any) -> None:
        """``Sandbox.put_files``: write files under the file root (``/tmp`` by default)."""
        self._portal.call(functools.partial(self._sandbox.put_files, files, dest_dir, **options))

    def get_files(self, paths: Sequence[str], **options: Any) -> dict[str, bytes]:
        """``Sandbox.get_files``: read regular files back."""
        return self._portal.call(functools.partial(self._sandbox.get_files, paths, **options))

    def put_dir(self, local_dir: str | os.PathLike[str], dest: str, **options: Any) -> None:
        """``Sandbox.put_dir``: copy a host directory tree into the sandbox, streamed."""
        self._portal.call(functools.partial(self._sandbox.put_dir, local_dir, dest, **options))

    def get_dir(self, src: str, local_dir: str | os.PathLike[str], **options: Any) -> None:
        """``Sandbox.get_dir``: copy a sandbox directory tree into a new or empty host one."""
        self._portal.call(functools.partial(self._sandbox.get_dir, src, local_dir, **options))

    def detach(self, keep_s: float) -> SandboxHandle:
        """``Sandbox.detach``: the supervisor keeps the sandbox past the block for at most
        ``keep_s`` seconds; ``attach_sandbox(handle)`` continues it, once."""
        return self._portal.call(functools.partial(self._sandbox.detach, keep_s))

    def start(self, argv: Sequence[str], **options: Any) -> BlockingProcess:
        """``Sandbox.start``: a background process, ended at the latest with the block."""
        process = self._portal.call(functools.partial(self._sandbox.start, argv, **options))
        return BlockingProcess(self._portal, process)

    def metrics(self, interval_s: float = DEFAULT_INTERVAL_S) -> Iterator[Metrics]:
        """``Sandbox.metrics``: a reading from the sandbox's cgroup on the host every
        ``interval_s`` seconds, until the sandbox is gone."""
        interval_s = check_interval(interval_s)
        reader = self._portal.call(self._sandbox.metrics_reader)
        while (sample := reader.read()) is not None:
            yield sample
            time.sleep(interval_s)


class BlockingProcess(HeldProcess):
    """A background process driven from blocking code (see ``sbxkit.Process``)."""

    def write(self, data: bytes) -> None:
        self._portal.call(self._process.write, data)

    def close_stdin(self) -> None:
        self._portal.call(self._process.close_stdin)

    def read(self, cursor: int = 0, **options: Any) -> tuple[bytes, int, bool]:
        """``Process.read``: ``(output from cursor, next cursor, done)``."""
        return self._portal.call(functools.partial(self._process.read, cursor, **options))

    def wait(self, timeout: float | None = None) -> ProcessExit:
        return self._portal.call(self._process.wait, timeout)

    def signal(self, sig: int | str) -> None:
        self._portal.call(self._process.signal, sig)

    def kill(self) -> ProcessExit:
        return self._portal.call(self._process.kill)

    def resize(self, rows: int, columns: int) -> None:
        self._portal.call(self._process.resize, rows, columns)


@contextmanager
def open_sandbox(spec: SandboxSpec, **options: Any) -> Iterator[BlockingSandbox]:
    """``sbxkit.open_sandbox`` as a ``with`` block; ``options`` are its keyword arguments.

    The sandbox lives in a trio task in the portal's thread; leaving the block ends that task,
    which removes the container (through the supervisor by default) before the block's
    exception propagates. What ended the sandbox itself (``SandboxExpired``, ``CleanupError``)
    is raised after a normal exit, or chained over the block's exception.
    """
    with _held(lambda: session.open_sandbox(spec, **options), BlockingSandbox) as sandbox:
        yield sandbox


class BlockingInterpreter(HeldInterpreter):
    """An interpreter session driven from plain Python (see ``sbxkit.Interpreter``). An
    ``on_output`` callback runs in sbxkit's trio thread."""

    def run_code(self, code: str, **options: Any) -> CodeResult:
        """``Interpreter.run_code``: ``options`` are its keyword arguments."""
        return self._portal.call(functools.partial(self._interpreter.run_code, code, **options))

    def restart(self) -> None:
        """``Interpreter.restart``: a fresh interpreter, its state gone."""
        self._portal.call(self._interpreter.restart)


@contextmanager
def open_interpreter(spec: SandboxSpec, **options: Any) -> Iterator[BlockingInterpreter]:
    """``sbxkit.open_interpreter`` as a ``with`` block; ``options`` are its keyword arguments.
    The sandbox is held and removed as ``open_sandbox``'s is."""
    opener = lambda: interpreter.open_interpreter(spec, **options)  # noqa: E731
    with _held(opener, BlockingInterpreter) as held:
        yield held


@contextmanager
def attach_sandbox(handle: SandboxHandle) -> Iterator[BlockingSandbox]:
    """``sbxkit.attach_sandbox`` as a ``with`` block: a detached sandbox continued here; the
    block's end removes it, as ``open_sandbox``'s does."""
    with _held(lambda: reattach.attach_sandbox(handle), BlockingSandbox) as sandbox:
        yield sandbox


@contextmanager
def _held(
    opener: Callable[[], AbstractAsyncContextManager[H]],
    wrap: Callable[[Portal, H], W],
) -> Iterator[W]:
    opened = threading.Event()
    release = trio.Event()
    held: list[H] = []

    async def hold() -> None:
        try:
            async with opener() as sandbox:
                held.append(sandbox)
                opened.set()
                await release.wait()
        finally:
            opened.set()  # wakes the opener if the sandbox never opened

    with Portal() as portal:
        holding = portal.submit(hold)
        try:
            opened.wait()
        except BaseException:
            holding.cancel()
            holding.wait()
            raise
        if not held:
            holding.wait()
            holding.result()  # raises why it did not open
        try:
            yield wrap(portal, held[0])
        except BaseException as exc:
            portal.run_sync(release.set)
            holding.wait()
            if holding.error is not None:
                raise holding.error from exc
            raise
        portal.run_sync(release.set)
        holding.wait()
        holding.result()
