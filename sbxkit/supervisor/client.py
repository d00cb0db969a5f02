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
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from sbxkit.engine.client import Engine
from sbxkit.engine.discovery import candidate_sockets
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import CleanupError, NeverFits, SbxError
from sbxkit.kernel.scripts import io_root
from sbxkit.network.audit import Denial
from sbxkit.network.netns import NetworkUnavailable
from sbxkit.network.terms import NetworkTerms
from sbxkit.supervisor.channel import FrameChannel
from sbxkit.supervisor.environment import supervisor_environment
from sbxkit.supervisor.fingerprint import implementation_fingerprint
from sbxkit.supervisor.journal import check_state_dir, default_state_dir
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
    AskDenials,
    Claim,
    Claimed,
    Close,
    Closed,
    Created,
    Denials,
    Expiring,
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


def supervisor_argv(
    state_dir: Path, command: str | None = None, *, engine_sockets: Sequence[str] = ()
) -> list[str]:
    """How to start the helper: ``command`` (a profile's ``supervisor.binary``), else
    ``SBXKIT_SUPERVISOR``, names an executable taking ``--state-dir`` (and ``--engine-socket``,
    the daemon socket the launching caller uses); the default is this interpreter running
    ``sbxkit.supervisor``."""
    override = (command if command is not None else os.environ.get("SBXKIT_SUPERVISOR", "")).strip()
    base = shlex.split(override) if override else [sys.executable, "-m", "sbxkit.supervisor"]
    sockets = [arg for socket in engine_sockets for arg in ("--engine-socket", socket)]
    return [*base, "--state-dir", str(state_dir), *sockets]


def launch_engine_sockets(first: Message | None) -> list[str]:
    """The daemon sockets a launched supervisor may serve: the registering caller's; for an
    operator's request (no Register), those the caller's environment names."""
    if isinstance(first, Register):
        return [first.engine_socket]
    try:
        return candidate_sockets(os.environ)
    except SbxError:
        return []


def launch_detached(argv: list[str], log_path: Path) -> None:
    """Start the supervisor in a new session whose parent is not us, so it survives us and we
    leave no zombie: a shell backgrounds it and exits at once. It gets a minimal environment
    (``environment.py``), never the caller's whole one."""
    subprocess.run(
        [
            "/bin/sh",
            "-c",
            'umask 077; unset PWD OLDPWD; log=$1; shift; "$@" </dev/null >/dev/null 2>>"$log" &',
            "sbxkit-launch",
            str(log_path),
            *argv,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        check=True,
        timeout=10,
        env=supervisor_environment(os.environb),
    )


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
    state_dir: Path, first: Message | None = None, *, command: str | None = None
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
            return await _connect_and_greet(state_dir, first, command)
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
    state_dir: Path, first: Message | None, command: str | None
) -> _Session:
    socket_path = state_dir / SOCKET_NAME
    stream = await _connect_once(socket_path)
    if stream is None:
        # What would stop the supervisor from starting is reported now, by path and problem.
        await trio.to_thread.run_sync(check_before_launch, state_dir)
        argv = supervisor_argv(state_dir, command, engine_sockets=launch_engine_sockets(first))
        log_path = state_dir / LOG_NAME
        log_offset = log_size(log_path)
        try:
            await trio.to_thread.run_sync(launch_detached, argv, log_path)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SupervisorError(f"cannot launch {shlex.join(argv)}: {exc}") from exc
        with trio.move_on_after(LAUNCH_TIMEOUT_S):
            while stream is None:
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
    ) -> None:
        self._engine = engine
        self.supervisor_command = supervisor_command
        self.state_dir = state_dir or default_state_dir()
        self.fifo_root = io_root(self.state_dir)
        """Beside the state directory: the supervisor checks and removes them there."""
        self.startup_deadline_s = startup_deadline_s
        self.close_timeout_s = close_timeout_s
        self.on_queued = on_queued
        self._sessions: dict[str, _Session] = {}
        self._queued: dict[str, float] = {}
        self._claimed_fds: dict[str, list[int]] = {}
        self._ended: dict[str, ServerMessage] = {}
        self._expiring: dict[str, str] = {}
        """A lease's Closed or Orphaned read while waiting for another answer (its close
        reads it here instead of waiting for a second one)."""

    async def connect(self, first: Message | None = None) -> _Session:
        return await connect_supervisor(self.state_dir, first, command=self.supervisor_command)

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

    async def _answer(self, lease: str, kind: type[Governed] | type[Denials]) -> Governed | Denials:
        """The supervisor's answer of ``kind`` on the lease's connection; a lease that ended
        meanwhile (Closed, Orphaned) is kept for its close and raised as unusable."""
        session = self._sessions.get(lease)
        if session is None:
            raise NetworkUnavailable("the lease has no connection to its supervisor")
        while True:
            reply = await receive_reply(session, kind.__name__.lower())
            if isinstance(reply, kind):
                return reply
            if isinstance(reply, Closed | Orphaned):
                self._ended[lease] = reply
                raise NetworkUnavailable(f"the lease ended: {type(reply).__name__}")
            if isinstance(reply, Expiring):
                self._expiring[lease] = reply.reason  # for ended_by_owner
            # a late Created/Failed of a create already answered: keep reading

    async def govern(
        self, lease: str, container_id: str, terms: NetworkTerms, user: tuple[int, int]
    ) -> None:
        """Have the supervisor put the lease's listeners in place (registered with its
        ``network``); they are the supervisor's and end with the lease."""
        session = self._sessions.get(lease)
        if session is None:
            raise NetworkUnavailable("the lease has no connection to its supervisor")
        await session.send(Govern(lease=lease))
        reply = await self._answer(lease, Governed)
        assert isinstance(reply, Governed)
        if reply.problem is not None:
            raise NetworkUnavailable(reply.problem)

    async def denials(self, lease: str) -> tuple[Denial, ...]:
        session = self._sessions.get(lease)
        if session is None:
            return ()
        await session.send(AskDenials(lease=lease))
        reply = await self._answer(lease, Denials)
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
            self._sessions[reply.lease] = session
            fds = session.take_fds(reply.fds)
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
        asked = trio.current_time()
        session = await self.connect(first=register)  # Register rides with the Hello
        self._sessions[lease] = session
        reply = await receive_reply(session, "register")
        while isinstance(reply, Queued):
            # The supervisor speaks at least every few seconds while we wait: silence for
            # REPLY_TIMEOUT_S means it is stuck, a deadline of its own ends the wait.
            if self.on_queued is not None:
                self.on_queued(reply.ahead, trio.current_time() - asked)
            reply = await receive_reply(session, "admission")
        if isinstance(reply, Refused):
            self._sessions.pop(lease, None)
            await session.aclose()
            raise refusal_error(reply, lease)
        if not isinstance(reply, Registered):
            raise SupervisorError(f"unexpected {type(reply).__name__} after register", lease=lease)
        self._queued[lease] = trio.current_time() - asked
        # From here the supervisor owns the container: cancelling us only closes the session.
        reply = await receive_reply(
            session, "create", timeout=self.startup_deadline_s + REPLY_TIMEOUT_S
        )
        if isinstance(reply, Created):
            return reply.container_id
        if isinstance(reply, Failed):
            raise SupervisorError(reply.reason, code="failed", lease=lease)
        raise SupervisorError(f"unexpected {type(reply).__name__} during create", lease=lease)

    async def started(self, lease: str) -> None:
        """Tell the supervisor the container started: its launch slot goes to the next lease.
        A lost connection shows up at removal, where it matters."""
        session = self._sessions.get(lease)
        if session is not None:
            with contextlib.suppress(SupervisorConnectionLost):
                await session.send(Started(lease=lease))

    def queued_s(self, lease: str) -> float:
        """How long the lease waited for admission (0 when it fitted at once)."""
        return self._queued.get(lease, 0.0)

    def claimed_fds(self, lease: str) -> list[int]:
        """The host ends a claimed kernel path container came with (``Claimed.fds``), now
        the caller's to close; [] on the daemon's path."""
        return self._claimed_fds.pop(lease, [])

    async def ended_by_owner(self, lease: str) -> str | None:
        """The supervisor's ``Expiring`` reason, if it ended the lease's container itself. It
        sends that before the removal's kill, so after the kill it is already here to read;
        any other message is left for ``remove``."""
        session = self._sessions.get(lease)
        await trio.lowlevel.checkpoint()
        if lease in self._expiring:  # read while a governed network's answer was awaited
            return self._expiring.pop(lease)
        if session is None or not session.has_input():
            return None
        with trio.move_on_after(REPLY_TIMEOUT_S):
            payload = await session.receive_payload()
            if payload is None:
                return None
            try:
                message = decode_server(payload)
            except SbxError:
                return None
            if isinstance(message, Expiring):
                return message.reason
            session.unread(payload)
        return None

    async def release(self, lease: str) -> None:
        """Hand the lease back without waiting for the verdict: the supervisor removes the
        container under its ownership (its record closes only when the daemon confirmed the
        removal; a failure keeps the record for its reaper). A pooled run's early return."""
        self._queued.pop(lease, None)
        session = self._sessions.pop(lease, None)
        if session is None:
            return
        try:
            with trio.CancelScope(shield=True), contextlib.suppress(SupervisorConnectionLost):
                await session.send(Close(lease=lease))
        finally:
            await session.aclose()

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        self._queued.pop(lease, None)
        session = self._sessions.pop(lease, None)
        if session is None:
            return  # never registered: nothing was created
        try:
            with trio.CancelScope(shield=True):
                await self._close(session, lease, container_id)
        finally:
            await session.aclose()

    async def _close(self, session: _Session, lease: str, container_id: str | None) -> None:
        """Ask for removal and wait for the verdict: only ``Closed`` means cleaned up."""
        lost = (
            "the connection to the supervisor was lost before cleanup was acknowledged; "
            "durable recovery is required (the supervisor's restart recovery removes it)"
        )
        ended = self._ended.pop(lease, None)
        if isinstance(ended, Closed):
            return
        if isinstance(ended, Orphaned):
            raise CleanupError(lease, container_id, ended.reason)
        # The send may fail if the supervisor already ended the lease; its verdict is buffered.
        with contextlib.suppress(SupervisorConnectionLost):
            await session.send(Close(lease=lease))
        with trio.move_on_after(self.close_timeout_s):
            while True:
                try:
                    message = await session.receive()
                except SbxError as exc:
                    raise CleanupError(lease, container_id, f"{lost} ({exc})") from exc
                if message is None:
                    raise CleanupError(lease, container_id, lost)
                if isinstance(message, Closed):
                    return
                if isinstance(message, Orphaned):
                    raise CleanupError(lease, container_id, message.reason)
                if isinstance(message, Refused):
                    return  # registration was refused: nothing was ever created
                # Created or Failed from a create that ended after we gave up: keep waiting.
        raise CleanupError(
            lease, container_id, f"no acknowledgement within {self.close_timeout_s:g} s"
        )
