"""The blocking API and the asyncio recipe against the real engine: results as from trio,
Ctrl-C and task cancellation remove the container before control returns (the witness sees
it gone at once, no waiting), sessions clean up however their block ends."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import sbxkit
import sbxkit.aio
import sbxkit.blocking
from sbxkit._consumers.session import SandboxExpired
from tests.engine.helpers import (
    BASE_LIMITS,
    SIGINT_AT_DEFAULT,
    limits,
    piped,
    processes_with_marker,
    spec,
    unique,
    wait_until,
)
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"


def labelled(image: str, script: str, label: str, **overrides: object) -> sbxkit.SandboxSpec:
    base = spec(image, script, **overrides)
    return sbxkit.SandboxSpec(
        image=base.image, command=base.command, limits=base.limits, labels={TEST_LABEL: label}
    )


def ours(witness: Witness, label: str) -> list[dict[str, object]]:
    return witness.containers(label=f"{TEST_LABEL}={label}")


def running(witness: Witness, label: str) -> bool:
    return any(c.get("State") == "running" for c in ours(witness, label))


def test_blocking_run_returns_the_result(witness: Witness, busybox: str) -> None:
    result = sbxkit.blocking.run(
        spec(busybox, "read x; echo got $x; exit 3"), b"hi\n", socket_path=witness.socket_path
    )
    assert (result.status, result.exit_code, result.stdout) == ("exited", 3, b"got hi\n")


def test_blocking_run_raises_spec_errors_plainly(busybox: str) -> None:
    bad = sbxkit.SandboxSpec(image=busybox, command=["true"], limits=limits(pids=0))
    with pytest.raises(sbxkit.SpecError) as caught:
        sbxkit.blocking.run(bad)
    assert caught.value.field == "limits.pids"


def test_blocking_run_many(witness: Witness, busybox: str) -> None:
    jobs = [sbxkit.Job(id=i, spec=spec(busybox, f"echo {i}")) for i in range(3)]
    results = sbxkit.blocking.run_many(jobs, parallel=3, socket_path=witness.socket_path)
    assert sorted((r.id, r.result.stdout) for r in results if r.result) == [
        (i, f"{i}\n".encode()) for i in range(3)
    ]


def test_blocking_sandbox_session_puts_execs_and_gets(witness: Witness, busybox: str) -> None:
    label = unique("blk")
    with sbxkit.blocking.open_sandbox(
        labelled(busybox, "true", label), socket_path=witness.socket_path
    ) as box:
        box.put_files({"job/in.txt": b"3 4\n"})
        result = box.exec(["sh", "-c", "wc -w < /tmp/job/in.txt > /tmp/job/out.txt"])
        assert result.ok, result
        assert box.get_files(["job/out.txt"]) == {"job/out.txt": b"2\n"}
        assert running(witness, label)
    assert ours(witness, label) == []  # removed when the block ended, before this line


def test_blocking_sandbox_is_removed_when_the_block_raises(witness: Witness, busybox: str) -> None:
    label = unique("blk")

    def use_then_fail() -> None:
        with sbxkit.blocking.open_sandbox(labelled(busybox, "true", label)) as box:
            assert box.exec(["true"]).ok
            _ = 1 / 0

    with pytest.raises(ZeroDivisionError):
        use_then_fail()
    assert ours(witness, label) == []


def test_blocking_sandbox_expiry_is_raised_after_the_block(witness: Witness, busybox: str) -> None:
    label = unique("blk")

    def outstay() -> None:
        with sbxkit.blocking.open_sandbox(labelled(busybox, "true", label, timeout_s=1)):
            time.sleep(2.5)

    with pytest.raises(SandboxExpired):
        outstay()
    assert ours(witness, label) == []


RUN_UNTIL_INTERRUPTED = {
    "run": """
try:
    sbxkit.blocking.run(spec)
except BaseException as exc:
    print(type(exc).__name__, flush=True)
""",
    "sandbox-exec": """
try:
    with sbxkit.blocking.open_sandbox(spec) as box:
        box.exec(["sleep", "60"])
except BaseException as exc:
    print(type(exc).__name__, flush=True)
""",
}


@pytest.mark.parametrize("kind", sorted(RUN_UNTIL_INTERRUPTED))
def test_ctrl_c_removes_the_sandbox_then_raises_keyboard_interrupt(
    witness: Witness, busybox: str, kind: str
) -> None:
    label = unique("blk")
    script = (
        SIGINT_AT_DEFAULT
        + textwrap.dedent(
            f"""
        import sbxkit, sbxkit.blocking
        spec = sbxkit.SandboxSpec(
            image={busybox!r}, command=["sleep", "60"], labels={{{TEST_LABEL!r}: {label!r}}},
            limits=sbxkit.Limits(**{ {**BASE_LIMITS, "timeout_s": 60}!r}),
        )
        """
        )
        + RUN_UNTIL_INTERRUPTED[kind]
    )
    proc = piped([sys.executable, "-c", script])
    try:
        assert wait_until(lambda: running(witness, label), 30), proc.poll()
        time.sleep(0.3)  # the exec (or the run's payload) is under way
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stdout.decode().strip() == "KeyboardInterrupt", stderr.decode()
    assert ours(witness, label) == []


def test_cancelling_the_asyncio_task_removes_the_container_before_it_finishes(
    witness: Witness, busybox: str
) -> None:
    label = unique("aio")

    async def main() -> float:
        task = asyncio.create_task(sbxkit.aio.run(labelled(busybox, "sleep 60", label)))
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(running, witness, label):
            assert time.monotonic() < deadline
            assert not task.done()
            await asyncio.sleep(0.05)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ours(witness, label) == []  # gone the moment the task finished cancelling
        return time.monotonic() - started

    cancel_s = asyncio.run(main())
    assert cancel_s < 30  # the 60 s payload was not waited out


def test_asyncio_timeout_removes_the_container(witness: Witness, busybox: str) -> None:
    label = unique("aio")

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2):
                await sbxkit.aio.run(labelled(busybox, "sleep 60", label))
        assert ours(witness, label) == []

    asyncio.run(main())


def test_the_asyncio_recipe_returns_results_and_errors(witness: Witness, busybox: str) -> None:
    async def main() -> None:
        result = await sbxkit.aio.run(spec(busybox, "echo hi"))
        assert result.stdout == b"hi\n"
        with pytest.raises(sbxkit.ImageError):
            await sbxkit.aio.run(spec("sbxkit-test/absent:latest", "true"))

    asyncio.run(main())


def test_the_naive_to_thread_recipe_leaves_the_container_running(
    witness: Witness, busybox: str
) -> None:
    """The premise: ``asyncio.to_thread(trio.run, …)`` cannot be cancelled."""
    import trio

    label = unique("aio")
    naive = labelled(busybox, "sleep 3", label)

    async def main() -> bool:
        task = asyncio.create_task(asyncio.to_thread(trio.run, sbxkit.run, naive))
        while not await asyncio.to_thread(running, witness, label):
            assert not task.done()
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return bool(ours(witness, label))

    assert asyncio.run(main())  # still there after the task was cancelled
    assert wait_until(lambda: not ours(witness, label), 30)  # only the payload's end removed it


def test_blocking_calls_work_inside_a_running_event_loop_and_from_any_thread(
    witness: Witness, busybox: str
) -> None:
    """A Jupyter cell is plain code running inside an asyncio loop; scripts use threads."""

    async def cell() -> bytes:
        return sbxkit.blocking.run(spec(busybox, "echo cell")).stdout

    assert asyncio.run(cell()) == b"cell\n"
    outputs: list[bytes] = []
    worker = threading.Thread(
        target=lambda: outputs.append(sbxkit.blocking.run(spec(busybox, "echo thread")).stdout)
    )
    worker.start()
    worker.join(60)
    assert outputs == [b"thread\n"]


# --- asyncio sandboxes: sbxkit.aio.open_sandbox ------------------------------------------------


def test_an_aio_sandbox_execs_moves_files_and_dirs_and_runs_a_process(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    label = unique("aio")
    tree = tmp_path / "src"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / "a.txt").write_bytes(b"alpha\n")

    async def main() -> None:
        async with sbxkit.aio.open_sandbox(labelled(busybox, "true", label)) as box:
            assert await asyncio.to_thread(running, witness, label)
            await box.put_files({"job/in.txt": b"3 4\n"})
            result = await box.exec(["sh", "-c", "wc -w < /tmp/job/in.txt > /tmp/job/out.txt"])
            assert result.ok, result
            assert await box.get_files(["job/out.txt"]) == {"job/out.txt": b"2\n"}
            await box.put_dir(tree, "/tmp/tree")
            await box.exec(["sh", "-c", "echo beta > /tmp/tree/lib/b.txt"])
            await box.get_dir("/tmp/tree", tmp_path / "back")

            shell = await box.start(["sh"])
            await shell.write(b"echo one\n")
            await shell.write(b"echo t")
            await shell.write(b"wo\n")
            seen, cursor = b"", 0
            while seen.count(b"\n") < 2:
                data, cursor, done = await shell.read(cursor, wait=10)
                assert not done
                seen += data
            assert seen == b"one\ntwo\n"
            assert shell.exit is None
            ended = await shell.kill()
            assert ended.status == "killed"
            assert shell.exit == ended
            worker = await box.start(["sh", "-c", "exit 5"], stdin=False)
            assert (await worker.wait(10)).exit_code == 5
        assert ours(witness, label) == []  # removed before the block's end returned

    asyncio.run(main())
    assert (tmp_path / "back" / "lib" / "a.txt").read_bytes() == b"alpha\n"
    assert (tmp_path / "back" / "lib" / "b.txt").read_bytes() == b"beta\n"


def test_an_aio_exec_timed_out_by_asyncio_is_killed_and_the_sandbox_goes_on(
    witness: Witness, busybox: str
) -> None:
    label = unique("aio")
    marker = str(8_000_000 + os.getpid() % 1_000_000)

    async def main() -> float:
        async with sbxkit.aio.open_sandbox(labelled(busybox, "true", label)) as box:
            began = time.monotonic()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(box.exec(["sleep", marker]), 1)
            cancelled_s = time.monotonic() - began
            # The trio side was cancelled: its process group is gone when wait_for raised.
            assert processes_with_marker(marker) == []
            assert (await box.exec(["echo", "still"])).stdout == b"still\n"
            process = await box.start(["sleep", marker])
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(process.wait(), 0.5)
            assert process.exit is None  # cancelling a wait leaves the process running
            assert (await process.kill()).status == "killed"
        assert ours(witness, label) == []
        return cancelled_s

    assert asyncio.run(main()) < 15  # not the exec's 20 s limit


def test_cancelling_an_aio_sandbox_block_removes_it_before_the_task_ends(
    witness: Witness, busybox: str
) -> None:
    label = unique("aio")

    async def hold(started: asyncio.Event) -> None:
        async with sbxkit.aio.open_sandbox(labelled(busybox, "true", label)) as box:
            started.set()
            await box.exec(["sleep", "60"])

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(hold(started))
        await asyncio.wait_for(started.wait(), 30)
        await asyncio.sleep(0.3)  # the exec is under way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ours(witness, label) == []  # gone the moment the task finished cancelling

        # Cancelled while it opens (or just after): nothing is left either.
        for delay in (0.05, 0.3):
            opening = asyncio.create_task(hold(asyncio.Event()))
            await asyncio.sleep(delay)
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
            assert ours(witness, label) == []

    asyncio.run(main())


def test_an_aio_sandbox_block_that_raises_or_outstays(witness: Witness, busybox: str) -> None:
    label = unique("aio")

    async def fail() -> None:
        async with sbxkit.aio.open_sandbox(labelled(busybox, "true", label)) as box:
            assert (await box.exec(["true"])).ok
            _ = 1 / 0

    async def outstay() -> None:
        async with sbxkit.aio.open_sandbox(labelled(busybox, "true", label, timeout_s=1)):
            await asyncio.sleep(2.5)

    async def refused() -> None:
        async with sbxkit.aio.open_sandbox(spec("sbxkit-test/absent:latest", "true")):
            raise AssertionError("never opened")

    with pytest.raises(ZeroDivisionError):
        asyncio.run(fail())
    assert ours(witness, label) == []
    with pytest.raises(SandboxExpired):
        asyncio.run(outstay())
    assert ours(witness, label) == []
    with pytest.raises(sbxkit.ImageError):
        asyncio.run(refused())
