"""``sbxkit shell`` driven through a real pseudo-terminal (ptyprocess).

A tiny wrapper shell runs in the same terminal: it prints ``stty -g`` before and after sbxkit,
so the test can prove the local terminal was restored (and compares ``tcgetattr`` of the
terminal, which on Linux the master side reports for the slave).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import ptyprocess

from tests.witness import LEASE_LABEL, Witness

WRAPPER = 'stty -g; echo READY; read go; "$@"; echo "sbxkit-rc=$?"; stty -g; echo DONE; read x'


@functools.cache
def cli_has_shell() -> bool:
    from sbxkit.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return "shell" in action.choices
    return False


def shell_argv(*args: str) -> list[str]:
    """``python -m sbxkit shell ...`` once the CLI has the subcommand, else the module."""
    if cli_has_shell():
        return [sys.executable, "-m", "sbxkit", "shell", *args]
    return [sys.executable, "-m", "sbxkit.cli.shell", *args]


class Terminal:
    def __init__(self, argv: list[str]) -> None:
        self.proc = ptyprocess.PtyProcess.spawn(
            ["/bin/sh", "-c", WRAPPER, "wrapper", *argv],
            dimensions=(24, 80),
            env={**os.environ, "TERM": "xterm"},
        )
        self.seen = b""
        self.stty_before = b""  # set by start
        self.attrs_before: list[Any] = []

    def expect(self, pattern: bytes, seconds: float = 20.0) -> re.Match[bytes]:
        deadline = time.monotonic() + seconds
        start = len(self.seen) - 200 if len(self.seen) > 200 else 0
        while True:
            match = re.compile(pattern).search(self.seen, start)
            if match:
                self.seen = self.seen[match.end() :]
                return match
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} within {seconds} s; saw {self.seen[-500:]!r}"
            ready, _, _ = select.select([self.proc.fd], [], [], min(left, 0.2))
            if ready:
                with contextlib.suppress(EOFError):
                    self.seen += self.proc.read(65536)

    def send(self, data: bytes) -> None:
        self.proc.write(data)

    def attrs(self) -> list[Any]:
        return termios.tcgetattr(self.proc.fd)

    def close(self) -> None:
        if self.proc.isalive():
            self.proc.terminate(force=True)

    def start(self) -> None:
        """Keep the terminal's settings before sbxkit (``stty -g`` and termios), then let the
        wrapper start it, until the sandbox's shell prompts."""
        self.stty_before = self.expect(rb"([^\r\n]+)\r\nREADY").group(1)
        self.attrs_before = self.attrs()
        self.send(b"go\n")
        self.expect(rb"\$ ")

    def lease(self) -> str:
        """The sandbox's lease, as the shell inside it says."""
        self.send(b'echo "lease=$SBXKIT_LEASE"\r')
        return self.expect(rb"lease=([0-9a-f]{32})").group(1).decode()

    def restored_after(self, exit_status: int) -> None:
        """sbxkit exited with ``exit_status`` and left the terminal's settings as ``start``
        found them."""
        self.expect(b"sbxkit-rc=%d\r\n" % exit_status)
        assert self.expect(rb"([^\r\n]+)\r\nDONE").group(1) == self.stty_before
        assert self.attrs() == self.attrs_before


def sbxkit_pid(wrapper_pid: int) -> int:
    children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_shell_round_trip_resize_exit_status_and_terminal_restored(
    busybox: str, witness: Witness
) -> None:
    term = Terminal(shell_argv("--socket", witness.socket_path, busybox))
    try:
        term.start()
        assert not term.attrs()[3] & termios.ICANON  # the local terminal is raw meanwhile
        lease = term.lease()
        assert witness.containers(label=f"{LEASE_LABEL}={lease}")
        term.send(b"echo hel''lo\r")
        term.expect(rb"hello")
        term.send(b"sleep 100\r")
        time.sleep(0.3)
        term.send(b"\x03")  # Ctrl-C reaches the sandbox's terminal, not sbxkit
        term.expect(rb"\$ ")
        term.proc.setwinsize(40, 100)
        time.sleep(0.3)
        term.send(b"stty size\r")
        term.expect(rb"40 100")
        term.send(b"exit 7\r")
        term.restored_after(7)
        assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []
    finally:
        term.close()


def test_sigterm_restores_the_terminal_and_removes_the_sandbox(
    busybox: str, witness: Witness
) -> None:
    term = Terminal(shell_argv("--socket", witness.socket_path, busybox))
    try:
        term.start()
        lease = term.lease()
        os.kill(sbxkit_pid(term.proc.pid), signal.SIGTERM)
        term.restored_after(143)
        assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []
    finally:
        term.close()


def test_a_profile_supplies_image_environment_and_limits(
    busybox: str, witness: Witness, tmp_path: Path
) -> None:
    """Without a terminal (stdin not a TTY) the command still runs on the sandbox's PTY."""
    profile = tmp_path / "shell.toml"
    profile.write_text(
        f'[sandbox.docker]\nimage = "{busybox}"\n'
        '[sandbox.docker.env]\nMODE = "from-profile"\n'
        '[sandbox.docker.limits]\ncpus = 0.5\nmemory = "64m"\npids = 64\ntimeout = 20\n'
    )
    done = subprocess.run(
        shell_argv(
            "--profile",
            str(profile),
            "--socket",
            witness.socket_path,
            "--",
            "sh",
            "-c",
            'echo "mode=$MODE"; tty; exit 5',
        ),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 5, done.stderr
    assert b"mode=from-profile\r\n/dev/pts/" in done.stdout


def test_local_eof_stays_eof_after_the_sandbox_flushes_its_terminal_input(
    python_image: str, witness: Witness
) -> None:
    """stdin at EOF (a pipe, /dev/null): a program that flushes its terminal's pending input
    before reading (a shell turning on its line editing does) still reads EOF, not a hang.
    A single ^D sent at local EOF was flushed with the rest (CI hung 300 s on `sbxkit shell`
    with busybox's ash)."""
    script = (
        "import sys, termios, time; time.sleep(1.5); termios.tcflush(0, termios.TCIFLUSH); "
        "print('read', repr(sys.stdin.read()))"
    )
    argv = ["--socket", witness.socket_path, "--timeout", "60", python_image]
    done = subprocess.run(
        shell_argv(*argv, "--", "python3", "-c", script),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=45,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"read ''" in done.stdout, done.stdout
