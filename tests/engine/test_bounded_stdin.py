"""A payload's stdin is streamed under the run's time limit, never read whole (issue 12, item 2).

Each case runs ``sbxkit run`` as a real process under a 1 GiB address-space limit (so the old
read-it-all behaviour fails with MemoryError instead of eating the host), and its peak memory
is read from the kernel's accounting of that one child.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.engine.cli_paths import CliPath
from tests.witness import Witness

LIMITS = ["--cpus", "0.5", "--memory", "64m", "--pids", "64", "--max-output", "1m"]
ADDRESS_SPACE = 1024 * 2**20
PEAK_RSS_CEILING_KIB = 150 * 1024
"""A streamed run's client stays far below this; reading 300 MB whole needs twice that."""

MEASURE = (
    "import resource, subprocess, sys\n"
    f"limit = {ADDRESS_SPACE}\n"
    "def cap():\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "done = subprocess.run(sys.argv[1:], preexec_fn=cap, stdin=subprocess.DEVNULL)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(f'peak_kib={peak}', file=sys.stderr)\n"
    "sys.exit(done.returncode)\n"
)


def run_measured(
    witness: Witness, image: str, *args: str, timeout: float = 60
) -> tuple[int, bytes, bytes, int]:
    """``(exit status, stdout, stderr, peak RSS of the sbxkit process in KiB)``."""
    argv = [sys.executable, "-m", "sbxkit", "run", *LIMITS, "--socket", witness.socket_path]
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv, *args[:-1], image, "--", *args[-1].split("\0")],
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    peak = int(done.stderr.rsplit(b"peak_kib=", 1)[1])
    return done.returncode, done.stdout, done.stderr, peak


def command(*argv: str) -> str:
    return "\0".join(argv)


def test_a_large_file_is_streamed_not_read_whole(
    witness: Witness, busybox: str, tmp_path: Path, cli_path: CliPath
) -> None:
    big = tmp_path / "big.bin"
    with big.open("wb") as handle:
        handle.truncate(300 * 2**20)  # 300 MB of zeros, sparse on disk
    status, out, err, peak = run_measured(
        witness, busybox, "--timeout", "60", "--stdin", str(big), command("wc", "-c")
    )
    assert status == 0, err
    assert out.strip() == str(300 * 2**20).encode()
    assert peak < PEAK_RSS_CEILING_KIB, f"peak RSS {peak} KiB"


def test_an_endless_stdin_ends_with_the_time_limit(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    started = time.monotonic()
    status, _, err, peak = run_measured(
        witness,
        busybox,
        "--timeout",
        "3",
        "--stdin",
        "/dev/zero",
        command("sh", "-c", "cat >/dev/null"),
    )
    assert status == 124, err  # timed out, not MemoryError (1) and not a host filling up
    assert b"Traceback" not in err
    assert time.monotonic() - started < 30
    assert peak < PEAK_RSS_CEILING_KIB, f"peak RSS {peak} KiB"


def test_a_payload_that_stops_reading_an_endless_stdin_exits(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    status, out, err, _ = run_measured(
        witness,
        busybox,
        "--timeout",
        "30",
        "--stdin",
        "/dev/zero",
        command("sh", "-c", "head -c 5000000 | wc -c"),
    )
    assert status == 0, err
    assert out.strip() == b"5000000"


def test_a_fifo_without_a_writer_waits_only_the_time_limit(
    witness: Witness, busybox: str, tmp_path: Path, cli_path: CliPath
) -> None:
    cli_path.falls_back("neither a regular file nor a device")  # the full path streams FIFOs
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    status, _, err, _ = run_measured(
        witness, busybox, "--timeout", "3", "--stdin", str(fifo), command("cat"), timeout=40
    )
    assert status == 124, err
    assert time.monotonic() - started < 30


def test_a_fifo_with_a_writer_is_streamed(
    witness: Witness, busybox: str, tmp_path: Path, cli_path: CliPath
) -> None:
    cli_path.falls_back("neither a regular file nor a device")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"open({str(fifo)!r}, 'wb').write(b'through the fifo\\n')"]
    )
    try:
        status, out, err, _ = run_measured(
            witness, busybox, "--timeout", "30", "--stdin", str(fifo), command("cat")
        )
    finally:
        writer.wait(10)
    assert status == 0, err
    assert out == b"through the fifo\n"
