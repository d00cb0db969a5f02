"""``sbxkit run`` handed to the running supervisor, against the real engine (issue 21, item 5).

The command line loads neither trio nor the CLI and really used the supervisor; the sandbox's
output passes through the command line only, never through the supervisor (the supervisor's
own read count, from ``/proc``, is the witness); each fall-back to the full path is named; a
command line killed mid-run leaves no container, no lease record and no FIFO directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sbxkit.kernel.scripts import io_root
from tests.engine.helpers import unique, wait_until
from tests.supervision import SupervisorProcess, private_state_dir, running_supervisor
from tests.witness import Witness

SMALL = ["--cpus", "0.5", "--memory", "64m", "--pids", "64", "--timeout", "30"]
LABEL = "sbxkit.test.handoff"


class Handed:
    """A persistent supervisor on a private state directory, and ``sbxkit`` commands pointed
    at it with their path traced."""

    def __init__(self, supervisor: SupervisorProcess, witness: Witness) -> None:
        self.supervisor = supervisor
        self.witness = witness
        self.trace = supervisor.state_dir.parent / "handoff.trace"

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "SBXKIT_STATE_DIR": str(self.supervisor.state_dir)}
        env.pop("SBXKIT_HANDOFF", None)
        return {**env, "SBXKIT_HANDOFF_TRACE": str(self.trace), **extra}

    def argv(self, *flags: str, python: tuple[str, ...] = ()) -> list[str]:
        return [sys.executable, *python, "-m", "sbxkit", "run", *SMALL, *flags]

    def run(
        self, *flags: str, python: tuple[str, ...] = (), stdin: int | None = None, **extra: str
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*self.argv(*flags, python=python)],
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            capture_output=True,
            env=self.env(**extra),
            timeout=90,
            check=False,
        )

    def start(self, *flags: str) -> subprocess.Popen[bytes]:
        """``sbxkit run SMALL flags`` in the background, its output discarded."""
        return subprocess.Popen(
            self.argv(*flags),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env(),
        )

    def last_path(self) -> str:
        return self.trace.read_text().splitlines()[-1]

    def leftovers(self) -> list[str]:
        """Lease records in the state directory and FIFO directories beside it."""
        state_dir = self.supervisor.state_dir
        records = [p.name for p in state_dir.glob("*.lease")]
        fifos = io_root(state_dir)
        return records + ([p.name for p in fifos.iterdir()] if fifos.exists() else [])


@pytest.fixture
def handed(witness: Witness) -> Iterator[Handed]:
    state_dir = private_state_dir()
    try:
        with running_supervisor(state_dir, "--persistent") as supervisor:
            yield Handed(supervisor, witness)
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)


def imported(importtime: bytes) -> set[str]:
    """The modules ``python -X importtime`` reported loading."""
    names = set()
    for line in importtime.decode(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_a_handed_off_run_loads_neither_trio_nor_the_cli_and_uses_the_supervisor(
    handed: Handed, busybox: str
) -> None:
    marker = unique("handed")
    done = handed.run(
        "--socket",
        handed.witness.socket_path,
        busybox,
        "--",
        "echo",
        marker,
        python=("-X", "importtime"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{marker}\n".encode()
    assert handed.last_path() == "handed off"
    loaded = imported(done.stderr)
    assert "sbxkit.handoff.client" in loaded
    heavy = {n for n in loaded if n.split(".")[0] in ("trio", "msgspec", "h11")}
    heavy |= {n for n in loaded if n.startswith("sbxkit.cli")}
    assert heavy == set()
    # Control: the full path of the same command does load them (the check can fail).
    full = handed.run(
        "--socket",
        handed.witness.socket_path,
        busybox,
        "--",
        "echo",
        marker,
        python=("-X", "importtime"),
        SBXKIT_HANDOFF="off",
    )
    assert full.returncode == 0, full.stderr[-2000:]
    assert {"trio", "sbxkit.cli"} <= imported(full.stderr)
    assert handed.last_path() == "full path: SBXKIT_HANDOFF is off"


def supervisor_reads(supervisor: SupervisorProcess) -> int:
    """Bytes the supervisor process has read so far (``rchar``: sockets, pipes, files)."""
    with open(f"/proc/{supervisor.proc.pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def test_the_output_passes_through_the_command_line_not_the_supervisor(
    handed: Handed, busybox: str
) -> None:
    size = 16 * 2**20
    flags = ("--socket", handed.witness.socket_path, "--max-output", "32m", busybox, "--")
    assert handed.run(*flags, "true").returncode == 0  # loads the hand-off in the supervisor
    before = supervisor_reads(handed.supervisor)
    done = handed.run(*flags, "sh", "-c", f"head -c {size} /dev/zero; head -c {size} /dev/zero >&2")
    read = supervisor_reads(handed.supervisor) - before
    assert done.returncode == 0, done.stderr[-500:]
    assert (len(done.stdout), done.stderr.count(b"\0")) == (size, size)
    assert handed.last_path() == "handed off"
    assert read < 2 * 2**20, f"the supervisor read {read} bytes during a run of 32 MiB of output"


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("profile", "--profile is not handed off"),
        ("fifo", "neither a regular file nor a device"),
        ("daemon", "the run takes the daemon's path"),
        ("typo", "unrecognized arguments: --memroy"),
    ],
)
def test_each_fall_back_is_named_and_the_full_path_runs_it(
    handed: Handed, busybox: str, tmp_path: Path, case: str, reason: str
) -> None:
    flags: list[str] = ["--socket", handed.witness.socket_path]
    extra: dict[str, str] = {}
    expect = 0
    if case == "profile":
        profile = tmp_path / "p.toml"
        profile.write_text(f'[sandbox.docker]\nimage = "{busybox}"\n')
        flags += ["--profile", str(profile), "--", "echo", "ran"]
    elif case == "fifo":
        fifo = tmp_path / "in"
        os.mkfifo(fifo)
        writer = subprocess.Popen(
            [sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'ran\\n')"]
        )
        flags += ["--stdin", str(fifo), busybox, "--", "cat"]
    elif case == "daemon":
        extra["SBXKIT_EVIDENCE"] = "daemon"
        flags += ["--json", busybox, "--", "echo", "ran"]
    else:
        flags += ["--memroy", "64m", busybox, "--", "echo", "ran"]
        expect = 2
    done = handed.run(*flags, **extra)
    if case == "fifo":
        writer.wait(10)
    assert done.returncode == expect, done.stderr
    assert reason in handed.last_path()
    if expect == 0:
        assert b"ran" in done.stdout
    else:
        assert b"unrecognized arguments: --memroy" in done.stderr  # the full path's usage error


def test_no_supervisor_running_is_a_named_fall_back(witness: Witness, busybox: str) -> None:
    state_dir = private_state_dir()
    trace = state_dir.parent / "trace"
    env = {**os.environ, "SBXKIT_STATE_DIR": str(state_dir), "SBXKIT_HANDOFF_TRACE": str(trace)}
    env.pop("SBXKIT_HANDOFF", None)
    # The full path launches a supervisor there: one that exits after a second idle.
    env["SBXKIT_SUPERVISOR"] = f"{sys.executable} -m sbxkit.supervisor --idle-exit 1"
    argv = [sys.executable, "-m", "sbxkit", "run", *SMALL, "--socket", witness.socket_path]
    try:
        done = subprocess.run(
            [*argv, busybox, "--", "echo", "ran"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"ran\n"
        assert trace.read_text().splitlines() == [
            "full path: no supervisor runs for the state directory"
        ]
    finally:
        assert wait_until(lambda: not (state_dir / "supervisor.sock").exists(), 30)
        shutil.rmtree(state_dir.parent, ignore_errors=True)


@pytest.mark.parametrize("when", ["running", "waiting_for_go"])
def test_a_command_line_killed_mid_run_leaves_nothing(
    handed: Handed, busybox: str, when: str
) -> None:
    label = unique("killed")
    flags = ["--socket", handed.witness.socket_path, "--label", f"{LABEL}={label}", busybox, "--"]
    proc = handed.start(*flags, "sleep", "60")
    try:
        assert wait_until(
            lambda: any(
                c.get("State") == "running"
                for c in handed.witness.containers(label=f"{LABEL}={label}")
            ),
            30,
        )
        if when == "running":  # the payload runs: the command line holds the sandbox's ends
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert wait_until(lambda: handed.witness.containers(label=f"{LABEL}={label}") == [], 20)
    assert wait_until(lambda: handed.leftovers() == [], 10), handed.leftovers()


def test_a_run_that_waited_for_capacity_reports_its_timeout_as_the_full_path_does(
    witness: Witness, busybox: str
) -> None:
    """Once a handed-off run has waited in the queue, the supervisor's refusal is reported
    by the command line itself (the full path would wait again): the same words, the same
    exit status (75), and the --json error object."""
    state_dir = private_state_dir()
    flags = ["--socket", witness.socket_path, "--json", busybox, "--"]
    budget = ("--memory-budget", str(100 * 2**20), "--admission-timeout", "1")
    try:
        with running_supervisor(state_dir, "--persistent", *budget) as supervisor:
            handed = Handed(supervisor, witness)
            holder = handed.start(*flags, "sleep", "60")
            try:
                assert wait_until(lambda: bool(list(state_dir.glob("*.lease"))), 30)
                waited = {
                    path: handed.run(*flags, "echo", "never", **env)
                    for path, env in (("handed", {}), ("full", {"SBXKIT_HANDOFF": "off"}))
                }
            finally:
                holder.send_signal(signal.SIGTERM)
                holder.wait(30)
        paths = handed.trace.read_text().splitlines()
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)
    # Each command traces its path as it ends: the two waiting runs, then the holder.
    assert paths == ["handed off", "full path: SBXKIT_HANDOFF is off", "handed off"]
    handed_run, full_run = waited["handed"], waited["full"]
    assert (handed_run.returncode, full_run.returncode) == (75, 75), handed_run.stderr
    assert b"waited 1 s for capacity" in handed_run.stderr
    assert handed_run.stderr == full_run.stderr
    assert handed_run.stdout == full_run.stdout
    assert json.loads(handed_run.stdout)["error"]["type"] == "AdmissionTimeout"
