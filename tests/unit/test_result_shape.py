"""Results on the command line (issue 43, items 9 and 10): verdict lines that name the limit,
one JSON shape for ``sbxkit run --json`` and ``sbxkit batch`` lines (a result and an error
alike), a lossless output encoding, and batch lines in input order."""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest

from sbxkit._consumers.harness import JobError, JobResult
from sbxkit._grammar.common import json_error, to_json
from sbxkit._grammar.run_grammar import RunBounds, bounds_of, status_notice
from sbxkit._model.result import RunResult, Status, own_exit_code
from sbxkit._model.spec import Limits, MiB, SandboxSpec, Workspace
from sbxkit._model.units import format_seconds, format_size
from sbxkit.cli.results import InputOrder, encode_result, scan_results
from tests.unit.test_cli_args import result

BOUNDS = RunBounds(timeout_s=30.0, output_bytes=MiB, memory_bytes=256 * MiB, disk_bytes=64 * MiB)


# -- verdict lines ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ended", "line"),
    [
        (result("timed_out", None), "sbxkit: timed out after 30 s"),
        (
            result("output_exceeded", None, overflowed="stdout"),
            "sbxkit: output exceeded (stdout): limit 1 MiB",
        ),
        (result("oom_killed", None), "sbxkit: oom killed: memory limit 256 MiB"),
        (result("disk_exceeded", None), "sbxkit: disk exceeded: disk limit 64 MiB"),
        (result("killed", None), "sbxkit: killed"),
        (result("exited", 3), None),
    ],
)
def test_a_verdict_line_names_the_limit_that_ended_the_run(
    ended: RunResult, line: str | None
) -> None:
    assert status_notice(ended, BOUNDS) == line


def test_a_verdict_line_without_known_limits_says_the_status_alone() -> None:
    assert status_notice(result("timed_out", None)) == "sbxkit: timed out"
    assert status_notice(result("oom_killed", None)) == "sbxkit: oom killed"


def test_the_bounds_are_the_specs() -> None:
    limits = Limits(cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=1000, timeout_s=1.5)
    spec = SandboxSpec(image="i", command=["true"], limits=limits)
    assert bounds_of(spec) == RunBounds(1.5, 1000, 64 * MiB, None)
    spec = msgspec.structs.replace(spec, workspace=Workspace(disk_bytes=3 * MiB))
    assert bounds_of(spec).disk_bytes == 3 * MiB


@pytest.mark.parametrize(
    ("size", "text"),
    [(1, "1 byte"), (1000, "1000 bytes"), (1024, "1 KiB"), (1536 * MiB, "1.5 GiB"), (MiB, "1 MiB")],
)
def test_sizes_read_as_a_person_writes_them(size: int, text: str) -> None:
    assert format_size(size) == text


def test_seconds_read_as_a_person_writes_them() -> None:
    assert [format_seconds(s) for s in (30.0, 0.5, 1.25, 3600.0)] == [
        "30 s",
        "0.5 s",
        "1.25 s",
        "3600 s",
    ]


# -- the exit code of a kill ----------------------------------------------------------------------


@pytest.mark.parametrize("status", ["timed_out", "output_exceeded", "oom_killed", "killed"])
def test_a_kill_carries_no_exit_code(status: Status) -> None:
    """docs/cli.md and docs/mcp.md: the payload's own code when it exited, else null."""
    assert own_exit_code(status, 137) is None
    assert own_exit_code("exited", 137) == 137


# -- one shape ------------------------------------------------------------------------------------


def line_of(done: JobResult, **options: Any) -> dict[str, Any]:
    raw = encode_result(done, **options)
    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == 1
    doc: dict[str, Any] = json.loads(raw)
    return doc


def test_run_json_and_a_batch_line_have_the_same_keys() -> None:
    ran = result("exited", 0, stdout=b"hi\n")
    run_doc = json.loads(to_json(ran))
    batch = line_of(JobResult(id="a", result=ran, queued_s=0.5))
    assert list(batch) == ["id", *run_doc]
    assert {k: v for k, v in batch.items() if k not in ("id", "timings")} == {
        k: v for k, v in run_doc.items() if k != "timings"
    }
    assert run_doc["error"] is None


def test_an_error_has_one_shape_in_both() -> None:
    run_doc = json.loads(json_error("SpecError", "--memory: too small", "--memory", 2))
    failed = JobError(type="SpecError", message="memory: too small", field="limits.memory_bytes")
    batch = line_of(JobResult(id=7, error=failed))
    assert list(batch) == ["id", *(key for key in run_doc if key != "exit_status")]
    assert run_doc["status"] == batch["status"] == "error"
    assert set(run_doc["error"]) == set(batch["error"]) == {"type", "message", "field"}
    assert batch["error"]["field"] == "limits.memory_bytes"
    assert run_doc["exit_status"] == 2


def test_base64_carries_every_byte_in_both() -> None:
    ran = result("exited", 0, stdout=b"a\xff\x00b", stderr=b"\xfe")
    for doc in (
        json.loads(to_json(ran, "base64")),
        line_of(JobResult(id="a", result=ran), encoding="base64"),
    ):
        assert "stdout" not in doc
        assert "stderr" not in doc
        assert base64.b64decode(doc["stdout_base64"]) == b"a\xff\x00b"
        assert base64.b64decode(doc["stderr_base64"]) == b"\xfe"
        assert (doc["stdout_bytes"], doc["stderr_bytes"]) == (4, 1)
    assert json.loads(to_json(ran))["stdout"] == "a\ufffd\x00b"  # the default stays text


def test_every_line_shape_resumes() -> None:
    ran = result("exited", 0, stdout=b"\xff")
    lines = [
        encode_result(JobResult(id="text", result=ran)),
        encode_result(JobResult(id="b64", result=ran), encoding="base64"),
        encode_result(JobResult(id="err", error=JobError(type="ImageError", message="gone"))),
        encode_result(JobResult(id="c", result=ran, node="n1", attempt=2), cluster=True),
    ]
    scan = scan_results(b"".join(lines))
    assert scan.done == {"text", "b64", "err", "c"}
    assert scan.errors == {"err"}


# -- input order ----------------------------------------------------------------------------------


def test_input_order_holds_a_line_only_while_an_earlier_job_runs() -> None:
    order = InputOrder(["a", "b", "c", "d"])
    assert order.add("c", b"C") == []
    assert order.add("b", b"B") == []
    assert order.held == 2
    assert order.add("a", b"A") == [b"A", b"B", b"C"]
    assert order.held == 0
    assert order.add("d", b"D") == [b"D"]


def test_input_order_gives_up_what_it_holds_when_the_batch_stops() -> None:
    order = InputOrder([1, 2, 3, 4])
    assert order.add(4, b"4") == []
    assert order.add(2, b"2") == []
    assert order.drain() == [b"2", b"4"]
    assert order.held == 0
