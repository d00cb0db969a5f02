"""Live metrics of a running sandbox from its cgroup on the host (``Sandbox.metrics``,
``sbxkit top``; the files and their proof: sbxkit/_kernel/cgroup_stats.py).

Where this host cannot read the cgroup — the daemon is remote or in a VM, so the pid it names
is no process here, or a counter's file is not readable by this user — ``MetricsUnavailable``
says which. The daemon's stats endpoint is not asked instead: it is another witness of the same
files, but one to take on the daemon's word, and ``Metrics`` promises the host's kernel's.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

import msgspec
import trio

from sbxkit._kernel.cgroup_stats import CgroupPlaces, cgroup_places, read_cgroups, read_sample
from sbxkit._model.result import Metrics
from sbxkit.engine.client import Engine
from sbxkit.errors import MetricsUnavailable, NotFound, SpecError

__all__ = ["DEFAULT_INTERVAL_S", "MetricsReader", "check_interval", "metric_stream"]

DEFAULT_INTERVAL_S = 1.0


def check_interval(interval_s: float, field: str = "interval_s") -> float:
    """``interval_s`` if it is a positive number of seconds, else ``SpecError`` naming
    ``field`` (as the caller typed it)."""
    if (
        isinstance(interval_s, bool)
        or not isinstance(interval_s, (int, float))
        or not math.isfinite(interval_s)
        or interval_s <= 0
    ):
        raise SpecError(field, f"must be a positive number of seconds, not {interval_s!r}")
    return float(interval_s)


def _unavailable(container_id: str, why: str) -> MetricsUnavailable:
    return MetricsUnavailable(f"no metrics for sandbox {container_id[:12]}: {why}")


def with_rate(sample: Metrics, previous: Metrics | None, elapsed_s: float) -> Metrics:
    """``sample`` with its CPU rate over ``elapsed_s`` since ``previous`` (pure)."""
    if (
        previous is None
        or elapsed_s <= 0
        or sample.cpu_time_s is None
        or previous.cpu_time_s is None
    ):
        return sample
    rate = max(0.0, sample.cpu_time_s - previous.cpu_time_s) / elapsed_s
    return msgspec.structs.replace(sample, cpu_rate=rate)


class MetricsReader:
    """One container's cgroup, found and proven once; ``read`` takes a reading."""

    def __init__(self, container_id: str, places: CgroupPlaces) -> None:
        self.container_id = container_id
        self.places = places
        self._previous: Metrics | None = None
        self._previous_at = 0.0

    @classmethod
    async def open(cls, engine: Engine, container_id: str) -> MetricsReader:
        """Find ``container_id``'s cgroup on this host through its init (``State.Pid``,
        proven by its ``/proc/PID/cgroup``); ``MetricsUnavailable`` where it cannot be."""
        try:
            state = (await engine.container_inspect(container_id)).state
        except NotFound:
            raise _unavailable(container_id, "the daemon has no such container") from None
        if not state.running:
            raise _unavailable(container_id, f"it is not running ({state.status})")
        text, why = read_cgroups(state.pid or 0, container_id)
        places = cgroup_places(text) if text is not None else None
        if text is not None and places is None:
            why = "its /proc/PID/cgroup names neither a v1 memory hierarchy nor a v2 one"
        if places is None:
            raise _unavailable(container_id, why)
        reader = cls(container_id, places)
        if reader.read() is None:
            raise _unavailable(container_id, f"its cgroup {places.memory} is gone")
        reader._previous = None  # the first reading the caller sees has no rate
        return reader

    def read(self) -> Metrics | None:
        """The counters now (with the CPU rate since the last reading), or None once the
        sandbox is gone. ``MetricsUnavailable`` for a counter this user may not read."""
        try:
            sample = read_sample(self.places)
        except PermissionError as exc:
            why = f"{exc.filename}: {exc.strerror} (read it as root)"
            raise _unavailable(self.container_id, why) from None
        now = time.monotonic()
        if sample is None:
            return None
        sample = with_rate(sample, self._previous, now - self._previous_at)
        self._previous, self._previous_at = sample, now
        return sample


async def metric_stream(
    engine: Engine, container_id: str, interval_s: float = DEFAULT_INTERVAL_S
) -> AsyncIterator[Metrics]:
    """A reading every ``interval_s`` seconds until the sandbox is gone (then it ends)."""
    interval_s = check_interval(interval_s)
    reader = await MetricsReader.open(engine, container_id)
    while (sample := reader.read()) is not None:
        yield sample
        await trio.sleep(interval_s)
