"""The one claim mechanism: containers parked for one claim each, and the parks under way.

Both pools use it — the in-process ``Pool`` (``inprocess.py``) and the pools the supervisor
holds (``sbxkit/supervisor/pooling.py``). A claim takes the oldest parked container at once;
with none parked it may wait (at most ``CLAIM_WAIT_S``) for a park already under way that no
other claim waits for — it is further along than a cold create would be, and a cold run on top
of the refills is what costs a busy daemon throughput (bench pool, sustained). Nothing under
way, a failing park, a closed pool: the claim goes cold at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import trio

__all__ = ["CLAIM_WAIT_S", "Parking", "ParkingBudget"]

CLAIM_WAIT_S = 5.0
"""The longest a claim waits for a container being parked before it runs cold."""

T = TypeVar("T")


class Parking(Generic[T]):
    """Parked containers (oldest first), how many parks are under way, and who waits."""

    def __init__(self) -> None:
        self.ready: list[T] = []
        """Parked, each waiting for its one claim, oldest first."""
        self.starting = 0
        """Parks under way (created or being created, not parked yet)."""
        self.waiting = 0
        """Claims waiting for a park under way (at most one per park)."""
        self._changed = trio.Event()

    def changed(self) -> None:
        """Something a waiting claim looks at changed: a container parked, a park ended or
        failed, the pool closed."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def park(self, item: T) -> None:
        self.ready.append(item)
        self.changed()

    def take(self) -> T | None:
        """The oldest parked container, if one is parked."""
        return self.ready.pop(0) if self.ready else None

    def can_wait(self) -> bool:
        """A park is under way that no other claim waits for."""
        return self.waiting < self.starting

    async def take_or_wait(self, hopeless: Callable[[], bool]) -> T | None:
        """The oldest parked container; with none parked, the next one parked while a park
        is under way for this claim (at most ``CLAIM_WAIT_S``). None — go cold — when none
        is parked and none is under way for it, or once ``hopeless()`` (a closed pool, a
        failing park)."""
        if self.ready:
            return self.ready.pop(0)
        if hopeless() or not self.can_wait():
            await trio.lowlevel.checkpoint()
            return None
        self.waiting += 1
        try:
            with trio.move_on_after(CLAIM_WAIT_S):
                while not self.ready:
                    if hopeless() or not self.starting:
                        return None
                    await self.wait_changed()
                return self.ready.pop(0)
            return None
        finally:
            self.waiting -= 1


class ParkingBudget:
    """How many containers the pools sharing it may hold unclaimed at once: being created,
    parked, or being removed unclaimed. A claimed container is its run's and no longer counts.
    One budget keeps a batch's pools (one per shape) within the batch's parallelism."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0
        self.peak = 0
        """The most ever held at once."""
        self._listeners: list[Callable[[], None]] = []

    def listen(self, poke: Callable[[], None]) -> None:
        """``poke()`` whenever room is given back."""
        self._listeners.append(poke)

    def resize(self, total: int) -> None:
        """A new bound (a batch's in-flight limit moved). Lower than what is held: no more is
        taken until enough is given back; higher: the listeners are told of the room."""
        grew = total > self.total
        self.total = total
        if grew:
            for poke in self._listeners:
                poke()

    def take(self) -> bool:
        if self.held >= self.total:
            return False
        self.held += 1
        self.peak = max(self.peak, self.held)
        return True

    def give_back(self) -> None:
        self.held -= 1
        for poke in self._listeners:
            poke()
