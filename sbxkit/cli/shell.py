"""``sbxkit shell [options] IMAGE [-- CMD...]``: an interactive shell in a fresh sandbox.

The local terminal is put in raw mode (``tty.setraw``) so every key reaches the sandbox's
terminal, and it is restored (``termios.tcsetattr(TCSAFLUSH)``) in a ``finally`` on every way
out: the shell exiting, an error, ``SIGINT``, ``SIGTERM``, ``SIGHUP``. ``SIGWINCH`` resizes the
remote terminal. The container is removed before the command returns (through the supervisor,
which also removes it if this process is killed). The exit status is the shell's own; 124 timed
out, 123 output exceeded, 137 OOM-killed, 128+N after signal N, and the ``sbxkit run`` codes
for errors (2 refused input, 69 engine unavailable, 74 cleanup failed, 70 other).

Wiring: ``add_shell_parser(subparsers)`` adds the subcommand to ``sbxkit``'s parser; its
handler returns the exit status and raises ``SbxError`` for the caller to map. ``main(argv)``
runs it standalone (``python -m sbxkit.cli.shell IMAGE``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import termios
import tty
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from sbxkit._grammar.backend_choice import cli_backend
from sbxkit._grammar.common import EXIT_INTERNAL, STATUS_EXIT, exit_with
from sbxkit._grammar.flags import (
    ImageAndCommand,
    add_sandbox_flags,
    image_usage,
    parse_with_flags_after_image,
    spec_from_args,
)
from sbxkit._grammar.profile import Profile, load_profile, profile_settings
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.notice import say
from sbxkit.backends.base import Backend, open_backend
from sbxkit.errors import SbxError

if TYPE_CHECKING:  # the PTY layer loads only when a shell runs, not for every subcommand
    from sbxkit._consumers.pty import PtySession
    from sbxkit._consumers.session import SandboxExit

DEFAULT_COMMAND = ["/bin/sh"]
SHELL_DEFAULTS = {
    "cpus": "1",
    "memory": "256m",
    "pids": "128",
    "max_output": "64m",
    "timeout": "3600",
}
"""An interactive session lives longer and prints more than a one-shot command."""

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
READ_CHUNK = 64 * 1024


# --- arguments ---------------------------------------------------------------------------------


def add_shell_arguments(parser: argparse.ArgumentParser) -> None:
    add_sandbox_flags(
        parser,
        SHELL_DEFAULTS,
        profile_help="TOML profile ([sandbox.docker]); flags override it",
        output_help="terminal output bytes for the whole session; one more ends it",
        timeout_help="the session's time limit",
        network_help="none (default) or bridge",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        action=ImageAndCommand,
        metavar="IMAGE [-- CMD]",
        help="image, then the command (default: /bin/sh)",
    )


def add_shell_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``shell`` to a parser's subcommands (``parser.add_subparsers()``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "shell",
        help="an interactive shell in a fresh sandbox, removed when it exits",
        usage=image_usage("shell", " [-- CMD...]"),
        description="Run CMD (default /bin/sh) on a terminal in a fresh hardened sandbox.",
        epilog="exit status: the shell's own; 124 timed out; 123 output exceeded; "
        "137 OOM-killed; 128+N after signal N; 2 refused input; 69 engine unavailable; "
        "74 cleanup failed; 70 other error",
    )
    add_shell_arguments(parser)
    parser.set_defaults(handler=cmd_shell)
    return parser


def shell_spec(
    args: argparse.Namespace, profile: Profile | None = None
) -> tuple[SandboxSpec, Settings | None]:
    """The spec and settings the flags describe, built exactly as ``sbxkit run`` builds them;
    ``SHELL_DEFAULTS`` fill the mandatory limits neither the flags nor the profile set."""
    spec = spec_from_args(args, profile, defaults=SHELL_DEFAULTS, default_command=DEFAULT_COMMAND)
    settings = profile_settings(profile)[0] if profile is not None else None
    return spec, settings


# --- the terminal ------------------------------------------------------------------------------


def _terminal_size(fd: int) -> tuple[int, int] | None:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    if size.lines <= 0 or size.columns <= 0:
        return None
    return size.lines, size.columns


def _pollable(fd: int) -> bool:
    """epoll refuses regular files and directories; those are read in a thread instead."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


async def _read_local(fd: int, pollable: bool) -> bytes:
    if not pollable:
        return await trio.to_thread.run_sync(os.read, fd, READ_CHUNK, abandon_on_cancel=True)
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            return os.read(fd, READ_CHUNK)
        except BlockingIOError:
            continue


EOF_REPEAT_S = 0.5
"""After local EOF, ^D again this often until the session ends: a program that flushes its
terminal's input (a shell turning its line editing on, ``tcflush``) drops a ^D sent before."""


async def _copy_in(fd: int, pty: PtySession) -> None:
    """Local keystrokes → the sandbox's terminal. Local EOF sends ^D (the terminal's EOF), and
    again every ``EOF_REPEAT_S`` until the session ends (the caller cancels this then): every
    read of the terminal after local EOF sees EOF, as a local terminal's would."""
    pollable = _pollable(fd)
    try:
        while True:
            try:
                data = await _read_local(fd, pollable)
            except OSError:  # EIO: the local terminal hung up
                data = b""
            if not data:
                while True:
                    await pty.send_all(b"\x04")
                    await trio.sleep(EOF_REPEAT_S)
            await pty.send_all(data)
    except (SbxError, trio.ClosedResourceError):
        return  # the session ended; the output side reports how


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(fd)
            continue
        view = view[written:]


class _Outcome:
    def __init__(self) -> None:
        self.exit: SandboxExit | None = None
        self.error: SbxError | None = None
        self.signal: int | None = None


async def _session(
    backend: Backend,
    spec: SandboxSpec | CheckedSpec,
    fd_in: int,
    fd_out: int,
    pending: list[int],
) -> _Outcome:
    outcome = _Outcome()
    live: list[PtySession] = []
    with trio.open_signal_receiver(signal.SIGWINCH, *_STOP_SIGNALS) as signals:
        if pending:  # a stop signal arrived before trio was listening
            outcome.signal = pending[0]
            return outcome
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    if signum == signal.SIGWINCH:
                        size = _terminal_size(fd_in)
                        if live and size is not None:
                            with contextlib.suppress(SbxError):
                                await live[0].resize(*size)
                    else:
                        outcome.signal = signum
                        nursery.cancel_scope.cancel()
                        return

            async def work() -> None:
                try:
                    from sbxkit._consumers.pty import open_pty

                    async with (
                        open_backend(backend),
                        open_pty(spec, size=_terminal_size(fd_in), backend=backend) as pty,
                    ):
                        live.append(pty)
                        async with trio.open_nursery() as inner:
                            inner.start_soon(_copy_in, fd_in, pty)
                            try:
                                while data := await pty.receive_some():
                                    await _write_all(fd_out, data)
                            except SbxError as exc:
                                outcome.error = exc
                            inner.cancel_scope.cancel()
                        if outcome.error is None:
                            outcome.exit = await pty.wait()
                except SbxError as exc:
                    outcome.error = exc
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(work)
    return outcome


def run_shell(
    spec: SandboxSpec,
    settings: Settings | None = None,
    socket_path: str | None = None,
    *,
    backend: Backend | None = None,
    fd_in: int = 0,
    fd_out: int = 1,
) -> int:
    """Run the session on the local terminal; return the exit status, raise ``SbxError``.

    Stop signals are recorded from before the terminal goes raw until it is restored, so
    none can end the process with the terminal left raw.
    """
    backend = backend or cli_backend(None, socket_path=socket_path, settings=settings)
    checked = backend.check(spec, "pty")  # a runtime without PTYs refuses before any terminal work
    pending: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, _frame: pending.append(signum))
        for signum in _STOP_SIGNALS
    }
    saved: list[Any] | None = None
    try:
        if os.isatty(fd_in):
            saved = termios.tcgetattr(fd_in)
            tty.setraw(fd_in, termios.TCSAFLUSH)
        outcome = trio.run(_session, backend, checked, fd_in, fd_out, pending)
    finally:
        if saved is not None:
            termios.tcsetattr(fd_in, termios.TCSAFLUSH, saved)
        for stop, handler in previous.items():
            signal.signal(stop, handler)
    if outcome.error is not None:
        raise outcome.error
    stopped = outcome.signal or (pending[0] if pending else None)
    if stopped is not None:
        name = signal.Signals(stopped).name
        say(f"sbxkit: interrupted by {name}; sandbox removed", sys.stderr)
        return 128 + stopped
    assert outcome.exit is not None
    result = outcome.exit
    if result.status == "exited":
        return result.exit_code if result.exit_code is not None else EXIT_INTERNAL
    say(f"sbxkit: {result.status.replace('_', ' ')}", sys.stderr)
    return STATUS_EXIT[result.status]


def cmd_shell(args: argparse.Namespace) -> int:
    """The ``sbxkit shell`` handler: returns the exit status, raises ``SbxError``."""
    profile = load_profile(args.profile) if args.profile is not None else None
    spec, settings = shell_spec(args, profile)  # supervisor.binary rides in the settings
    backend = cli_backend(profile, socket_path=args.socket, settings=settings)
    return run_shell(spec, backend=backend)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """``python -m sbxkit.shell [options] IMAGE [-- CMD]``: the subcommand, standalone."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="sbxkit shell",
        description="An interactive shell in a fresh hardened sandbox.",
    )
    add_shell_arguments(parser)
    args, unknown = parse_with_flags_after_image(parser, sys.argv[1:] if argv is None else argv)
    if unknown:
        parser.error("unrecognized arguments: " + " ".join(unknown))
    exit_with(cmd_shell, args)


if __name__ == "__main__":
    main()
