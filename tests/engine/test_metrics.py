"""Live metrics against the real engine: ``Sandbox.metrics`` (trio, asyncio, blocking) and
``sbxkit top`` read a running sandbox's cgroup on the host, and its figures follow what its
payload does — memory it holds, CPU it burns, processes it forks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

import sbxkit.aio
import sbxkit.blocking
from sbxkit._consumers.session import Sandbox, open_sandbox
from sbxkit._lifecycle.metrics import MetricsReader
from sbxkit._model.result import Metrics
from sbxkit._model.spec import MiB, SandboxSpec
from sbxkit.engine.client import Engine
from sbxkit.errors import MetricsUnavailable, SpecError
from tests.engine.helpers import runtime_limits
from tests.witness import Witness

HOLD_100_MIB = "import time; held = b'x' * (100 << 20); print('held', flush=True); time.sleep(60)"
BUSY = "while True: pass"
SLEEPERS = "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 60 & done; wait"


def metrics_spec(image: str, **overrides: object) -> SandboxSpec:
    # A long time limit: in the cgroup v2 cell's emulated VM, 60 s did not see the test through.
    limits = {"memory_bytes": 256 * MiB, "cpus": 1.0, "timeout_s": 300.0, **overrides}
    return SandboxSpec(image=image, command=["unused"], limits=runtime_limits(None, **limits))


async def reading_until(
    sandbox: Sandbox, holds: Callable[[Metrics], bool], seconds: float = 20.0
) -> tuple[Metrics, list[Metrics]]:
    """Readings every 0.2 s until one ``holds``; fails with what was seen if none does."""
    seen: list[Metrics] = []
    with trio.move_on_after(seconds):
        async for sample in sandbox.metrics(interval_s=0.2):
            seen.append(sample)
            if holds(sample):
                return sample, seen
    pytest.fail(f"no reading held within {seconds} s: {seen[-3:]}")


RAW_FILES = {
    "v1": ("memory.usage_in_bytes", "memory.max_usage_in_bytes", "cpuacct.usage", "pids.current"),
    "v2": ("memory.current", "memory.peak", "cpu.stat", "pids.current", "io.stat"),
}


def print_raw_files(reader: MetricsReader) -> None:
    """The counters' files as the kernel wrote them, for the record (``pytest -s``): the
    unit tests' v2 samples (tests/unit/test_cgroup_stats.py) were taken from this output."""
    places = reader.places
    for name in RAW_FILES[places.version]:
        directory = {"cpuacct.usage": places.cpu, "pids.current": places.pids}.get(name)
        path = f"{directory or places.memory}/{name}"
        with contextlib.suppress(FileNotFoundError), open(path) as file:
            print(f"===== {places.version} {name}\n{file.read()}", end="")


async def test_metrics_follow_memory_cpu_and_pids(
    engine: Engine, python_image: str, witness: Witness
) -> None:
    async with open_sandbox(metrics_spec(python_image), engine=engine) as sandbox:
        first, _ = await reading_until(sandbox, lambda m: True)
        assert first.cgroup in ("v1", "v2")
        assert first.cpu_rate is None  # no previous reading to take a rate over
        assert first.memory_bytes is not None
        assert first.memory_bytes < 100 * MiB, first
        assert first.pids is not None
        assert first.pids >= 1, first  # the keep-alive
        assert first.io_read_bytes is not None, first
        assert first.io_write_bytes is not None, first

        holder = await sandbox.start(["python3", "-c", HOLD_100_MIB])
        held, _ = await reading_until(
            sandbox, lambda m: (m.memory_bytes or 0) > 100 * MiB and (m.pids or 0) > first.pids
        )
        assert held.memory_peak_bytes is not None
        print_raw_files(await sandbox.metrics_reader())
        assert held.memory_peak_bytes >= held.memory_bytes > 100 * MiB, held
        await holder.kill()
        await reading_until(sandbox, lambda m: (m.memory_bytes or 0) < 100 * MiB)
        peak = (await reading_until(sandbox, lambda m: True))[0].memory_peak_bytes
        assert peak is not None
        assert peak > 100 * MiB  # the high-water mark stays

        # Eight engineers share two cores here: the busy loop's share is not a number to
        # expect, but its CPU time piling up, and the rate saying so, are.
        idle, _ = await reading_until(sandbox, lambda m: m.cpu_rate is not None)
        assert idle.cpu_time_s is not None
        idle_s: float = idle.cpu_time_s
        busy = await sandbox.start(["python3", "-c", BUSY])
        await reading_until(
            sandbox,
            lambda m: (m.cpu_time_s or 0) > idle_s + 0.5 and (m.cpu_rate or 0) > 0.05,
            seconds=40,
        )
        await busy.kill()

        sleepers = await sandbox.start(["sh", "-c", SLEEPERS])
        await reading_until(sandbox, lambda m: (m.pids or 0) >= first.pids + 11)
        await sleepers.kill()


async def test_metrics_end_when_the_sandbox_is_gone(
    engine: Engine, busybox: str, witness: Witness
) -> None:
    """The container killed under the iterator: its cgroup goes, and the iteration ends (no
    error, no hang) within a couple of intervals."""
    async with open_sandbox(metrics_spec(busybox), engine=engine) as sandbox:
        seen: list[Metrics] = []
        three, ended = trio.Event(), trio.Event()

        async def iterate() -> None:
            async for sample in sandbox.metrics(interval_s=0.1):
                seen.append(sample)
                if len(seen) == 3:
                    three.set()
            ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(iterate)
            with trio.fail_after(10):
                await three.wait()
            await engine.container_kill(sandbox.container_id)
            with trio.fail_after(10):
                await ended.wait()
        with pytest.raises(MetricsUnavailable, match=r"it is not running \(exited\)"):
            await MetricsReader.open(engine, sandbox.container_id)
        assert len(seen) >= 3
        assert all(m.memory_bytes for m in seen)
    with pytest.raises(SpecError, match="interval_s"):
        sandbox.metrics(interval_s=0)


async def test_metrics_faces_asyncio_and_blocking(busybox: str, witness: Witness) -> None:
    spec = metrics_spec(busybox)

    async def from_asyncio() -> list[Metrics]:
        async with sbxkit.aio.open_sandbox(spec) as sandbox:
            got: list[Metrics] = []
            async for sample in sandbox.metrics(interval_s=0.1):
                got.append(sample)
                if len(got) == 2:
                    break
            return got

    def from_blocking() -> list[Metrics]:
        with sbxkit.blocking.open_sandbox(spec) as sandbox:
            readings = sandbox.metrics(interval_s=0.1)
            return [next(readings), next(readings)]

    results: dict[str, list[Metrics]] = {}
    errors: list[BaseException] = []

    def both() -> None:
        try:
            results["aio"] = asyncio.run(from_asyncio())
            results["blocking"] = from_blocking()
        except BaseException as exc:  # raised in the test below, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=both)
    thread.start()
    await trio.to_thread.run_sync(thread.join)
    if errors:
        raise errors[0]
    assert set(results) == {"aio", "blocking"}
    for face, got in results.items():
        assert len(got) == 2, face
        assert got[0].cpu_rate is None, (face, got)
        assert got[1].cpu_rate is not None, (face, got)
        assert got[1].pids is not None
        assert got[1].pids >= 1, (face, got)


async def test_top_no_stream_lists_a_live_sandbox(busybox: str, witness: Witness) -> None:
    """``sbxkit top --no-stream`` (the supervisor's journal, as the tests' SBXKIT_STATE_DIR
    names it) shows the open sandbox with its figures, in JSON and as a table."""
    async with open_sandbox(metrics_spec(busybox)) as sandbox:
        holder = await sandbox.start(["sh", "-c", "sleep 60 & sleep 60 & wait"])
        env = dict(os.environ)
        top = [sys.executable, "-m", "sbxkit", "top", "--no-stream", "--interval", "0.3"]
        shown = await trio.run_process([*top, "--format", "json"], capture_stdout=True, env=env)
        rows = [json.loads(line) for line in shown.stdout.decode().splitlines()]
        mine = [row for row in rows if row["container_id"] == sandbox.container_id]
        assert len(mine) == 1, rows
        assert mine[0]["lease"] == sandbox.lease, mine
        assert mine[0]["error"] is None, mine
        figures = mine[0]["metrics"]
        assert figures["pids"] >= 4, figures  # the keep-alive, sh and its two sleeps
        assert figures["memory_bytes"] > 0, figures
        assert figures["cpu_rate"] is not None, figures
        table = await trio.run_process(top, capture_stdout=True, env=env)
        lines = table.stdout.decode().splitlines()
        assert lines[0].split()[:3] == ["CONTAINER", "LEASE", "CPU"], lines
        assert any(line.startswith(sandbox.container_id[:12]) for line in lines[1:]), lines
        await holder.kill()


def test_top_without_a_state_dir_shows_none(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sbxkit", "top", "--no-stream", "--format", "json"],
        env={**os.environ, "SBXKIT_STATE_DIR": f"{tmp_path}/none"},
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == b""
