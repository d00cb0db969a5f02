"""The owned container: created stopped, verified, owned, started, removed — the one lifecycle
under every consumer (one-shot runs, sessions, PTYs, stdio workers, grants, the harness).

``owned_container(plan, engine, owner)`` creates the plan's container through the owner, verifies it
against the plan and removes it through the owner on every exit (docs/architecture.md, "The one-shot
lifecycle", steps 3–4 and 9); ``attached`` attaches to it, registers the exit wait and starts it;
``ContainerProcess`` is the exit of a started container's main process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import msgspec
import trio

from sbxkit._kernel.fifos import make_io_dir, remove_io_dir, sandbox_ids
from sbxkit._kernel.rlimits import RlimitsUnenforced, enforce_rlimits
from sbxkit._kernel.userns import host_root_problem, read_uid_map, recorded_maps_problem
from sbxkit._lifecycle.outcome import Verdict, judge_exit
from sbxkit._lifecycle.owner import (
    CreateRequest,
    DetachingOwner,
    GoverningOwner,
    InspectingOwner,
    LaunchingOwner,
    Owner,
)
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.result import Status, Stream
from sbxkit._model.spec import body_ids
from sbxkit._plan.plan import Plan
from sbxkit._plan.verify import check_created
from sbxkit._protocol.wire import Expiring, Launch
from sbxkit._util.public import publish
from sbxkit.engine.client import Engine, Waiter
from sbxkit.engine.models import ContainerCreate, ContainerInspect, ContainerWaitReply
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import (
    Conflict,
    ContainerMismatch,
    EngineError,
    NetworkUnavailable,
    NotFound,
    SandboxExpired,
    SandboxUnusable,
    SbxError,
)

KILL_BUDGET_S = 10.0
"""How long ending a sandbox's process may take (kill, then confirm)."""


class SandboxExit(msgspec.Struct, frozen=True, kw_only=True):
    """How a PTY session's or a stdio worker's process ended.

    ``status`` as for a one-shot run: ``exit_code`` is the process's own only when it exited;
    after ``timed_out`` or ``output_exceeded`` sbxkit killed it. ``stderr`` is the captured
    (capped) standard error of a stdio worker; a TTY has none.
    """

    status: Status
    exit_code: int | None
    stderr: bytes = b""
    overflowed: Stream | None = None
    oom_evidence: str | None = None
    kill_evidence: str | None = None


class Detachment(msgspec.Struct, frozen=True, kw_only=True):
    """A lease its owner keeps without its caller (``OwnedContainer.detach``): the secret that
    reattaches it once, the keep deadline (unix seconds), and where its supervisor lives."""

    secret: str
    until: float
    state_dir: str
    supervisor_command: str | None = None

    def __repr__(self) -> str:
        return f"Detachment(until={self.until:.0f}, state_dir={self.state_dir!r})"


# --- the owned container --------------------------------------------------------------------


class OwnedContainer:
    """A created, verified, still stopped container, removed when its context ends."""

    def __init__(
        self, *, engine: Engine, plan: Plan, container_id: str, began: float, owner: Owner
    ) -> None:
        self.engine = engine
        self.plan = plan
        self.spec = plan.spec
        self.user = plan.user
        """``UID:GID`` its payload and every exec run as."""
        self.body = plan.body
        self.lease = plan.lease
        self.container_id = container_id
        self.queued_s = owner.queued_s(plan.lease)
        """How long the create waited for admission."""
        self.create_s = trio.current_time() - began - self.queued_s
        """Create and verification, not counting the wait for admission."""
        self.deadline = began + self.queued_s + plan.timeout_s
        """trio clock time at which the spec's time limit ends (``timeout_s`` after create
        began, not counting the wait for admission; the owner's backstop ends later)."""
        self.remove_s: float | None = None
        """How long removal took; set when the ``owned_container`` block has ended."""
        self.released = False
        """The owner took the removal over (``release``): the block's end does not wait."""
        self.launched_by_owner = False
        """Its owner starts it (``LaunchingOwner``): the kernel path waits for that start, or
        for its shell's word, instead of starting it (``owned_container``'s ``launch``)."""
        self._owner = owner

    async def start(self, *, launched: bool = True) -> None:
        """Start the container and tell the owner its launch is over (its launch slot goes to
        the next); then, for a governed network, have the owner put its listeners in place —
        before anything is written to the payload's stdin, which is what releases a gated or
        parked payload (sbxkit/network/gate.py, sbxkit/pool/). ``launched=False``: the caller
        says so itself later (``launched``) — a kernel path run, right after its go line."""
        await self.engine.container_start(self.container_id)
        await self.set_rlimits()
        await self.prove_root()
        if launched:
            await self.launched()
        await self.govern()

    async def set_rlimits(self) -> None:
        """An engine that dropped the body's ulimits (rootless Podman), once started and before
        its payload runs (a gated shell, a parked one): the host sets them on every process of
        the container and reads them back (``sbxkit._kernel.rlimits``); ``ContainerMismatch``
        if it cannot (the block's end removes the container)."""
        if not self.plan.host_rlimits:
            return
        await set_host_rlimits(self.engine, self.container_id, self.body)

    async def prove_root(self) -> None:
        """A workspace with root inside, once started and before its payload runs: the host's
        kernel must agree with the witness it was planned on (``sbxkit._kernel.userns``);
        ``ContainerMismatch`` if it does not (the block's end removes the container)."""
        witness = self.plan.root_witness
        if witness is None:
            return
        info = await self.engine.container_inspect(self.container_id)
        pid = info.state.pid or 0
        uid_map = await trio.to_thread.run_sync(read_uid_map, pid, self.container_id)
        problem = host_root_problem(uid_map, witness)
        if problem is not None:
            raise ContainerMismatch(self.container_id, problem)

    async def launched(self) -> None:
        """Tell the owner the container's launch is over: started, its payload let go."""
        await self._owner.started(self.lease)

    async def said_or_launched(self, said: Callable[[], Awaitable[None]]) -> bool:
        """For a container its owner starts: ``said()`` came first (True), or the daemon's
        answer to the start (False); a refused start raises the daemon's error."""
        assert self.launched_by_owner  # set only for a LaunchingOwner (owned_container)
        owner = cast(LaunchingOwner, self._owner)  # a runtime Protocol check costs ~16 µs
        return await owner.said_or_launched(self.lease, self.container_id, said)

    async def launch_answer(self) -> None:
        """For a container its owner starts: once the daemon answered the start."""
        assert self.launched_by_owner  # set only for a LaunchingOwner (owned_container)
        owner = cast(LaunchingOwner, self._owner)
        await owner.launch_answer(self.lease, self.container_id)

    async def release(self) -> None:
        """Hand the removal to the owner, if it removes on its own (``Owner.release``): the
        payload is done with the container."""
        self.released = await self._owner.release(self.lease)

    async def detach(self, keep_s: float) -> Detachment:
        """Hand the lease to its owner to keep without this process for at most ``keep_s``
        seconds (``DetachingOwner``): the secret that reattaches it and the keep deadline
        (unix seconds). The block's end then leaves the container to the owner."""
        if not isinstance(self._owner, DetachingOwner):
            raise SbxError(
                f"the owner {type(self._owner).__name__} cannot keep a sandbox without its "
                "caller: only the supervisor can"
            )
        secret, until = await self._owner.detach(self.lease, keep_s)
        self.released = True  # the owner's now: ``remove`` returns at once
        return Detachment(
            secret=secret,
            until=until,
            state_dir=str(self._owner.state_dir),
            supervisor_command=self._owner.supervisor_command,
        )

    @classmethod
    def reattached(
        cls, *, engine: Engine, plan: Plan, container_id: str, deadline: float, owner: Owner
    ) -> OwnedContainer:
        """The container of a lease taken over from another process (``DetachingOwner``),
        its time limit ending at ``deadline`` (trio clock) as it did there."""
        box = cls(
            engine=engine, plan=plan, container_id=container_id, began=trio.current_time(),
            owner=owner,
        )  # fmt: skip
        box.create_s = 0.0
        box.deadline = deadline
        return box

    @property
    def governed(self) -> bool:
        """The owner runs listeners for this sandbox (its payload waits for them)."""
        return self.plan.network is not None and self.plan.network.needs_governor

    async def govern(self) -> None:
        """The seam between a started container and its payload: the owner's listeners."""
        terms = self.plan.network
        if terms is None or not terms.needs_governor:
            return
        if not isinstance(self._owner, GoverningOwner):
            raise NetworkUnavailable(
                f"the owner {type(self._owner).__name__} cannot govern a network"
            )
        user = body_ids(self.user)
        await self._owner.govern(self.lease, self.container_id, terms, user)

    async def denials(self) -> tuple[Denial, ...]:
        """What the sandbox's governed network refused so far (empty when it has none)."""
        if not self.governed or not isinstance(self._owner, GoverningOwner):
            return ()
        return await self._owner.denials(self.lease)

    async def ports(self) -> tuple[PortForward, ...]:
        """The sandbox's inbound ports as bound on the host (empty when it has none)."""
        if self.plan.network is None or not self.plan.network.ports:
            return ()
        if not isinstance(self._owner, GoverningOwner):
            return ()
        return await self._owner.ports(self.lease)

    @property
    def timeout_s(self) -> float:
        return self.plan.timeout_s

    @property
    def output_bytes(self) -> int:
        return self.plan.output_bytes

    async def judge(self, exit_code: int | None) -> Verdict:
        """How the container's main process ended, on the evidence (``judge_exit``); a
        removal its owner decided is sbxkit's, never someone else's kill."""
        return await judge_exit(
            self.engine,
            self.container_id,
            exit_code,
            ended_by_owner=self.owner_ending,
        )

    async def owner_ending(self) -> Expiring | None:
        """Why the owner itself ended the container (``Owner.ended_by_owner``), if it did."""
        return await self._owner.ended_by_owner(self.lease)

    async def kill(self) -> None:
        """SIGKILL the container; one that is already stopped or gone is fine."""
        with contextlib.suppress(NotFound, Conflict):
            await self.engine.container_kill(self.container_id)


@asynccontextmanager
async def attached(box: OwnedContainer) -> AsyncIterator[tuple[HijackedStream, Waiter]]:
    """Attach (before start, so no output is lost), register the ``next-exit`` wait, start;
    both connections are closed when the block ends."""
    attach = await box.engine.container_attach(box.container_id, stdin=True)
    try:
        waiter = await box.engine.container_wait(box.container_id, "next-exit")
        try:
            await box.start()
            yield attach, waiter
        finally:
            await waiter.aclose()
    finally:
        await attach.aclose()


async def set_host_rlimits(engine: Engine, container_id: str, body: ContainerCreate) -> None:
    """Set ``body``'s ulimits on the started container's processes from the host, proven by
    ``/proc/PID/limits`` (``enforce_rlimits``); ``ContainerMismatch`` naming what failed."""
    host = body.host_config
    wanted = [(u.name, u.soft, u.hard) for u in (host.ulimits if host else None) or []]
    info = await engine.container_inspect(container_id)
    pid = info.state.pid or 0
    if pid <= 0 or not info.state.running:
        raise ContainerMismatch(container_id, "its init is not running: no rlimits were set")
    try:
        await trio.to_thread.run_sync(enforce_rlimits, pid, container_id, wanted)
    except RlimitsUnenforced as exc:
        raise ContainerMismatch(
            container_id,
            f"the engine dropped HostConfig.Ulimits and the host could not set "
            f"them before the payload: {exc}",
        ) from None


async def _check_own_userns(engine: Engine, plan: Plan, container_id: str) -> None:
    """A body that asked rootful Podman for a user namespace of its own (a workspace's root):
    before the start, the maps Podman recorded at the create must be one that keeps root
    inside off host root (``recorded_maps_problem``); the host's kernel is asked again once it
    runs (``OwnedContainer.prove_root``). ``ContainerMismatch``: never started, removed."""
    host = plan.body.host_config
    if not engine.is_podman or host is None or host.userns_mode is None:
        return
    maps = await engine.podman_id_mappings(container_id)
    uids, gids = (maps.uid_map, maps.gid_map) if maps is not None else (None, None)
    problem = recorded_maps_problem(uids, gids)
    if problem is not None:
        raise ContainerMismatch(container_id, problem)


def owner_launch(plan: Plan, owner: Owner) -> Launch | None:
    """What ``owner`` verifies before it starts the plan's container itself, or None: only an
    owner that launches (``LaunchingOwner``: the supervisor), and only a kernel path container
    whose payload waits for its go line — not one whose governed network's listeners must go
    in after the start and before the payload."""
    if plan.io_dir is None or (plan.network is not None and plan.network.needs_governor):
        return None
    if not (isinstance(owner, LaunchingOwner) and owner.launches):
        return None
    return Launch(expected_mounts=list(plan.expected_mounts), image_id=plan.image_id)


@asynccontextmanager
async def owned_container(
    plan: Plan, engine: Engine, owner: Owner, *, launch: bool = False
) -> AsyncIterator[OwnedContainer]:
    """The one lifecycle under every consumer: create the plan's container stopped through the
    owner (which admits it), verify it against the plan, yield it, and remove it through the
    owner however the block ends — shielded, and a removal failure is raised, never swallowed.

    ``launch``: the caller runs the kernel path's one-shot payload (it waits for the caller's
    go line), so an owner that can start the container itself once verified does
    (``owner_launch``; ``OwnedContainer.launched_by_owner``). The caller verifies it too."""
    began = trio.current_time()
    container_id: str | None = None
    box: OwnedContainer | None = None
    if plan.io_dir is not None:  # the kernel path's FIFOs: the bind's source must exist
        make_io_dir(Path(plan.io_dir).parent, plan.lease, *sandbox_ids(plan.body.user))
    try:
        launching = owner_launch(plan, owner) if launch else None
        # As before, a launched create carries no network terms (owner_launch launches none
        # whose terms need a governor).
        network = plan.network if launching is None else None
        request = CreateRequest(
            plan.lease, plan.name, plan.body, plan.lifetime_s, network=network, launch=launching
        )
        container_id = await owner.create(request)
        inspected = created_inspection(owner, plan.lease)
        if inspected is None:
            inspected = await engine.container_inspect(container_id)
        check_created(
            inspected,
            plan.body,
            lease=plan.lease,
            name=plan.name,
            container_id=container_id,
            expected_mounts=plan.expected_mounts,
            podman=engine.is_podman,
            image_id=plan.image_id,
            launched=launching is not None,
            rlimits_by_host=plan.host_rlimits,
        )
        await _check_own_userns(engine, plan, container_id)
        box = OwnedContainer(
            engine=engine, plan=plan, container_id=container_id, began=began, owner=owner
        )
        # ``launching`` is set only for a LaunchingOwner (``owner_launch`` checked it).
        box.launched_by_owner = launching is not None and cast(LaunchingOwner, owner).launching(
            plan.lease
        )
        yield box
    finally:
        removing = trio.current_time()
        with trio.CancelScope(shield=True):
            try:
                await owner.remove(plan.lease, plan.name, container_id)  # at once if released
            finally:
                # The kernel path's FIFOs; an owner that took the removal over removes them
                # once the container is gone.
                if plan.io_dir is not None and not (box is not None and box.released):
                    remove_io_dir(Path(plan.io_dir).parent, plan.lease)
        if box is not None:
            box.remove_s = trio.current_time() - removing


def created_inspection(owner: Owner, lease: str) -> ContainerInspect | None:
    """The daemon's answer on the container just created, if its owner inspected it."""
    return owner.created_inspection(lease) if isinstance(owner, InspectingOwner) else None


class ContainerProcess:
    """The exit of a started container's main process (PTY sessions and stdio workers).

    ``end`` kills the container for a reason (time limit, overflow); ``wait`` returns how the
    process ended. The wait was registered (``next-exit``) before start, so no exit is missed.
    """

    def __init__(self, box: OwnedContainer, waiter: Waiter) -> None:
        self.box = box
        self._waiter = waiter
        self.ended_by: Status | None = None
        self._result: tuple[Verdict, int | None] | None = None

    async def end(self, status: Status) -> None:
        if self.ended_by is None:
            self.ended_by = status
        with trio.CancelScope(shield=True), trio.move_on_after(KILL_BUDGET_S):
            await self.box.kill()

    async def wait(self) -> tuple[Verdict, int | None]:
        """``(verdict, exit_code)``: the code only when the process exited by itself; at the
        time limit the container is killed."""
        if self._result is not None:
            return self._result
        reply: ContainerWaitReply | None = None
        with trio.move_on_at(self.box.deadline):
            reply = await self._waiter.result()
        if reply is None:
            await self.end("timed_out")
            # Killed for the time limit: the status no longer needs the reply.
            with trio.move_on_after(KILL_BUDGET_S), contextlib.suppress(SbxError):
                reply = await self._waiter.result()
        if self.ended_by is not None:
            self._result = (Verdict(status=self.ended_by), None)
            return self._result
        assert reply is not None
        if reply.error is not None and reply.error.message:
            raise EngineError("POST", "wait", 500, reply.error.message)
        code = reply.status_code
        verdict = await self.box.judge(code)
        self._result = (verdict, code if verdict.status == "exited" else None)
        return self._result


__all__ = [
    "KILL_BUDGET_S",
    "ContainerProcess",
    "OwnedContainer",
    "SandboxExit",
    "SandboxExpired",
    "SandboxUnusable",
    "attached",
    "owned_container",
]

publish(__name__, globals())  # public names show as sbxkit.NAME
