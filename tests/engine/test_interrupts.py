"""Ctrl-C at the public boundary, against the real engine: ``trio.run(sbxkit.run, …)`` raises a
plain ``KeyboardInterrupt`` after the container is gone; a repeated Ctrl-C on ``sbxkit run`` and
``sbxkit batch`` exits 130 with no traceback, after cleanup. The witness proves the removal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.engine.cli_paths import CliPath
from tests.engine.helpers import BASE_LIMITS, SIGINT_AT_DEFAULT, piped, unique, wait_until
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"


def running(witness: Witness, label: str, count: int = 1) -> bool:
    found = witness.containers(label=f"{TEST_LABEL}={label}")
    return sum(1 for c in found if c.get("State") == "running") >= count


def interrupt(proc: subprocess.Popen[bytes], times: int) -> tuple[bytes, bytes]:
    try:
        for _ in range(times):
            proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_in_trio_run_of_sbxkit_run_is_a_plain_keyboard_interrupt_after_removal(
    witness: Witness, busybox: str
) -> None:
    label = unique("ki")
    script = SIGINT_AT_DEFAULT + textwrap.dedent(
        f"""
        import trio, sbxkit
        spec = sbxkit.SandboxSpec(
            image={busybox!r}, command=["sleep", "60"], labels={{{TEST_LABEL!r}: {label!r}}},
            limits=sbxkit.Limits(**{BASE_LIMITS!r}),
        )
        try:
            trio.run(sbxkit.run, spec)
        except BaseException as exc:
            print(type(exc).__name__, flush=True)
        """
    )
    proc = piped([sys.executable, "-c", script])
    try:
        assert wait_until(lambda: running(witness, label), 30), proc.poll()
    finally:
        stdout, stderr = interrupt(proc, 1)
    assert stdout.decode().strip() == "KeyboardInterrupt", stderr.decode()
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []  # gone before it returned


def test_a_repeated_ctrl_c_on_sbxkit_run_exits_130_quietly_after_cleanup(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    label = unique("ki")
    proc = piped(
        [
            sys.executable,
            "-m",
            "sbxkit",
            "run",
            "--memory",
            "64m",
            "--timeout",
            "60",
            "--label",
            f"{TEST_LABEL}={label}",
            "--socket",
            witness.socket_path,
            busybox,
            "--",
            "sleep",
            "60",
        ]
    )
    try:
        assert wait_until(lambda: running(witness, label), 30), proc.poll()
    finally:
        _, stderr = interrupt(proc, 2)
    assert proc.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr, stderr.decode()
    assert b"interrupted by SIGINT" in stderr
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []


def test_a_repeated_ctrl_c_on_sbxkit_batch_exits_130_quietly_after_cleanup(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    label = unique("ki")
    jobs = tmp_path / "jobs.jsonl"
    lines = [
        {
            "id": i,
            "image": busybox,
            "command": ["sleep", "60"],
            "limits": {**BASE_LIMITS, "timeout_s": 60},
            "labels": {TEST_LABEL: label},
        }
        for i in range(2)
    ]
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    proc = piped(
        [
            sys.executable,
            "-m",
            "sbxkit",
            "batch",
            str(jobs),
            "--out",
            str(out),
            "--parallel",
            "2",
            "--socket",
            witness.socket_path,
        ]
    )
    try:
        assert wait_until(lambda: running(witness, label, 2), 30), proc.poll()
    finally:
        _, stderr = interrupt(proc, 2)
    assert proc.returncode == 130, stderr.decode()
    assert b"Traceback" not in stderr, stderr.decode()
    assert b"every sandbox in flight was removed" in stderr
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []
