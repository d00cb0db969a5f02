"""``SBXKIT_HOST_SLOWNESS`` stretches sbxkit's own bounds on a slow host, and a bad value is
refused before anything is launched or created (docs/operations.md, "A slow host").

The cgroup v2 cell's VM (TCG, 20 to 65 times slower than the CI machine) is such a host: its
first supervisor did not open its socket within the fixed 15 s launch bound. Here a supervisor
command that takes 18 s to start stands for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sbxkit._consumers.runner import run
from sbxkit._model.bounds import LAUNCH_TIMEOUT_S, SLOWNESS_ENV
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from tests.engine.helpers import spec, unique, wait_until
from tests.engine.test_supervisor import AUTO_CALLER, host_pids_with, supervisor_pids
from tests.witness import RUN_LABEL, THIS_RUN, Witness

SLOW_START_S = 18.0
"""Past the launch bound as written (15 s), within it stretched twice (30 s)."""


def slow_supervisor(tmp_path: Path) -> Path:
    """A supervisor command that sleeps ``SLOW_START_S`` before it starts the real one."""
    script = tmp_path / "slow-supervisor"
    script.write_text(
        "#!/bin/sh\n"
        f"sleep {SLOW_START_S:g}\n"
        f'exec {sys.executable} -m sbxkit.supervisor --idle-exit 2 "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_a_supervisor_slower_than_the_launch_bound_is_waited_for_on_a_slow_host(
    busybox: str, witness: Witness, state_dir: Path, tmp_path: Path
) -> None:
    assert SLOW_START_S > LAUNCH_TIMEOUT_S
    command = slow_supervisor(tmp_path)
    marker = unique("slowness")
    script = tmp_path / "caller.py"
    script.write_text(AUTO_CALLER.format(image=busybox, marker=marker, socket=witness.socket_path))
    env = {
        **subprocess_env(),
        "SBXKIT_STATE_DIR": str(state_dir),
        "SBXKIT_SUPERVISOR": str(command),
        SLOWNESS_ENV: "2",
    }
    started = time.monotonic()
    try:
        caller = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            timeout=90,
            stdin=subprocess.DEVNULL,
        )
        took = time.monotonic() - started
        assert caller.returncode == 0, caller
        assert caller.stdout.decode().split() == ["exited", "0", marker], caller
        assert took >= SLOW_START_S, took  # the launch really was slower than 15 s
    finally:
        # The relaunches' wrappers start a supervisor each that exits at once on the lock;
        # the served one exits 2 s after it is idle.
        gone = wait_until(
            lambda: not host_pids_with(str(command).encode()) and not supervisor_pids(state_dir),
            SLOW_START_S * 3,
        )
    assert gone, (host_pids_with(str(command).encode()), supervisor_pids(state_dir))


def subprocess_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != SLOWNESS_ENV}


@pytest.mark.parametrize("typed", ["fast", "0.5", "0", "-3", "inf", "nan", "101"])
async def test_a_bad_host_slowness_is_refused_before_anything_is_launched_or_created(
    typed: str,
    busybox: str,
    engine: Engine,
    witness: Witness,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SBXKIT_STATE_DIR", str(state_dir))
    monkeypatch.setenv(SLOWNESS_ENV, typed)
    marker = unique("bad-slowness")
    since = time.time()
    with pytest.raises(SpecError) as refused:
        await run(spec(busybox, f"echo {marker}"), engine=engine)
    until = time.time() + 0.5

    assert refused.value.field == SLOWNESS_ENV
    assert f"got {typed!r}" in refused.value.rule
    assert "a number from 1 to 100" in refused.value.rule
    assert supervisor_pids(state_dir) == []  # nothing launched ...
    assert not (state_dir / "supervisor.log").exists()
    ours = witness.events(since, until, type=["container"], label=[f"{RUN_LABEL}={THIS_RUN}"])
    assert ours == []  # ... nor created (this test session's label: the daemon is shared)
