"""Driving ``sbxkit mcp`` as a real subprocess with the official SDK's own client.

``connect`` opens an ``mcp.Client`` on a server it starts: over stdio (the client launches
``python -m sbxkit mcp`` as MCP clients do) or over streamable HTTP on loopback (a server
process this module starts with ``--http 127.0.0.1:0``). ``era`` picks the protocol: the SDK's
default negotiates the 2026-07-28 protocol; ``"legacy"`` is the 2025 initialize handshake that
most MCP clients speak today. Over HTTP the client presents the server's bearer token as a
real client does: an ``Authorization`` header on the SDK's HTTP client (``http_client``).
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

import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE, streamable_http_client

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
TOKEN_FILE = re.compile(r"bearer token in (\S+) ")


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
    """``sbxkit mcp --http 127.0.0.1:0`` as a process; ``url`` is where it serves, ``token``
    the bearer token it generated (read from the file whose path it printed), if it did.
    ``open_files`` starts it with that soft file-descriptor limit (a user's usual 1024)."""

    def __init__(
        self, profile: Path, log: Path, *extra: str, open_files: int | None = None
    ) -> None:
        self.log = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        argv = server_argv(profile, "--http", "127.0.0.1:0", *extra)
        if open_files is not None:  # the soft limit only, as a user's shell sets it
            argv = ["prlimit", f"--nofile={open_files}:", *argv]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log
        )
        self.url = self._wait_serving()
        found = TOKEN_FILE.search(self.output())
        self.token_path = found.group(1) if found else None
        self.token = Path(self.token_path).read_text().strip() if self.token_path else None
        self.token_left_behind = False

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
        """SIGTERM, then wait; a token file the server did not remove is recorded
        (``token_left_behind``) and removed, so that nothing outlives the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
            if self.token_path and os.path.exists(self.token_path):
                self.token_left_behind = True
                os.unlink(self.token_path)

    def client(self, token: str | None = None, **client: Any) -> Any:
        """An SDK client presenting ``token`` (default: the server's)."""
        return http_client(self.url, token or self.token, **client)


@asynccontextmanager
async def http_client(
    url: str,
    token: str | None,
    *,
    sessions: list[str] | None = None,
    max_sse_event_size: int | None = DEFAULT_MAX_SSE_EVENT_SIZE,
    **client: Any,
) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, its HTTP client sending ``Authorization:
    Bearer TOKEN`` on every request (docs/mcp.md shows the same). ``sessions`` collects the
    session ids the server issues it (what a neighbour could learn of them)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def watch(response: httpx2.Response) -> None:
        issued = response.headers.get("mcp-session-id")
        if sessions is not None and issued and issued not in sessions:
            sessions.append(issued)

    hooks = {"response": [watch]}
    timeout = httpx2.Timeout(30, read=300)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http,
        Client(
            streamable_http_client(url, http_client=http, max_sse_event_size=max_sse_event_size),
            **client,
        ) as session,
    ):
        yield session


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
        async with server.client(mode=mode, **client) as session:
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


# --- a hostile neighbour: plain standard-library HTTP, run as another local account ---------

RAW_CLIENT = r'''
import http.client, json, sys

HOST, PORT = sys.argv[1], int(sys.argv[2])
MODERN, LEGACY = "2026-07-28", "2025-11-25"


def parse(text):
    """A JSON-RPC reply, from a JSON body or an SSE stream's data lines."""
    lines = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for chunk in [text, *lines]:
        try:
            message = json.loads(chunk)
        except ValueError:
            continue
        if isinstance(message, dict) and ("result" in message or "error" in message):
            return message
    return None


def send(method, body=None, headers=None):
    connection = http.client.HTTPConnection(HOST, PORT, timeout=60)
    sent = {
        "Host": f"{HOST}:{PORT}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **(headers or {}),
    }
    connection.request(method, "/mcp", None if body is None else json.dumps(body), sent)
    response = connection.getresponse()
    text = response.read().decode("utf-8", "replace")
    connection.close()
    return {
        "status": response.status,
        "www_authenticate": response.getheader("WWW-Authenticate"),
        "session": response.getheader("Mcp-Session-Id"),
        "body": text[:1000],
        "reply": parse(text),
    }


def auth(token):
    return {"Authorization": "Bearer " + token} if token else {}


def call(tool, arguments, token=None, session=None):
    """tools/call as the 2026-07-28 protocol sends it (no session), or, with ``session``, as a
    2025-11-25 client inside that session."""
    params = {"name": tool, "arguments": arguments}
    headers = auth(token)
    if session is None or session.startswith("modern:"):
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        headers.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call"})
        headers["Mcp-Name"] = tool
        if session is not None:
            headers["Mcp-Session-Id"] = session[len("modern:"):]
    else:
        headers.update({"MCP-Protocol-Version": LEGACY, "Mcp-Session-Id": session})
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    return send("POST", body, headers)


def initialize(token=None):
    """A 2025-11-25 session: initialize, then the initialized notification."""
    client = {"name": "x", "version": "0"}
    params = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": client}
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
    opened = send("POST", hello, auth(token))
    if opened["session"]:
        headers = {**auth(token), "MCP-Protocol-Version": LEGACY}
        headers["Mcp-Session-Id"] = opened["session"]
        send("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    return opened


def structured(answer):
    reply = answer.get("reply") or {}
    return (reply.get("result") or {}).get("structuredContent") or {}
'''
"""Helpers the attacker scripts below share (standard library only, run with ``python3 -I``)."""

UNAUTHENTICATED_ATTACK = (
    RAW_CLIENT
    + r"""
plan = json.loads(sys.argv[3])
done = {"list": call("sandbox_list", {})}
listed = [entry["sandbox_id"] for entry in structured(done["list"]).get("sandboxes", [])]
target = listed[0] if listed else plan["sandbox_id"]  # else: as if the id had leaked
done["read"] = call("sandbox_read_file", {"sandbox_id": target, "path": plan["path"]})
done["write"] = call(
    "sandbox_write_file", {"sandbox_id": target, "path": plan["path"], "content": "forged\n"}
)
done["wrong_token"] = call("sandbox_list", {}, token=plan["wrong_token"])
done["not_bearer"] = send("POST", {}, {"Authorization": "Basic " + plan["wrong_token"]})
done["initialize"] = initialize()
for index in range(3):  # a made-up session id each time: a fresh quota each time, once
    done[f"made_up_session_{index}"] = call(
        "sandbox_open", {}, session=f"modern:made-up-{index}"
    )
print(json.dumps(done))
"""
)
"""Another account with no token: what the red team did, step by step (docs/mcp.md)."""

TENANT_ATTACK = (
    RAW_CLIENT
    + r"""
plan = json.loads(sys.argv[3])
token, victim, path, session = plan["token"], plan["sandbox_id"], plan["path"], plan["session"]
done = {"list": call("sandbox_list", {}, token)}
done["read"] = call("sandbox_read_file", {"sandbox_id": victim, "path": path}, token)
done["write"] = call(
    "sandbox_write_file", {"sandbox_id": victim, "path": path, "content": "forged"}, token
)
done["exec"] = call("sandbox_exec", {"sandbox_id": victim, "command": ["cat", path]}, token)
done["close"] = call("sandbox_close", {"sandbox_id": victim}, token)
done["victims_session"] = call("sandbox_list", {}, token, session=session)
done["made_up_session"] = call("sandbox_list", {}, token, session="0" * 32)
done["made_up_modern_session"] = call("sandbox_list", {}, token, session="modern:" + "1" * 32)
done["delete_victims_session"] = send(
    "DELETE", None, {**auth(token), "MCP-Protocol-Version": LEGACY, "Mcp-Session-Id": session}
)
own = initialize(token)
done["own_session"] = own
opens = [call("sandbox_open", {}, token) for _ in range(3)]
opens.append(call("sandbox_open", {}, token, session=own["session"]))
opens.append(call("sandbox_open", {}, token, session="modern:made-up"))
done["opens"] = opens
print(json.dumps(done))
"""
)
"""A second client with a token of its own, against the first's sandboxes and quota."""

HALF_OPEN_FLOOD = r"""
import json, resource, select, socket, sys, time

host, port, count, trickling = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # what any account may do
head = f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()  # never finished
held = []
for _ in range(count):
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.settimeout(5)
    try:
        conn.connect((host, port))
        conn.sendall(head)
    except OSError:
        conn.close()
        continue
    held.append(conn)
print(json.dumps({"held": len(held)}), flush=True)
slow = held[:trickling]  # slowloris: a header line every second, never the blank line
while not select.select([sys.stdin], [], [], 1.0)[0]:
    for index, conn in enumerate(slow):
        try:
            conn.sendall(f"X-Slow-{index}: {time.monotonic()}\r\n".encode())
        except OSError:
            pass
sys.stdin.readline()


def closed(conn):
    conn.setblocking(False)
    try:
        return conn.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


print(json.dumps({
    "held": len(held),
    "closed": sum(closed(conn) for conn in held),
    "slow_closed": sum(closed(conn) for conn in slow),
}), flush=True)
"""
"""Another account opens ``count`` connections that never finish a request head (``trickling``
of them sending a header line every second), holds them until told on stdin, then says how
many the server closed."""
