"""How many jobs a batch keeps in flight when the caller names no ``parallel``: a hill climb on
what each window of completed jobs measured (pure; ``paced.py`` is its I/O shell).

A fixed number per core is wrong both ways: a CPU-bound batch (HumanEval: about 70 ms of CPU a
job across the daemon, the runtime and the payload) saturates two cores with a few jobs in
flight, and more only add contention; an I/O-bound batch (jobs that sleep or wait) could keep
many more in flight than the cores suggest. So the limit starts at ``default_parallel()`` and
moves once per *window*: at least ``WINDOW_MIN_JOBS`` (and the current limit's worth of)
completed jobs over at least ``WINDOW_MIN_S``. A window measures two things:

- the host's CPU busy share over the window (``/proc/stat``: every core's non-idle time over
  its total; the shell reads it, a test injects it);
- the batch's throughput: jobs completed per second.

The rule, applied at the end of each window:

1. **A move that cost throughput is undone.** If throughput fell more than ``TOLERANCE`` below
   the best of the last ``MEMORY_WINDOWS`` windows (since the last undo), at a limit that never
   came within ``TOLERANCE`` of that best, the limit returns to the lowest limit that did, and
   holds there for ``HOLD_WINDOWS`` windows. Against the best, not the previous window: a
   run of small cuts, each within the noise of the one before, must not slide the limit far
   below where throughput was; to the lowest good limit: as many in flight as that throughput
   needs, no more.
2. Otherwise, **cores with idle time: raise** toward where they would saturate — the limit
   times ``SATURATED`` over the busy share (which grows about in proportion to the jobs in
   flight), at least a quarter more (at least one) and at most ``RAISE_AT_MOST`` times: more
   in flight is cheap while the cores are not the bottleneck — an I/O-bound batch climbs to
   the cap in a few windows, not one quarter a window.
3. **Saturated cores (busy share ≥ ``SATURATED``): lower** by an eighth (at least one): on busy
   cores fewer in flight do the same work with less contention, until a cut costs throughput
   and rule 1 puts it back — a CPU-bound batch settles at the knee of its curve. **Unless more
   in flight still pays**: a window more than ``TOLERANCE`` above the best of the remembered
   windows at any lower limit raises as rule 2 does. Jobs that wait fill a "saturated" host's
   last idle moments (256 ``sleep 1`` jobs on 2 cores read 90 % busy from 22 in flight on, yet
   took 15.6–17.7 s at 32 or 64 against 20.4–20.9 s where this rule used to stop them).

The limit always stays within ``[floor, cap]``: ``floor`` one job per core (fewer never keeps
the cores busy: a job spends much of its wall time waiting on the daemon), ``cap``
``PARALLEL_CAP``. An explicit ``parallel`` turns all of this off (``Pacer.fixed``): it is the
limit for the whole batch, as before.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "HOLD_WINDOWS",
    "MEMORY_WINDOWS",
    "RAISE_AT_MOST",
    "SATURATED",
    "TOLERANCE",
    "WINDOW_MIN_JOBS",
    "WINDOW_MIN_S",
    "CpuTimes",
    "Pacer",
    "Window",
    "busy_share",
    "parse_proc_stat",
]

SATURATED = 0.9
"""A busy share at or above this: the cores are the bottleneck."""
TOLERANCE = 0.1
"""A fall in throughput larger than this fraction counts as a loss (windows are noisy)."""
RAISE_AT_MOST = 2.0
"""An idle window multiplies the limit by at most this (its estimate of where the cores would
saturate may be far off: the host's other tenants, a window's noise)."""
HOLD_WINDOWS = 3
"""Windows the limit stays put after a move was undone."""
MEMORY_WINDOWS = 16
"""The windows a loss is judged against: older ones may have seen another load."""
WINDOW_MIN_JOBS = 8
"""A window is at least this many completed jobs (and at least the current limit)."""
WINDOW_MIN_S = 0.2
"""... over at least this long: ``/proc/stat`` counts in ticks of 10 ms."""


class CpuTimes(msgspec.Struct, frozen=True):
    """Cumulative CPU time of the host, all cores, in any unit: busy and total."""

    busy: float
    total: float


class Window(msgspec.Struct, frozen=True):
    """What one window measured."""

    busy: float
    """The host's CPU busy share over the window, 0..1."""
    throughput: float
    """Jobs completed per second over the window."""


def busy_share(before: CpuTimes, after: CpuTimes) -> float:
    """The busy share of the CPU time between two readings (0 when no time passed)."""
    total = after.total - before.total
    if total <= 0:
        return 0.0
    return min(1.0, max(0.0, (after.busy - before.busy) / total))


def parse_proc_stat(text: str) -> CpuTimes:
    """``/proc/stat``'s ``cpu`` line: busy is everything but idle and iowait (a core waiting
    on I/O could run something else)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(value) for value in fields[1:]]
            # user nice system idle iowait irq softirq steal [guest guest_nice: within user]
            total = sum(ticks[:8])
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            return CpuTimes(busy=float(total - idle), total=float(total))
    raise ValueError("no cpu line in /proc/stat")


class Pacer:
    """The in-flight limit of one batch and the rule that moves it (the module's doc)."""

    def __init__(self, start: int, *, floor: int = 1, cap: int) -> None:
        if not 1 <= floor <= cap:
            raise ValueError(f"need 1 <= floor <= cap, got floor={floor}, cap={cap}")
        self.floor = floor
        self.cap = cap
        self.adaptive = True
        self.limit = self._clamp(start)
        self._seen: list[tuple[int, float]] = []
        """The limit and throughput of the last windows since the last undo, oldest first."""
        self._hold = 0

    @classmethod
    def fixed(cls, parallel: int) -> Pacer:
        """A caller's own ``parallel``: the limit, never moved."""
        pacer = cls(parallel, floor=parallel, cap=parallel)
        pacer.adaptive = False
        return pacer

    def _clamp(self, limit: int) -> int:
        return max(self.floor, min(self.cap, limit))

    def window_due(self, completed: int, elapsed_s: float) -> bool:
        """Whether ``completed`` jobs over ``elapsed_s`` make a window to judge."""
        return (
            self.adaptive
            and completed >= max(WINDOW_MIN_JOBS, self.limit)
            and elapsed_s >= WINDOW_MIN_S
        )

    def observe(self, window: Window) -> int:
        """Judge one window run at the current limit; returns the limit from now on."""
        if not self.adaptive:
            return self.limit
        seen = self._seen
        self._seen = [*seen, (self.limit, window.throughput)][-MEMORY_WINDOWS:]
        if self._hold > 0:
            self._hold -= 1
            return self.limit
        best = max((throughput for _, throughput in seen), default=0.0)
        good = {limit for limit, throughput in seen if throughput >= best * (1 - TOLERANCE)}
        # A loss at a limit that did well before is the windows' noise, not a move's doing.
        if good and window.throughput < best * (1 - TOLERANCE) and self.limit not in good:
            self.limit = min(good)
            self._hold = HOLD_WINDOWS
            # Measured afresh from here: the host's load may have moved every figure.
            self._seen = []
            return self.limit
        below = max((t for limit, t in seen if limit < self.limit), default=None)
        # Saturated, yet more in flight still paying: the cores' last idle moments are being
        # filled (jobs that wait on busy cores), so the climb goes on.
        paying = below is not None and window.throughput > below * (1 + TOLERANCE)
        if window.busy >= SATURATED and not paying:
            self.limit = self._clamp(self.limit - max(1, self.limit // 8))
        else:
            self.limit = self._clamp(self._raised(window.busy))
        return self.limit

    def _raised(self, busy: float) -> int:
        """A quarter more (at least one); on idle cores up to where they would saturate."""
        step = max(1, self.limit // 4)
        if busy < SATURATED:
            # The busy share grows about in proportion to the jobs in flight.
            toward = int(self.limit * min(RAISE_AT_MOST, SATURATED / max(busy, 1e-9)))
            step = max(step, toward - self.limit)
        return self.limit + step
