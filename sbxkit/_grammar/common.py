"""What every ``sbxkit`` subcommand shares: exit statuses, errors at the boundary, signals.

Exit statuses (README's table): the payload's own code when it exited normally (0–255); 124
timed out; 123 output exceeded; 137 OOM-killed or killed by someone else; 2 refused input (a
bad flag or spec, an image missing or refused, a request larger than the host's budget, a
container create the daemon answered with a 4xx other than 409); 69
engine unavailable; 74 cleanup failed (the lease is kept); 75 capacity (a hard bound of the
supervisor, or its admission deadline); 70 any other sbxkit error; 128 + N after signal N.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import msgspec
import trio

from sbxkit._consumers.process_log import ProcessExit
from sbxkit._grammar.daemon_refusal import is_daemon_refusal
from sbxkit._grammar.result_doc import ErrorDoc, ErrorResultDoc, OutputEncoding, result_doc
from sbxkit._model.result import RunResult, Status
from sbxkit._util.notice import say
from sbxkit.errors import (
    CapacityExhausted,
    CleanupError,
    EngineUnavailable,
    ImageError,
    SbxError,
    SessionError,
    SpecError,
)

T = TypeVar("T")

EXIT_REFUSED = 2
EXIT_DISK_EXCEEDED = 122
EXIT_OUTPUT_EXCEEDED = 123
EXIT_TIMED_OUT = 124
EXIT_OOM_KILLED = 137
EXIT_ENGINE_UNAVAILABLE = 69
EXIT_INTERNAL = 70
EXIT_CLEANUP_FAILED = 74
EXIT_CAPACITY = 75  # EX_TEMPFAIL: a hard bound of the supervisor, or the admission deadline
EXIT_SIGINT = 128 + signal.SIGINT

STATUS_EXIT: dict[Status, int] = {
    "timed_out": EXIT_TIMED_OUT,
    "output_exceeded": EXIT_OUTPUT_EXCEEDED,
    "oom_killed": EXIT_OOM_KILLED,
    "killed": EXIT_OOM_KILLED,
    "disk_exceeded": EXIT_DISK_EXCEEDED,  # 128 + SIGKILL as well: --json's status says which
}


def to_json(result: RunResult, encoding: OutputEncoding = "utf-8") -> bytes:
    """``sbxkit run --json``'s document (sbxkit/_grammar/result_doc.py)."""
    return msgspec.json.encode(result_doc(result, encoding))


def exit_code_for(result: RunResult | ProcessExit) -> int:
    """The exit status the command line gives a run, or a background process's end."""
    if result.status == "exited":
        return result.exit_code if result.exit_code is not None else EXIT_INTERNAL
    return STATUS_EXIT[result.status]


def exit_code_for_error(error: SbxError) -> int:
    if isinstance(error, SessionError):
        return error.code
    if isinstance(error, SpecError | ImageError) or is_daemon_refusal(error):
        return EXIT_REFUSED
    if isinstance(error, EngineUnavailable):
        return EXIT_ENGINE_UNAVAILABLE
    if isinstance(error, CleanupError):
        return EXIT_CLEANUP_FAILED
    if isinstance(error, CapacityExhausted):
        return EXIT_CAPACITY
    return EXIT_INTERNAL


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; the sandbox was removed before this was raised."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


async def cancel_on_signals(
    work: Callable[[], Awaitable[T]], *alongside: Callable[[], Awaitable[None]]
) -> T:
    """Run ``work`` with SIGINT/SIGTERM turned into trio cancellation, so every removal runs
    shielded to completion (a KeyboardInterrupt raised mid-cleanup could cut it short).

    Returns what ``work`` returned; raises its ``SbxError`` plainly (trio would wrap it in an
    exception group), or ``Interrupted`` after cleanup when a signal cut it short. The
    ``alongside`` tasks (a progress ticker) are cancelled when ``work`` ends. The one bridge
    of ``run`` and ``batch``; ``shell`` has its own, since it also forwards SIGWINCH.
    """
    received: list[int] = []
    outcome: list[T] = []
    error: list[SbxError] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    received.append(signum)
                    nursery.cancel_scope.cancel()
                    return

            async def main() -> None:
                try:
                    outcome.append(await work())
                except SbxError as exc:
                    error.append(exc)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            for task in alongside:
                nursery.start_soon(task)
            nursery.start_soon(main)
    if error:
        raise error[0]
    if not outcome:
        assert received, "work ended with no result, no error and no signal"
        raise Interrupted(received[0])
    return outcome[0]


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error under ``--json`` is also one JSON object on stdout, and no
    flag may be abbreviated (``--mem 64m`` is an unknown flag, not ``--memory``): a prefix
    that works today would change meaning when a flag is added. Subcommands are Parsers too.
    """

    json_errors = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            print_json_error("UsageError", message, None, EXIT_REFUSED)
        super().error(message)


def print_json_error(kind: str, message: str, field: str | None, code: int) -> None:
    """``--json``'s answer on an error: one object, ``error`` set, on stdout."""
    sys.stdout.write(json_error(kind, message, field, code) + "\n")
    sys.stdout.flush()


def json_error(kind: str, message: str, field: str | None, code: int) -> str:
    """``--json``'s error object (``print_json_error``; a handed-off run's ``RunError``)."""
    message, field = _printable(message), None if field is None else _printable(field)
    doc = ErrorResultDoc(error=ErrorDoc(type=kind, message=message, field=field), exit_status=code)
    return msgspec.json.encode(doc).decode()


def _printable(text: str) -> str:
    """``text`` with what is not UTF-8 (a byte from the command line) escaped, as stderr
    shows it: JSON cannot carry a lone surrogate."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def exit_with(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> NoReturn:
    """Run a subcommand's handler and exit with its status; errors become documented codes."""
    json_errors = bool(getattr(args, "json", False))
    try:
        code = handler(args)
    except SbxError as exc:
        print(f"sbxkit: error: {exc}", file=sys.stderr)
        code = exit_code_for_error(exc)
        if json_errors:
            print_json_error(type(exc).__name__, str(exc), getattr(exc, "field", None), code)
    except Interrupted as exc:
        say(f"sbxkit: interrupted by {exc}; sandbox removed", sys.stderr)
        code = exc.exit_code
        if json_errors:
            print_json_error("Interrupted", f"interrupted by {exc}", None, code)
    except KeyboardInterrupt:
        # A Ctrl-C outside trio's signal receiver: before the run began, or a repeated one
        # that trio redelivers once the receiver closes (after cleanup). No traceback.
        say("sbxkit: interrupted by SIGINT", sys.stderr)
        code = EXIT_SIGINT
    sys.exit(code)


def subcommand_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            chosen: argparse.ArgumentParser = action.choices[name]
            return chosen
    return parser
