"""The auto-launched supervisor starts with a minimal, documented environment.

A caller with a secret in its environment launches the supervisor through a real run; the
supervisor's ``/proc/<pid>/environ`` (read from the host while it idles) holds only the names
``sbxkit._lifecycle.launch_environment`` documents, and its command line names the caller's daemon
socket explicitly (``--engine-socket``) instead of inheriting ``DOCKER_HOST``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sbxkit._lifecycle.launch_environment import SUPERVISOR_ENVIRONMENT
from tests.engine.helpers import unique, wait_until
from tests.engine.test_supervisor import auto_caller, cmdline, supervisor_pids
from tests.witness import Witness

SECRET = "sk-test-" + "5" * 24


def test_the_auto_launched_supervisor_never_sees_its_callers_secrets(
    busybox: str, witness: Witness, state_dir: Path, tmp_path: Path
) -> None:
    marker = unique("environ")
    script, env = auto_caller(tmp_path, busybox, marker, witness.socket_path, state_dir, 5)
    env |= {
        "OPENAI_API_KEY": SECRET,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "SBXKIT_ENV": "ci",
        "LC_ALL": "C.UTF-8",
    }
    caller = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert caller.returncode == 0, caller
    (helper,) = supervisor_pids(state_dir)
    environ = Path(f"/proc/{helper}/environ").read_bytes()

    assert SECRET.encode() not in environ
    names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
    assert names <= set(SUPERVISOR_ENVIRONMENT), names
    assert {"PATH", "SBXKIT_ENV", "LC_ALL"} <= names  # what it does get, it gets
    assert "HOME" not in names
    assert "DOCKER_HOST" not in names
    argv = cmdline(str(helper)).split(b"\0")
    assert argv[argv.index(b"--engine-socket") + 1] == witness.socket_path.encode()
    assert wait_until(lambda: not supervisor_pids(state_dir), 15.0)
