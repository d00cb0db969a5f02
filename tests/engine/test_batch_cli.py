"""``sbxkit batch`` as a real subprocess against the real engine: results, resume, bad input,
interruption, and the progress line on a terminal. What the daemon did is read through the
witness, by this test's label. The one-shot suites run on the cold path and with ``--pool``
(the ``batch_path`` fixture: a pool per shape, docs/pool.md)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ptyprocess
import pytest

from sbxkit._model.spec import MiB
from tests.engine.helpers import unique, wait_until
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"
LIMITS = {
    "cpus": 0.1,
    "memory_bytes": 32 * MiB,
    "pids": 32,
    "output_bytes": MiB,
    "timeout_s": 40,
}


def cli_has_batch() -> bool:
    from sbxkit.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return "batch" in action.choices
    return False


def batch_argv(*args: str) -> list[str]:
    """``python -m sbxkit batch ...`` once the CLI has the subcommand, else the module."""
    if cli_has_batch():
        return [sys.executable, "-m", "sbxkit", "batch", *args]
    return [sys.executable, "-c", "from sbxkit.cli.batch import main; main()", *args]


def job(job_id: Any, image: str, script: str, label: str, **extra: Any) -> str:
    doc = {
        "id": job_id,
        "image": image,
        "command": ["sh", "-c", script],
        "limits": LIMITS,
        "labels": {TEST_LABEL: label},
        **extra,
    }
    return json.dumps(doc)


def write_jobs(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def batch(
    witness: Witness, jobs: Path, out: Path, *options: str, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        batch_argv(str(jobs), "--out", str(out), "--socket", witness.socket_path, *options),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(params=["cold", "pooled"])
def batch_path(request: pytest.FixtureRequest) -> list[str]:
    """``sbxkit batch``'s flags for the cold path, then for the pooled one."""
    return [] if request.param == "cold" else ["--pool"]


def result_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of RESULTS, each required to be complete JSON ending in a newline."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.splitlines()]


def creates(witness: Witness, label: str, since: float) -> int:
    events = witness.events(
        since, time.time(), type=["container"], event=["create"], label=[f"{TEST_LABEL}={label}"]
    )
    return len(events)


def test_every_job_gets_one_complete_line(
    witness: Witness, busybox: str, tmp_path: Path, batch_path: list[str]
) -> None:
    label = unique("batch")
    # The first four hold their slots for a while: a pool parks containers for the rest.
    lines = [
        job(
            f"j{i}", busybox, f"{'sleep 2; ' if i < 4 else ''}echo out-{i}; echo err-{i} >&2", label
        )
        for i in range(10)
    ]
    lines.append(job("stdin", busybox, "cat", label, stdin="fed through stdin\n"))
    lines.append(job("bad-utf8", busybox, r"printf 'a\377b'; exit 3", label))
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out = tmp_path / "results.jsonl"
    proc = batch(witness, jobs, out, "--parallel", "4", *batch_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"\r" not in proc.stderr  # stderr is not a terminal: no progress line
    assert b"12 jobs ran" in proc.stderr
    docs = {doc["id"]: doc for doc in result_lines(out)}
    assert len(docs) == 12
    for i in range(10):
        doc = docs[f"j{i}"]
        assert (doc["status"], doc["exit_code"]) == ("exited", 0)
        assert (doc["stdout"], doc["stderr"]) == (f"out-{i}\n", f"err-{i}\n")
        assert doc["stdout_bytes"] == len(f"out-{i}\n")
        assert len(doc["container_id"]) == 64
        assert doc["error"] is None
        assert {"queued_s", "create_s", "start_s", "run_s", "remove_s", "elapsed_s"} <= set(
            doc["timings"]
        )
    assert docs["stdin"]["stdout"] == "fed through stdin\n"
    odd = docs["bad-utf8"]
    assert (odd["status"], odd["exit_code"]) == ("exited", 3)  # a payload status, exit 0 still
    assert (odd["stdout"], odd["stdout_bytes"]) == ("a\ufffdb", 3)
    assert any(doc["pooled"] for doc in docs.values()) == bool(batch_path)
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []


def test_order_input_writes_the_lines_in_the_jobs_order_with_every_byte(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    """``--order input``: the first job is the slowest, yet its line comes first; the default
    (completion) writes it last. ``--output-encoding base64`` carries bytes that are not
    UTF-8 exactly (issue 43, item 10)."""
    label = unique("order")
    lines = [job("slow", busybox, r"sleep 3; printf 'a\377\000b'", label)]
    lines += [job(f"quick{i}", busybox, f"echo {i}", label) for i in range(3)]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    ordered = tmp_path / "ordered.jsonl"
    proc = batch(
        witness, jobs, ordered, "--parallel", "4", "--order", "input",
        "--output-encoding", "base64",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    docs = result_lines(ordered)
    assert [doc["id"] for doc in docs] == ["slow", "quick0", "quick1", "quick2"]
    assert base64.b64decode(docs[0]["stdout_base64"]) == b"a\xff\x00b"
    assert "stdout" not in docs[0]
    assert [base64.b64decode(doc["stdout_base64"]) for doc in docs[1:]] == [b"0\n", b"1\n", b"2\n"]
    completed = tmp_path / "completed.jsonl"
    proc = batch(witness, jobs, completed, "--parallel", "4")
    assert proc.returncode == 0, proc.stderr.decode()
    assert [doc["id"] for doc in result_lines(completed)][-1] == "slow"
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []


def test_a_batch_without_parallel_runs_every_job_under_its_adaptive_limit(
    witness: Witness, busybox: str, tmp_path: Path, batch_path: list[str]
) -> None:
    """No ``--parallel``: the limit adapts (to the host's real load here, so only what no load
    can change is checked): every job has its line, in order, and nothing is left."""
    label = unique("adaptive")
    lines = [job(i, busybox, f"echo {i}", label) for i in range(24)]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out = tmp_path / "results.jsonl"
    proc = batch(witness, jobs, out, "--order", "input", *batch_path, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()
    docs = result_lines(out)
    assert [doc["id"] for doc in docs] == list(range(24))
    assert [doc["stdout"] for doc in docs] == [f"{i}\n" for i in range(24)]
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []


def test_resume_reruns_exactly_the_jobs_without_a_line(
    witness: Witness, busybox: str, tmp_path: Path, batch_path: list[str]
) -> None:
    label = unique("batch")
    jobs = write_jobs(
        tmp_path / "jobs.jsonl",
        [job(i, busybox, f"echo {i}", label) for i in range(12)],
    )
    out = tmp_path / "results.jsonl"
    first = batch(witness, jobs, out, "--parallel", "4", *batch_path)
    assert first.returncode == 0, first.stderr.decode()
    kept_lines = out.read_bytes().splitlines(keepends=True)[::2]
    kept = [json.loads(line)["id"] for line in kept_lines]
    out.write_bytes(b"".join(kept_lines))
    since = time.time()
    second = batch(witness, jobs, out, "--parallel", "4", *batch_path)
    assert second.returncode == 0, second.stderr.decode()
    assert b"(6 already done)" in second.stderr
    assert out.read_bytes().startswith(b"".join(kept_lines))  # earlier lines untouched
    docs = result_lines(out)
    assert sorted(doc["id"] for doc in docs) == list(range(12))
    rerun = [doc["id"] for doc in docs[len(kept_lines) :]]
    assert sorted(rerun) == sorted(set(range(12)) - set(kept))
    assert all(doc["stdout"] == f"{doc['id']}\n" for doc in docs)
    if batch_path:  # a container parked for a job that started cold meanwhile is removed
        assert creates(witness, label, since) >= 6
    else:
        assert creates(witness, label, since) == 6
    third = batch(witness, jobs, out, *batch_path)
    assert third.returncode == 0
    assert b"nothing to do" in third.stderr
    assert len(result_lines(out)) == 12


def test_a_bad_line_is_refused_by_number_and_field_before_anything_runs(
    witness: Witness, busybox: str, tmp_path: Path, batch_path: list[str]
) -> None:
    label = unique("batch")
    bad = json.loads(job("bad", busybox, "true", label))
    bad["limits"]["memory_bytes"] = 64.5
    jobs = write_jobs(
        tmp_path / "jobs.jsonl",
        [job("ok1", busybox, "true", label), job("ok2", busybox, "true", label), json.dumps(bad)],
    )
    out = tmp_path / "results.jsonl"
    since = time.time()
    proc = batch(witness, jobs, out, *batch_path)
    assert proc.returncode == 2
    assert f"{jobs} line 3: limits.memory_bytes: Expected `int".encode() in proc.stderr
    assert not out.exists()
    assert creates(witness, label, since) == 0


def test_a_profile_naming_a_missing_host_file_is_refused_once_before_any_job(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    label = unique("batch")
    missing = tmp_path / "no-such-dataset"
    profile = tmp_path / "profile.toml"
    profile.write_text(
        "[sandbox.docker]\nenable_bind_mounts = true\n"
        f'[[sandbox.docker.mounts]]\ntype = "bind"\nsource = "{missing}"\ntarget = "/data"\n'
    )
    jobs = write_jobs(
        tmp_path / "jobs.jsonl", [job(f"j{n}", busybox, "true", label) for n in range(3)]
    )
    out = tmp_path / "results.jsonl"
    since = time.time()
    proc = batch(witness, jobs, out, "--profile", str(profile))
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if str(missing).encode() in line]
    assert len(said) == 1, proc.stderr  # once at start, not once per job
    assert b"sandbox.docker.mounts[0].source" in proc.stderr
    assert not out.exists()
    assert creates(witness, label, since) == 0


def test_a_job_larger_than_the_memory_budget_is_refused(
    witness: Witness, busybox: str, tmp_path: Path, batch_path: list[str]
) -> None:
    label = unique("batch")
    jobs = write_jobs(tmp_path / "jobs.jsonl", [job("huge", busybox, "true", label)])
    since = time.time()
    proc = batch(witness, jobs, tmp_path / "out.jsonl", "--memory-budget", "16m", *batch_path)
    assert proc.returncode == 2
    assert b"job 'huge': limits.memory_bytes" in proc.stderr
    assert creates(witness, label, since) == 0  # nor was anything parked for it


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_removes_everything_in_flight_and_leaves_results_valid(
    witness: Witness, busybox: str, tmp_path: Path, signum: signal.Signals, batch_path: list[str]
) -> None:
    label = unique("batch")
    selector = f"{TEST_LABEL}={label}"
    lines = [job(f"quick{i}", busybox, f"echo {i}", label) for i in range(4)]
    lines += [job(f"slow{i}", busybox, "sleep 30", label) for i in range(8)]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out = tmp_path / "results.jsonl"
    proc = subprocess.Popen(
        batch_argv(
            *(str(jobs), "--out", str(out), "--parallel", "4", "--socket", witness.socket_path),
            *batch_path,
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def quick_done_and_four_slow_running() -> bool:
            if not out.exists() or out.read_bytes().count(b"\n") < 4:
                return False
            found = witness.containers(label=selector)
            running = sum(1 for c in found if c.get("State") == "running")
            # Pooled: containers parked for the slow jobs still queued are running too, and
            # the interrupt must remove them as well.
            return running >= 5 if batch_path else running == 4

        assert wait_until(quick_done_and_four_slow_running, 30), proc.poll()
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, stderr.decode()
    assert f"interrupted by {signum.name}".encode() in stderr
    docs = result_lines(out)  # every line complete JSON
    assert sorted(doc["id"] for doc in docs) == [f"quick{i}" for i in range(4)]
    assert witness.containers(label=selector) == []  # removed before the command exited


def test_progress_is_drawn_on_a_terminal(witness: Witness, busybox: str, tmp_path: Path) -> None:
    label = unique("batch")
    jobs = write_jobs(tmp_path / "jobs.jsonl", [job(i, busybox, "true", label) for i in range(3)])
    out = tmp_path / "results.jsonl"
    argv = batch_argv(
        str(jobs), "--out", str(out), "--parallel", "3", "--socket", witness.socket_path
    )
    term = ptyprocess.PtyProcess.spawn(argv, env=dict(os.environ), dimensions=(24, 200))
    seen = b""
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([term.fd], [], [], 0.2)
            if ready:
                try:
                    seen += term.read(65536)
                except EOFError:
                    break
    finally:
        if term.isalive():
            term.terminate(force=True)
    assert term.wait() == 0, seen
    assert b"\r3/3 done" in seen
    assert b"jobs/s" in seen
    assert b"ETA" in seen
    assert len(result_lines(out)) == 3
