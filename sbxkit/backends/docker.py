"""The Docker backend: the hardened container (docs/security.md), for every consumer.

``own`` is the one lifecycle every Docker consumer stands on: check the spec (once), open the
engine, build the plan (``sbxkit._plan.plan.make_plan``: image, mounts, runtime, GPUs, the hardened
body), then ``sbxkit._lifecycle.owned.owned_container`` creates, verifies and — however the block
ends — removes the container through the owner. ``run_once`` is ``own`` plus the one-shot steps of
``sbxkit._lifecycle.attached``; sessions, PTYs, stdio workers, grants and the harness call ``own``
or ``run_once`` through a backend, never the engine directly.

Cleanup ownership stays with the owner (docs/architecture.md, "The owner seam"). With the default
owner, the supervisor journals every lease and recovers orphans itself at its start and in its
reaper loop; ``reconcile_orphans`` asks it for one more pass now (``sbxkit leases recover``). With
an explicit in-process owner there is nothing durable to recover, so it returns ``[]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict, Unpack

import msgspec

from sbxkit._kernel.rlimits import check_host_rlimits_consumer
from sbxkit._lifecycle import leases_admin as admin
from sbxkit._lifecycle.attached import OutputCallback, run_attached
from sbxkit._lifecycle.kernel_run import NotAlive, run_on_fifos
from sbxkit._lifecycle.kernel_watch import KernelSupervise, supervise_kernel
from sbxkit._lifecycle.owned import OwnedContainer, owned_container
from sbxkit._lifecycle.owner import Owner
from sbxkit._lifecycle.supervised import QueueObserver, SupervisedOwner
from sbxkit._model.call_checks import check_stdin
from sbxkit._model.gpu import GpuCursor
from sbxkit._model.network_terms import Network
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec, root_inside
from sbxkit._plan.kernel_host import kernel_path_reason, shellless_images
from sbxkit._plan.plan import (
    GPU_CURSOR,
    CheckedSpec,
    DaemonFacts,
    build_plan,
    check_spec,
    effective_settings,
    forget_image,
    learn_daemon,
    new_lease_id,
)
from sbxkit._protocol.journal import default_state_dir
from sbxkit._protocol.wire import Recover
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.base import Backend, Consumer
from sbxkit.engine.client import Engine, engine_or_open, open_engine
from sbxkit.errors import (
    UID_ATTEMPTS,
    CreateInterrupted,
    ImageChanged,
    SbxError,
    SpecError,
    UidTaken,
)
from sbxkit.network.gate import GATE_LINE, Prefixed, gate_command

__all__ = ["DockerBackend", "DockerOptions", "default_owner", "docker_backend", "governed"]

KILLED_BY_SBXKIT = ("timed_out", "output_exceeded")
CREATE_INTERRUPTIONS = 3
"""How many times a one-shot run registers afresh after its supervisor died during the create
(``CreateInterrupted``) before the interruption is its result."""


def default_owner(
    engine: Engine, settings: Settings, on_queued: QueueObserver | None = None
) -> SupervisedOwner:
    """The supervisor of the settings' state dir (``effective_settings`` fills it in)."""
    assert settings.supervisor_state_dir is not None
    return SupervisedOwner(
        engine,
        state_dir=Path(settings.supervisor_state_dir),
        on_queued=on_queued,
        supervisor_command=settings.supervisor_command,
    )


Overrides = Mapping[str, Any]
"""What a caller sets in a container's create body beyond the plan (``build_plan``'s
``body_overrides``)."""


class DockerBackend:
    """Hardened Docker containers (docs/security.md): every consumer, one lifecycle."""

    kind = "docker"

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        settings: Settings | None = None,
        engine: Engine | None = None,
        owner: Owner | None = None,
        gpu_cursor: GpuCursor | None = None,
        on_queued: QueueObserver | None = None,
        recover_at_open: bool = True,
        wait_for_removal: bool = False,
    ) -> None:
        self.socket_path = socket_path
        named = socket_path or (engine.socket_path if engine is not None else None)
        if named is not None and (settings is None or settings.supervisor_state_dir is None):
            # The daemon named here has its own supervisor (address.state_dir_text).
            state_dir = str(default_state_dir(named))
            settings = msgspec.structs.replace(
                settings or Settings(), supervisor_state_dir=state_dir
            )
        self.settings = settings
        self.engine = engine
        self.owner = owner
        self.gpu_cursor = gpu_cursor or GPU_CURSOR
        self.on_queued = on_queued
        self.recover_at_open = recover_at_open
        self.wait_for_removal = wait_for_removal
        """Return a run on the kernel path only once its container is confirmed removed (as
        on the daemon's path), not at the payload's exit."""
        self.kernel_supervise: KernelSupervise = supervise_kernel
        """Who watches a one-shot run on the kernel path (stdin, output, the time limit, the
        exit): this process; a run ``sbxkit run`` handed to the supervisor is watched by the
        command line, which gets the sandbox's ends (``sbxkit.handoff``)."""
        self.on_daemon_path: Callable[[], None] | None = None
        """Called before a one-shot run takes the daemon's path (the kernel's is not there for
        it); what it raises declines the run before anything is created. A run ``sbxkit run``
        hands to the supervisor declines so: its command line cannot read an attach stream."""
        self._opened: contextlib.AsyncExitStack | None = None

    async def preflight(self) -> None:
        """The engine answers ``/_ping`` with a usable API version (EngineUnavailable if not);
        the connection is kept for this backend's sandboxes until ``aclose``.

        Skipped when an engine was handed in: its owner already negotiated with the daemon.
        """
        if self.engine is None:
            stack = contextlib.AsyncExitStack()
            self.engine = await stack.enter_async_context(open_engine(self.socket_path))
            self._opened = stack

    def check(self, spec: SandboxSpec | CheckedSpec, consumer: Consumer) -> CheckedSpec:
        """Docker serves every consumer; the spec is validated once (``own`` and ``run_once``
        take the result without validating it again). A governed network is refused for PTYs
        and stdio workers, whose payload starts with the container, before its listeners."""
        checked = check_spec(spec, self.settings)
        refuse_late_start(checked.spec, consumer)
        if gated(checked.spec):
            gate_command(list(checked.spec.command))  # refuses what the gate cannot exec
        return checked

    @asynccontextmanager
    async def own(
        self,
        spec: SandboxSpec | CheckedSpec,
        consumer: Consumer,
        *,
        command: Sequence[str] | None = None,
        body_overrides: Mapping[str, Any] | None = None,
        kernel: bool = False,
    ) -> AsyncIterator[OwnedContainer]:
        """Plan the sandbox and own its container for the block (``owned_container``).
        ``kernel``: put it on the kernel path (``plan.io_dir``) where the host allows.

        Bad input raises ``SpecError`` before the daemon is contacted.
        """
        checked = check_spec(spec, self.settings, command=command)
        refuse_late_start(checked.spec, consumer)
        async with self._own_checked(checked, consumer, body_overrides, kernel) as box:
            yield box

    @asynccontextmanager
    async def _own_checked(
        self, checked: CheckedSpec, consumer: Consumer, overrides: Overrides | None, kernel: bool
    ) -> AsyncIterator[OwnedContainer]:
        """``own`` once the spec is checked and fits ``consumer``: a cold container (a
        subclass may serve it otherwise, ``PooledBackend``)."""
        async with engine_or_open(self.engine, self.socket_path) as engine:
            facts = await learn_daemon(engine, checked, self.gpu_cursor)
            if facts.host_rlimits:
                check_host_rlimits_consumer(consumer)
            owner = self.owner or default_owner(engine, checked.settings, self.on_queued)
            fifo_io = kernel and await kernel_path_reason(engine, checked, facts) is None
            async with contextlib.AsyncExitStack() as stack:
                for attempt in range(1, UID_ATTEMPTS + 1):
                    plan = build_plan(
                        checked,
                        facts,
                        lease=new_lease_id(),
                        body_overrides=overrides,
                        fifo_root=owner.fifo_root if fifo_io else None,
                    )
                    try:
                        box = await stack.enter_async_context(owned_container(plan, engine, owner))
                        break
                    except UidTaken:  # nothing was created: a new lease, a new uid
                        if attempt == UID_ATTEMPTS:
                            raise
                yield box

    async def run_once(
        self,
        spec: SandboxSpec | CheckedSpec,
        stdin: StdinSource | None = None,
        *,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Run ``spec.command`` once in a fresh container and remove it (docs/architecture.md).

        Where the host can tell (``sbxkit._kernel``), the run's stdio are host FIFOs and its
        exit the kernel's word: the result returns at the payload's exit, and — with the
        supervisor as owner, unless ``wait_for_removal`` — the removal goes on under it (the
        lease closes only once the daemon confirmed it). Elsewhere, the daemon's path.

        Under a governed network the command starts only once the owner's listeners are in
        place — on the kernel path behind its own go line, on the daemon's behind a gate
        (sbxkit/network/gate.py) — and the result carries what the network refused."""
        check_stdin(stdin, streams=True)
        return await self._run_checked(self.check(spec, "run"), stdin, on_output)

    async def _run_checked(
        self, checked: CheckedSpec, stdin: StdinSource | None, on_output: OutputCallback | None
    ) -> RunResult:
        """``run_once`` once the spec and stdin are checked: in a fresh container (a subclass
        may serve it otherwise, ``PooledBackend``)."""
        async with engine_or_open(self.engine, self.socket_path) as engine:
            # Planned on a recent inspection of the image when there is one: the container's
            # image is checked before it starts, and a moved name is planned again, afresh.
            facts = await learn_daemon(engine, checked, self.gpu_cursor, reuse_image=True)
            replanned = False
            interrupted = taken = 0
            while True:
                try:
                    if await kernel_path_reason(engine, checked, facts) is None:
                        try:
                            return await self._run_planned(
                                engine, checked, facts, stdin, on_output, True
                            )
                        except NotAlive:  # no shell ran, so no payload did: the daemon's path
                            shellless_images.add(facts.image_id)
                    if self.on_daemon_path is not None:
                        self.on_daemon_path()
                    return await self._run_planned(engine, checked, facts, stdin, on_output, False)
                except ImageChanged:  # raised before the start: nothing ran, no stdin was read
                    if replanned:
                        raise
                    facts = await learn_daemon(engine, checked, self.gpu_cursor)
                    replanned = True
                except CreateInterrupted:  # no container was ever ours: nothing ran, nor read
                    interrupted += 1
                    if interrupted > CREATE_INTERRUPTIONS:
                        raise
                except UidTaken:  # refused before the create: planned under a new lease
                    taken += 1
                    if taken >= UID_ATTEMPTS:
                        raise
                except SbxError:
                    forget_image(engine, checked.spec.image)
                    raise

    async def _run_planned(
        self,
        engine: Engine,
        checked: CheckedSpec,
        facts: DaemonFacts,
        stdin: StdinSource | None,
        on_output: OutputCallback | None,
        fifo_io: bool,
    ) -> RunResult:
        owner = self.owner or default_owner(engine, checked.settings, self.on_queued)
        fifo_root = owner.fifo_root if fifo_io else None
        # The kernel path waits for its go line; the daemon's behind a gate, for the listeners,
        # the root's proof, or the rlimits the host sets (``OwnedContainer.start``).
        if (gated(checked.spec) or facts.host_rlimits) and not fifo_io:
            command = gate_command(
                list(checked.spec.command),
                *(() if gated(checked.spec) else (HOST_RLIMITS_GATED,)),
            )
            checked = check_spec(checked, self.settings, command=command)
            stdin = Prefixed(GATE_LINE, stdin)
        plan = build_plan(checked, facts, lease=new_lease_id(), fifo_root=fifo_root)
        async with owned_container(plan, engine, owner, launch=fifo_io) as box:
            if not fifo_io:
                ran = await run_attached(box, stdin, on_output)
            else:
                ran = await run_on_fifos(box, stdin, on_output, self.kernel_supervise)
            denials, ports = await box.denials(), await box.ports()
            # The payload exited: its PID namespace is gone, nothing of it runs. The owner
            # removes the container; we return now. A timeout or an overflow still has a
            # live payload until the removal's kill: that one is waited for. So is a container
            # that holds a named volume of the caller's (in use until it is gone).
            if fifo_io and not (
                self.wait_for_removal
                or ran.verdict.status in KILLED_BY_SBXKIT
                or any(mount.type == "volume" for mount in plan.expected_mounts)
            ):
                await box.release()
        return ran.result(box, denials, ports)

    async def reconcile_orphans(self) -> list[str]:
        """One supervisor recovery pass now (the report's lines); ``[]`` for an own owner, or
        when built with ``recover_at_open=False`` (the supervisor recovers at its own start
        and in its reaper loop: a one-shot CLI run need not ask for one more pass)."""
        if self.owner is not None or not self.recover_at_open:
            return []
        settings = effective_settings(self.settings)
        assert settings.supervisor_state_dir is not None
        report = await admin.request(Path(settings.supervisor_state_dir), Recover())
        return list(report.lines)

    async def aclose(self) -> None:
        """Close the engine ``preflight`` opened (one handed in stays its owner's)."""
        if self._opened is not None:
            stack, self._opened = self._opened, None
            self.engine = None
            await stack.aclose()


def governed(spec: SandboxSpec) -> bool:
    """The spec asks for listeners its owner must put in place before the payload runs."""
    network = spec.network
    return isinstance(network, Network) and (
        bool(network.allow) or network.callback is not None or bool(network.ports)
    )


HOST_RLIMITS_GATED = (
    "on rootless Podman the command starts once the host has set its rlimits (the engine "
    "drops HostConfig.Ulimits)"
)


def gated(spec: SandboxSpec) -> bool:
    """A cold one-shot run of ``spec`` on the daemon's path waits behind a gate
    (sbxkit/network/gate.py) until its start is done: the listeners of a governed network go
    in, a workspace's root is proven not the host's (``OwnedContainer.prove_root``)."""
    return governed(spec) or root_inside(spec)


def refuse_late_start(spec: SandboxSpec, consumer: Consumer) -> None:
    """A PTY's or a stdio worker's payload starts with its container: before a governed
    network's listeners could exist, or a workspace's root could be proven not the host's.
    Refused, naming which."""
    if consumer not in ("pty", "stdio"):
        return
    if governed(spec):
        field, what = "network", "a governed network (allow, callback)"
        why = "before its listeners exist"
    elif root_inside(spec):
        field, what = "workspace", "a workspace with root inside"
        why = "before its root is proven not the host's"
    else:
        return
    raise SpecError(
        field,
        f"{what} is not served for {consumer} sandboxes: their payload starts with the "
        f"container, {why}; use a one-shot run or a session",
    )


class DockerOptions(TypedDict, total=False):
    """The keywords every consumer takes when no backend is given: where and how its Docker
    sandbox runs (``DockerBackend``'s arguments)."""

    engine: Engine | None
    """An open engine to use (default: open one on ``socket_path`` for the sandbox)."""
    owner: Owner | None
    """Who creates and removes the container (default: the supervisor)."""
    settings: Settings | None
    """Operator settings (default: ``Settings()`` and the environment's ``SBXKIT_*``)."""
    socket_path: str | None
    """The daemon's socket (default: discovered, docs/operations.md)."""
    gpu_cursor: GpuCursor | None
    """Round-robin position over the daemon's CDI GPUs (default: this process's)."""
    on_queued: QueueObserver | None
    """``on_queued(ahead, waited_s)`` while the sandbox waits for admission."""


def docker_backend(backend: Backend | None, **options: Unpack[DockerOptions]) -> Backend:
    """The consumer's backend: the one given, or a ``DockerBackend`` of ``options``.

    The public entry points (``run``, ``open_sandbox``, ``open_pty`` ...) take either; both at
    once is ambiguous and refused.
    """
    if backend is None:
        return DockerBackend(**options)
    given = sorted(name for name, value in options.items() if value is not None)
    if given:
        raise SpecError(
            "backend", f"give {', '.join(given)} to the backend, not beside it (one or the other)"
        )
    return backend


publish(__name__, globals())  # public names show as sbxkit.NAME
