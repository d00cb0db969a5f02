"""Keeping a pool full: the park / refill / claim loop the pools held in this process share.

``KeptPool`` is the loop of the in-process ``Pool`` (``inprocess.py``) and of the warm
interpreter pool (``sbxkit._consumers.interp_pool``); what differs is what one park opens (a
parked container, a started interpreter) and what its slot does when parked, claimed or
dropped (``Slot``). Parking itself — the parked ones, the parks under way, a claim waiting for
one of them — is ``sbxkit._util.parking``. Each park runs in the pool's own task and holds its
sandbox open until its claim is done, it idles out (``idle_ttl_s``) or the pool closes; the
sandbox is removed when that task ends. Refills run in the pool's tasks, off the claim's path;
a park that fails is kept (``last_error``), never raised into the caller's block.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Generic, Protocol, TypeVar

import trio

from sbxkit._util.parking import Parking
from sbxkit._util.unwrap import plain_errors
from sbxkit.errors import SbxError

__all__ = ["REFILL_BACKOFF_S", "KeptPool", "Slot"]

REFILL_BACKOFF_S = 1.0
"""How long refills pause after a park failed (a full host, a missing image): claims go cold."""


class Slot(Protocol):
    """One parked thing waiting for its one claim, as the keeping loop sees it."""

    @property
    def removed(self) -> trio.Event:
        """Set once its sandbox is removed (its park's task ended)."""
        ...

    async def wait_claim(self) -> None:
        """Parked: wait until it is claimed or dropped (at most ``idle_ttl_s``)."""

    async def let_go(self) -> None:
        """Out of the parking: hold it for its claim's block if claimed, else let it go."""

    def drop(self) -> None:
        """Remove it unclaimed (the pool closes or shrinks)."""


S = TypeVar("S", bound=Slot)


class KeptPool(Generic[S]):
    """Up to ``size`` slots parked or under way, refilled in the pool's own tasks (``start``)."""

    def __init__(self, *, size: int, idle_ttl_s: float) -> None:
        self.size = size
        self.idle_ttl_s = idle_ttl_s
        self.parking: Parking[S] = Parking()
        self._wanted = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self.last_error: SbxError | None = None
        """Why the last park failed (None once one succeeded)."""

    # -- what a pool supplies ---------------------------------------------------------------------

    def _open(self) -> AbstractAsyncContextManager[S]:
        """One park: the slot, its sandbox created and ready; removed when the block ends."""
        raise NotImplementedError

    def _may_park(self) -> bool:
        """Room for one more park besides ``size`` (checked last: it may take the room)."""
        return True

    def _failed(self, exc: SbxError) -> None:
        self.last_error = exc

    def _ended(self, slot: S | None) -> None:
        """A park's task ends (``slot`` None: it failed before it parked)."""

    # -- keeping it full --------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Keep the pool full for the block (``start``); every parked slot is removed when it
        ends (``close``), and the block waits for its removals."""
        with plain_errors():  # the caller's own error leaves as itself, not in a group
            async with trio.open_nursery() as nursery:
                self.start(nursery)
                try:
                    yield
                finally:
                    self.close()

    def start(self, nursery: trio.Nursery) -> None:
        """Run the pool's tasks in ``nursery``; its first parks start before this returns (a
        claim right after may wait for one of them)."""
        self._nursery = nursery
        self._fill()
        nursery.start_soon(self._keep_full)

    def target(self) -> int:
        """How many to keep parked or under way: ``size``."""
        return self.size

    def _fill(self) -> None:
        """Start parks until ``target()`` are parked or under way."""
        assert self._nursery is not None
        parking = self.parking
        while (
            len(parking.ready) + parking.starting < self.target()
            and not self._closing
            and self._may_park()
        ):
            parking.starting += 1
            self._nursery.start_soon(self._park_one)

    async def _keep_full(self) -> None:
        while not self._closing:
            self._fill()
            self._wanted = trio.Event()
            await self._wanted.wait()
            if self.last_error is not None:
                await trio.sleep(REFILL_BACKOFF_S)  # e.g. a full host: claims run cold meanwhile

    async def _park_one(self) -> None:
        """Open a slot, park it, wait for a claim, the idle limit or the close, and hold it for
        its claim; its sandbox is removed when this returns, whatever happened."""
        parking, slot = self.parking, None
        try:
            async with self._open() as slot:
                parking.starting -= 1
                if not self._closing and len(parking.ready) < self.size:  # not shrunk meanwhile
                    self.last_error = None
                    parking.park(slot)
                    with trio.move_on_after(self.idle_ttl_s):
                        await slot.wait_claim()
                with contextlib.suppress(ValueError):
                    parking.ready.remove(slot)  # idled out or closing: nobody may claim it now
                await slot.let_go()
        except SbxError as exc:
            self._failed(exc)
        finally:
            if slot is None:
                parking.starting -= 1
            else:
                slot.removed.set()
            self._ended(slot)
            self._wanted.set()
            parking.changed()  # a claim waiting for this park looks again (take_or_wait)

    async def wait_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` (default: all ``size``) are parked; raise the error that stops
        parking (a missing image, a module that does not import) instead of waiting for ever."""
        wanted = self.size if count is None else min(count, self.size)
        while len(self.parking.ready) < min(wanted, self.target()):
            if self.last_error is not None and not self.parking.ready:
                raise self.last_error
            await self.parking.wait_changed()

    # -- claims -----------------------------------------------------------------------------------

    def _hopeless(self) -> bool:
        """A claim waiting for a park under way goes cold now."""
        return self._closing or self.last_error is not None

    async def _take_or_wait(self) -> S | None:
        """The oldest parked slot, or one parked while a park is under way for this claim
        (``Parking.take_or_wait``), claimed; None: go cold."""
        slot = await self.parking.take_or_wait(self._hopeless)
        return None if slot is None else self._claimed(slot)

    def _claimed(self, slot: S) -> S:
        self._wanted.set()  # refill in the background, off this claim's path
        return slot

    def close(self) -> None:
        """Remove every parked slot (claimed ones end with their claims); the removals go on
        in the pool's tasks."""
        self._closing = True
        for slot in list(self.parking.ready):
            slot.drop()
        self.parking.ready.clear()
        self.parking.changed()
        self._wanted.set()
