"""Incremental demuxer for Docker's multiplexed (non-TTY) attach stream.

Pure: bytes in, ``(stream_id, chunk)`` events out, no I/O, in the style of h11's connection
object. Each frame is an 8-byte header ``[stream_id, 0, 0, 0, size as big-endian u32]`` and
``size`` payload bytes; the socket may cut it at any byte. A frame may announce up to 4 GiB
and the workload is untrusted, so payload bytes are passed on as soon as they arrive: only
the header (at most 8 bytes) is ever buffered.
"""

from __future__ import annotations

import struct
from typing import NoReturn

from sbxkit.errors import FrameError

STDIN, STDOUT, STDERR, SYSTEMERR = 0, 1, 2, 3
_LEGAL_STREAMS = frozenset({STDIN, STDOUT, STDERR, SYSTEMERR})

HEADER_SIZE = 8
MAX_PAYLOAD = 0xFFFF_FFFF  # the size field is a u32
_HEADER = struct.Struct(">BxxxI")


def encode_frame(stream_id: int, payload: bytes) -> bytes:
    """One well-formed frame. Refuses what the demuxer would refuse, so it cannot fake bad input."""
    if stream_id not in _LEGAL_STREAMS:
        raise ValueError(f"stream id must be 0-3, got {stream_id}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes does not fit a u32 size field")
    return _HEADER.pack(stream_id, len(payload)) + payload


class Demuxer:
    """Turns attach-stream bytes, cut anywhere, into ordered ``(stream_id, chunk)`` events.

    Chunks are never empty and never span frames; a frame split across feeds comes out as
    several chunks. After a FrameError every further call raises FrameError again.
    """

    def __init__(self) -> None:
        self._header = bytearray()
        self._stream_id = STDOUT  # meaningful only while _payload_left > 0
        self._payload_left = 0
        self._offset = 0  # bytes consumed so far: FrameError reports positions against it
        self._header_start = 0
        self._error: FrameError | None = None
        self._closed = False

    @property
    def mid_frame(self) -> bool:
        """True if input ending now would cut a header or a payload short."""
        return bool(self._header) or self._payload_left > 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Consume ``data``; return every payload byte in it, in stream order.

        On FrameError, chunks decoded earlier in the same call are dropped with the connection.
        """
        self._raise_if_failed()
        if self._closed:
            raise RuntimeError("feed() called after close()")
        events: list[tuple[int, bytes]] = []
        view = memoryview(data)  # slicing a view copies nothing until we build a chunk
        pos = 0
        while pos < len(view):
            if self._payload_left:
                take = min(self._payload_left, len(view) - pos)
                whole = pos == 0 and take == len(view) and isinstance(data, bytes)
                events.append((self._stream_id, data if whole else bytes(view[pos : pos + take])))
                self._payload_left -= take
            else:
                if not self._header:
                    self._header_start = self._offset
                take = min(HEADER_SIZE - len(self._header), len(view) - pos)
                self._header += view[pos : pos + take]
                self._check_header()
                if len(self._header) == HEADER_SIZE:
                    self._stream_id, self._payload_left = _HEADER.unpack(self._header)
                    self._header.clear()
            pos += take
            self._offset += take
        return events

    def close(self) -> None:
        """Declare end of input; raise FrameError if it cut a frame short."""
        self._raise_if_failed()
        self._closed = True
        if self._header:
            self._fail(
                self._offset,
                f"input ended inside a frame header after {len(self._header)} of "
                f"{HEADER_SIZE} bytes ({self._header.hex(' ')})",
            )
        if self._payload_left:
            self._fail(
                self._offset,
                f"input ended inside a stream {self._stream_id} payload "
                f"with {self._payload_left} bytes still announced",
            )

    def _check_header(self) -> None:
        # Checked as header bytes arrive rather than once the header is whole, so garbage is
        # refused at the byte that shows it, even if the rest of the header never arrives.
        start = self._header_start
        header = self._header
        if header[0] not in _LEGAL_STREAMS:
            self._fail(
                start, f"stream id {header[0]} is not 0-3 (header so far: {header.hex(' ')})"
            )
        for index in range(1, min(len(header), 4)):
            if header[index]:
                self._fail(
                    start + index,
                    f"header padding byte {index} is 0x{header[index]:02x}, must be 0x00 "
                    f"(header so far: {header.hex(' ')})",
                )

    def _fail(self, offset: int, problem: str) -> NoReturn:
        self._error = FrameError(offset, problem)
        raise self._error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise FrameError(
                self._error.offset, f"demuxer already failed: {self._error.problem}"
            ) from self._error
