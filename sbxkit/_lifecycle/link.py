"""A lease's connection to its supervisor, carried across the supervisor's restarts (issue 22).

``SupervisedOwner`` holds one ``LeaseLink`` per lease. Its reader — a trio system task, so it
runs while the caller's own tasks wait on the daemon, and ends with the lease — takes every
message the supervisor sends into an inbox the owner's calls read (``take``), and notices at
once when the connection drops: EOF or a reset before the lease is over means the supervisor
died (a live supervisor ends a lease's connection only after ``Closed``, ``Orphaned`` or
``Refused``). The reader then reconnects — launching a supervisor as any connection does — and
re-adopts the lease with its secret (``Adopt``, proof.py) within ``adopt_within_s``. Meanwhile
the payload runs on: its output and its exit flow between the caller and the daemon (or the
host's FIFOs and the init's pidfd), never through the supervisor.

Before ``Created`` (the caller waited for admission or for the create) the answer may be the
container of the interrupted create (``Adopted``), or, when the supervisor holds no record of
the lease (nothing was created), a fresh registration of the same lease. A ``Close`` the caller
sent is sent again on the new connection. What cannot be re-adopted leaves the link ``lost``:
the owner's calls raise, and removal reports that durable recovery is required, as before.

A governed lease (docs/network.md) is re-adopted the same way, at once: its ``Adopt`` carries
the terms it registered, and the new supervisor binds its listeners in the sandbox again
before it answers ``Adopted`` — until then nothing listens there, so egress stays closed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec
import trio

from sbxkit._kernel.fifos import make_io_dir, sandbox_ids
from sbxkit._kernel.scripts import io_dir_of
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._protocol.proof import SECRET_BYTES, secret_hash
from sbxkit._protocol.wire import (
    Adopt,
    Adopted,
    Close,
    Closed,
    Created,
    Detached,
    Expiring,
    Launched,
    Message,
    Orphaned,
    Refused,
    Register,
    ServerMessage,
    Unadopted,
)
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import LinkLost, SbxError

ADOPT_WITHIN_S = 10.0
"""How long a caller tries to re-adopt a lease after its supervisor died (a restarted
supervisor holds the lease ``--adopt-grace``, 10 s by default, from its own start)."""
RETRY_CEILING_S = 1.0
EXPIRING_POLL_S = 0.05

M = TypeVar("M", bound=ServerMessage)

TERMINAL = (Closed, Orphaned, Refused)
"""After these the supervisor says nothing more on the lease's connection."""


class Session(Protocol):
    """A connection to a supervisor (``client._Session``)."""

    async def send(self, *messages: Message | None) -> None: ...

    async def receive(self) -> ServerMessage | None: ...

    def has_input(self) -> bool: ...

    async def aclose(self) -> None: ...


Connect = Callable[[Message], Awaitable[Session]]
"""Connect to the state directory's supervisor (launching it if absent), send ``first``."""


def new_secret() -> str:
    """A lease's secret: 32 random bytes, hex; kept in the caller's memory only."""
    return secrets.token_hex(SECRET_BYTES)


def with_secret(register: Register) -> tuple[str, Register]:
    """A fresh secret, and ``register`` carrying its hash (proof.py): the secret stays in the
    caller's memory and re-adopts the lease should the supervisor die."""
    secret = new_secret()
    return secret, msgspec.structs.replace(register, secret_hash=secret_hash(secret))


def fifo_dir_keeper(body: ContainerCreate) -> Callable[[], None] | None:
    """For a kernel path body: make its FIFO directory again if it is gone (a restarted
    supervisor's recovery removes it with an interrupted create's container, before the
    lease is registered again)."""
    io_dir = io_dir_of(body)
    if io_dir is None:
        return None
    path = Path(io_dir)

    def keep() -> None:
        if not os.path.lexists(path):
            make_io_dir(path.parent, path.name, *sandbox_ids(body.user))

    return keep


class LeaseLink:
    """One lease's connection, its inbox, and its re-adoption when the supervisor dies."""

    def __init__(
        self,
        lease: str,
        session: Session,
        *,
        connect: Connect,
        secret: str | None,
        register: Register | None = None,
        network: NetworkTerms | None = None,
        adopt_within_s: float = ADOPT_WITHIN_S,
        before_register: Callable[[], None] | None = None,
    ) -> None:
        self.lease = lease
        self.session = session
        self._connect = connect
        self._secret = secret
        self._next_secret: str | None = None
        """The next secret, made for an Adopt and kept until its answer (a retry resends the
        same pair: proof.py)."""
        self.register = register
        """How the lease was registered (None: claimed); sent again when a restarted
        supervisor holds no record of a lease that was never created."""
        self.network = network if network is not None and network.needs_governor else None
        """A governed lease's terms (registered or claimed): its Adopt carries them, so the
        next supervisor puts its listeners back."""
        self.adopt_within_s = adopt_within_s
        self._before_register = before_register
        """Restores what the Register needs on the host (its FIFO directory: recovery removed
        it with the interrupted create's container), run in a worker thread."""
        self.created = register is None
        """The caller knows the lease's container (Created, Adopted or Claimed came)."""
        self.closing = False
        self._closing_at_drop = False
        """Close was sent before the connection dropped (so the dead supervisor may have
        carried it out)."""
        self.ended = False
        self.lost: str | None = None
        self.adopting = False
        self.adoptions = 0
        self._inbox: list[ServerMessage] = []
        self._changed = trio.Event()
        self._scope = trio.CancelScope()
        self._done = trio.Event()

    @property
    def never_created(self) -> bool:
        """A registered create whose container the caller never heard of (no Created, no
        Adopted): nothing of its payload can have run."""
        return self.register is not None and not self.created

    # -- the reader ------------------------------------------------------------------------------

    def start(self) -> None:
        trio.lowlevel.spawn_system_task(self._run, name=f"sbxkit lease {self.lease}")

    def stop(self) -> None:
        """End the reader (the lease is over for the caller); its connection closes."""
        self._scope.cancel()

    async def _run(self) -> None:
        try:
            with self._scope:
                await self._read()
        except Exception as exc:  # a system task must not raise: the link is lost instead
            self._lose(f"internal error: {exc!r}")
        finally:
            self._done.set()
            self._notify()
            with trio.CancelScope(shield=True):
                await self.session.aclose()

    async def _read(self) -> None:
        while True:
            try:
                message = await self.session.receive()
            except SbxError as exc:
                self._lose(f"the supervisor sent what this client cannot read: {exc}")
                return
            if message is None:
                if not await self._readopt():
                    return
                continue
            if isinstance(message, Created):
                self.created = True  # from here a missing record means it was recovered
            self._push(message)
            if isinstance(message, TERMINAL) or (
                isinstance(message, Detached) and message.problem is None
            ):  # a detached lease's connection ends with the lease alive: no re-adoption
                self.ended = True
                return

    # -- re-adoption ----------------------------------------------------------------------------

    async def _readopt(self) -> bool:
        """The connection dropped before the lease was over: re-adopt it in a (restarted)
        supervisor. True: the link goes on; False: the lease is over or lost."""
        if self._secret is None:
            self._lose("the lease has no secret to re-adopt it with")
            return False
        self.adopting = True
        self._closing_at_drop = self.closing
        self._notify()
        problem = "no supervisor answered"
        try:
            with trio.move_on_after(self.adopt_within_s):
                delay = 0.05
                while True:
                    outcome = await self._adopt_once()
                    if isinstance(outcome, bool):
                        return outcome
                    problem = outcome
                    await trio.sleep(delay)
                    delay = min(delay * 2, RETRY_CEILING_S)
            self._lose(f"it was not re-adopted within {self.adopt_within_s:g} s ({problem})")
            return False
        finally:
            self.adopting = False
            self._notify()

    async def _adopt_once(self) -> bool | str:
        """One attempt: True (adopted or registered afresh), False (over or lost), or a
        problem worth another attempt."""
        assert self._secret is not None
        if self._next_secret is None:
            self._next_secret = new_secret()
        adopt = Adopt(
            lease=self.lease,
            secret=self._secret,
            next_secret_hash=secret_hash(self._next_secret),
            network=self.network,
        )
        try:
            session = await self._connect(adopt)
        except SbxError as exc:
            return str(exc)
        try:
            return await self._answered(session)
        except BaseException:  # cancelled (the adoption's time is up, or the link stopped)
            with trio.CancelScope(shield=True):
                await session.aclose()
            raise

    async def _answered(self, session: Session) -> bool | str:
        """Act on the answer to an Adopt sent on ``session`` (kept if adopted)."""
        try:
            reply = await session.receive()
        except SbxError as exc:
            reply = None
            problem = str(exc)
        else:
            problem = "the supervisor closed the connection during the adoption"
        if isinstance(reply, Adopted):
            self._secret, self._next_secret = self._next_secret, None
            await self._swap(session)
            self.adoptions += 1
            if not self.created:
                self.created = True
                self._push(reply)  # the container the interrupted create made
            if self.closing:
                with contextlib.suppress(SbxError):
                    await session.send(Close(lease=self.lease))
            return True
        if isinstance(reply, Unadopted) and not reply.record:
            return await self._without_record(session)
        await session.aclose()
        if isinstance(reply, Closed):  # its container was already gone: the lease is over
            self._push(reply)
            self.ended = True
            return False
        if isinstance(reply, Unadopted):
            self._lose(f"it could not be re-adopted: {reply.reason}")
            return False
        if isinstance(reply, Refused):
            return f"refused: {reply.reason}"  # e.g. too many connections now: try again
        return problem if reply is None else f"unexpected {type(reply).__name__}"

    async def _without_record(self, session: Session) -> bool | str:
        """The supervisor holds no record of the lease. A record is deleted only once its
        container is confirmed gone, and none is written before admission: a lease whose
        Close went out before the drop was closed as asked, one never created is registered
        afresh, any other was recovered — its container removed — before it was re-adopted."""
        await session.aclose()
        if self._closing_at_drop:
            self._push(Closed(lease=self.lease))
            self.ended = True
            return False
        if self.created or self.register is None:
            self._lose("it was recovered (its container removed) before it could be re-adopted")
            return False
        if self.closing:  # never created, nothing journaled: nothing to remove
            self._push(Closed(lease=self.lease))
            self.ended = True
            return False
        try:
            if self._before_register is not None:
                await trio.to_thread.run_sync(self._before_register)
            fresh = await self._connect(self.register)
        except (SbxError, OSError) as exc:
            return str(exc)
        await self._swap(fresh)
        return True

    async def _swap(self, session: Session) -> None:
        old, self.session = self.session, session
        with trio.CancelScope(shield=True):
            await old.aclose()

    # -- what the owner's calls use ------------------------------------------------------------

    async def send(self, message: Message) -> None:
        """Send on the lease's connection, once any re-adoption under way has settled;
        ``LinkLost`` if the lease is lost or over (a dropped connection: the transport's
        error, while the reader re-adopts)."""
        while self.adopting:
            await self._wait_change()
        if self.lost is not None:
            raise LinkLost(self.lost)
        if self.ended:
            raise LinkLost("the lease is over")
        await self.session.send(message)

    async def close(self) -> None:
        """Ask for removal: now, or on the next connection if a re-adoption is under way
        (and again after any later one)."""
        self.closing = True
        if self.adopting or self.ended or self.lost is not None:
            return
        with contextlib.suppress(SbxError):
            await self.session.send(Close(lease=self.lease))

    def take_now(self, *kinds: type[M]) -> M | None:
        """The oldest message of ``kinds`` already read, removed from the inbox."""
        for index, message in enumerate(self._inbox):
            if isinstance(message, kinds):
                del self._inbox[index]
                return message
        return None

    def unread(self, message: ServerMessage) -> None:
        """Put a taken message back, first (another call of the owner's needs it)."""
        self._inbox.insert(0, message)
        self._notify()

    def holds(self, *kinds: type[ServerMessage]) -> bool:
        return any(isinstance(message, kinds) for message in self._inbox)

    async def take(self, *kinds: type[M], timeout: float) -> M | None:
        """The oldest message of ``kinds``, waiting while the supervisor is silent at most
        ``timeout`` (a re-adoption under way is not silence); None after that. ``LinkLost``
        when none can come any more."""
        while True:
            found = self.take_now(*kinds)
            if found is not None:
                return found
            if self.lost is not None:
                raise LinkLost(self.lost)
            if self._done.is_set():
                raise LinkLost("the supervisor ended the lease's connection")
            with trio.move_on_after(timeout) as waited:
                await self._wait_change()
            if waited.cancelled_caught and not self.adopting:
                return None

    async def launched(self, adoptions: int) -> Launched | None:
        """The supervisor's answer to the start it sent for the lease (``Launched``); None once
        the lease was re-adopted after ``adoptions`` re-adoptions (the supervisor that holds it
        now never started it: the caller does). ``LinkLost`` when neither can come."""
        while True:
            found = self.take_now(Launched)
            if found is not None:
                return found
            if self.adoptions != adoptions:
                return None
            if self.lost is not None:
                raise LinkLost(self.lost)
            if self._done.is_set():
                raise LinkLost("the supervisor ended the lease's connection")
            await self._wait_change()

    async def settled(self) -> None:
        """Once no re-adoption is under way (it succeeded, or the lease is lost or over)."""
        while self.adopting:
            await self._wait_change()

    async def expiring(self, timeout: float) -> Expiring | None:
        """The supervisor's ``Expiring``, if it sent one: read already, or arriving
        now (it is sent before the removal's kill, so once the kill was seen it is here).
        A re-adoption under way is waited out first: the new supervisor may be the one."""
        deadline = trio.current_time() + timeout
        await self.settled()
        while True:
            found = self.take_now(Expiring)
            if found is not None:
                return found
            if self.adopting or self._done.is_set() or trio.current_time() > deadline:
                return None  # what came before a drop was read before it
            if not self._has_input():
                return None
            with trio.move_on_after(EXPIRING_POLL_S):
                await self._wait_change()

    async def wait_done(self) -> None:
        await self._done.wait()

    # -- internals ------------------------------------------------------------------------------

    def _has_input(self) -> bool:
        try:
            return self.session.has_input()
        except (OSError, ValueError):  # closed meanwhile
            return False

    def _push(self, message: ServerMessage) -> None:
        self._inbox.append(message)
        self._notify()

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()
