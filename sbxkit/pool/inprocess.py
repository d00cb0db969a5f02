"""Pre-started single-use sandboxes held by this process: ``open_pool``, ``Pool``, ``Claim``.

A ``Pool`` keeps containers of one *shape* (``shape.py``) created, verified, attached and
started ahead of time, each parked in a shell that waits for exactly one claim line
(``line.py``). A claim writes the line and then the run's stdin; from there the run is the
cold run's: the same output caps, the same time limit (it starts at the claim), the same
verdict. A container is never handed to a second claim.

Each pooled container is an ordinary sandbox of the backend: planned once, created through its
owner (the supervisor by default: journaled, admitted against the host's budget, removed if this
process dies), verified before it is parked, removed when claimed-and-done, when it has idled
``idle_ttl_s``, or when the pool closes. Refills run in the pool's own tasks, off the claim's
path (``keeping.py``, the loop the warm interpreter pool shares); a claim that finds nothing
parked waits only for a park already under way for it (``parking.py``, the mechanism the
supervisor's pools share), and runs cold otherwise.

A batch that drives the pool (``Pool.batch``: ``run_many(jobs, pool=pool)``) caps its refills at
the batch's demand: parked and under way never exceed the batch's jobs still to claim (plus
claims waiting for a park), so no container is parked for a job that does not exist and the
pool is not refilled when the batch ends — it refills again at its next claim (or
``wait_ready``) outside a batch.

Served cold (``RunResult.pooled`` is False), never refused: a spec of another shape, a
command the claim line cannot carry, a time limit above the pool's ``max_timeout_s``, or an
empty pool with nothing under way for it. A batch's pools, one per shape (``shapes.py``),
share a ``ParkingBudget`` and are ``resize``d as its queue moves. See docs/pool.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from sbxkit._kernel.scripts import GO_LINE
from sbxkit._lifecycle.attached import OutputCallback
from sbxkit._lifecycle.kernel_run import started_on_fifos
from sbxkit._lifecycle.kernel_watch import Feed
from sbxkit._lifecycle.owned import OwnedContainer, attached
from sbxkit._model.call_checks import check_pool_options
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.parking import ParkingBudget
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.docker import DockerBackend
from sbxkit.errors import CleanupError, SbxError
from sbxkit.pool.keeping import KeptPool
from sbxkit.pool.line import claim_line_within
from sbxkit.pool.shape import parked_spec, shape_of
from sbxkit.pool.transport import AttachTransport, ClaimTransport, FifoTransport

__all__ = ["Claim", "Pool", "PoolBatch", "open_pool", "parked_transport"]


@dataclass(eq=False)
class _Parked:
    """One started container waiting for its one claim (a ``keeping.Slot``)."""

    box: OwnedContainer
    transport: ClaimTransport
    taken: trio.Event = field(default_factory=trio.Event)
    """Claimed or dropped: parked no more."""
    done: trio.Event = field(default_factory=trio.Event)
    """Its claim is done with it (or nobody claimed it): remove it."""
    removed: trio.Event = field(default_factory=trio.Event)
    claimed: bool = False
    on_finish: Callable[[], None] | None = None
    """Called once, when a claimed run ends (the pool's refill for it, in a batch)."""

    def finish(self) -> None:
        """The claim is over (its run ended, failed or was given up): remove the container."""
        if self.done.is_set():
            return
        self.done.set()
        if self.on_finish is not None:
            self.on_finish()

    async def wait_claim(self) -> None:
        await self.taken.wait()

    async def let_go(self) -> None:
        if self.claimed:  # its run's own time limit bounds it; its lease's end at the latest
            with trio.move_on_at(self.box.deadline):
                await self.done.wait()
        self.finish()

    def drop(self) -> None:
        self.taken.set()
        self.finish()


class Pool(KeptPool[_Parked]):
    """Up to ``size`` parked containers of ``spec``'s shape (``open_pool``)."""

    def __init__(
        self,
        backend: DockerBackend,
        spec: SandboxSpec,
        *,
        size: int,
        idle_ttl_s: float,
        max_timeout_s: float,
        refill: bool = True,
        budget: ParkingBudget | None = None,
    ) -> None:
        super().__init__(size=size, idle_ttl_s=idle_ttl_s)
        self.backend = backend
        self.budget = budget
        self.refill = refill
        self.max_timeout_s = max_timeout_s
        self.shape = shape_of(spec)
        parked = parked_spec(spec, idle_ttl_s, max_timeout_s)
        self._checked: CheckedSpec = backend.check(parked, "run")
        self._filled_once = False
        self.cleanup_errors: list[CleanupError] = []
        self._batch_demand: int | None = None
        """The jobs still to claim of the batches driving the pool (``batch``); None when
        none has since its last claim outside a batch: then ``size`` is the only target."""
        self._batches = 0
        self._running = 0
        """Claimed containers whose run has not ended."""
        if budget is not None:
            budget.listen(lambda: self._wanted.set())

    # -- keeping it full (keeping.py) -------------------------------------------------------------

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[_Parked]:
        """Create, verify, attach, start: the owned container is removed when this ends."""
        async with (
            self.backend.own(self._checked, "run", kernel=True) as box,
            parked_transport(box) as transport,
        ):
            yield _Parked(box, transport)

    def _may_park(self) -> bool:
        return (self.refill or not self._filled_once) and (
            self.budget is None or self.budget.take()
        )

    def _batched(self) -> bool:
        return self._batch_demand is not None

    def target(self) -> int:
        """How many to keep parked or under way: ``size``; while a batch drives the pool, no
        more than its jobs still to claim and the claims waiting for a park under way, and
        ``size`` with the claimed runs not ended counted in (a refill yields to the claims:
        a claimed container is replaced when its run has ended, not while it runs)."""
        if self._batch_demand is None:
            return self.size
        wanted = self._batch_demand + self.parking.waiting
        return max(0, min(self.size - self._running, wanted))

    def _fill(self) -> None:
        """Start parks until ``target()`` are parked or under way (once only without
        refill)."""
        super()._fill()
        self._filled_once = True

    def _failed(self, exc: SbxError) -> None:
        """Kept; a removal that failed is raised when the pool closes."""
        super()._failed(exc)
        if isinstance(exc, CleanupError):
            self.cleanup_errors.append(exc)

    def _ended(self, slot: _Parked | None) -> None:
        if self.budget is not None and (slot is None or not slot.claimed):
            self.budget.give_back()

    async def wait_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` (default: all ``size``) containers are parked — while a batch
        drives the pool, no more than it parks for the batch; raise the error that stops
        parking (a missing image, say) instead of waiting for ever."""
        self._unbatched_claim()  # no batch drives the pool: it keeps its size again
        await super().wait_ready(count)

    # -- claims -----------------------------------------------------------------------------------

    def _serves(self, spec: SandboxSpec | CheckedSpec) -> CheckedSpec | None:
        """``spec`` checked, when a claim of it can take a parked container (else None: it
        runs cold, or meets its own error)."""
        try:
            checked = self.backend.check(spec, "run")
        except SbxError:
            return None
        if claim_line_within(checked.spec, self.max_timeout_s) is None:
            return None
        return checked if shape_of(checked.spec) == self.shape else None

    @contextlib.contextmanager
    def batch(self, specs: Sequence[SandboxSpec | CheckedSpec]) -> Iterator[PoolBatch]:
        """A batch of ``specs`` claims through the pool for the block (``PoolBatch.run``):
        meanwhile the pool parks no more than the batch's jobs still to claim. After the
        last batch the pool stays as the batches left it until a claim outside one."""
        served = {i: self._serves(spec) for i, spec in enumerate(specs)}
        batch = PoolBatch(self, {i: c for i, c in served.items() if c is not None})
        self._batches += 1
        self._batch_demand = (self._batch_demand or 0) + len(batch.unclaimed)
        try:
            yield batch
        finally:
            self._batches -= 1
            assert self._batch_demand is not None  # set above; only a claim outside clears it
            self._batch_demand -= len(batch.unclaimed)
            batch.unclaimed.clear()

    def _unbatched_claim(self) -> None:
        """A claim (or ``wait_ready``) outside any batch: the pool keeps ``size`` again."""
        if self._batches == 0 and self._batch_demand is not None:
            self._batch_demand = None
            self._wanted.set()

    def _take(self, spec: SandboxSpec) -> _Parked | None:
        if self._closing or shape_of(spec) != self.shape:
            return None
        slot = self.parking.take()
        return None if slot is None else self._claimed(slot)

    def _claimed(self, slot: _Parked) -> _Parked:
        slot.claimed = True
        slot.taken.set()  # its idle limit ends here: the run has the time after the claim
        if self.budget is not None:
            self.budget.give_back()  # the container is its run's now
        if not self._batched():
            return super()._claimed(slot)  # refill in the background, off this claim's path
        self._running += 1
        slot.on_finish = self._run_ended
        return slot

    def _run_ended(self) -> None:
        """A batch's claimed run ended: its replacement starts now, before the batch admits
        its next job (which may then wait for it rather than go cold)."""
        self._running -= 1
        if self._nursery is not None:
            self._fill()

    def resize(self, size: int) -> None:
        """Keep ``size`` containers parked from now on (0: none). More are parked in the pool's
        own tasks; the excess is removed at once, the longest parked first."""
        self.size = size
        while len(self.parking.ready) > size:
            self.parking.ready.pop(0).drop()
        self._wanted.set()

    def take(self, spec: SandboxSpec | CheckedSpec) -> Claim:
        """Decide, at once and without waiting, which path ``spec`` runs on: a parked container
        taken for it alone (``Claim.pooled``), or cold. ``Claim.run`` runs it."""
        checked = self.backend.check(spec, "run")
        self._unbatched_claim()
        return self._take_checked(checked)

    def _take_checked(self, checked: CheckedSpec) -> Claim:
        line = claim_line_within(checked.spec, self.max_timeout_s)
        slot = None if line is None else self._take(checked.spec)
        return self._claim(checked, slot, line)

    def _claim(self, checked: CheckedSpec, slot: _Parked | None, line: bytes | None) -> Claim:
        """The claim of ``slot`` with the line for its image (whose own values of the keys
        the parked shell sets are put back); cold if that line cannot be written after all."""
        if slot is not None:
            image_env = slot.box.plan.image_env
            line = claim_line_within(checked.spec, self.max_timeout_s, image_env=image_env)
            if line is None:
                slot.finish()  # removed unused; the run goes cold
                slot = None
        return Claim(self, checked, slot, line)

    async def run(
        self,
        spec: SandboxSpec | CheckedSpec,
        stdin: StdinSource | None = None,
        *,
        on_output: OutputCallback | None = None,
        wait_for_removal: bool = False,
    ) -> RunResult:
        """Run ``spec`` in a parked container when it can, cold through the backend otherwise
        (``RunResult.pooled`` says which).

        A pooled run returns at the payload's exit (its verdict judged) while its container's
        removal goes on in the pool, under the owner (``timings.remove_s`` is then 0); a
        removal that fails is raised when the pool closes. ``wait_for_removal`` returns only
        after the daemon confirmed removal, as a cold run does."""
        return await self._run(self.take(spec), stdin, on_output, wait_for_removal)

    async def _run(
        self,
        claim: Claim,
        stdin: StdinSource | None,
        on_output: OutputCallback | None,
        wait_for_removal: bool,
    ) -> RunResult:
        if not claim.pooled and claim.line is not None:
            claim = await self.wait_for_park(claim)
        return await claim.run(stdin, on_output=on_output, wait_for_removal=wait_for_removal)

    async def wait_for_park(self, cold: Claim) -> Claim:
        """A cold ``take``'s second chance (``Parking.take_or_wait``): the next container
        parked by a park already under way that no other claim waits for. Nothing under way, a
        failing park, another shape, a closed pool: ``cold`` as it was."""
        if shape_of(cold.checked.spec) != self.shape:
            await trio.lowlevel.checkpoint()
            return cold
        slot = await self._take_or_wait()
        if slot is None:
            return cold
        return self._claim(cold.checked, slot, cold.line)

    async def aclose(self) -> None:
        """Remove every parked container (their tasks end, and the pool's nursery with them);
        ``close`` does it without waiting."""
        self.close()


@dataclass(eq=False)
class PoolBatch:
    """A batch's claims through a pool (``Pool.batch``): each job it can serve counts down
    the batch's demand as it claims, before it takes, so no refill is started for it."""

    pool: Pool
    unclaimed: dict[int, CheckedSpec]
    """The batch's jobs the pool can serve that have not claimed yet, checked, by index."""

    async def run(
        self, index: int, spec: SandboxSpec | CheckedSpec, stdin: StdinSource | None = None
    ) -> RunResult:
        """Job ``index`` of the batch (``spec``), as ``Pool.run``."""
        pool = self.pool
        checked = self.unclaimed.pop(index, None)
        if checked is None:
            checked = pool.backend.check(spec, "run")  # cold: its own error, if any
        elif pool._batch_demand is not None:
            pool._batch_demand -= 1
        return await pool._run(pool._take_checked(checked), stdin, None, False)


@dataclass(eq=False)
class Claim:
    """One run's path, decided by ``Pool.take``: a parked container taken for it alone
    (``pooled``), or cold through the pool's backend. Run it once (``run``), or ``abandon`` it."""

    pool: Pool
    checked: CheckedSpec
    slot: _Parked | None
    line: bytes | None

    @property
    def pooled(self) -> bool:
        return self.slot is not None

    def abandon(self) -> None:
        """Give up a claim that will not run: its container is removed."""
        if self.slot is not None:
            self.slot.finish()

    async def run(
        self,
        stdin: StdinSource | None = None,
        *,
        on_output: OutputCallback | None = None,
        wait_for_removal: bool = False,
    ) -> RunResult:
        """``Pool.run``'s second half."""
        if self.slot is None or self.line is None:
            return await self.pool.backend.run_once(self.checked, stdin, on_output=on_output)
        limits = self.checked.spec.limits
        timeout_s, output_bytes = limits.timeout_s, limits.output_bytes
        assert timeout_s is not None  # checked
        assert output_bytes is not None
        return await _claim(
            self.slot, self.line, stdin, timeout_s, output_bytes, on_output, wait_for_removal
        )


async def _claim(
    slot: _Parked,
    line: bytes,
    stdin: StdinSource | None,
    timeout_s: float,
    output_bytes: int,
    on_output: OutputCallback | None,
    wait_for_removal: bool,
) -> RunResult:
    box, clock = slot.box, trio.current_time
    t_claim = clock()
    try:
        feed = Feed(line, stdin, output_bytes, timeout_s, on_output)
        ran = await slot.transport.run(feed, box.judge)
        run_s = clock() - t_claim
        denials = await box.denials()  # its governed network's, before the lease ends
        ports = await box.ports()
    except BaseException:
        slot.finish()
        with trio.CancelScope(shield=True):
            await slot.removed.wait()  # an error or a cancellation leaves after removal
        raise
    slot.finish()
    if wait_for_removal:
        await slot.removed.wait()  # the owned container's own shielded, bounded removal
    return ran.result(
        box.container_id,
        box.lease,
        start_s=0.0,
        run_s=run_s,
        remove_s=box.remove_s or 0.0,
        denials=denials,
        ports=ports,
    )


@asynccontextmanager
async def parked_transport(box: OwnedContainer) -> AsyncIterator[ClaimTransport]:
    """Start ``box`` parked, on the kernel's path when its plan put it there (FIFOs: the
    shell said it runs, the init is held, the go line lets the parked shell read its claim)
    and on the daemon's otherwise (attach and ``wait`` registered before the start)."""
    if box.plan.io_dir is None:
        async with attached(box) as (attach, waiter):
            yield AttachTransport(attach, waiter)
        return
    async with started_on_fifos(box) as (io, exited, evidence):
        await io.stdin.send_all(GO_LINE)
        yield FifoTransport(io, exited, evidence, box.engine, box.container_id)


@asynccontextmanager
async def open_pool(
    spec: SandboxSpec,
    *,
    size: int,
    backend: DockerBackend | None = None,
    idle_ttl_s: float = 300.0,
    max_timeout_s: float = 600.0,
    refill: bool = True,
) -> AsyncIterator[Pool]:
    """A pool of ``size`` parked containers of ``spec``'s shape for the block; every one of them
    is removed when the block ends. ``backend`` defaults to ``DockerBackend()`` (the
    supervisor owns every pooled container). ``refill=False`` parks ``size`` containers once
    and does not replace what is claimed or idles out."""
    check_pool_options(size, idle_ttl_s, max_timeout_s)
    pool = Pool(
        backend or DockerBackend(),
        spec,
        size=size,
        idle_ttl_s=float(idle_ttl_s),
        max_timeout_s=float(max_timeout_s),
        refill=refill,
    )
    async with pool.running():
        yield pool
    if pool.cleanup_errors:
        raise pool.cleanup_errors[0]


publish(__name__, globals())  # public names show as sbxkit.NAME
