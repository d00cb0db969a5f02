"""Stdio workers against the real engine: framed messages, stderr capture, caps, removal."""

from __future__ import annotations

import json

import trio

from sbxkit._consumers.stdio import StdioWorker, open_stdio_worker
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from tests.engine.helpers import container_exists, limits
from tests.witness import Witness

LINE_ECHO = """
import sys
sys.stderr.write("worker up\\n")
sys.stderr.flush()
while True:
    line = sys.stdin.readline()
    if not line:
        break
    sys.stdout.write(line)
    sys.stdout.flush()
sys.stderr.write("worker done\\n")
"""


class LineReader:
    """Newline-framed messages over a trio ReceiveStream."""

    def __init__(self, worker: StdioWorker) -> None:
        self._stream = worker.stdout
        self._buffer = b""

    async def line(self) -> bytes:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some(7)  # small reads: framing must not care
            if not chunk:
                raise EOFError(self._buffer)
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


async def test_a_stdio_worker_echoes_framed_messages(
    python_image: str, engine: Engine, witness: Witness
) -> None:
    spec = SandboxSpec(image=python_image, command=["python3", "-c", LINE_ECHO], limits=limits())
    messages = [
        {"jsonrpc": "2.0", "id": i, "method": "ping", "params": {"n": "é" * i}} for i in range(3)
    ]
    async with open_stdio_worker(spec, engine=engine) as worker:
        reader = LineReader(worker)
        with trio.fail_after(20):
            for message in messages:
                await worker.stdin.send_all(json.dumps(message).encode() + b"\n")
            replies = [json.loads(await reader.line()) for _ in messages]
            await worker.stdin.send_eof()
            assert await worker.stdout.receive_some() == b""
            result = await worker.wait()
        container_id = worker.container_id
    assert replies == messages
    assert (result.status, result.exit_code) == ("exited", 0)
    assert result.stderr == b"worker up\nworker done\n"
    assert not container_exists(witness, container_id)


async def test_stdout_and_stderr_caps_end_the_worker(busybox: str, engine: Engine) -> None:
    cap = 1000
    flood = SandboxSpec(
        image=busybox,
        command=["sh", "-c", f"head -c {cap + 1} /dev/zero; sleep 100"],
        limits=limits(output_bytes=cap),
    )
    async with open_stdio_worker(flood, engine=engine) as worker:
        received = b""
        with trio.fail_after(10):
            while chunk := await worker.stdout.receive_some():
                received += chunk
            result = await worker.wait()
    assert received == bytes(cap)
    assert (result.status, result.overflowed) == ("output_exceeded", "stdout")

    exact = SandboxSpec(
        image=busybox,
        command=["sh", "-c", f"head -c {cap} /dev/zero >&2"],
        limits=limits(output_bytes=cap),
    )
    async with open_stdio_worker(exact, engine=engine) as worker:
        with trio.fail_after(10):
            assert await worker.stdout.receive_some() == b""
            result = await worker.wait()
    assert (result.status, result.exit_code, result.stderr) == ("exited", 0, bytes(cap))
