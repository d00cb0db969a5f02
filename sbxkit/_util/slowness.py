"""``SBXKIT_HOST_SLOWNESS`` read as a number, standard library only: the hand-off client (a
process per ``sbxkit run``) stretches its handshake by it without loading ``sbxkit.errors``.
``sbxkit._model.bounds`` turns a bad value into the ``SpecError`` users see."""

from __future__ import annotations

import math

SLOWNESS_ENV = "SBXKIT_HOST_SLOWNESS"
MAX_SLOWNESS = 100.0
"""Past this a bound is minutes long: a fault would look like a hang."""


def slowness_factor(raw: str | None) -> float | None:
    """The factor ``raw`` says (1 when unset or empty), or None when it is no number from 1 to
    ``MAX_SLOWNESS``."""
    if raw is None or not raw.strip():
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or not 1.0 <= value <= MAX_SLOWNESS:
        return None
    return value


__all__ = ["MAX_SLOWNESS", "SLOWNESS_ENV", "slowness_factor"]
