"""The caller's side of supervision: an ``Owner`` that delegates create and remove.

``SupervisedOwner`` connects to the supervisor of a state directory, launching it when absent
(in its own session, so it survives its caller), and holds one connection per lease. The
connection itself is the caller's liveness: when the caller dies, the kernel closes it and the
supervisor removes the container.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import CleanupError, NeverFits, SbxError
from sbxkit.kernel.scripts import io_root
from sbxkit.network.audit import Denial
from sbxkit.network.netns import NetworkUnavailable
from sbxkit.network.terms import NetworkTerms
from sbxkit.supervisor.channel import FrameChannel
from sbxkit.supervisor.fingerprint import implementation_fingerprint
from sbxkit.supervisor.journal import check_state_dir, default_state_dir
from sbxkit.supervisor.launch import (
    launch_detached,
    launch_engine_sockets,
    launch_lock,
    supervisor_argv,
)
from sbxkit.supervisor.link import (
    ADOPT_WITHIN_S,
    LeaseLink,
    LinkLost,
    fifo_dir_keeper,
    with_secret,
)
from sbxkit.supervisor.statedir import (
    LOG_NAME,
    SOCKET_NAME,
    log_size,
    read_log_from,
    scan_entries,
    startup_refusal,
)
from sbxkit.supervisor.wire import (
    PROTOCOL_VERSION,
    Adopted,
    AskDenials,
    Claim,
    Claimed,
    Closed,
    Created,
    Denials,
    Failed,
    Govern,
    Governed,
    Hello,
    Message,
    Orphaned,
    Queued,
    Refused,
    Register,
    Registered,
    Reservation,
    ServerMessage,
    Started,
    Unclaimed,
    Welcome,
    decode_server,
    encode,
)

LAUNCH_TIMEOUT_S = 15.0
RELAUNCH_AFTER_S = 2.0
REPLY_TIMEOUT_S = 30.0
HANDSHAKE_ATTEMPTS = 4


class SupervisorError(SbxError):
    """The supervisor refused or failed a request, or could not be reached."""

    def __init__(self, reason: str, *, code: str = "error", lease: str | None = None) -> None:
        super().__init__(f"supervisor: {reason}")
        self.reason = reason
        self.code = code
        self.lease = lease


class SupervisorConnectionLost(SupervisorError):
    """The connection to the supervisor closed while sending."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"connection lost: {reason}", code="connection")


class CapacityExhausted(SupervisorError):
    """A hard bound is used up — lease records or connections — and the request was refused
    explicitly (nothing was created). Retrying later can succeed; CLI exit status 75."""


class AdmissionTimeout(CapacityExhausted):
    """The request waited for capacity (memory, live sandboxes, launches) longer than the
    supervisor's admission deadline (``--admission-timeout``); nothing was created."""


QueueObserver = Callable[[int, float], object]
"""Called while a request waits for capacity: (requests ahead of it, seconds waited so far);
when its place changes and about every second."""


def check_before_launch(state_dir: Path) -> None:
    """The supervisor's own startup checks, run by the client before it launches one: the path
    and every entry (a state directory it would refuse is reported at once, not after
    ``LAUNCH_TIMEOUT_S``)."""
    check_state_dir(state_dir, create=True)
    problems, _stale = scan_entries(state_dir)
    if problems:
        raise SupervisorError(
            "unsafe supervisor state blocks execution: " + "; ".join(map(str, problems)),
            code="storage",
        )


class _Session(FrameChannel):
    """One connection carrying one lease."""

    async def send(self, *messages: Message | None) -> None:
        """Send messages in one write; a closed connection is a SupervisorError, never a trio
        error."""
        try:
            await self.stream.send_all(b"".join(encode(m) for m in messages if m is not None))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise SupervisorConnectionLost(str(exc) or type(exc).__name__) from exc

    async def receive(self) -> ServerMessage | None:
        payload = await self.receive_payload()
        return None if payload is None else decode_server(payload)


async def _connect_once(path: Path) -> trio.SocketStream | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise SupervisorError(f"{path} is not a socket owned by uid {os.geteuid()}", code="storage")
    try:
        return await trio.open_unix_socket(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return None
        raise SupervisorError(f"cannot connect to {path}: {exc.strerror}") from exc


async def connect_supervisor(
    state_dir: Path,
    first: Message | None = None,
    *,
    command: str | None = None,
    engine_sockets: Sequence[str] | None = None,
) -> _Session:
    """Connect to the state dir's supervisor (launching it if needed); complete the handshake.

    ``first`` is sent right behind the Hello, in the same write, to save a round trip: the
    supervisor reads it only after it has accepted the Hello, and ignores it otherwise.

    A supervisor that is exiting because it was idle may close a fresh connection before the
    handshake; that race is retried (and a new supervisor launched) a few times.
    """
    if state_dir not in _CHECKED_STATE_DIRS:
        await trio.to_thread.run_sync(lambda: check_state_dir(state_dir, create=True))
        _CHECKED_STATE_DIRS.add(state_dir)  # the supervisor re-checks at every start
    for attempt in range(HANDSHAKE_ATTEMPTS):
        try:
            return await _connect_and_greet(state_dir, first, command, engine_sockets)
        except _HandshakeLost:
            if attempt + 1 == HANDSHAKE_ATTEMPTS:
                raise SupervisorError(
                    "the supervisor closed the connection during the "
                    f"handshake {HANDSHAKE_ATTEMPTS} times"
                ) from None
            await trio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


class _HandshakeLost(Exception):
    """The connection closed before Welcome (e.g. an idle supervisor exiting)."""


_CHECKED_STATE_DIRS: set[Path] = set()


async def _connect_and_greet(
    state_dir: Path,
    first: Message | None,
    command: str | None,
    engine_sockets: Sequence[str] | None = None,
) -> _Session:
    stream = await _connect_once(state_dir / SOCKET_NAME)
    if stream is None:
        async with launch_lock(state_dir):
            sockets = launch_engine_sockets(first) if engine_sockets is None else engine_sockets
            stream = await _launched(state_dir, command, sockets)
    session = _Session(stream, accept_fds=True)  # a Claimed may bring a sandbox's ends
    try:
        try:
            hello = Hello(protocol=PROTOCOL_VERSION, fingerprint=implementation_fingerprint())
            # Shielded: once ``first`` (a Register) is on its way, the supervisor may create
            # for it. Cancelled here, the caller would leave without the session its removal
            # needs; the cancellation lands at the caller's next checkpoint instead.
            with trio.CancelScope(shield=True), trio.fail_after(REPLY_TIMEOUT_S):
                await session.send(hello, first)
                reply = await session.receive()
        except (
            SupervisorConnectionLost,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            OSError,
        ):
            raise _HandshakeLost() from None
        except trio.TooSlowError:
            raise SupervisorError(
                f"the supervisor did not answer the handshake within {REPLY_TIMEOUT_S:g} s"
            ) from None
        if reply is None:
            raise _HandshakeLost()
    except BaseException:
        await session.aclose()
        raise
    if isinstance(reply, Welcome):
        return session
    await session.aclose()
    if isinstance(reply, Refused):
        raise refusal_error(reply)
    raise SupervisorError(f"unexpected {type(reply).__name__} in the handshake")


async def _launched(
    state_dir: Path, command: str | None, engine_sockets: Sequence[str]
) -> trio.SocketStream:
    """A connection to the supervisor another task of this run launched meanwhile, else to
    one launched now (serving ``engine_sockets``)."""
    socket_path = state_dir / SOCKET_NAME
    stream = await _connect_once(socket_path)
    if stream is not None:
        return stream
    # What would stop the supervisor from starting is reported now, by path and problem.
    await trio.to_thread.run_sync(check_before_launch, state_dir)
    argv = supervisor_argv(state_dir, command, engine_sockets=engine_sockets)
    log_path = state_dir / LOG_NAME
    log_offset = log_size(log_path)
    relaunch_after = RELAUNCH_AFTER_S
    with trio.move_on_after(LAUNCH_TIMEOUT_S):
        while stream is None:
            # Again after a while without an answer: the one that started may have been
            # killed before it listened (an extra one exits at once, on the lock).
            relaunch_at = trio.current_time() + relaunch_after
            relaunch_after *= 2
            try:
                await trio.to_thread.run_sync(launch_detached, argv, log_path)
            except (OSError, subprocess.SubprocessError) as exc:
                raise SupervisorError(f"cannot launch {shlex.join(argv)}: {exc}") from exc
            while stream is None and trio.current_time() < relaunch_at:
                await trio.sleep(0.02)
                stream = await _connect_once(socket_path)
                refusal = startup_refusal(read_log_from(log_path, log_offset))
                if stream is None and refusal is not None:
                    raise SupervisorError(f"it refused to start: {refusal}", code="storage")
    if stream is None:
        raise SupervisorError(
            f"{shlex.join(argv)} did not open {socket_path} "
            f"within {LAUNCH_TIMEOUT_S:g} s; see {log_path}"
        )
    return stream


def refusal_error(reply: Refused, lease: str | None = None) -> SupervisorError | NeverFits:
    """The error a refusal stands for: its code decides the class."""
    if reply.code == "never_fits":
        return NeverFits(reply.field or "limits", reply.reason, lease=lease)
    if reply.code == "admission_timeout":
        return AdmissionTimeout(reply.reason, code=reply.code, lease=lease)
    if reply.code == "capacity":
        return CapacityExhausted(reply.reason, code=reply.code, lease=lease)
    return SupervisorError(reply.reason, code=reply.code, lease=lease)


async def receive_reply(
    session: _Session, what: str, timeout: float = REPLY_TIMEOUT_S
) -> ServerMessage:
    with trio.move_on_after(timeout):
        try:
            message = await session.receive()
        except SbxError as exc:
            raise SupervisorError(f"{what}: {exc}") from exc
        if message is None:
            raise SupervisorError(f"{what}: the supervisor closed the connection")
        return message
    raise SupervisorError(f"{what}: no answer within {timeout:g} s")


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

    async def connect(self, first: Message | None = None) -> _Session:
        """A launched supervisor serves this owner's daemon (whatever ``first`` is: a
        Register, a Claim, or an Adopt after the previous one died)."""
        return await connect_supervisor(
            self.state_dir,
            first,
            command=self.supervisor_command,
            engine_sockets=[self._engine.socket_path],
        )

    # -- the owner seam -------------------------------------------------------------------------

    def register_for(
        self,
        lease: str,
        name: str,
        body: ContainerCreate,
        *,
        lifetime_s: float,
        network: NetworkTerms | None = None,
    ) -> Register:
        """The Register asking for ``body``'s container under ``lease`` (and ``network``, a
        governed network the supervisor carries out once asked)."""
        host = body.host_config
        if host is None or host.memory is None or host.nano_cpus is None:
            raise SupervisorError("the create body must bound memory and CPU", lease=lease)
        return Register(
            lease=lease,
            name=name,
            engine_socket=self._engine.socket_path,
            body=body,
            reservation=Reservation(memory_bytes=host.memory, nano_cpus=host.nano_cpus),
            startup_deadline_s=self.startup_deadline_s,
            lifetime_deadline_s=lifetime_s,
            network=network,
        )

    def _link(self, lease: str, session: _Session, **options: Any) -> LeaseLink:
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
        try:
            await link.send(message)
            reply = await link.take(kind, timeout=REPLY_TIMEOUT_S)
        except LinkLost as exc:
            raise NetworkUnavailable(f"the lease is over or lost: {exc.reason}") from None
        if reply is None:
            raise SupervisorError(f"{kind.__name__}: no answer within {REPLY_TIMEOUT_S:g} s")
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
            network = claim.template.network
            self._link(
                reply.lease,
                session,
                secret=reply.secret,
                governed=network is not None and network.needs_governor,
            )
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

    async def create(
        self,
        lease: str,
        name: str,
        body: ContainerCreate,
        *,
        lifetime_s: float,
        network: NetworkTerms | None = None,
    ) -> str:
        register = self.register_for(lease, name, body, lifetime_s=lifetime_s, network=network)
        secret, register = with_secret(register)
        asked = trio.current_time()
        session = await self.connect(first=register)  # Register rides with the Hello
        link = self._link(
            lease,
            session,
            secret=secret,
            register=register,
            governed=network is not None and network.needs_governor,
            before_register=fifo_dir_keeper(body),
        )
        # From Registered on the supervisor owns the container: cancelling us only closes the
        # lease. A re-adoption after its death may answer with the container (Adopted), or
        # register afresh (Queued, Registered again).
        timeout = REPLY_TIMEOUT_S
        while True:
            try:
                reply = await link.take(*_CREATE_ANSWERS, timeout=timeout)
            except LinkLost as exc:
                raise SupervisorError(f"create: {exc.reason}", lease=lease) from None
            if reply is None:
                raise SupervisorError(f"create: no answer within {timeout:g} s", lease=lease)
            if isinstance(reply, Queued):
                # The supervisor speaks at least every few seconds while we wait: silence for
                # REPLY_TIMEOUT_S means it is stuck, a deadline of its own ends the wait.
                if self.on_queued is not None:
                    self.on_queued(reply.ahead, trio.current_time() - asked)
            elif isinstance(reply, Registered):
                self._queued[lease] = reply.waited_s
                timeout = self.startup_deadline_s + REPLY_TIMEOUT_S
            elif isinstance(reply, Created | Adopted):
                self._queued.setdefault(lease, trio.current_time() - asked)  # re-adopted
                self._inspected[lease] = reply.inspected if isinstance(reply, Created) else None
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

    async def ended_by_owner(self, lease: str) -> str | None:
        """The supervisor's ``Expiring`` reason, if it ended the lease's container itself. It
        sends that before the removal's kill, so after the kill it is already here to read."""
        await trio.lowlevel.checkpoint()
        link = self._links.get(lease)
        return None if link is None else await link.expiring(REPLY_TIMEOUT_S)

    async def release(self, lease: str) -> bool:
        """Hand the lease back without waiting for the verdict: the supervisor removes the
        container, then its FIFO directory (the record closes only when the daemon confirmed
        the removal; a failure keeps it for the reaper). A pooled run's early return. The
        link finishes on its own: if the supervisor dies first, it re-adopts the lease to
        close it, as long as this process lives (else the restarted supervisor's grace ends).
        A lease whose supervisor died and that was not re-adopted raises ``CleanupError``."""
        self._queued.pop(lease, None)
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
        link = self._links.pop(lease, None)
        if link is None:
            return  # never registered: nothing was created
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
