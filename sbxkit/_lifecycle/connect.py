"""Reaching a state directory's supervisor: its connection and handshake, launching it when
absent (in its own session, so it survives its caller), and what its refusals mean.

``connect_supervisor`` is every caller's way in: ``SupervisedOwner`` (client.py) for each
lease, the operator's requests (admin.py), a hand-off's resumption (sbxkit/handoff).
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import trio

from sbxkit._lifecycle.launch import (
    launch_detached,
    launch_engine_sockets,
    launch_lock,
    supervisor_argv,
)
from sbxkit._model.bounds import LAUNCH_TIMEOUT_S, REPLY_TIMEOUT_S, SLOWNESS_ENV, scaled
from sbxkit._protocol.channel import FrameChannel
from sbxkit._protocol.fingerprint import implementation_fingerprint
from sbxkit._protocol.journal import check_state_dir
from sbxkit._protocol.statedir import (
    LOG_NAME,
    SOCKET_NAME,
    log_size,
    read_log_from,
    scan_entries,
    startup_refusal,
)
from sbxkit._protocol.wire import (
    PROTOCOL_VERSION,
    Hello,
    Message,
    Refused,
    ServerMessage,
    Welcome,
    decode_server,
    encode,
)
from sbxkit.errors import (
    AdmissionTimeout,
    CapacityExhausted,
    NeverFits,
    SbxError,
    SupervisorConnectionLost,
    SupervisorError,
    UidTaken,
)

RELAUNCH_AFTER_S = 2.0
HANDSHAKE_ATTEMPTS = 4


def launch_timeout_s() -> float:
    """``LAUNCH_TIMEOUT_S`` stretched by ``SBXKIT_HOST_SLOWNESS`` (a bad value: SpecError)."""
    return scaled(LAUNCH_TIMEOUT_S, os.environ.get(SLOWNESS_ENV))


def reply_timeout_s() -> float:
    """``REPLY_TIMEOUT_S`` stretched by ``SBXKIT_HOST_SLOWNESS`` (a bad value: SpecError)."""
    return scaled(REPLY_TIMEOUT_S, os.environ.get(SLOWNESS_ENV))


def check_before_launch(state_dir: Path) -> None:
    """The supervisor's own startup checks, run by the client before it launches one: the path
    and every entry (a state directory it would refuse is reported at once, not after
    ``launch_timeout_s()``)."""
    check_state_dir(state_dir, create=True)
    problems, _stale = scan_entries(state_dir)
    if problems:
        raise SupervisorError(
            "unsafe supervisor state blocks execution: " + "; ".join(map(str, problems)),
            code="storage",
        )


class SupervisorSession(FrameChannel):
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
) -> SupervisorSession:
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
) -> SupervisorSession:
    reply_timeout = reply_timeout_s()  # a bad SBXKIT_HOST_SLOWNESS: refused before anything
    stream = await _connect_once(state_dir / SOCKET_NAME)
    if stream is None:
        async with launch_lock(state_dir):
            sockets = launch_engine_sockets(first) if engine_sockets is None else engine_sockets
            stream = await _launched(state_dir, command, sockets)
    session = SupervisorSession(stream, accept_fds=True)  # a Claimed may bring a sandbox's ends
    try:
        try:
            hello = Hello(protocol=PROTOCOL_VERSION, fingerprint=implementation_fingerprint())
            # Shielded: once ``first`` (a Register) is on its way, the supervisor may create
            # for it. Cancelled here, the caller would leave without the session its removal
            # needs; the cancellation lands at the caller's next checkpoint instead.
            with trio.CancelScope(shield=True), trio.fail_after(reply_timeout):
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
                f"the supervisor did not answer the handshake within {reply_timeout:g} s"
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
    launch_timeout = launch_timeout_s()
    with trio.move_on_after(launch_timeout):
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
            f"within {launch_timeout:g} s (SBXKIT_HOST_SLOWNESS stretches it on a slow host); "
            f"see {log_path}"
        )
    return stream


def refusal_error(
    reply: Refused, lease: str | None = None
) -> SupervisorError | NeverFits | UidTaken:
    """The error a refusal stands for: its code decides the class."""
    if reply.code == "uid_taken":
        return UidTaken(lease or "?", reply.reason)
    if reply.code == "never_fits":
        return NeverFits(reply.field or "limits", reply.reason, lease=lease)
    if reply.code == "admission_timeout":
        return AdmissionTimeout(reply.reason, code=reply.code, lease=lease)
    if reply.code == "capacity":
        return CapacityExhausted(reply.reason, code=reply.code, lease=lease)
    return SupervisorError(reply.reason, code=reply.code, lease=lease)


async def receive_reply(
    session: SupervisorSession, what: str, timeout: float | None = None
) -> ServerMessage:
    """The next message; ``timeout`` defaults to ``reply_timeout_s()``."""
    if timeout is None:
        timeout = reply_timeout_s()
    with trio.move_on_after(timeout):
        try:
            message = await session.receive()
        except SbxError as exc:
            raise SupervisorError(f"{what}: {exc}") from exc
        if message is None:
            raise SupervisorError(f"{what}: the supervisor closed the connection")
        return message
    raise SupervisorError(f"{what}: no answer within {timeout:g} s")
