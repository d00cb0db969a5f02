"""Harness mode without a daemon: admission, the JSONL jobs decoder, resume, the results writer,
the progress line, and run_many's dispatching (with the runner replaced by a fake)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, cast

import hypothesis.strategies as st
import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given

from sbxkit._consumers.harness import (
    PARALLEL_CAP,
    PARALLEL_PER_CORE,
    Admission,
    Budget,
    Job,
    JobError,
    JobId,
    JobResult,
    Need,
    default_parallel,
    need_of,
    run_many,
)
from sbxkit._consumers.paced import Pacing
from sbxkit._grammar.result_doc import ErrorDoc, ErrorResultDoc
from sbxkit._model.result import PhaseTimings, RunResult
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit.backends import Backend
from sbxkit.cli.batch import (
    Progress,
    ResultLine,
    ResultsFileError,
    ResultsWriter,
    decode_jobs,
    encode_result,
    format_progress,
    pending_jobs,
    prepare_results,
    scan_results,
)
from sbxkit.cli.results import InputOrder
from sbxkit.errors import CleanupError, ImageError, JobsFileError, SpecError

LIMITS: dict[str, Any] = {
    "cpus": 0.5,
    "memory_bytes": 64 * MiB,
    "pids": 64,
    "output_bytes": MiB,
    "timeout_s": 10,
}


def spec(memory: int = 64 * MiB, cpus: float = 0.5, command: str = "true") -> SandboxSpec:
    return SandboxSpec(
        image="sbxkit-test/busybox:latest",
        command=[command],
        limits=msgspec.convert({**LIMITS, "memory_bytes": memory, "cpus": cpus}, Limits),
    )


# --- admission -----------------------------------------------------------------------------------

M64 = Need(64 * MiB, 100_000_000)


def test_admission_caps_the_number_in_flight() -> None:
    admission = Admission(2, Budget(None, None))
    assert admission.admit(M64)
    assert admission.admit(M64)
    assert not admission.admit(M64)
    admission.release(M64)
    assert admission.admit(M64)
    assert admission.in_flight == 2


def test_admission_sums_memory_against_the_budget() -> None:
    admission = Admission(10, Budget(200 * MiB, None))
    assert [admission.admit(M64) for _ in range(4)] == [True, True, True, False]
    assert admission.memory_in_use == 192 * MiB
    admission.release(M64)
    assert admission.admit(M64)
    assert not admission.admit(Need(9 * MiB, 0))
    assert admission.admit(Need(8 * MiB, 0))  # exactly the budget fits


def test_admission_sums_cpu_against_the_budget() -> None:
    admission = Admission(10, Budget(None, 2_000_000_000))
    one = Need(0, 1_000_000_000)
    assert admission.admit(one)
    assert admission.admit(one)
    assert not admission.admit(Need(0, 1))
    admission.release(one)
    assert admission.admit(Need(0, 1))


def test_a_refused_admission_changes_nothing() -> None:
    admission = Admission(1, Budget(100, 100))
    assert admission.admit(Need(60, 60))
    assert not admission.admit(Need(10, 10))
    assert (admission.in_flight, admission.memory_in_use, admission.nano_cpus_in_use) == (
        1,
        60,
        60,
    )


def test_a_job_larger_than_the_whole_budget_is_refused_by_name() -> None:
    admission = Admission(4, Budget(200 * MiB, 2_000_000_000))
    admission.check("small", M64)
    with pytest.raises(SpecError) as memory:
        admission.check("huge", Need(256 * MiB, 1))
    assert memory.value.field == "job 'huge': limits.memory_bytes"
    assert "could never start" in str(memory.value)
    with pytest.raises(SpecError) as cpus:
        admission.check(7, Need(1, 3_000_000_000))
    assert cpus.value.field == "job 7: limits.cpus"


@pytest.mark.parametrize("parallel", [0, -1, True, 1.5, "4"])
def test_parallel_must_be_a_positive_integer(parallel: object) -> None:
    with pytest.raises(SpecError, match="parallel"):
        Admission(cast(int, parallel), Budget(None, None))


def test_release_without_admit_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        Admission(1, Budget(None, None)).release(M64)


def test_need_of_a_spec() -> None:
    assert need_of(spec(memory=32 * MiB, cpus=0.25)) == Need(32 * MiB, 250_000_000)
    absent = SandboxSpec(image="x", command=["true"], limits=Limits())
    assert need_of(absent) == Need(0, 0)  # the run itself refuses it


@given(
    st.integers(1, 8),
    st.integers(1, 1000),
    st.integers(1, 1000),
    st.lists(st.tuples(st.booleans(), st.integers(0, 400), st.integers(0, 400)), max_size=60),
)
def test_admission_never_exceeds_any_bound(
    parallel: int, memory: int, cpus: int, steps: list[tuple[bool, int, int]]
) -> None:
    admission = Admission(parallel, Budget(memory, cpus))
    held: list[Need] = []
    for start, mem, cpu in steps:
        if start or not held:
            need = Need(mem, cpu)
            fitted = admission.fits(need)
            assert admission.admit(need) == fitted
            if fitted:
                held.append(need)
        else:
            admission.release(held.pop(0))
        assert admission.in_flight == len(held) <= parallel
        assert admission.memory_in_use == sum(n.memory_bytes for n in held) <= memory
        assert admission.nano_cpus_in_use == sum(n.nano_cpus for n in held) <= cpus


# --- run_many with a fake runner ---------------------------------------------------------------


def fake_result(command: str) -> RunResult:
    return RunResult(
        status="exited",
        exit_code=0,
        stdout=command.encode(),
        stderr=b"",
        overflowed=None,
        container_id="c" * 64,
        lease="l" * 32,
        timings=PhaseTimings(),
    )


class FakeRunner:
    """A backend whose runs sleep, track concurrency and fail on demand (no engine here: the
    real-engine harness tests run real containers)."""

    kind = "fake"

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self.active = 0
        self.peak = 0
        self.cancelled = 0

    async def __call__(
        self, spec: SandboxSpec, stdin: bytes | None = None, **kwargs: Any
    ) -> RunResult:
        command = spec.command[0]
        if command == "missing-image":
            raise ImageError(spec.image, "not present locally")
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await trio.sleep(self.seconds)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        if command == "cleanup-fails":
            raise CleanupError("l" * 32, "c" * 64, "daemon said no")
        return fake_result(command)

    async def run_once(self, spec: SandboxSpec, stdin: bytes | None = None, **_: Any) -> RunResult:
        return await self(spec, stdin)


def backend_of(stand_in: object) -> Backend:
    """The stand-ins implement only ``run_once``: all ``run_many`` asks of a backend."""
    return cast(Backend, stand_in)


class FnBackend:
    """A backend whose ``run_once`` is one function."""

    kind = "fn"

    def __init__(self, run: Any) -> None:
        self.run_once = run


@pytest.fixture
def fake() -> FakeRunner:
    return FakeRunner()


def jobs_of(n: int, **kwargs: Any) -> list[Job]:
    return [Job(id=f"j{i}", spec=spec(**kwargs)) for i in range(n)]


async def test_run_many_bounds_parallelism_and_keeps_input_order(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[JobResult] = []
    results = await run_many(
        jobs_of(10),
        parallel=3,
        host_memory_bytes=10**12,
        host_cpus=64,
        backend=backend_of(fake),
        on_result=seen.append,
    )
    assert fake.peak == 3
    assert [r.id for r in results] == [f"j{i}" for i in range(10)]
    assert sorted(r.id for r in seen) == sorted(r.id for r in results)
    assert all(r.ok for r in results)
    assert max(overlap(results)) == 3


@pytest.mark.parametrize(
    ("cores", "expected"), [(None, None), (0, 4), (1, 4), (2, 8), (8, 32), (16, 64), (64, 64)]
)
def test_the_default_parallelism_follows_the_cores(cores: int | None, expected: int | None) -> None:
    """Per core of this process's affinity, at least one core's worth, at most the cap."""
    if cores is None:
        import os

        expected = min(PARALLEL_CAP, PARALLEL_PER_CORE * len(os.sched_getaffinity(0)))
    assert default_parallel(cores) == expected


async def test_run_many_without_parallel_starts_with_the_cores_worth_at_once(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    from tests.unit.test_pacing import ScriptedCpu  # saturated cores: the limit never rises

    pacing = Pacing(cpu=ScriptedCpu([1.0]))
    jobs = jobs_of(3 * default_parallel())
    results = await run_many(jobs, backend=backend_of(fake), pacing=pacing)
    assert fake.peak == default_parallel()
    assert all(r.ok for r in results)


@pytest.mark.parametrize("parallel", [0, -3, True, 2.5, "8"])
async def test_run_many_names_a_bad_parallel_before_anything_runs(
    fake: FakeRunner, parallel: object
) -> None:
    with pytest.raises(SpecError, match=f"parallel: must be an integer >= 1, got {parallel!r}"):
        await run_many(jobs_of(2), parallel=cast(int, parallel), backend=backend_of(fake))
    assert fake.peak == 0


def overlap(results: list[JobResult]) -> list[int]:
    """How many jobs were in flight at each start/finish event (finishes first on ties)."""
    events = sorted(
        [(r.started_at, 1) for r in results] + [(r.finished_at, -1) for r in results],
        key=lambda e: (e[0], e[1]),
    )
    counts, now = [], 0
    for _, delta in events:
        now += delta
        counts.append(now)
    return counts


async def test_run_many_admits_by_memory(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    results = await run_many(
        jobs_of(9), parallel=8, host_memory_bytes=200 * MiB, host_cpus=64, backend=backend_of(fake)
    )
    assert fake.peak == 3
    assert max(overlap(results)) == 3
    assert results[-1].queued_s > 0


async def test_run_many_admits_in_input_order_without_overtaking(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    jobs = [
        Job(id="a", spec=spec(memory=150 * MiB)),
        Job(id="big", spec=spec(memory=150 * MiB)),
        Job(id="small", spec=spec(memory=8 * MiB)),
    ]
    results = await run_many(
        jobs, parallel=8, host_memory_bytes=200 * MiB, host_cpus=64, backend=backend_of(fake)
    )
    by_id = {r.id: r for r in results}
    assert by_id["big"].started_at >= by_id["a"].finished_at
    assert by_id["small"].started_at >= by_id["big"].started_at


async def test_one_jobs_error_is_its_result_not_the_batchs(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    jobs = [
        Job(id=1, spec=spec()),
        Job(id=2, spec=spec(command="missing-image")),
        Job(id=3, spec=spec(command="cleanup-fails")),
    ]
    results = await run_many(
        jobs, parallel=2, host_memory_bytes=10**12, backend=backend_of(fake), host_cpus=8
    )
    assert results[0].ok
    assert results[1].error == JobError(
        type="ImageError", message="image 'sbxkit-test/busybox:latest': not present locally"
    )
    error = results[2].error
    assert error is not None
    assert error.type == "CleanupError"
    assert (error.container_id, error.lease) == ("c" * 64, "l" * 32)


async def test_oversized_job_refuses_the_batch_before_anything_runs(fake: FakeRunner) -> None:
    jobs = [*jobs_of(3), Job(id="huge", spec=spec(memory=300 * MiB))]
    with pytest.raises(SpecError, match="job 'huge'"):
        await run_many(
            jobs, parallel=2, host_memory_bytes=200 * MiB, host_cpus=2, backend=backend_of(fake)
        )
    assert fake.peak == 0


async def test_duplicate_ids_are_refused(fake: FakeRunner) -> None:
    jobs = [Job(id="x", spec=spec()), Job(id="x", spec=spec())]
    with pytest.raises(SpecError, match=r"jobs\[1\]\.id"):
        await run_many(
            jobs, parallel=1, host_memory_bytes=MiB * 1024, host_cpus=1, backend=backend_of(fake)
        )


async def test_cancelling_run_many_cancels_every_run_in_flight(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    seen: list[JobResult] = []
    with trio.move_on_after(1.5):
        await run_many(
            jobs_of(10),
            parallel=4,
            host_memory_bytes=10**12,
            host_cpus=64,
            backend=backend_of(fake),
            on_result=seen.append,
        )
    assert len(seen) == 4  # the first wave finished at t=1
    assert fake.cancelled == 4  # the second wave was cancelled; the rest never started
    assert fake.active == 0


async def test_an_on_result_failure_stops_the_batch_and_is_reraised(
    fake: FakeRunner, autojump_clock: trio.testing.MockClock
) -> None:
    def explode(result: JobResult) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        await run_many(
            jobs_of(6),
            parallel=2,
            host_memory_bytes=10**12,
            host_cpus=64,
            backend=backend_of(fake),
            on_result=explode,
        )
    assert fake.active == 0


async def test_a_full_supervisor_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    from sbxkit.errors import CapacityExhausted

    calls: list[float] = []

    async def full_twice(spec: SandboxSpec, stdin: bytes | None = None, **kw: Any) -> RunResult:
        calls.append(trio.current_time())
        if len(calls) <= 2:
            raise CapacityExhausted("capacity exhausted: 64 live sandboxes", code="capacity")
        return fake_result("ok")

    results = await run_many(
        jobs_of(1),
        parallel=1,
        host_memory_bytes=10**12,
        host_cpus=8,
        backend=backend_of(FnBackend(full_twice)),
    )
    assert results[0].ok
    assert len(calls) == 3

    calls.clear()

    async def always_full(spec: SandboxSpec, stdin: bytes | None = None, **kw: Any) -> RunResult:
        calls.append(trio.current_time())
        raise CapacityExhausted("capacity exhausted", code="capacity")

    results = await run_many(
        jobs_of(1),
        parallel=1,
        host_memory_bytes=10**12,
        host_cpus=8,
        backend=backend_of(FnBackend(always_full)),
        capacity_wait_s=5.0,
    )
    assert results[0].error is not None
    assert results[0].error.type == "CapacityExhausted"
    assert calls[-1] - calls[0] <= 5.0


@pytest.mark.parametrize(
    ("memory", "cpus", "field"),
    [(0, 2.0, "host_memory_bytes"), (MiB, 0.0, "host_cpus"), (MiB, float("nan"), "host_cpus")],
)
async def test_bad_budgets_are_refused(
    fake: FakeRunner, memory: int, cpus: float, field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        await run_many(
            jobs_of(1),
            parallel=1,
            host_memory_bytes=memory,
            host_cpus=cpus,
            backend=backend_of(fake),
        )
    assert caught.value.field == field


# --- the jobs file -------------------------------------------------------------------------------


def line(**fields: Any) -> str:
    doc: dict[str, Any] = {
        "id": "a",
        "image": "sbxkit-test/busybox:latest",
        "command": ["true"],
        "limits": LIMITS,
    }
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


def jsonl(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def test_jobs_decode_with_stdin_env_and_blank_lines() -> None:
    data = jsonl(line(id="a", stdin="héllo\n", env={"K": "v"}), "", "  ", line(id=2))
    jobs = decode_jobs(data)
    assert [j.id for j in jobs] == ["a", 2]
    assert jobs[0].stdin == "héllo\n".encode()
    checked = jobs[0].spec
    assert isinstance(checked, CheckedSpec)  # checked here, so the run does not check again
    assert checked.spec.env == {"K": "v"}
    assert checked.spec.limits.memory_bytes == 64 * MiB
    assert jobs[1].stdin is None


def refusal(data: bytes) -> JobsFileError:
    with pytest.raises(JobsFileError) as caught:
        decode_jobs(data, "jobs.jsonl")
    return caught.value


@pytest.mark.parametrize(
    ("bad", "field", "rule"),
    [
        ('{"id": "b", "image": ', "(line)", "invalid JSON"),
        ("[1, 2]", "(line)", "must be a JSON object"),
        (line(id=...), "id", "required field is missing"),
        (line(id=True), "id", "must be a string or an integer"),
        (line(id=""), "id", "must not be empty"),
        (line(stdin=5), "stdin", "must be a string"),
        (line(imagee="x"), "imagee", "unknown field"),
        (line(limits={**LIMITS, "memory_bytes": 1.5}), "limits.memory_bytes", "Expected `int"),
        (line(limits={**LIMITS, "memory_bytes": "64 pots"}), "limits.memory_bytes", "unknown unit"),
        (line(limits={**LIMITS, "memory_bytes": "lots"}), "limits.memory_bytes", "not a size"),
        (line(limits={**LIMITS, "timeout_s": None}), "limits.timeout_s", "mandatory"),
        (line(limits={**LIMITS, "pids": 0}), "limits.pids", "must be > 0"),
        (line(user="0:0"), "user", "root users are refused"),
        (line(command=[]), "command", "non-empty list"),
        (line(image=...), "image", "required field is missing"),
    ],
)
def test_a_bad_line_is_named_by_number_and_field(bad: str, field: str, rule: str) -> None:
    error = refusal(jsonl(line(id="first"), "", bad, line(id="last")))
    assert error.line == 3
    assert error.field == field
    assert rule in error.rule
    assert str(error).startswith(f"jobs.jsonl line 3: {field}: ")
    assert isinstance(error, SpecError)


def test_a_repeated_id_names_both_lines() -> None:
    error = refusal(jsonl(line(id="x"), line(id="y"), line(id="x")))
    assert (error.line, error.field) == (3, "id")
    assert "line 1" in error.rule


# --- resume --------------------------------------------------------------------------------------


def result_json(job_id: JobId, status: str = "exited") -> bytes:
    """A complete line as sbxkit writes it: a result's, or an error's (``error``, ``lost``)."""
    if status in ("error", "lost"):
        failed = ErrorDoc(type="ImageError", message="gone")
        return msgspec.json.encode(ErrorResultDoc(id=job_id, status=status, error=failed)) + b"\n"
    return msgspec.json.encode(ResultLine(id=job_id, status=status, exit_code=0)) + b"\n"


def test_scan_collects_the_ids_done_and_the_error_lines() -> None:
    data = result_json("a") + result_json(2) + result_json("c", "error")
    scan = scan_results(data)
    assert scan.done == {"a", 2, "c"}
    assert scan.errors == {"c"}
    assert (scan.keep_bytes, scan.needs_newline) == (len(data), False)


def test_scan_drops_a_crashs_trailing_fragment() -> None:
    whole = result_json("a")
    scan = scan_results(whole + b'{"id":"b","sta')
    assert scan.done == {"a"}
    assert scan.keep_bytes == len(whole)


def test_scan_keeps_a_complete_last_record_that_lost_its_newline() -> None:
    data = result_json("a") + result_json("b").rstrip(b"\n")
    scan = scan_results(data)
    assert scan.done == {"a", "b"}
    assert (scan.keep_bytes, scan.needs_newline) == (len(data), True)


def test_scan_refuses_a_corrupt_complete_line() -> None:
    with pytest.raises(ResultsFileError) as caught:
        scan_results(result_json("a") + b"garbage\n" + result_json("b"), "out.jsonl")
    assert caught.value.line == 2
    assert str(caught.value).startswith("out.jsonl line 2: not a result line")


def test_prepare_repairs_the_file_and_resume_skips_exactly_the_done_ids(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert prepare_results(out).done == set()
    assert not out.exists()
    out.write_bytes(result_json("j1") + result_json("j3") + b'{"id":"j')
    scan = prepare_results(out)
    assert out.read_bytes() == result_json("j1") + result_json("j3")
    assert scan.moved_to is not None  # the torn line is moved aside, not deleted
    assert Path(scan.moved_to).read_bytes() == b'{"id":"j'
    jobs = decode_jobs(jsonl(*(line(id=f"j{i}") for i in range(5))))
    assert [j.id for j in pending_jobs(jobs, scan)] == ["j0", "j2", "j4"]
    out.write_bytes(result_json("j1").rstrip(b"\n"))
    assert prepare_results(out).done == {"j1"}
    assert out.read_bytes() == result_json("j1")


# --- the results writer --------------------------------------------------------------------------


def job_result(stdout: bytes = b"out", **kw: Any) -> JobResult:
    result = msgspec.structs.replace(fake_result("x"), stdout=stdout, stderr=b"\xff\xfeerr")
    return JobResult(id="a", result=result, started_at=1.0, finished_at=3.5, **kw)


def test_result_lines_are_one_line_of_utf8_with_raw_byte_counts() -> None:
    encoded = encode_result(job_result(b"two\nlines\x00\xc3("))
    assert encoded.count(b"\n") == 1
    assert encoded.endswith(b"\n")
    doc = json.loads(encoded)
    assert doc["stdout"] == "two\nlines\x00\ufffd("
    assert doc["stdout_bytes"] == 12
    assert doc["stderr"] == "\ufffd\ufffderr"
    assert doc["stderr_bytes"] == 5
    assert doc["status"] == "exited"
    assert doc["exit_code"] == 0
    assert doc["error"] is None
    assert doc["container_id"] == "c" * 64
    assert doc["timings"]["elapsed_s"] == 2.5
    assert set(doc["timings"]) >= {"queued_s", "create_s", "start_s", "run_s", "remove_s"}


def test_error_lines_carry_the_class_and_message() -> None:
    done = JobResult(id=7, error=JobError(type="ImageError", message="image 'x': missing"))
    doc = json.loads(encode_result(done))
    assert doc["id"] == 7
    assert doc["status"] == "error"
    # The error object of ``sbxkit run --json`` (docs/cli.md); the container and lease beside it.
    assert doc["error"] == {"type": "ImageError", "message": "image 'x': missing", "field": None}
    assert (doc["container_id"], doc["lease"]) == (None, None)


def test_writer_appends_whole_lines_and_loops_over_short_writes(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(result_json("old"))
    import os

    def short(fd: int, data: bytes) -> int:
        return os.write(fd, data[:3])

    writer = ResultsWriter(out, write=short)
    writer.append(encode_result(job_result()))
    writer.sync()
    writer.close()
    lines = out.read_bytes().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["id"] == "a"


def test_a_failed_write_never_leaves_a_partial_line(tmp_path: Path) -> None:
    import os

    out = tmp_path / "out.jsonl"
    before = result_json("old")
    out.write_bytes(before)
    calls = {"n": 0}

    def fails_halfway(fd: int, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    writer = ResultsWriter(out, write=fails_halfway)
    with pytest.raises(OSError, match="No space"):
        writer.append(encode_result(job_result(b"x" * 10_000)))
    writer.close()
    assert out.read_bytes() == before
    assert scan_results(out.read_bytes()).keep_bytes == len(before)


def test_writer_refuses_anything_but_one_line(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "out.jsonl")
    try:
        for bad in (b"{}", b"{}\n{}\n"):
            with pytest.raises(ValueError, match="one line"):
                writer.append(bad)
    finally:
        writer.close()


# --- progress ------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_line_says_done_running_queued_failures_rate_and_eta() -> None:
    text = format_progress(
        done=30, total=100, failed=2, errors=1, ran=20, elapsed_s=10.0, running=8
    )
    assert text == (
        "30/100 done · 8 running · 62 queued · 2 failed · 1 error · 2.00 jobs/s · ETA 0:35"
    )
    assert "ETA ?" in format_progress(done=0, total=5, failed=0, errors=0, ran=0, elapsed_s=1)
    assert "ETA 0:00" in format_progress(done=5, total=5, failed=0, errors=0, ran=5, elapsed_s=1)


def test_progress_is_redrawn_with_cr_on_a_terminal() -> None:
    now = [0.0]
    stream = Terminal(tty=True)
    progress = Progress(4, 1, stream, clock=lambda: now[0])
    now[0] = 2.0
    progress.record(job_result())
    failed = msgspec.structs.replace(fake_result("x"), exit_code=1)
    progress.record(JobResult(id="b", result=failed))
    progress.record(JobResult(id="c", error=JobError(type="SbxError", message="m")))
    progress.finish()
    text = stream.getvalue()
    assert text.startswith("\r1/4 done") or text.startswith("\r2/4 done")
    assert "\r4/4 done · 0 running · 0 queued · 1 failed · 1 error · 1.50 jobs/s · ETA 0:00" in (
        text
    )
    assert text.endswith("\n")
    assert (progress.failed, progress.errors) == (1, 1)


@pytest.mark.parametrize("width", [10, 30, 45, 60, 200])
def test_the_status_line_fits_the_terminal_dropping_parts_from_the_end(width: int) -> None:
    full = format_progress(done=3, total=10, failed=1, errors=0, ran=3, elapsed_s=3.0, running=2)
    fitted = format_progress(
        done=3, total=10, failed=1, errors=0, ran=3, elapsed_s=3.0, running=2, width=width
    )
    assert len(fitted) <= width
    assert full.startswith(fitted)
    assert fitted == full or full[len(fitted) :].startswith(" · ") or len(fitted) == width


def test_progress_counts_jobs_started_until_they_finish() -> None:
    progress = Progress(3, 0, Terminal(tty=False))
    progress.start("a")
    progress.start("b")
    assert progress.running == 2
    progress.record(job_result())
    assert (progress.running, progress.done) == (1, 1)


def test_no_progress_when_stderr_is_not_a_terminal() -> None:
    stream = Terminal(tty=False)
    progress = Progress(2, 0, stream)
    progress.record(job_result())
    progress.finish()
    assert stream.getvalue() == ""
    assert progress.done == 1


async def test_run_many_ahead_bounds_what_waits_for_a_slow_first_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``ahead`` (``sbxkit batch --order input``): no job starts more than ``ahead`` places
    after the earliest one running, so the lines held for input order stay fewer than it."""

    async def run(spec: SandboxSpec, stdin: bytes | None = None, **_: Any) -> RunResult:
        await trio.sleep(100 if spec.command[0] == "slow" else 1)
        return fake_result(spec.command[0])

    jobs = [Job(id="j0", spec=spec(command="slow")), *jobs_of(9)[1:]]
    for ahead, expect_wait in ((3, True), (None, False)):
        order = InputOrder(job.id for job in jobs)
        most = [0]

        def held(done: JobResult, order: InputOrder = order, most: list[int] = most) -> None:
            order.add(done.id, b"line")
            most[0] = max(most[0], order.held)

        results = await run_many(
            jobs, parallel=4, backend=backend_of(FnBackend(run)), on_result=held, ahead=ahead
        )
        by_id = {r.id: r for r in results}
        assert (by_id["j3"].started_at >= by_id["j0"].finished_at) is expect_wait
        assert most[0] == (2 if ahead == 3 else 8)
        assert order.held == 0
