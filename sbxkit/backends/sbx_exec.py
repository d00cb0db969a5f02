"""The ``sbx`` backend's process seam: its errors, and running one ``sbx`` command with
bounded output, a deadline and a kill that never leaves the process behind."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import msgspec
import trio

from sbxkit._lifecycle.output import OutputCapture
from sbxkit._model.result import Stream
from sbxkit._util.unwrap import plain_async
from sbxkit.engine.frames import STDERR, STDOUT
from sbxkit.errors import SbxUnavailable

COMMAND_OUTPUT_CAP = 1024 * 1024
"""Bytes kept per stream of the runner's own commands (create, policy, rm, ls)."""
DRAIN_GRACE_S = 2.0
"""After a command exits, how long its pipes may stay open (a backgrounded descendant)."""


# --- errors -------------------------------------------------------------------------------------


# --- the exec seam ------------------------------------------------------------------------------


class CompletedCommand(msgspec.Struct, frozen=True, kw_only=True):
    """How one command ended. ``returncode`` is None when it was stopped by the seam (deadline
    or output cap); a negative code means a signal the seam did not send (as ``subprocess``)."""

    argv: list[str]
    returncode: int | None
    stdout: bytes
    stderr: bytes
    overflowed: Stream | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0


Exec = Callable[[Sequence[str], bytes, float, int], Awaitable[CompletedCommand]]
"""``(argv, stdin, timeout_s, max_output) -> CompletedCommand``.

Runs ``argv`` on the host with ``stdin`` written and then closed; keeps at most
``max_output`` bytes per stream and stops the command at byte ``max_output + 1``
(``overflowed``) or after ``timeout_s`` (``timed_out``). Raises ``SbxUnavailable`` when the
program cannot be started. Must stop the process it started before returning, even when
cancelled."""


async def _kill_now(process: trio.Process) -> None:
    """Stop the local CLI process at once: the sandbox itself is stopped by ``rm --force``."""
    process.kill()


class _Streams:
    """Feeds stdin and pumps stdout/stderr of one process under the output caps."""

    def __init__(self, stdin: bytes, max_output: int) -> None:
        self.stdin = stdin
        self.capture = OutputCapture(max_output)
        self.overflowed = False
        self.drained = trio.Event()
        self._open = 2

    async def feed(self, stream: trio.abc.SendStream) -> None:
        # A command that stops reading (or exits) closes the pipe: that is its business.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(self.stdin)
            await stream.aclose()

    async def pump(
        self, stream: trio.abc.ReceiveStream, stream_id: int, scope: trio.CancelScope
    ) -> None:
        while chunk := await stream.receive_some():
            if self.capture.add(stream_id, bytes(chunk)):
                self.overflowed = True  # byte N+1: stop the command now
                scope.cancel()
                return
        self._open -= 1
        if self._open == 0:
            self.drained.set()


@plain_async  # no exception group escapes the nursery
async def process_exec(
    argv: Sequence[str], stdin: bytes, timeout: float, max_output: int
) -> CompletedCommand:
    """The default ``Exec``: ``trio.run_process`` with piped, capped, concurrent streams.

    The child inherits this process's environment (the CLI needs ``HOME``, ``PATH`` and its
    login state); a run's own environment never goes there — it is on stdin. Cancellation,
    the deadline and an overflow all end in ``run_process``'s own cleanup (``SIGKILL`` here,
    then reaping); the pipes are closed in every case.
    """
    streams = _Streams(stdin, max_output)
    returncode: int | None = None
    spawn_error: OSError | None = None
    process: trio.Process | None = None
    try:
        with trio.move_on_after(timeout) as deadline:
            async with trio.open_nursery() as nursery:
                try:
                    process = await nursery.start(
                        partial(
                            trio.run_process,
                            list(argv),
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            check=False,
                            deliver_cancel=_kill_now,
                        )
                    )
                except OSError as error:  # caught here: the nursery would wrap it in a group
                    spawn_error = error
                else:
                    assert process.stdin is not None
                    assert process.stdout is not None
                    assert process.stderr is not None
                    scope = nursery.cancel_scope
                    nursery.start_soon(streams.feed, process.stdin)
                    nursery.start_soon(streams.pump, process.stdout, STDOUT, scope)
                    nursery.start_soon(streams.pump, process.stderr, STDERR, scope)
                    await process.wait()
                    returncode = process.returncode
                    # A descendant may hold the pipes open after the command exited.
                    with trio.move_on_after(DRAIN_GRACE_S):
                        await streams.drained.wait()
                    scope.cancel()
    finally:
        if process is not None:  # the pipes are ours once run_process handed the process over
            with trio.CancelScope(shield=True):
                for stream in (process.stdin, process.stdout, process.stderr):
                    if stream is not None:
                        await stream.aclose()
    if spawn_error is not None:
        raise SbxUnavailable(argv[0], spawn_error.strerror or str(spawn_error))
    overflowed = streams.overflowed
    timed_out = deadline.cancelled_caught and returncode is None and not overflowed
    return CompletedCommand(
        argv=list(argv),
        returncode=None if overflowed or timed_out else returncode,
        stdout=streams.capture.stdout,
        stderr=streams.capture.stderr,
        overflowed=streams.capture.overflowed if overflowed else None,
        timed_out=timed_out,
    )
