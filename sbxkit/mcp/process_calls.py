"""The process tools' requests and answers (pure): what a ``process_*`` call may ask for within
the operator's policy, and how a process and its output become JSON.

Bounds. A process runs at most until its sandbox's lifetime ends (``timeout`` may shorten
that): it is the long-lived shell an agent keeps between calls, so the per-command
``limits.timeout`` does not apply, but the sandbox's removal ends it. Its merged output is
kept up to the sandbox's ``limits.max_output`` (a call may lower it; one byte more kills it,
``output_exceeded``). One read returns at most ``mcp.max_file_bytes`` and waits at most
``mcp.max_read_wait`` seconds; one write carries at most ``mcp.max_file_bytes``; at most
``mcp.max_processes`` run at once in one sandbox (the hub refuses the next).

Output as text. A read's bytes may end inside a UTF-8 character (a cursor counts bytes); as
``utf-8`` the read stops before such a tail, which the next read returns whole, so no
character is ever split into two replacement characters. Bytes that are not UTF-8 at all
become U+FFFD; ``base64`` returns them exactly.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import msgspec

from sbxkit._consumers.process_log import DEFAULT_READ_BYTES, ProcessExit, check_signal
from sbxkit._consumers.processes import Process
from sbxkit._model.spec import Limits, check_limit, parse_size
from sbxkit.errors import SpecError
from sbxkit.mcp.arguments import (
    Encoding,
    ProcessReadArgs,
    ProcessSignalArgs,
    ProcessStartArgs,
    process_command,
)
from sbxkit.mcp.policy import McpPolicy, at_most, lower_output, merged_env

ENDED_PROCESSES_KEPT = 16
"""How many ended processes of a sandbox stay readable (their output and exit), newest kept:
their output is held in memory, bounded by ``limits.max_output`` each."""
MIN_READ_BYTES = 4
"""The longest UTF-8 character: a read of at least this many bytes always makes progress."""


class StartRequest(msgspec.Struct, frozen=True, kw_only=True):
    command: list[str]
    pty: bool
    timeout_s: float
    max_output: int
    cwd: str | None
    env: dict[str, str] | None


class ReadRequest(msgspec.Struct, frozen=True, kw_only=True):
    cursor: int
    max_bytes: int
    wait_s: float


def start_request(
    policy: McpPolicy, command_limits: Limits, lifetime_s: float, args: ProcessStartArgs
) -> StartRequest:
    """A background process in an open sandbox: its timeout lowers the sandbox's lifetime,
    its output cap the sandbox's ``limits.max_output``."""
    timeout = lifetime_s
    if args.timeout is not None:
        check_limit("timeout_s", args.timeout, "timeout")
        at_most("timeout", "timeout_s", args.timeout, lifetime_s, "this sandbox's lifetime")
        timeout = args.timeout
    assert command_limits.output_bytes is not None  # mandatory in an MCP policy
    return StartRequest(
        command=process_command(args),
        pty=args.pty,
        timeout_s=float(timeout),
        max_output=lower_output(args.max_output, command_limits.output_bytes),
        cwd=args.cwd,
        env=None if args.env is None else merged_env(policy.base.env, args.env),
    )


def read_request(policy: McpPolicy, args: ProcessReadArgs) -> ReadRequest:
    """A read's size (``MIN_READ_BYTES`` to ``mcp.max_file_bytes``, default 64 KiB or less)
    and wait (up to ``mcp.max_read_wait``)."""
    limit = policy.file_bytes
    raw = args.max_bytes
    if raw is None:
        size = min(DEFAULT_READ_BYTES, limit)
    else:
        size = parse_size(raw, "max_bytes") if isinstance(raw, str) else raw
        if not MIN_READ_BYTES <= size <= limit:
            raise SpecError(
                "max_bytes",
                f"must be {MIN_READ_BYTES} to {limit} bytes (mcp.max_file_bytes); asked for {size}",
            )
    longest = policy.options.max_read_wait
    if args.wait > longest:
        raise SpecError(
            "wait",
            f"at most {longest:g} s (mcp.max_read_wait); asked for {args.wait:g} s — read "
            "again with the next cursor to wait longer",
        )
    return ReadRequest(cursor=args.cursor, max_bytes=size, wait_s=float(args.wait))


def signal_number(args: ProcessSignalArgs) -> int:
    """``15``, ``"TERM"`` or ``"SIGTERM"`` → 15, refused naming the argument ``signal``."""
    try:
        return check_signal(args.signal)
    except SpecError as error:
        raise SpecError("signal", error.rule) from None


def text_end(chunk: bytes) -> int:
    """How much of ``chunk`` holds whole UTF-8 characters: an incomplete sequence at its end
    (at most 3 bytes) is left out. Invalid bytes count as whole (they decode as U+FFFD)."""
    for back in range(1, min(4, len(chunk)) + 1):
        byte = chunk[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
            continue
        if 0xF0 <= byte <= 0xF4:
            need = 4
        elif 0xE0 <= byte <= 0xEF:
            need = 3
        elif 0xC2 <= byte <= 0xDF:
            need = 2
        else:  # ASCII, or a byte no UTF-8 character starts with
            need = 1
        return len(chunk) - back if need > back else len(chunk)
    return len(chunk)


def output_piece(data: bytes, encoding: Encoding, *, final: bool) -> tuple[str, int]:
    """``(content, bytes it covers)`` of a read's ``data``; ``final``: nothing follows it
    (the process ended and this reaches its last byte), so a split tail is decoded as is."""
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii"), len(data)
    used = len(data) if final else text_end(data)
    return data[:used].decode("utf-8", "replace"), used


def exit_fields(exit_: ProcessExit | None) -> dict[str, Any] | None:
    """How a process ended, as ``sandbox_exec`` reports a command (``None``: it runs)."""
    if exit_ is None:
        return None
    return {
        "status": exit_.status,
        "exit_code": exit_.exit_code,
        "output_bytes": exit_.output_bytes,
        "duration_s": round(exit_.run_s, 3),
        "evidence": {"oom": exit_.oom_evidence, "kill": exit_.kill_evidence},
    }


def process_fields(
    sandbox_id: str,
    process_id: str,
    command: list[str],
    *,
    pty: bool,
    output_bytes: int,
    exit_: ProcessExit | None,
) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox_id,
        "process_id": process_id,
        "command": command,
        "pty": pty,
        "running": exit_ is None,
        "output_bytes": output_bytes,
        "exit": exit_fields(exit_),
    }


def read_fields(
    sandbox_id: str,
    process_id: str,
    request: ReadRequest,
    data: bytes,
    encoding: Encoding,
    *,
    done: bool,
    exit_: ProcessExit | None,
) -> dict[str, Any]:
    """One read: the output from ``cursor``, the cursor to read from next, and whether that
    is all there will ever be (``done``, with how it ended)."""
    content, used = output_piece(data, encoding, final=done)
    return {
        "sandbox_id": sandbox_id,
        "process_id": process_id,
        "output": content,
        "encoding": encoding,
        "cursor": request.cursor,
        "next_cursor": request.cursor + used,
        "bytes": used,
        "done": done,
        "running": exit_ is None,
        "exit": exit_fields(exit_),
    }


@dataclass
class HeldProcess:
    """A background process of an open sandbox, kept after it ends so its output stays
    readable (the session's table forgets ended ones)."""

    process: Process
    command: list[str]
    stdin_closed: bool = False

    def fields(self, sandbox_id: str) -> dict[str, Any]:
        process = self.process
        return process_fields(
            sandbox_id,
            process.id,
            self.command,
            pty=process.pty,
            output_bytes=process.output_bytes,
            exit_=process.exit,
        )


def forget_ended(processes: dict[str, HeldProcess]) -> None:
    """Keep every running process and the ``ENDED_PROCESSES_KEPT`` newest ended ones."""
    ended = [key for key, held in processes.items() if held.process.exit is not None]
    for key in ended[: max(0, len(ended) - ENDED_PROCESSES_KEPT)]:
        del processes[key]
