"""PTY sessions against the real engine: the terminal, resize, exit status, caps, removal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio

from sbxkit._consumers.pty import PtySession, open_pty
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from tests.engine.helpers import container_exists, removal_after_sigkill, runtime_limits
from tests.engine.runtimes import pty_device_name
from tests.witness import Witness


async def read_until(pty: PtySession, needle: bytes, seconds: float = 10.0) -> bytes:
    seen = b""
    with trio.fail_after(seconds):
        while needle not in seen:
            chunk = await pty.receive_some()
            assert chunk, f"EOF before {needle!r}; saw {seen!r}"
            seen += chunk
    return seen


async def test_a_pty_round_trips_resizes_and_reports_the_exit_status(
    runtime: str | None, busybox: str, engine: Engine, witness: Witness
) -> None:
    spec = SandboxSpec(
        image=busybox, command=["/bin/sh"], limits=runtime_limits(runtime), runtime=runtime
    )
    async with open_pty(spec, size=(24, 80), engine=engine) as pty:
        await read_until(pty, b"$ ")
        await pty.send_all(b"stty size; tty\r")
        seen = await read_until(pty, pty_device_name(runtime))
        assert b"24 80" in seen
        await pty.resize(40, 132)
        await pty.send_all(b"echo ro''und; stty size\r")
        seen = await read_until(pty, b"40 132")
        assert b"round" in seen
        await pty.send_all(b"exit 7\r")
        while await pty.receive_some():
            pass
        result = await pty.wait()
        assert (result.status, result.exit_code) == ("exited", 7)
        container_id = pty.container_id
    assert not container_exists(witness, container_id)


async def test_pty_output_is_capped_exactly(
    runtime: str | None, busybox: str, engine: Engine
) -> None:
    cap = 5000
    spec = SandboxSpec(
        image=busybox,
        command=["sh", "-c", "stty raw -echo; head -c 10000 /dev/zero; sleep 100"],
        limits=runtime_limits(runtime, output_bytes=cap),
        runtime=runtime,
    )
    async with open_pty(spec, engine=engine) as pty:
        received = 0
        with trio.fail_after(10):
            while chunk := await pty.receive_some():
                received += len(chunk)
            result = await pty.wait()
    assert received == cap
    assert (result.status, result.exit_code) == ("output_exceeded", None)


async def test_the_time_limit_ends_a_pty(runtime: str | None, busybox: str, engine: Engine) -> None:
    spec = SandboxSpec(
        image=busybox,
        command=["sleep", "100"],
        limits=runtime_limits(runtime, timeout_s=1.0),
        runtime=runtime,
    )
    started = trio.current_time()
    async with open_pty(spec, engine=engine) as pty:
        assert await pty.receive_some() == b""
        result = await pty.wait()
    assert result.status == "timed_out"
    assert trio.current_time() - started < 5.0


CALLER = """
import sys, trio
from sbxkit._consumers.pty import open_pty
from sbxkit._model.spec import Limits, SandboxSpec

async def main():
    spec = SandboxSpec(image={image!r}, command=["/bin/sh"], runtime={runtime!r}, limits=Limits(
        cpus=0.5, memory_bytes=64 << 20, pids={pids}, output_bytes=1 << 20, timeout_s=120))
    async with open_pty(spec, size=(24, 80)) as pty:
        print(pty.container_id, flush=True)
        await pty.send_all(b"echo ready\\r")
        await trio.sleep(600)

trio.run(main)
"""


def test_a_sigkilled_pty_caller_leaves_no_container(
    runtime: str | None, busybox: str, witness: Witness, tmp_path: Path
) -> None:
    """The default owner is the supervisor: killing the caller closes its connection, and the
    supervisor removes the container."""
    script = tmp_path / "caller.py"
    script.write_text(
        CALLER.format(image=busybox, runtime=runtime, pids=runtime_limits(runtime).pids)
    )
    caller = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert caller.stdout is not None
        container_id = caller.stdout.readline().decode().strip()
        assert container_id, caller.stderr.read().decode() if caller.stderr else ""
        assert witness.get(f"/containers/{container_id}/json")["State"]["Running"]
        elapsed = removal_after_sigkill(caller, witness, container_id)
    finally:
        if caller.poll() is None:
            caller.kill()
        caller.wait(10)
    print(f"\nPTY caller SIGKILLed -> container gone in {elapsed:.3f} s")
    assert elapsed < 2.0
