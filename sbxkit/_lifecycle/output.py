"""Per-stream byte caps for captured sandbox output.

Untrusted code can print without end, so each stream keeps at most its cap in memory. The
first bytes are kept, not the tail: the start of the output is what explains a run, and a
flood at the end would otherwise push it out. A cap of N lets exactly N bytes through; byte
N+1 marks the stream exceeded. Pure: no I/O, fed by whoever reads the attach stream.
"""

from __future__ import annotations

from typing import Literal

from sbxkit._util.capped import CappedBuffer
from sbxkit.engine.frames import STDERR, STDIN, STDOUT, SYSTEMERR

__all__ = ["CappedBuffer", "OutputCapture", "StreamName", "stream_name"]

StreamName = Literal["stdout", "stderr"]

# Docker echoes stdin on stream 0 and reports its own failures on stream 3; neither gets a
# field of its own, so they share the cap of the stream a reader would expect them on.
_STREAM_NAMES: dict[int, StreamName] = {
    STDIN: "stdout",
    STDOUT: "stdout",
    STDERR: "stderr",
    SYSTEMERR: "stderr",
}


def stream_name(stream_id: int) -> StreamName:
    """``stdout`` for frame streams 0 and 1, ``stderr`` for 2 and 3."""
    name = _STREAM_NAMES.get(stream_id)
    if name is None:
        raise ValueError(f"stream id must be 0-3, got {stream_id}")
    return name


class OutputCapture:
    """Capped stdout and stderr of one run, remembering which stream overflowed first."""

    def __init__(self, max_output_bytes: int) -> None:
        if max_output_bytes < 0:
            raise ValueError(f"max_output_bytes must be >= 0, got {max_output_bytes}")
        self._buffers: dict[StreamName, CappedBuffer] = {
            "stdout": CappedBuffer(max_output_bytes),
            "stderr": CappedBuffer(max_output_bytes),
        }
        self._overflowed: StreamName | None = None

    def add(self, stream_id: int, data: bytes) -> bool:
        """File ``data`` under its stream; return True only when the first overflow happens."""
        name = _STREAM_NAMES.get(stream_id)
        if name is None:
            raise ValueError(f"stream id must be 0-3, got {stream_id}")
        if not self._buffers[name].add(data) or self._overflowed is not None:
            return False
        self._overflowed = name
        return True

    def kept(self, name: StreamName) -> int:
        """Bytes kept so far on one stream."""
        return self._buffers[name].kept_bytes

    @property
    def overflowed(self) -> StreamName | None:
        """The stream that exceeded the cap first, or None while both fit."""
        return self._overflowed

    @property
    def stdout(self) -> bytes:
        return self._buffers["stdout"].value()

    @property
    def stderr(self) -> bytes:
        return self._buffers["stderr"].value()

    @property
    def stdout_bytes(self) -> int:
        return self._buffers["stdout"].kept_bytes

    @property
    def stderr_bytes(self) -> int:
        return self._buffers["stderr"].kept_bytes
