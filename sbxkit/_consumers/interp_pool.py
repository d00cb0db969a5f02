"""Warm interpreters: ``open_interpreter_pool`` keeps interpreters started ahead of time, each
in its own sandbox with the named modules already imported, and ``InterpreterPool.interpreter``
hands one to exactly one session (docs/interpreter.md, "Warm interpreters").

Each parked interpreter is an ordinary ``open_interpreter`` block run in the pool's own task:
its sandbox is created, verified and owned like any session (the supervisor removes it if this
process dies), and its interpreter has imported ``preload`` and said it is ready. The loop that
keeps the pool full is the in-process container pool's (``sbxkit.pool.keeping``). A claim takes
the oldest parked one: nothing parked, it waits only for a park under way that no other claim
waits for, and starts cold otherwise — never refused. A claimed interpreter is never parked
again: the claim's block ends, its sandbox is removed. Refills run in the pool's tasks, off the
claim's path.

Time. A parked sandbox is planned with ``idle_ttl_s`` more than the spec's time limit (its
lease's backstop), and a claim's session gets the spec's own limit from the claim on: its
block is cancelled then (``SandboxExpired``), and ``run_code``'s default ``timeout`` is the
spec's ``timeout_s``, as for a cold interpreter.
"""

from __future__ import annotations

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
from sbxkit._util.public import publish
from sbxkit.errors import SandboxExpired, SbxError, SpecError
from sbxkit.pool.keeping import KeptPool

__all__ = ["InterpreterPool", "open_interpreter_pool"]


@dataclass(eq=False)
class _Warm:
    """One parked interpreter, waiting for its one claim (a ``keeping.Slot``)."""

    interpreter: Interpreter
    claimed: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    removed: trio.Event = field(default_factory=trio.Event)

    async def wait_claim(self) -> None:
        await self.claimed.wait()

    async def let_go(self) -> None:
        if self.claimed.is_set():
            await self.done.wait()  # the claim's block, bounded by its own deadline

    def drop(self) -> None:
        self.done.set()
        self.claimed.set()


class InterpreterPool(KeptPool[_Warm]):
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
        super().__init__(size=size, idle_ttl_s=idle_ttl_s)
        self.spec = spec
        self.preload = preload
        self.python = python
        timeout_s = spec.limits.timeout_s
        assert timeout_s is not None  # checked
        self.timeout_s: float = timeout_s
        self._parked_spec = msgspec.structs.replace(
            spec,
            limits=msgspec.structs.replace(spec.limits, timeout_s=idle_ttl_s + timeout_s),
        )
        self._options = options
        self.claims = {"warm": 0, "cold": 0}

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[_Warm]:
        """An interpreter started, ``preload`` imported; its sandbox removed when this ends."""
        async with open_interpreter(
            self._parked_spec, python=self.python, preload=self.preload, **self._options
        ) as interp:
            interp._timeout_s = self.timeout_s
            yield _Warm(interp)

    def _failed(self, exc: SbxError) -> None:
        if not isinstance(exc, SandboxExpired):  # a claimed session's deadline: the claim says so
            super()._failed(exc)

    def _claimed(self, slot: _Warm) -> _Warm:
        slot.claimed.set()
        return super()._claimed(slot)

    async def _take(self) -> _Warm | None:
        while True:
            slot = await self._take_or_wait()
            if slot is None:
                return None
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
    async with pool.running():
        yield pool


publish(__name__, globals())  # public names show as sbxkit.NAME
