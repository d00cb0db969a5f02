"""The command-line papercuts of issue 15 against the real engine: piped stdin, ``--json``
errors, and ``sbxkit batch`` with a profile's defaults, size strings and ``--retry-errors``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engine.cli_paths import CliPath
from tests.engine.helpers import delete_image, tag_image, unique
from tests.engine.test_batch_cli import TEST_LABEL, batch, result_lines, write_jobs
from tests.engine.test_cli import run_cli, sbxkit
from tests.witness import Witness


def test_piped_stdin_without_the_flag_is_refused_before_any_container(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    cli_path.falls_back("stdin is a pipe or a file and --stdin is not given")
    label = unique("stdin")
    proc = run_cli(
        witness, busybox, "cat", options=("--label", f"{TEST_LABEL}={label}"), stdin=b"data"
    )
    assert proc.returncode == 2, proc.stderr.decode()
    assert b"--stdin -" in proc.stderr
    assert proc.stdout == b""
    assert witness.containers(label=f"{TEST_LABEL}={label}") == []


def test_stdin_none_ignores_a_piped_stdin(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    proc = run_cli(witness, busybox, "sh", "-c", "wc -c", options=("--stdin", "none"), stdin=b"x")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.strip() == b"0"


def test_json_prints_an_error_object_for_a_missing_image(
    witness: Witness, cli_path: CliPath
) -> None:
    cli_path.falls_back("ImageError")
    proc = sbxkit(
        "run", "--json", "--socket", witness.socket_path, "sbxkit-test/absent:1", "--", "true"
    )
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["error"]["type"] == "ImageError"
    assert doc["exit_status"] == 2


def test_batch_jobs_take_defaults_from_a_profile_and_size_strings(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    label = unique("batch")
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f"""
[sandbox.docker]
image = "{busybox}"
labels = {{ "{TEST_LABEL}" = "{label}" }}

[sandbox.docker.limits]
cpus = 0.5
memory = "64m"
pids = 32
max_output = "1m"
timeout = 30
"""
    )
    lines = [
        json.dumps({"id": "profile", "command": ["sh", "-c", "echo $((1 + 1))"]}),
        json.dumps(
            {
                "id": "sizes",
                "command": ["sh", "-c", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"],
                "limits": {"memory": "96MB", "max_output": "4kb"},
            }
        ),
    ]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = batch(witness, jobs, out, "--profile", str(profile))
    assert proc.returncode == 0, proc.stderr.decode()
    docs = {doc["id"]: doc for doc in result_lines(out)}
    assert docs["profile"]["stdout"] == "2\n"
    assert docs["sizes"]["stdout"] == f"{96 * 1024 * 1024}\n"


DEFAULT_LIMITS = ("--cpus", "0.5", "--memory", "32m", "--pids", "32", "--timeout", "30")


def test_retry_errors_reruns_only_the_jobs_that_could_not_run(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    later = f"sbxkit-test/{unique('later')}"
    lines = [
        json.dumps({"id": "ok", "image": busybox, "command": ["echo", "ran"]}),
        json.dumps({"id": "typo", "image": f"{later}:1", "command": ["echo", "fixed"]}),
    ]
    jobs = write_jobs(tmp_path / "jobs.jsonl", lines)
    out = tmp_path / "out.jsonl"
    first = batch(witness, jobs, out, *DEFAULT_LIMITS, "--max-output", "1m")
    assert first.returncode == 1, first.stderr.decode()
    assert {d["id"]: d["status"] for d in result_lines(out)} == {"ok": "exited", "typo": "error"}
    tag_image(witness, busybox, later, "1")  # the "typo" is fixed
    try:
        again = batch(witness, jobs, out, *DEFAULT_LIMITS, "--max-output", "1m", "--retry-errors")
    finally:
        delete_image(witness, f"{later}:1")
    assert again.returncode == 0, again.stderr.decode()
    docs = result_lines(out)
    assert sorted(d["id"] for d in docs) == ["ok", "typo"]  # one line per id
    by_id = {d["id"]: d for d in docs}
    assert by_id["typo"]["stdout"] == "fixed\n"
    assert by_id["ok"]["stdout"] == "ran\n"  # not run again: its line is the first run's
    assert b"1 job ran" in again.stderr
