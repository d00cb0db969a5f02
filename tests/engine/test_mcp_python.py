"""``sbxkit mcp``'s output as it happens and its ``python`` tool (issue 44 item 3), driven by the
official SDK's own client over stdio and streamable HTTP (tests/engine/mcp_support.py): a
payload's output reaches the client's progress callback while it still runs; a client's
cancellation interrupts a python call (its state kept) and removes a run's sandbox; the
interpreter keeps its state across calls of one MCP session and not across sessions, and ends
with its session or its idle timeout; a PNG comes back as MCP image content and an exception
as an error result with its traceback. The autouse witness proves no container is left; the
stdio server process is gone after each test.
"""

from __future__ import annotations

import base64
import os
import re
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import mcp_types
import pytest
import trio
from mcp import Client

from tests.engine.mcp_support import CELLS, HttpServer, connect, mcp_servers, write_profile
from tests.witness import PYTHON, Witness

HEARTBEAT = re.compile(r"running for \d+ s")
TICKS = (
    "import sys, time\n"
    "for i in range(3):\n"
    "    print('tick', i, flush=True)\n"
    "    print('warn', i, file=sys.stderr, flush=True)\n"
    "    time.sleep(1)\n"
)
"""Prints over about three seconds: each tick must reach the client before the call ends."""


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path)


class Seen:
    """A call's progress notifications: (seconds since the call began, message)."""

    def __init__(self) -> None:
        self.began = time.monotonic()
        self.messages: list[tuple[float, str]] = []
        self.values: list[float] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.values.append(progress)
        self.messages.append((time.monotonic() - self.began, message or ""))

    def output(self) -> list[tuple[float, str]]:
        return [(at, text) for at, text in self.messages if not HEARTBEAT.fullmatch(text)]


async def streamed(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[Any, Seen, float]:
    seen = Seen()
    result = await client.call_tool(tool, arguments, progress_callback=seen)
    return result, seen, time.monotonic() - seen.began


def assert_streamed(seen: Seen, ended: float, stdout: str, stderr: str) -> None:
    """Every byte of output came as a message, in order per stream, the first tick well before
    the call ended, and progress values strictly increased."""
    texts = [text for _, text in seen.output()]
    joined = "".join(texts)
    assert [line for line in joined.splitlines() if line.startswith("tick")] == [
        "tick 0",
        "tick 1",
        "tick 2",
    ]
    assert sorted(joined.splitlines()) == sorted((stdout + stderr).splitlines())
    first = next(at for at, text in seen.output() if "tick 0" in text)
    assert first < ended - 1.5, (first, ended)  # it came while the payload still slept
    assert seen.values == sorted(set(seen.values))


@pytest.mark.parametrize("cell", CELLS)
async def test_output_streams_as_progress_while_a_payload_prints(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    async with connect(cell, profile, tmp_path) as client:
        command = ["python3", "-c", TICKS]
        result, seen, ended = await streamed(client, "run", {"command": command})
        fields = result.structured_content
        assert fields["status"] == "exited", fields
        assert_streamed(seen, ended, fields["stdout"], fields["stderr"])

        box = (await client.call_tool("sandbox_open", {})).structured_content["sandbox_id"]
        arguments = {"sandbox_id": box, "command": command}
        result, seen, ended = await streamed(client, "sandbox_exec", arguments)
        fields = result.structured_content
        assert_streamed(seen, ended, fields["stdout"], fields["stderr"])
        await client.call_tool("sandbox_close", {"sandbox_id": box})

        result, seen, ended = await streamed(client, "python", {"code": TICKS})
        fields = result.structured_content
        assert (fields["status"], result.is_error) == ("ok", False), result.content
        assert_streamed(seen, ended, fields["stdout"], fields["stderr"])

        quiet = await client.call_tool("python", {"code": "1 + 1"})  # no token: no progress
        assert quiet.structured_content["text"] == "2"
    assert mcp_servers(os.getpid()) == []


BEATING = (
    "import time\n"
    "while True:\n"
    "    with open('/tmp/beat', 'a') as f:\n"
    "        f.write('x')\n"
    "    print('beat', flush=True)\n"
    "    time.sleep(0.1)\n"
)
STILL = (
    "import os, time\n"
    "before = os.path.getsize('/tmp/beat')\n"
    "time.sleep(1)\n"
    "os.path.getsize('/tmp/beat') - before\n"
)


@pytest.mark.parametrize("cell", [*CELLS, "http-legacy"])
async def test_a_cancelled_python_call_is_interrupted_and_its_state_kept(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    """The client cancels a call that never ends (``notifications/cancelled``, or over the
    2026-07-28 protocol its closed response stream): the code stops — a file it appended to
    every 0.1 s stops growing — and the interpreter lives on with its variables; the session's
    end removes its sandbox."""
    async with connect(cell, profile, tmp_path) as client:
        await client.call_tool("python", {"code": "kept = 'still here'"})
        seen = Seen()
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def beat() -> None:
                    await client.call_tool("python", {"code": BEATING}, progress_callback=seen)

                nursery.start_soon(beat)
                deadline = time.monotonic() + 30
                while sum("beat" in text for _, text in seen.output()) < 3:
                    assert time.monotonic() < deadline, seen.messages
                    await trio.sleep(0.05)
                scope.cancel()
        assert len(witness.sbxkit_containers()) == 1
        after = await client.call_tool("python", {"code": "kept"})
        assert after.structured_content["text"] == "'still here'", after.content
        assert after.structured_content["fresh"] is False
        still = await client.call_tool("python", {"code": STILL})
        assert still.structured_content["text"] == "0", still.content
    assert await trio_wait(lambda: witness.sbxkit_containers() == [], 10)
    assert mcp_servers(os.getpid()) == []


async def trio_wait(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await trio.sleep(0.05)
    return True


async def test_python_state_lives_in_one_session_and_not_in_another(
    profile: Path, tmp_path: Path, witness: Witness
) -> None:
    """Two HTTP sessions (the 2025-11-25 protocol) of one server: each has its own
    interpreter; the one whose session ends has its sandbox removed, the other keeps its
    state; stopping the server removes the rest."""
    server = HttpServer(profile, tmp_path / "http-server.log")
    try:
        async with server.client(mode="legacy") as first:
            made = await first.call_tool("python", {"code": "secret = 41"})
            assert made.structured_content["fresh"] is True
            again = await first.call_tool("python", {"code": "secret + 1"})
            assert (again.structured_content["text"], again.structured_content["fresh"]) == (
                "42",
                False,
            )
            async with server.client(mode="legacy") as second:
                other = await second.call_tool("python", {"code": "secret"})
                assert other.is_error
                assert other.structured_content["fresh"] is True
                assert other.structured_content["error"]["name"] == "NameError"
                assert len(witness.sbxkit_containers()) == 2
                await second.call_tool("python", {"code": "secret = 'mine'"})
            assert await trio_wait(lambda: len(witness.sbxkit_containers()) == 1, 10)
            kept = await first.call_tool("python", {"code": "secret"})
            assert kept.structured_content["text"] == "41"
            fresh = await first.call_tool("python", {"code": "'secret' in dir()", "restart": True})
            assert fresh.structured_content["text"] == "False"
            assert fresh.structured_content["fresh"] is True
            assert len(witness.sbxkit_containers()) == 1
    finally:
        server.stop()
    assert witness.sbxkit_containers() == []
    assert not server.token_left_behind


def png(width: int, height: int) -> bytes:
    """A real RGB PNG made by the standard library, as the sandbox's code makes it too."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + b"".join(bytes([x * 40 % 256, y * 40 % 256, 200]) for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PICTURE = (
    "import struct, zlib\n"
    "def chunk(kind, data):\n"
    "    body = kind + data\n"
    "    return struct.pack('>I', len(data)) + body + struct.pack('>I', zlib.crc32(body))\n"
    "rows = b''.join(b'\\x00' + b''.join(bytes([x * 40 % 256, y * 40 % 256, 200])"
    " for x in range(4)) for y in range(6))\n"
    "header = struct.pack('>IIBBBBB', 4, 6, 8, 2, 0, 0, 0)\n"
    "class Picture:\n"
    "    def _repr_png_(self):\n"
    "        return (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', header)\n"
    "                + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))\n"
    "print('drawn')\n"
    "Picture()\n"
)


@pytest.mark.parametrize("cell", CELLS)
async def test_an_image_is_image_content_and_an_exception_an_error_result(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    async with connect(cell, profile, tmp_path) as client:
        result = await client.call_tool("python", {"code": PICTURE})
        assert not result.is_error, result.content
        images = [part for part in result.content if isinstance(part, mcp_types.ImageContent)]
        texts = [part.text for part in result.content if isinstance(part, mcp_types.TextContent)]
        assert [image.mime_type for image in images] == ["image/png"]
        data = base64.b64decode(images[0].data)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert data == png(4, 6)
        assert texts[0] == "drawn\n"
        assert result.structured_content["images"] == ["image/png"]
        assert "image/png" not in result.structured_content["data"]

        failed = await client.call_tool("python", {"code": "def f():\n    return 1 / 0\nf()"})
        assert failed.is_error
        error = failed.structured_content["error"]
        assert (error["name"], error["value"]) == ("ZeroDivisionError", "division by zero")
        [text] = [p.text for p in failed.content if isinstance(p, mcp_types.TextContent)]
        assert "return 1 / 0" in text
        assert text.rstrip().endswith("ZeroDivisionError: division by zero")

        slow = await client.call_tool(
            "python", {"code": "import time\ntime.sleep(30)", "timeout": 1}
        )
        assert slow.structured_content["status"] == "timed_out"
        assert (await client.call_tool("python", {"code": "2 ** 10"})).structured_content[
            "text"
        ] == "1024"

        died = await client.call_tool("python", {"code": "import os\nos._exit(3)"})
        assert died.is_error
        assert "restart: true" in died.structured_content["error"]["message"]
        back = await client.call_tool("python", {"code": "'back'", "restart": True})
        assert back.structured_content["text"] == "'back'"
    assert await trio_wait(lambda: witness.sbxkit_containers() == [], 10)


async def test_an_idle_interpreter_ends_and_the_next_call_starts_afresh(
    tmp_path: Path, witness: Witness
) -> None:
    profile = write_profile(tmp_path, idle_timeout=3)
    async with connect("stdio", profile, tmp_path) as client:
        await client.call_tool("python", {"code": "x = 1"})
        assert len(witness.sbxkit_containers()) == 1
        assert await trio_wait(lambda: witness.sbxkit_containers() == [], 20)
        again = await client.call_tool("python", {"code": "'x' in dir()"})
        assert (again.structured_content["text"], again.structured_content["fresh"]) == (
            "False",
            True,
        )
    assert await trio_wait(lambda: witness.sbxkit_containers() == [], 10)


async def test_a_shown_figure_is_image_content_before_the_value_s_own(
    tmp_path: Path, witness: Witness, pydata_image: str
) -> None:
    """A figure the code shows with ``plt.show()`` (an entry of ``CodeResult.displays``) comes
    back as an ``ImageContent`` too, ahead of the value's own PNG."""
    profile = write_profile(tmp_path, images=[pydata_image])
    profile.write_text(
        profile.read_text().replace(f'image = "{PYTHON}"', f'image = "{pydata_image}"', 1)
    )
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.show()\n"
        "fig, ax = plt.subplots(figsize=(2, 1)); ax.bar([0], [1])\n"
        "fig"
    )
    async with connect("stdio", profile, tmp_path) as client:
        result = await client.call_tool("python", {"code": code})
        assert not result.is_error, result.content
        images = [part for part in result.content if isinstance(part, mcp_types.ImageContent)]
        assert [image.mime_type for image in images] == ["image/png", "image/png"]
        sizes = [struct.unpack(">II", base64.b64decode(i.data)[16:24]) for i in images]
        assert sizes[0] != sizes[1]  # the shown figure, then the 2x1 inch value
        assert result.structured_content["images"] == ["image/png", "image/png"]
    assert await trio_wait(lambda: witness.sbxkit_containers() == [], 10)
