"""Decisions: one record per connection the sandbox's listeners took, and the denials a
``RunResult`` carries.

Pure. A ``Decision`` is written as one JSON line to the operator's audit log (``sandbox``,
``destination``, ``verdict``, bytes each way) when its connection ends — at once for a denial.
``Denials`` keeps the first ``MAX_DENIALS`` denials of a sandbox and counts the rest, so a
payload that loops on a refused name cannot grow its owner's memory.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from sbxkit._util.public import publish

__all__ = ["MAX_DENIALS", "Decision", "Denial", "Denials", "encode_decision"]

MAX_DENIALS = 100

Verdict = Literal["allowed", "denied"]
Kind = Literal["connect", "http", "callback", "request", "inbound"]


class Denial(msgspec.Struct, frozen=True, kw_only=True):
    """One connection the governed network refused: what was asked for and the rule."""

    destination: str
    """``host:port`` as the sandbox asked (``?`` when the request named none)."""
    reason: str
    kind: Kind = "request"


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    time: float
    sandbox: str
    """The lease of the sandbox that asked."""
    destination: str
    """``host:port`` as the sandbox asked."""
    verdict: Verdict
    kind: Kind
    """``connect`` (a CONNECT tunnel, or a connection to a listener of an allow entry),
    ``http`` (a plain request the proxy forwarded), ``callback`` (to the operator's callback
    endpoint), ``request`` (refused before its destination was known) or ``inbound`` (a host
    connection to an inbound port; ``address`` is the host peer's)."""
    reason: str | None = None
    """Why it was denied (None when allowed)."""
    rule: str | None = None
    """The allow entry that allowed it."""
    address: str | None = None
    """The address sbxkit connected to (resolved by sbxkit, never by the sandbox)."""
    bytes_up: int = 0
    bytes_down: int = 0
    injected: str | None = None
    """An inject rule that applied: its host and header name (``api.example.com
    Authorization``), never the value."""

    def denial(self) -> Denial:
        return Denial(destination=self.destination, reason=self.reason or "", kind=self.kind)


_ENCODER = msgspec.json.Encoder()


def encode_decision(decision: Decision) -> bytes:
    """One audit line (newline included)."""
    return _ENCODER.encode(decision) + b"\n"


class Denials:
    """A sandbox's denials so far: the first ``limit`` kept, the rest counted."""

    def __init__(self, limit: int = MAX_DENIALS) -> None:
        self.limit = limit
        self.kept: list[Denial] = []
        self.dropped = 0

    def add(self, denial: Denial) -> None:
        if len(self.kept) < self.limit:
            self.kept.append(denial)
        else:
            self.dropped += 1


publish(__name__, globals())  # public names show as sbxkit.NAME
