"""The ``sbxkit`` command: ``sbxkit run`` handed to the running supervisor, else the full CLI.

Standard library only (plus the few sbxkit modules that are: ``scan``, ``fifos``,
``notice``, ``capped``, ``supervisor.address``, ``supervisor.fingerprint``): no trio, no msgspec,
no ``sbxkit.cli``. ``main`` tries the hand-off and runs the full path (``sbxkit.cli.parser``) when
the hand-off declines — nothing of the payload has run then, and nothing of stdin was read.

The hand-off (sbxkit/_protocol/wire.py, ``Run``): connect to the state directory's supervisor
(its socket must be ours, and so must its peer), send ``Hello`` and ``Run`` in one write, print
the "waiting for capacity" notices a terminal gets, then take ``RunStarted`` and the sandbox's
ends, run it on them (``fifos.watch``), send ``RunEnded`` and print what ``RunReport`` says
exactly as ``sbxkit run`` prints a result. SIGINT and SIGTERM at any point: ``RunCancel``, wait
for the removal, then exit 130 or 143. Should the supervisor die once this process holds the
ends, the run is resumed in the next one (``rejoin.py``, loaded only then); before that,
nothing of the payload ran and the full path runs it.

``SBXKIT_HANDOFF=off`` forces the full path; ``SBXKIT_HANDOFF_TRACE=FILE`` appends, per
command, whether it was handed off or why not (docs/operations.md).
"""

from __future__ import annotations

import _socket  # socket.py would build its enums: a few ms per process, for nothing here
import binascii
import contextlib
import json
import os
import signal
import stat
import struct
import sys
import time

from sbxkit._protocol.address import SOCKET_NAME, state_dir_text
from sbxkit._protocol.fingerprint import PROTOCOL_VERSION, implementation_fingerprint
from sbxkit._util.notice import WaitingNotice, say
from sbxkit._util.readiness import readable
from sbxkit._util.slowness import MAX_SLOWNESS, SLOWNESS_ENV, slowness_factor
from sbxkit.handoff.fifos import Ends, Watched, watch
from sbxkit.handoff.scan import PLANNING_ENV, Scan, scan_run

TYPE_CHECKING = False  # typing is not loaded here: a process per job pays for every import
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

__all__ = [
    "cancel_message",
    "ended_message",
    "error_json",
    "handoff",
    "hello_message",
    "main",
    "run_message",
    "with_output",
]

_HEADER = struct.Struct(">I")
MAX_FRAME = 8 * 1024 * 1024  # wire.MAX_FRAME
RECEIVE_CHUNK = 64 * 1024
_FD = struct.Struct("i")
MAX_FDS = 4
HANDSHAKE_S = 10.0
"""How long the supervisor has to welcome a hand-off, stretched by ``SBXKIT_HOST_SLOWNESS``."""
OFF = ("0", "off", "no", "false")


class Declined(Exception):
    """The hand-off does not serve this command: the full path runs it (nothing ran yet)."""


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Lost(Exception):
    """The supervisor closed the connection."""


def main() -> NoReturn:
    """The ``sbxkit`` console script (and ``python -m sbxkit``)."""
    argv = sys.argv[1:]
    code: int | None = None
    if os.environ.get("SBXKIT_HANDOFF", "").strip().lower() in OFF:
        _trace("full path: SBXKIT_HANDOFF is off")
    else:
        code = handoff(argv)
    if code is None:
        from sbxkit.cli.parser import main as full_path  # the whole CLI, loaded only now

        full_path(argv)
    sys.stdout.flush()
    sys.exit(code)


def _trace(line: str) -> None:
    """One line for ``SBXKIT_HANDOFF_TRACE`` (how a command was run), if it names a file."""
    path = os.environ.get("SBXKIT_HANDOFF_TRACE", "")
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as trace:
            trace.write(line + "\n")  # a diagnostic: a trace that cannot be written is not


def handoff(argv: Sequence[str]) -> int | None:
    """Run ``argv`` through the supervisor: its exit status, or None when it declined (then
    nothing of the payload ran and nothing of stdin was read)."""
    with _Signals() as signals:
        try:
            code = _handoff(argv, signals)
        except Declined as exc:
            _trace(f"full path: {exc}")
            if signals.received:  # Ctrl-C before anything ran: as the full path says it
                say(f"sbxkit: interrupted by {signals.name()}", sys.stderr)
                return 128 + signals.received[0]
            return None
    _trace("handed off")
    return code


def _handoff(argv: Sequence[str], signals: _Signals) -> int:
    scan = scan_run(argv)
    if isinstance(scan, str):
        raise Declined(scan)
    if sys.stdout is None or sys.stderr is None:
        raise Declined("stdout or stderr is closed (the full path says so)")
    state_dir = state_dir_text(socket=scan.socket)
    if not os.path.isabs(state_dir):
        raise Declined(f"the state directory {state_dir!r} is not absolute")
    source, owned = _stdin_source(scan)
    try:
        channel = _connect(os.path.join(state_dir, SOCKET_NAME))
        try:
            return _converse(channel, argv, scan, state_dir, source, signals)
        finally:
            channel.close()
    finally:
        if owned and source is not None:
            os.close(source)


def _stdin_source(scan: Scan) -> tuple[int | None, bool]:
    """Where the payload's stdin comes from (a descriptor, and whether it is ours to close).
    What the hand-off does not serve the full path reports or streams: a piped stdin without
    ``--stdin`` (refused), a file that cannot be opened, a FIFO (whose open waits)."""
    if scan.stdin is None:
        if _carries_data(0):
            raise Declined("stdin is a pipe or a file and --stdin is not given")
        return None, False
    if scan.stdin == "none":
        return None, False
    if scan.stdin == "-":
        try:
            os.fstat(0)
        except OSError:
            raise Declined("--stdin - with no stdin") from None
        return 0, False
    try:  # never open a FIFO to look: that would let its writer go, and lose what it wrote
        if not _servable(os.stat(scan.stdin).st_mode):
            raise Declined(f"--stdin {scan.stdin} is neither a regular file nor a device")
        fd = os.open(scan.stdin, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise Declined(f"--stdin {scan.stdin}: cannot open it") from None
    if not _servable(os.fstat(fd).st_mode):  # replaced since: not ours to judge
        os.close(fd)
        raise Declined(f"--stdin {scan.stdin} is neither a regular file nor a device")
    return fd, True


def _servable(mode: int) -> bool:
    """A stdin source the hand-off streams: a regular file or a character device (a FIFO's
    open waits for its writer, inside the run's time limit: the full path does that)."""
    return stat.S_ISREG(mode) or stat.S_ISCHR(mode)


def _carries_data(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


# -- the connection ---------------------------------------------------------------------------


class _Channel:
    """Frames to and from the supervisor (a 4-byte length, then JSON); descriptors that ride
    with a frame (``SCM_RIGHTS``) are kept in ``fds``."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.fds: list[int] = []

    def send(self, *messages: dict[str, Any]) -> None:
        frames = []
        for message in messages:
            payload = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
            frames.append(_HEADER.pack(len(payload)) + payload)
        try:
            self.sock.sendall(b"".join(frames))
        except OSError as exc:
            raise Lost(str(exc)) from None

    def receive(self, signals: _Signals | None, timeout_s: float | None = None) -> dict[str, Any]:
        """The next message; ``Interrupted`` when a signal comes first (``signals`` given),
        ``Lost`` at EOF, ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            frame = self._frame()
            if frame is not None:
                message: dict[str, Any] = json.loads(frame)
                return message
            if signals is not None and signals.received:
                raise Interrupted(signals.received[0])
            watched = [self.sock.fileno()] + ([signals.read_fd] if signals is not None else [])
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = readable(watched, wait)
            if not ready:
                raise TimeoutError("no answer from the supervisor")
            if signals is not None and signals.read_fd in ready:
                signals.drain()
            if self.sock.fileno() in ready:
                self._read()

    def _frame(self) -> bytes | None:
        if len(self.buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self.buffer)
        if size > MAX_FRAME:
            raise Lost(f"a frame of {size} bytes")
        if len(self.buffer) < _HEADER.size + size:
            return None
        frame = bytes(self.buffer[_HEADER.size : _HEADER.size + size])
        del self.buffer[: _HEADER.size + size]
        return frame

    def _read(self) -> None:
        try:
            data, ancillary, _flags, _ = self.sock.recvmsg(
                RECEIVE_CHUNK, _socket.CMSG_SPACE(MAX_FDS * _FD.size)
            )
        except OSError as exc:
            raise Lost(str(exc)) from None
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % _FD.size
                self.fds.extend(fd for (fd,) in _FD.iter_unpack(payload[:usable]))
        if not data:
            raise Lost("the supervisor closed the connection")
        self.buffer += data

    def take_fds(self, count: int) -> list[int]:
        taken, self.fds = self.fds[:count], self.fds[count:]
        return taken

    def close(self) -> None:
        for fd in self.fds:
            _close(fd)
        self.fds.clear()
        self.sock.close()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _connect(path: str) -> _Channel:
    """The supervisor's socket, if it is ours and a process of ours listens on it."""
    try:
        info = os.lstat(path)
    except OSError:
        raise Declined("no supervisor runs for the state directory") from None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise Declined(f"{path} is not a socket of uid {os.geteuid()}")
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        sock.close()
        raise Declined("the supervisor's socket does not answer") from None
    if struct.unpack("3i", creds)[1] != os.geteuid():
        sock.close()
        raise Declined("the supervisor's socket is another account's")
    return _Channel(sock)


# -- the conversation -------------------------------------------------------------------------


def _converse(
    channel: _Channel,
    argv: Sequence[str],
    scan: Scan,
    state_dir: str,
    source: int | None,
    signals: _Signals,
) -> int:
    env = {key: os.environ[key] for key in (*PLANNING_ENV, *scan.env_names) if key in os.environ}
    if any("\udc80" <= char <= "\udcff" for value in env.values() for char in value):
        raise Declined("a variable the run reads is not UTF-8 (the full path names it)")
    factor = slowness_factor(os.environ.get(SLOWNESS_ENV))
    if factor is None:
        rule = f"is not a number from 1 to {MAX_SLOWNESS:g}"
        raise Declined(f"{SLOWNESS_ENV} {rule} (the full path names it)")
    try:
        channel.send(hello_message(), run_message(argv, state_dir, env, scan))
        welcome = channel.receive(None, HANDSHAKE_S * factor)
    except (Lost, TimeoutError) as exc:
        raise Declined(f"the supervisor did not take the hand-off ({exc})") from None
    if welcome.get("type") != "welcome":
        raise Declined(f"the supervisor answered {welcome.get('type')}")
    asked = time.monotonic()
    notice = WaitingNotice(sys.stderr) if sys.stderr.isatty() else None
    queued_lease: str | None = None
    while True:
        try:
            message = channel.receive(signals)
        except Interrupted as exc:
            return _cancel(channel, exc.signum, scan)
        except Lost:  # it died (a live one answers a queued run): no payload ran, no stdin read
            if queued_lease is not None:
                _forget_fifos(state_dir, queued_lease)
            why = "waited for capacity" if queued_lease is not None else "was planned"
            raise Declined(f"the supervisor closed the connection while the run {why}") from None
        kind = message["type"]
        if kind == "queued":
            queued_lease = message["lease"]
            if notice is not None:
                notice(message["ahead"], time.monotonic() - asked)
        elif kind == "run_declined":
            raise Declined(message["reason"])
        elif kind == "run_error":
            return _print_error(message, scan)
        elif kind == "run_started":
            return _run_started(channel, message, scan, state_dir, source, signals)
        else:
            raise Declined(f"unexpected {kind} from the supervisor")


def _forget_fifos(state_dir: str, lease: str) -> None:
    """The FIFO directory the dead supervisor made for a run still waiting for capacity: no
    record was journaled for it (nothing is before admission), so no recovery removes it."""
    from pathlib import Path  # a rare path: these load what the hand-off otherwise avoids

    from sbxkit._kernel.fifos import remove_io_dir
    from sbxkit._kernel.scripts import io_root
    from sbxkit._protocol.records import LEASE_ID

    if LEASE_ID.fullmatch(lease):
        with contextlib.suppress(OSError):
            remove_io_dir(io_root(Path(state_dir)), lease)


def _run_started(
    channel: _Channel,
    started: dict[str, Any],
    scan: Scan,
    state_dir: str,
    source: int | None,
    signals: _Signals,
) -> int:
    fds = channel.take_fds(started["fds"])
    lost = {"exit_status": started["lost_status"], "stderr": started["lost_stderr"]}
    lost["json"] = started.get("lost_json")
    if len(fds) != 4:  # the ends did not come: have the sandbox removed, say so
        for fd in fds:
            os.close(fd)
        reason = f"supervisor: claim: 4 file descriptors promised, {len(fds)} came"
        answer = _removed(channel, signal.SIGTERM, lost)
        return _print_error(answer or _error(reason, "SupervisorError", 70, scan), scan)
    ends = Ends(*fds)
    began = time.monotonic()
    try:  # the pidfd stays open until the verdict: a restarted supervisor may need its word
        watched = watch(
            ends,
            binascii.a2b_base64(started["line"]),
            source,
            started["output_bytes"],
            started["timeout_s"],
            started["drain_s"],
            signals.read_fd,
            lambda: bool(signals.received),
        )
        for fd in (ends.stdin, ends.stdout, ends.stderr):
            ends.close(fd)

        def resume(ended: dict[str, Any] | None, cancel: int | None) -> dict[str, Any] | None:
            """The supervisor died: carry the run on in the next one (rejoin.py)."""
            from sbxkit.handoff.rejoin import rejoin

            run_s = time.monotonic() - began
            answer, how = rejoin(started, ended, ends.pidfd, run_s, state_dir, scan.json, cancel)
            _trace(how)
            return answer

        if watched.status == "interrupted":
            return _cancel(channel, signals.received[0], scan, lost=lost, resume=resume)
        ended = ended_message(watched)
        try:
            channel.send(ended)
            report = channel.receive(signals)
        except Interrupted as exc:
            return _cancel(channel, exc.signum, scan, lost=lost, resume=resume)
        except Lost:
            resumed = resume(ended, None)
            if resumed is None:
                return _print_error(lost, scan)
            report = resumed
    finally:
        ends.close_all()
    if report["type"] == "run_error":
        return _print_error(report, scan)
    return _print_result(report, watched, scan)


def _cancel(
    channel: _Channel,
    signum: int,
    scan: Scan,
    *,
    lost: dict[str, Any] | None = None,
    resume: Callable[[None, int], dict[str, Any] | None] | None = None,
) -> int:
    """A signal came: have the supervisor remove the sandbox, wait for it (further signals
    wait too), then say so as the full path does. ``resume``: a handed run's removal asked
    of the next supervisor, should this one be dead."""
    failed = _removed(channel, signum, lost or _lost_before_start(scan))
    if failed is not None and failed is lost and resume is not None:
        answer = resume(None, signum)
        failed = None if answer is not None and answer["type"] == "run_interrupted" else lost
    if failed is not None:
        return _print_error(failed, scan)
    code = 128 + int(signum)
    name = signal.Signals(signum).name
    say(f"sbxkit: interrupted by {name}; sandbox removed", sys.stderr)
    if scan.json:
        sys.stdout.write(error_json("Interrupted", f"interrupted by {name}", code) + "\n")
        sys.stdout.flush()
    return code


def _removed(channel: _Channel, signum: int, lost: dict[str, Any]) -> dict[str, Any] | None:
    """``RunCancel`` and its answer: None once the sandbox is removed, else the error to print
    (the supervisor's, or ``lost`` when it is gone)."""
    try:
        channel.send(cancel_message(signum))
        answer = channel.receive(None)
    except Lost:
        return lost
    return answer if answer["type"] == "run_error" else None


def _lost_before_start(scan: Scan) -> dict[str, Any]:
    """The supervisor went away before it started the sandbox: as the full path says it
    (``SupervisedOwner.create``: the connection closed during admission)."""
    reason = "supervisor: admission: the supervisor closed the connection"
    return _error(reason, "SupervisorError", 70, scan)


def _error(message: str, kind: str, code: int, scan: Scan) -> dict[str, Any]:
    document = error_json(kind, message, code) if scan.json else None
    return {"exit_status": code, "stderr": f"sbxkit: error: {message}\n", "json": document}


# -- what is printed --------------------------------------------------------------------------


def _print_result(report: dict[str, Any], watched: Watched, scan: Scan) -> int:
    """As ``sbxkit run`` prints a result: ``--json``'s one object (the supervisor's document,
    this process's output in it), else the output, then the notice."""
    stdout, stderr = watched.stdout.value(), watched.stderr.value()
    if scan.json:
        sys.stdout.buffer.write(with_output(report["json"], stdout, stderr) + b"\n")
    else:
        sys.stdout.buffer.write(stdout)
        sys.stderr.buffer.write(stderr)
        if report.get("notice"):
            say(report["notice"], sys.stderr)
    sys.stdout.flush()
    return int(report["exit_status"])


def _print_error(error: dict[str, Any], scan: Scan) -> int:
    """As ``sbxkit run`` reports an error: the line on stderr, ``--json``'s error object."""
    sys.stderr.write(error["stderr"])
    sys.stderr.flush()
    if scan.json and error.get("json"):
        sys.stdout.write(error["json"] + "\n")
        sys.stdout.flush()
    return int(error["exit_status"])


# -- the messages (sbxkit/_protocol/wire.py: Hello, Run, RunEnded, RunCancel) ----------------


def hello_message() -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "fingerprint": implementation_fingerprint(),
    }


def run_message(
    argv: Sequence[str], state_dir: str, env: dict[str, str], scan: Scan
) -> dict[str, Any]:
    return {
        "type": "run",
        "argv": list(argv),
        "state_dir": state_dir,
        "env": env,
        "json": scan.json,
        "stdin": scan.stdin,
    }


def ended_message(watched: Watched) -> dict[str, Any]:
    return {
        "type": "run_ended",
        "status": watched.status,
        "stdout_bytes": watched.stdout.kept_bytes,
        "stderr_bytes": watched.stderr.kept_bytes,
        "overflowed": watched.overflowed,
    }


def cancel_message(signum: int) -> dict[str, Any]:
    return {"type": "run_cancel", "signal": int(signum)}


def with_output(document: str, stdout: bytes, stderr: bytes) -> bytes:
    """``--json``'s document as the supervisor rendered it (``stdout`` and ``stderr`` empty,
    the byte counts this process reported), with this process's output in it: text decoded as
    UTF-8 with replacement, as ``sbxkit run --json`` prints it."""
    output = (
        '"stdout":'
        + json.dumps(stdout.decode("utf-8", "replace"), ensure_ascii=False)
        + ',"stderr":'
        + json.dumps(stderr.decode("utf-8", "replace"), ensure_ascii=False)
    )
    return document.replace('"stdout":"","stderr":""', output, 1).encode()


def error_json(kind: str, message: str, code: int) -> str:
    """``--json``'s error document, as ``_grammar.common.json_error`` renders one (no field)."""
    error = {"type": kind, "message": message, "field": None}
    doc: dict[str, object] = {"status": "error", "container_id": None, "lease": None}
    doc |= {"timings": {}, "error": error, "exit_status": code}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


# -- signals ----------------------------------------------------------------------------------


class _Signals:
    """SIGINT and SIGTERM recorded (not raised) while the hand-off runs, each waking a pipe the
    waits watch; the previous handlers are back afterwards (the full path installs its own)."""

    WATCHED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: list[int] = []
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous: dict[int, Any] = {}
        self._previous_wakeup = -1

    def __enter__(self) -> _Signals:
        self._previous_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in self.WATCHED:
            self._previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def name(self) -> str:
        return signal.Signals(self.received[0]).name

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self.read_fd, 64)

    def __exit__(self, *_: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self.read_fd)
        os.close(self._write_fd)
