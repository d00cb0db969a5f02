"""The caller's side of supervision: an ``Owner`` that delegates create and remove.

``SupervisedOwner`` connects to the supervisor of a state directory, launching it when absent
(in its own session, so it survives its caller), and holds one connection per lease. The
connection itself is the caller's liveness: when the caller dies, the kernel closes it and the
supervisor removes the container.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.connect import (
    SupervisorSession,
    connect_supervisor,
    receive_reply,
    refusal_error,
    reply_timeout_s,
)
from sbxkit._lifecycle.link import (
    ADOPT_WITHIN_S,
    LeaseLink,
    fifo_dir_keeper,
    new_secret,
    with_secret,
)
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._protocol.journal import default_state_dir
from sbxkit._protocol.proof import secret_hash
from sbxkit._protocol.wire import (
    Adopt,
    Adopted,
    AskDenials,
    Claim,
    Claimed,
    Closed,
    Created,
    Denials,
    Detach,
    Detached,
    Expiring,
    Failed,
    Govern,
    Governed,
    Message,
    Orphaned,
    Queued,
    Refused,
    Register,
    Registered,
    Reservation,
    Started,
    Unadopted,
    Unclaimed,
)
from sbxkit._util.public import publish
from sbxkit._util.unwrap import plain_errors
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerInspect
from sbxkit.engine.transport import status_error
from sbxkit.errors import (
    CleanupError,
    CreateInterrupted,
    LinkLost,
    NetworkUnavailable,
    ReattachRefused,
    SbxError,
    SupervisorError,
)

QueueObserver = Callable[[int, float], object]
"""Called while a request waits for capacity: (requests ahead of it, seconds waited so far);
when its place changes and about every second."""


class SupervisedOwner:
    """Owner whose containers survive nothing: the supervisor removes them even if we die.

    Admission happens in the supervisor: a request that does not fit the budget yet waits in
    its FIFO queue (``on_queued`` hears about it), one that can never fit raises ``NeverFits``.

    Each lease is carried by a ``LeaseLink`` (link.py): if the supervisor dies while the
    lease lives, the link notices at once, launches or reaches a new one and re-adopts the
    lease with its secret within ``adopt_within_s`` — the payload runs on meanwhile.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        state_dir: Path | None = None,
        startup_deadline_s: float = 30.0,
        close_timeout_s: float = 60.0,
        on_queued: QueueObserver | None = None,
        supervisor_command: str | None = None,
        adopt_within_s: float = ADOPT_WITHIN_S,
    ) -> None:
        self._engine = engine
        self.supervisor_command = supervisor_command
        self.state_dir = state_dir or default_state_dir()
        self.fifo_root = io_root(self.state_dir)
        """Beside the state directory: the supervisor checks and removes them there."""
        self.startup_deadline_s = startup_deadline_s
        self.close_timeout_s = close_timeout_s
        self.on_queued = on_queued
        self.adopt_within_s = adopt_within_s
        """How long a lease's link tries to re-adopt it after its supervisor died."""
        self._links: dict[str, LeaseLink] = {}
        self._queued: dict[str, float] = {}
        self._claimed_fds: dict[str, list[int]] = {}
        self._inspected: dict[str, ContainerInspect | None] = {}
        self._launching: dict[str, int] = {}
        """The leases whose start the supervisor sent, with their link's re-adoptions then."""
        self._launch_answered: set[str] = set()

    launches = True
    """Its supervisor starts a kernel path container itself once verified (``launch``)."""

    async def connect(self, first: Message | None = None) -> SupervisorSession:
        """A launched supervisor serves this owner's daemon (whatever ``first`` is: a
        Register, a Claim, or an Adopt after the previous one died)."""
        return await connect_supervisor(
            self.state_dir,
            first,
            command=self.supervisor_command,
            engine_sockets=[self._engine.socket_path],
        )

    # -- the owner seam -------------------------------------------------------------------------

    def register_for(self, request: CreateRequest) -> Register:
        """The Register asking for ``request``'s container (its ``network``, a governed
        network the supervisor carries out once asked; its ``launch``, the start the
        supervisor makes once the container is verified)."""
        host = request.body.host_config
        if host is None or host.memory is None or host.nano_cpus is None:
            raise SupervisorError("the create body must bound memory and CPU", lease=request.lease)
        return Register(
            lease=request.lease,
            name=request.name,
            engine_socket=self._engine.socket_path,
            body=request.body,
            reservation=Reservation(memory_bytes=host.memory, nano_cpus=host.nano_cpus),
            startup_deadline_s=self.startup_deadline_s,
            lifetime_deadline_s=request.lifetime_s,
            network=request.network,
            launch=request.launch,
        )

    def _link(self, lease: str, session: SupervisorSession, **options: Any) -> LeaseLink:
        link = LeaseLink(
            lease, session, connect=self.connect, adopt_within_s=self.adopt_within_s, **options
        )
        self._links[lease] = link
        link.start()
        return link

    async def _ask(
        self, lease: str, message: Message, kind: type[Governed] | type[Denials]
    ) -> Governed | Denials:
        """Send ``message``, return the answer of ``kind``; a lease that ended meanwhile (its
        Closed or Orphaned stays for its removal) or lost its supervisor is unusable."""
        link = self._links.get(lease)
        if link is None:
            raise NetworkUnavailable("the lease has no connection to its supervisor")
        timeout = reply_timeout_s()
        try:
            await link.send(message)
            reply = await link.take(kind, timeout=timeout)
        except LinkLost as exc:
            raise NetworkUnavailable(f"the lease is over or lost: {exc.reason}") from None
        if reply is None:
            raise SupervisorError(f"{kind.__name__}: no answer within {timeout:g} s")
        return reply

    async def govern(
        self, lease: str, container_id: str, terms: NetworkTerms, user: tuple[int, int]
    ) -> None:
        """Have the supervisor put the lease's listeners in place (registered with its
        ``network``); they are the supervisor's and end with the lease."""
        reply = await self._ask(lease, Govern(lease=lease), Governed)
        assert isinstance(reply, Governed)
        if reply.problem is not None:
            raise NetworkUnavailable(reply.problem)

    async def denials(self, lease: str) -> tuple[Denial, ...]:
        if lease not in self._links:
            return ()
        reply = await self._ask(lease, AskDenials(lease=lease), Denials)
        assert isinstance(reply, Denials)
        return tuple(reply.denials)

    async def ports(self, lease: str) -> tuple[PortForward, ...]:
        """Asked with the denials (one reply carries the governed network's state)."""
        if lease not in self._links:
            return ()
        reply = await self._ask(lease, AskDenials(lease=lease), Denials)
        assert isinstance(reply, Denials)
        return tuple(reply.ports)

    async def claim(self, claim: Claim) -> Claimed | Unclaimed:
        """Take a parked container of the claim's shape from the supervisor's pool (starting
        the pool on a shape's first claim). ``Claimed``: its lease is ours now, to end with
        ``remove`` like any other; ``Unclaimed``: nothing parked, run cold."""
        session = await self.connect(first=claim)
        try:
            reply = await receive_reply(session, "claim")
        except BaseException:
            await session.aclose()
            raise
        if isinstance(reply, Claimed):
            fds = session.take_fds(reply.fds)
            self._link(reply.lease, session, secret=reply.secret, network=claim.template.network)
            if len(fds) != reply.fds:
                for fd in fds:
                    os.close(fd)
                await self.remove(reply.lease, reply.name, reply.container_id)
                raise SupervisorError(
                    f"claim: {reply.fds} file descriptors promised, {len(fds)} came",
                    lease=reply.lease,
                )
            self._claimed_fds[reply.lease] = fds
            return reply
        await session.aclose()
        if isinstance(reply, Unclaimed):
            return reply
        if isinstance(reply, Refused):
            raise refusal_error(reply)
        raise SupervisorError(f"unexpected {type(reply).__name__} after a claim")

    async def create(self, request: CreateRequest) -> str:
        lease = request.lease
        register = self.register_for(request)
        secret, register = with_secret(register)
        asked = trio.current_time()
        session = await self.connect(first=register)  # Register rides with the Hello
        link = self._link(
            lease,
            session,
            secret=secret,
            register=register,
            network=request.network,
            before_register=fifo_dir_keeper(request.body),
        )
        # From Registered on the supervisor owns the container: cancelling us only closes the
        # lease. A re-adoption after its death may answer with the container (Adopted), or
        # register afresh (Queued, Registered again).
        reply_timeout = timeout = reply_timeout_s()
        while True:
            try:
                reply = await link.take(*_CREATE_ANSWERS, timeout=timeout)
            except LinkLost as exc:
                if link.never_created:
                    raise CreateInterrupted(f"create: {exc.reason}", lease=lease) from None
                raise SupervisorError(f"create: {exc.reason}", lease=lease) from None
            if reply is None:
                raise SupervisorError(f"create: no answer within {timeout:g} s", lease=lease)
            if isinstance(reply, Queued):
                # The supervisor speaks at least every few seconds while we wait: silence for
                # reply_timeout_s() means it is stuck, a deadline of its own ends the wait.
                if self.on_queued is not None:
                    self.on_queued(reply.ahead, trio.current_time() - asked)
            elif isinstance(reply, Registered):
                self._queued[lease] = reply.waited_s
                timeout = self.startup_deadline_s + reply_timeout
            elif isinstance(reply, Created | Adopted):
                self._queued.setdefault(lease, trio.current_time() - asked)  # re-adopted
                self._inspected[lease] = reply.inspected if isinstance(reply, Created) else None
                if request.launch is not None and isinstance(reply, Created):
                    self._launching[lease] = link.adoptions  # an Adopted one was never started
                return reply.container_id
            elif isinstance(reply, Refused):
                self._links.pop(lease, None)
                raise refusal_error(reply, lease)
            elif isinstance(reply, Failed):
                raise SupervisorError(reply.reason, code="failed", lease=lease)
            else:  # Closed or Orphaned before any container: left for remove
                link.unread(reply)
                what = type(reply).__name__
                raise SupervisorError(f"{what} during create", lease=lease)

    async def started(self, lease: str) -> None:
        """Tell the supervisor the container started: its launch slot goes to the next lease.
        A lost connection shows up at removal, where it matters; a re-adopted lease holds no
        slot, so nothing waits for a re-adoption here."""
        link = self._links.get(lease)
        if link is not None and not link.adopting:
            with contextlib.suppress(SbxError):
                await link.send(Started(lease=lease))

    def launching(self, lease: str) -> bool:
        """Its supervisor sent the start of the lease's container (``create``'s ``launch``)."""
        return lease in self._launching

    async def said_or_launched(
        self, lease: str, container_id: str, said: Callable[[], Awaitable[None]]
    ) -> bool:
        """Wait for whichever comes first: ``said()`` (the container's shell says it runs —
        True; the daemon's answer may still be on its way, ``launch_answer``), or the
        daemon's answer to the supervisor's start (False). A start the daemon refused raises
        its error, as the caller's own start would have."""
        first: list[bool] = []
        with plain_errors():
            async with trio.open_nursery() as nursery:

                async def word() -> None:
                    await said()
                    first.append(True)
                    nursery.cancel_scope.cancel()

                async def answer() -> None:
                    await self.launch_answer(lease, container_id)
                    first.append(False)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(word)
                nursery.start_soon(answer)
        return first[0]

    async def launch_answer(self, lease: str, container_id: str) -> None:
        """Return once the lease's container was started (at once when that was already
        seen): the supervisor's ``Launched``; or,
        when the lease was re-adopted by a supervisor that never started it, once this caller
        started it (a container already running answers 304). Raises the daemon's error for a
        start it refused (``status_error``), ``SupervisorError`` for one nobody answered."""
        if lease in self._launch_answered:
            await trio.lowlevel.checkpoint()
            return
        link = self._links.get(lease)
        if link is None:
            raise SupervisorError("the lease has no connection to its supervisor", lease=lease)
        deadline = self._engine.deadlines.start + reply_timeout_s()
        try:
            with trio.fail_after(deadline):
                answer = await link.launched(self._launching.get(lease, link.adoptions))
        except LinkLost as exc:
            raise SupervisorError(f"start: {exc.reason}", lease=lease) from None
        except trio.TooSlowError:
            raise SupervisorError(f"start: no answer within {deadline:g} s", lease=lease) from None
        if answer is None:
            await self._engine.container_start(container_id)
        elif answer.status == 0:
            raise SupervisorError(f"start: {answer.message}", code="failed", lease=lease)
        elif answer.status is not None:
            raise status_error("POST", answer.path, answer.status, answer.message)
        self._launch_answered.add(lease)

    async def detach(self, lease: str, keep_s: float) -> tuple[str, float]:
        """Hand the lease to the supervisor to keep without this caller for at most
        ``keep_s`` seconds: ``(secret, until)``, the fresh secret that reattaches it (once)
        and the keep deadline (unix seconds). From here ``remove`` leaves it alone."""
        link = self._links.get(lease)
        if link is None:
            raise SupervisorError("the lease has no connection to its supervisor", lease=lease)
        secret = new_secret()
        timeout = reply_timeout_s()
        try:
            await link.send(Detach(lease=lease, keep_s=keep_s, secret_hash=secret_hash(secret)))
            reply = await link.take(Detached, timeout=timeout)
        except LinkLost as exc:
            raise SupervisorError(f"detach: {exc.reason}", lease=lease) from None
        if reply is None:
            raise SupervisorError(f"detach: no answer within {timeout:g} s", lease=lease)
        if reply.problem is not None:
            raise SupervisorError(f"detach refused: {reply.problem}", code="detach", lease=lease)
        self._forget(lease)
        link.stop()  # its connection ends; the supervisor keeps the lease
        return secret, reply.until

    async def reattach(
        self, lease: str, secret: str, *, network: NetworkTerms | None = None
    ) -> str:
        """Take a detached lease over with its handle's ``secret`` (``Adopt``): its container
        id. From here the lease is this caller's as if it had created it: ``remove`` ends it,
        and this process's death too. ``ReattachRefused`` says why not."""
        next_secret = new_secret()
        adopt = Adopt(
            lease=lease, secret=secret, next_secret_hash=secret_hash(next_secret), network=network
        )
        session = await self.connect(first=adopt)
        try:
            reply = await receive_reply(session, "reattach")
        except BaseException:
            await session.aclose()  # an Adopted not read: the connection's end removes it
            raise
        if isinstance(reply, Adopted):
            self._link(lease, session, secret=next_secret, network=network)
            return reply.container_id
        await session.aclose()
        if isinstance(reply, Unadopted):
            raise ReattachRefused(lease, reply.reason, ended=reply.ended)
        if isinstance(reply, Closed):
            raise ReattachRefused(
                lease, "its container is already gone; the lease is over", ended=True
            )
        if isinstance(reply, Refused):
            raise refusal_error(reply, lease)
        raise SupervisorError(f"unexpected {type(reply).__name__} after a reattach", lease=lease)

    def _forget(self, lease: str) -> None:
        self._queued.pop(lease, None)
        self._inspected.pop(lease, None)
        self._launching.pop(lease, None)
        self._launch_answered.discard(lease)
        self._links.pop(lease, None)

    def queued_s(self, lease: str) -> float:
        """How long the lease waited for admission (0 when it fitted at once)."""
        return self._queued.get(lease, 0.0)

    def created_inspection(self, lease: str) -> ContainerInspect | None:
        """The supervisor's post-create inspection (``Created``), once; None if adopted."""
        return self._inspected.pop(lease, None)

    def claimed_fds(self, lease: str) -> list[int]:
        """The host ends a claimed kernel path container came with (``Claimed.fds``), now
        the caller's to close; [] on the daemon's path."""
        return self._claimed_fds.pop(lease, [])

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        """The supervisor's ``Expiring``, if it ended the lease's container itself. It
        sends that before the removal's kill, so after the kill it is already here to read."""
        await trio.lowlevel.checkpoint()
        link = self._links.get(lease)
        return None if link is None else await link.expiring(reply_timeout_s())

    async def release(self, lease: str) -> bool:
        """Hand the lease back without waiting for the verdict: the supervisor removes the
        container, then its FIFO directory (the record closes only when the daemon confirmed
        the removal; a failure keeps it for the reaper). A pooled run's early return. The
        link finishes on its own: if the supervisor dies first, it re-adopts the lease to
        close it, as long as this process lives (else the restarted supervisor's grace ends).
        A lease whose supervisor died and that was not re-adopted raises ``CleanupError``."""
        self._queued.pop(lease, None)
        self._launching.pop(lease, None)
        self._launch_answered.discard(lease)
        link = self._links.pop(lease, None)
        if link is None:
            return False
        with trio.CancelScope(shield=True):
            await link.settled()  # a re-adoption under way decides who removes it
        if link.lost is not None:  # nobody to hand it to: recovery must finish it
            link.stop()
            raise CleanupError(lease, None, f"{LOST_ACK}: {link.lost}")
        with trio.CancelScope(shield=True):
            await link.close()
        await trio.lowlevel.checkpoint()  # the Close is out: a cancellation may land now
        return True

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        self._queued.pop(lease, None)
        self._inspected.pop(lease, None)
        self._launching.pop(lease, None)
        self._launch_answered.discard(lease)
        link = self._links.pop(lease, None)
        if link is None:
            return  # never registered: nothing was created
        if link.lost is not None and link.never_created:
            link.stop()  # CreateInterrupted: the journal owns the lease, its payload never ran
            return
        try:
            with trio.CancelScope(shield=True):
                await self._close(link, lease, container_id)
        finally:
            link.stop()

    async def _close(self, link: LeaseLink, lease: str, container_id: str | None) -> None:
        """Ask for removal and wait for the verdict: only ``Closed`` means cleaned up."""
        await link.close()  # now, or on the connection a re-adoption under way brings
        try:
            message = await link.take(Closed, Orphaned, Refused, timeout=self.close_timeout_s)
        except LinkLost as exc:
            raise CleanupError(lease, container_id, f"{LOST_ACK}: {exc.reason}") from None
        if message is None:
            raise CleanupError(
                lease, container_id, f"no acknowledgement within {self.close_timeout_s:g} s"
            )
        if isinstance(message, Orphaned):
            raise CleanupError(lease, container_id, message.reason)
        # Closed; or Refused: registration was refused, nothing was ever created


LOST_ACK = (
    "the connection to the supervisor was lost before cleanup was acknowledged and the lease "
    "was not re-adopted; durable recovery is required (the supervisor's restart recovery "
    "removes it)"
)
_CREATE_ANSWERS = (Queued, Registered, Created, Adopted, Refused, Failed, Closed, Orphaned)

publish(__name__, globals())  # public names show as sbxkit.NAME
