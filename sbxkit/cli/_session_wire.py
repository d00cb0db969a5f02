"""The command line's open sandboxes (``sbxkit open``): where they are found and what their
holders are asked (pure: names, paths, messages; no I/O beyond ``os.path``).

An open sandbox is held by a holder process (``_session_holder``) that ``sbxkit open`` starts
and leaves running; ``sbxkit exec``, ``logs``, ``write``, ``wait``, ``kill``, ``ps``, ``cp``
and ``close`` are its clients. The holder listens on ``NAME.sock`` in the sessions directory
(0700) and writes ``NAME.json`` (0600): the socket's path and a secret every request carries.
A request is one frame, its answer one frame: a 4-byte big-endian length, then msgpack.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping

import msgspec

from sbxkit._consumers.process_log import ProcessExit
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit.errors import SpecError

SESSIONS_ENV = "SBXKIT_SESSIONS_DIR"
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")
NAME_RULE = "1 to 40 of a-z 0-9 _ . -, starting with a letter or digit"
MAX_FRAME = 64 * 1024 * 1024
"""One request or answer: room for ``MAX_INPUT_BYTES`` of stdin and a result's two streams."""
MAX_INPUT_BYTES = 16 * 1024 * 1024
"""Bytes ``sbxkit exec --stdin`` and ``sbxkit write`` carry in one call (held in memory)."""
MAX_SOCKET_PATH = 107
HEADER = struct.Struct(">I")


def sessions_dir(environ: Mapping[str, str] = os.environ) -> str:
    """``SBXKIT_SESSIONS_DIR``, else ``~/.sbxkit/sessions`` (beside the supervisor's state
    directory, which holds only the supervisor's own files)."""
    configured = environ.get(SESSIONS_ENV, "").strip()
    if configured:
        return configured
    return os.path.join(os.path.expanduser("~"), ".sbxkit", "sessions")


def check_name(name: str, field: str = "NAME") -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise SpecError(field, f"{name!r} is not a session name: {NAME_RULE}")
    return name


def socket_path(directory: str, name: str) -> str:
    path = os.path.join(directory, name + ".sock")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SpecError(
            SESSIONS_ENV,
            f"{path} is too long for a Unix socket ({MAX_SOCKET_PATH} bytes at most): "
            f"choose a shorter sessions directory",
        )
    return path


def record_path(directory: str, name: str) -> str:
    return os.path.join(directory, name + ".json")


def log_path(directory: str, name: str) -> str:
    return os.path.join(directory, name + ".log")


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``NAME.json``: what a client needs to reach the holder, and what ``sbxkit sessions``
    shows without asking it."""

    name: str
    socket: str
    secret: str
    pid: int
    container_id: str
    image: str
    started: float  # unix seconds
    expires: float  # unix seconds: the session's time limit
    ports: list[str] = msgspec.field(default_factory=list)
    """Its inbound ports as ``ADDRESS:HOST_PORT->PORT`` (docs/network.md, "Inbound ports")."""


class OpenPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What ``sbxkit open`` hands its holder on stdin: the spec its flags made (checked), and
    what chooses the backend."""

    name: str
    spec: SandboxSpec
    socket: str | None
    profile: str | None  # absolute
    files_root: str


# --- requests ----------------------------------------------------------------------------------


class Request(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    secret: str


class Exec(Request, tag="exec"):
    argv: list[str]
    stdin: bytes | None = None
    timeout_s: float | None = None
    workdir: str | None = None
    env: dict[str, str] | None = None


class Start(Request, tag="start"):
    argv: list[str]
    pty: bool = False
    timeout_s: float | None = None
    workdir: str | None = None
    env: dict[str, str] | None = None


class Read(Request, tag="read"):
    process: str
    cursor: int
    max_bytes: int
    wait_s: float


class Write(Request, tag="write"):
    process: str
    data: bytes
    eof: bool = False


class Wait(Request, tag="wait"):
    process: str
    timeout_s: float | None = None


class Signal(Request, tag="signal"):
    process: str
    signal: str  # a number or a name, as Process.signal takes it


class Kill(Request, tag="kill"):
    process: str


class List(Request, tag="list"):
    pass


class PutDir(Request, tag="put_dir"):
    local: str  # absolute, on the host: the holder runs as the caller, on the same host
    dest: str


class PutFile(Request, tag="put_file"):
    dest: str
    data: bytes


class GetPath(Request, tag="get_path"):
    """A file's content comes back in the answer; a directory is written to ``local`` (which
    must not exist, or be empty) by the holder."""

    src: str
    local: str


class Close(Request, tag="close"):
    pass


AnyRequest = (
    Exec | Start | Read | Write | Wait | Signal | Kill | List | PutDir | PutFile | GetPath | Close
)


# --- answers -----------------------------------------------------------------------------------


class Answer(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, kw_only=True):
    pass


class Ran(Answer, tag="ran"):
    result: RunResult


class Started(Answer, tag="started"):
    process: str


class Output(Answer, tag="output"):
    data: bytes
    cursor: int
    done: bool
    exit: ProcessExit | None


class Ended(Answer, tag="ended"):
    exit: ProcessExit | None  # None: still running (Wait's timeout passed)


class ProcessRow(msgspec.Struct, frozen=True, kw_only=True):
    process: str
    command: list[str]
    pty: bool
    output_bytes: int
    exit: ProcessExit | None


class Processes(Answer, tag="processes"):
    rows: list[ProcessRow]


class Done(Answer, tag="done"):
    pass


class FileData(Answer, tag="file"):
    data: bytes


class Failed(Answer, tag="failed"):
    """An ``SbxError`` the holder met: the client says it and exits as ``sbxkit run`` would."""

    error: str  # the class name in sbxkit.errors
    message: str
    field: str | None
    code: int  # the exit status the command line gives it (exit_code_for_error)


AnyAnswer = Ran | Started | Output | Ended | Processes | Done | FileData | Failed

_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(AnyRequest)
_answers = msgspec.msgpack.Decoder(AnyAnswer)


def frame(message: Request | Answer) -> bytes:
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME:
        raise SpecError("input", f"{len(payload)} bytes in one call; at most {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


def decode_request(payload: bytes) -> AnyRequest:
    return _requests.decode(payload)


def decode_answer(payload: bytes) -> AnyAnswer:
    return _answers.decode(payload)
