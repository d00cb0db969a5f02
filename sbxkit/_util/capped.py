"""The first N bytes of one output stream, and whether more came (pure, standard library only:
every capture of sandbox output keeps it with this — ``output.py``, ``stdio.py`` and the
command line's hand-off, ``sbxkit/handoff/client.py``).

A cap of N lets exactly N bytes through; byte N+1 marks the stream exceeded. The first bytes
are kept, not the tail: the start of the output is what explains a run.
"""

from __future__ import annotations

__all__ = ["CappedBuffer"]


class CappedBuffer:
    """The first ``cap`` bytes of one stream, plus a count of everything offered."""

    def __init__(self, cap: int) -> None:
        if cap < 0:
            raise ValueError(f"cap must be >= 0, got {cap}")
        self._cap = cap
        # Chunks joined once at the end: appending to a bytearray would copy a large output
        # many times over as it grows.
        self._chunks: list[bytes] = []
        self._kept_len = 0
        self._total_seen = 0
        self._exceeded = False

    @property
    def cap(self) -> int:
        return self._cap

    @property
    def exceeded(self) -> bool:
        """True once more than ``cap`` bytes were offered."""
        return self._exceeded

    @property
    def total_seen(self) -> int:
        """Bytes offered so far, dropped ones included."""
        return self._total_seen

    @property
    def kept_bytes(self) -> int:
        return self._kept_len

    def add(self, data: bytes) -> bool:
        """Keep what still fits; return True only on the call that first goes past the cap."""
        self._total_seen += len(data)
        room = self._cap - self._kept_len
        if room > 0 and data:
            piece = bytes(data) if len(data) <= room else bytes(memoryview(data)[:room])
            self._chunks.append(piece)
            self._kept_len += len(piece)
        if self._exceeded or self._total_seen <= self._cap:
            return False
        self._exceeded = True
        return True

    def value(self) -> bytes:
        if len(self._chunks) != 1:
            self._chunks = [b"".join(self._chunks)]
        return self._chunks[0]
