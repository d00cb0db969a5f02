"""Admission: which lease may be created now, in arrival order, within the host's budget.

Pure bookkeeping (no I/O, no waiting). The owner does the waiting — the supervisor
(``supervisor/service.py``) for every caller of its state dir, ``InProcessOwner`` for its own
process — so a sandbox is admitted in exactly one place whatever the caller. The rules
(docs/operations.md, "Capacity and admission"):

- **Memory is incompressible.** A lease reserves its memory limit from admission until its
  record is deleted (the container confirmed gone). The default budget is the daemon's
  ``MemTotal`` less a headroom for the host: the larger of 1 GiB and 10 %, never more than half.
- **CPU quotas are ceilings, not reservations.** They limit admission only when an operator
  sets a CPU budget. A quota above the daemon's CPU count can never be created at all.
- **Live sandboxes** are capped too (``max_running``); a lease over the cap waits like one over
  the memory budget.
- **Fair and starvation-free:** waiting requests are admitted strictly in arrival order; the
  head waits for room rather than being overtaken by smaller requests behind it.
- **Never fits → refused at once:** a request larger than the whole budget is refused before it
  is queued, with the flag, the asked value and the budget in the message.

Records and connections are different: they are hard bounds that fail explicitly (the
execution-boundary document), checked by the service before a request reaches this queue.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import msgspec

from sbxkit._model.units import GiB, format_size

K = TypeVar("K", bound=Hashable)


class Need(msgspec.Struct, frozen=True):
    """What one lease reserves: memory bytes and CPU in nano-CPUs (1e9 = one CPU)."""

    memory_bytes: int
    nano_cpus: int


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """What may be reserved at once. None on an axis: that axis does not limit admission."""

    memory_bytes: int | None
    nano_cpus: int | None = None
    max_running: int | None = None
    host_nano_cpus: int | None = None  # the daemon's NCPU: no container may ask for more


def memory_headroom(mem_total: int) -> int:
    """What the host keeps for itself: the larger of 1 GiB and 10 %, at most half."""
    return min(max(GiB, mem_total // 10), mem_total // 2)


def default_memory_budget(mem_total: int) -> int:
    return mem_total - memory_headroom(mem_total)


class NeverFits(msgspec.Struct, frozen=True):
    """Why a request can never be admitted: the spec field, the CLI flag and the rule."""

    field: str
    rule: str


def never_fits(need: Need, budget: Budget) -> NeverFits | None:
    """The reason ``need`` could not be admitted even on an idle host, or None."""
    if budget.memory_bytes is not None and need.memory_bytes > budget.memory_bytes:
        return NeverFits(
            "limits.memory_bytes",
            f"--memory {format_size(need.memory_bytes)} asked, more than the whole memory budget "
            f"of {format_size(budget.memory_bytes)}; it can never start",
        )
    if budget.host_nano_cpus is not None and need.nano_cpus > budget.host_nano_cpus:
        return NeverFits(
            "limits.cpus",
            f"--cpus {need.nano_cpus / 1e9:g} asked, more than the daemon's "
            f"{budget.host_nano_cpus / 1e9:g} CPUs; it can never start",
        )
    if budget.nano_cpus is not None and need.nano_cpus > budget.nano_cpus:
        return NeverFits(
            "limits.cpus",
            f"--cpus {need.nano_cpus / 1e9:g} asked, more than the whole CPU budget of "
            f"{budget.nano_cpus / 1e9:g}; it can never start",
        )
    return None


class AdmissionQueue(Generic[K]):
    """A FIFO of waiting requests and the reservations of admitted ones.

    ``enqueue`` a request, then ``admit_ready`` (after every change) returns the keys admitted
    now, in order; ``release`` returns an admitted key's reservation. ``hold`` reserves without
    waiting (records recovered at startup, whose containers may exist).
    """

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._waiting: dict[K, Need] = {}
        self._held: dict[K, tuple[Need, bool]] = {}
        self.memory_in_use = 0
        self.nano_cpus_in_use = 0
        self.running = 0

    def fits(self, need: Need) -> bool:
        b = self.budget
        return (
            (b.max_running is None or self.running < b.max_running)
            and (b.memory_bytes is None or self.memory_in_use + need.memory_bytes <= b.memory_bytes)
            and (b.nano_cpus is None or self.nano_cpus_in_use + need.nano_cpus <= b.nano_cpus)
        )

    def __contains__(self, key: object) -> bool:
        """Queued or admitted (holding a reservation)."""
        return key in self._waiting or key in self._held

    def enqueue(self, key: K, need: Need) -> None:
        if key in self._waiting or key in self._held:
            raise ValueError(f"{key!r} is already queued or admitted")
        self._waiting[key] = need

    def withdraw(self, key: K) -> bool:
        """Leave the queue (the caller left, or its deadline passed); False if not waiting."""
        return self._waiting.pop(key, None) is not None

    def admit_ready(self) -> list[K]:
        """Admit from the head while the head fits; the head is never overtaken."""
        admitted: list[K] = []
        for key, need in list(self._waiting.items()):
            if not self.fits(need):
                break
            del self._waiting[key]
            self._reserve(key, need, running=True)
            admitted.append(key)
        return admitted

    def hold(self, key: K, need: Need, *, running: bool = False) -> None:
        """Reserve without queueing, even beyond the budget (what already exists is counted)."""
        self._reserve(key, need, running=running)

    def stop_running(self, key: K) -> None:
        """The lease is no longer a live sandbox (an orphan now), but its memory stays held."""
        entry = self._held.get(key)
        if entry is not None and entry[1]:
            self._held[key] = (entry[0], False)
            self.running -= 1

    def start_running(self, key: K) -> None:
        """A held key is a live sandbox again (a lease re-adopted after a restart)."""
        entry = self._held.get(key)
        if entry is not None and not entry[1]:
            self._held[key] = (entry[0], True)
            self.running += 1

    def release(self, key: K) -> None:
        entry = self._held.pop(key, None)
        if entry is None:
            return
        need, running = entry
        self.memory_in_use -= need.memory_bytes
        self.nano_cpus_in_use -= need.nano_cpus
        self.running -= int(running)

    def ahead(self, key: K) -> int:
        """How many requests wait in front of ``key``."""
        for index, waiting in enumerate(self._waiting):
            if waiting == key:
                return index
        return 0

    def is_waiting(self, key: K) -> bool:
        return key in self._waiting

    def is_admitted(self, key: K) -> bool:
        return key in self._held

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _reserve(self, key: K, need: Need, *, running: bool) -> None:
        if key in self._held:
            raise ValueError(f"{key!r} is already admitted")
        self._held[key] = (need, running)
        self.memory_in_use += need.memory_bytes
        self.nano_cpus_in_use += need.nano_cpus
        self.running += int(running)


__all__ = [
    "AdmissionQueue",
    "Budget",
    "Need",
    "NeverFits",
    "default_memory_budget",
    "memory_headroom",
    "never_fits",
]
