"""The owner seam: who creates a sandbox's container and who guarantees its removal.

Every container sbxkit makes is created and removed through an ``Owner``. The runner never calls
the daemon's create or delete itself, so ownership can move out of the caller's process (the
supervisor) without touching the lifecycle.

``InProcessOwner`` owns containers from inside the caller's process. It survives timeouts, errors
and trio cancellation, but **not a killed caller**: if the process dies (SIGKILL, power loss)
between create and remove, the container stays. Use it only where a helper process cannot run. It
admits by the supervisor's rules (``sbxkit._lifecycle.admission``) within its own process: one queue
per daemon socket and trio run, shared by every ``InProcessOwner`` of that run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import trio

from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.admission import (
    AdmissionQueue,
    Budget,
    Need,
    default_memory_budget,
    never_fits,
)
from sbxkit._lifecycle.ownership import Removal, remove_until_gone
from sbxkit._lifecycle.uid_holds import UidHold, hold_own_uid
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._plan.policy import watched_disk
from sbxkit._protocol.journal import default_state_dir
from sbxkit._protocol.wire import Expiring, Launch
from sbxkit._util.public import publish
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import CleanupError, NeverFits, SpecError, UidTaken
from sbxkit.network.governor import Governor


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """What ``Owner.create`` is asked for: a stopped container for a lease."""

    lease: str
    name: str
    """The container's name (``sbxkit-<lease>``)."""
    body: ContainerCreate
    """The planned create body, as the owner must create it."""
    lifetime_s: float
    """The backstop: an owner that can act on its own removes the container once that long
    has passed since registration."""
    network: NetworkTerms | None = None
    """A governed sandbox's terms, for the owner to govern once the container started."""
    launch: Launch | None = None
    """What a ``LaunchingOwner`` verifies before it starts the container itself."""


class Owner(Protocol):
    """Creates and removes a lease's container."""

    @property
    def fifo_root(self) -> Path:
        """Where the kernel path's FIFO directories of this owner's leases live
        (``sbxkit._kernel``): the supervisor's is beside its state directory, so it can check
        and remove them."""
        ...

    async def create(self, request: CreateRequest) -> str:
        """Create ``request.body``'s stopped container; return its immutable id.

        ``request.network`` (given only for a governed sandbox) is what the owner will govern
        once the container started (``GoverningOwner.govern``); the supervisor re-checks the
        body against it.

        ``request.lifetime_s`` is the backstop: an owner that can act on its own (the supervisor)
        removes the container once that long has passed since registration, whatever the
        caller does.

        Must run to completion even if the caller is cancelled meanwhile (the id must be known
        so the container can be removed); the caller then removes it.
        """
        ...

    async def started(self, lease: str) -> None:
        """The caller started the lease's container: the daemon's launch work for it is done
        (the supervisor bounds creates and starts in flight and hands the slot on)."""
        ...

    def queued_s(self, lease: str) -> float:
        """How long the lease waited for admission before its create (0 when it fitted)."""
        ...

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        """Why the owner itself ended the lease's container (the supervisor's lifetime
        deadline, a writable root past its bound), if it did; None otherwise. Asked only of a
        signal exit: a removal sbxkit decided is never reported as someone else's kill."""
        ...

    async def release(self, lease: str) -> bool:
        """Hand the container's removal to the owner, if it removes on its own (the
        supervisor): ``remove`` then returns at once, while the lease closes only when the
        daemon confirmed the removal. True when it took the removal over, the lease's kernel
        path FIFO directory included. An owner that cannot (in-process) does nothing here,
        returns False and removes in ``remove``."""
        ...

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        """Remove the lease's container (by id, or by name and lease label if the id is unknown).

        Returns only once the daemon confirmed removal or that it is gone; raises CleanupError
        otherwise. Must be called from a shielded scope.
        """
        ...


@runtime_checkable
class InspectingOwner(Protocol):
    """An owner that inspects each container it created (the supervisor checks the admitted
    limits on the daemon's answer) and hands that answer on: the caller verifies its plan on
    it instead of asking the daemon again."""

    def created_inspection(self, lease: str) -> ContainerInspect | None:
        """The owner's post-create inspection of the lease's container, once; None if it
        has none (the caller inspects)."""
        ...


@runtime_checkable
class LaunchingOwner(Protocol):
    """An owner that can start a kernel path container itself the moment it has verified it
    against the caller's plan (``create``'s ``launch``: the supervisor, one round trip before
    the caller could). Only a container whose payload waits for its caller's go line is
    launched so: what starts is the shell that waits. ``launches`` False: not this one."""

    launches: bool

    async def create(self, request: CreateRequest) -> str: ...

    def launching(self, lease: str) -> bool:
        """The owner sent the lease's start (a container re-adopted mid-create was not)."""
        ...

    async def said_or_launched(
        self, lease: str, container_id: str, said: Callable[[], Awaitable[None]]
    ) -> bool:
        """Whichever comes first: ``said()`` (True) or the daemon's answer to the start
        (False); a refused start raises the daemon's error."""
        ...

    async def launch_answer(self, lease: str, container_id: str) -> None:
        """Return once the daemon answered the start (or the caller started it itself)."""
        ...


@runtime_checkable
class GoverningOwner(Protocol):
    """An owner that can govern a sandbox's network (docs/network.md): it runs the sandbox's
    listeners for as long as it owns the lease, so they die with it."""

    async def govern(
        self, lease: str, container_id: str, terms: NetworkTerms, user: tuple[int, int]
    ) -> None:
        """Put the lease's listeners in place (the container started; its payload not yet).
        Raises ``NetworkUnavailable`` when they cannot be: the payload must not run."""
        ...

    async def denials(self, lease: str) -> tuple[Denial, ...]:
        """What the lease's governed network refused so far."""
        ...

    async def ports(self, lease: str) -> tuple[PortForward, ...]:
        """The lease's inbound ports as bound on the host (empty before ``govern``)."""
        ...


@runtime_checkable
class DetachingOwner(Protocol):
    """An owner that can keep a lease without its caller for a while and hand it to another
    process that proves the secret (the supervisor; issue 40)."""

    state_dir: Path
    supervisor_command: str | None

    async def detach(self, lease: str, keep_s: float) -> tuple[str, float]:
        """Keep the lease at most ``keep_s`` seconds without this caller: the fresh secret
        that reattaches it once, and the keep deadline (unix seconds)."""
        ...

    async def reattach(
        self, lease: str, secret: str, *, network: NetworkTerms | None = None
    ) -> str:
        """Take a detached lease over with its secret: its container id."""
        ...


REMOVE_RETRY_CEILING_S = 1.0


class InProcessAdmission:
    """The admission queue and launch bound of one process, for one daemon (the supervisor's
    rules without a supervisor): memory waits its turn, creates + starts in flight are bounded."""

    def __init__(self, budget: Budget, launch_bound: int) -> None:
        self.queue: AdmissionQueue[str] = AdmissionQueue(budget)
        self._launching = trio.Semaphore(launch_bound)
        self._launch_held: set[str] = set()
        self._changed = trio.Event()

    async def admit(self, lease: str, need: Need) -> None:
        """Wait for room (FIFO), then for a launch slot. Cancellation leaves the queue."""
        impossible = never_fits(need, self.queue.budget)
        if impossible is not None:
            raise NeverFits(impossible.field, impossible.rule, lease=lease)
        self.queue.enqueue(lease, need)
        try:
            self._pump()
            while not self.queue.is_admitted(lease):
                await self._changed.wait()  # every release or withdrawal pumps and sets it
            await self._launching.acquire()
            self._launch_held.add(lease)
        except BaseException:
            self.queue.withdraw(lease)
            self.release(lease)
            raise

    def started(self, lease: str) -> None:
        if lease in self._launch_held:
            self._launch_held.discard(lease)
            self._launching.release()

    def release(self, lease: str) -> None:
        """The container is confirmed gone (or was never created)."""
        self.started(lease)
        self.queue.release(lease)
        self._pump()

    def _pump(self) -> None:
        """Admit what fits, then wake every waiter to look again (its place may have moved)."""
        self.queue.admit_ready()
        self._changed.set()
        self._changed = trio.Event()


_GATES: trio.lowlevel.RunVar[dict[str, InProcessAdmission]] = trio.lowlevel.RunVar("sbxkit_gates")


async def in_process_admission(engine: Engine) -> InProcessAdmission:
    """This trio run's admission for ``engine``'s daemon (made on first use from ``/info``)."""
    try:
        gates = _GATES.get()
    except LookupError:
        gates = {}
        _GATES.set(gates)
    gate = gates.get(engine.socket_path)
    if gate is None:
        info = await engine.cached_info()
        budget = Budget(
            memory_bytes=default_memory_budget(info.mem_total) if info.mem_total else None,
            host_nano_cpus=info.ncpu * 10**9 if info.ncpu else None,
        )
        gate = gates.setdefault(
            engine.socket_path, InProcessAdmission(budget, 2 * max(info.ncpu, 1))
        )
    return gate


def need_of_body(body: ContainerCreate) -> Need:
    host = body.host_config
    return Need(
        (host.memory or 0) if host is not None else 0,
        (host.nano_cpus or 0) if host is not None else 0,
    )


_GOVERNORS: trio.lowlevel.RunVar[trio.Nursery] = trio.lowlevel.RunVar("sbxkit_governors")


async def governor_nursery() -> trio.Nursery:
    """Where this trio run's in-process governors serve: a nursery in a system task, so a
    lease's listeners outlive the task that asked for them (a pool's park, a session's block)
    and end with the run at the latest."""
    try:
        return _GOVERNORS.get()
    except LookupError:
        pass
    ready: list[trio.Nursery] = []
    opened = trio.Event()

    async def host() -> None:
        async with trio.open_nursery() as nursery:
            ready.append(nursery)
            opened.set()
            await trio.sleep_forever()

    trio.lowlevel.spawn_system_task(host, name="sbxkit governors")
    await opened.wait()
    _GOVERNORS.set(ready[0])
    return ready[0]


class InProcessOwner:
    """Owns containers from the calling process; does not survive the caller being killed."""

    def __init__(self, engine: Engine, *, remove_budget_s: float = 60.0) -> None:
        self._engine = engine
        self.fifo_root = io_root(default_state_dir())
        """Beside the default state directory (no supervisor checks or removes them here)."""
        self._remove_budget_s = remove_budget_s
        self._queued: dict[str, float] = {}
        self._gate: InProcessAdmission | None = None
        self._governors: dict[str, Governor] = {}
        self._uids: dict[str, UidHold] = {}

    async def govern(
        self, lease: str, container_id: str, terms: NetworkTerms, user: tuple[int, int]
    ) -> None:
        """Run the lease's governor in this process (its listeners are this process's)."""
        governor = Governor(lease, terms, user=user)
        nursery = await governor_nursery()
        await nursery.start(governor.run, self._engine, container_id)
        self._governors[lease] = governor

    async def denials(self, lease: str) -> tuple[Denial, ...]:
        await trio.lowlevel.checkpoint()
        governor = self._governors.get(lease)
        return () if governor is None else governor.denied()[0]

    async def ports(self, lease: str) -> tuple[PortForward, ...]:
        await trio.lowlevel.checkpoint()
        governor = self._governors.get(lease)
        return () if governor is None else tuple(governor.ports)

    async def create(self, request: CreateRequest) -> str:
        # An in-process owner has no life of its own: lifetime_s is enforced by the runner's
        # timeout alone; it never launches (``launch`` is for a ``LaunchingOwner``). A cancel
        # that arrives while waiting for admission is honoured: nothing is under way yet.
        lease, body = request.lease, request.body
        if watched_disk(body) is not None:
            raise SpecError(
                "workspace.disk_bytes",
                "a writable image's bound is watched by the supervisor, and an in-process "
                "owner has no life of its own to watch it: use the default owner",
            )
        held = hold_own_uid(lease, body)
        if isinstance(held, str):
            raise UidTaken(lease, held)
        if held is not None:
            self._uids[lease] = held  # let go once the container is confirmed gone
        asked = trio.current_time()
        self._gate = gate = await in_process_admission(self._engine)
        await gate.admit(lease, need_of_body(body))
        self._queued[lease] = trio.current_time() - asked
        # Shielded: once the request may have reached the daemon, give up only with the id in
        # hand. The engine's own create deadline bounds this. Whatever happens, the caller's
        # remove() confirms the container gone and then returns the reservation.
        with trio.CancelScope(shield=True):
            container_id = await self._engine.container_create(body, name=request.name)
        return container_id

    async def started(self, lease: str) -> None:
        if self._gate is not None:
            self._gate.started(lease)

    def queued_s(self, lease: str) -> float:
        return self._queued.get(lease, 0.0)

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        await trio.lowlevel.checkpoint()
        return None  # it has no life of its own: it never ends a container unasked

    async def release(self, lease: str) -> bool:
        await trio.lowlevel.checkpoint()  # nothing runs on its own here: ``remove`` removes
        return False

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        self._queued.pop(lease, None)
        governor = self._governors.pop(lease, None)
        if governor is not None:
            governor.close()  # its listeners go with the lease
        removal = Removal()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self._remove_budget_s) as budget:
                await remove_until_gone(
                    self._engine,
                    lease,
                    name,
                    container_id,
                    removal,
                    ceiling_s=REMOVE_RETRY_CEILING_S,
                )
        if not budget.cancelled_caught:
            if self._gate is not None:
                self._gate.release(lease)  # confirmed gone: its memory is free again
            held = self._uids.pop(lease, None)
            if held is not None:
                held.release()  # and its uid
            return
        if self._gate is not None:
            self._gate.started(lease)  # the launch is over either way; memory stays held
        raise CleanupError(
            lease,
            container_id,
            f"not confirmed within {self._remove_budget_s:g} s "
            f"(last error: {removal.last_error or 'none'})",
        )


publish(__name__, globals())  # public names show as sbxkit.NAME
