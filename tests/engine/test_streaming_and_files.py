"""``run(..., on_output=...)`` streams chunks as they arrive, within the caps; ``run(...,
files=...)`` puts files into ``/tmp`` of a one-shot run. Against the real engine."""

from __future__ import annotations

import pytest

import sbxkit
from sbxkit.engine.client import Engine
from tests.engine.helpers import spec
from tests.engine.oneshot_paths import OneShot


class Seen(Exception):
    pass


async def test_output_arrives_while_the_payload_still_runs(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    chunks: list[tuple[str, bytes]] = []

    def on_output(stream: str, chunk: bytes) -> None:
        chunks.append((stream, chunk))
        if b"first" in b"".join(c for s, c in chunks if s == "stdout"):
            raise Seen  # only a streamed chunk can stop a payload that sleeps past its limit

    payload = spec(busybox, "echo first; sleep 30; echo never", timeout_s=20)
    with pytest.raises(Seen):
        await oneshot(payload, engine=engine, on_output=on_output)
    assert b"".join(c for _, c in chunks) == b"first\n"


async def test_the_callback_sees_exactly_what_the_caps_keep(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    payload = spec(
        busybox,
        "printf 'e%.0s' $(seq 5) >&2; i=0; while [ $i -lt 200 ]; do printf 0123456789; "
        "i=$((i+1)); done",
        output_bytes=1000,
    )
    result = await oneshot(payload, engine=engine, on_output=lambda s, c: chunks[s].append(c))
    assert result.status == "output_exceeded"
    assert b"".join(chunks["stdout"]) == result.stdout
    assert len(result.stdout) == 1000
    # The daemon copies the two streams in separate goroutines: stderr written first may still
    # arrive after the stdout overflow ended the run. Whatever arrived, the callback saw it all.
    assert b"".join(chunks["stderr"]) == result.stderr
    assert b"eeeee".startswith(result.stderr)


async def test_without_a_callback_nothing_changes(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    result = await oneshot(spec(busybox, "echo hi"), engine=engine)
    assert result.stdout == b"hi\n"


async def test_files_are_in_tmp_when_the_command_runs(engine: Engine, python_image: str) -> None:
    payload = sbxkit.SandboxSpec(
        image=python_image,
        command=["python3", "/tmp/job/main.py"],
        limits=spec(python_image, "true").limits,
    )
    files = {
        "job/main.py": b"print(open('/tmp/job/data.txt').read().upper())",
        "job/data.txt": b"x",
    }
    result = await sbxkit.run(payload, b"", engine=engine, files=files)
    assert (result.status, result.exit_code, result.stdout) == ("exited", 0, b"X\n")


async def test_a_run_with_files_keeps_the_time_limit_and_stdin(
    engine: Engine, busybox: str
) -> None:
    timed = await sbxkit.run(
        spec(busybox, "cat /tmp/a; sleep 30", timeout_s=1), engine=engine, files={"a": b"A"}
    )
    assert timed.status == "timed_out"
    assert timed.stdout == b"A"
    fed = await sbxkit.run(spec(busybox, "cat - /tmp/a"), b"in:", engine=engine, files={"a": b"A"})
    assert fed.stdout == b"in:A"


async def test_files_and_on_output_together_are_refused(busybox: str) -> None:
    with pytest.raises(sbxkit.SpecError) as caught:
        await sbxkit.run(spec(busybox, "true"), files={"a": b""}, on_output=lambda s, c: None)
    assert caught.value.field == "on_output"


async def test_measure_usage_reports_peak_memory_and_cpu_time_of_the_command(
    engine: Engine, python_image: str
) -> None:
    def measured(code: str) -> sbxkit.SandboxSpec:
        return sbxkit.SandboxSpec(
            image=python_image,
            command=["python3", "-c", code],
            limits=spec(python_image, "true", memory_bytes=256 << 20).limits,
        )

    idle = await sbxkit.run(measured("pass"), engine=engine, measure_usage=True)
    busy = await sbxkit.run(
        measured("b = bytearray(96 << 20); sum(range(20_000_000))"),
        engine=engine,
        measure_usage=True,
    )
    assert idle.ok, idle
    assert busy.ok, busy
    assert idle.usage is not None
    assert busy.usage is not None
    assert busy.usage.cgroup == idle.usage.cgroup
    assert idle.usage.memory_peak_bytes is not None
    assert busy.usage.memory_peak_bytes is not None
    assert busy.usage.memory_peak_bytes >= 96 << 20  # the cgroup saw the allocation
    assert idle.usage.memory_peak_bytes < 96 << 20
    assert busy.usage.memory_peak_bytes <= 256 << 20  # within the limit
    assert idle.usage.cpu_time_s is not None
    assert busy.usage.cpu_time_s is not None
    assert busy.usage.cpu_time_s > 2 * idle.usage.cpu_time_s  # the loop's CPU time is counted


async def test_a_plain_run_has_no_usage(engine: Engine, busybox: str) -> None:
    assert (await sbxkit.run(spec(busybox, "true"), engine=engine)).usage is None
