"""Driving ``sbxkit mcp`` as a real subprocess with the official SDK's own client.

``connect`` opens an ``mcp.Client`` on a server it starts: over stdio (the client launches
``python -m sbxkit mcp`` as MCP clients do) or over streamable HTTP on loopback (a server
process this module starts with ``--http 127.0.0.1:0``). ``era`` picks the protocol: the SDK's
default negotiates the 2026-07-28 protocol; ``"legacy"`` is the 2025 initialize handshake that
most MCP clients speak today.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.witness import BUSYBOX, PYTHON

LIMITS = """
[sandbox.docker.limits]
cpus = 1
memory = "256m"
pids = 64
max_output = "64k"
timeout = 60
"""
CELLS = ["stdio", "http"]
"""Transport cells most tests run in (the SDK's default protocol era)."""
ERA_CELLS = ["stdio", "http", "stdio-legacy", "http-legacy"]
"""Transport × protocol era, for the tests that differ between eras (sessions, cancelling)."""
SERVING = re.compile(r"serving (http://\S+/mcp)")


def profile_text(**mcp: Any) -> str:
    table = {
        "images": [PYTHON, BUSYBOX],
        "max_sandboxes_per_client": 3,
        "max_sandboxes": 6,
        "idle_timeout": 300,
        "lifetime": 600,
        **mcp,
    }
    lines = [f"{key} = {toml_value(value)}" for key, value in table.items()]
    return f'[sandbox.docker]\nimage = "{PYTHON}"\n{LIMITS}\n[mcp]\n' + "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def write_profile(directory: Path, **mcp: Any) -> Path:
    path = directory / "mcp-profile.toml"
    path.write_text(profile_text(**mcp))
    return path


def server_argv(profile: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sbxkit", "mcp", "--profile", str(profile), *extra]


class HttpServer:
    """``sbxkit mcp --http 127.0.0.1:0`` as a process; ``url`` is where it serves."""

    def __init__(self, profile: Path, log: Path, *extra: str) -> None:
        self.log = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            server_argv(profile, "--http", "127.0.0.1:0", *extra),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        self.url = self._wait_serving()

    def _wait_serving(self, seconds: float = 30.0) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = SERVING.search(self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"sbxkit mcp --http did not start: {self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()


@asynccontextmanager
async def connect(
    cell: str, profile: Path, logs: Path, *extra: str, **client: Any
) -> AsyncIterator[Client]:
    """An SDK client on a fresh ``sbxkit mcp`` of ``profile`` (``cell``: transport[-legacy])."""
    transport, _, era = cell.partition("-")
    mode = "legacy" if era == "legacy" else "auto"
    if transport == "stdio":
        argv = server_argv(profile, *extra)
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
        with open(logs / "stdio-server.log", "w") as log:  # noqa: ASYNC230 - before any await
            async with Client(stdio_client(params, errlog=log), mode=mode, **client) as session:
                yield session
        return
    server = HttpServer(profile, logs / "http-server.log", *extra)
    try:
        async with Client(server.url, mode=mode, **client) as session:
            yield session
    finally:
        server.stop()


def structured(result: mcp_types.CallToolResult) -> dict[str, Any]:
    """A successful tool result's JSON (the SDK client checked it against the output schema)."""
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def tool_error(result: mcp_types.CallToolResult) -> dict[str, Any]:
    """A tool error's fields: type, field, rule, message."""
    assert result.is_error, result.structured_content
    assert result.structured_content is not None
    error: dict[str, Any] = result.structured_content["error"]
    text = result.content[0]
    assert isinstance(text, mcp_types.TextContent)
    assert text.text == error["message"]
    return error


def mcp_servers(pid: int) -> list[int]:
    """``sbxkit mcp`` processes whose parent is ``pid`` (not the supervisors earlier tests of
    the same process started, whose command lines name sbxkit too)."""
    needle = b"\0-m\0sbxkit\0mcp\0"
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if parent == pid and needle in b"\0" + cmdline:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"
