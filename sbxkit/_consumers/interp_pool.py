"""Warm interpreters: ``open_interpreter_pool`` keeps interpreters started ahead of time, each
in its own sandbox with the named modules already imported, and ``InterpreterPool.interpreter``
hands one to exactly one session (docs/interpreter.md, "Warm interpreters").

Each parked interpreter is an ordinary ``open_interpreter`` block run in the pool's own task:
its sandbox is created, verified and owned like any session (the supervisor removes it if this
process dies), and its interpreter has imported ``preload`` and said it is ready. A claim takes
the oldest parked one (``Parking``, the mechanism the container pools share): nothing parked,
it waits only for a park under way that no other claim waits for, and starts cold otherwise —
never refused. A claimed interpreter is never parked again: the claim's block ends, its sandbox
is removed. Refills run in the pool's tasks, off the claim's path.

Time. A parked sandbox is planned with ``idle_ttl_s`` more than the spec's time limit (its
lease's backstop), and a claim's session gets the spec's own limit from the claim on: its
block is cancelled then (``SandboxExpired``), and ``run_code``'s default ``timeout`` is the
spec's ``timeout_s``, as for a cold interpreter.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from sbxkit._consumers.interpreter import (
    Interpreter,
    check_interpreter_options,
    open_interpreter,
)
from sbxkit._model.call_checks import check_pool_options
from sbxkit._model.spec import SandboxSpec, check_limit
from sbxkit._util.parking import Parking
from sbxkit._util.public import publish
from sbxkit._util.unwrap import plain_errors
from sbxkit.errors import SandboxExpired, SbxError, SpecError

__all__ = ["InterpreterPool", "open_interpreter_pool"]

REFILL_BACKOFF_S = 1.0


@dataclass(eq=False)
class _Warm:
    """One parked interpreter, waiting for its one claim."""

    interpreter: Interpreter
    claimed: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    removed: trio.Event = field(default_factory=trio.Event)


class InterpreterPool:
    """Up to ``size`` warm interpreters of one spec and ``preload`` (``open_interpreter_pool``)."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        size: int,
        preload: tuple[str, ...],
        python: str,
        idle_ttl_s: float,
        options: dict[str, Any],
    ) -> None:
        self.spec = spec
        self.size = size
        self.preload = preload
        self.python = python
        self.idle_ttl_s = idle_ttl_s
        timeout_s = spec.limits.timeout_s
        assert timeout_s is not None  # checked
        self.timeout_s: float = timeout_s
        self._parked_spec = msgspec.structs.replace(
            spec,
            limits=msgspec.structs.replace(spec.limits, timeout_s=idle_ttl_s + timeout_s),
        )
        self._options = options
        self.parking: Parking[_Warm] = Parking()
        self._wanted = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self.last_error: SbxError | None = None
        """Why the last interpreter could not be parked (None once one was)."""
        self.claims = {"warm": 0, "cold": 0}

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._fill()
        nursery.start_soon(self._keep_full)

    def _fill(self) -> None:
        assert self._nursery is not None
        parking = self.parking
        while len(parking.ready) + parking.starting < self.size and not self._closing:
            parking.starting += 1
            self._nursery.start_soon(self._park_one)

    async def _keep_full(self) -> None:
        while not self._closing:
            self._fill()
            self._wanted = trio.Event()
            await self._wanted.wait()
            if self.last_error is not None:
                await trio.sleep(REFILL_BACKOFF_S)  # a missing module, a full host: go cold

    async def _park_one(self) -> None:
        """Open an interpreter, park it, and hold its block open until its claim's block ends,
        it idles out or the pool closes; its sandbox is removed when this returns."""
        parking, slot = self.parking, None
        try:
            async with open_interpreter(
                self._parked_spec, python=self.python, preload=self.preload, **self._options
            ) as interp:
                interp._timeout_s = self.timeout_s
                slot = _Warm(interp)
                parking.starting -= 1
                if not self._closing and len(parking.ready) < self.size:
                    self.last_error = None
                    parking.park(slot)
                    with trio.move_on_after(self.idle_ttl_s):
                        await slot.claimed.wait()
                with contextlib.suppress(ValueError):
                    parking.ready.remove(slot)  # idled out or closing: nobody may claim it now
                if slot.claimed.is_set():
                    await slot.done.wait()  # the claim's block, bounded by its own deadline
        except SandboxExpired:
            pass  # a claimed session's deadline passed: the claim says so
        except SbxError as exc:
            self.last_error = exc
        finally:
            if slot is None:
                parking.starting -= 1
            else:
                slot.removed.set()
            self._wanted.set()
            parking.changed()

    async def wait_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` (default: all ``size``) interpreters are parked; raise the
        error that stops parking (a module that does not import, say) instead."""
        wanted = self.size if count is None else min(count, self.size)
        while len(self.parking.ready) < wanted:
            if self.last_error is not None and not self.parking.ready:
                raise self.last_error
            await self.parking.wait_changed()

    def _hopeless(self) -> bool:
        return self._closing or self.last_error is not None

    async def _take(self) -> _Warm | None:
        while True:
            slot = await self.parking.take_or_wait(self._hopeless)
            if slot is None:
                return None
            slot.claimed.set()
            self._wanted.set()  # refill off this claim's path
            interp = slot.interpreter
            gen = interp._gen
            alive = gen is not None and gen.process is not None and gen.process.exit is None
            if interp._dead is None and alive:
                return slot
            slot.done.set()  # it died while parked: removed, and the claim looks again

    @asynccontextmanager
    async def interpreter(self) -> AsyncIterator[Interpreter]:
        """A fresh interpreter for this block alone: a warm one when one is parked (its
        ``warm`` is True), else one started cold with the same ``preload``. Its sandbox is
        removed when the block ends; the spec's time limit counts from the claim."""
        slot = None if self._closing else await self._take()
        if slot is None:
            self.claims["cold"] += 1
            async with open_interpreter(
                self.spec, python=self.python, preload=self.preload, **self._options
            ) as cold:
                yield cold
            return
        self.claims["warm"] += 1
        interp = slot.interpreter
        interp.warm = True
        box = interp.sandbox._box
        box.deadline = min(box.deadline, trio.current_time() + self.timeout_s)  # Sandbox.deadline
        try:
            with trio.CancelScope(deadline=box.deadline) as scope:
                yield interp
        finally:
            slot.done.set()
            with trio.CancelScope(shield=True):
                await slot.removed.wait()  # the session's own shielded, bounded removal
        if scope.cancelled_caught:
            raise SandboxExpired(box.lease, box.container_id, self.timeout_s) from None

    def close(self) -> None:
        """Remove every parked interpreter (claimed ones end with their claims' blocks)."""
        self._closing = True
        for slot in list(self.parking.ready):
            slot.done.set()
            slot.claimed.set()
        self.parking.ready.clear()
        self.parking.changed()
        self._wanted.set()


@asynccontextmanager
async def open_interpreter_pool(
    spec: SandboxSpec,
    *,
    size: int,
    preload: Sequence[str] = (),
    python: str = "python3",
    idle_ttl_s: float = 300.0,
    **options: Any,
) -> AsyncIterator[InterpreterPool]:
    """Keep ``size`` interpreters of ``spec`` warm for the block — each in its own sandbox,
    ``preload``'s modules imported — and hand each to one ``pool.interpreter()`` block. An
    interpreter idle for ``idle_ttl_s`` is replaced; every sandbox is removed when the block
    ends. ``python`` and ``options`` are ``open_interpreter``'s."""
    if not isinstance(spec, SandboxSpec):
        raise SpecError("spec", f"must be a SandboxSpec, got {type(spec).__name__}")
    check_pool_options(size, idle_ttl_s, 1.0)
    check_limit("timeout_s", spec.limits.timeout_s)
    modules, _ = check_interpreter_options(spec, python, preload)
    pool = InterpreterPool(
        spec,
        size=size,
        preload=modules,
        python=python,
        idle_ttl_s=float(idle_ttl_s),
        options=options,
    )
    with plain_errors():  # the caller's own error leaves as itself, not in a group
        async with trio.open_nursery() as nursery:
            pool.start(nursery)
            try:
                yield pool
            finally:
                pool.close()


publish(__name__, globals())  # public names show as sbxkit.NAME
