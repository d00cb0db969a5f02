"""Chaos: callers and supervisors SIGKILLed at random; no run is lost to a supervisor crash.

Bounded and seeded (``SBXKIT_CHAOS_SEED``, printed): ``CALLERS`` caller processes
(tests/engine/chaos_caller.py) each run ``RUNS_EACH`` supervised one-shot runs in a row — a
random sleep, a marker on stdout, a random exit status — against one state directory, whose
supervisor they launch themselves, as in production. Meanwhile the test SIGKILLs, every 1.5-3 s,
the running supervisor (the callers launch the next one and re-adopt their leases), or a
caller, or both at once (the caller dies in the gap: its lease waits out the grace period).
Then:

- every run of a caller that was not killed, and every run a killed caller finished before its
  death, returned its payload's own result: none ends in a cleanup error (exit 74) because a
  supervisor died under it — not even one whose create a kill interrupted before the daemon
  saw it (it runs afresh under a new lease: ``CreateInterrupted``);
- once the grace period of the leases the killed callers left behind has passed, no container
  is left (the witness counts them), and no lease record but the tombstones of such
  interrupted creates: an operator's ``leases retire`` (which checks the daemon for a container
  by the lease's label and name first) clears each, as docs/operations.md says to.

Measured here (2 cores, shared with other suites): see the commit message.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.supervision import auto_launched_supervisors, supervisor_pids, wait_gone
from tests.witness import Witness

CALLERS = 8
RUNS_EACH = 8
CALLER_KILLS = 3
GRACE_S = 8
SEED = int(os.environ.get("SBXKIT_CHAOS_SEED", "22"))
CALLER = Path(__file__).with_name("chaos_caller.py")
ROOT = Path(__file__).parents[2]


def plan(rng: random.Random, state_dir: Path, image: str) -> dict[str, list[dict[str, Any]]]:
    """Per caller, its runs: (id, script, expected exit status, expected stdout)."""
    plans: dict[str, list[dict[str, Any]]] = {}
    for caller in range(CALLERS):
        runs = []
        for index in range(RUNS_EACH):
            run_id = f"c{caller}r{index}"
            code = rng.randrange(0, 10)
            pause = rng.choice(["0.2", "0.5", "1", "1.5", "2"])
            script = f"sleep {pause}; echo {run_id}; exit {code}"
            runs.append({"id": run_id, "script": script, "code": code})
        plans[f"c{caller}"] = runs
    return plans


@pytest.fixture
def chaos_supervisor(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    command = [sys.executable, "-m", "sbxkit.supervisor", "--idle-exit", "2"]
    command += ["--reaper-interval", "0.5", "--adopt-grace", str(GRACE_S)]
    monkeypatch.setenv("SBXKIT_SUPERVISOR", shlex.join(command))
    return state_dir


async def test_callers_and_supervisors_killed_at_random_lose_no_run_and_leak_nothing(
    chaos_supervisor: Path, witness: Witness, busybox: str
) -> None:
    state_dir = chaos_supervisor
    rng = random.Random(SEED)
    print(f"\nchaos seed {SEED}")
    plans = plan(rng, state_dir, busybox)
    lines: dict[str, list[dict[str, Any]]] = {name: [] for name in plans}
    processes: dict[str, trio.Process] = {}
    killed_callers: set[str] = set()
    supervisor_kills = 0
    started = time.monotonic()

    async def caller(name: str, nursery: trio.Nursery) -> None:
        runs = [{"id": r["id"], "script": r["script"]} for r in plans[name]]
        argv = [sys.executable, str(CALLER), json.dumps(
            {"state_dir": str(state_dir), "image": busybox, "runs": runs}
        )]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, env=env)
        processes[name] = process
        assert process.stdout is not None
        buffer = b""
        async with process.stdout:
            while chunk := await process.stdout.receive_some():
                buffer += chunk
                *done, buffer = buffer.split(b"\n")
                lines[name].extend(json.loads(line) for line in done if line.strip())
        await process.wait()

    async def chaos(done: trio.Event) -> None:
        nonlocal supervisor_kills
        while not done.is_set():
            await trio.sleep(rng.uniform(1.5, 3.0))
            live = [n for n, p in processes.items() if p.returncode is None]
            if done.is_set() or not live:
                return
            draw = rng.random()
            kill_caller = len(killed_callers) < CALLER_KILLS and draw < 0.4
            kill_supervisor = not kill_caller or draw < 0.2  # < 0.2: both, the caller last
            pids = supervisor_pids(state_dir) if kill_supervisor else []
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            if pids:
                supervisor_kills += 1
                print(f"  {time.monotonic() - started:5.1f} s: killed supervisor {pids}")
            if kill_caller:
                victim = rng.choice(sorted(live))
                killed_callers.add(victim)
                processes[victim].send_signal(signal.SIGKILL)
                print(f"  {time.monotonic() - started:5.1f} s: killed caller {victim}")
            if pids:
                await trio.to_thread.run_sync(wait_gone, pids)

    with auto_launched_supervisors(state_dir):
        callers_done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(chaos, callers_done)
            async with trio.open_nursery() as callers:
                for name in plans:
                    callers.start_soon(caller, name, callers)
            callers_done.set()
            nursery.cancel_scope.cancel()
        ran_s = time.monotonic() - started

        # Every finished run is its payload's own result.
        finished = 0
        for name, runs in plans.items():
            by_id = {line["id"]: line for line in lines[name]}
            for expected in runs:
                line = by_id.get(expected["id"])
                if line is None:
                    assert name in killed_callers, f"{name} was not killed: {expected['id']} lost"
                    continue
                assert "error" not in line, f"{expected['id']}: {line}"
                assert line["status"] == "exited", line
                assert line["exit_code"] == expected["code"], line
                assert line["stdout"] == f"{expected['id']}\n", line
                finished += 1
        assert supervisor_kills >= 3, f"only {supervisor_kills} supervisor kills: not chaos"

        # What the killed callers left: held for the grace period, then removed.
        if not supervisor_pids(state_dir):  # someone must recover it: an operator's request
            await trio.to_thread.run_sync(_recover, state_dir)
        deadline = trio.current_time() + GRACE_S + 30
        while _unresolved(state_dir) or witness.sbxkit_containers():
            if trio.current_time() > deadline:
                left = [p.stem for p in state_dir.glob("*.lease")]
                raise AssertionError(
                    f"left: records {left}, containers "
                    f"{[c['Id'][:12] for c in witness.sbxkit_containers()]}"
                )
            await trio.sleep(0.25)
        tombstones = sorted(p.stem for p in state_dir.glob("*.lease"))
        for lease in tombstones:  # no container carries them: the operator's retire checks too
            await trio.to_thread.run_sync(_retire, state_dir, lease)
        assert not list(state_dir.glob("*.lease"))
    log = (state_dir / "supervisor.log").read_text(errors="replace")
    readopted = log.count("re-adopted by its caller")
    print(
        f"chaos: {finished} runs finished in {ran_s:.1f} s, {supervisor_kills} supervisor and "
        f"{len(killed_callers)} caller kills, {readopted} re-adoptions, "
        f"{log.count('expired unclaimed')} expired unclaimed, {len(tombstones)} tombstone(s) "
        f"retired; clean "
        f"{time.monotonic() - started:.1f} s after the start"
    )
    assert readopted >= 1, "no lease was re-adopted: the kills hit no running sandbox"


def _unresolved(state_dir: Path) -> list[str]:
    """The records that are not uncertain tombstones (recovery still owes them a removal)."""
    return [
        path.stem
        for path in state_dir.glob("*.lease")
        if json.loads(path.read_text()).get("state") != "uncertain"
    ]


def _retire(state_dir: Path, lease: str) -> None:
    leases = [sys.executable, "-m", "sbxkit", "leases", "--state-dir", str(state_dir)]
    done = subprocess.run(
        [*leases, "retire", lease, "--confirm"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"retire {lease}: {done.stdout}{done.stderr}"


def _recover(state_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "sbxkit", "leases", "--state-dir", str(state_dir), "recover"],
        check=True,
        capture_output=True,
        timeout=60,
    )
