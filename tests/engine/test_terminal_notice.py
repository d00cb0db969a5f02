"""sbxkit's own lines stay visible on a terminal, whatever a payload printed before them.

A payload that ends its output inside an unterminated ``ESC ]`` (an operating system command)
made the terminal swallow everything after it until a terminator: sbxkit's ``timed out``
notice never showed. The run goes to a real terminal emulator here (tmux, its pane read back
with ``capture-pane``), so what is checked is what a person at the terminal sees.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.helpers import unique
from tests.witness import SOCKET, Witness

HIDERS = {
    "osc": r"\033]0;",  # an operating system command, never terminated
    "dcs": r"\033P",  # a device control string, never terminated
}


@pytest.fixture
def tmux() -> Iterator[list[str]]:
    """A private tmux server (its own socket name), killed afterwards with all it runs."""
    binary = shutil.which("tmux")
    if binary is None:
        pytest.fail("tmux is missing: scripts/engine-up installs it", pytrace=False)
    command = [binary, "-L", f"sbxkit-test-{secrets.token_hex(4)}"]
    yield command
    subprocess.run([*command, "kill-server"], capture_output=True, check=False, timeout=30)


def screen_after(tmux: list[str], shell: str, done: Path, seconds: float = 90.0) -> str:
    """Run ``shell`` in a fresh 160x24 pane; the pane's text once ``done`` exists."""
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "160", "-y", "24", "sh", "-c", f"{shell}; sleep 600"],
        check=True,
        timeout=30,
        env=os.environ,
    )
    deadline = time.monotonic() + seconds
    while not done.exists():
        assert time.monotonic() < deadline, "the run in the pane did not end"
        time.sleep(0.1)
    time.sleep(0.3)  # the pane has drawn what was written before the file appeared
    captured = subprocess.run(
        [*tmux, "capture-pane", "-p"], capture_output=True, check=True, timeout=30, text=True
    )
    return captured.stdout


@pytest.mark.parametrize("hider", sorted(HIDERS))
def test_a_payloads_unterminated_escape_does_not_hide_sbxkits_notice(
    hider: str, tmux: list[str], busybox: str, witness: Witness, tmp_path: Path
) -> None:
    marker = unique("shown")
    done = tmp_path / "done"
    payload = f"printf '{marker}{HIDERS[hider]}'; sleep 30"
    run = [sys.executable, "-m", "sbxkit", "run", "--socket", SOCKET, "--memory", "64m"]
    run += ["--timeout", "2s", busybox, "--", "sh", "-c", payload]
    screen = screen_after(tmux, f"{shlex.join(run)}; echo $? > {done}", done)
    assert done.read_text().strip() == "124", screen  # sbxkit run's status for a timeout
    assert marker in screen, screen  # the payload's own text, before its escape
    assert "sbxkit: timed out" in screen, screen
    assert witness.sbxkit_containers() == []
