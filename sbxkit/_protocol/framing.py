"""The supervisor protocol's frames: a 4-byte big-endian length, then a JSON document whose
``type`` field names the message (wire.py holds the vocabulary). Pure: bytes in, messages out.
A frame larger than ``MAX_FRAME`` is a ``WireError``; the connection is then dropped.
"""

from __future__ import annotations

import struct

import msgspec

from sbxkit.errors import WireError

MAX_FRAME = 8 * 1024 * 1024
"""Room for a Register of the largest spec: a 1 MiB command and 128 KiB of env, each byte
JSON-escaped to six bytes at worst (spec.MAX_COMMAND_BYTES, rules.ENV_SIZE_LIMIT)."""
_HEADER = struct.Struct(">I")


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """Base of every wire message; our own data, so unknown fields are refused."""


class LeaseMessage(Message):
    """A message about one lease, which it names first (the wire's ``lease`` field)."""

    lease: str


_encoder = msgspec.json.Encoder()


def encode(message: Message) -> bytes:
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME:
        raise WireError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME}-byte cap")
    return _HEADER.pack(len(payload)) + payload


class FrameReader:
    """Incremental frame splitter; ``feed`` returns complete payloads in order."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > self._max_frame:
                raise WireError(f"frame of {size} bytes exceeds the {self._max_frame}-byte cap")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buffer)
