"""sbxkit's own time bounds on its machinery, and how a slow host stretches them. Pure.

The supervisor's launch (``LAUNCH_TIMEOUT_S``), an answer to a request
(``REPLY_TIMEOUT_S``) and one removal attempt (``REMOVE_ATTEMPT_BUDGET_S``) hold with room to
spare on a server. A host slower at everything (an emulated CPU, a loaded small VM) can exceed
them with nothing wrong: ``SBXKIT_HOST_SLOWNESS`` (a number from 1 to 100, how many times slower
than a server the host is) multiplies all three, and ``sbxkit run``'s hand-off handshake
(``sbxkit/handoff/client.py``). It never touches a sandbox's own limits (its
``timeout_s`` and startup deadline are the spec's).
"""

from __future__ import annotations

from sbxkit._util.slowness import MAX_SLOWNESS, SLOWNESS_ENV, slowness_factor
from sbxkit.errors import SpecError

LAUNCH_TIMEOUT_S = 15.0
"""How long a launched supervisor has to open its socket."""
REPLY_TIMEOUT_S = 30.0
"""How long the supervisor has to answer a request (the handshake, a registration, a detach)."""
REMOVE_ATTEMPT_BUDGET_S = 5.0
"""One attempt at removing a container before its record is left to the reaper."""

SLOWNESS_RULE = (
    f"must be a number from 1 to {MAX_SLOWNESS:g}: how many times slower than a server this "
    "host is (it multiplies the supervisor's launch, reply and removal bounds and the "
    "hand-off's handshake)"
)


def parse_slowness(raw: str | None) -> float:
    """The factor ``SBXKIT_HOST_SLOWNESS`` says (1 when unset or empty); anything else is a
    ``SpecError`` naming what was typed and the rule."""
    value = slowness_factor(raw)
    if value is None:
        raise SpecError(SLOWNESS_ENV, f"{SLOWNESS_RULE}; got {raw!r}")
    return value


def scaled(seconds: float, raw: str | None) -> float:
    """``seconds`` stretched by the slowness ``raw`` says."""
    return seconds * parse_slowness(raw)


__all__ = [
    "LAUNCH_TIMEOUT_S",
    "MAX_SLOWNESS",
    "REMOVE_ATTEMPT_BUDGET_S",
    "REPLY_TIMEOUT_S",
    "SLOWNESS_ENV",
    "parse_slowness",
    "scaled",
]
