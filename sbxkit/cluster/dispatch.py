"""A cluster batch's bookkeeping (pure): which job goes next, which attempt it is, what a lost
attempt leads to.

This is not a scheduler: it never chooses a node. It keeps the batch's order (jobs start in
input order; a retried job goes to the head of the driver's queue), bounds how many relay tasks
are in Ray at once, and counts attempts so that every job ends exactly once — with a result, or
with an error once its retries are used up — however many attempts were lost on the way.

Relays are submitted beyond what the accepted nodes hold (``ahead``): the ones that do not fit
wait in Ray, queued against the sbxkit resources, which is what Ray reports as resource demand
(``ray status``, the autoscaler's view) and what an autoscaler adds nodes for. Without it the
driver would hold the work back and Ray would see none waiting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sbxkit.errors import SpecError

AHEAD_MIN = 4
"""Relays queued in Ray beyond the accepted nodes' capacity: at least this many, else as many
as that capacity (so the demand Ray shows grows with the cluster)."""


def ahead(capacity: int) -> int:
    """How many relays may wait in Ray beyond ``capacity`` running ones."""
    return max(capacity, AHEAD_MIN)


class Dispatch:
    """Jobs are indexes ``0 .. count-1``. The caller asks ``next`` while it may submit, and
    reports each attempt's end: ``finished``, ``lost`` or ``not_placed``."""

    def __init__(self, count: int, *, parallel: int, retries: int, previous: Sequence[int]):
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise SpecError("retries", f"must be an integer >= 0, got {retries!r}")
        if len(previous) != count:
            raise ValueError("previous must give every job's earlier attempts")
        self.parallel = parallel
        self._queue: deque[int] = deque(range(count))
        self._attempts = list(previous)
        self._retries_left = [retries] * count
        self._ended = [False] * count
        self.in_flight: set[int] = set()

    def next(self, capacity: int) -> int | None:
        """The next job to submit, or None while ``min(parallel, capacity + ahead(capacity))``
        are in flight or nothing waits. ``capacity``: the sandboxes the accepted nodes
        advertise in all."""
        bound = min(self.parallel, capacity + ahead(capacity))
        if not self._queue or len(self.in_flight) >= bound:
            return None
        index = self._queue.popleft()
        self._attempts[index] += 1
        self.in_flight.add(index)
        return index

    def attempt(self, index: int) -> int:
        """The number of the job's current (or last) attempt, 1-based, across resumes."""
        return self._attempts[index]

    def skip(self, index: int) -> None:
        """The job ends without being submitted (refused before it could run)."""
        self._queue.remove(index)
        self._ended[index] = True

    def finished(self, index: int) -> None:
        """The attempt ended with a result or an sbxkit error: the job is done."""
        self.in_flight.remove(index)
        self._ended[index] = True

    def lost(self, index: int) -> bool:
        """The attempt's node or agent was lost. True: the job is queued again (at the head);
        False: its retries are used up and it ends with this attempt."""
        self.in_flight.remove(index)
        if self._retries_left[index] > 0:
            self._retries_left[index] -= 1
            self._queue.appendleft(index)
            return True
        self._ended[index] = True
        return False

    def not_placed(self, index: int) -> None:
        """Ray placed the relay where no accepted agent runs: nothing ran, so it is not an
        attempt; the job goes back to the head of the queue."""
        self.in_flight.remove(index)
        self._attempts[index] -= 1
        self._queue.appendleft(index)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def all_ended(self) -> bool:
        return all(self._ended)
