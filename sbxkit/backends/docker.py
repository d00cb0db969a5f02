"""The Docker backend: the hardened container of design.md §3, for every consumer.

``own`` is the one lifecycle every Docker consumer stands on: check the spec (once), open the
engine, build the plan (``sbxkit.plan.make_plan``: image, mounts, runtime, GPUs, the hardened
body), then ``sbxkit.owned.owned_container`` creates, verifies and — however the block ends —
removes the container through the owner. ``run_once`` is ``own`` plus the one-shot steps of
``sbxkit.attached``; sessions, PTYs, stdio workers, grants and the harness call ``own`` or
``run_once`` through a backend, never the engine directly.

Cleanup ownership stays where design.md §4 puts it. With the default owner, the supervisor
journals every lease and recovers orphans itself at its start and in its reaper loop;
``reconcile_orphans`` asks it for one more pass now (``sbxkit leases recover``). With an
explicit in-process owner there is nothing durable to recover, so it returns ``[]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict, Unpack

from sbxkit.attached import OutputCallback, run_attached
from sbxkit.backends.base import Backend, Consumer
from sbxkit.call_checks import check_stdin
from sbxkit.engine.client import Engine, engine_or_open, open_engine
from sbxkit.errors import SpecError
from sbxkit.gpu import GpuCursor
from sbxkit.network.gate import GATE_LINE, Prefixed, gate_command
from sbxkit.network.terms import Network
from sbxkit.owned import OwnedContainer, owned_container
from sbxkit.owner import Owner
from sbxkit.plan import GPU_CURSOR, CheckedSpec, check_spec, effective_settings, make_plan
from sbxkit.result import RunResult
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec
from sbxkit.stdin import StdinSource
from sbxkit.supervisor import admin
from sbxkit.supervisor.client import QueueObserver, SupervisedOwner
from sbxkit.supervisor.wire import Recover

__all__ = ["DockerBackend", "DockerOptions", "default_owner", "docker_backend", "governed"]


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


class DockerBackend:
    """Hardened Docker containers (design.md §3): every consumer, one lifecycle."""

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
    ) -> None:
        self.socket_path = socket_path
        self.settings = settings
        self.engine = engine
        self.owner = owner
        self.gpu_cursor = gpu_cursor or GPU_CURSOR
        self.on_queued = on_queued
        self.recover_at_open = recover_at_open
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
        refuse_ungovernable(checked.spec, consumer)
        if governed(checked.spec):
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
    ) -> AsyncIterator[OwnedContainer]:
        """Plan the sandbox and own its container for the block (``owned_container``).

        Bad input raises ``SpecError`` before the daemon is contacted.
        """
        checked = check_spec(spec, self.settings, command=command)
        refuse_ungovernable(checked.spec, consumer)
        async with engine_or_open(self.engine, self.socket_path) as engine:
            plan = await make_plan(
                engine, checked, gpu_cursor=self.gpu_cursor, body_overrides=body_overrides
            )
            owner = self.owner or default_owner(engine, plan.settings, self.on_queued)
            async with owned_container(plan, engine, owner) as box:
                yield box

    async def run_once(
        self,
        spec: SandboxSpec | CheckedSpec,
        stdin: StdinSource | None = None,
        *,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Run ``spec.command`` once in a fresh container and remove it (design.md §3).

        Under a governed network the command waits behind a gate (sbxkit/network/gate.py)
        until the owner's listeners are in place, and the result carries what the network
        refused."""
        check_stdin(stdin, streams=True)
        checked = self.check(spec, "run")
        if not governed(checked.spec):
            async with self.own(checked, "run") as box:
                ran = await run_attached(box, stdin, on_output)
            return ran.result(box)
        gated = gate_command(list(checked.spec.command))
        async with self.own(checked, "run", command=gated) as box:
            ran = await run_attached(box, Prefixed(GATE_LINE, stdin), on_output)
            denials = await box.denials()
        return ran.result(box, denials)

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
    return isinstance(network, Network) and (bool(network.allow) or network.callback is not None)


def refuse_ungovernable(spec: SandboxSpec, consumer: Consumer) -> None:
    """A PTY's or a stdio worker's payload starts with its container, before a governed
    network's listeners could exist: refused, naming the network."""
    if consumer in ("pty", "stdio") and governed(spec):
        raise SpecError(
            "network",
            f"a governed network (allow, callback) is not served for {consumer} sandboxes: "
            "their payload starts with the container, before its listeners exist; use a "
            "one-shot run or a session",
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
