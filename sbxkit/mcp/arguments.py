"""Tool arguments: decoded into structs and checked before anything is created (pure).

A model's arguments are untrusted input like a jobs file's lines: unknown keys are refused by
name, every type is checked by msgspec, and the rules a spec obeys apply with the argument's
own path in the error (``limits.memory``, ``files['../x']``, ``env['A B']``). What the
operator's profile caps (images, limits, sizes) is ``sbxkit.mcp.policy``'s.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from sbxkit._consumers.archive import confine, relative_name
from sbxkit._grammar.profile import ProfileLimits
from sbxkit._model.rules import check_env
from sbxkit._model.spec import spec_error_from, validate_command, validate_workdir
from sbxkit._model.textcheck import check_utf8
from sbxkit.errors import ArchiveError, SpecError

FILES_ROOT = "/tmp"
"""Where files go and are read from: the sandbox's scratch tmpfs, its one writable place
besides ``/dev/shm`` (the root filesystem is read-only)."""
MAX_RUN_FILES = 100
SANDBOX_ID_RE = re.compile(r"sbx-[0-9a-f]{24}")
PROCESS_ID_RE = re.compile(r"p[0-9a-f]{16}")

Encoding = Literal["utf-8", "base64"]


class Args(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every tool's arguments: unknown keys are refused, naming them."""


class RunArgs(Args):
    command: list[str]
    stdin: str | None = None
    files: dict[str, str] | None = None
    image: str | None = None
    limits: ProfileLimits | None = None
    env: dict[str, str] | None = None


class OpenArgs(Args):
    image: str | None = None
    limits: ProfileLimits | None = None
    lifetime: float | None = None
    env: dict[str, str] | None = None


class SandboxArgs(Args):
    sandbox_id: str


class ExecArgs(SandboxArgs):
    command: list[str]
    stdin: str | None = None
    timeout: float | None = None
    max_output: int | str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None


class WriteFileArgs(SandboxArgs):
    path: str
    content: str
    encoding: Encoding = "utf-8"


class ReadFileArgs(SandboxArgs):
    path: str
    encoding: Encoding = "utf-8"


class CloseArgs(SandboxArgs):
    pass


class ListArgs(Args):
    pass


class ProcessStartArgs(SandboxArgs):
    command: list[str] | None = None
    shell: str | None = None
    pty: bool = False
    timeout: float | None = None
    max_output: int | str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None


class ProcessArgs(SandboxArgs):
    process_id: str


class ProcessWriteArgs(ProcessArgs):
    data: str = ""
    encoding: Encoding = "utf-8"
    close_stdin: bool = False


class ProcessReadArgs(ProcessArgs):
    cursor: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_bytes: int | str | None = None
    wait: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    encoding: Encoding = "utf-8"


class ProcessSignalArgs(ProcessArgs):
    signal: int | str


class ProcessKillArgs(ProcessArgs):
    pass


class ProcessListArgs(SandboxArgs):
    pass


class PythonArgs(Args):
    code: str
    timeout: float | None = None
    restart: bool = False


ARGS: dict[str, type[Args]] = {
    "run": RunArgs,
    "sandbox_open": OpenArgs,
    "sandbox_exec": ExecArgs,
    "sandbox_write_file": WriteFileArgs,
    "sandbox_read_file": ReadFileArgs,
    "sandbox_close": CloseArgs,
    "sandbox_list": ListArgs,
    "process_start": ProcessStartArgs,
    "process_write": ProcessWriteArgs,
    "process_read": ProcessReadArgs,
    "process_signal": ProcessSignalArgs,
    "process_kill": ProcessKillArgs,
    "process_list": ProcessListArgs,
    "python": PythonArgs,
}
"""Tool name → its arguments (``sbxkit.mcp.schemas`` describes the same fields)."""

A = TypeVar("A", bound=Args)


def decode_args(arguments: dict[str, Any] | None, kind: type[A]) -> A:
    """``arguments`` as ``kind``, checked: every refusal is a ``SpecError`` naming the
    argument (``limits.cpus``) and the rule."""
    try:
        args = msgspec.convert(arguments or {}, kind)
    except msgspec.ValidationError as error:
        raise _named(spec_error_from(error)) from None
    check_utf8(args)  # a JSON string can carry a lone surrogate (\ud800)
    if isinstance(args, RunArgs | ExecArgs):
        check_command(args.command)
    if isinstance(args, SandboxArgs):
        check_sandbox_id(args.sandbox_id)
    if isinstance(args, ProcessArgs):
        check_process_id(args.process_id)
    if isinstance(args, ProcessStartArgs):
        process_command(args)
    if isinstance(args, ExecArgs | ProcessStartArgs):
        validate_workdir(args.cwd, "cwd")
    if isinstance(args, RunArgs | OpenArgs | ExecArgs | ProcessStartArgs) and args.env is not None:
        check_env(args.env, "env")
    return args


def _named(error: SpecError) -> SpecError:
    """msgspec names the whole arguments object ``spec`` when no field is at fault."""
    return SpecError("arguments", error.rule) if error.field == "spec" else error


def check_command(command: list[str]) -> None:
    """The argv rules of a spec's ``command`` (non-empty, no NUL, a program name)."""
    validate_command(command)


def check_sandbox_id(sandbox_id: str) -> None:
    if SANDBOX_ID_RE.fullmatch(sandbox_id) is None:
        raise SpecError(
            "sandbox_id", "is not a sandbox id (sandbox_open returns one, e.g. sbx-0123…)"
        )


def check_process_id(process_id: str) -> None:
    if PROCESS_ID_RE.fullmatch(process_id) is None:
        raise SpecError(
            "process_id", "is not a process id (process_start returns one, e.g. p0123…)"
        )


def process_command(args: ProcessStartArgs) -> list[str]:
    """A process's argv: ``command`` as given, or ``shell`` run by ``sh -c``; exactly one."""
    if (args.command is None) == (args.shell is None):
        both = "not both" if args.command is not None else "one is required"
        raise SpecError(
            "command",
            f"give command (an argv list) or shell (a command line for sh -c), {both}",
        )
    if args.shell is not None:
        if not args.shell.strip():
            raise SpecError("shell", "is empty; give a command line, e.g. 'make test'")
        argv = ["sh", "-c", args.shell]
        try:
            check_command(argv)
        except SpecError as error:  # it names command[2]: the model typed shell
            raise SpecError("shell", error.rule) from None
        return argv
    assert args.command is not None
    check_command(args.command)
    return list(args.command)


def text_bytes(text: str, field: str, limit: int) -> bytes:
    """UTF-8 text as bytes, at most ``limit`` of them."""
    data = text.encode("utf-8")
    if len(data) > limit:
        raise SpecError(field, f"is {len(data)} bytes; at most {limit} (mcp.max_file_bytes)")
    return data


def content_bytes(content: str, encoding: Encoding, limit: int, field: str = "content") -> bytes:
    """A file's content (or a process's input) as sent: UTF-8 text, or base64 for bytes that
    are not text."""
    if encoding == "utf-8":
        return text_bytes(content, field, limit)
    try:
        data = base64.b64decode(content.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error):
        raise SpecError(field, "is not valid base64 (encoding is 'base64')") from None
    if len(data) > limit:
        raise SpecError(field, f"is {len(data)} bytes; at most {limit} (mcp.max_file_bytes)")
    return data


def base64_text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def file_path(path: str, field: str = "path") -> str:
    """A path under ``/tmp`` (relative to it, or absolute inside it), as a relative name."""
    try:
        return confine(path, FILES_ROOT)
    except ArchiveError as error:
        raise SpecError(field, f"{error.reason} (files live under {FILES_ROOT})") from None


def run_files(files: dict[str, str], limit: int) -> dict[str, bytes]:
    """A run's files: relative names under ``/tmp``, UTF-8 text, ``limit`` bytes together."""
    if len(files) > MAX_RUN_FILES:
        raise SpecError("files", f"{len(files)} files; at most {MAX_RUN_FILES}")
    encoded: dict[str, bytes] = {}
    total = 0
    for name, text in files.items():
        where = f"files[{name!r}]"
        try:
            relative_name(name)
        except ArchiveError as error:
            raise SpecError(where, f"{error.reason} (names are relative to {FILES_ROOT})") from None
        encoded[name] = data = text.encode("utf-8")
        total += len(data)
        if total > limit:
            raise SpecError("files", f"more than {limit} bytes together (mcp.max_file_bytes)")
    return encoded
