"""Admission against the real daemon: many callers at once wait their turn instead of failing.

Issue 10's contract, each proven with real sandboxes and the independent witness:
- many concurrent ``sbxkit run`` processes with default limits all succeed with their own output;
- two ``sbxkit batch`` processes at once both finish every job, each really running in parallel;
- the queue is FIFO, a queued run's time limit starts at its start, not while it waits;
- a queued caller that is SIGKILLed leaves no container and no record;
- a request that can never fit is refused at once with nothing created (exit 2);
- records and connections stay hard bounds that fail explicitly (``CapacityExhausted``, exit 75);
- a passed admission deadline is its own error (``AdmissionTimeout``), nothing created.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import RunResult
from sbxkit._model.spec import MiB
from sbxkit._plan.plan import new_lease_id
from sbxkit._protocol.wire import Close, Closed, Created, Registered, Welcome
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import AdmissionTimeout, CapacityExhausted, NeverFits, SpecError
from sbxkit.supervisor.recovery import STALE_IO_MARGIN_S
from tests.engine.cli_paths import CliPath
from tests.engine.helpers import spec, unique, wait_until
from tests.engine.test_supervisor import RawClient, hello, register_for
from tests.supervision import (
    SupervisorProcess,
    running_supervisor,
)
from tests.witness import RUN_LABEL, SOCKET, THIS_RUN, Witness

ONE_SLOT = ("--memory-budget", str(100 * MiB))  # one 64 MiB sandbox fits, two do not


@pytest.fixture(autouse=True)
def _no_auto_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs here talk to the supervisor the test started, never a detached one."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")


def owner_for(engine: Engine, state_dir: Path, **kwargs: Any) -> SupervisedOwner:
    return SupervisedOwner(engine, state_dir=state_dir, close_timeout_s=30.0, **kwargs)


def lease_files(state_dir: Path) -> list[Path]:
    return list(state_dir.glob("*.lease")) if state_dir.exists() else []


def created_names(witness: Witness, since: float) -> list[str]:
    """Names of the containers this test session created since ``since`` (unix seconds): every
    one it makes carries its run label; others' on a shared daemon do not count."""
    assert THIS_RUN is not None  # else the filter would match nothing, and prove nothing
    mine = [f"{RUN_LABEL}={THIS_RUN}"]
    events = witness.events(since, time.time(), type=["container"], event=["create"], label=mine)
    return [e["Actor"]["Attributes"].get("name", "") for e in events]


class Holder:
    """A sandbox that occupies the budget until ``release``."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.running = trio.Event()

    async def hold(self, engine: Engine, owner: SupervisedOwner, image: str) -> None:
        with self.scope:
            await run(spec(image, "sleep 60", timeout_s=60.0), engine=engine, owner=owner)

    def release(self) -> None:
        self.scope.cancel()


async def wait_running(witness: Witness, count: int, label_filter: str | None = None) -> None:
    def enough() -> bool:
        running = [c for c in witness.sbxkit_containers() if c.get("State") == "running"]
        return len(running) >= count

    for _ in range(400):
        if await trio.to_thread.run_sync(enough):
            return
        await trio.sleep(0.05)
    raise AssertionError(f"{count} running sandboxes never appeared")


@asynccontextmanager
async def one_held(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> AsyncIterator[trio.Nursery]:
    """A holder's sandbox runs, taking its slot, for the block (the block's nursery is its)."""
    holder = Holder()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder.hold, engine, owner_for(engine, state_dir), busybox)
        await wait_running(witness, 1)
        yield nursery
        holder.release()


async def one_more(engine: Engine, state_dir: Path, busybox: str) -> RunResult:
    """A run beside the held one (refused or waiting, as the test's bound says)."""
    return await run(spec(busybox, "echo no"), engine=engine, owner=owner_for(engine, state_dir))


# -- FIFO, waiting instead of refusing, the time limit from start ---------------------------------


async def test_queued_runs_wait_in_fifo_order_and_their_time_limit_starts_at_start(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    finished: list[int] = []
    places: dict[int, list[int]] = {}
    results: dict[int, RunResult] = {}
    with running_supervisor(state_dir, "--persistent", *ONE_SLOT):
        async with one_held(engine, witness, state_dir, busybox) as nursery:

            async def queued_run(index: int, told: trio.Event) -> None:
                def on_queued(ahead: int, waited_s: float) -> None:
                    places.setdefault(index, []).append(ahead)
                    told.set()

                owner = owner_for(engine, state_dir, on_queued=on_queued)
                # A 2 s limit while the wait lasts longer: the limit must start at start.
                job = spec(busybox, f"sleep 0.2; echo {index}", timeout_s=2.0)
                results[index] = await run(job, engine=engine, owner=owner)
                finished.append(index)

            for index in range(4):
                told = trio.Event()
                nursery.start_soon(queued_run, index, told)
                await told.wait()  # queued before the next one asks: arrival order is known
            await trio.sleep(2.5)  # longer than the queued runs' own time limit
            assert finished == []
        # The last run returned at its payload's exit; its lease closes once it is removed.
        gone = await trio.to_thread.run_sync(wait_until, lambda: not lease_files(state_dir), 10.0)
        assert gone
    assert finished == [0, 1, 2, 3]  # one fits at a time: FIFO order is completion order
    for index, result in results.items():
        assert result.status == "exited", (index, result)
        assert result.stdout == f"{index}\n".encode()
        assert result.timings.queued_s > 2.0  # waited, and the wait did not count as runtime
    assert [places[i][0] for i in range(4)] == [0, 1, 2, 3]
    assert not lease_files(state_dir)


# -- hard bounds fail explicitly ------------------------------------------------------------------


async def test_max_records_refuses_explicitly(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    with running_supervisor(state_dir, "--persistent", "--max-records", "1"):
        async with one_held(engine, witness, state_dir, busybox):
            since = time.time()
            with pytest.raises(CapacityExhausted) as caught:
                await one_more(engine, state_dir, busybox)
            assert caught.value.code == "capacity"
            assert "1 lease records, the cap is 1" in str(caught.value)
            assert not isinstance(caught.value, AdmissionTimeout)
            assert created_names(witness, since) == []
        # Returns once its container is gone: the supervisor stops right after this block.
        owner = owner_for(engine, state_dir)
        backend = DockerBackend(engine=engine, owner=owner, wait_for_removal=True)
        result = await run(spec(busybox, "echo yes"), backend=backend)
    assert (result.status, result.stdout) == ("exited", b"yes\n")


async def test_max_connections_refuses_explicitly(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    with running_supervisor(state_dir, "--persistent", "--max-connections", "1"):
        async with one_held(engine, witness, state_dir, busybox):
            with pytest.raises(CapacityExhausted) as caught:
                await one_more(engine, state_dir, busybox)
            assert "too many connections" in str(caught.value)


async def test_a_passed_admission_deadline_is_its_own_error(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    with running_supervisor(state_dir, "--persistent", "--admission-timeout", "1", *ONE_SLOT):
        async with one_held(engine, witness, state_dir, busybox):
            since = time.time()
            with pytest.raises(AdmissionTimeout) as caught:
                await one_more(engine, state_dir, busybox)
            assert "waited 1 s for capacity" in str(caught.value)
            assert caught.value.code == "admission_timeout"
            assert created_names(witness, since) == []
            assert len(lease_files(state_dir)) == 1  # only the holder's: nothing journaled


# -- launch slots: a client that never says it started --------------------------------------------


@contextmanager
def slot_hog(socket_path: Path, image: str) -> Iterator[RawClient]:
    """A raw client that takes a launch slot with a startup deadline of 1e7 s and never sends
    ``Started`` (issue 27.4); closing it ends its lease."""
    hog = RawClient(socket_path, timeout=30)
    lease = new_lease_id()
    try:
        hog.send(hello())
        assert isinstance(hog.receive(), Welcome)
        register = register_for(lease, image, "true", SOCKET)
        hog.send(msgspec.structs.replace(register, startup_deadline_s=1e7))
        assert isinstance(hog.receive(), Registered)
        assert isinstance(hog.receive(), Created)
        yield hog
    finally:
        # Removed before the supervisor stops (a SIGTERMed supervisor keeps the record).
        hog.send(Close(lease=lease))
        assert any(isinstance(m, Closed) for m in hog.drain())
        hog.close()


@contextmanager
def the_one_slot_held(state_dir: Path, image: str, *flags: str) -> Iterator[None]:
    """A supervisor with one launch slot, which a slot hog holds."""
    with (
        running_supervisor(state_dir, "--persistent", "--max-launching", "1", *flags) as sup,
        slot_hog(sup.socket_path, image),
    ):
        yield


async def test_a_client_that_never_starts_holds_its_launch_slot_only_up_to_the_cap(
    engine: Engine, state_dir: Path, busybox: str
) -> None:
    """Its slot is the only one; the next run hears Queued and runs once the supervisor's cap
    (3 s here) has passed, not the 1e7 s the hog asked for."""
    heard: list[int] = []
    owner = owner_for(engine, state_dir, on_queued=lambda ahead, _waited: heard.append(ahead))
    with the_one_slot_held(state_dir, busybox, "--max-startup-deadline", "3"):
        started = time.monotonic()
        result = await run(spec(busybox, "echo mine"), engine=engine, owner=owner)
        waited = time.monotonic() - started
    assert result.stdout == b"mine\n", result
    assert heard, "the waiting run heard no Queued"
    assert heard[0] == 0  # first in line for the slot
    assert 1.5 <= waited < 20.0, f"waited {waited:.1f} s"  # the cap, with a loaded machine's margin


async def test_a_run_waiting_for_a_launch_slot_times_out_cleanly(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    heard: list[int] = []
    owner = owner_for(engine, state_dir, on_queued=lambda ahead, _waited: heard.append(ahead))
    with the_one_slot_held(state_dir, busybox, "--admission-timeout", "2"):
        since = time.time()
        with pytest.raises(AdmissionTimeout) as caught:
            await run(spec(busybox, "echo no"), engine=engine, owner=owner)
        assert "waited 2 s for a launch slot" in str(caught.value)
        assert created_names(witness, since) == []
        assert len(lease_files(state_dir)) == 1  # only the hog's: nothing journaled
    assert heard


# -- never fits: refused at once ------------------------------------------------------------------


async def test_a_request_larger_than_the_budget_is_refused_at_once(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    ncpu = int(witness.get("/info")["NCPU"])
    with running_supervisor(state_dir, "--persistent", *ONE_SLOT):
        since = time.time()
        owner = owner_for(engine, state_dir)
        with pytest.raises(NeverFits) as too_much_memory:
            await run(spec(busybox, "true", memory_bytes=200 * MiB), engine=engine, owner=owner)
        with pytest.raises(NeverFits) as too_many_cpus:
            await run(spec(busybox, "true", cpus=ncpu + 1), engine=engine, owner=owner)
    assert isinstance(too_much_memory.value, SpecError)
    assert too_much_memory.value.field == "limits.memory_bytes"
    assert "--memory 200 MiB asked" in str(too_much_memory.value)
    assert "budget of 100 MiB" in str(too_much_memory.value)
    assert too_many_cpus.value.field == "limits.cpus"
    assert f"the daemon's {ncpu} CPUs" in str(too_many_cpus.value)
    assert created_names(witness, since) == []
    assert not lease_files(state_dir)


# -- the command line -----------------------------------------------------------------------------


def cli(*args: str, state_dir: Path | None = None) -> subprocess.Popen[bytes]:
    """``sbxkit ARGS`` as a process: with ``state_dir``, it talks to the supervisor the test
    started there; without, to the test session's (auto-launched, idle-exiting) one."""
    env = dict(os.environ)
    env.pop("SBXKIT_SUPERVISOR", None)  # the CLI may launch the session's supervisor
    if state_dir is not None:
        env["SBXKIT_STATE_DIR"] = str(state_dir)
    return subprocess.Popen(
        [sys.executable, "-m", "sbxkit", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def test_32_concurrent_cli_runs_with_default_limits_all_succeed(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    procs = [
        cli("run", "--json", "--socket", witness.socket_path, busybox, "--", "echo", f"job-{i}")
        for i in range(32)
    ]
    outcomes = [(p.wait(180), *p.communicate()) for p in procs]
    for i, (code, out, err) in enumerate(outcomes):
        assert code == 0, (i, code, err.decode(errors="replace")[-400:])
        doc = json.loads(out)
        assert doc["status"] == "exited"
        assert doc["stdout"] == f"job-{i}\n"


def test_an_impossible_cli_request_exits_2_naming_the_flag(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    cli_path.falls_back("NeverFits")  # the full path reproduces the refusal
    since = time.time()
    proc = cli("run", "--memory", "64g", "--socket", witness.socket_path, busybox, "--", "true")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert b"--memory 64 GiB asked, more than the whole memory budget" in err
    assert created_names(witness, since) == []


def test_a_queued_caller_sigkilled_while_waiting_leaves_no_container_and_no_record(
    witness: Witness, state_dir: Path, busybox: str, cli_handoff: CliPath
) -> None:
    with running_supervisor(state_dir, "--persistent", *ONE_SLOT) as sup:
        holder = cli(
            "run",
            "--memory",
            "64m",
            "--socket",
            witness.socket_path,
            busybox,
            "--",
            "sleep",
            "60",
            state_dir=state_dir,
        )
        assert wait_until(lambda: len(lease_files(state_dir)) == 1, 30), sup.log()
        since = time.time()
        waiting = cli(
            "run",
            "--memory",
            "64m",
            "--socket",
            witness.socket_path,
            busybox,
            "--",
            "echo",
            "never",
            state_dir=state_dir,
        )
        assert wait_until(lambda: "waiting for capacity" in sup.log(), 30), sup.log()
        queued_lease = _queued_lease(sup)
        waiting.send_signal(signal.SIGKILL)
        waiting.wait(10)
        holder.send_signal(signal.SIGTERM)  # the holder's sandbox is removed, room is made
        holder.wait(30)
        assert wait_until(lambda: not lease_files(state_dir), 10), sup.log()
        time.sleep(0.5)  # a wrongly admitted lease would be created by now
        assert f"sbxkit-{queued_lease}" not in created_names(witness, since)
        assert not (state_dir / f"{queued_lease}.lease").exists()


def test_a_fifo_directory_no_lease_can_use_is_swept_once_older_than_the_longest_wait(
    witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full-path caller makes its lease's FIFO directory before it registers, and nothing is
    journaled until admission: killed while queued, it leaves the directory behind. The
    reaper removes it once it is older than the longest admission wait — never a live
    lease's, nor a fresh one (a caller may be about to register it)."""
    monkeypatch.setenv("SBXKIT_HANDOFF", "off")  # the hand-off's command line removes its own
    wait_s = 30.0
    longest = ("--admission-timeout", f"{wait_s:g}")
    with running_supervisor(state_dir, "--persistent", *longest, *ONE_SLOT) as sup:
        holder = cli(
            "run", "--memory", "64m", "--socket", witness.socket_path, busybox, "--",
            "sleep", "60", state_dir=state_dir,
        )  # fmt: skip
        try:
            assert wait_until(lambda: len(lease_files(state_dir)) == 1, 30), sup.log()
            live_lease = lease_files(state_dir)[0].stem
            waiting = cli(
                "run", "--memory", "64m", "--socket", witness.socket_path, busybox, "--",
                "echo", "never", state_dir=state_dir,
            )  # fmt: skip
            assert wait_until(lambda: "waiting for capacity" in sup.log(), 30), sup.log()
            queued_lease = _queued_lease(sup)
            waiting.send_signal(signal.SIGKILL)
            waiting.wait(10)
            io = io_root(state_dir)
            left, live, fresh = io / queued_lease, io / live_lease, io / ("f" * 32)
            assert left.is_dir()  # the leak this sweeps (the test can fail)
            assert live.is_dir()
            fresh.mkdir(mode=0o700)
            aged = time.time() - wait_s - STALE_IO_MARGIN_S - 5
            for path in (left, live):
                os.utime(path, (aged, aged))
            assert wait_until(lambda: not left.exists(), 10), sup.log()  # reaper: every 0.5 s
            assert f"lease {queued_lease}: removed its FIFO directory" in sup.log()
            time.sleep(1.0)  # two more passes
            assert live.is_dir()
            assert fresh.is_dir()
            holder.send_signal(signal.SIGTERM)
            holder.wait(30)
            assert wait_until(lambda: not live.exists(), 10), sup.log()  # removed with its lease
            fresh.rmdir()
        finally:
            holder.kill()  # a failed check leaves no sandbox running behind it
            holder.wait(30)


def _queued_lease(sup: SupervisorProcess) -> str:
    for line in sup.log().splitlines():
        if "waiting for capacity" in line:
            return line.split("lease ", 1)[1].split(":", 1)[0]
    raise AssertionError(sup.log())


# -- batches --------------------------------------------------------------------------------------


def _jobs_file(path: Path, label: str, count: int, script: str) -> None:
    lines = []
    for i in range(count):
        job: dict[str, Any] = {
            "id": i,
            "image": "sbxkit-test/busybox:latest",
            "command": ["sh", "-c", script.format(i=i)],
            "labels": {"sbxkit-test.batch": label},
            "limits": {
                "cpus": 1,
                "memory_bytes": 64 * MiB,
                "pids": 64,
                "output_bytes": MiB,
                "timeout_s": 60,
            },
        }
        lines.append(json.dumps(job))
    path.write_text("\n".join(lines) + "\n")


def test_two_batches_at_once_both_finish_every_job_running_8_at_a_time(
    witness: Witness, tmp_path: Path
) -> None:
    labels = [unique("batch-a"), unique("batch-b")]
    procs = []
    for n, label in enumerate(labels):
        _jobs_file(tmp_path / f"jobs{n}.jsonl", label, 10, "sleep 3; echo {i}")
        procs.append(
            cli(
                "batch",
                str(tmp_path / f"jobs{n}.jsonl"),
                "--parallel",
                "8",
                "--out",
                str(tmp_path / f"out{n}.jsonl"),
                "--socket",
                witness.socket_path,
            )
        )
    most = {label: 0 for label in labels}
    while any(p.poll() is None for p in procs):
        for label in labels:
            running = witness.containers(label=f"sbxkit-test.batch={label}")
            most[label] = max(most[label], sum(c.get("State") == "running" for c in running))
        time.sleep(0.1)
    for n, proc in enumerate(procs):
        _, err = proc.communicate()
        assert proc.returncode == 0, err.decode(errors="replace")[-600:]
        lines = [json.loads(line) for line in (tmp_path / f"out{n}.jsonl").read_text().splitlines()]
        assert sorted(line["id"] for line in lines) == list(range(10))
        assert all(line["status"] == "exited" and line["exit_code"] == 0 for line in lines)
        assert all(line["stdout"] == f"{line['id']}\n" for line in lines)
    # cpus: 1 jobs on a 2-core host: CPU quotas are ceilings, not reservations.
    assert most == {label: 8 for label in labels}, most
