"""Issue 12's reproductions against the real daemon: each is refused with exit 2 and a message
naming the field, and the daemon's event stream shows no container created for this test run
in the meantime (not merely one created and removed). A valid run in the same window is the
control: the same event query does see its create."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.cli_paths import CliPath
from tests.engine.helpers import creates_during
from tests.witness import Witness

SMALL = ["--cpus", "0.5", "--memory", "64m", "--pids", "32", "--timeout", "20"]


def sbxkit(*args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable.encode(), b"-m", b"sbxkit", *map(os.fsencode, args)]
    return subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False
    )


CASES: list[tuple[list[str | bytes], bytes]] = [
    (["--user", "4294967294:1"], b"user: ids must be in 1..2147483647"),
    (["--workdir", "/dev/null"], b"workdir: /dev/null is refused"),
    (["--workdir", "/" + "a" * 5000], b"workdir: must be at most 1024 bytes"),
    (["--timeout", "1e300"], b"--timeout: must be in 0.001..2592000"),
    (["--cpus", "١"], b"--cpus: expected a number of ASCII digits"),
    (["--env", b"K=\xff"], b"env['K']: must be valid UTF-8"),
    (["--label", b"k=\xff"], b"--label['k']: must be valid UTF-8"),
]
IMAGES = ["HIDDEN/busybox:1", "busybox:", "a@b@c", "hidden//busybox:1"]


@pytest.mark.parametrize(("flags", "says"), CASES, ids=lambda c: repr(c)[:40])
def test_flag_refused_before_any_container(
    witness: Witness, busybox: str, flags: list[str | bytes], says: bytes, cli_path: CliPath
) -> None:
    cli_path.falls_back("SpecError", "not UTF-8")  # the full path reproduces the refusal
    since = time.time()
    done = sbxkit("run", *SMALL, "--socket", witness.socket_path, *flags, busybox, "true")
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert b"Traceback" not in done.stderr
    assert creates_during(witness, since) == []


@pytest.mark.parametrize("image", IMAGES)
def test_image_refused_before_any_container(
    witness: Witness, image: str, cli_path: CliPath
) -> None:
    cli_path.falls_back("SpecError")
    since = time.time()
    done = sbxkit("run", *SMALL, "--socket", witness.socket_path, image, "true")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(b"sbxkit: error: IMAGE: ")
    assert creates_during(witness, since) == []


def test_non_utf8_argv_refused_before_any_container(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    cli_path.falls_back("not UTF-8")
    since = time.time()
    done = sbxkit("run", *SMALL, "--socket", witness.socket_path, busybox, "echo", b"\xff")
    assert done.returncode == 2, done.stderr
    assert b"CMD[1]: must be valid UTF-8" in done.stderr
    assert creates_during(witness, since) == []


def test_the_event_query_sees_a_valid_runs_create(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    since = time.time()
    done = sbxkit("run", *SMALL, "--socket", witness.socket_path, busybox, "true")
    assert done.returncode == 0, done.stderr
    assert len(creates_during(witness, since)) == 1


def test_batch_special_files_refused_before_any_container(witness: Witness, tmp_path: Path) -> None:
    fifo = tmp_path / "jobs.fifo"
    os.mkfifo(fifo)
    since = time.time()
    for jobs in (fifo, Path("/dev/zero")):
        out = str(tmp_path / "out.jsonl")
        done = sbxkit("batch", str(jobs), "--out", out, "--socket", witness.socket_path)
        assert done.returncode == 2, done.stderr
        assert b"not a regular file" in done.stderr
    assert creates_during(witness, since) == []
