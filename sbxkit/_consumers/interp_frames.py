"""The interpreter's framing (``open_interpreter``), pure: bytes in, checked frames out.

Each frame is a 4-byte big-endian length, then that many bytes of one JSON object. Nothing
from the interpreter is trusted: the code it runs shares its process. So every frame is bounded
before it is buffered (a length above ``max_frame`` is refused at once, not read), decoded
against a closed set of shapes (msgspec: unknown tags, missing or mistyped fields, invalid
base64 are refused), and a refusal is final — the decoder keeps nothing after it, and the
caller ends that interpreter and reports it (``InterpreterDied``).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from typing import Literal

import msgspec

from sbxkit._model.result import Stream
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = [
    "CodeError",
    "CodeResult",
    "CodeStatus",
    "FrameDecoder",
    "FrameRefused",
    "Out",
    "Ready",
    "Reply",
    "check_preload",
    "encode_request",
    "frame_bound",
]

HEADER = struct.Struct(">I")
FRAME_OVERHEAD = 64 * 1024
"""Room for a frame's keys, escapes and base64 over its capped contents."""

CodeStatus = Literal["ok", "error", "timed_out", "output_exceeded"]


class FrameRefused(ValueError):
    """A frame that is not what the protocol allows: ``reason`` says what was wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CodeError(msgspec.Struct, frozen=True):
    """What the code raised: the exception's class name, its ``str`` and its traceback."""

    name: str
    value: str
    traceback: str


class Ready(msgspec.Struct, tag_field="t", tag="ready", frozen=True):
    python: str
    preload_error: str | None = None
    """Set when a module named in ``preload`` did not import: which, and the exception."""


class Out(msgspec.Struct, tag_field="t", tag="out", frozen=True):
    id: int
    s: Stream
    d: str


class Reply(msgspec.Struct, tag_field="t", tag="result", frozen=True):
    id: int
    value: dict[str, str] | None
    error: CodeError | None
    displays: list[dict[str, str]] = msgspec.field(default_factory=list)


Frame = Ready | Out | Reply


class CodeResult(msgspec.Struct, frozen=True, kw_only=True):
    """One ``Interpreter.run_code`` call.

    ``status``: ``ok``; ``error`` (the code raised: ``error``); ``timed_out`` (its time limit
    passed and sbxkit interrupted it — ``error`` then shows the ``KeyboardInterrupt`` where it
    stopped); ``output_exceeded`` (stdout or stderr passed ``max_output`` bytes and sbxkit
    interrupted it; each keeps exactly the first ``max_output`` bytes). ``text`` is the repr
    of the last expression's value (None without one, or when it is None); ``data`` maps MIME
    types (``text/plain``, ``text/html``, ``image/png`` as base64, ``application/json``,
    ``text/markdown``) to that value's representations. ``displays`` are the matplotlib
    figures the call left open in pyplot (``plt.show()`` or not), in order, each as
    ``text/plain`` and ``image/png``; they are closed after. The status and the caps are
    sbxkit's own judgement; the rest is what the code's process said.
    """

    status: CodeStatus
    stdout: str = ""
    stderr: str = ""
    text: str | None = None
    data: dict[str, str] = msgspec.field(default_factory=dict)
    error: CodeError | None = None
    run_s: float = 0.0
    displays: list[dict[str, str]] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def frame_bound(max_output: int) -> int:
    """The largest frame a call capped at ``max_output`` may send: its result holds at most
    about eight capped texts, each at worst six bytes per character once JSON-escaped, and
    figures of at most ``4 * max_output`` bytes of JSON in all."""
    return 52 * max_output + FRAME_OVERHEAD


def encode_request(call_id: int, code: str, cap: int) -> bytes:
    """One request frame: run ``code``, capping each representation at ``cap`` characters."""
    body = json.dumps({"id": call_id, "code": code, "cap": cap}).encode("utf-8")
    return HEADER.pack(len(body)) + body


MAX_PRELOAD = 64


def check_preload(preload: object) -> tuple[str, ...]:
    """``preload``, checked: module names (dotted identifiers) the interpreter imports before
    it is ready. Refused with the name and the rule, before any container exists."""
    if isinstance(preload, str) or not isinstance(preload, (list, tuple)):
        raise SpecError("preload", f"must be a list of module names, got {type(preload).__name__}")
    if len(preload) > MAX_PRELOAD:
        raise SpecError("preload", f"must name at most {MAX_PRELOAD} modules")
    for name in preload:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise SpecError("preload", f"{name!r} is not a module name (dotted Python identifiers)")
    return tuple(preload)


_DECODER = msgspec.json.Decoder(Frame)


class FrameDecoder:
    """Split the interpreter's byte stream into checked frames. Holds at most one frame's
    bytes; after a refusal every later ``feed`` is refused too."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._refused: str | None = None

    def feed(self, data: bytes) -> list[Ready | Out | Reply]:
        if self._refused is not None:
            raise FrameRefused(self._refused)
        self._buffer += data
        frames: list[Ready | Out | Reply] = []
        try:
            while len(self._buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buffer)
                if size > self.max_frame:
                    raise FrameRefused(
                        f"a frame of {size} bytes, over the bound of {self.max_frame}"
                    )
                if len(self._buffer) < HEADER.size + size:
                    break
                body = bytes(self._buffer[HEADER.size : HEADER.size + size])
                del self._buffer[: HEADER.size + size]
                frames.append(decode_frame(body))
        except FrameRefused as exc:
            self._refused = exc.reason
            self._buffer.clear()
            raise
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)


def decode_frame(body: bytes) -> Ready | Out | Reply:
    """One frame's body, checked; ``FrameRefused`` says why not."""
    try:
        frame = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        why = _short(str(exc))
        raise FrameRefused(f"a malformed frame ({why}): {_short(repr(body))}") from None
    if isinstance(frame, Out):
        try:
            base64.b64decode(frame.d, validate=True)
        except (binascii.Error, ValueError):
            raise FrameRefused("an output frame whose data is not base64") from None
    return frame


def out_bytes(frame: Out) -> bytes:
    """An output frame's bytes (``decode_frame`` checked them)."""
    return base64.b64decode(frame.d, validate=True)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


publish(__name__, globals())  # public names show as sbxkit.NAME
