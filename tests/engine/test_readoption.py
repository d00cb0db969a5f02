"""A supervisor crash costs no run (issue 22): live callers re-adopt their leases.

Each test SIGKILLs the supervisor while a sandbox of one kind runs — a one-shot run on both
evidence paths, a claimed pooled run, a session (exec and files), a PTY, a stdio worker, a
batch — and proves through the independent witness that the caller finishes with the payload's
own result, that the daemon created and destroyed the container exactly once, and that no
record is left. Supervisors are auto-launched by the callers, as in production (the killed one
too), unless a test plays the service manager. What cannot be saved fails as before (exit 74):
a caller that dies in the gap, a lifetime that passes in it, a supervisor that does not come
back (tests/engine/test_supervisor_faults.py, ``kill_mid_run``); proof of ownership is checked
(a wrong, a replayed, a second owner's secret). The chaos test is test_readoption_chaos.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._consumers.harness import Job, run_many
from sbxkit._consumers.pty import open_pty
from sbxkit._consumers.runner import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._consumers.stdio import open_stdio_worker
from sbxkit._lifecycle.connect import connect_supervisor
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import RunResult, Stream
from sbxkit._model.spec import SandboxSpec
from sbxkit._protocol.proof import secret_hash
from sbxkit._protocol.wire import Adopt, Unadopted
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError, SbxError
from sbxkit.pool.held import HeldPool, PooledBackend
from tests.engine.helpers import actions, spec
from tests.faultproxy import FaultProxy
from tests.supervision import (
    auto_launched_supervisors,
    running_supervisor,
    signal_supervisors,
    wait_gone,
)
from tests.witness import LEASE_LABEL, Witness

GRACE_S = 15
"""The auto-launched supervisors' ``--adopt-grace``: generous on a loaded 2-core machine (a
caller re-adopts within a second or two here)."""
CALLER = Path(__file__).with_name("readoption_caller.py")


def supervisor_command(*extra: str) -> str:
    return shlex.join(
        [sys.executable, "-m", "sbxkit.supervisor", "--idle-exit", "2", "--reaper-interval",
         "0.5", "--adopt-grace", str(GRACE_S), *extra]
    )  # fmt: skip


@pytest.fixture
def supervised(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``state_dir``, whose supervisor the callers launch (and launch again after a crash);
    every one still running is stopped afterwards."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", supervisor_command())
    with auto_launched_supervisors(state_dir):
        yield state_dir


# -- helpers ------------------------------------------------------------------------------------


async def eventually(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = trio.current_time() + seconds
    while not await trio.to_thread.run_sync(predicate):
        if trio.current_time() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        await trio.sleep(0.05)


async def crash(state_dir: Path) -> None:
    """SIGKILL the state directory's supervisor (one runs); return once it is dead."""
    pids = await trio.to_thread.run_sync(signal_supervisors, state_dir)
    assert len(pids) == 1, f"supervisors of {state_dir}: {pids}"
    await trio.to_thread.run_sync(wait_gone, pids)


def log_of(state_dir: Path) -> str:
    path = state_dir / "supervisor.log"
    return path.read_text(errors="replace") if path.exists() else ""


def records(state_dir: Path) -> list[str]:
    return sorted(path.stem for path in state_dir.glob("*.lease"))


async def removed_exactly_once(
    witness: Witness, state_dir: Path, lease: str, since: float, *, creates: int = 1
) -> list[str]:
    """The lease's container is gone and its record too; the daemon created ``creates`` and
    destroyed exactly as many. Returns the lease's container events."""

    def gone() -> bool:
        return not witness.containers(label=f"{LEASE_LABEL}={lease}") and lease not in records(
            state_dir
        )

    await eventually(gone, 20, f"lease {lease}: container and record gone")
    events = actions(
        witness.events(since, time.time(), type=["container"], label=[f"{LEASE_LABEL}={lease}"])
    )
    assert events.count("create") == creates, events
    assert events.count("destroy") == creates, events
    return events


async def readopted(state_dir: Path, lease: str, log: Callable[[], str] | None = None) -> str:
    """The supervisor's log, once it says the lease was re-adopted (``log``: a supervisor
    this test runs; else the auto-launched ones' log in the state directory)."""
    read = log or (lambda: log_of(state_dir))
    marker = f"lease {lease}: re-adopted by its caller"
    await eventually(lambda: marker in read(), 20, marker)
    return read()


def first_output(seen: trio.Event) -> Callable[[Stream, bytes], None]:
    def on_output(stream: Stream, chunk: bytes) -> None:
        seen.set()

    return on_output


class Background:
    """One supervised run in a nursery: ``running`` once its payload's first output came;
    then its result, or the sbxkit error it raised."""

    def __init__(self, engine: Engine, owner: SupervisedOwner, busybox: str, script: str):
        self.running = trio.Event()
        self.outcome: list[RunResult | SbxError] = []
        self._engine, self._owner = engine, owner
        self._sandbox = spec(busybox, script, timeout_s=30)

    async def run(self) -> None:
        try:
            on_output = first_output(self.running)
            result = await run(
                self._sandbox, engine=self._engine, owner=self._owner, on_output=on_output
            )
            self.outcome.append(result)
        except SbxError as exc:
            self.outcome.append(exc)

    @property
    def result(self) -> RunResult:
        (result,) = self.outcome
        assert isinstance(result, RunResult), repr(result)
        return result


PAYLOAD = "echo before; sleep 2; echo after >&2; exit 7"


def assert_payloads_own(result: RunResult) -> None:
    assert (result.status, result.exit_code) == ("exited", 7), result
    assert (result.stdout, result.stderr) == (b"before\n", b"after\n")


# -- every consumer ------------------------------------------------------------------------------


@pytest.mark.parametrize("evidence", ["kernel", "daemon"])
async def test_a_one_shot_run_finishes_across_a_supervisor_crash(
    evidence: str,
    engine: Engine,
    witness: Witness,
    supervised: Path,
    busybox: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if evidence == "daemon":
        monkeypatch.setenv("SBXKIT_EVIDENCE", "daemon")
    owner = SupervisedOwner(engine, state_dir=supervised)
    since, one = time.time(), Background(engine, owner, busybox, PAYLOAD)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one.run)
        await one.running.wait()
        await crash(supervised)
    result = one.result
    assert_payloads_own(result)
    assert result.evidence == evidence
    await readopted(supervised, result.lease)
    await removed_exactly_once(witness, supervised, result.lease, since)


async def test_a_claimed_pooled_run_finishes_across_a_supervisor_crash(
    engine: Engine, witness: Witness, supervised: Path, busybox: str
) -> None:
    """The claimer got the parked container's secret with ``Claimed``; its FIFO ends and the
    init's pidfd are its own (SCM_RIGHTS), so the supervisor's death takes nothing from it."""
    owner = SupervisedOwner(engine, state_dir=supervised)
    pool = HeldPool(size=1, refill=False, wait_for_removal=True)
    backend = PooledBackend(pool=pool, engine=engine, owner=owner)
    sandbox = spec(busybox, PAYLOAD, timeout_s=30)
    since, running = time.time(), trio.Event()
    assert await backend.warm(sandbox) == 1
    results: list[RunResult] = []

    async def one_run() -> None:
        results.append(await backend.run_once(sandbox, on_output=first_output(running)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one_run)
        await running.wait()
        await crash(supervised)
    (result,) = results
    assert result.pooled
    assert_payloads_own(result)
    await readopted(supervised, result.lease)
    await removed_exactly_once(witness, supervised, result.lease, since)


async def test_a_session_goes_on_across_a_supervisor_crash(
    engine: Engine, witness: Witness, supervised: Path, busybox: str
) -> None:
    """An exec running when the supervisor dies completes; later execs and file transfers
    work; the block's end closes the lease in the new supervisor."""
    owner = SupervisedOwner(engine, state_dir=supervised)
    since = time.time()
    async with open_sandbox(spec(busybox, "true", timeout_s=60), engine=engine, owner=owner) as box:
        lease = box.lease
        await box.put_files({"kept.txt": b"written before"})
        async with trio.open_nursery() as nursery:
            results: list[RunResult] = []

            async def long_exec() -> None:
                results.append(await box.exec(["sh", "-c", "sleep 2; echo long; exit 3"]))

            nursery.start_soon(long_exec)
            await trio.sleep(0.5)
            await crash(supervised)
        assert (results[0].status, results[0].exit_code, results[0].stdout) == (
            "exited",
            3,
            b"long\n",
        )
        await readopted(supervised, lease)
        after = await box.exec(["sh", "-c", "cat /tmp/kept.txt; echo; echo again"])
        assert after.stdout == b"written before\nagain\n"
        await box.put_files({"late.txt": b"written after"})
        assert await box.get_files(["kept.txt", "late.txt"]) == {
            "kept.txt": b"written before",
            "late.txt": b"written after",
        }
    await removed_exactly_once(witness, supervised, lease, since)


async def read_until(stream: Any, marker: bytes, seconds: float = 20.0) -> bytes:
    seen = b""
    with trio.fail_after(seconds):
        while marker not in seen:
            chunk = await stream.receive_some()
            if not chunk:
                break
            seen += chunk
    return seen


async def test_a_pty_goes_on_across_a_supervisor_crash(
    engine: Engine, witness: Witness, supervised: Path, busybox: str
) -> None:
    owner = SupervisedOwner(engine, state_dir=supervised)
    since = time.time()
    sandbox = SandboxSpec(
        image=busybox, command=["sh"], limits=spec(busybox, "", timeout_s=60).limits
    )
    async with open_pty(sandbox, engine=engine, owner=owner) as pty:
        lease = pty.lease
        await pty.send_all(b"echo one''one\r")
        assert b"oneone" in await read_until(pty, b"oneone")
        await crash(supervised)
        await pty.send_all(b"echo two''two\r")  # the terminal did not wait for anyone
        assert b"twotwo" in await read_until(pty, b"twotwo")
        await readopted(supervised, lease)
        await pty.send_all(b"exit 5\r")
        while await pty.receive_some():
            pass
        ended = await pty.wait()
    assert (ended.status, ended.exit_code) == ("exited", 5)
    await removed_exactly_once(witness, supervised, lease, since)


async def test_a_stdio_worker_goes_on_across_a_supervisor_crash(
    engine: Engine, witness: Witness, supervised: Path, busybox: str
) -> None:
    owner = SupervisedOwner(engine, state_dir=supervised)
    since = time.time()
    script = "while read -r line; do echo got:$line; done; echo bye >&2; exit 4"
    async with open_stdio_worker(
        spec(busybox, script, timeout_s=60), engine=engine, owner=owner
    ) as worker:
        lease = worker.lease
        await worker.stdin.send_all(b"a\n")
        assert await read_until(worker.stdout, b"got:a\n") == b"got:a\n"
        await crash(supervised)
        await worker.stdin.send_all(b"b\n")
        assert await read_until(worker.stdout, b"got:b\n") == b"got:b\n"
        await readopted(supervised, lease)
        await worker.stdin.send_eof()
        assert await read_until(worker.stdout, b"never") == b""
        ended = await worker.wait()
    assert (ended.status, ended.exit_code, ended.stderr) == ("exited", 4, b"bye\n")
    await removed_exactly_once(witness, supervised, lease, since)


async def test_a_batch_finishes_across_a_supervisor_crash(
    engine: Engine, witness: Witness, supervised: Path, busybox: str
) -> None:
    """Every job in flight when the supervisor dies is re-adopted (through one new
    supervisor, launched once by this process) and returns its own result."""
    since = time.time()
    jobs = [
        Job(id=str(code), spec=spec(busybox, f"sleep 2; echo job{code}; exit {code}", timeout_s=30))
        for code in range(4)
    ]
    started: set[str] = set()
    results: list[Any] = []

    async def batch() -> None:
        results.extend(
            await run_many(
                jobs,
                parallel=4,
                engine=engine,
                owner_factory=lambda e: SupervisedOwner(e, state_dir=supervised),
                on_start=lambda job_id: started.add(str(job_id)),
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batch)
        running = lambda: len(witness.sbxkit_containers()) == 4  # noqa: E731 (this session's)
        await eventually(running, 30, "four jobs running")
        await trio.sleep(0.3)
        await crash(supervised)
    assert len(results) == 4
    launched_after = 0
    for job in results:
        result = job.result
        assert result is not None, job
        code = int(job.id)
        assert (result.status, result.exit_code, result.stdout) == (
            "exited",
            code,
            f"job{code}\n".encode(),
        )
        await readopted(supervised, result.lease)
        await removed_exactly_once(witness, supervised, result.lease, since)
    launched_after = log_of(supervised).count("listening on")
    assert launched_after == 2, "one supervisor before the crash, one (not four) after it"


# -- who restarts it, and when the create was interrupted ----------------------------------------


async def test_a_supervisor_restarted_by_a_service_manager_is_found_and_adopts(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller cannot launch one (``/bin/false``): it keeps trying until the service
    manager's restart answers, within its re-adoption window."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    owner = SupervisedOwner(engine, state_dir=state_dir)
    script = "echo before; sleep 4; echo after >&2; exit 7"
    since, one = time.time(), Background(engine, owner, busybox, script)
    with running_supervisor(state_dir, "--persistent", "--adopt-grace", "10") as first:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one.run)
            await one.running.wait()
            first.kill()
            (lease,) = records(state_dir)
            await trio.sleep(1.0)  # the service manager's RestartSec
            with running_supervisor(state_dir, "--persistent", "--adopt-grace", "10") as second:
                await readopted(state_dir, lease, second.log)
                await removed_exactly_once(witness, state_dir, lease, since)
    result = one.result
    assert (result.status, result.exit_code, result.stdout) == ("exited", 7, b"before\n")
    assert f"lease {result.lease}: re-adopted" in second.log()


@contextlib.asynccontextmanager
async def a_create_its_supervisor_dies_in(
    state_dir: Path, proxy: FaultProxy, one_run: Callable[[], Awaitable[None]]
) -> AsyncIterator[tuple[str, Any]]:
    """``one_run`` under a supervisor behind ``proxy``, killed once the run's create reached
    the proxy, and restarted; yields the lease and the restarted supervisor once the run is
    over (both supervisors are stopped when the block ends)."""
    flags = ("--docker-socket", proxy.path, "--persistent")
    with running_supervisor(state_dir, *flags) as first, contextlib.ExitStack() as later:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one_run)
            await eventually(lambda: proxy.seen("create") == 1, 15, "the create reached it")
            (lease,) = records(state_dir)
            first.kill()
            second = later.enter_context(running_supervisor(state_dir, *flags))
        yield lease, second


async def test_a_create_the_supervisor_died_in_is_taken_over_once_its_container_appears(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor dies while the daemon still holds the create (a proxy delays it): the
    caller never heard ``Created``. It re-adopts the lease in the restarted supervisor, which
    waits for the late container, checks it was never started, and hands it over: the run
    goes on with the one container the daemon created."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    owner = SupervisedOwner(engine, state_dir=state_dir)
    since = time.time()
    results: list[RunResult] = []

    async def one_run() -> None:
        sandbox = spec(busybox, "echo made; exit 9", timeout_s=30)
        results.append(await run(sandbox, engine=engine, owner=owner))

    with FaultProxy(witness.socket_path) as proxy:
        proxy.delay_create(3.0)
        async with a_create_its_supervisor_dies_in(state_dir, proxy, one_run) as (lease, second):
            await readopted(state_dir, lease, second.log)
            await removed_exactly_once(witness, state_dir, lease, since)
    (result,) = results
    assert (result.status, result.exit_code, result.stdout) == ("exited", 9, b"made\n")
    assert proxy.seen("create") == 1  # taken over, not created again


async def test_a_create_that_never_reached_the_daemon_runs_afresh_under_a_new_lease(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor dies after journaling the create and before the daemon saw it (a proxy
    withholds the request until its sender is gone): no container ever appears, and the
    restarted supervisor cannot hand one over. The caller never heard of a container, so its
    payload never ran: the run registers afresh under a new lease and finishes with its
    payload's own result. The interrupted lease stays the journal's tombstone (a late
    container would be removed), and no container is left."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    owner = SupervisedOwner(engine, state_dir=state_dir)
    results: list[RunResult] = []

    async def one_run() -> None:
        sandbox = spec(busybox, "echo made; exit 9", timeout_s=30)
        results.append(await run(sandbox, engine=engine, owner=owner))

    with FaultProxy(witness.socket_path) as proxy:
        proxy.withhold_create()
        async with a_create_its_supervisor_dies_in(state_dir, proxy, one_run) as (lease, second):
            await eventually(lambda: records(state_dir) == [lease], 30, "only the tombstone left")
            log = second.log()
    (result,) = results
    assert (result.status, result.exit_code, result.stdout) == ("exited", 9, b"made\n")
    assert result.lease != lease
    assert (proxy.seen("create"), proxy.faulted("create")) == (2, 1)  # the withheld, the fresh
    record = json.loads((state_dir / f"{lease}.lease").read_text())
    assert record["state"] == "uncertain", record
    assert witness.containers(label=f"{LEASE_LABEL}={lease}") == []
    assert f"lease {lease}: not re-adopted: its create was interrupted" in log, log


async def test_a_request_waiting_for_admission_registers_again_in_the_new_supervisor(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One live sandbox at a time: the second run waits in the queue (nothing journaled for
    it) when the supervisor dies. The restarted one holds no record of it, so its caller
    registers it again; the first run is re-adopted, and both finish with their own result."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    owner = SupervisedOwner(engine, state_dir=state_dir, on_queued=lambda *_: waiting.set())
    waiting, running = trio.Event(), trio.Event()
    since = time.time()
    results: dict[str, RunResult] = {}

    async def one_run(name: str, script: str) -> None:
        sandbox = spec(busybox, script, timeout_s=30)
        results[name] = await run(
            sandbox, engine=engine, owner=owner, on_output=first_output(running)
        )

    flags = ("--persistent", "--max-workers", "1")
    with running_supervisor(state_dir, *flags) as first, contextlib.ExitStack() as later:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one_run, "first", "echo first; sleep 3; exit 1")
            await running.wait()
            nursery.start_soon(one_run, "second", "echo second; exit 2")
            await waiting.wait()
            (first_lease,) = records(state_dir)  # the waiting one has none
            first.kill()
            second = later.enter_context(running_supervisor(state_dir, *flags))
            await readopted(state_dir, first_lease, second.log)
        for result in results.values():
            await removed_exactly_once(witness, state_dir, result.lease, since)
    assert (results["first"].exit_code, results["first"].stdout) == (1, b"first\n")
    assert (results["second"].exit_code, results["second"].stdout) == (2, b"second\n")
    log = second.log()
    assert f"lease {results['second'].lease}: not re-adopted: no record of the lease" in log


# -- what cannot be saved ----------------------------------------------------------------------


def start_caller(state_dir: Path, busybox: str, script: str) -> subprocess.Popen[bytes]:
    """A caller process running one sandbox (tests/engine/readoption_caller.py): it prints
    ``running LEASE`` once the payload's first output came, then its result as JSON."""
    return subprocess.Popen(
        [sys.executable, str(CALLER), str(state_dir), busybox, script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


async def test_a_caller_that_dies_in_the_gap_leaves_its_container_to_the_grace_period(
    witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor dies, then its caller too, before re-adopting: the restarted supervisor
    holds the container for its grace period, then removes it as an orphan; ``sbxkit leases
    recover`` and the log say so."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")  # the caller cannot relaunch one
    since = time.time()
    with running_supervisor(state_dir, "--persistent") as first:
        caller = start_caller(state_dir, busybox, "echo before; sleep 60")
        try:
            assert caller.stdout is not None
            line = await trio.to_thread.run_sync(caller.stdout.readline)
            assert line.startswith(b"running "), (line, caller.stderr)
            lease = line.split()[1].decode()
            first.kill()
            caller.send_signal(signal.SIGKILL)  # dies while it tries to re-adopt
        finally:
            caller.kill()
            caller.wait(10)
    assert witness.containers(label=f"{LEASE_LABEL}={lease}"), "the container waits for recovery"
    with running_supervisor(state_dir, "--persistent", "--adopt-grace", "3") as second:
        await eventually(lambda: "held" in second.log(), 10, "the hold is logged")
        report = await trio.to_thread.run_sync(_leases_recover, state_dir)
        assert f"{lease} created" in report, report
        assert "held" in report, report
        await removed_exactly_once(witness, state_dir, lease, since)
        log = second.log()
        assert f"lease {lease}: expired unclaimed: no caller re-adopted it within the 3 s" in log
        report = await trio.to_thread.run_sync(_leases_recover, state_dir)
        assert f"lease {lease}: expired unclaimed" in report, report


def _leases_recover(state_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sbxkit", "leases", "--state-dir", str(state_dir), "recover"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return done.stdout.decode()


async def test_a_lifetime_that_passes_in_the_gap_is_not_re_adopted(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease's lifetime deadline passed while no supervisor ran (its record says so): the
    restarted supervisor does not hold it, refuses the caller's adoption, and removes it; the
    caller fails as before (``CleanupError``, exit 74), and nothing is left."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    owner = SupervisedOwner(engine, state_dir=state_dir, adopt_within_s=20.0)
    since, one = time.time(), Background(engine, owner, busybox, "echo before; sleep 60")
    with running_supervisor(state_dir, "--persistent") as first:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one.run)
            await one.running.wait()
            first.kill()
            (lease,) = records(state_dir)
            path = state_dir / f"{lease}.lease"
            record = json.loads(path.read_text())
            record["lifetime_deadline"] = time.time() - 1  # as if the gap had outlived it
            path.write_text(json.dumps(record) + "\n")
            with running_supervisor(state_dir, "--persistent") as second:
                await removed_exactly_once(witness, state_dir, lease, since)
    (error,) = one.outcome
    assert isinstance(error, CleanupError), repr(error)
    assert "its lifetime deadline passed" in str(error) or "recovered" in str(error), str(error)
    assert f"lease {lease}: re-adopted" not in second.log()


# -- proof of ownership ------------------------------------------------------------------------


async def test_wrong_replayed_and_second_owner_secrets_are_refused_and_logged(
    engine: Engine, witness: Witness, supervised: Path, busybox: str
) -> None:
    owner = SupervisedOwner(engine, state_dir=supervised)
    since, one = time.time(), Background(engine, owner, busybox, "echo before; sleep 5; exit 7")

    async def adopt(lease: str, secret: str) -> Unadopted:
        session = await connect_supervisor(supervised)
        try:
            next_hash = secret_hash(os.urandom(32).hex())
            await session.send(Adopt(lease=lease, secret=secret, next_secret_hash=next_hash))
            reply = await session.receive()
        finally:
            await session.aclose()
        assert isinstance(reply, Unadopted), reply
        return reply

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one.run)
        await one.running.wait()
        (lease,) = owner._links  # the test reads the caller's memory: an attacker could not
        spent = owner._links[lease]._secret
        assert spent is not None
        journaled = (supervised / f"{lease}.lease").read_text()
        assert spent not in journaled
        assert secret_hash(spent) in journaled
        await crash(supervised)
        await readopted(supervised, lease)
        current = owner._links[lease]._secret
        assert current is not None
        assert current != spent
        wrong = await adopt(lease, os.urandom(32).hex())
        replayed = await adopt(lease, spent)
        second = await adopt(lease, current)
    assert "wrong secret" in wrong.reason
    assert wrong.record
    assert "replayed secret" in replayed.reason
    assert "owned by another connection" in second.reason
    log = log_of(supervised)
    for said in (
        "refused: wrong secret",
        "refused: replayed secret (already used for an adoption)",
        "the lease is owned by another connection",
    ):
        assert f"lease {lease}: not re-adopted: {said}" in log, said
    result = one.result
    assert (result.status, result.exit_code, result.stdout) == ("exited", 7, b"before\n")
    await removed_exactly_once(witness, supervised, lease, since)
