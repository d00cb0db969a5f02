"""The I/O shell of a batch's adaptive in-flight limit (``run_many`` without ``parallel``).

``pacing.py`` has the rule and is pure; here are its inputs — the host's cores
(``default_parallel``, the limit it starts from), ``/proc/stat`` and the clock — and
``PacedLimit``, which counts a batch's completed jobs into windows and applies each move.
``Pacing`` is the caller's handle on it: the CPU reading to use (a test injects a script),
the bounds, and a hook that hears every judged window.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import trio

from sbxkit._consumers.pacing import CpuTimes, Pacer, Window, busy_share, parse_proc_stat
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = [
    "PARALLEL_CAP",
    "PARALLEL_PER_CORE",
    "PaceStep",
    "PacedLimit",
    "Pacing",
    "default_parallel",
    "read_proc_stat",
]

PARALLEL_PER_CORE = 4
"""Jobs in flight per core when the caller names no ``parallel`` (README.md, harness mode,
has the figures that chose it)."""
PARALLEL_CAP = 64
"""... and never more than this many: each one in flight holds a container and its memory."""


def default_parallel(cores: int | None = None) -> int:
    """``PARALLEL_PER_CORE`` per core (``cores``, else those this process may run on), at
    least one core's worth and at most ``PARALLEL_CAP``."""
    return max(PARALLEL_PER_CORE, min(PARALLEL_CAP, PARALLEL_PER_CORE * _cores(cores)))


def _cores(cores: int | None = None) -> int:
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def read_proc_stat() -> CpuTimes:
    """The host's CPU times now (``/proc/stat``); busy 0 of 0 where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            return parse_proc_stat(stat.read())
    except (OSError, ValueError):
        return CpuTimes(busy=0.0, total=0.0)  # busy_share reads it as idle: only raises


class PaceStep(msgspec.Struct, frozen=True, kw_only=True):
    """One judged window of an adaptive batch (``Pacing.on_window``)."""

    at: float
    """When the window ended and the new limit took effect (``trio.current_time()``)."""
    window: Window
    before: int
    after: int
    """The in-flight limit from ``at`` on."""


@dataclass(frozen=True, kw_only=True)
class Pacing:
    """``run_many(pacing=...)``: how a batch without ``parallel`` measures and bounds its
    in-flight limit (sbxkit/_consumers/pacing.py has the rule). The defaults are the host's."""

    cpu: Callable[[], CpuTimes] = read_proc_stat
    """The host's cumulative CPU times; a test injects a script."""
    on_window: Callable[[PaceStep], object] | None = None
    """Called (synchronously) with every judged window; an exception stops the batch."""
    start: int | None = None
    """The first limit (None: ``default_parallel()``)."""
    floor: int | None = None
    """The lowest limit (None: one per core this process may run on)."""
    cap: int = PARALLEL_CAP

    def pacer(self) -> Pacer:
        for name, value in (("start", self.start), ("floor", self.floor), ("cap", self.cap)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise SpecError(f"pacing.{name}", f"must be an integer >= 1, got {value!r}")
        cap = self.cap
        floor = min(cap, _cores()) if self.floor is None else self.floor
        if floor > cap:
            raise SpecError("pacing.floor", f"{floor} exceeds pacing.cap {cap}")
        start = default_parallel() if self.start is None else self.start
        return Pacer(start, floor=floor, cap=cap)


class PacedLimit:
    """The pacer's I/O shell for one batch: counts completions into windows, reads the CPU
    and the clock, and hands each new limit to ``set_limit`` (the batch's admission and its
    pools per shape)."""

    def __init__(
        self,
        pacer: Pacer,
        pacing: Pacing,
        set_limit: Callable[[int], None],
    ) -> None:
        self.pacer = pacer
        self.pacing = pacing
        self.set_limit = set_limit
        self._begin(self.pacing.cpu())

    def _begin(self, cpu: CpuTimes) -> None:
        self.completed = 0
        self.since = trio.current_time()
        self.cpu_since = cpu  # a window's end reading is the next one's start

    def job_done(self, queue_left: bool) -> bool:
        """Count one completed job; True when the limit rose (the dispatcher may start more).
        Once every job has started the batch only drains: nothing is left to pace."""
        if not self.pacer.adaptive or not queue_left:
            return False
        self.completed += 1
        now = trio.current_time()
        if not self.pacer.window_due(self.completed, now - self.since):
            return False
        # /proc/stat is procfs: its read does not block on a disk.
        cpu = self.pacing.cpu()
        window = Window(
            busy=busy_share(self.cpu_since, cpu), throughput=self.completed / (now - self.since)
        )
        before = self.pacer.limit
        after = self.pacer.observe(window)
        self.set_limit(after)
        self._begin(cpu)
        if self.pacing.on_window is not None:
            self.pacing.on_window(PaceStep(at=now, window=window, before=before, after=after))
        return after > before


publish(__name__, globals())  # public names show as sbxkit.NAME
