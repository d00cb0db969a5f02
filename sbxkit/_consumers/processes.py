"""Background processes in a session: ``Sandbox.start`` → a ``Process`` that keeps running.

Each process is one Docker exec under the session's exec wrapper (``RUN_SCRIPT``: its own
process group, recorded by a token, killed from inside by ``KILL_SCRIPT``, as for
``Sandbox.exec``). One trio task per process, in a nursery that lives as long as the
``open_sandbox`` block, reads its stream into an ``OutputLog`` while the caller writes stdin,
reads by cursor, signals and waits from any task.

Output. stdout and stderr are merged into one stream, in the order the daemon's frames
arrive (with ``pty=True`` the terminal has only one anyway): what a shell tool shows an agent.
Each stream keeps its own order; across the two, lines written within a few milliseconds of
each other can arrive swapped (the daemon copies the two pipes in separate goroutines).
The log keeps every byte up to ``max_output`` (default: the spec's ``output_bytes``) so any
cursor can be read again; byte ``max_output + 1`` kills the process's group:
``output_exceeded``, with exactly ``max_output`` bytes readable. Unlike ``exec``, whose cap is
per stream, this cap is on the merged total.

Endings, judged as for ``exec``: ``exited`` (its own code; a signal exit is ``oom_killed`` or
``killed`` only on the daemon's evidence), ``timed_out`` (``timeout`` from start, default the
spec's ``timeout_s``), ``output_exceeded``, and ``killed`` for sbxkit's own kills on the
caller's request: ``Process.kill()``, and a ``Process.signal(N)`` after which the process
exited with status 128 + N (``kill_evidence`` names the signal); a process that handled the
signal and exited by itself reports its own code. A process still running when the session
ends is ``killed`` with ``kill_evidence`` "the session closed": removing the container kills
it, and its task ends first (nothing is left reading).

Bounds: each process by its time limit and output cap; each session by ``max_processes``
live processes (default 16), beyond which ``start`` raises ``TooManyProcesses`` before
anything reaches the daemon. An ended process leaves the session's table (the caller's handle
keeps its output).
"""

from __future__ import annotations

import contextlib
import math
import secrets
import signal as signals
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

import trio

from sbxkit._consumers.exec_scripts import NO_GROUP_STATUS, SIGNAL_SCRIPT, wrapped_exec
from sbxkit._consumers.process_log import (
    DEFAULT_MAX_PROCESSES,
    DEFAULT_READ_BYTES,
    OutputLog,
    ProcessExit,
    check_max_processes,
    check_read,
    check_seconds,
    check_signal,
    check_terminal_size,
)
from sbxkit._lifecycle.outcome import SIGNAL_EXIT_BASE, Verdict, judge_exit
from sbxkit._lifecycle.owned import KILL_BUDGET_S, OwnedContainer
from sbxkit._model.call_checks import check_argv
from sbxkit._model.network_terms import spec_owned_keys
from sbxkit._model.result import RunResult, Status
from sbxkit._model.rules import merge_env, runtime_env
from sbxkit._model.spec import check_limit, validate_workdir
from sbxkit._util.public import publish
from sbxkit.engine.execapi import exec_create, exec_resize, exec_start
from sbxkit.engine.frames import STDOUT, Demuxer
from sbxkit.engine.transport import READ_CHUNK, HijackedStream
from sbxkit.errors import (
    Conflict,
    EngineConnectionError,
    NotFound,
    ProcessError,
    ProcessStillRunning,
    SandboxUnusable,
    SbxError,
    SpecError,
    TooManyProcesses,
)

__all__ = ["Process", "ProcessTable", "running", "start_process"]

SIGNAL_WAIT_S = 2.0
"""How long ``signal`` retries while a just-started process has not yet recorded its group."""
END_WAIT_S = 10.0
"""How long ``kill`` waits for its task to confirm the end (the kill itself is bounded)."""


class Host(Protocol):
    """What a process needs of its ``Sandbox`` (sbxkit/_consumers/session.py; no import cycle)."""

    _box: OwnedContainer
    _unusable: str | None
    processes: ProcessTable

    @property
    def container_id(self) -> str: ...

    @property
    def lease(self) -> str: ...

    def _check_usable(self) -> None: ...

    async def _end_group(self, token: str, stream: HijackedStream | None) -> None: ...

    async def _exit_code(self, exec_id: str) -> int: ...

    async def _run(
        self, argv: list[str], stdin: bytes | None, timeout: float, max_output: int
    ) -> RunResult: ...


# --- the process ---------------------------------------------------------------------------


class Process:
    """A background process in an open sandbox (``Sandbox.start``). Use it only inside the
    sandbox's block; any task may write, read, signal or wait."""

    def __init__(
        self,
        sandbox: Host,
        *,
        token: str,
        exec_id: str,
        stream: HijackedStream,
        pty: bool,
        stdin: bool,
        max_output: int,
        deadline: float,
        began: float,
        on_end: Callable[[str], object],
        tap: Callable[[int, bytes], object] | None = None,
    ) -> None:
        self.id = "p" + token
        self._tap = tap  # takes the output instead of the log (the interpreter's frames)
        self._on_end = on_end
        self.pty = pty
        self._sandbox = sandbox
        self._token = token
        self._exec_id = exec_id
        self._stream = stream
        self._stdin_open = stdin
        self._log = OutputLog(max_output)
        self._changed = trio.Event()
        self._done = trio.Event()
        self._exit: ProcessExit | None = None
        self._error: SbxError | None = None
        self._write_lock = trio.Lock()
        self._signalled: set[int] = set()
        self._kill_asked = False
        self._scope = trio.CancelScope(deadline=deadline)
        self._began = began  # unix seconds, the daemon's evidence window
        self._t0 = trio.current_time()

    def __repr__(self) -> str:
        state = "running" if self._exit is None else self._exit.status
        return f"<Process {self.id} {state}>"

    @property
    def exit(self) -> ProcessExit | None:
        """How it ended, or None while it runs."""
        return self._exit

    @property
    def output_bytes(self) -> int:
        """Bytes of output so far: the cursor after everything."""
        return self._log.size

    # -- the caller's side ---------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Send ``data`` to its stdin (the terminal, with ``pty=True``); bounded by its time
        limit. Refused once stdin is closed or the process has ended."""
        if not isinstance(data, bytes | bytearray | memoryview):
            hint = " (encode it, e.g. text.encode())" if isinstance(data, str) else ""
            raise SpecError("data", f"must be bytes, got {type(data).__name__}{hint}")
        async with self._write_lock:
            self._check_writable()
            try:
                with trio.move_on_at(self._scope.deadline) as limit:
                    await self._stream.send_all(bytes(data))
            except EngineConnectionError as exc:
                raise ProcessError(self.id, f"its stdin is gone ({exc.reason})") from None
            if limit.cancelled_caught:
                raise ProcessError(self.id, "its time limit passed while writing to it")

    async def close_stdin(self) -> None:
        """Half-close stdin: the process reads EOF (a no-op once closed or ended)."""
        async with self._write_lock:
            if not self._stdin_open or self._exit is not None:
                await trio.lowlevel.checkpoint()
                return
            self._stdin_open = False
            with contextlib.suppress(EngineConnectionError):
                await self._stream.send_eof()

    def _check_writable(self) -> None:
        if self._exit is not None:
            raise ProcessError(self.id, f"it has ended ({self._exit.status}); nothing reads stdin")
        if not self._stdin_open:
            raise ProcessError(self.id, "its stdin is closed (or was not attached: stdin=False)")

    async def read(
        self, cursor: int = 0, *, max_bytes: int = DEFAULT_READ_BYTES, wait: float = 0.0
    ) -> tuple[bytes, int, bool]:
        """``(output from cursor, next cursor, done)``: at most ``max_bytes``; when nothing is
        new yet, waits up to ``wait`` seconds for more (or the end). ``done`` is True once the
        process ended and everything up to the returned cursor is all there is."""
        check_read(cursor, max_bytes, wait, self._log.size)
        if cursor == self._log.size and self._exit is None and wait > 0:
            with trio.move_on_after(wait):
                while cursor == self._log.size and self._exit is None:
                    await self._changed.wait()
        else:
            await trio.lowlevel.checkpoint()
        self._raise_error()
        data, after = self._log.read(cursor, max_bytes)
        return data, after, self._exit is not None and after == self._log.size

    async def wait(self, timeout: float | None = None) -> ProcessExit:
        """How it ended; waits at most ``timeout`` seconds (None: until it ends, which its own
        time limit bounds), else ``ProcessStillRunning`` (it keeps running)."""
        check_seconds("timeout", timeout, optional=True)
        with trio.move_on_after(math.inf if timeout is None else timeout):
            await self._done.wait()
        self._raise_error()
        if self._exit is None:
            raise ProcessStillRunning(self.id, timeout or 0.0)
        return self._exit

    async def signal(self, sig: int | str) -> None:
        """Send ``sig`` (a number or a name: 15, ``"TERM"``) to its process group. A no-op once
        it ended. If it then exits with status 128 + sig, its status is ``killed``."""
        number = check_signal(sig)
        if self._exit is not None:
            await trio.lowlevel.checkpoint()
            return
        self._signalled.add(number)
        with trio.move_on_after(SIGNAL_WAIT_S):
            while self._exit is None:
                if await _send_signal(self._sandbox, self._token, number):
                    return
                await trio.sleep(0.02)  # the wrapper has not recorded its group yet
        if self._exit is None:
            raise ProcessError(self.id, f"no process group recorded within {SIGNAL_WAIT_S:g} s")

    async def kill(self) -> ProcessExit:
        """Kill its whole process group (``SIGKILL``); its status is ``killed`` unless it had
        already ended. Returns how it ended."""
        if self._exit is None:
            self._kill_asked = True
            self._scope.cancel()
        with trio.move_on_after(END_WAIT_S):
            await self._done.wait()
        return await self.wait(0)

    async def resize(self, rows: int, columns: int) -> None:
        """Set its terminal's size (``pty=True`` only); a no-op once it ended."""
        check_terminal_size(rows, columns)
        if not self.pty:
            raise ProcessError(self.id, "it has no terminal to resize (started with pty=False)")
        if self._exit is not None:
            await trio.lowlevel.checkpoint()
            return
        with contextlib.suppress(NotFound, Conflict):  # it just ended: no terminal left
            await exec_resize(self._sandbox._box.engine, self._exec_id, rows, columns)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise ProcessError(self.id, f"following it failed: {self._error}") from self._error

    # -- its task ------------------------------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def follow(self) -> None:
        """Read its output until it ends or is ended, then judge how (its task's body)."""
        status: Status | None = None
        evidence: str | None = None
        try:
            ended = False
            with self._scope:
                ended = await self._pump()
            if ended:
                status = None  # judged below from its exit code
            elif self._log.overflowed:
                status = "output_exceeded"
            elif self._kill_asked:
                status, evidence = "killed", "sbxkit killed it on the caller's request (kill())"
            else:
                status = "timed_out"
            if not ended:
                with trio.CancelScope(shield=True):
                    await self._sandbox._end_group(self._token, self._stream)
            exit_ = await self._judge(status, evidence)
        except trio.Cancelled:
            # The session is closing: removing its container ends the process.
            self._finish(
                ProcessExit(
                    status="killed",
                    exit_code=None,
                    output_bytes=self._log.size,
                    run_s=trio.current_time() - self._t0,
                    kill_evidence="the session closed",
                )
            )
            raise
        except SbxError as exc:
            self._error = exc
            with trio.CancelScope(shield=True), contextlib.suppress(SbxError):
                await self._sandbox._end_group(self._token, None)
            self._finish(None)
        else:
            self._finish(exit_)
        finally:
            with trio.CancelScope(shield=True):
                await self._stream.aclose()

    def _finish(self, exit_: ProcessExit | None) -> None:
        if self._exit is None:
            self._exit = exit_
        self._on_end(self.id)  # off the session's table before any waiter wakes
        self._done.set()
        self._wake()

    async def _pump(self) -> bool:
        """Keep output until EOF (True) or the first byte past the cap (False)."""
        demuxer = None if self.pty else Demuxer()
        while chunk := await self._stream.receive_some(READ_CHUNK):
            pieces = [(STDOUT, chunk)] if demuxer is None else demuxer.feed(chunk)
            for stream_id, data in pieces:
                if self._tap is not None:  # the tap bounds what it keeps
                    self._tap(stream_id, data)
                    self._wake()
                    continue
                overflowed = self._log.add(data)
                self._wake()
                if overflowed:
                    return False
        if demuxer is not None:
            demuxer.close()
        return True

    async def _judge(self, status: Status | None, evidence: str | None) -> ProcessExit:
        run_s = trio.current_time() - self._t0
        if status is not None:
            return ProcessExit(
                status=status,
                exit_code=None,
                output_bytes=self._log.size,
                run_s=run_s,
                kill_evidence=evidence,
            )
        code = await self._sandbox._exit_code(self._exec_id)
        verdict = Verdict(status="exited")
        signum = code - SIGNAL_EXIT_BASE
        if signum in self._signalled:
            name = signals.Signals(signum).name
            verdict = Verdict(
                status="killed", kill_evidence=f"{name}, sent by sbxkit on the caller's request"
            )
        elif code > SIGNAL_EXIT_BASE:  # an exit of its own stands: no evidence to read
            engine = self._sandbox._box.engine
            container = self._sandbox.container_id
            verdict = await judge_exit(engine, container, code, since=self._began)
        return ProcessExit(
            status=verdict.status,
            exit_code=code if verdict.status == "exited" else None,
            output_bytes=self._log.size,
            run_s=run_s,
            oom_evidence=verdict.oom_evidence,
            kill_evidence=verdict.kill_evidence,
        )


# --- the session's table -------------------------------------------------------------------


class ProcessTable:
    """A session's live background processes (``Sandbox.processes``: iterate it, ``len`` it,
    ``get`` one by id) and the nursery their tasks run in."""

    def __init__(self, limit: int = DEFAULT_MAX_PROCESSES) -> None:
        self.limit = check_max_processes(limit)
        self._live: dict[str, Process] = {}
        self._nursery: trio.Nursery | None = None

    def __iter__(self) -> Iterator[Process]:
        return iter(tuple(self._live.values()))

    def __len__(self) -> int:
        return len(self._live)

    def get(self, process_id: str) -> Process | None:
        """The live process with that id, or None."""
        return self._live.get(process_id)

    async def _start(
        self,
        sandbox: Host,
        argv: list[str],
        *,
        stdin: bool,
        pty: bool,
        env: list[str] | None,
        workdir: str | None,
        max_output: int,
        timeout: float,
        tap: Callable[[int, bytes], object] | None = None,
    ) -> Process:
        """Create and start the exec, hand its stream to a new task; refused beyond the limit
        or outside the sandbox's block. With ``tap``, output goes there, not to the log, as
        ``tap(stream id, bytes)`` (``pty=False`` only: a terminal has one stream)."""
        if self._nursery is None:
            raise SandboxUnusable(sandbox.container_id, "the sandbox's block has ended")
        if len(self._live) >= self.limit:
            raise TooManyProcesses(self.limit)
        sandbox._check_usable()
        engine = sandbox._box.engine
        token = secrets.token_hex(8)
        body = wrapped_exec(
            token, argv, user=sandbox._box.user, stdin=stdin, tty=pty, env=env, workdir=workdir
        )
        began = time.time()  # the daemon stamps its events with this host's clock
        deadline = trio.current_time() + timeout
        try:
            exec_id = await exec_create(engine, sandbox.container_id, body)
        except (NotFound, Conflict) as exc:
            sandbox._unusable = f"its container is not running ({exc.message})"
            raise SandboxUnusable(sandbox.container_id, sandbox._unusable) from exc
        with trio.CancelScope(shield=True):  # once started, only its task may own the stream
            started: HijackedStream | None = None
            try:
                started = await exec_start(engine, exec_id, tty=pty)
            finally:
                if started is None:  # it may run anyway: end it (bounded inside)
                    await sandbox._end_group(token, None)
            stream = started
        process = Process(
            sandbox,
            token=token,
            exec_id=exec_id,
            stream=stream,
            pty=pty,
            stdin=stdin,
            max_output=max_output,
            deadline=deadline,
            began=began,
            on_end=self._ended,
            tap=tap,
        )
        self._live[process.id] = process
        self._nursery.start_soon(process.follow)
        return process

    def _ended(self, process_id: str) -> None:
        self._live.pop(process_id, None)


@asynccontextmanager
async def running(table: ProcessTable) -> AsyncIterator[None]:
    """The nursery of a session's block. Leaving it cancels every process's task (the
    container's removal, next, ends the processes themselves). The block's own exception
    passes through as itself, never inside an exception group."""
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        table._nursery = nursery
        try:
            yield
        except BaseException as exc:  # re-raised below, outside the nursery
            error = exc
        finally:
            table._nursery = None
            nursery.cancel_scope.cancel()
    if error is not None:
        raise error


async def start_process(
    self: Host,
    argv: Sequence[str],
    *,
    stdin: bool = True,
    pty: bool = False,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    max_output: int | None = None,
    timeout: float | None = None,
) -> Process:
    """Start ``argv`` in the background as the sandbox user; return its ``Process``
    (``Sandbox.start``).

    It runs until it exits, ``timeout`` passes (default: the spec's ``timeout_s``), its merged
    output passes ``max_output`` bytes (default: the spec's ``output_bytes``), it is killed, or
    the sandbox closes. ``stdin=False`` attaches none (it reads EOF); ``pty=True`` runs it on a
    terminal. At most ``max_processes`` (``open_sandbox``) run at once: ``TooManyProcesses``.
    """
    command = check_argv(argv)
    timeout = self._box.timeout_s if timeout is None else timeout
    check_limit("timeout_s", timeout, "timeout")
    max_output = self._box.output_bytes if max_output is None else max_output
    check_limit("output_bytes", max_output, "max_output")
    validate_workdir(workdir, "workdir")
    for field, flag in (("stdin", stdin), ("pty", pty)):
        if not isinstance(flag, bool):
            raise SpecError(field, f"must be True or False, got {flag!r}")
    env_list: list[str] | None = None
    if env:
        owned = spec_owned_keys(self._box.spec.network)  # the container's values stand
        merged = merge_env(dict(env), runtime=runtime_env(self.lease), field="env", owned=owned)
        env_list = [f"{key}={value}" for key, value in sorted(merged.items())]
    return await self.processes._start(
        self,
        command,
        stdin=stdin,
        pty=pty,
        env=env_list,
        workdir=workdir,
        max_output=max_output,
        timeout=timeout,
    )


async def _send_signal(sandbox: Host, token: str, number: int) -> bool:
    """Signal a background process's group from inside; False if none is recorded (yet)."""
    argv = ["sh", "-c", SIGNAL_SCRIPT, "sbxkit-signal", token, str(number)]
    result = await sandbox._run(argv, None, KILL_BUDGET_S, 4096)
    if result.ok:
        return True
    if result.status == "exited" and result.exit_code == NO_GROUP_STATUS:
        return False
    raise SbxError(f"signalling a process failed ({result.status}): {result.stderr[:200]!r}")


publish(__name__, globals())  # public names show as sbxkit.NAME
