"""The line a terminal sees while a run waits for capacity (standard library only: the
command line prints it on the hand-off too)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not loaded by the command line's hand-off
if TYPE_CHECKING:
    from typing import Any

__all__ = ["TERMINAL_RESET", "WaitingNotice", "say"]

TERMINAL_RESET = "\x18\x1b\\\x1b[0m\x1b(B\x0f"
"""What a payload's output may have left open on a terminal, ended before a line of sbxkit's
own: CAN and ST end an escape sequence or string (an unterminated ``ESC ]`` swallows all text
until one, sbxkit's ``timed out`` included), SGR 0 undoes hidden or same-colour text, and
``ESC ( B`` and SI bring back the ASCII character set."""


def say(line: str, stream: Any) -> None:
    """Print one line of sbxkit's own on ``stream``, where a terminal shows it whatever the
    payload printed before it."""
    isatty = getattr(stream, "isatty", None)
    prefix = TERMINAL_RESET if isatty is not None and isatty() else ""
    print(prefix + line, file=stream, flush=True)


class WaitingNotice:
    """Says on a terminal that the run waits for capacity, once it has waited a second, and
    again whenever its place in the queue changes."""

    AFTER_S = 1.0

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.told: int | None = None

    def __call__(self, ahead: int, waited_s: float) -> None:
        if waited_s >= self.AFTER_S and ahead != self.told:
            self.told = ahead
            say(f"sbxkit: waiting for capacity: {ahead} ahead", self.stream)
