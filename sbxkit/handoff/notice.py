"""The line a terminal sees while a run waits for capacity (standard library only: the
command line prints it on the hand-off too)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not loaded by the command line's hand-off
if TYPE_CHECKING:
    from typing import Any

__all__ = ["WaitingNotice"]


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
            print(f"sbxkit: waiting for capacity: {ahead} ahead", file=self.stream, flush=True)
