"""The runtime a sandbox runs under when its spec names none (issue 46, item 3), as the daemon's
own inspect says: crun on a Docker daemon whose default is runc and that registers crun (its
container setup costs half runc's CPU per job), runc below crun's fsize floor, and an explicit
crun under that floor refused by name before any container exists.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._model.runtimes import CRUN_MIN_FSIZE
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from tests.engine.helpers import containers_with_marker, creates_during, spec, unique, wait_until
from tests.engine.runtimes import planned_default_runtime
from tests.witness import Witness

SMALL_FSIZE = 4096
"""A grant's small ``max_bytes`` (tightened into the fsize ceiling): crun cannot start under it."""


def inspected_runtime(witness: Witness, container_id: str) -> str:
    return str(witness.get(f"/containers/{container_id}/json")["HostConfig"]["Runtime"])


@pytest.fixture(autouse=True)
def main_daemon_registers_crun(witness: Witness) -> None:
    """What this module proves needs a runc-default Docker daemon that registers crun (the
    main test daemon): anything else fails it, never skips."""
    assert planned_default_runtime(witness) == "crun", witness.get("/info")["Runtimes"]


async def test_a_session_that_names_no_runtime_runs_under_crun(
    busybox: str, engine: Engine, witness: Witness
) -> None:
    async with open_sandbox(spec(busybox, "unused"), engine=engine) as sandbox:
        assert inspected_runtime(witness, sandbox.container_id) == "crun"
        done = await sandbox.exec(["sh", "-c", "echo ran"])
    assert done.ok, done
    assert done.stdout == b"ran\n"


async def test_a_one_shot_run_that_names_no_runtime_runs_under_crun(
    busybox: str, engine: Engine, witness: Witness
) -> None:
    marker = unique("crundefault")
    seen: list[str] = []

    async def watch() -> None:
        for _ in range(200):
            found = await trio.to_thread.run_sync(containers_with_marker, witness, marker)
            if found:
                seen.append(
                    await trio.to_thread.run_sync(inspected_runtime, witness, found[0]["Id"])
                )
                return
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        result = await run(spec(busybox, f"echo {marker}; sleep 2"), engine=engine)
    assert result.exit_code == 0, result
    assert seen == ["crun"]


async def test_an_fsize_under_crun_s_floor_runs_under_runc_and_holds(
    busybox: str, engine: Engine, witness: Witness
) -> None:
    script = (
        f"head -c {SMALL_FSIZE} /dev/zero > /tmp/fits && echo fits; "
        f"head -c {SMALL_FSIZE + 1} /dev/zero > /tmp/over && echo over"
    )
    session = spec(busybox, "unused", fsize_bytes=SMALL_FSIZE)
    async with open_sandbox(session, engine=engine) as sandbox:
        assert inspected_runtime(witness, sandbox.container_id) == "runc"
        done = await sandbox.exec(["sh", "-c", script])
    assert b"fits" in done.stdout, done
    assert b"over" not in done.stdout, done


async def test_the_floor_itself_runs_under_crun(
    busybox: str, engine: Engine, witness: Witness
) -> None:
    async with open_sandbox(
        spec(busybox, "unused", fsize_bytes=CRUN_MIN_FSIZE), engine=engine
    ) as sandbox:
        assert inspected_runtime(witness, sandbox.container_id) == "crun"
        done = await sandbox.exec(["true"])
    assert done.ok, done


async def test_runc_named_stays_the_opt_out(busybox: str, engine: Engine, witness: Witness) -> None:
    async with open_sandbox(spec(busybox, "unused", runtime="runc"), engine=engine) as sandbox:
        assert inspected_runtime(witness, sandbox.container_id) == "runc"


async def test_explicit_crun_under_the_floor_is_refused_before_any_container(
    busybox: str, engine: Engine, witness: Witness
) -> None:
    since = time.time()
    with pytest.raises(SpecError) as caught:
        await run(spec(busybox, "true", runtime="crun", fsize_bytes=SMALL_FSIZE), engine=engine)
    assert caught.value.field == "limits.fsize_bytes"
    assert f"{SMALL_FSIZE} is under crun's floor of {CRUN_MIN_FSIZE} bytes" in caught.value.rule
    assert creates_during(witness, since) == []


def test_sbxkit_run_plans_the_same_runtime(busybox: str, witness: Witness) -> None:
    """The CLI plans through the same rule: its one-shot run's container is crun's, and one
    with ``--fsize 4k`` runc's."""
    for fsize, expected in (("64m", "crun"), ("4k", "runc")):
        marker = unique("crundefcli")
        argv = [sys.executable, "-m", "sbxkit", "run", "--socket", witness.socket_path]
        argv += ["--cpus", "0.5", "--memory", "64m", "--pids", "32", "--timeout", "20"]
        argv += ["--fsize", fsize, busybox, "sh", "-c", f"echo {marker}; sleep 3"]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
            found: list[dict[str, object]] = []

            def seen(marker: str = marker, found: list[dict[str, object]] = found) -> bool:
                found[:] = containers_with_marker(witness, marker)
                return bool(found)

            assert wait_until(seen, 15), child
            runtime = inspected_runtime(witness, str(found[0]["Id"]))
            out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        assert marker.encode() in out
        assert runtime == expected, (fsize, runtime)
