"""The MCP process tools against a real ``sbxkit mcp``, driven by the official SDK's client
(tests/engine/mcp_support.py): a long-lived shell fed across calls and read by cursor, its
kill, its end with its sandbox, the per-sandbox cap, and refusals that name the argument —
processes proved gone on the host's own process table, containers by the witness."""

from __future__ import annotations

import base64
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from tests.engine.helpers import creates_during, processes_with_marker
from tests.engine.mcp_support import CELLS, connect, structured, tool_error, write_profile
from tests.witness import BUSYBOX, Witness


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    return await client.call_tool(tool, arguments)


async def counted(marker: str, count: int, seconds: float = 10.0) -> bool:
    """``count`` host processes inside a container carry ``marker`` (polled: a process
    started a moment ago may not run yet). Each background process is two: sbxkit's exec
    wrapper (its argv names the command) and the command itself."""
    deadline = time.monotonic() + seconds
    while len(processes_with_marker(marker)) != count:
        if time.monotonic() > deadline:
            return False
        await trio.sleep(0.05)
    return True


async def gone(marker: str, seconds: float = 10.0) -> bool:
    return await counted(marker, 0, seconds)


@pytest.mark.parametrize("cell", CELLS)
async def test_a_shell_fed_across_calls_read_by_cursor_then_killed(
    cell: str, tmp_path: Path, witness: Witness
) -> None:
    marker = "shell-" + secrets.token_hex(4)
    async with connect(cell, write_profile(tmp_path), tmp_path) as client:
        box = structured(await call(client, "sandbox_open", image=BUSYBOX))["sandbox_id"]
        started = structured(
            await call(client, "process_start", sandbox_id=box, shell=f"exec sh -s {marker}")
        )
        assert (started["running"], started["exit"], started["pty"]) == (True, None, False)
        assert started["command"] == ["sh", "-c", f"exec sh -s {marker}"]
        ids = {"sandbox_id": box, "process_id": started["process_id"]}
        assert await counted(marker, 2)  # it runs between calls: the wrapper and the shell

        # One command line split across three writes: the shell runs it once it is whole.
        first = structured(await call(client, "process_write", **ids, data="echo one; echo t"))
        assert first == {**ids, "bytes": 16, "stdin_closed": False}
        nothing = structured(await call(client, "process_read", **ids, wait=0.5))
        assert (nothing["output"], nothing["next_cursor"], nothing["done"]) == ("", 0, False)
        await call(client, "process_write", **ids, data="wo $((6*7)); printf '\\342\\202\\254")
        third = base64.b64encode(b"\\342\\202\\254\\n'\n").decode()
        structured(await call(client, "process_write", **ids, data=third, encoding="base64"))

        wanted = "one\ntwo 42\n€€\n".encode()
        seen, cursor = b"", 0
        while len(seen) < len(wanted):
            # Four bytes at a time: "€" (3 bytes) is never split into replacement characters.
            read = structured(
                await call(client, "process_read", **ids, cursor=cursor, max_bytes=4, wait=10)
            )
            assert read["cursor"] == cursor
            assert read["running"]
            assert not read["done"]
            assert read["next_cursor"] == cursor + read["bytes"]
            assert read["bytes"] > 0
            assert "\ufffd" not in read["output"]
            seen += read["output"].encode()
            cursor = read["next_cursor"]
        assert seen == wanted
        again = structured(await call(client, "process_read", **ids, encoding="base64"))
        assert base64.b64decode(again["output"]) == wanted  # any cursor reads again

        listed = structured(await call(client, "process_list", sandbox_id=box))
        assert (listed["running"], listed["max_processes"]) == (1, 4)
        assert [p["process_id"] for p in listed["processes"]] == [ids["process_id"]]

        killed = structured(await call(client, "process_kill", **ids))
        assert killed["running"] is False
        assert killed["exit"]["status"] == "killed"
        assert "kill()" in killed["exit"]["evidence"]["kill"]
        assert killed["exit"]["output_bytes"] == len(wanted)
        assert await gone(marker)
        end = structured(await call(client, "process_read", **ids, cursor=cursor, wait=5))
        assert (end["output"], end["done"], end["exit"]) == ("", True, killed["exit"])
        refused = tool_error(await call(client, "process_write", **ids, data="echo late\n"))
        assert refused["type"] == "ProcessError"
        assert "has ended (killed)" in refused["message"]

        # The sandbox goes on: a new shell, ended by closing its stdin, exits by itself.
        shell = structured(await call(client, "process_start", sandbox_id=box, command=["sh"]))
        other = {"sandbox_id": box, "process_id": shell["process_id"]}
        await call(client, "process_write", **other, data="exit 3\n", close_stdin=True)
        ended = structured(await call(client, "process_read", **other, wait=10))
        while not ended["done"]:
            ended = structured(await call(client, "process_read", **other, wait=10))
        assert (ended["exit"]["status"], ended["exit"]["exit_code"]) == ("exited", 3)
        structured(await call(client, "sandbox_close", sandbox_id=box))
    assert witness.sbxkit_containers() == []


async def test_a_terminal_echoes_and_answers(tmp_path: Path) -> None:
    async with connect("stdio", write_profile(tmp_path), tmp_path) as client:
        box = structured(await call(client, "sandbox_open", image=BUSYBOX))["sandbox_id"]
        started = structured(
            await call(client, "process_start", sandbox_id=box, command=["sh", "-i"], pty=True)
        )
        ids = {"sandbox_id": box, "process_id": started["process_id"]}
        await call(client, "process_write", **ids, data="tty; echo $((20+22))\n")
        text, cursor = "", 0
        deadline = time.monotonic() + 20
        while "42\r\n" not in text and time.monotonic() < deadline:
            read = structured(await call(client, "process_read", **ids, cursor=cursor, wait=5))
            text, cursor = text + read["output"], read["next_cursor"]
        assert "/dev/pts/" in text, text
        assert "42\r\n" in text, text  # a terminal: \r\n line ends
        signalled = structured(await call(client, "process_signal", **ids, signal="KILL"))
        assert signalled["process_id"] == ids["process_id"]
        # A read answers as soon as anything new arrives: the terminal may still print after
        # the kill (its line discipline's last bytes) before the end is known.
        deadline = time.monotonic() + 20
        read = structured(await call(client, "process_read", **ids, cursor=cursor, wait=5))
        while not read["done"] and time.monotonic() < deadline:
            cursor = read["next_cursor"]
            read = structured(await call(client, "process_read", **ids, cursor=cursor, wait=5))
        assert read["done"], read
        assert read["exit"]["status"] == "killed"
        assert "SIGKILL" in read["exit"]["evidence"]["kill"]
        structured(await call(client, "sandbox_close", sandbox_id=box))


async def test_processes_end_with_their_sandbox(tmp_path: Path, witness: Witness) -> None:
    marker = "8" + str(secrets.randbelow(10**6)).zfill(6)
    profile = write_profile(tmp_path, max_read_wait=30)
    async with connect("stdio", profile, tmp_path) as client:
        box = structured(await call(client, "sandbox_open"))["sandbox_id"]
        for _ in range(2):
            await call(client, "process_start", sandbox_id=box, command=["sleep", marker])
        assert await counted(marker, 4)
        structured(await call(client, "sandbox_close", sandbox_id=box))
        assert processes_with_marker(marker) == []  # gone when the close answered
        assert witness.sbxkit_containers() == []

        # A sandbox's lifetime bounds its processes; a read waiting on one returns then.
        short = structured(await call(client, "sandbox_open", lifetime=4))["sandbox_id"]
        started = structured(
            await call(client, "process_start", sandbox_id=short, command=["sleep", marker])
        )
        ids = {"sandbox_id": short, "process_id": started["process_id"]}
        assert started["running"]
        began = time.monotonic()
        read = structured(await call(client, "process_read", **ids, wait=30))
        assert time.monotonic() - began < 20  # not the 30 s wait: the lifetime ended it
        assert read["done"], read
        assert read["exit"]["status"] == "timed_out", read
        assert await gone(marker)
        # Its timeout was the lifetime left, less a margin: it timed out just before the
        # sandbox's removal, which follows.
        deadline = time.monotonic() + 10
        while not (after := await call(client, "process_read", **ids)).is_error:
            assert time.monotonic() < deadline
            await trio.sleep(0.2)
        after = tool_error(after)
        assert after["field"] == "sandbox_id"
        assert "has ended" in after["message"]
    assert witness.sbxkit_containers() == []


async def test_the_process_cap_is_refused_until_one_ends(tmp_path: Path) -> None:
    marker = "7" + str(secrets.randbelow(10**6)).zfill(6)
    profile = write_profile(tmp_path, max_processes=2)
    async with connect("stdio", profile, tmp_path) as client:
        box = structured(await call(client, "sandbox_open"))["sandbox_id"]
        sleeps = [
            structured(
                await call(client, "process_start", sandbox_id=box, command=["sleep", marker])
            )["process_id"]
            for _ in range(2)
        ]
        error = tool_error(await call(client, "process_start", sandbox_id=box, shell="true"))
        assert error["type"] == "QuotaExhausted"
        assert error["field"] == "mcp.max_processes"
        assert "already runs 2 background processes (the operator allows 2)" in error["message"]
        assert await counted(marker, 4)  # the refused one started nothing
        await call(client, "process_kill", sandbox_id=box, process_id=sleeps[0])
        third = structured(await call(client, "process_start", sandbox_id=box, shell="true"))
        assert third["running"] in (True, False)
        listed = structured(await call(client, "process_list", sandbox_id=box))
        assert len(listed["processes"]) == 3
        assert listed["max_processes"] == 2
        structured(await call(client, "sandbox_close", sandbox_id=box))
    assert await gone(marker)


async def test_bad_process_arguments_are_refused_precisely(
    tmp_path: Path, witness: Witness
) -> None:
    profile = write_profile(tmp_path, max_read_wait=5, max_file_bytes="1k")
    since = time.time()
    async with connect("stdio", profile, tmp_path) as client:
        box = structured(await call(client, "sandbox_open", lifetime=120))["sandbox_id"]
        cat = structured(await call(client, "process_start", sandbox_id=box, command=["cat"]))
        ids = {"sandbox_id": box, "process_id": cat["process_id"]}
        other = "p" + "0" * 16
        cases: list[tuple[str, dict[str, Any], str | None, str]] = [
            ("process_start", {"sandbox_id": box}, "command", "one is required"),
            (
                "process_start",
                {"sandbox_id": box, "command": ["sh"], "shell": "ls"},
                "command",
                "not both",
            ),
            ("process_start", {"sandbox_id": box, "shell": ""}, "shell", "is empty"),
            ("process_start", {"sandbox_id": box, "command": "ls"}, "command", "Expected `array"),
            (
                "process_start",
                {"sandbox_id": box, "shell": "ls", "timeout": 121},
                "timeout",
                "lifetime limit of 120 s",
            ),
            (
                "process_start",
                {"sandbox_id": box, "shell": "ls", "max_output": "1m"},
                "max_output",
                "never raise",
            ),
            (
                "process_start",
                {"sandbox_id": box, "shell": "ls", "user": "root"},
                "user",
                "unknown field",
            ),
            ("process_start", {"sandbox_id": box, "shell": "ls", "cwd": "tmp"}, "cwd", ""),
            ("process_read", {**ids, "cursor": 999}, "cursor", "from 0 to 0"),
            ("process_read", {**ids, "cursor": -1}, "cursor", ">= 0"),
            ("process_read", {**ids, "wait": 6}, "wait", "mcp.max_read_wait"),
            ("process_read", {**ids, "max_bytes": 2048}, "max_bytes", "mcp.max_file_bytes"),
            ("process_read", {"sandbox_id": box, "process_id": other}, "process_id", "no process"),
            ("process_read", {"sandbox_id": box, "process_id": "1"}, "process_id", "not a process"),
            ("process_write", {**ids, "data": "x" * 1025}, "data", "mcp.max_file_bytes"),
            ("process_write", {**ids, "data": "%%", "encoding": "base64"}, "data", "base64"),
            ("process_write", ids, "data", "nothing to do"),
            ("process_signal", {**ids, "signal": "NOPE"}, "signal", "not a signal name"),
            ("process_signal", {**ids, "signal": True}, "signal", "Expected"),
            (
                "process_kill",
                {"sandbox_id": "sbx-" + "0" * 24, "process_id": other},
                "sandbox_id",
                "no open sandbox",
            ),
        ]
        for tool, arguments, field, rule in cases:
            error = tool_error(await client.call_tool(tool, arguments))
            assert error["field"] == field, (tool, arguments, error)
            assert rule in error["message"], (tool, arguments, error)
        still = structured(await call(client, "process_read", **ids))
        assert still["running"]  # no refusal touched the process
        closed = await call(client, "process_write", **ids, close_stdin=True)
        assert structured(closed)["stdin_closed"]
        late = tool_error(await call(client, "process_write", **ids, data="x"))
        assert late["type"] == "ProcessError"
        structured(await call(client, "sandbox_close", sandbox_id=box))
    assert len(creates_during(witness, since)) == 1  # the sandbox only
