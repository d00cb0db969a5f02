"""The kernel path's shell (sbxkit/_kernel/scripts.py) under the host's dash and busybox ash —
the shells of the two test images — on real FIFOs made and opened as the host side makes and
opens them (sbxkit/_kernel/fifos.py): the shell says it runs before the payload can, the
payload starts only at the go line, its argv and environment are exactly the spec's (nothing
the shell added), and stdin, stdout and stderr pass byte-exact until EOF. No daemon: the
real-engine tier runs the same code in containers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbxkit._kernel.fifos import FIFO_NAMES, open_host_ends
from sbxkit._kernel.scripts import GO_LINE, SYNC_BYTE, cold_command

SHELLS = {"dash": "dash", "ash": "busybox"}
REPORT = (
    "import json, os, sys; data = sys.stdin.buffer.read(); sys.stderr.write('E'); "
    "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), 'stdin': data.hex()}))"
)
BASE_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def fifo_dir(tmp: Path) -> Path:
    for name in FIFO_NAMES:
        os.mkfifo(tmp / name, 0o600)
    return tmp


def read_all(fd: int, seconds: float = 10.0) -> bytes:
    data, deadline = bytearray(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        if not chunk:
            return bytes(data)
        data += chunk
    raise AssertionError("no EOF")


def run_wrapped(
    tmp: Path, shell: str, argv: list[str], env: dict[str, str], stdin: bytes
) -> tuple[dict[str, object], bytes]:
    """Start the wrapped command, check it waits for the go line, then let it run."""
    ends = open_host_ends(fifo_dir(tmp))
    command = cold_command(argv, {**BASE_ENV, **env}, io_target=str(tmp))
    sh = ["busybox", "sh"] if shell == "busybox" else [shell]
    child = subprocess.Popen([*sh, *command[1:]], env={**BASE_ENV, **env}, cwd="/")
    try:
        deadline = time.monotonic() + 10
        while (said := _read_some(ends.stderr)) == b"" and time.monotonic() < deadline:
            time.sleep(0.001)
        assert said == SYNC_BYTE
        time.sleep(0.05)
        assert child.poll() is None  # blocked at the go line: the payload has not started
        os.write(ends.stdin, GO_LINE + stdin)
        os.close(ends.stdin)
        out, err = read_all(ends.stdout), read_all(ends.stderr)
        assert child.wait(10) == 0
    finally:
        child.kill()
        for fd in (ends.stdout, ends.stderr):
            os.close(fd)
    report: dict[str, object] = json.loads(out)
    return report, err


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 1)
    except BlockingIOError:
        return b""


WORDS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=30)


@pytest.mark.parametrize("shell", SHELLS.values())
@settings(max_examples=25, deadline=None)
@given(args=st.lists(WORDS, max_size=4), rest=st.binary(max_size=2000))
def test_the_wrapped_payload_gets_exactly_its_argv_env_and_stdin(
    tmp_path_factory: pytest.TempPathFactory, shell: str, args: list[str], rest: bytes
) -> None:
    tmp = tmp_path_factory.mktemp("io")
    env = {"K": "v\nw", "SHLVL": "7"}  # the container's own SHLVL survives the shell's
    report, err = run_wrapped(tmp, shell, [sys.executable, "-E", "-c", REPORT, *args], env, rest)
    assert report["argv"] == args
    assert report["stdin"] == rest.hex()
    assert report["env"] == {**BASE_ENV, **env}  # no PWD, no SHLVL of the shell's own
    assert err == b"E"


@pytest.mark.parametrize("shell", SHELLS.values())
def test_a_leading_dash_or_quote_is_an_argument_not_shell_text(tmp_path: Path, shell: str) -> None:
    argv = [sys.executable, "-E", "-c", REPORT, "$(id)", "'", '"', "-n", ";exit 3"]
    report, _ = run_wrapped(tmp_path, shell, argv, {}, b"")
    assert report["argv"] == argv[4:]
