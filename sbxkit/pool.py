"""Pre-started single-use sandboxes: a one-shot run without waiting for the daemon's start.

A ``Pool`` keeps containers of one *shape* (everything of a spec but its command, env, stdin,
time limit and output cap) created, verified, attached and started ahead of time, each parked
in a shell that waits for exactly one line on its stdin::

    sh -c 'nl=<LF> cr=<CR>; IFS= read -r l && eval "$l"'

A claim writes one line — ``export K='v'; ...; exec 'argv0' 'argv1' ...``, every word
shell-quoted (``claim_line``) — followed by the run's stdin, byte-exact (``read`` consumes
exactly one line from a pipe; ``sh -s`` would read ahead and eat the payload's input). From
there the run is the cold run's: the same output caps, the same time limit (it starts at the
claim), the same verdict. A container is never handed to a second claim.

Each pooled container is an ordinary sandbox of the backend: planned once, created through its
owner (the supervisor by default: journaled, admitted against the host's budget, removed if this
process dies), verified before it is parked, removed when claimed-and-done, when it has idled
``idle_ttl_s``, or when the pool closes. Refills run in the pool's own tasks, off the claim's
path: with nothing parked, ``Pool.run`` waits (at most ``CLAIM_WAIT_S``) only for a container
already being parked that no other claim waits for, and runs cold otherwise.

Served cold (``RunResult.pooled`` is False), never refused: a spec of another shape, a
command starting with ``-``, a time limit above the pool's ``max_timeout_s``, or an empty pool
with nothing under way for it.
Newlines in a command or env value ride spliced (``PARK_SCRIPT``). A batch's pools, one per
shape (sbxkit/shape_pools.py), share a ``ParkingBudget`` and are ``resize``d as its queue moves.
See docs/pool.md.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgspec
import trio

from sbxkit.attached import OutputCallback, Ran, supervise
from sbxkit.backends.docker import DockerBackend
from sbxkit.call_checks import check_pool_options
from sbxkit.engine.client import Waiter
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import CleanupError, SbxError
from sbxkit.outcome import Verdict, judge_exit
from sbxkit.owned import OwnedContainer, attached
from sbxkit.plan import CheckedSpec
from sbxkit.policy import claim_env
from sbxkit.result import RunResult
from sbxkit.spec import SandboxSpec
from sbxkit.stdin import Prefixed, StdinSource
from sbxkit.unwrap import plain_errors

__all__ = [
    "PARK_SCRIPT",
    "Claim",
    "ParkingBudget",
    "Pool",
    "claim_line",
    "claim_line_within",
    "open_pool",
    "parked_spec",
    "shape_of",
]

PARK_SCRIPT = "nl='\n' cr='\r'; IFS= read -r l && eval \"$l\""
"""The parked shell: one line, then that line is the payload (it ``exec``s the command). The
line cannot hold a newline or a carriage return: a word that has one is spliced from quoted
pieces and ``"$nl"``/``"$cr"``, which the shell defined before it read."""
REFILL_BACKOFF_S = 1.0
CLAIM_WAIT_S = 5.0
"""The longest ``Pool.run`` waits for a container being parked before it runs cold."""
_SPLICE = {"\n": '"$nl"', "\r": '"$cr"'}


def _quote(word: str) -> str:
    """``word`` as one shell word on one line."""
    if "\n" not in word and "\r" not in word:
        return shlex.quote(word)
    pieces: list[str] = []
    current = ""
    for char in word:
        if char in _SPLICE:
            pieces += [shlex.quote(current), _SPLICE[char]]
            current = ""
        else:
            current += char
    pieces.append(shlex.quote(current))
    return "".join(pieces)


def claim_line(command: list[str], env: dict[str, str]) -> bytes | None:
    """The one line a claim writes, or None when the run cannot be claimed this way (a NUL,
    which no argv or environment can hold, or a command the shell's ``exec`` would take for
    an option)."""
    if any("\0" in word for word in [*command, *env, *env.values()]):
        return None
    if not command or command[0].startswith("-"):
        return None
    exports = "".join(f"export {key}={_quote(value)}; " for key, value in sorted(env.items()))
    return (exports + "exec " + " ".join(_quote(word) for word in command) + "\n").encode()


def claim_line_within(spec: SandboxSpec, max_timeout_s: float) -> bytes | None:
    """``spec``'s claim line, or None when a pool with this ``max_timeout_s`` serves it cold
    whatever it holds (no line, or a longer time limit)."""
    timeout_s = spec.limits.timeout_s
    if timeout_s is None or timeout_s > max_timeout_s:
        return None
    return claim_line(list(spec.command), claim_env(spec))


def shape_of(spec: SandboxSpec) -> SandboxSpec:
    """What a pooled container is created from: the spec without its command, env, time
    limit and output cap (they come with the claim)."""
    limits = msgspec.structs.replace(spec.limits, timeout_s=1.0, output_bytes=1)
    return msgspec.structs.replace(spec, command=["sh"], env={}, limits=limits)


def parked_spec(spec: SandboxSpec, idle_ttl_s: float, max_timeout_s: float) -> SandboxSpec:
    """The spec a parked container of ``spec``'s shape is planned from: the parked shell, no
    env, and a time limit that covers the longest wait plus the longest claimed run."""
    limits = msgspec.structs.replace(
        spec.limits, timeout_s=idle_ttl_s + max_timeout_s, output_bytes=1
    )
    return msgspec.structs.replace(shape_of(spec), command=["sh", "-c", PARK_SCRIPT], limits=limits)


_LineFirst = Prefixed
"""The claim line, then the run's own stdin (bytes or a stream), closed with it."""


@dataclass(eq=False)
class _Parked:
    """One started container waiting for its one claim."""

    box: OwnedContainer
    attach: HijackedStream
    waiter: Waiter
    done: trio.Event = field(default_factory=trio.Event)
    removed: trio.Event = field(default_factory=trio.Event)
    claimed: bool = False


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


class Pool:
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
        self.backend = backend
        self.budget = budget
        self.refill = refill
        self.size = size
        self.idle_ttl_s = idle_ttl_s
        self.max_timeout_s = max_timeout_s
        self.shape = shape_of(spec)
        parked = parked_spec(spec, idle_ttl_s, max_timeout_s)
        self._checked: CheckedSpec = backend.check(parked, "run")
        self._ready: list[_Parked] = []
        self._starting = [0]
        self._waiting = 0  # run() calls waiting for a park under way (one per park)
        self._filled_once = False
        self._wanted = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self.last_error: SbxError | None = None
        """Why the last container could not be parked (None once one was)."""
        self._changed = trio.Event()
        self.cleanup_errors: list[CleanupError] = []
        if budget is not None:
            budget.listen(lambda: self._wanted.set())

    # -- keeping it full ------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        """Run the pool's tasks in ``nursery``; its first parks start before this returns (a
        claim right after may wait for one of them)."""
        self._nursery = nursery
        self._fill()
        nursery.start_soon(self._keep_full)

    def _fill(self) -> None:
        """Start parks until ``size`` are parked or under way (once only without refill)."""
        assert self._nursery is not None
        starting = self._starting
        while (
            len(self._ready) + starting[0] < self.size
            and not self._closing
            and (self.refill or not self._filled_once)
            and (self.budget is None or self.budget.take())
        ):
            starting[0] += 1
            self._nursery.start_soon(self._park_one, starting)
        self._filled_once = True

    async def _keep_full(self) -> None:
        while not self._closing:
            self._fill()
            self._wanted = trio.Event()
            await self._wanted.wait()
            if self.last_error is not None:
                await trio.sleep(REFILL_BACKOFF_S)  # e.g. a full host: claims run cold meanwhile

    async def _park_one(self, starting: list[int]) -> None:
        """Create, verify, attach, start; wait for a claim, the idle limit or the close; the
        owned container is removed when this returns, whatever happened. A failure is kept
        (``last_error``; a removal that failed is raised when the pool closes), never raised
        into the caller's block."""
        slot: _Parked | None = None
        try:
            async with (
                self.backend.own(self._checked, "run") as box,
                attached(box) as (attach, waiter),
            ):
                slot = _Parked(box, attach, waiter)
                starting[0] -= 1
                if not self._closing and len(self._ready) < self.size:  # not shrunk meanwhile
                    self._ready.append(slot)
                    self.last_error = None
                    self._signal()
                    with trio.move_on_after(self.idle_ttl_s):
                        await slot.done.wait()
                with contextlib.suppress(ValueError):
                    self._ready.remove(slot)  # idled out or closing: nobody may claim it now
                slot.done.set()
        except SbxError as exc:
            self.last_error = exc
            if isinstance(exc, CleanupError):
                self.cleanup_errors.append(exc)
            self._signal()
        finally:
            if slot is None:
                starting[0] -= 1
            else:
                slot.removed.set()
            if self.budget is not None and (slot is None or not slot.claimed):
                self.budget.give_back()
            self._wanted.set()
            self._signal()  # a run waiting for this park looks again (wait_for_park)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` (default: all ``size``) containers are parked; raise the error
        that stops parking (a missing image, say) instead of waiting for ever."""
        wanted = self.size if count is None else min(count, self.size)
        while len(self._ready) < wanted:
            if self.last_error is not None and not self._ready:
                raise self.last_error
            await self._changed.wait()

    # -- claims -----------------------------------------------------------------------------------

    def _take(self, spec: SandboxSpec) -> _Parked | None:
        if self._closing or not self._ready or shape_of(spec) != self.shape:
            return None
        slot = self._ready.pop(0)
        slot.claimed = True
        if self.budget is not None:
            self.budget.give_back()  # the container is its run's now
        self._wanted.set()  # refill in the background, off this claim's path
        return slot

    def resize(self, size: int) -> None:
        """Keep ``size`` containers parked from now on (0: none). More are parked in the pool's
        own tasks; the excess is removed at once, the longest parked first."""
        self.size = size
        while len(self._ready) > size:
            self._ready.pop(0).done.set()
        self._wanted.set()

    def take(self, spec: SandboxSpec | CheckedSpec) -> Claim:
        """Decide, at once and without waiting, which path ``spec`` runs on: a parked container
        taken for it alone (``Claim.pooled``), or cold. ``Claim.run`` runs it."""
        checked = self.backend.check(spec, "run")
        line = claim_line_within(checked.spec, self.max_timeout_s)
        slot = None if line is None else self._take(checked.spec)
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
        claim = self.take(spec)
        if not claim.pooled and claim.line is not None:
            claim = await self.wait_for_park(claim)
        return await claim.run(stdin, on_output=on_output, wait_for_removal=wait_for_removal)

    async def wait_for_park(self, cold: Claim) -> Claim:
        """A cold ``take``'s second chance: with nothing parked, wait (at most
        ``CLAIM_WAIT_S``) for a container already being parked that no other claim waits for —
        it is further along than a cold create would be, and a cold run on top of the refills
        is what costs a busy daemon throughput (bench pool, sustained). Nothing under way, a
        failing park, another shape, a closed pool: ``cold`` as it was."""
        if (
            self._closing
            or self.last_error is not None
            or shape_of(cold.checked.spec) != self.shape
            or self._waiting >= self._starting[0]
        ):
            await trio.lowlevel.checkpoint()
            return cold
        self._waiting += 1
        try:
            with trio.move_on_after(CLAIM_WAIT_S):
                while not self._ready:
                    if self._closing or self.last_error is not None or not self._starting[0]:
                        return cold
                    await self._changed.wait()
                return self.take(cold.checked)
            return cold
        finally:
            self._waiting -= 1

    async def aclose(self) -> None:
        """Remove every parked container (their tasks end, and the pool's nursery with them)."""
        self.close()

    def close(self) -> None:
        """``aclose`` without waiting: the removals go on in the pool's tasks."""
        self._closing = True
        for slot in list(self._ready):
            slot.done.set()
        self._ready.clear()
        self._wanted.set()


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
            self.slot.done.set()

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
        stream = _LineFirst(self.line, stdin)
        return await _claim(self.slot, stream, timeout_s, output_bytes, on_output, wait_for_removal)


async def _claim(
    slot: _Parked,
    stdin: _LineFirst,
    timeout_s: float,
    output_bytes: int,
    on_output: OutputCallback | None,
    wait_for_removal: bool,
) -> RunResult:
    box, clock = slot.box, trio.current_time
    t_claim = clock()
    try:
        outcome = await supervise(
            slot.attach, slot.waiter, stdin, output_bytes, timeout_s, on_output
        )
        run_s = clock() - t_claim
        verdict, exit_code = Verdict(status=outcome.status), None
        if outcome.status == "exited":
            exit_code = outcome.exit_code
            verdict = await judge_exit(box.engine, box.container_id, exit_code)
        denials = await box.denials()  # its governed network's, before the lease ends
    except BaseException:
        slot.done.set()
        with trio.CancelScope(shield=True):
            await slot.removed.wait()  # an error or a cancellation leaves after removal
        raise
    slot.done.set()
    if wait_for_removal:
        await slot.removed.wait()  # the owned container's own shielded, bounded removal
    ran = Ran(
        verdict=verdict,
        exit_code=exit_code,
        capture=outcome.capture,
        start_s=0.0,
        run_s=run_s,
    )
    result = ran.result(box, denials)
    return msgspec.structs.replace(
        result,
        pooled=True,
        timings=msgspec.structs.replace(result.timings, queued_s=0.0, create_s=0.0),
    )


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
    with plain_errors():  # the caller's own error leaves as itself, not in a group
        async with trio.open_nursery() as nursery:
            pool.start(nursery)
            try:
                yield pool
            finally:
                with trio.CancelScope(shield=True):
                    await pool.aclose()
    if pool.cleanup_errors:
        raise pool.cleanup_errors[0]
