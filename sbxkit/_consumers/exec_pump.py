"""Reading one exec's multiplexed stream (``Sandbox.exec`` and its file transfers): output
into a capped capture while stdin is fed, and an ended exec's stream drained and dropped."""

from __future__ import annotations

import contextlib

import trio

from sbxkit._consumers.dirs import StdoutSink
from sbxkit._lifecycle.attached import OutputCallback, feed_stdin
from sbxkit._lifecycle.output import OutputCapture, stream_name
from sbxkit._util.stdin import StdinSource
from sbxkit._util.unwrap import plain_async
from sbxkit.engine.frames import STDOUT, Demuxer
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import SbxError

__all__ = ["discard_until_eof", "pump_exec"]


@plain_async  # Ctrl-C inside the nursery leaves as a plain KeyboardInterrupt
async def pump_exec(
    stream: HijackedStream,
    capture: OutputCapture,
    stdin: StdinSource | None,
    on_stdout: StdoutSink | None = None,
    on_output: OutputCallback | None = None,
) -> tuple[bool, bool]:
    """Demux output into ``capture`` (feeding ``stdin`` alongside) until EOF or an overflow;
    with ``on_stdout``, stdout goes there instead, uncapped (the callee bounds it);
    ``on_output(stream, chunk)`` is told exactly what the capture kept, as it arrives.

    Returns ``(ended, overflowed)``; errors are raised outside the nursery, unwrapped.
    """
    error: SbxError | None = None
    ended = overflowed = False
    async with trio.open_nursery() as nursery:
        if stdin is not None:
            nursery.start_soon(feed_stdin, stream, stdin)
        demuxer = Demuxer()
        try:
            while not overflowed:
                chunk = await stream.receive_some()
                if not chunk:
                    demuxer.close()
                    ended = True
                    break
                for stream_id, data in demuxer.feed(chunk):
                    if on_stdout is not None and stream_id == STDOUT:
                        await on_stdout(data)
                        continue
                    name = stream_name(stream_id)
                    before = capture.kept(name)
                    overflowed = capture.add(stream_id, data)
                    kept = capture.kept(name) - before
                    if on_output is not None and kept:
                        on_output(name, bytes(data[:kept]))  # never past the cap
                    if overflowed:
                        break
        except SbxError as exc:
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    return ended, overflowed


async def discard_until_eof(stream: HijackedStream, drained: trio.Event) -> None:
    """Read and drop an ended exec's output until its stream closes (or an error ends it)."""
    try:
        with contextlib.suppress(SbxError):
            while await stream.receive_some():
                pass
    finally:
        drained.set()
