"""A user outside the daemon's group (issue 43, item 9) is told what to do, not only
"Permission denied": the command fails as an unavailable engine (69) before anything exists."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.accounts import local_account
from tests.witness import Witness

ROOT = Path(__file__).resolve().parents[2]


def test_a_user_outside_the_daemons_group_is_told_how_to_join(
    witness: Witness, busybox: str
) -> None:
    with local_account() as outsider:
        done = outsider.run(
            [
                sys.executable,
                "-m",
                "sbxkit",
                "run",
                "--socket",
                witness.socket_path,
                busybox,
                "--",
                "true",
            ],
            env={"PYTHONPATH": str(ROOT), "SBXKIT_HANDOFF": "off"},
            capture_output=True,
        )
    assert done.returncode == 69, done.stderr
    assert b"Permission denied: this user may not open the daemon's socket" in done.stderr
    assert b"usermod -aG docker" in done.stderr
    assert b"Traceback" not in done.stderr
