"""Switching ``DOCKER_HOST`` as docker users do (issue 43, item 3): with no
``SBXKIT_STATE_DIR``, each daemon gets its own state directory and supervisor, so a run on a
second daemon never meets the first one's supervisor ("not a daemon socket this supervisor
was started for"), and runs on the first are handed off to its supervisor as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sbxkit._protocol.address import state_dir_text
from tests.engine.helpers import wait_until
from tests.supervision import supervisor_pids
from tests.witness import Witness

PYTHON = "sbxkit-test/python:latest"


def other_daemon() -> Witness:
    raw = os.environ.get("SBXKIT_TEST_CLUSTER_SOCKETS", "")
    sockets = [s.strip() for s in raw.split(",") if s.strip()]
    if not sockets:
        pytest.fail(
            "SBXKIT_TEST_CLUSTER_SOCKETS must name a second Docker daemon (./dev test passes "
            "scripts/cluster-engines-up's)",
            pytrace=False,
        )
    other = Witness(sockets[0])
    if not other.ping():
        pytest.fail(f"no Docker engine on {other.socket_path}", pytrace=False)
    return other


def test_each_daemon_named_gets_its_own_supervisor(witness: Witness) -> None:
    other = other_daemon()
    home = Path(tempfile.mkdtemp(prefix="sbxhome-", dir="/tmp"))
    home.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("SBXKIT_STATE_DIR", "DOCKER_HOST")}
    env["HOME"] = str(home)
    trace = home / "trace"
    env["SBXKIT_HANDOFF_TRACE"] = str(trace)
    hosts = [f"unix://{witness.socket_path}", f"unix://{other.socket_path}"]
    # Their names as state_dir_text gives them, under the runs' own home.
    dirs = [home / ".sbxkit" / Path(state_dir_text({"DOCKER_HOST": h})).name for h in hosts]
    try:
        for round_ in range(2):
            for host in hosts:
                done = subprocess.run(
                    [sys.executable, "-m", "sbxkit", "run", PYTHON, "--", "echo", host],
                    env={**env, "DOCKER_HOST": host},
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
                assert (done.returncode, done.stdout) == (0, f"{host}\n".encode()), (
                    round_,
                    done.stderr,
                )
        assert dirs[0] != dirs[1]
        assert [d.is_dir() for d in dirs] == [True, True]
        assert [len(supervisor_pids(d)) for d in dirs] == [1, 1]
        # The second round reached each daemon's running supervisor: handed off, or (where
        # the daemon's path decides, a remapping daemon) the full path on that supervisor.
        served = {"handed off", "full path: the run takes the daemon's path"}
        assert set(trace.read_text().splitlines()[-2:]) <= served, trace.read_text()
    finally:
        for state_dir in dirs:
            for pid in supervisor_pids(state_dir):
                os.kill(pid, signal.SIGTERM)
        assert wait_until(lambda: not any(supervisor_pids(d) for d in dirs), 30.0)
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    assert other.wait_until_no_sbxkit_containers(seconds=10.0) == []
