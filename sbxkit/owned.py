"""The owned container: created stopped, verified, owned, started, removed — one lifecycle for
sessions, PTYs and stdio workers (``session.py``, ``pty.py``, ``stdio.py``).

``owned_container`` is steps 1–4 of the one-shot lifecycle (design.md §3) and removal through
the owner on every exit; ``ContainerProcess`` is the exit of a started container's main process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from sbxkit.engine.client import Engine, Waiter, engine_or_open
from sbxkit.engine.models import ContainerCreate, ContainerWaitReply
from sbxkit.errors import (
    Conflict,
    EngineError,
    NotFound,
    SbxError,
)
from sbxkit.outcome import SIGNAL_EXIT_BASE, classify_exit, judge_exit
from sbxkit.owner import Owner
from sbxkit.policy import container_name
from sbxkit.result import Status, Stream
from sbxkit.runner import (
    GPU_CURSOR,
    LIFETIME_MARGIN_S,
    default_owner,
    effective_settings,
    new_lease_id,
    prepare_create,
)
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec, validate_spec
from sbxkit.verify import check_created

KILL_BUDGET_S = 10.0
"""How long ending a sandbox's process may take (kill, then confirm)."""


class SandboxExpired(SbxError):
    """The session's time limit (``spec.limits.timeout_s``) ended the ``async with`` block;
    the container was removed."""

    def __init__(self, lease: str, container_id: str, seconds: float) -> None:
        super().__init__(
            f"sandbox {container_id[:12]} (lease {lease}): the session's time limit of "
            f"{seconds:g} s passed; the sandbox was removed"
        )
        self.lease = lease
        self.container_id = container_id
        self.seconds = seconds


class SandboxUnusable(SbxError):
    """The sandbox can no longer run work (its container was killed or stopped)."""

    def __init__(self, container_id: str, reason: str) -> None:
        super().__init__(f"sandbox {container_id[:12]} is unusable: {reason}")
        self.container_id = container_id
        self.reason = reason


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


# --- the owned container --------------------------------------------------------------------


class OwnedContainer:
    """A created, verified, still stopped container, removed when its context ends."""

    def __init__(
        self,
        *,
        engine: Engine,
        spec: SandboxSpec,
        body: ContainerCreate,
        lease: str,
        container_id: str,
        deadline: float,
        owner: Owner,
    ) -> None:
        self.engine = engine
        self.spec = spec
        self.body = body
        self.lease = lease
        self.container_id = container_id
        self.deadline = deadline
        """trio clock time at which the spec's time limit ends (``timeout_s`` after create
        began, not counting the wait for admission; the owner's backstop ends later)."""
        self._owner = owner

    async def start(self) -> None:
        """Start the container and tell the owner (its launch slot goes to the next)."""
        await self.engine.container_start(self.container_id)
        await self._owner.started(self.lease)

    @property
    def timeout_s(self) -> float:
        assert self.spec.limits.timeout_s is not None
        return self.spec.limits.timeout_s

    @property
    def output_bytes(self) -> int:
        assert self.spec.limits.output_bytes is not None
        return self.spec.limits.output_bytes

    async def kill(self) -> None:
        """SIGKILL the container; one that is already stopped or gone is fine."""
        with contextlib.suppress(NotFound, Conflict):
            await self.engine.container_kill(self.container_id)


@asynccontextmanager
async def owned_container(
    spec: SandboxSpec,
    *,
    command: Sequence[str] | None = None,
    body_overrides: Mapping[str, Any] | None = None,
    engine: Engine | None = None,
    owner: Owner | None = None,
    settings: Settings | None = None,
    socket_path: str | None = None,
) -> AsyncIterator[OwnedContainer]:
    """Steps 1–4 of the one-shot lifecycle, then removal through the owner on every exit.

    ``command`` replaces ``spec.command`` (a session's keep-alive); ``body_overrides`` replace
    fields of the hardened body (a PTY's ``tty``/``stdin_once``) before create, and the
    post-create verification compares the container against that final body.
    """
    settings = effective_settings(settings)
    if command is not None:
        spec = msgspec.structs.replace(spec, command=list(command))
    validate_spec(spec, settings)
    assert spec.limits.timeout_s is not None
    lease = new_lease_id()
    name = container_name(lease)
    async with engine_or_open(engine, socket_path) as eng:
        body, resolved = await prepare_create(eng, spec, settings, lease, GPU_CURSOR)
        if body_overrides:
            body = msgspec.structs.replace(body, **dict(body_overrides))
        owner = owner or default_owner(eng, settings)
        began = trio.current_time()
        container_id: str | None = None
        try:
            lifetime = spec.limits.timeout_s + LIFETIME_MARGIN_S
            container_id = await owner.create(lease, name, body, lifetime_s=lifetime)
            # The time limit runs from admission: a wait for capacity does not eat it.
            deadline = began + owner.queued_s(lease) + spec.limits.timeout_s
            inspected = await eng.container_inspect(container_id)
            check_created(
                inspected,
                body,
                lease=lease,
                name=name,
                container_id=container_id,
                expected_mounts=resolved.expected,
                podman=eng.is_podman,
            )
            yield OwnedContainer(
                engine=eng,
                spec=spec,
                body=body,
                lease=lease,
                container_id=container_id,
                deadline=deadline,
                owner=owner,
            )
        finally:
            with trio.CancelScope(shield=True):
                await owner.remove(lease, name, container_id)


class ContainerProcess:
    """The exit of a started container's main process (PTY sessions and stdio workers).

    ``end`` kills the container for a reason (time limit, overflow); ``wait`` returns how the
    process ended. The wait was registered (``next-exit``) before start, so no exit is missed.
    """

    def __init__(self, box: OwnedContainer, waiter: Waiter) -> None:
        self.box = box
        self._waiter = waiter
        self.ended_by: Status | None = None
        self._result: tuple[Status, int | None, str | None] | None = None

    async def end(self, status: Status) -> None:
        if self.ended_by is None:
            self.ended_by = status
        with trio.CancelScope(shield=True), trio.move_on_after(KILL_BUDGET_S):
            await self.box.kill()

    async def wait(self) -> tuple[Status, int | None, str | None]:
        """``(status, exit_code, oom_evidence)``; at the time limit the container is killed."""
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
            self._result = (self.ended_by, None, None)
            return self._result
        assert reply is not None
        if reply.error is not None and reply.error.message:
            raise EngineError("POST", "wait", 500, reply.error.message)
        code = reply.status_code
        status, evidence = classify_exit(False, code)
        if code > SIGNAL_EXIT_BASE:
            status, evidence = await judge_exit(self.box.engine, self.box.container_id, code)
        self._result = (status, code if status == "exited" else None, evidence)
        return self._result


__all__ = [
    "KILL_BUDGET_S",
    "ContainerProcess",
    "OwnedContainer",
    "SandboxExit",
    "SandboxExpired",
    "SandboxUnusable",
    "owned_container",
]
