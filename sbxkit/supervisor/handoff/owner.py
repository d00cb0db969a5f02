"""The owner of a handed-off run's lease: the supervisor itself, in-process.

``ServedOwner`` is a ``SupervisedOwner`` whose supervisor is the process it runs in: the run's lease
goes through the same admission, re-check, journal and lease task as one registered over a
connection (``Admitting.admit_lease``, ``Pooling.take_parked``), and its answers — what a connection
would have carried (``Queued``, ``Registered``, ``Created``, ``Closed`` ...) — arrive in a
``LocalReplies`` instead. ``Queued`` goes on to the command line (its terminal's notice). The lease
ends when the run releases or removes it, or when the command line's connection ends (``stop_all``):
the lease task removes the container and closes the record as ever.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Awaitable, Callable

import msgspec
import trio

from sbxkit._kernel.scripts import io_dir_of
from sbxkit._lifecycle.connect import refusal_error, reply_timeout_s
from sbxkit._lifecycle.link import with_secret
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._protocol.wire import (
    Claim,
    Claimed,
    Closed,
    Created,
    Expiring,
    Failed,
    Message,
    Orphaned,
    Queued,
    Refused,
    Unclaimed,
)
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError, NetworkUnavailable, SupervisorError
from sbxkit.supervisor.lease import Intent
from sbxkit.supervisor.pooling import Pooling, claimed_message

__all__ = ["Declined", "LocalReplies", "ServedOwner"]


class Declined(Exception):
    """The hand-off does not serve this run (nothing of its payload ran): the command line runs
    it on the full path, which reproduces any error exactly."""


Forward = Callable[[Queued], Awaitable[None]]


class LocalReplies:
    """A lease's answers, kept in this process: the ``Caller`` an in-process lease is admitted
    for and the ``Replies`` its lease task sends to. Never blocks a sender."""

    gone = False

    def __init__(self, forward: Forward, payload: bytes = b"") -> None:
        self._forward = forward
        self._messages: deque[Message] = deque()
        self._arrived = trio.Event()
        self.last_payload = payload

    async def send(self, message: Message) -> None:
        if isinstance(message, Queued):
            await self._forward(message)
            return
        self.hold(message)
        await trio.lowlevel.checkpoint()

    def hold(self, message: Message) -> None:
        """Kept here at once: an in-process caller is woken by nothing but its own turn."""
        self._messages.append(message)
        self._arrived.set()

    async def flush(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive(self) -> Message:
        while not self._messages:
            self._arrived = trio.Event()
            await self._arrived.wait()
        return self._messages.popleft()

    def take(self, kind: type[Message]) -> Message | None:
        """The first message of ``kind`` already here (taken), without waiting."""
        for message in self._messages:
            if isinstance(message, kind):
                self._messages.remove(message)
                return message
        return None


class ServedOwner(SupervisedOwner):
    """A ``SupervisedOwner`` whose supervisor is this process (see the module's docstring)."""

    launches = False
    """Its runs start their containers themselves: the start would not leave this process."""

    def __init__(self, service: Pooling, engine: Engine, forward: Forward) -> None:
        super().__init__(engine, state_dir=service.state.path)
        self.service = service
        self._forward = forward
        self._local: dict[str, tuple[LocalReplies, Intent]] = {}
        self.current: tuple[str, str] = ("", "")
        """The lease and container id of the run's sandbox, once known (its ``lost`` line)."""
        self.secret: str | None = None
        """The current lease's secret (its record keeps the hash): the command line re-adopts
        the run with it should this supervisor die (``RunStarted.secret``)."""
        self.pooled = False
        self.engine_socket = engine.socket_path

    def stop_all(self, reason: str) -> None:
        """The command line left or was interrupted: every lease of the run ends now (its
        container removed by its lease task, its admission wait withdrawn)."""
        for _replies, intent in self._local.values():
            intent.request_stop(reason)

    async def create(self, request: CreateRequest) -> str:
        lease = request.lease
        if request.launch is not None:  # launches is False: owned_container never asks
            raise SupervisorError("a handed-off run starts its container itself", lease=lease)
        register = self.register_for(request)
        secret, register = with_secret(register)
        self.secret = secret  # a governed run's too: resumed, its egress stays closed
        replies = LocalReplies(self._forward, msgspec.json.encode(register))
        intent = Intent()
        self._local[lease] = (replies, intent)
        self.current = (lease, "")
        asked = trio.current_time()
        # Admission is never cut short by cancellation (its queue entry and launch slot must be
        # given back): a leaving caller ends it through the intent (``stop_all``) instead.
        try:
            with trio.CancelScope(shield=True):
                live = await self.service.admit_lease(replies, register, intent)
        except BaseException:
            self._local.pop(lease, None)
            raise
        if live is None:
            self._local.pop(lease, None)
            refused = replies.take(Refused)
            if isinstance(refused, Refused):
                raise refusal_error(refused, lease)
            raise SupervisorError("the run left before it was admitted", lease=lease)
        self._queued[lease] = trio.current_time() - asked
        with trio.move_on_after(self.startup_deadline_s + reply_timeout_s()):
            while True:
                reply = await replies.receive()
                if isinstance(reply, Created):
                    self.current = (lease, reply.container_id)
                    if reply.inspected is not None:
                        self._inspected[lease] = reply.inspected
                    return reply.container_id
                if isinstance(reply, Failed):
                    raise SupervisorError(reply.reason, code="failed", lease=lease)
        raise SupervisorError("create: no answer in time", lease=lease)

    async def started(self, lease: str) -> None:
        local = self._local.get(lease)
        if local is not None:
            local[1].started.set()
            local[1].nudge.set()
        await trio.lowlevel.checkpoint()

    async def govern(
        self, lease: str, container_id: str, terms: NetworkTerms, user: tuple[int, int]
    ) -> None:
        problem = await self.service.govern_lease(lease)
        if problem is not None:
            raise NetworkUnavailable(problem)

    async def denials(self, lease: str) -> tuple[Denial, ...]:
        await trio.lowlevel.checkpoint()
        live = self.service.live.get(lease)
        governor = live.governor if live is not None else None
        return tuple(governor.denied()[0]) if governor is not None else ()

    async def ports(self, lease: str) -> tuple[PortForward, ...]:
        await trio.lowlevel.checkpoint()
        live = self.service.live.get(lease)
        governor = live.governor if live is not None else None
        return tuple(governor.ports) if governor is not None else ()

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        await trio.lowlevel.checkpoint()
        local = self._local.get(lease)
        expiring = local[0].take(Expiring) if local is not None else None
        return expiring if isinstance(expiring, Expiring) else None

    async def claim(self, claim: Claim) -> Claimed | Unclaimed:
        """Take a parked container of the claim's shape from this supervisor's pool. Its FIFO
        ends are duplicated for the run (the parked copies close as parking ends); a pool that
        parks on the daemon's path cannot be handed off."""
        if io_dir_of(claim.template.body) is None:
            raise Declined("this shape's pool parks on the daemon's path")
        taken = await self.service.take_parked(claim, None)
        if isinstance(taken, Refused):
            raise refusal_error(taken)
        if isinstance(taken, Unclaimed):
            return taken
        live = taken
        replies = LocalReplies(self._forward)
        live.peer = replies
        claimed, fds = claimed_message(live)
        self._claimed_fds[claimed.lease] = [os.dup(fd) for fd in fds]
        self._local[claimed.lease] = (replies, live.intent)
        self.current = (claimed.lease, claimed.container_id)
        self.secret, self.pooled = claimed.secret, True
        live.claimed.set()  # parking ends: its copies of the ends are closed
        return claimed

    async def release(self, lease: str) -> bool:
        """The removal goes on under this supervisor's lease task (the FIFO directory goes
        with it); the lease closes once the daemon confirmed it (a pooled or kernel path
        run's early return)."""
        self._queued.pop(lease, None)
        self._inspected.pop(lease, None)
        local = self._local.pop(lease, None)
        if local is not None:
            local[1].request_stop("caller closed")
        await trio.lowlevel.checkpoint()
        return local is not None

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        """Ask for removal and wait for the verdict: only ``Closed`` means cleaned up."""
        self._queued.pop(lease, None)
        for fd in self._claimed_fds.pop(lease, []):
            with contextlib.suppress(OSError):
                os.close(fd)
        local = self._local.pop(lease, None)
        if local is None:
            await trio.lowlevel.checkpoint()
            return  # never admitted, or released: nothing to wait for here
        replies, intent = local
        intent.request_stop("caller closed")
        with trio.move_on_after(self.close_timeout_s):
            while True:
                message = await replies.receive()
                if isinstance(message, Closed | Refused):
                    return
                if isinstance(message, Orphaned):
                    raise CleanupError(lease, container_id, message.reason)
        raise CleanupError(
            lease, container_id, f"no acknowledgement within {self.close_timeout_s:g} s"
        )
