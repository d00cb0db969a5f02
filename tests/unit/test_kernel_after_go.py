"""``supervise_kernel``'s ``after_go``: run once the go line is out, before any stdin.

A cold run tells its owner its launch is over there, so the supervisor's work on that message
overlaps the payload's run instead of delaying its start. Plain pipes stand in for the
sandbox's FIFOs; no daemon in this tier (tests/engine/ runs the real path).
"""

from __future__ import annotations

import os

import trio

from sbxkit._lifecycle.kernel_watch import Feed, KernelIO, supervise_kernel


def pipe_io() -> tuple[KernelIO, int, int, int]:
    """A KernelIO on three pipes; the other ends: stdin's reader, stdout's and stderr's
    writers."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (in_w, out_r, err_r):
        os.set_blocking(fd, False)
    io = KernelIO(
        trio.lowlevel.FdStream(in_w), trio.lowlevel.FdStream(out_r), trio.lowlevel.FdStream(err_r)
    )
    return io, in_r, out_w, err_w


async def test_after_go_runs_after_the_line_and_before_stdin() -> None:
    io, in_r, out_w, err_w = pipe_io()
    seen_at_go: list[bytes] = []
    exit_now = trio.Event()

    async def after_go() -> None:
        seen_at_go.append(os.read(in_r, 1 << 16))  # what the payload could read so far

    async def exited() -> int:
        await exit_now.wait()
        return 0

    async def payload() -> None:
        await trio.sleep(0.05)
        os.write(out_w, b"ran\n")
        for fd in (out_w, err_w):
            os.close(fd)
        exit_now.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(payload)
        outcome = await supervise_kernel(
            io, exited, Feed(b"GO\n", b"stdin bytes", 1024, 10), after_go
        )
    rest = os.read(in_r, 1 << 16)
    os.close(in_r)
    await io.aclose()
    assert seen_at_go == [b"GO\n"]
    assert rest == b"stdin bytes"
    assert (outcome.status, outcome.exit_code, outcome.capture.stdout) == ("exited", 0, b"ran\n")


async def test_no_after_go_when_the_line_cannot_be_written() -> None:
    """The sandbox is gone before its go line: there is no launch to call over (the owner's
    removal hands its launch slot on)."""
    io, in_r, out_w, err_w = pipe_io()
    os.close(in_r)  # nobody will ever read the line
    for fd in (out_w, err_w):
        os.close(fd)
    called: list[bool] = []

    async def after_go() -> None:
        called.append(True)

    async def exited() -> int:
        return 1

    outcome = await supervise_kernel(io, exited, Feed(b"GO\n", None, 1024, 10), after_go)
    await io.aclose()
    assert called == []
    assert (outcome.status, outcome.exit_code) == ("exited", 1)
