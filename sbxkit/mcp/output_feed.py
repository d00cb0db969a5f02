"""A tool's output as it happens, between the thread that runs the sandbox and the one that
speaks MCP (pure; a lock, no I/O).

Over stdio both sides are one trio thread; over HTTP the hub runs in a portal's trio thread
and the server in uvicorn's asyncio loop, so ``add`` and ``take`` may run in two threads.
``add`` is an ``on_output`` callback: it decodes each stream's bytes as UTF-8 without ever
splitting a character (an incomplete one waits for its next bytes) and keeps the text in
arrival order. ``take`` hands over what arrived since, one message per run of one stream, so a
client reads stdout and stderr in the order they came and the server sends a few messages a
second, not one per write.
"""

from __future__ import annotations

import codecs
import threading

from sbxkit._model.result import Stream


class OutputFeed:
    """Output chunks in, ``(stream, text)`` messages out (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        streams: tuple[Stream, ...] = ("stdout", "stderr")
        self._decoders = {
            stream: codecs.getincrementaldecoder("utf-8")("replace") for stream in streams
        }
        self._pending: list[tuple[Stream, str]] = []
        self.bytes = 0

    def add(self, stream: Stream, chunk: bytes) -> None:
        with self._lock:
            self.bytes += len(chunk)
            text = self._decoders[stream].decode(chunk)
            if not text:
                return
            if self._pending and self._pending[-1][0] == stream:
                self._pending[-1] = (stream, self._pending[-1][1] + text)
            else:
                self._pending.append((stream, text))

    def take(self, *, final: bool = False) -> list[tuple[Stream, str]]:
        """What arrived since the last ``take``; ``final``: the output has ended, so an
        incomplete character at a stream's end is decoded as it is (U+FFFD)."""
        with self._lock:
            if final:
                for stream, decoder in self._decoders.items():
                    tail = decoder.decode(b"", final=True)
                    if tail:
                        self._pending.append((stream, tail))
            taken, self._pending = self._pending, []
            return taken
