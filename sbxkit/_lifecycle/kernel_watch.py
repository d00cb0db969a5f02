"""A run on the kernel's evidence: the line that lets it go, stdin, capped output, the time
limit and the exit, on the sandbox's FIFOs and its init's pidfd.

The parallel of ``sbxkit._lifecycle.attached.supervise`` for the kernel path, with the same caps and
the same time limit. stdin is fed from its own task (writing it all before reading output would
deadlock on the 64 KiB FIFO buffers). The exit is the pidfd's; the output is complete at the FIFOs'
EOF, which follows the init's exit at once (its PID namespace is torn down: every writer is gone),
bounded anyway by ``DRAIN_GRACE_S``.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from sbxkit._kernel.fifos import HostEnds
from sbxkit._kernel.init import ContainerInit
from sbxkit._kernel.scripts import SYNC_BYTE
from sbxkit._lifecycle.attached import Outcome, OutputCallback
from sbxkit._lifecycle.output import OutputCapture
from sbxkit._util.stdin import StdinSource, write_stdin
from sbxkit._util.unwrap import plain_async
from sbxkit.engine.frames import STDERR, STDOUT

__all__ = [
    "AfterGo",
    "Exited",
    "Feed",
    "KernelIO",
    "KernelSupervise",
    "NotAlive",
    "supervise_kernel",
]

Exited = Callable[[], Awaitable[int]]
"""Waits for the sandbox's init to exit; its status as Docker spells it."""

AfterGo = Callable[[], Awaitable[None]] | None
"""Run once the go line is out (a cold run tells its owner its launch is over): the owner's
work on that message then overlaps the payload's run instead of delaying its start — each
message to the supervisor wakes it, and on two cores it takes the sender's CPU for a while."""

READ_CHUNK = 256 * 1024


class NotAlive(Exception):
    """The sandbox's shell never said it runs (no ``/bin/sh``, or it failed first): its
    payload never started."""


@dataclass
class KernelIO:
    """A sandbox's FIFO ends as trio streams, and its init; ``aclose`` releases all four."""

    stdin: trio.lowlevel.FdStream
    stdout: trio.lowlevel.FdStream
    stderr: trio.lowlevel.FdStream
    init: ContainerInit | None = None

    @classmethod
    def of(cls, ends: HostEnds) -> KernelIO:
        """The streams own the fds from here on."""
        return cls(
            trio.lowlevel.FdStream(ends.stdin),
            trio.lowlevel.FdStream(ends.stdout),
            trio.lowlevel.FdStream(ends.stderr),
        )

    async def alive(self, exited: Exited, limit_s: float) -> None:
        """Wait for the shell's sync byte on stderr: ``NotAlive`` if the sandbox exits (or its
        stderr ends) first, or nothing comes within ``limit_s``. A read end no writer has
        opened yet reads as EOF, so the fd is polled before it is read."""
        fd = self.stderr.fileno()
        said: list[bytes] = []
        with trio.move_on_after(limit_s):
            async with trio.open_nursery() as nursery:

                async def sync() -> None:
                    await trio.lowlevel.wait_readable(fd)
                    said.append(os.read(fd, 1))
                    nursery.cancel_scope.cancel()

                async def death() -> None:
                    await exited()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(sync)
                nursery.start_soon(death)
        if said != [SYNC_BYTE]:
            raise NotAlive("the sandbox's shell never said it runs (does the image have /bin/sh?)")

    async def __aenter__(self) -> KernelIO:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for stream in (self.stdin, self.stdout, self.stderr):
                await stream.aclose()
        if self.init is not None:
            self.init.close()


async def _feed(
    stream: trio.lowlevel.FdStream, line: bytes, stdin: StdinSource | None, after_go: AfterGo
) -> None:
    """The line that lets the payload go, ``after_go``, then its stdin; closing the host's end
    (the only writer) is the payload's EOF. A payload that stopped reading is its own
    business."""
    try:
        await stream.send_all(line)
        if after_go is not None:
            await after_go()
        await write_stdin(stream.send_all, stdin)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await stream.aclose()


@dataclass(frozen=True)
class Feed:
    """What a run on a waiting sandbox is given and held to: the ``line`` that lets it go (the
    go line, or a pooled claim's line), its stdin, the output cap, the time limit, and who
    hears its output as it comes."""

    line: bytes
    stdin: StdinSource | None
    max_output: int
    timeout_s: float
    on_output: OutputCallback | None = None


@plain_async  # its nursery's errors (and Ctrl-C) leave as themselves, not as a group
async def supervise_kernel(
    io: KernelIO, exited: Exited, feed: Feed, after_go: AfterGo = None
) -> Outcome:
    """Write the feed's line (then run ``after_go``) then its stdin, stream output under the
    caps, wait for the exit (the init's pidfd, or the daemon's wait where no pidfd could be
    verified) — all within the time limit."""
    outcome = Outcome(OutputCapture(feed.max_output))
    on_output = feed.on_output
    open_streams = [2]
    drained = trio.Event()
    with trio.move_on_after(feed.timeout_s) as timer:
        async with trio.open_nursery() as nursery:

            async def pump(stream: trio.lowlevel.FdStream, stream_id: int) -> None:
                while chunk := await stream.receive_some(READ_CHUNK):
                    if outcome.take(stream_id, chunk, on_output):
                        nursery.cancel_scope.cancel()
                        return
                open_streams[0] -= 1
                if not open_streams[0]:
                    drained.set()

            nursery.start_soon(_feed, io.stdin, feed.line, feed.stdin, after_go)
            nursery.start_soon(pump, io.stdout, STDOUT)
            nursery.start_soon(pump, io.stderr, STDERR)
            await outcome.exited_with(await exited(), drained, nursery)
    return outcome.after(timer)


KernelSupervise = Callable[[KernelIO, Exited, Feed, AfterGo], Awaitable[Outcome]]
"""Who watches a run on the kernel path once its sandbox waits for the feed's line: this process
(``supervise_kernel``), or — for ``sbxkit run`` handed to the supervisor — the command line,
which gets the FIFO ends and the init's pidfd (``sbxkit.handoff``)."""
