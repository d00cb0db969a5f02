"""``sbxkit mcp`` as a real subprocess, driven by the official SDK's own client, over stdio and
streamable HTTP on loopback (tests/engine/mcp_support.py): the tools and their schemas, runs,
sessions with files, limits that hold, cancellation, refusals that create nothing, and
removal whatever ends the client or the server — each proved by the independent witness.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import pwd
import secrets
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import jsonschema
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from sbxkit._model.uids import HOST_UIDS
from tests.accounts import Account, local_account
from tests.doc_blocks import ROOT, extract
from tests.doc_runs import DocState, run_creates
from tests.engine.helpers import creates_during, processes_with_marker, wait_until
from tests.engine.mcp_support import (
    CELLS,
    ERA_CELLS,
    HALF_OPEN_FLOOD,
    TENANT_ATTACK,
    UNAUTHENTICATED_ATTACK,
    HttpServer,
    connect,
    mcp_servers,
    server_argv,
    structured,
    tool_error,
    write_profile,
)
from tests.witness import BUSYBOX, PYTHON, Witness

TOOLS = [
    "run",
    "sandbox_open",
    "sandbox_exec",
    "sandbox_write_file",
    "sandbox_read_file",
    "sandbox_close",
    "sandbox_list",
    "process_start",
    "process_write",
    "process_read",
    "process_signal",
    "process_kill",
    "process_list",
    "python",
]


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path)


async def wait_for(predicate: Any, seconds: float, interval: float = 0.05) -> bool:
    """Poll a synchronous ``predicate`` (the witness) without blocking trio for long."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await trio.sleep(interval)
    return True


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    return await client.call_tool(tool, arguments)


# --- what a model sees -----------------------------------------------------------------------


@pytest.mark.parametrize("cell", CELLS)
async def test_tools_are_listed_with_schemas(cell: str, profile: Path, tmp_path: Path) -> None:
    async with connect(cell, profile, tmp_path) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert list(listed) == TOOLS
    for tool in listed.values():
        assert tool.description
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False
        assert tool.output_schema is not None
    run = listed["run"]
    assert run.input_schema["required"] == ["command"]
    assert run.input_schema["properties"]["image"]["enum"] == [PYTHON, BUSYBOX]
    limits = run.input_schema["properties"]["limits"]["properties"]
    assert limits["timeout"]["maximum"] == 60
    assert "At most 256 MiB" in limits["memory"]["description"]
    assert "no network" in run.description  # type: ignore[operator]
    assert set(listed["sandbox_exec"].input_schema["required"]) == {"sandbox_id", "command"}


# --- runs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", CELLS)
async def test_a_one_shot_run(cell: str, profile: Path, tmp_path: Path, witness: Witness) -> None:
    async with connect(cell, profile, tmp_path) as client:
        result = structured(
            await call(
                client,
                "run",
                command=["python3", "main.py", "--twice"],
                stdin="hello",
                files={"main.py": MAIN_PY, "lib/words.txt": "sandbox\n"},
                env={"GREETING": "hi"},
            )
        )
        assert result["status"] == "exited"
        assert result["exit_code"] == 3
        stdout = "HELLO sandbox hi /tmp ['--twice']\n"
        assert result["stdout"] == stdout
        assert result["stderr"] == "to stderr\n"
        assert (result["stdout_bytes"], result["stderr_bytes"]) == (len(stdout), 10)
        assert result["overflowed"] is None
        # A run with files is a short session: its exec's exit is the daemon's to witness.
        assert result["evidence"] == {"oom": None, "kill": None, "witness": "daemon"}
        busybox = structured(await call(client, "run", command=["id", "-u"], image=BUSYBOX))
        assert int(busybox["stdout"]) in HOST_UIDS  # a uid of the sandbox's own
        assert busybox["evidence"]["witness"] == "kernel"  # a one-shot run: the init's pidfd
    assert witness.sbxkit_containers() == []


MAIN_PY = """
import os, sys
words = open("lib/words.txt").read().strip()
print(sys.stdin.read().upper(), words, os.environ["GREETING"], os.getcwd(), sys.argv[1:])
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


async def test_the_documented_full_profile_serves_as_written(
    tmp_path: Path, witness: Witness
) -> None:
    """Issue 43: docs/mcp.md's full profile, as written, after the shell block before it made
    its mount's source: the server starts and a run reads the mount (before, the source was
    missing and every call failed)."""
    blocks = extract((ROOT / "docs/mcp.md").read_text(), "docs/mcp.md")
    [toml] = [block for block in blocks if block.lang == "toml"]
    state = DocState()
    try:
        run_creates(toml, state, ROOT)
        profile = tmp_path / "mcp-profile.toml"
        profile.write_text(toml.code)
        async with connect("stdio", profile, tmp_path) as client:
            result = structured(
                await call(client, "run", command=["cat", "/data/points.csv"], image=BUSYBOX)
            )
            write = ["sh", "-c", "echo x > /data/new"]
            written = structured(await call(client, "run", command=write, image=BUSYBOX))
        assert (result["status"], result["exit_code"], result["stdout"]) == (
            "exited",
            0,
            "x,y\n1,2\n",
        )
        assert written["exit_code"] != 0  # the mount is read-only
        assert "Read-only file system" in written["stderr"], written
    finally:
        state.close()
    assert witness.sbxkit_containers() == []


@pytest.mark.parametrize("cell", CELLS)
async def test_a_timeout_kills_the_command(cell: str, profile: Path, tmp_path: Path) -> None:
    async with connect(cell, profile, tmp_path) as client:
        began = time.monotonic()
        result = structured(
            await call(client, "run", command=["sleep", "30"], limits={"timeout": 1})
        )
        assert (result["status"], result["exit_code"]) == ("timed_out", None)
        assert time.monotonic() - began < 15
        opened = structured(await call(client, "sandbox_open", limits={"timeout": 20}))
        box = opened["sandbox_id"]
        timed = structured(
            await call(client, "sandbox_exec", sandbox_id=box, command=["sleep", "7391"], timeout=1)
        )
        assert timed["status"] == "timed_out"
        assert processes_with_marker("7391") == []  # its process group was killed
        after = structured(await call(client, "sandbox_exec", sandbox_id=box, command=["true"]))
        assert after["status"] == "exited"  # the sandbox goes on
        structured(await call(client, "sandbox_close", sandbox_id=box))


@pytest.mark.parametrize("cell", CELLS)
async def test_output_is_capped_exactly(cell: str, profile: Path, tmp_path: Path) -> None:
    async with connect(cell, profile, tmp_path) as client:

        async def emit(count: int) -> dict[str, Any]:
            script = f"head -c {count} /dev/zero | tr '\\0' x; echo done >&2"
            return structured(
                await call(client, "run", command=["sh", "-c", script], limits={"max_output": 1000})
            )

        exact = await emit(1000)
        assert (exact["status"], exact["stdout_bytes"], exact["overflowed"]) == (
            "exited",
            1000,
            None,
        )
        over = await emit(1001)
        assert (over["status"], over["overflowed"], over["exit_code"]) == (
            "output_exceeded",
            "stdout",
            None,
        )
        assert over["stdout"] == "x" * 1000


# --- sessions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", ERA_CELLS)
async def test_a_session_with_files(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    async with connect(cell, profile, tmp_path) as client:
        opened = structured(await call(client, "sandbox_open", limits={"memory": "128m"}))
        box = opened["sandbox_id"]
        assert opened["limits"]["memory"] == 128 * 1024 * 1024
        assert opened["files_root"] == "/tmp"
        assert len(witness.sbxkit_containers()) == 1
        written = structured(
            await call(
                client,
                "sandbox_write_file",
                sandbox_id=box,
                path="src/count.py",
                content=COUNT_PY,
            )
        )
        assert written == {"sandbox_id": box, "path": "/tmp/src/count.py", "bytes": len(COUNT_PY)}
        blob = bytes(range(256))
        structured(
            await call(
                client,
                "sandbox_write_file",
                sandbox_id=box,
                path="/tmp/data/blob.bin",
                content=base64.b64encode(blob).decode(),
                encoding="base64",
            )
        )
        count = ["sh", "-c", "python3 src/count.py src/count.py > out/words.txt"]
        ran = structured(await call(client, "sandbox_exec", sandbox_id=box, command=count))
        # out/ does not exist yet: the shell's failure is a result, not a tool error
        assert (ran["status"], ran["exit_code"] != 0) == ("exited", True)
        assert "out/words.txt" in ran["stderr"]
        made = await call(client, "sandbox_exec", sandbox_id=box, command=["mkdir", "out"])
        assert structured(made)["exit_code"] == 0
        ran = structured(await call(client, "sandbox_exec", sandbox_id=box, command=count))
        assert ran["exit_code"] == 0
        read = structured(
            await call(client, "sandbox_read_file", sandbox_id=box, path="out/words.txt")
        )
        words = f"{len(COUNT_PY.split())}\n"
        assert (read["content"], read["encoding"], read["bytes"]) == (words, "utf-8", len(words))
        back = structured(
            await call(
                client, "sandbox_read_file", sandbox_id=box, path="data/blob.bin", encoding="base64"
            )
        )
        assert base64.b64decode(back["content"]) == blob
        not_text = tool_error(
            await call(client, "sandbox_read_file", sandbox_id=box, path="data/blob.bin")
        )
        assert (not_text["field"], "base64" in not_text["rule"]) == ("encoding", True)
        listed = structured(await call(client, "sandbox_list"))
        assert [entry["sandbox_id"] for entry in listed["sandboxes"]] == [box]
        assert listed["open_or_running"] == 1
        closed = structured(await call(client, "sandbox_close", sandbox_id=box))
        assert closed == {"sandbox_id": box, "closed": True}
        assert witness.sbxkit_containers() == []  # removed before the close returned
        gone = tool_error(await call(client, "sandbox_exec", sandbox_id=box, command=["true"]))
        assert gone["field"] == "sandbox_id"
        assert "closed by sandbox_close" in gone["message"]
        assert structured(await call(client, "sandbox_list"))["sandboxes"] == []


COUNT_PY = "import sys\nprint(len(open(sys.argv[1]).read().split()))\n"


@pytest.mark.parametrize("cell", ["stdio"])
async def test_lifetime_and_idle_end_a_sandbox(cell: str, tmp_path: Path, witness: Witness) -> None:
    """One sandbox outlives its lifetime (2 s), the other its idle timeout (6 s): each is
    removed, and its id says which ended it. (Only the ends are asserted: on a loaded machine
    the short one may be gone before the other is open.)"""
    profile = write_profile(tmp_path, idle_timeout=6)
    async with connect(cell, profile, tmp_path) as client:
        short = structured(await call(client, "sandbox_open", lifetime=2))["sandbox_id"]
        idle = structured(await call(client, "sandbox_open"))["sandbox_id"]
        assert await wait_for(lambda: witness.sbxkit_containers() == [], 30)
        ended = tool_error(await call(client, "sandbox_exec", sandbox_id=short, command=["true"]))
        assert "its lifetime of 2 s passed" in ended["message"]
        ended = tool_error(await call(client, "sandbox_exec", sandbox_id=idle, command=["true"]))
        assert "no call used it for 6 s" in ended["message"]
        assert structured(await call(client, "sandbox_list"))["sandboxes"] == []


# --- cancellation and progress -------------------------------------------------------------------


@pytest.mark.parametrize("cell", ERA_CELLS)
async def test_cancelling_a_run_removes_its_sandbox(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    progress: list[float] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    async with connect(cell, profile, tmp_path) as client:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    await client.call_tool(
                        "run", {"command": ["sleep", "120"]}, progress_callback=on_progress
                    )

                nursery.start_soon(run)
                assert await wait_for(lambda: len(progress) >= 2, 30)  # long runs report
                assert len(witness.sbxkit_containers()) == 1
                scope.cancel()
        began = time.monotonic()
        assert await wait_for(lambda: witness.sbxkit_containers() == [], 10)
        assert time.monotonic() - began < 10
        again = structured(await call(client, "run", command=["echo", "still serving"]))
        assert again["stdout"] == "still serving\n"


@pytest.mark.parametrize("cell", ERA_CELLS)
async def test_cancelling_an_exec_kills_its_processes(
    cell: str, profile: Path, tmp_path: Path
) -> None:
    async with connect(cell, profile, tmp_path) as client:
        box = structured(await call(client, "sandbox_open"))["sandbox_id"]
        with trio.move_on_after(2):
            await client.call_tool(
                "sandbox_exec", {"sandbox_id": box, "command": ["sleep", "8123"]}
            )
        assert await wait_for(lambda: processes_with_marker("8123") == [], 10)
        after = structured(await call(client, "sandbox_exec", sandbox_id=box, command=["true"]))
        assert after["status"] == "exited"
        structured(await call(client, "sandbox_close", sandbox_id=box))


# --- refusals: a tool error naming the field and the rule, nothing created ------------------------


ABSENT = "sbxkit-test/absent:1"
"""On the allow-list, never loaded into the daemon: sbxkit never pulls."""


@pytest.mark.parametrize("cell", CELLS)
async def test_refusals_create_nothing(cell: str, tmp_path: Path, witness: Witness) -> None:
    profile = write_profile(tmp_path, images=[PYTHON, BUSYBOX, ABSENT])
    cases: list[tuple[str, dict[str, Any], str | None, str]] = [
        ("run", {"command": ["true"], "image": "alpine:3"}, "image", "not an image the operator"),
        ("sandbox_open", {"image": "sbxkit-test/busybox:other"}, "image", PYTHON),
        ("run", {"command": ["true"], "limits": {"memory": "1g"}}, "limits.memory", "never raise"),
        ("run", {"command": ["true"], "limits": {"cpus": 2}}, "limits.cpus", "never raise"),
        ("sandbox_open", {"lifetime": 10_000}, "lifetime", "never lengthen"),
        ("run", {}, "command", "required"),
        ("run", {"command": "ls -l"}, "command", "Expected `array`"),
        ("run", {"command": ["true"], "privileged": True}, "privileged", "unknown field"),
        ("run", {"command": ["true"], "limits": {"memroy": 1}}, "limits.memroy", "unknown"),
        ("run", {"command": ["true"], "files": {"../x": ""}}, "files['../x']", "'..'"),
        ("sandbox_exec", {"sandbox_id": "abc", "command": ["true"]}, "sandbox_id", "not a"),
        ("sandbox_read_file", {"sandbox_id": "sbx-" + "0" * 24, "path": "x"}, "sandbox_id", "no"),
        ("run", {"command": ["true"], "image": ABSENT}, None, "never pulls"),
        ("sandbox_open", {"image": ABSENT}, None, "never pulls"),
    ]
    since = time.time()
    async with connect(cell, profile, tmp_path) as client:
        for tool, arguments, field, rule in cases:
            error = tool_error(await client.call_tool(tool, arguments))
            assert error["field"] == field, (tool, arguments, error)
            assert rule in error["message"], (tool, arguments, error)
        with pytest.raises(MCPError, match="unknown tool 'shell'"):
            await client.call_tool("shell", {"command": "ls"})
        still = structured(await call(client, "run", command=["true"]))
        assert still["status"] == "exited"
    created = creates_during(witness, since)
    assert len(created) == 1, created  # the last run only


@pytest.mark.parametrize("cell", ["stdio"])
async def test_quotas_refuse_clearly(cell: str, tmp_path: Path, witness: Witness) -> None:
    profile = write_profile(tmp_path, max_sandboxes_per_client=2)
    async with connect(cell, profile, tmp_path) as client:
        first = structured(await call(client, "sandbox_open"))["sandbox_id"]
        structured(await call(client, "sandbox_open"))
        for tool, arguments in (("sandbox_open", {}), ("run", {"command": ["true"]})):
            error = tool_error(await client.call_tool(tool, arguments))
            assert error["field"] == "mcp.max_sandboxes_per_client"
            assert "close one with sandbox_close" in error["message"]
        assert len(witness.sbxkit_containers()) == 2
        structured(await call(client, "sandbox_close", sandbox_id=first))
        structured(await call(client, "run", command=["true"]))
        listed = structured(await call(client, "sandbox_list"))
        assert (listed["open_or_running"], listed["max_per_client"]) == (1, 2)


@pytest.mark.parametrize("cell", ["stdio", "http"])
async def test_a_missing_engine_is_a_tool_error(cell: str, profile: Path, tmp_path: Path) -> None:
    absent = str(tmp_path / "no-daemon.sock")
    async with connect(cell, profile, tmp_path, "--socket", absent) as client:
        for tool, arguments in (("run", {"command": ["true"]}), ("sandbox_open", {})):
            error = tool_error(await client.call_tool(tool, arguments))
            assert error["type"] == "EngineUnavailable", error
            assert absent in error["message"]
        assert [tool.name for tool in (await client.list_tools()).tools] == TOOLS
        assert structured(await call(client, "sandbox_list"))["open_or_running"] == 0


# --- removal whatever ends the client or the server ---------------------------------------------


async def test_a_stdio_client_that_leaves_takes_its_sandboxes(
    profile: Path, tmp_path: Path, witness: Witness
) -> None:
    """The server sees stdin close: it removes everything, then exits. (The SDK's client
    gives a server 2 s before SIGTERM, then 2 s before SIGKILL: on a loaded machine the
    supervisor may finish the job, hence the wait.)"""
    async with connect("stdio", profile, tmp_path) as client:
        structured(await call(client, "sandbox_open"))
        structured(await call(client, "sandbox_open"))
        assert len(witness.sbxkit_containers()) == 2
    assert await wait_for(lambda: witness.sbxkit_containers() == [], 10)


async def test_an_http_session_that_ends_takes_its_sandboxes(
    profile: Path, tmp_path: Path, witness: Witness
) -> None:
    """Two clients, each its own HTTP session: the one that ends its session (DELETE) has its
    sandboxes removed at once, the other keeps its own; stopping the server removes the rest
    before it exits."""
    server = HttpServer(profile, tmp_path / "http-server.log")
    try:
        async with server.client(mode="legacy") as staying:
            kept = structured(await call(staying, "sandbox_open"))["sandbox_id"]
            async with server.client(mode="legacy") as leaving:
                structured(await call(leaving, "sandbox_open"))
                structured(await call(leaving, "sandbox_open"))
                assert len(witness.sbxkit_containers()) == 3
                mine = structured(await call(leaving, "sandbox_list"))["sandboxes"]
                assert kept not in [entry["sandbox_id"] for entry in mine]
            assert await wait_for(lambda: len(witness.sbxkit_containers()) == 1, 5)
            listed = structured(await call(staying, "sandbox_list"))["sandboxes"]
            assert [entry["sandbox_id"] for entry in listed] == [kept]
            status = server.stop()
            assert witness.sbxkit_containers() == []
    except* (httpx2.TransportError, MCPError):
        pass  # the staying client's session ends with the server
    finally:
        status = server.stop()
    assert status == -signal.SIGTERM, server.output()  # uvicorn re-raises it after cleanup


CLIENT_SCRIPT = """
import os, sys, trio, httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

async def main():
    if sys.argv[1].startswith("http://"):
        auth = {"Authorization": "Bearer " + os.environ["MCP_TOKEN"]}
        server = streamable_http_client(sys.argv[1], http_client=httpx2.AsyncClient(headers=auth))
    else:
        argv, env = sys.argv[1:], dict(os.environ)
        server = StdioServerParameters(command=sys.executable, args=argv, env=env)
    async with Client(server) as client, trio.open_nursery() as nursery:
        await client.call_tool("sandbox_open", {})
        nursery.start_soon(client.call_tool, "run", {"command": ["sleep", "600"]})
        print("ready", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def start_client(
    witness: Witness, *target: str, token: str | None = None
) -> subprocess.Popen[bytes]:
    """A client process holding one open sandbox and one run under way (two containers)."""
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, *target],
        env={**os.environ, "MCP_TOKEN": token or ""},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert client.stdout is not None
    if client.stdout.readline().strip() != b"ready":
        client.kill()
        raise AssertionError(client.communicate(timeout=10)[1].decode()[-3000:])
    assert wait_until(lambda: len(witness.sbxkit_containers()) == 2, 30)
    return client


def sigkill(client: subprocess.Popen[bytes]) -> None:
    client.send_signal(signal.SIGKILL)
    client.wait(10)


def test_killing_the_client_removes_everything(profile: Path, witness: Witness) -> None:
    client = start_client(witness, "-m", "sbxkit", "mcp", "--profile", str(profile))
    try:
        servers = mcp_servers(client.pid)
        assert len(servers) == 1
        sigkill(client)
    finally:
        if client.poll() is None:
            sigkill(client)
    # The server saw its stdin close: it removed both sandboxes and exited by itself.
    assert wait_until(lambda: witness.sbxkit_containers() == [], 15)
    assert wait_until(lambda: not os.path.exists(f"/proc/{servers[0]}"), 15)


async def test_killing_an_http_client_removes_everything(tmp_path: Path, witness: Witness) -> None:
    """Over HTTP the server cannot see a client die, only its connections: the run under way
    is cancelled with its request (its sandbox removed), the open sandbox ends at the idle
    timeout. The server goes on serving others."""
    profile = write_profile(tmp_path, idle_timeout=20)
    server = HttpServer(profile, tmp_path / "http-server.log")
    try:
        client = start_client(witness, server.url, token=server.token)
        sigkill(client)
        killed = time.monotonic()
        assert await wait_for(lambda: len(witness.sbxkit_containers()) == 1, 5)  # the run's
        assert time.monotonic() - killed < 5
        assert await wait_for(lambda: witness.sbxkit_containers() == [], 40)  # idle
        async with server.client() as other:
            assert structured(await call(other, "run", command=["true"]))["exit_code"] == 0
    finally:
        server.stop()


class RawClient:
    """JSON-RPC lines on a server's pipes: the wire as a 2025-11-25 client writes it."""

    def __init__(self, server: subprocess.Popen[bytes]) -> None:
        assert server.stdin is not None
        assert server.stdout is not None
        self.stdin, self.stdout = server.stdin, server.stdout
        self.next_id = 0

    def send(
        self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False
    ) -> int:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        if not notify:
            self.next_id += 1
            message["id"] = self.next_id
        self.stdin.write(json.dumps(message).encode() + b"\n")
        self.stdin.flush()
        return self.next_id

    def answer(self, request_id: int) -> dict[str, Any]:
        while True:
            line = self.stdout.readline()
            assert line, "the server closed stdout"
            message = json.loads(line)
            if message.get("id") == request_id:
                assert "result" in message, message
                result: dict[str, Any] = message["result"]
                return result


def test_sigterm_removes_everything_then_exits(profile: Path, witness: Witness) -> None:
    """With the client still attached (stdin open): SIGTERM removes every sandbox, then the
    server exits 143 by itself — it does not wait for the client to close stdin."""
    server = subprocess.Popen(
        server_argv(profile), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        rpc = RawClient(server)
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        rpc.answer(rpc.send("initialize", hello))
        rpc.send("notifications/initialized", notify=True)
        opened = rpc.answer(rpc.send("tools/call", {"name": "sandbox_open", "arguments": {}}))
        assert opened["isError"] is False, opened
        rpc.send("tools/call", {"name": "run", "arguments": {"command": ["sleep", "600"]}})
        assert wait_until(lambda: len(witness.sbxkit_containers()) == 2, 30)
        server.send_signal(signal.SIGTERM)
        status = server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert status == 128 + signal.SIGTERM, server.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    assert witness.sbxkit_containers() == []


@pytest.mark.parametrize("cell", CELLS)
async def test_killing_the_server_removes_everything(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    """SIGKILL: no code of the server runs; the supervisor that owns every lease sees the
    server's connections close and removes the sandboxes."""
    ended: list[str] = []
    try:
        async with connect(cell, profile, tmp_path) as client:
            structured(await call(client, "sandbox_open"))
            with trio.fail_after(60):  # the call in flight must end, not hang
                async with trio.open_nursery() as nursery:

                    async def run() -> None:
                        try:
                            await client.call_tool("run", {"command": ["sleep", "600"]})
                        except MCPError as exc:  # stdio: the connection closed under it
                            ended.append(str(exc))
                        finally:  # HTTP: the client's transport fails and cancels the call
                            ended.append("ended")

                    nursery.start_soon(run)
                    assert await wait_for(lambda: len(witness.sbxkit_containers()) == 2, 30)
                    servers = mcp_servers(os.getpid())
                    assert len(servers) == 1, servers
                    os.kill(servers[0], signal.SIGKILL)
                    assert await wait_for(lambda: witness.sbxkit_containers() == [], 20)
    except* (httpx2.TransportError, MCPError):
        pass  # the client's own transport breaks with the server (HTTP, on leaving)
    assert "ended" in ended, "the call in flight did not end with the server"


# --- the scripted agent ---------------------------------------------------------------------------


@pytest.mark.parametrize("cell", CELLS)
async def test_a_scripted_agent_completes_a_coding_task(
    cell: str, profile: Path, tmp_path: Path, witness: Witness
) -> None:
    """An agent loop without a model: it writes code and a test, runs the test, reads the
    failure, fixes the code, runs again and reads the result file the code wrote."""
    async with connect(cell, profile, tmp_path) as client:
        summary = await scripted_agent(client)
    assert summary == {"attempts": 2, "median": 4.0, "mean": 5.0}
    assert witness.sbxkit_containers() == []


STATS_WRONG = """
def median(xs):
    return sorted(xs)[len(xs) // 2]
"""
STATS_RIGHT = """
def median(xs):
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
"""
TEST_STATS = """
from stats import median

data = [1, 3, 5, 11]
assert median([3, 1, 2]) == 2
assert median(data) == 4.0, f"median({data}) gave {median(data)}"
with open("result.txt", "w") as out:  # python3-minimal: no json module in the image
    print(f"median={median(data)} mean={sum(data) / len(data)}", file=out)
print("all good")
"""


async def scripted_agent(client: Client) -> dict[str, Any]:
    """Plan → act → observe → fix, as a model would drive the tools (JSON in, JSON out)."""
    tools = {tool.name for tool in (await client.list_tools()).tools}
    assert {"sandbox_open", "sandbox_write_file", "sandbox_exec"} <= tools
    box = structured(await call(client, "sandbox_open", lifetime=120))["sandbox_id"]
    await call(
        client, "sandbox_write_file", sandbox_id=box, path="task/test_stats.py", content=TEST_STATS
    )
    attempts = 0
    for code in (STATS_WRONG, STATS_RIGHT):
        attempts += 1
        await call(client, "sandbox_write_file", sandbox_id=box, path="task/stats.py", content=code)
        ran = structured(
            await call(
                client,
                "sandbox_exec",
                sandbox_id=box,
                command=["python3", "test_stats.py"],
                cwd="/tmp/task",
            )
        )
        if ran["exit_code"] == 0:
            assert ran["stdout"] == "all good\n"
            break
        assert "median([1, 3, 5, 11]) gave 5" in ran["stderr"], ran  # what the agent reads
    read = structured(
        await call(client, "sandbox_read_file", sandbox_id=box, path="task/result.txt")
    )
    structured(await call(client, "sandbox_close", sandbox_id=box))
    found = dict(pair.split("=") for pair in read["content"].split())
    return {"attempts": attempts, **{key: float(value) for key, value in found.items()}}


# --- HTTP: who may call, and as whom (issue 38) ---------------------------------------------------


SECRET = "the victim's notes\n"


def address(server: HttpServer) -> tuple[str, str]:
    parts = urlsplit(server.url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, str(parts.port)


def outline(answers: dict[str, Any]) -> dict[str, Any]:
    """Each step of an attack: its HTTP status and, when the call reached a tool, what it got."""
    shown: dict[str, Any] = {}
    for step, answer in answers.items():
        if isinstance(answer, list):
            shown[step] = [outline({str(i): item})[str(i)] for i, item in enumerate(answer)]
            continue
        result = (answer.get("reply") or {}).get("result") or {}
        content = json.dumps(result.get("structuredContent"))[:160] if result else None
        shown[step] = (answer["status"], result.get("isError"), content)
    return shown


def as_account(account: Account, script: str, *args: str) -> dict[str, Any]:
    done = account.python(script, *args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    answers: dict[str, Any] = json.loads(done.stdout)
    return answers


async def write_notes(client: Client, box: str) -> None:
    structured(
        await call(client, "sandbox_write_file", sandbox_id=box, path="notes.txt", content=SECRET)
    )


async def read_notes(client: Client, box: str) -> str:
    read = structured(await call(client, "sandbox_read_file", sandbox_id=box, path="notes.txt"))
    content: str = read["content"]
    return content


def account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


async def test_another_account_without_the_token_gets_nothing(
    tmp_path: Path, witness: Witness
) -> None:
    """The finding, replayed by another local account with plain standard-library HTTP: it
    lists the victim's sandboxes, reads and overwrites its file, opens sandboxes under made-up
    session ids past the quota, and tries a wrong token and another scheme. Every request is
    refused 401 with a Bearer challenge before anything runs: nothing is created, the victim's
    file is its own, and the log names the refused account — without any token."""
    profile = write_profile(tmp_path, max_sandboxes_per_client=2)
    server = HttpServer(profile, tmp_path / "http-server.log")
    wrong = secrets.token_urlsafe(32)
    try:
        async with server.client() as victim:  # the 2026-07-28 protocol: no session
            box = structured(await call(victim, "sandbox_open"))["sandbox_id"]
            await write_notes(victim, box)
            plan = {"sandbox_id": box, "path": "notes.txt", "wrong_token": wrong}
            since = time.time()
            with local_account() as attacker:
                answers = await trio.to_thread.run_sync(
                    lambda: as_account(
                        attacker, UNAUTHENTICATED_ATTACK, *address(server), json.dumps(plan)
                    )
                )
            assert not account_exists(attacker.name)
            refused = {step: answer["status"] for step, answer in answers.items()}
            assert refused == dict.fromkeys(answers, 401), outline(answers)
            for answer in answers.values():
                assert answer["www_authenticate"].startswith('Bearer realm="sbxkit mcp"'), answer
            assert creates_during(witness, since) == []
            assert await read_notes(victim, box) == SECRET
            listed = structured(await call(victim, "sandbox_list"))
            assert [entry["sandbox_id"] for entry in listed["sandboxes"]] == [box]
        # The token the victim used: generated, in a file only this account can read, whose
        # path — never the token — the server printed.
        assert server.token_path is not None, server.output()
        assert stat.S_IMODE(os.stat(server.token_path).st_mode) == 0o600
        assert server.token
        assert server.token not in server.output()
    finally:
        server.stop()
    log = server.output()
    assert f"(uid {attacker.uid}): no Authorization header" in log
    assert f"(uid {attacker.uid}): a wrong bearer token" in log
    assert f"(uid {attacker.uid}): the Authorization header is not a bearer token" in log
    assert wrong not in log
    assert server.token not in log
    assert not server.token_left_behind  # the server removed its token file when it stopped
    assert witness.sbxkit_containers() == []


async def test_a_client_with_its_own_token_stays_in_its_own_sandboxes(
    tmp_path: Path, witness: Witness
) -> None:
    """Two clients, each with a token of its own (--token-file): the other account, with its
    token, sees none of the victim's sandboxes and cannot read, write, run in or close them;
    the victim's session id (as if leaked), a made-up one, or any on a 2026-07-28 request is
    refused, and so is ending the victim's session; its quota counts per token however many
    sessions it opens, so the victim's own quota stays whole."""
    tokens = {"victim": secrets.token_urlsafe(32), "mallory": secrets.token_urlsafe(32)}
    token_file = tmp_path / "tokens"
    token_file.write_text("".join(f"{name} {token}\n" for name, token in tokens.items()))
    token_file.chmod(0o600)
    profile = write_profile(tmp_path, max_sandboxes_per_client=2, max_sandboxes=4)
    server = HttpServer(profile, tmp_path / "http-server.log", "--token-file", str(token_file))
    sessions: list[str] = []
    try:
        assert server.token_path is None
        assert "clients: victim, mallory" in server.output()
        async with server.client(tokens["victim"], mode="legacy", sessions=sessions) as victim:
            box = structured(await call(victim, "sandbox_open"))["sandbox_id"]
            await write_notes(victim, box)
            [session] = sessions
            plan = {"token": tokens["mallory"], "sandbox_id": box, "path": "notes.txt"}
            plan["session"] = session
            with local_account() as mallory:
                answers = await trio.to_thread.run_sync(
                    lambda: as_account(mallory, TENANT_ATTACK, *address(server), json.dumps(plan))
                )
            assert not account_exists(mallory.name)
            shown = outline(answers)
            assert raw_structured(answers["list"])["sandboxes"] == [], shown
            for step in ("read", "write", "exec", "close"):
                error = raw_structured(answers[step], error=True)["error"]
                assert error["field"] == "sandbox_id", shown
                assert f"no open sandbox {box} for this client" in error["message"], shown
            assert answers["victims_session"]["status"] == 404, shown
            assert answers["made_up_session"]["status"] == 404, shown
            assert answers["made_up_modern_session"]["status"] == 400, shown
            assert answers["delete_victims_session"]["status"] == 404, shown
            opens = answers["opens"]
            assert [raw_structured(answer).get("sandbox_id", "")[:4] for answer in opens[:2]] == [
                "sbx-",
                "sbx-",
            ], shown
            for answer in opens[2:4]:  # sessionless and in its own session: one quota
                error = raw_structured(answer, error=True)["error"]
                assert error["field"] == "mcp.max_sandboxes_per_client", shown
            assert opens[4]["status"] == 400, shown
            # The victim: its file, its session, its quota — all its own.
            assert await read_notes(victim, box) == SECRET
            second = structured(await call(victim, "sandbox_open"))["sandbox_id"]
            listed = structured(await call(victim, "sandbox_list"))
            assert {entry["sandbox_id"] for entry in listed["sandboxes"]} == {box, second}
            assert len(witness.sbxkit_containers()) == 4  # two each
    finally:
        server.stop()
    log = server.output()
    assert all(token not in log for token in tokens.values())
    assert witness.sbxkit_containers() == []


def raw_structured(answer: dict[str, Any], *, error: bool = False) -> dict[str, Any]:
    """The structured content of a tool result a raw client got (an error when ``error``)."""
    result = (answer.get("reply") or {}).get("result")
    assert answer["status"] == 200, answer
    assert result is not None, answer
    assert result.get("isError", False) is error, result
    content: dict[str, Any] = result["structuredContent"]
    return content


HEAD_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0
"""docs/mcp.md: a request head must arrive within 10 s; an idle connection closes after 5 s."""
FLOOD = 1200
"""More half-open connections than a user's file-descriptor limit of 1024 (the red team held
1,104)."""
VICTIM_BOUND_S = 30.0
"""A ``run`` of ``echo`` answers in a second or two; thirty is noise-proof, and far below the
SDK client's five-minute read timeout the old server ran into."""


def server_fds(server: HttpServer) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def idle_connection_closed(server: HttpServer, idle_s: float) -> bool:
    """An authenticated request on a fresh connection, then ``idle_s`` of silence: has the
    server closed the connection (keep-alive timeout)?"""
    host, port = address(server)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": LEGACY_HELLO}
    headers = {
        "Authorization": f"Bearer {server.token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    conn.request("POST", "/mcp", json.dumps(body), headers)
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    time.sleep(idle_s)
    assert conn.sock is not None
    conn.sock.settimeout(5)
    try:
        return conn.sock.recv(1) == b""
    except OSError:
        return True
    finally:
        conn.close()


LEGACY_HELLO = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "keep-alive", "version": "0"},
}


async def test_half_open_connections_from_another_account_do_not_starve_a_client(
    tmp_path: Path, witness: Witness
) -> None:
    """The server runs with a user's limit of 1024 open files. Another account opens 1,200
    connections that never finish a request head (ten of them trickling a header line every
    second) and holds them: the victim's ``run`` still answers within its bound, a newcomer
    still connects, the server never holds more than its connection limit, and every one of
    the attacker's connections is closed within the head deadline. An authenticated
    connection left idle is closed after the keep-alive timeout."""
    profile = write_profile(tmp_path)
    server = HttpServer(profile, tmp_path / "http-server.log", open_files=1024)
    try:
        async with server.client() as victim:
            before = structured(await call(victim, "run", command=["echo", "before"]))
            assert before["stdout"] == "before\n"
            with local_account() as attacker:
                flood = attacker.popen(
                    ["python3", "-I", "-c", HALF_OPEN_FLOOD, *address(server), str(FLOOD), "10"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                try:
                    assert flood.stdout is not None
                    assert flood.stdin is not None
                    line = await trio.to_thread.run_sync(flood.stdout.readline)
                    assert line, flood.communicate(timeout=10)[1][-2000:]
                    flooded = time.monotonic()
                    held = json.loads(line)["held"]
                    fds = server_fds(server)
                    began = time.monotonic()
                    with trio.fail_after(VICTIM_BOUND_S):
                        during = structured(await call(victim, "run", command=["echo", "during"]))
                        async with server.client() as newcomer:
                            listed = structured(await call(newcomer, "sandbox_list"))
                    answered_in = time.monotonic() - began
                    assert during["stdout"] == "during\n"
                    assert listed["sandboxes"] == []
                    await trio.sleep(max(0.0, flooded + HEAD_TIMEOUT_S + 3 - time.monotonic()))
                    flood.stdin.write("check\n")
                    flood.stdin.flush()
                    line = await trio.to_thread.run_sync(flood.stdout.readline)
                    assert line, flood.communicate(timeout=10)[1][-2000:]
                    report = json.loads(line)
                finally:
                    flood.kill()
                    flood.wait(10)
            assert not account_exists(attacker.name)
        assert answered_in < VICTIM_BOUND_S
        assert fds < 600, fds  # limit 256 + 2 accept batches of 128 + its own (docs/mcp.md)
        assert report == {"held": held, "closed": held, "slow_closed": min(10, held)}, report
        assert await trio.to_thread.run_sync(idle_connection_closed, server, KEEP_ALIVE_S + 2.0)
    finally:
        server.stop()
    log = server.output()
    assert "the limit of 256 connections was reached" in log, log[-3000:]
    assert witness.sbxkit_containers() == []


# --- HTTP: transfers as large as max_file_bytes -----------------------------------------------


MAX_FILE_BYTES = 4 * 1024 * 1024
"""The profile's default ``max_file_bytes``, as the red team's server had it."""
WRITE = "sandbox_write_file"
BLOB = "blob.bin"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_file_of_max_file_bytes_goes_through_http(
    mode: str, profile: Path, tmp_path: Path
) -> None:
    """A write of exactly max_file_bytes succeeds over HTTP, as binary (base64) and as text,
    and reads back whole; so does a run whose stdin and files are each that large; one byte
    more is a tool error naming max_file_bytes, not a protocol error (the SDK's default 4 MiB
    request cap made it HTTP 413). The client lifts the SDK client's 1 MiB cap on one SSE
    event, as docs/mcp.md says a client reading large files must."""
    blob = os.urandom(MAX_FILE_BYTES)
    text = "x" * MAX_FILE_BYTES
    server = HttpServer(profile, tmp_path / "http-server.log")
    try:
        async with server.client(mode=mode, max_sse_event_size=None) as client:
            box = structured(await call(client, "sandbox_open"))["sandbox_id"]
            written = structured(
                await call(
                    client,
                    "sandbox_write_file",
                    sandbox_id=box,
                    path="blob.bin",
                    content=base64.b64encode(blob).decode(),
                    encoding="base64",
                )
            )
            assert written["bytes"] == MAX_FILE_BYTES
            digest = structured(
                await call(client, "sandbox_exec", sandbox_id=box, command=["sha256sum", BLOB])
            )
            assert digest["stdout"].split()[0] == hashlib.sha256(blob).hexdigest()
            back = structured(
                await call(
                    client, "sandbox_read_file", sandbox_id=box, path="blob.bin", encoding="base64"
                )
            )
            assert base64.b64decode(back["content"]) == blob
            as_text = await call(client, WRITE, sandbox_id=box, path="t", content=text)
            assert structured(as_text)["bytes"] == MAX_FILE_BYTES
            over = tool_error(
                await call(
                    client,
                    "sandbox_write_file",
                    sandbox_id=box,
                    path="blob.bin",
                    content=base64.b64encode(blob + b"!").decode(),
                    encoding="base64",
                )
            )
            assert (over["field"], "mcp.max_file_bytes" in over["message"]) == ("content", True)
            over_text = tool_error(
                await call(client, WRITE, sandbox_id=box, path="t", content=text + "x")
            )
            assert "mcp.max_file_bytes" in over_text["message"], over_text
            count = ["sh", "-c", "wc -c < /dev/stdin; wc -c < big.txt"]
            ran = structured(
                await call(client, "run", command=count, stdin=text, files={"big.txt": text})
            )
            assert ran["stdout"].split() == [str(MAX_FILE_BYTES)] * 2, ran
            structured(await call(client, "sandbox_close", sandbox_id=box))
    finally:
        server.stop()


# --- what a client checks: output schemas and annotations -----------------------------------------


GONE = "sbx-" + "0" * 24
ERROR_CALLS: dict[str, dict[str, Any]] = {
    "run": {"command": ["true"], "image": "alpine:3"},
    "sandbox_open": {"lifetime": 10**9},
    "sandbox_exec": {"sandbox_id": GONE, "command": ["true"]},
    "sandbox_write_file": {"sandbox_id": GONE, "path": "x", "content": ""},
    "sandbox_read_file": {"sandbox_id": GONE, "path": "x"},
    "sandbox_close": {"sandbox_id": GONE},
    "sandbox_list": {"everything": True},
    "process_start": {"sandbox_id": GONE, "shell": "sh"},
    "process_write": {"sandbox_id": GONE, "process_id": "p" + "0" * 16, "data": "x"},
    "process_read": {"sandbox_id": GONE, "process_id": "nope"},
    "process_signal": {"sandbox_id": GONE, "process_id": "p" + "0" * 16, "signal": "NOPE"},
    "process_kill": {"sandbox_id": GONE, "process_id": "p" + "0" * 16},
    "process_list": {"sandbox_id": GONE},
    "python": {"code": "1", "timeout": -1},
}
"""A refused call of every tool."""


def schema_validator(schema: dict[str, Any] | None) -> Any:
    """A JSON-schema validator of the schema's dialect (2020-12, MCP's default), the schema
    itself checked first."""
    assert schema is not None
    validator = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    validator.check_schema(schema)
    return validator(schema)


@pytest.mark.parametrize("cell", CELLS)
async def test_every_result_conforms_to_its_tools_output_schema(
    cell: str, profile: Path, tmp_path: Path
) -> None:
    """An error result is checked against the tool's output schema as strictly as a result
    (the MCP Inspector does so): every tool's refusal conforms, and so does every tool's
    result."""
    async with connect(cell, profile, tmp_path) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(ERROR_CALLS) == set(tools)
        for name, arguments in ERROR_CALLS.items():
            refused = await client.call_tool(name, arguments)
            tool_error(refused)
            schema_validator(tools[name].output_schema).validate(refused.structured_content)
        box = structured(await call(client, "sandbox_open"))["sandbox_id"]
        results = {
            "run": await call(client, "run", command=["echo", "hi"]),
            "sandbox_exec": await call(client, "sandbox_exec", sandbox_id=box, command=["true"]),
            "sandbox_write_file": await call(
                client, "sandbox_write_file", sandbox_id=box, path="f", content="x"
            ),
            "sandbox_read_file": await call(client, "sandbox_read_file", sandbox_id=box, path="f"),
            "sandbox_list": await call(client, "sandbox_list"),
        }
        started = await call(client, "process_start", sandbox_id=box, shell="cat")
        ids = {"sandbox_id": box, "process_id": structured(started)["process_id"]}
        results["process_start"] = started
        results["process_write"] = await call(client, "process_write", **ids, data="hi\n")
        results["process_read"] = await call(client, "process_read", **ids, wait=5)
        results["process_signal"] = await call(client, "process_signal", **ids, signal="CONT")
        results["process_list"] = await call(client, "process_list", sandbox_id=box)
        results["process_kill"] = await call(client, "process_kill", **ids)
        results["sandbox_close"] = await call(client, "sandbox_close", sandbox_id=box)
        results["python"] = await call(client, "python", code="print('hi'); 6 * 7")
        for name, result in results.items():
            schema_validator(tools[name].output_schema).validate(structured(result))
        raised = await call(client, "python", code="1 / 0")  # the code's error is a result too
        assert raised.is_error
        schema_validator(tools["python"].output_schema).validate(raised.structured_content)


HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
EXPECTED_ANNOTATIONS = {
    # tool: (read-only, destructive, idempotent, open world) with no network and no writable
    # mount: a run changes nothing that outlives its sandbox, so running it again adds nothing
    "run": (False, False, True, False),
    "sandbox_open": (False, False, False, False),
    "sandbox_exec": (False, True, False, False),
    "sandbox_write_file": (False, True, True, False),
    "sandbox_read_file": (True, False, True, False),
    "sandbox_close": (False, True, True, False),
    "sandbox_list": (True, False, True, False),
    "process_start": (False, True, False, False),
    "process_write": (False, True, False, False),
    "process_read": (True, False, True, False),
    "process_signal": (False, True, False, False),
    "process_kill": (False, True, True, False),
    "process_list": (True, False, True, False),
    "python": (False, True, False, False),
}


@pytest.mark.parametrize("cell", CELLS)
async def test_every_tool_carries_annotations(cell: str, profile: Path, tmp_path: Path) -> None:
    async with connect(cell, profile, tmp_path) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == set(EXPECTED_ANNOTATIONS)
    for name, expected in EXPECTED_ANNOTATIONS.items():
        annotations = tools[name].annotations
        assert annotations is not None, name
        shown = annotations.model_dump(by_alias=True)
        assert tuple(shown[hint] for hint in HINTS) == expected, (name, shown)
        assert annotations.title
        assert tools[name].title == annotations.title
