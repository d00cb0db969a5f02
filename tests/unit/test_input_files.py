"""Input files (issue 12, items 2 and 8): jobs and profile files size-capped, read under a
deadline and refused by kind; ``sbxkit batch`` never takes a file that is not a results file
for results, and never truncates or rewrites a line it did not write. Pure, or the CLI as a
subprocess against a socket that does not exist (exit 2 is the refusal, before any engine)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sbxkit._grammar.profile import MAX_PROFILE_BYTES, load_profile
from sbxkit._util.bounded_read import file_kind_problem, read_bounded
from sbxkit.cli.batch import check_out_path, load_jobs
from sbxkit.cli.jobs import forget_error_lines
from sbxkit.cli.results import is_own_torn_line, prepare_results, scan_results
from sbxkit.errors import ResultsFileError, SpecError
from tests.unit.test_harness import result_json

NO_SOCKET = "/nonexistent/sbxkit-test.sock"
IMAGE = "sbxkit-test/busybox:latest"
JOB = {
    "image": IMAGE,
    "command": ["true"],
    "limits": {"cpus": 1, "memory": "64m", "pids": 32, "max_output": "1m", "timeout": 10},
}


def refusal(make: object, *args: object, **kwargs: object) -> SpecError:
    assert callable(make)
    with pytest.raises(SpecError) as caught:
        make(*args, **kwargs)
    return caught.value


def batch_cli(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sbxkit", "batch", "--socket", NO_SOCKET, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )


def result_line(job_id: str | int, status: str = "exited") -> bytes:
    return result_json(job_id, status)


# --- special files, caps and the deadline -------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_kinds_other_than_regular_files_are_refused_by_name(tmp_path: Path, fifo: Path) -> None:
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        cases = {
            fifo: "a FIFO",
            Path("/dev/zero"): "a character device",
            tmp_path: "a directory",
            sock_path: "a socket",
        }
        for path, kind in cases.items():
            error = refusal(read_bounded, path, field="JOBS", limit=100)
            assert error.field == "JOBS"
            assert kind in error.rule
    assert file_kind_problem(0o100644) is None


def test_a_fifo_never_blocks_the_profile_or_jobs_reader(fifo: Path) -> None:
    """Without a writer, opening a FIFO for reading blocks forever; here it is refused."""
    assert "FIFO" in refusal(load_profile, fifo).rule
    assert "FIFO" in refusal(load_jobs, fifo).rule


def test_sizes_are_capped(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"#" * 101)
    assert "larger than 100 bytes" in refusal(read_bounded, big, field="f", limit=100).rule
    assert read_bounded(big, field="f", limit=101) == b"#" * 101
    huge = tmp_path / "profile.toml"
    huge.write_bytes(b"#" * (MAX_PROFILE_BYTES + 1))
    assert "larger than" in refusal(load_profile, huge).rule


def test_a_read_that_hangs_is_abandoned_at_the_deadline(tmp_path: Path) -> None:
    release = threading.Event()

    def hung(path: Path, limit: int) -> bytes:
        release.wait(30)
        return b""

    try:
        error = refusal(
            read_bounded, tmp_path, field="profile", limit=1, deadline_s=0.2, reader=hung
        )
        assert "not read within 0.2 s" in error.rule
    finally:
        release.set()


def test_batch_refuses_special_jobs_files_before_any_engine(fifo: Path, tmp_path: Path) -> None:
    for jobs in (fifo, Path("/dev/zero"), tmp_path):
        done = batch_cli(str(jobs), "--out", str(tmp_path / "out.jsonl"))
        assert done.returncode == 2, done.stderr
        assert b"not a regular file" in done.stderr
    done = batch_cli(str(tmp_path / "absent.jsonl"), "--out", str(tmp_path / "out.jsonl"))
    assert done.returncode == 2
    assert b"cannot read" in done.stderr


def test_out_must_be_a_regular_file(fifo: Path, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": 1, **JOB}) + "\n")
    for out in (fifo, Path("/dev/zero")):
        done = batch_cli(str(jobs), "--out", str(out))
        assert done.returncode == 2, done.stderr
        assert b"results go to a regular file" in done.stderr


# --- batch data safety (item 8) -----------------------------------------------------------------


def test_out_naming_the_jobs_file_is_refused_and_the_file_untouched(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": 1, **JOB}) + "\n")
    before = jobs.read_bytes()
    done = batch_cli(str(jobs), "--out", str(jobs))
    assert done.returncode == 2, done.stderr
    assert b"is the JOBS file" in done.stderr
    assert jobs.read_bytes() == before
    link = tmp_path / "link.jsonl"
    link.symlink_to(jobs)
    assert "JOBS" in refusal(check_out_path, link, {"JOBS": jobs}).rule


def test_a_jsonl_with_id_fields_is_not_results(tmp_path: Path) -> None:
    """Any JSONL with ids used to suppress jobs ("nothing to do"); now it refuses the run."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": 1, **JOB}) + "\n")
    other = tmp_path / "other.jsonl"
    other.write_bytes(b'{"id": 1, "status": "exited"}\n{"id": 2, "name": "x"}\n')
    before = other.read_bytes()
    done = batch_cli(str(jobs), "--out", str(other))
    assert done.returncode == 2, done.stderr
    assert b"line 1: not a result line" in done.stderr
    assert other.read_bytes() == before


def test_a_torn_last_line_that_is_not_ours_is_never_cut(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": 1, **JOB}) + "\n")
    for content in (b"notes about my experiment", result_line("a") + b"my own text, no newline"):
        out = tmp_path / "out.jsonl"
        out.write_bytes(content)
        done = batch_cli(str(jobs), "--out", str(out))
        assert done.returncode == 2, done.stderr
        assert out.read_bytes() == content
        assert [p.name for p in tmp_path.iterdir() if ".torn-" in p.name] == []


def test_our_torn_last_line_is_moved_aside_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    torn = result_line("b")[:40]
    out.write_bytes(result_line("a") + torn)
    scan = prepare_results(out)
    assert scan.done == {"a"}
    assert out.read_bytes() == result_line("a")
    assert scan.moved_to is not None
    assert Path(scan.moved_to).read_bytes() == torn
    assert Path(scan.moved_to).parent == tmp_path


def test_which_torn_lines_are_ours() -> None:
    assert is_own_torn_line(b'{"id":"b","status":"ex', after_results=False)
    assert is_own_torn_line(b'{"id":7,"stat', after_results=True)
    assert is_own_torn_line(b'{"id":"b', after_results=True)
    assert not is_own_torn_line(b'{"id":"b', after_results=False)  # could be anybody's
    assert not is_own_torn_line(b'{"id":"b","image":"x"', after_results=True)  # a job line
    assert not is_own_torn_line(b'{"id": "b", "status": "exited"', after_results=True)


def test_results_of_the_earlier_format_still_resume() -> None:
    """Lines written before ``kill_evidence`` and ``usage`` existed lack those keys."""
    doc = json.loads(result_line("old"))
    del doc["kill_evidence"], doc["usage"]
    scan = scan_results(json.dumps(doc, separators=(",", ":")).encode() + b"\n")
    assert scan.done == {"old"}


def test_a_result_line_with_an_unknown_status_or_key_is_not_ours() -> None:
    for change in ({"status": "fine"}, {"extra": 1}):
        doc = {**json.loads(result_line("x")), **change}
        with pytest.raises(ResultsFileError):
            scan_results(json.dumps(doc).encode() + b"\n")


def test_retry_errors_rewrites_through_a_symlink_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "real.jsonl"
    target.write_bytes(result_line(1, "error") + result_line(2))
    target.chmod(0o600)
    link = tmp_path / "results.jsonl"
    link.symlink_to(target)
    assert forget_error_lines(link, {1}) == 1
    assert link.is_symlink()
    assert target.read_bytes() == result_line(2)
    assert target.stat().st_mode & 0o777 == 0o600
