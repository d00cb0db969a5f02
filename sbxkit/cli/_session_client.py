"""The client side of the command line's open sandboxes: the sessions directory, a session's
record, and one request to its holder (standard library and msgspec; no trio)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from typing import Any

import msgspec

import sbxkit.cli._session_wire as wire
from sbxkit._grammar.common import EXIT_INTERNAL, EXIT_REFUSED
from sbxkit._protocol.framing import FrameReader
from sbxkit._protocol.statedir import directory_problem
from sbxkit.errors import SessionError, StorageError


def sessions_directory(create: bool) -> str:
    directory = wire.sessions_dir()
    if create:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return directory
    problem = directory_problem(info, os.geteuid())
    if problem is not None:
        raise StorageError(directory, f"{problem} (the sessions directory, {wire.SESSIONS_ENV})")
    return directory


def read_record(directory: str, name: str) -> wire.SessionRecord | None:
    path = wire.record_path(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(path, f"cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.geteuid() or info.st_mode & 0o077 or not stat.S_ISREG(info.st_mode):
            raise StorageError(path, "is not a 0600 regular file of this account's")
        data = handle.read(64 * 1024)
    try:
        return msgspec.json.decode(data, type=wire.SessionRecord)
    except msgspec.DecodeError:
        return None  # a holder mid-write or a broken file: treated as no session


def clear(directory: str, name: str) -> None:
    for path in (wire.record_path(directory, name), wire.socket_path(directory, name)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def connect(record: wire.SessionRecord) -> socket.socket | None:
    """A connection to the record's holder, or None when nobody answers there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(record.socket)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    if struct.unpack("3i", creds)[1] != os.geteuid():
        sock.close()
        raise SessionError(record.name, "its socket is served by another uid", code=EXIT_INTERNAL)
    return sock


def exchange(sock: socket.socket, request: wire.Request) -> wire.AnyAnswer | None:
    with sock:
        sock.sendall(wire.frame(request))
        reader = FrameReader(wire.MAX_FRAME)
        while True:
            chunk = sock.recv(256 * 1024)
            if not chunk:
                return None
            frames = reader.feed(chunk)
            if frames:
                return wire.decode_answer(frames[0])


def ask(name: str, request: wire.Request) -> wire.AnyAnswer:
    """Send ``request`` (its secret filled in here) to the holder of session ``name``."""
    wire.check_name(name)
    directory = sessions_directory(create=False)
    record = read_record(directory, name)
    if record is None:
        raise SessionError(
            name, "no open session by that name (sbxkit sessions lists them)", code=EXIT_REFUSED
        )
    sock = connect(record)
    if sock is None:
        clear(directory, name)
        raise SessionError(
            name,
            "its holder is gone (killed, or the host restarted); the supervisor removed its "
            f"sandbox (see {wire.log_path(directory, name)})",
            code=EXIT_INTERNAL,
        )
    answer = exchange(sock, msgspec.structs.replace(request, secret=record.secret))
    if answer is None:
        raise SessionError(name, "its holder closed the connection unanswered", code=EXIT_INTERNAL)
    if isinstance(answer, wire.Failed):
        raise SessionError(name, answer.message, code=answer.code, field=answer.field)
    return answer


def expect(answer: wire.AnyAnswer, kind: type[Any]) -> Any:
    if not isinstance(answer, kind):  # a holder of another version
        raise SessionError("?", f"unexpected answer {type(answer).__name__}", code=EXIT_INTERNAL)
    return answer
