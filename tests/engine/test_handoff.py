"""``sbxkit run`` handed to the running supervisor, against the real engine (issue 21, item 5).

The command line loads neither trio nor the CLI and really used the supervisor; the sandbox's
output passes through the command line only, never through the supervisor (the supervisor's
own read count, from ``/proc``, is the witness); each fall-back to the full path is named; a
command line killed mid-run leaves no container, no lease record and no FIFO directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.connect import connect_supervisor, receive_reply
from sbxkit._lifecycle.link import new_secret
from sbxkit._protocol.proof import secret_hash
from sbxkit._protocol.wire import RunError, RunResume, ServerMessage
from sbxkit.errors import SbxError
from tests.engine.helpers import actions, unique, wait_until
from tests.supervision import (
    SupervisorProcess,
    auto_launched_supervisors,
    private_state_dir,
    running_supervisor,
    supervisor_command,
)
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

    def start(self, *flags: str, output: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        """``sbxkit run SMALL flags`` in the background, its output discarded (or piped)."""
        return subprocess.Popen(
            self.argv(*flags),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
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
    command = ("--socket", handed.witness.socket_path, busybox, "--", "echo", marker)
    done = handed.run(*command, python=("-X", "importtime"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{marker}\n".encode()
    assert handed.last_path() == "handed off"
    loaded = imported(done.stderr)
    assert "sbxkit.handoff.client" in loaded
    heavy = {n for n in loaded if n.split(".")[0] in ("trio", "msgspec", "h11")}
    heavy |= {n for n in loaded if n.startswith("sbxkit.cli")}
    assert heavy == set()
    # Control: the full path of the same command does load them (the check can fail).
    full = handed.run(*command, python=("-X", "importtime"), SBXKIT_HANDOFF="off")
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
        ("slowness", "SBXKIT_HOST_SLOWNESS is not a number from 1 to 100"),
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
    elif case == "slowness":  # the full path refuses it, named, before anything is created
        extra["SBXKIT_HOST_SLOWNESS"] = "fast"
        flags += [busybox, "--", "echo", "ran"]
        expect = 2
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
    elif case == "slowness":
        assert b"SBXKIT_HOST_SLOWNESS" in done.stderr
        assert b"got 'fast'" in done.stderr
        assert b"ran" not in done.stdout
    else:
        assert b"unrecognized arguments: --memroy" in done.stderr  # the full path's usage error


def test_a_slow_host_setting_keeps_the_hand_off(handed: Handed, busybox: str) -> None:
    # The handshake's bound is stretched, not the run refused or sent down the full path.
    marker = unique("slow-host")
    flags = ("--socket", handed.witness.socket_path, busybox, "--", "echo", marker)
    done = handed.run(*flags, SBXKIT_HOST_SLOWNESS="3")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.decode().split() == [marker]
    assert handed.last_path() == "handed off"


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


# -- a supervisor crash while the command line holds the run (issue 22 × issue 21 item 5) ------

PAYLOAD = "sleep 3; echo out; echo err >&2; exit 3"
LAUNCHED = [sys.executable, "-m", "sbxkit.supervisor", "--idle-exit", "2", "--reaper-interval"]


def holds_the_init(pid: int) -> bool:
    """The command line holds the sandbox's init as a pidfd: ``RunStarted`` came."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[pidfd]":
                    return True
    return False


def crash_mid_run(handed: Handed, *flags: str) -> subprocess.CompletedProcess[bytes]:
    """``sbxkit run flags`` handed off; the supervisor SIGKILLed once the command line holds
    the run (the payload still sleeps); what the command line printed and its status."""
    proc = handed.start(*flags, output=subprocess.PIPE)
    try:
        assert wait_until(lambda: holds_the_init(proc.pid), 30), "never handed off"
        handed.supervisor.kill()
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def without_timings(document: bytes) -> dict[str, object]:
    fields = json.loads(document)
    for varying in ("timings", "container_id", "lease"):
        fields.pop(varying)
    return fields


def removed_once(witness: Witness, state_dir: Path, label: str, since: float) -> None:
    """The containers labelled ``label`` since ``since``: one created, one destroyed, none
    left; no lease record left in ``state_dir``."""
    assert wait_until(lambda: witness.containers(label=label) == [], 20)
    assert wait_until(lambda: not list(state_dir.glob("*.lease")), 20)
    seen = actions(witness.events(since, time.time(), type=["container"], label=[label]))
    assert (seen.count("create"), seen.count("destroy")) == (1, 1), seen


@pytest.mark.parametrize("case", ["cold", "pooled", "timed_out"])
def test_a_handed_off_run_survives_a_supervisor_crash_with_its_own_result(
    witness: Witness, busybox: str, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The supervisor is SIGKILLed while the payload sleeps: the command line carries the run
    on in the supervisor it launches (``RunResume``) and prints exactly what an uninterrupted
    run prints (cold, and a run past its time limit: the output, the notice, the status;
    pooled, claimed: ``--json``'s document, timings and ids aside); the daemon created and
    destroyed the container once; no record and no FIFO directory is left."""
    state_dir = private_state_dir()
    label = unique("crash")
    monkeypatch.setenv("SBXKIT_SUPERVISOR", shlex.join([*LAUNCHED, "0.5", "--adopt-grace", "15"]))
    flags = ["--socket", witness.socket_path, "--label", f"{LABEL}={label}"]
    pooled = case == "pooled"
    if pooled:
        flags += ["--pool", "1", "--json"]
    payload = PAYLOAD
    if case == "timed_out":
        flags += ["--timeout", "5"]
        payload = "echo out; echo err >&2; sleep 60"
    command = [busybox, "--", "sh", "-c", payload]
    try:
        with auto_launched_supervisors(state_dir):
            with running_supervisor(state_dir, "--persistent") as supervisor:
                handed = Handed(supervisor, witness)
                control = handed.run(*flags, *command)  # uninterrupted (pooled: parks one)
                if pooled:
                    time.sleep(1.0)  # the refill parks
                else:  # the control's removal is done before the crashed run is counted
                    assert wait_until(
                        lambda: witness.containers(label=f"{LABEL}={label}") == [], 20
                    )
                since = time.time()
                crashed = crash_mid_run(handed, *flags, *command)
            paths = handed.trace.read_text().splitlines()
            expected = 124 if case == "timed_out" else 3
            assert control.returncode == expected, control.stderr[-2000:]
            assert crashed.returncode == expected, crashed.stderr[-2000:]
            resumed = "resumed: the supervisor died; the one after it judged the run"
            assert paths[-2:] == [resumed, "handed off"], paths
            if not pooled:
                assert crashed.stdout == b"out\n"
                assert crashed.stderr.startswith(b"err\n")
                assert (crashed.stdout, crashed.stderr) == (control.stdout, control.stderr)
                if case == "timed_out":  # the limit named, by the served run and the resumed
                    assert crashed.stderr.endswith(b"sbxkit: timed out after 5 s\n")
                removed_once(witness, state_dir, f"{LABEL}={label}", since)
            else:
                assert crashed.stderr == control.stderr == b""
                assert without_timings(crashed.stdout) == without_timings(control.stdout)
                result = json.loads(crashed.stdout)
                assert (result["stdout"], result["stderr"]) == ("out\n", "err\n")
                assert result["pooled"] is True
                removed_once(witness, state_dir, f"sbxkit.lease={result['lease']}", since - 60)
            assert wait_until(lambda: handed.leftovers() == [], 20), handed.leftovers()
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)
    assert wait_until(lambda: witness.containers(label=f"{LABEL}={label}") == [], 30)


def test_a_handed_off_run_whose_supervisor_never_comes_back_is_lost_and_recovered(
    witness: Witness, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No supervisor can start again (``SBXKIT_SUPERVISOR`` is /bin/false): the command line
    tries to resume its run for ``ADOPT_WITHIN_S``, then says it is lost (74) as before; the
    record keeps the container for recovery, and the next supervisor's recovery removes it
    once its grace for re-adoption ends — exactly once, no record left."""
    state_dir = private_state_dir()
    label = unique("lost")
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    flags = ["--socket", witness.socket_path, "--label", f"{LABEL}={label}", "--json"]
    try:
        with running_supervisor(state_dir, "--persistent") as supervisor:
            handed = Handed(supervisor, witness)
            since = time.time()
            crashed = crash_mid_run(handed, *flags, busybox, "--", "sh", "-c", PAYLOAD)
        assert crashed.returncode == 74, crashed.stderr[-2000:]
        assert b"durable recovery is required" in crashed.stderr
        assert json.loads(crashed.stdout)["exit_status"] == 74
        trace = handed.trace.read_text().splitlines()
        assert trace[-2].startswith("lost: not resumed within 10 s"), trace
        assert len(list(state_dir.glob("*.lease"))) == 1  # recovery's, with its container
        assert len(witness.containers(label=f"{LABEL}={label}")) == 1
        with running_supervisor(state_dir, "--persistent", "--adopt-grace", "1"):
            removed_once(witness, state_dir, f"{LABEL}={label}", since)
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)


def test_a_crash_costs_neither_the_running_run_nor_the_one_waiting_for_capacity(
    witness: Witness, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget for one sandbox: one handed-off run holds it, a second waits in the queue.
    The supervisor is SIGKILLed: the first is resumed in the supervisor it launches, the
    second — nothing of it ran — is run by the full path; both print their payload's own
    result; every container the daemon created is destroyed once, no record is left."""
    state_dir = private_state_dir()
    label = unique("queue")
    monkeypatch.setenv("SBXKIT_SUPERVISOR", shlex.join([*LAUNCHED, "0.5", "--adopt-grace", "15"]))
    flags = ["--socket", witness.socket_path, "--label", f"{LABEL}={label}", busybox, "--"]
    budget = ("--memory-budget", str(100 * 2**20))
    since = time.time()
    try:
        with (
            auto_launched_supervisors(state_dir),
            running_supervisor(state_dir, "--persistent", *budget) as supervisor,
        ):
            handed = Handed(supervisor, witness)
            holder = handed.start(
                *flags, "sh", "-c", "sleep 5; echo held; exit 4", output=subprocess.PIPE
            )
            assert wait_until(lambda: holds_the_init(holder.pid), 30), "never handed off"
            waiting = handed.start(
                *flags, "sh", "-c", "echo waited; exit 5", output=subprocess.PIPE
            )
            time.sleep(2.0)  # it connects and waits: the budget holds one sandbox
            assert waiting.poll() is None
            supervisor.kill()
            held, waited = holder.communicate(timeout=90), waiting.communicate(timeout=90)
        assert (holder.returncode, held) == (4, (b"held\n", b"")), held[1][-2000:]
        assert (waiting.returncode, waited) == (5, (b"waited\n", b"")), waited[1][-2000:]
        trace = handed.trace.read_text().splitlines()
        assert (
            "full path: the supervisor closed the connection while the run waited for capacity"
            in trace
        )
        assert "resumed: the supervisor died; the one after it judged the run" in trace
        assert wait_until(lambda: witness.containers(label=f"{LABEL}={label}") == [], 30)
        assert wait_until(lambda: handed.leftovers() == [], 30), handed.leftovers()
        seen = actions(
            witness.events(since, time.time(), type=["container"], label=[f"{LABEL}={label}"])
        )
        assert seen.count("create") == seen.count("destroy") >= 2, seen
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)


def test_a_command_line_interrupted_after_its_supervisor_died_has_the_next_remove_the_run(
    witness: Witness, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL the supervisor, then SIGINT the command line while the payload runs on: the
    supervisor it launches removes the sandbox (``RunResume`` with the signal) and the command
    line says so as an uninterrupted cancel does (130); removed once, nothing left."""
    state_dir = private_state_dir()
    label = unique("cancel")
    monkeypatch.setenv("SBXKIT_SUPERVISOR", shlex.join([*LAUNCHED, "0.5", "--adopt-grace", "15"]))
    flags = ["--socket", witness.socket_path, "--label", f"{LABEL}={label}", busybox, "--"]
    since = time.time()
    try:
        with (
            auto_launched_supervisors(state_dir),
            running_supervisor(state_dir, "--persistent") as supervisor,
        ):
            handed = Handed(supervisor, witness)
            proc = handed.start(*flags, "sleep", "60", output=subprocess.PIPE)
            assert wait_until(lambda: holds_the_init(proc.pid), 30), "never handed off"
            supervisor.kill()
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=90)
        assert proc.returncode == 130, stderr[-2000:]
        assert (stdout, stderr) == (b"", b"sbxkit: interrupted by SIGINT; sandbox removed\n")
        trace = handed.trace.read_text().splitlines()
        assert "resumed: the supervisor died; the one after it removed the run" in trace, trace
        removed_once(witness, state_dir, f"{LABEL}={label}", since)
        assert wait_until(lambda: handed.leftovers() == [], 20), handed.leftovers()
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)


PAUSED_PRELOAD = Path(__file__).with_name("paused_preload_supervisor.py")


def test_a_resume_while_the_supervisor_loads_the_handoff_is_answered_and_it_lives_on(
    witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RunResume`` reaches a fresh supervisor while it loads the hand-off in a worker thread (as a
    command line whose supervisor died reaches the one it launched): every connection is answered
    (unknown leases: not re-adopted), the supervisor lives on, no internal error is logged. The
    preload is held half-way through the run grammar package until the event loop imports the
    hand-off too (paused_preload_supervisor.py); then both threads imported it at once, one found a
    partly initialized module, the connection dropped and the supervisor ended (CI: a command line's
    resume ran out of its 10 s relaunching such supervisors)."""
    state_dir = private_state_dir()
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")  # the test's supervisor only
    log_path = state_dir.parent / "supervisor.out"
    flags = supervisor_command(state_dir, "--persistent", "--engine-socket", witness.socket_path)
    command = [sys.executable, str(PAUSED_PRELOAD), *flags[3:]]  # past ``python -m module``

    async def resumed(after_s: float) -> ServerMessage | str:
        await trio.sleep(after_s)
        resume = RunResume(
            lease=new_secret()[:32],
            secret=new_secret(),
            next_secret_hash=secret_hash(new_secret()),
            cancel=int(signal.SIGINT),
        )
        try:
            session = await connect_supervisor(state_dir, resume)
            try:
                return await receive_reply(session, "resume", 60)
            finally:
                await session.aclose()
        except SbxError as exc:  # e.g. the connection dropped: said below with the log
            return str(exc)

    async def resumed_at_once() -> list[ServerMessage | str]:
        answers: dict[float, ServerMessage | str] = {}

        async def one(after_s: float) -> None:
            answers[after_s] = await resumed(after_s)

        async with trio.open_nursery() as nursery:
            for after_s in (0.0, 0.05, 0.1):
                nursery.start_soon(one, after_s)
        return list(answers.values())

    def logged() -> str:
        return log_path.read_text(errors="replace")

    try:
        with open(log_path, "wb") as log:
            supervisor = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            assert wait_until(lambda: "preload paused" in logged(), 60, 0.01), logged()
            answers = trio.run(resumed_at_once)
            assert wait_until(lambda: "preload resumed" in logged(), 10), logged()
            assert len(answers) == 3, answers
            for answer in answers:
                assert isinstance(answer, RunError), (answer, logged())
                assert "no record of the lease" in answer.stderr, answer
            assert supervisor.poll() is None, logged()
            assert "internal error" not in logged(), logged()
            assert "Traceback" not in logged(), logged()
        finally:
            supervisor.terminate()
            supervisor.wait(30)
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)
