"""Pools the supervisor holds (issue 13): parked containers that outlive the process that asked.

Proven on the real daemon, each through the independent witness:
- successive ``sbxkit run --pool`` processes claim what an earlier one caused to be parked;
- a parked container is an ordinary lease: journaled while parked, removed at the idle limit,
  when the pool is ended, when the supervisor is stopped (SIGTERM), recovered after SIGKILL,
  and its capacity goes to a caller that would otherwise wait;
- a claimer killed mid-run leaves nothing; claims never wait for a refill;
- the command and env reach the container only at the claim (never the create body or the
  journal).
The one-shot contract itself (caps, stdin, timeouts, OOM, verdicts) runs on the held path
through the ``oneshot`` fixture (tests/engine/oneshot_paths.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._lifecycle.owner import CreateRequest, InProcessOwner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import RunResult
from sbxkit._model.spec import MiB, SandboxSpec
from sbxkit._model.uids import HOST_UIDS
from sbxkit._plan.plan import make_plan
from sbxkit.engine.client import Engine
from sbxkit.errors import PoolUnavailable, SpecError
from sbxkit.pool.held import HeldPool, PooledBackend
from tests.engine.cli_paths import CliPath
from tests.engine.helpers import parked_command, spec, still_parked, unique, wait_until
from tests.supervision import running_supervisor
from tests.witness import Witness

TWO_SLOTS = ("--memory-budget", str(150 * MiB))  # two 64 MiB sandboxes fit, three do not


@pytest.fixture(autouse=True)
def _no_auto_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs here talk to the supervisor the test started, never a detached one."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")


def backend_for(engine: Engine, state_dir: Path, **terms: Any) -> PooledBackend:
    owner = SupervisedOwner(engine, state_dir=state_dir, close_timeout_s=30.0)
    return PooledBackend(pool=HeldPool(**{"size": 1, **terms}), engine=engine, owner=owner)


def parked(witness: Witness, label: str) -> list[dict[str, Any]]:
    """Running containers of the test's shape whose main process is still the parked shell."""
    return [
        c
        for c in witness.containers(label=label)
        if c.get("State") == "running"
        and parked_command(c.get("Command", ""))
        and still_parked(c["Id"])
    ]


def shaped(image: str, script: str, label: str, **limits: Any) -> SandboxSpec:
    """``sh -c script`` carrying ``label`` (the witness finds the test's containers by it)."""
    return msgspec.structs.replace(spec(image, script, **limits), labels={label: "1"})


async def until(predicate: Callable[[], bool], seconds: float = 30.0) -> bool:
    return await trio.to_thread.run_sync(lambda: wait_until(predicate, seconds))


def journal_bytes(state_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in state_dir.iterdir() if p.is_file())


def lease_files(state_dir: Path) -> list[Path]:
    return list(state_dir.glob("*.lease")) if state_dir.exists() else []


def cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "SBXKIT_STATE_DIR": str(state_dir)}
    env.pop("SBXKIT_SUPERVISOR", None)
    return subprocess.run(
        [sys.executable, "-m", "sbxkit", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        timeout=120,
    )


# -- successive processes --------------------------------------------------------------------------


def test_successive_cli_runs_claim_what_an_earlier_run_had_parked(
    witness: Witness, state_dir: Path, busybox: str, cli_handoff: CliPath
) -> None:
    label = unique("held")
    flags = ["run", "--json", "--pool", "1", "--label", f"{label}=1", busybox, "--"]
    with running_supervisor(state_dir, "--persistent") as sup:
        first = cli(state_dir, *flags, "echo", "one")
        assert first.returncode == 0, first.stderr
        first_doc = json.loads(first.stdout)
        # It starts the pool and waits for the pool's first park (no second container).
        assert (first_doc["pooled"], first_doc["stdout"]) == (True, "one\n")

        assert wait_until(lambda: len(parked(witness, label)) == 1, 30.0), sup.log()
        [waiting] = parked(witness, label)
        journaled = {p.stem for p in lease_files(state_dir)}
        assert waiting["Labels"]["sbxkit.lease"] in journaled  # an ordinary lease, journaled
        report = cli(state_dir, "leases", "recover")
        assert b"pools: 1 holding 1 parked" in report.stdout + report.stderr, report

        second = cli(state_dir, *flags, "sh", "-c", 'echo "two $0"; exit 3', "x")
        assert second.returncode == 3, second.stderr  # the payload's own exit status
        doc = json.loads(second.stdout)
        assert doc["pooled"] is True
        assert doc["container_id"] == waiting["Id"]  # the very container that was parked
        assert (doc["status"], doc["exit_code"], doc["stdout"]) == ("exited", 3, "two x\n")

        # Its replacement is parked after the claimed run ended, off the run's path.
        assert wait_until(lambda: len(parked(witness, label)) == 1, 30.0), sup.log()
        assert parked(witness, label)[0]["Id"] != waiting["Id"]
    # SIGTERM (running_supervisor's stop): the parked replacement is removed on the way out.
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    assert "removing parked containers" in sup.log()
    assert not lease_files(state_dir)


# -- an ordinary lease -----------------------------------------------------------------------------


async def test_a_parked_container_idles_out_and_its_pool_ends(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    label = unique("held")
    sandbox = shaped(busybox, "true", label)
    with running_supervisor(state_dir) as sup:  # not persistent: exits once idle
        backend = backend_for(engine, state_dir, idle_ttl_s=1.5)
        assert await backend.warm(sandbox) == 1
        assert len(parked(witness, label)) == 1
        assert await until(lambda: sup.proc.poll() is not None), "an idle pool kept it alive"
        assert "no claim for 1.5 s; ended" in sup.log()
    assert witness.wait_until_no_sbxkit_containers(seconds=5.0) == []
    assert not lease_files(state_dir)


async def test_ending_a_pool_removes_its_parked_containers_before_returning(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    label = unique("held")
    sandbox = shaped(busybox, "true", label)
    with running_supervisor(state_dir, "--persistent"):
        backend = backend_for(engine, state_dir, size=2)
        await backend.warm(sandbox)
        assert await until(lambda: len(parked(witness, label)) == 2)
        await backend.end(sandbox)
        assert witness.containers(label=label) == []  # gone when end returned, not later
        assert not lease_files(state_dir)


async def test_a_killed_supervisors_parked_containers_are_recovered(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    label = unique("held")
    sandbox = shaped(busybox, "true", label)
    with running_supervisor(state_dir, "--persistent") as sup:
        await backend_for(engine, state_dir).warm(sandbox)
        [waiting] = parked(witness, label)
        sup.kill()  # SIGKILL: nothing of the supervisor runs
        assert witness.containers(label=label) != []  # still there, and journaled
        assert waiting["Labels"]["sbxkit.lease"] in {p.stem for p in lease_files(state_dir)}
    with running_supervisor(state_dir, "--persistent") as again:  # recovery at start
        assert await until(lambda: witness.containers(label=label) == []), again.log()
        assert await until(lambda: not lease_files(state_dir), 10.0)


async def test_a_waiting_caller_takes_the_capacity_parked_containers_hold(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """Two parked containers fill a two-sandbox budget; a cold run of another shape does not
    wait for their idle limit (300 s) but gets the capacity at once (one is removed)."""
    label = unique("held")
    with running_supervisor(state_dir, "--persistent", *TWO_SLOTS, "--admission-timeout", "20"):
        backend = backend_for(engine, state_dir, size=2)
        pooled = shaped(busybox, "true", label)
        await backend.warm(pooled)
        assert await until(lambda: len(parked(witness, label)) == 2)
        other = shaped(busybox, "echo other", unique("other"), timeout_s=5.0)
        owner = SupervisedOwner(engine, state_dir=state_dir, close_timeout_s=30.0)
        with trio.fail_after(15):
            result = await run(other, engine=engine, owner=owner)
        assert (result.status, result.stdout) == ("exited", b"other\n")
        assert len(parked(witness, label)) <= 1
        await backend.end(pooled)


# -- claims ----------------------------------------------------------------------------------------


def test_a_claimer_killed_mid_run_leaves_nothing(
    witness: Witness, state_dir: Path, busybox: str, cli_handoff: CliPath
) -> None:
    label = unique("held")
    flags = ["run", "--pool", "1", "--label", f"{label}=1", busybox, "--"]
    with running_supervisor(state_dir, "--persistent") as sup:
        assert cli(state_dir, *flags, "true").returncode == 0  # starts the pool
        assert wait_until(lambda: len(parked(witness, label)) == 1, 30.0), sup.log()
        [waiting] = parked(witness, label)
        env = {**os.environ, "SBXKIT_STATE_DIR": str(state_dir)}
        env.pop("SBXKIT_SUPERVISOR", None)
        claimer = subprocess.Popen(
            [sys.executable, "-m", "sbxkit", *flags, "sleep", "60"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )

        def claimed() -> bool:  # the parked shell has exec'd the claimed payload
            top = witness.get(f"/containers/{waiting['Id']}/top")
            return any("sleep 60" in " ".join(row) for row in top.get("Processes") or [])

        assert wait_until(claimed, 30.0)
        claimer.send_signal(signal.SIGKILL)
        claimer.wait(10)

        def gone() -> bool:
            return all(c["Id"] != waiting["Id"] for c in witness.containers(label=label))

        assert wait_until(gone, 15.0), sup.log()


async def test_two_claims_at_once_on_a_pool_of_one_one_pooled_one_cold(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """A claim never waits for a refill: with one parked, the second of two simultaneous
    runs goes cold at once."""
    label = unique("held")
    sandbox = shaped(busybox, "sleep 0.5; echo done", label)
    with running_supervisor(state_dir, "--persistent"):
        backend = backend_for(engine, state_dir, wait_for_removal=True)
        await backend.warm(sandbox)
        results: list[RunResult] = []

        async def one() -> None:
            results.append(await backend.run_once(sandbox))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
        await backend.end(sandbox)
    assert sorted(r.pooled for r in results) == [False, True]
    assert [r.stdout for r in results] == [b"done\n", b"done\n"]


async def test_claims_on_an_empty_pool_wait_for_its_parks_under_way_not_more(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """Three runs at once on a new pool of two: two wait for the two parks under way (each
    further along than a cold create), the third finds nothing to wait for and goes cold."""
    label = unique("held")
    sandbox = shaped(busybox, "echo done", label)
    with running_supervisor(state_dir, "--persistent"):
        backend = backend_for(engine, state_dir, size=2, wait_for_removal=True, refill=False)
        results: list[RunResult] = []

        async def one() -> None:
            results.append(await backend.run_once(sandbox))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
        await backend.end(sandbox)
    assert sorted(r.pooled for r in results) == [False, True, True]
    assert [r.stdout for r in results] == [b"done\n"] * 3


async def test_the_command_and_env_reach_the_container_only_at_the_claim(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    secret = f"secret-{os.urandom(6).hex()}"
    label = unique("held")
    sandbox = shaped(busybox, 'echo "$TOKEN"', label)
    sandbox = msgspec.structs.replace(sandbox, env={"TOKEN": secret})
    with running_supervisor(state_dir, "--persistent"):
        backend = backend_for(engine, state_dir, wait_for_removal=True)
        await backend.warm(sandbox)
        [waiting] = parked(witness, label)
        inspected = witness.get(f"/containers/{waiting['Id']}/json")
        result = await backend.run_once(sandbox)
        assert result.pooled
        assert result.stdout == f"{secret}\n".encode()
        journal = journal_bytes(state_dir)
        await backend.end(sandbox)
    assert secret not in json.dumps(inspected)  # neither Cmd, Env nor anything else
    assert secret.encode() not in journal


async def test_a_held_pool_needs_the_supervisor_and_sane_terms(engine: Engine) -> None:
    with pytest.raises(SpecError, match="pool: a held pool lives in the supervisor"):
        PooledBackend(pool=HeldPool(size=1), owner=InProcessOwner(engine))
    with pytest.raises(SpecError, match=r"pool\.size"):
        PooledBackend(pool=HeldPool(size=0))
    with pytest.raises(SpecError, match=r"pool\.idle_ttl"):
        PooledBackend(pool=HeldPool(size=1, idle_ttl_s=float("nan")))


async def test_ending_a_pool_whose_park_waits_for_a_launch_slot_gives_the_slot_back(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    """The one launch slot is held by a created, never started container; a pool's park waits
    for it; the pool is ended; the slot comes free. The park must hand the slot back without
    creating: a leaked slot would leave every later create waiting."""
    with running_supervisor(state_dir, "--persistent", "--max-launching", "1") as sup:
        owner = SupervisedOwner(engine, state_dir=state_dir, close_timeout_s=30.0)
        holder = await make_plan(engine, spec(busybox, "true"))
        held = await owner.create(
            CreateRequest(holder.lease, holder.name, holder.body, holder.lifetime_s)
        )
        backend = backend_for(engine, state_dir)
        sandbox = shaped(busybox, "true", unique("held"))
        with pytest.raises(PoolUnavailable, match="nothing parked"):
            await backend.warm(sandbox, wait_s=0.5)  # its park waits for the slot
        await backend.end(sandbox)
        await owner.remove(holder.lease, holder.name, held)  # the slot comes free
        with trio.fail_after(15):
            result = await run(spec(busybox, "echo after"), engine=engine, owner=owner)
        assert result.stdout == b"after\n", sup.log()
        assert witness.containers(label=sandbox_label(sandbox)) == []


async def test_a_session_starts_from_a_parked_container(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str
) -> None:
    label = unique("held")
    sandbox = shaped(busybox, "true", label, timeout_s=30.0)
    with running_supervisor(state_dir, "--persistent"):
        backend = backend_for(engine, state_dir)
        await backend.warm(sandbox)
        [waiting] = parked(witness, label)
        async with open_sandbox(sandbox, backend=backend) as box:
            assert box.container_id == waiting["Id"]  # claimed, not created
            await box.put_files({"in.txt": b"abc"})
            result = await box.exec(["sh", "-c", "cat /tmp/in.txt; echo; id -u"])
            own = box.user.partition(":")[0]  # the parked container's own uid
            assert (result.status, result.stdout) == ("exited", f"abc\n{own}\n".encode())
            assert int(own) in HOST_UIDS
            listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
            processes = (await box.exec(["sh", "-c", listing])).stdout.decode()
            assert any(line.startswith("sleep ") for line in processes.splitlines())
            # The parked shell exec'd the keep-alive (docker-init's argv still names it).
            assert not any(line.startswith("sh -c nl=") for line in processes.splitlines())
        assert all(c["Id"] != waiting["Id"] for c in witness.containers(label=label))
        await backend.end(sandbox)
    # Served cold: a session with env (its env is the container's, set at create).
    with_env = msgspec.structs.replace(sandbox, env={"K": "v"})
    with running_supervisor(state_dir, "--persistent"):
        backend = backend_for(engine, state_dir)
        await backend.warm(with_env)
        [waiting] = parked(witness, label)
        async with open_sandbox(with_env, backend=backend) as box:
            assert box.container_id != waiting["Id"]
            assert (await box.exec(["sh", "-c", "echo $K"])).stdout == b"v\n"
        await backend.end(with_env)


def sandbox_label(sandbox: SandboxSpec) -> str:
    return next(iter(sandbox.labels))


# -- lifetimes (issue 27, finding 3) -----------------------------------------------------------


def short_margin(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The owner's backstop is a run's time limit plus this margin (120 s by default): a few
    seconds keep these tests short. Negative: the backstop falls before the run's own time
    limit, as it does for a caller that stalled past its limit."""
    monkeypatch.setattr("sbxkit._plan.plan.LIFETIME_MARGIN_S", seconds)
    monkeypatch.setattr("sbxkit.pool.held.LIFETIME_MARGIN_S", seconds)


async def test_a_claimed_run_keeps_its_own_lifetime_however_long_it_was_parked(
    engine: Engine, witness: Witness, state_dir: Path, busybox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen: caller B warmed a pool with idle_ttl 129.9, max_timeout 0.1; caller A (the same
    # shape and parked lifetime) ran sleep 128 with timeout 129 and got killed after 124.9 s,
    # reported as someone else's kill: the parked time had eaten A's lifetime.
    short_margin(monkeypatch, 1.0)
    label = unique("held")
    with running_supervisor(state_dir, "--persistent"):
        warmer = backend_for(engine, state_dir, idle_ttl_s=12.0, max_timeout_s=0.5, refill=False)
        claimer = backend_for(engine, state_dir, idle_ttl_s=3.0, max_timeout_s=9.5, refill=False)
        await warmer.warm(shaped(busybox, "true", label))  # parked lifetime: 12.5 + 1 s
        await trio.sleep(8.0)  # parked 8 s, within the warmer's idle limit
        result = await claimer.run_once(shaped(busybox, "sleep 7; echo done", label, timeout_s=9))
        assert result.pooled
        assert (result.status, result.exit_code, result.stdout) == ("exited", 0, b"done\n")
        await warmer.end(shaped(busybox, "true", label))


@pytest.mark.parametrize("path", ["cold", "held"])
async def test_the_supervisors_own_removal_is_never_reported_as_someone_elses_kill(
    path: str,
    engine: Engine,
    witness: Witness,
    state_dir: Path,
    busybox: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lifetime deadline passes before the run's own time limit (a caller that stalled):
    # the supervisor removes the container, and the run must say that sbxkit did. The deadline
    # (3 s) is 9 s before the run's own limit: CI's Docker 26.1 cell, beside the main suite,
    # once took 2.9 s from the deadline to the result.
    short_margin(monkeypatch, -9.0)
    label = unique("held")
    sandbox = shaped(busybox, "sleep 30", label, timeout_s=12)
    with running_supervisor(state_dir, "--persistent") as sup:
        if path == "cold":
            owner = SupervisedOwner(engine, state_dir=state_dir, close_timeout_s=30.0)
            result = await run(sandbox, engine=engine, owner=owner)
        else:
            backend = backend_for(engine, state_dir, refill=False)
            await backend.warm(sandbox)
            result = await backend.run_once(sandbox)
            assert result.pooled
        assert "lifetime deadline reached" in sup.log()
    assert result.status == "timed_out", result
    assert result.kill_evidence is not None
    assert "lifetime deadline" in result.kill_evidence
    assert result.timings.run_s < 11.0  # ended by the supervisor, before the run's own limit
