"""How much slower than the CI machine this one is: a factor for the suite's timing bounds.

A bound such as "a cold run with no stdin ends within 4 s" holds on the CI machine with room to
spare, and is exceeded by a machine that is slower at everything, such as the cgroup v2 cell's
VM under TCG (about 20 times slower; scripts/cgroup2-cell). ``bound`` scales such a bound by the
slowness measured once per session (the CPU time of a pure-Python loop against the CI
machine's), never below the bound as written, and never above a ceiling the test names: what
the failure it guards against would take (a payload's own timeout, a killer's budget), so a
scaled bound can still fail.
"""

from __future__ import annotations

import functools
import os
import time

REFERENCE_LOOP_S = 0.040
"""The CI machine's best time for ``_loop`` (0.033 s measured, idle; a little room so the CI
machine's own noise leaves its bounds as written)."""

MAX_FACTOR = 40.0
"""No machine is taken as more than this much slower: a broken measurement cannot make every
bound a minute long."""

ENV = "SBXKIT_TEST_SLOWNESS"
"""Set to a number, it replaces the measurement (>= 1; for a machine known to be slow)."""


def _loop() -> float:
    # CPU time, not wall time: the other work of a shared machine (the suite's own cells
    # beside it) must not loosen the bounds; a machine slow at everything (an emulated CPU)
    # still shows.
    started = time.process_time()
    total = 0
    for i in range(1_000_000):
        total += i * i % 7
    return time.process_time() - started


@functools.cache
def measured() -> tuple[float, float]:
    """(factor, the loop's best CPU time in seconds) for this session, best of five."""
    best = min(_loop() for _ in range(5))
    given = os.environ.get(ENV, "").strip()
    if given:
        return clamp(float(given)), best
    return clamp(best / REFERENCE_LOOP_S), best


def clamp(factor: float) -> float:
    return min(max(factor, 1.0), MAX_FACTOR)


def factor() -> float:
    return measured()[0]


def bound(seconds: float, *, ceiling: float) -> float:
    """``seconds`` scaled by this machine's slowness, at most ``ceiling`` (and never less than
    ``seconds``: the bound as written holds on the CI machine)."""
    return scaled(seconds, factor(), ceiling=ceiling)


def scaled(seconds: float, slowness: float, *, ceiling: float) -> float:
    """The pure rule of ``bound``."""
    if ceiling < seconds:
        raise ValueError(f"ceiling {ceiling} s is below the bound {seconds} s")
    return min(seconds * clamp(slowness), ceiling)
