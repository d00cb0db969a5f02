"""``sbxkit pools list | end SHAPE | end --all`` (issue 25): the supervisor's held pools, seen
and ended from the command line. Parked containers are proven gone (or still parked) through
the witness; a claimed run is never cut short by its pool's end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.cli_paths import CliPath
from tests.engine.helpers import container_exists, runs_marker, unique, wait_until
from tests.engine.test_held_pool import cli, parked
from tests.supervision import running_supervisor
from tests.witness import Witness


@pytest.fixture(autouse=True)
def _no_auto_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command here talks to the supervisor the test started, never a detached one."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")


def pool_lines(state_dir: Path) -> dict[str, str]:
    """``sbxkit pools list``: image → its line (each test's pools have distinct images)."""
    proc = cli(state_dir, "pools", "list")
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.decode().splitlines()
    assert header.split() == ["SHAPE", "SIZE", "PARKED", "STARTING", "CLAIMED", "IDLE", "IMAGE"]
    return {row.split()[6]: row for row in rows}


def start_pool(state_dir: Path, image: str, label: str, size: int) -> None:
    run = cli(state_dir, "run", "--pool", str(size), "--label", f"{label}=1", image, "--", "true")
    assert run.returncode == 0, run.stderr


def test_pools_are_listed_and_ended_one_shape_or_all(
    witness: Witness, state_dir: Path, busybox: str, python_image: str, cli_handoff: CliPath
) -> None:
    small, large = unique("pool-a"), unique("pool-b")
    with running_supervisor(state_dir, "--persistent") as sup:
        start_pool(state_dir, busybox, small, 2)
        start_pool(state_dir, python_image, large, 1)
        assert wait_until(lambda: len(parked(witness, small)) == 2, 30.0), sup.log()
        assert wait_until(lambda: len(parked(witness, large)) == 1, 30.0), sup.log()

        lines = pool_lines(state_dir)
        assert set(lines) == {busybox, python_image}
        shape, size, parked_count, _, claimed, *_ = lines[busybox].split()
        assert (len(shape), size, parked_count, claimed) == (12, "2", "2", "0")

        ended = cli(state_dir, "pools", "end", shape)
        assert ended.returncode == 0, ended.stderr
        assert ended.stdout.decode() == f"ended pool {shape} ({busybox}): 2 parked removed\n"
        assert parked(witness, small) == []  # removed before the command returned
        assert len(parked(witness, large)) == 1  # another shape's pool is left alone
        assert set(pool_lines(state_dir)) == {python_image}

        everything = cli(state_dir, "pools", "end", "--all")
        assert everything.returncode == 0, everything.stderr
        assert everything.stdout.decode().startswith("ended pool ")
        assert parked(witness, large) == []
        assert cli(state_dir, "pools", "list").stdout == b"no pools are held\n"
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), b"SHAPE: name one pool's shape"),
        (("abc", "--all"), b"SHAPE: name one pool's shape"),
        (("not-hex",), b"a shape is hex digits"),
        (("0123",), b"no held pool has a shape starting with '0123'"),
    ],
)
def test_ending_what_is_not_one_pool_is_refused(
    state_dir: Path, args: tuple[str, ...], says: bytes
) -> None:
    with running_supervisor(state_dir, "--persistent"):
        proc = cli(state_dir, "pools", "end", *args)
    assert proc.returncode == 2, proc
    assert says in proc.stderr


def test_with_no_supervisor_no_pool_is_held_and_none_is_launched(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    proc = cli(state_dir, "pools", "list")
    assert (proc.returncode, proc.stdout) == (0, b"no pools are held\n")
    assert list(state_dir.iterdir()) == []  # no socket: nothing was launched


def test_ending_a_pool_leaves_its_claimed_run_alone(
    witness: Witness, state_dir: Path, busybox: str, cli_handoff: CliPath
) -> None:
    label = unique("pool-claimed")
    with running_supervisor(state_dir, "--persistent") as sup:
        start_pool(state_dir, busybox, label, 1)
        assert wait_until(lambda: len(parked(witness, label)) == 1, 30.0), sup.log()
        [waiting] = parked(witness, label)
        env = {**os.environ, "SBXKIT_STATE_DIR": str(state_dir)}
        env.pop("SBXKIT_SUPERVISOR", None)
        flags = ["--pool", "1", "--label", f"{label}=1", "--json"]
        payload = ["sh", "-c", "sleep 8 && echo done"]
        claimer = subprocess.Popen(
            [sys.executable, "-m", "sbxkit", "run", *flags, busybox, "--", *payload],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

        try:  # claimed: the parked shell has exec'd the payload
            assert wait_until(lambda: runs_marker(witness, waiting["Id"], "sleep 8"), 15.0)
            ended = cli(state_dir, "pools", "end", "--all")
            assert ended.returncode == 0, ended.stderr
            assert container_exists(witness, waiting["Id"])  # still running its claim
            out, err = claimer.communicate(timeout=60)
        finally:
            if claimer.poll() is None:
                claimer.kill()
                claimer.wait()
        assert claimer.returncode == 0, err
        doc = json.loads(out)
        assert (doc["pooled"], doc["container_id"], doc["stdout"]) == (
            True,
            waiting["Id"],
            "done\n",
        )
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
