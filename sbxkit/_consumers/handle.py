"""A detached session's handle (issue 40): what another process needs to reattach it.

``Sandbox.detach`` hands the lease to the supervisor to keep without a caller for a while and
returns a ``SandboxHandle``: the lease, its container, a fresh secret (single use: the
supervisor journals only its hash and spends it on the reattach), where the supervisor lives,
and the session's plan, so ``attach_sandbox`` (reattach.py) rebuilds the same session — user,
time limit, output cap, file root — without planning anything again. The handle is a secret:
keep it as you would a password (its ``repr`` hides the secret; its JSON does not).
"""

from __future__ import annotations

import math
import time
from typing import Protocol

import msgspec
import trio

from sbxkit._consumers.processes import ProcessTable
from sbxkit._lifecycle.owned import OwnedContainer
from sbxkit._plan.plan import Plan
from sbxkit.errors import SandboxUnusable, SbxError

HANDLE_VERSION = 1


class SandboxHandle(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A detached sandbox, for ``attach_sandbox`` in this or another process of the same
    account, once, before ``keep_until``. ``to_json``/``from_json`` carry it across."""

    version: int = HANDLE_VERSION
    lease: str
    container_id: str
    secret: str
    """Proves the lease to its supervisor once; never logged."""
    state_dir: str
    """The supervisor's state directory (its socket is ``supervisor.sock`` there)."""
    supervisor_command: str | None = None
    engine_socket: str
    keep_until: float
    """Unix seconds: the supervisor removes the sandbox if nobody reattached it by then."""
    deadline: float
    """Unix seconds: the session's time limit ends, as it would have in the first process."""
    files_root: str
    max_processes: int
    plan: Plan

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return (
            f"SandboxHandle(lease={self.lease!r}, container_id={self.container_id[:12]!r}, "
            f"state_dir={self.state_dir!r}, keep_until={self.keep_until:.0f}, secret=<hidden>)"
        )

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> SandboxHandle:
        try:
            handle = msgspec.json.decode(data, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SbxError(f"not a sandbox handle: {exc}") from None
        if handle.version != HANDLE_VERSION:
            raise SbxError(f"sandbox handle version {handle.version}, expected {HANDLE_VERSION}")
        return handle


class Detachable(Protocol):
    """What ``detach_sandbox`` needs of a session (``session.Sandbox``)."""

    _box: OwnedContainer
    _unusable: str | None
    files_root: str
    processes: ProcessTable


def keep_for(keep_s: float, session_left: float) -> float:
    """How long the supervisor is asked to keep the lease (pure): ``keep_s``, at most what
    is left of the session's time limit (the supervisor bounds it by the lifetime too)."""
    if not (isinstance(keep_s, int | float) and 0 < keep_s < math.inf):
        raise SbxError(f"keep_s must be a positive number of seconds, not {keep_s!r}")
    if session_left <= 0:
        raise SbxError("the session's time limit has passed: nothing to detach")
    return min(float(keep_s), session_left)


async def detach_sandbox(self: Detachable, keep_s: float) -> SandboxHandle:
    """Hand the sandbox to the supervisor to keep, without this process, for at most
    ``keep_s`` seconds (and never past the session's time limit); return the handle that
    reattaches it once (``attach_sandbox``). From here this ``Sandbox`` is unusable and its
    block's end leaves the container running; background processes (``start``) end with the
    block, as at a close. Nobody reattaching by ``keep_until`` → the supervisor removes it."""
    if self._unusable is not None:
        raise SandboxUnusable(self._box.container_id, self._unusable)
    box = self._box
    left = box.deadline - trio.current_time()
    kept = await box.detach(keep_for(keep_s, left))
    self._unusable = "the sandbox was detached (attach_sandbox continues it)"
    return SandboxHandle(
        lease=box.lease,
        container_id=box.container_id,
        secret=kept.secret,
        state_dir=str(kept.state_dir),
        supervisor_command=kept.supervisor_command,
        engine_socket=box.engine.socket_path,
        keep_until=kept.until,
        deadline=time.time() + left,
        files_root=self.files_root,
        max_processes=self.processes.limit,
        plan=box.plan,
    )
