"""Interpreter sessions: ``open_interpreter`` → an ``Interpreter`` whose state lives between
calls (docs/interpreter.md).

One session sandbox (``open_sandbox``) runs sbxkit's own standard-library interpreter
(sbxkit/_consumers/interp_program.py) as a background process (``Sandbox.start``). Its output
never reaches a log: it goes to a tap that splits it into checked frames
(sbxkit/_consumers/interp_frames.py), keeps each call's output up to that call's cap and drops
the rest. What sbxkit judges itself — a call's time limit, its output cap, a malformed or
out-of-turn frame, the process's end with the daemon's evidence — no frame can change.

A call past its time limit or output cap, or cancelled, is interrupted (SIGINT to the
interpreter's process group: ``KeyboardInterrupt`` in the code) and the interpreter lives on;
one that does not stop within ``INTERRUPT_GRACE_S`` is killed. A killed, crashed or
protocol-breaking interpreter raises ``InterpreterDied`` (now and on every later call) until
``restart()``.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from sbxkit._consumers.interp_frames import (
    CodeResult,
    CodeStatus,
    FrameDecoder,
    FrameRefused,
    Out,
    Ready,
    Reply,
    check_preload,
    encode_request,
    frame_bound,
    out_bytes,
)
from sbxkit._consumers.interp_program import INTERPRETER_SOURCE
from sbxkit._consumers.processes import Process
from sbxkit._consumers.session import Sandbox, open_sandbox
from sbxkit._lifecycle.outcome import SIGNAL_EXIT_BASE, judge_exit
from sbxkit._model.result import Stream
from sbxkit._model.spec import SandboxSpec, check_limit
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.public import publish
from sbxkit.engine.frames import STDOUT
from sbxkit.errors import (
    ImageError,
    InterpreterDied,
    ProcessError,
    SandboxUnusable,
    SbxError,
    SpecError,
)

__all__ = ["Interpreter", "check_interpreter_options", "open_interpreter"]

INTERRUPT_GRACE_S = 5.0
"""How long an interrupted call may take to stop before its interpreter is killed."""
START_TIMEOUT_S = 30.0
MAX_CODE_BYTES = 16 * 1024 * 1024
STDERR_TAIL = 2048
"""Bytes of the interpreter process's own stderr kept for a crash report."""

OutputCallback = Callable[[Stream, bytes], object]
"""``on_output(stream, chunk)``: a call's output as it arrives, within its cap (it may return
an awaitable, which is awaited)."""


class _Call:
    """One call's output and reply, as the tap delivers them (bounded by ``cap``)."""

    def __init__(self, call_id: int, cap: int) -> None:
        self.id = call_id
        self.cap = cap
        self.out: dict[Stream, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.chunks: list[tuple[Stream, bytes]] = []  # for on_output, not yet handed over
        self.overflowed = False
        self.reply: Reply | None = None

    def add(self, stream: Stream, data: bytes) -> None:
        kept = self.out[stream]
        room = self.cap - len(kept)
        if len(data) > room:
            self.overflowed = True
            data = data[: max(room, 0)]
        if data:
            kept += data
            self.chunks.append((stream, data))


class _Generation:
    """One interpreter process and the tap that reads it."""

    def __init__(self, max_frame: int) -> None:
        self.decoder = FrameDecoder(max_frame)
        self.process: Process | None = None
        self.ready: Ready | None = None
        self.call: _Call | None = None
        self.refused: str | None = None
        self.changed = trio.Event()
        self.stderr_tail = b""

    def tap(self, stream_id: int, data: bytes) -> None:
        self.changed.set()
        self.changed = trio.Event()
        if stream_id != STDOUT:
            # The process's own stderr, before the interpreter redirects it or after it
            # died (a fatal error, the wrapper's "Killed"): the last bytes, for the report.
            self.stderr_tail = (self.stderr_tail + data)[-STDERR_TAIL:]
            return
        if self.refused is not None:
            return
        try:
            frames = self.decoder.feed(data)
        except FrameRefused as exc:
            self.refused = f"it wrote {exc.reason}"
            return
        for frame in frames:
            self.refused = self._take(frame)
            if self.refused is not None:
                return

    def _take(self, frame: Ready | Out | Reply) -> str | None:
        call = self.call
        if isinstance(frame, Ready):
            if self.ready is not None:
                return "it said it was ready twice"
            self.ready = frame
        elif isinstance(frame, Out):
            if call is not None and frame.id == call.id and call.reply is None:
                call.add(frame.s, out_bytes(frame))
            # Output of an earlier call (a child still writing) or between calls is dropped.
        elif call is None or frame.id != call.id or call.reply is not None:
            return f"it sent a result for call {frame.id}, which is not the call running"
        else:
            call.reply = frame
        return None


class Interpreter:
    """A Python interpreter in a sandbox whose state lives between calls. Use it only inside
    its ``open_interpreter`` block, one call at a time (calls from several tasks queue)."""

    def __init__(
        self,
        sandbox: Sandbox,
        python: str,
        max_frame_output: int,
        preload: tuple[str, ...] = (),
        timeout_s: float | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.python = python
        self.preload = preload
        """Modules each start of the interpreter imports before it is ready."""
        self.warm = False
        """True when it came parked from an ``InterpreterPool``, False when started cold."""
        self._timeout_s = timeout_s  # a warm one's default call limit; its sandbox's is longer
        self._max_frame = frame_bound(max_frame_output)
        self._gen: _Generation | None = None
        self._dead: InterpreterDied | None = None
        self._calls = 0
        self._lock = trio.Lock()

    def __repr__(self) -> str:
        state = "dead" if self._dead is not None else "alive"
        return f"<Interpreter {self.sandbox.container_id[:12]} {state}>"

    @property
    def python_version(self) -> str | None:
        """The interpreter's Python version, as it said at start."""
        ready = None if self._gen is None else self._gen.ready
        return None if ready is None else ready.python

    async def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        max_output: int | None = None,
        on_output: OutputCallback | None = None,
    ) -> CodeResult:
        """Run ``code`` in the interpreter's namespace; the value of a last expression is the
        result's ``text`` and ``data``.

        ``timeout`` (default: the spec's ``timeout_s``) bounds the call: past it the code is
        interrupted (``timed_out``). ``max_output`` (default: the spec's ``output_bytes``) caps
        stdout and stderr each, and each representation of the value: exactly N bytes of
        output pass, N + 1 interrupts the code (``output_exceeded``). ``on_output(stream,
        chunk)`` gets the output as it arrives. ``InterpreterDied`` if the interpreter ends.
        """
        if not isinstance(code, str):
            raise SpecError("code", f"must be a str of Python source, got {type(code).__name__}")
        if len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise SpecError("code", f"must be at most {MAX_CODE_BYTES} bytes")
        box = self.sandbox._box
        if timeout is None:
            timeout = box.timeout_s if self._timeout_s is None else self._timeout_s
        check_limit("timeout_s", timeout, "timeout")
        max_output = box.output_bytes if max_output is None else max_output
        check_limit("output_bytes", max_output, "max_output")
        if frame_bound(max_output) > self._max_frame:
            raise SpecError("max_output", "must be at most the spec's limits.output_bytes")
        async with self._lock:
            return await self._run(code, timeout, max_output, on_output)

    async def restart(self) -> None:
        """End the interpreter (if it still runs) and start a fresh one: its state is gone."""
        async with self._lock:
            await self._stop()
            await self._launch()

    # -- inside --------------------------------------------------------------------------------

    async def _launch(self) -> None:
        gen = _Generation(self._max_frame)
        self._gen = gen
        self._dead = None
        box = self.sandbox._box
        gen.process = await self.sandbox.processes._start(
            self.sandbox,
            [self.python, "-c", INTERPRETER_SOURCE, *self.preload],
            stdin=True,
            pty=False,
            env=None,
            workdir=None,
            max_output=0,
            timeout=max(box.deadline - trio.current_time(), 0.001),
            tap=gen.tap,
        )
        try:
            with trio.move_on_after(START_TIMEOUT_S):
                while gen.ready is None:
                    await self._check_alive(gen)
                    await _wait(gen, START_TIMEOUT_S)
            if gen.ready is None:
                await self._die(gen, f"it did not start within {START_TIMEOUT_S:g} s")
        except InterpreterDied as died:
            await self._unusable_if_stopped(died)
            raise
        failed = None if gen.ready is None else gen.ready.preload_error
        if failed is not None:
            await self._stop()
            self._dead = InterpreterDied("its preload failed: " + failed)
            raise ImageError(box.spec.image, f"preload {failed}")

    async def _unusable_if_stopped(self, died: InterpreterDied) -> None:
        """A launch that failed because the container stopped under it (gVisor ends the
        sandbox on an OOM, and an exec created just before reads the runtime's complaint
        as its output) leaves a sandbox nothing can start in: say that, as an exec into a
        stopped container does, not what the dying exec's stream looked like."""
        box = self.sandbox._box
        try:
            state = (await box.engine.container_inspect(box.container_id)).state
        except SbxError:
            return  # no word from the daemon: the launch's own failure stands
        if not state.running:
            self.sandbox._unusable = f"its container is not running ({state.status})"
            raise SandboxUnusable(box.container_id, self.sandbox._unusable) from died

    async def _stop(self) -> None:
        gen = self._gen
        if gen is not None and gen.process is not None and gen.process.exit is None:
            with trio.CancelScope(shield=True), contextlib.suppress(ProcessError):
                await gen.process.kill()  # ProcessError: following it had failed; it is ended

    async def _run(
        self, code: str, timeout: float, max_output: int, on_output: OutputCallback | None
    ) -> CodeResult:
        if self._dead is not None:
            raise self._dead
        gen = self._gen
        assert gen is not None
        assert gen.process is not None
        process = gen.process
        self._calls += 1
        call = _Call(self._calls, max_output)
        gen.call = call
        t0 = trio.current_time()
        deadline = t0 + timeout
        interrupted_at: float | None = None
        status: CodeStatus | None = None
        try:
            try:
                await process.write(encode_request(call.id, code, max_output))
            except ProcessError:
                await self._check_alive(gen)
                raise
            while call.reply is None:
                while call.chunks:
                    stream, chunk = call.chunks.pop(0)
                    if on_output is not None:
                        outcome = on_output(stream, chunk)
                        if inspect.isawaitable(outcome):
                            await outcome
                await self._check_alive(gen)
                if call.reply is not None:
                    break
                now = trio.current_time()
                if interrupted_at is None and (call.overflowed or now >= deadline):
                    status = "output_exceeded" if call.overflowed else "timed_out"
                    interrupted_at = now
                    await self._interrupt(gen)
                    continue
                if interrupted_at is not None and now >= interrupted_at + INTERRUPT_GRACE_S:
                    await self._die(
                        gen, f"it did not stop within {INTERRUPT_GRACE_S:g} s of an interrupt"
                    )
                until = deadline if interrupted_at is None else interrupted_at + INTERRUPT_GRACE_S
                await _wait(gen, until - now)
        except BaseException as exc:
            if call.reply is None and self._dead is None:
                with trio.CancelScope(shield=True):
                    if _cancelled(exc) and await self._interrupted(gen, call):
                        raise  # the code stopped at the interrupt: the interpreter lives on
                    # Failed, or cancelled code that would not stop: its state is not idle.
                    await self._stop()
                self._dead = InterpreterDied("a call was abandoned while it ran; it was killed")
            raise
        finally:
            gen.call = None
        for stream, chunk in call.chunks:
            if on_output is not None:
                outcome = on_output(stream, chunk)
                if inspect.isawaitable(outcome):
                    await outcome
        return _result(call, status, max_output, trio.current_time() - t0)

    async def _interrupted(self, gen: _Generation, call: _Call) -> bool:
        """A cancelled call: interrupt its code and wait (at most ``INTERRUPT_GRACE_S``) for
        its reply, so that the interpreter lives on with its state. False: it did not stop."""
        process = gen.process
        assert process is not None
        with trio.move_on_after(INTERRUPT_GRACE_S):
            try:
                await process.signal("INT")
            except SbxError:
                return False
            while call.reply is None:
                ended = process.exit is not None or process._error is not None
                if ended or gen.refused is not None:
                    return False
                await _wait(gen, INTERRUPT_GRACE_S)
        return call.reply is not None

    async def _interrupt(self, gen: _Generation) -> None:
        assert gen.process is not None
        try:
            await gen.process.signal("INT")
        except SandboxUnusable as exc:
            await self._sandbox_ended(gen, exc.reason)
            await self._die(gen, f"it could not be interrupted ({exc})")
        except SbxError as exc:
            await self._oom_since_start(gen)
            await self._die(gen, f"it could not be interrupted ({exc})")

    async def _oom_since_start(self, gen: _Generation) -> None:
        """An interpreter that cannot be interrupted may have been OOM-killed with its stream
        left open (gVisor): the daemon's ``oom`` events since its start say so."""
        box = self.sandbox._box
        assert gen.process is not None
        killed = SIGNAL_EXIT_BASE + signal.SIGKILL
        verdict = await judge_exit(box.engine, box.container_id, killed, since=gen.process._began)
        if verdict.status != "oom_killed":
            return
        await self._stop()
        self._dead = InterpreterDied(
            f"the kernel's OOM killer killed its process ({verdict.oom_evidence})",
            status="oom_killed",
            evidence=verdict.oom_evidence,
        )
        raise self._dead

    async def _sandbox_ended(self, gen: _Generation, why: str) -> None:
        """The whole container ended under the interpreter (gVisor ends the sandbox on an OOM
        and leaves the exec's stream open): the container's own end, on the daemon's
        evidence, is the interpreter's."""
        box = self.sandbox._box
        code: int | None = None
        with contextlib.suppress(SbxError):
            state = (await box.engine.container_inspect(box.container_id)).state
            if state.running:
                return  # the container runs: the process's own end is the story
            code = state.exit_code
        verdict = await judge_exit(box.engine, box.container_id, code)
        evidence = verdict.oom_evidence or verdict.kill_evidence
        what = "the kernel's OOM killer" if verdict.status == "oom_killed" else verdict.status
        reason = f"its sandbox's container ended ({what}, exit code {code}): {why}"
        await self._stop()
        self._dead = InterpreterDied(
            reason + (f" ({evidence})" if evidence else ""),
            status=verdict.status,
            exit_code=code if verdict.status == "exited" else None,
            evidence=evidence,
        )
        raise self._dead

    async def _check_alive(self, gen: _Generation) -> None:
        if self._dead is not None:
            raise self._dead
        if gen.refused is not None:
            await self._die(gen, gen.refused)
        process = gen.process
        assert process is not None
        if process._error is not None:
            await self._die(gen, f"following its process failed: {process._error}")
        ended = process.exit
        if ended is not None:
            await self._sandbox_ended(gen, f"its process ended: {ended.status}")
            if ended.status == "exited" and ended.exit_code == SIGNAL_EXIT_BASE:
                # A runtime's own failure (gVisor's 128) may hide an OOM kill; a signal exit
                # was judged on the daemon's events already (Process._judge).
                await self._oom_since_start(gen)
            if ended.status == "exited":
                reason = f"its process exited with code {ended.exit_code}"
            elif ended.status == "oom_killed":
                reason = "the kernel's OOM killer killed its process"
            else:
                reason = f"its process ended: {ended.status}"
            evidence = ended.oom_evidence or ended.kill_evidence
            said = gen.stderr_tail.decode("utf-8", "replace").strip()
            self._dead = InterpreterDied(
                reason
                + (f" ({evidence})" if evidence else "")
                + (f"; its last words on stderr: {said[-500:]!r}" if said else ""),
                status=ended.status,
                exit_code=ended.exit_code,
                evidence=evidence,
            )
            raise self._dead

    async def _die(self, gen: _Generation, reason: str) -> None:
        """Kill the interpreter for ``reason`` and raise ``InterpreterDied``."""
        self._gen = gen
        await self._stop()
        self._dead = InterpreterDied(reason + "; it was killed", status="killed", evidence=reason)
        raise self._dead


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation (``_wait``'s nursery raises it as a group)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def _wait(gen: _Generation, seconds: float) -> None:
    """Until the tap brings something, the process ends, or ``seconds`` pass."""
    process = gen.process
    assert process is not None
    changed = gen.changed
    with trio.move_on_after(max(seconds, 0.0)):
        async with trio.open_nursery() as nursery:

            async def tapped() -> None:
                await changed.wait()
                nursery.cancel_scope.cancel()

            async def ended() -> None:
                with contextlib.suppress(ProcessError):  # _check_alive reports it
                    await process.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(tapped)
            nursery.start_soon(ended)


def _result(call: _Call, status: CodeStatus | None, cap: int, run_s: float) -> CodeResult:
    reply = call.reply
    assert reply is not None
    data = {mime: text[:cap] for mime, text in (reply.value or {}).items()}
    displays = [{mime: text[:cap] for mime, text in shown.items()} for shown in reply.displays]
    error = reply.error
    if status is None:
        status = "error" if error is not None else "ok"
    return CodeResult(
        status=status,
        stdout=call.out["stdout"].decode("utf-8", "replace"),
        stderr=call.out["stderr"].decode("utf-8", "replace"),
        text=data.get("text/plain"),
        data=data,
        error=error,
        run_s=run_s,
        displays=displays,
    )


@asynccontextmanager
async def open_interpreter(
    spec: SandboxSpec | CheckedSpec,
    *,
    python: str = "python3",
    preload: Sequence[str] = (),
    **options: Any,
) -> AsyncIterator[Interpreter]:
    """A Python interpreter in a fresh session sandbox, whose variables live between
    ``run_code`` calls. ``python`` names the image's interpreter (3.8 or later, standard
    library only); ``preload`` names modules it imports before it is ready (one that does
    not import: ``ImageError``); ``options`` are ``open_sandbox``'s. The block's end removes
    the sandbox, as ``open_sandbox``'s does."""
    modules, output_bytes = check_interpreter_options(spec, python, preload)
    async with open_sandbox(spec, **options) as sandbox:
        interpreter = Interpreter(sandbox, python, output_bytes, modules)
        await interpreter._launch()
        yield interpreter


def check_interpreter_options(
    spec: SandboxSpec | CheckedSpec, python: object, preload: object
) -> tuple[tuple[str, ...], int]:
    """``open_interpreter``'s own arguments, checked before any container exists: the
    preloaded modules and the spec's output cap."""
    if not isinstance(python, str) or not python:
        raise SpecError("python", f"must be the interpreter's name or path, got {python!r}")
    modules = check_preload(preload)
    checked = spec.spec if isinstance(spec, CheckedSpec) else spec
    output_bytes = checked.limits.output_bytes
    check_limit("output_bytes", output_bytes)
    assert output_bytes is not None
    return modules, output_bytes


publish(__name__, globals())  # public names show as sbxkit.NAME
