"""Injection and inbound ports through every surface a user reaches them by (issue 45, "Done
when": the CLI, a profile — so Inspect and MCP get them — and an interpreter session).

Each test drives the real thing in a subprocess, as a user would: ``sbxkit run --inject``, a
real ``inspect eval`` (Inspect's mock model, offline) whose solver runs in the eval process on
the host, and ``sbxkit mcp`` through the MCP SDK's own client over stdio and over HTTP. The
upstream that demands the bearer token and the payload that looks for the token everywhere it
can read are tests/network/test_broker.py's; the forwarded port serves a Python
``http.server`` that the host fetches through the port the surface reported.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mcp_types
import msgspec
import pytest
import trio

import sbxkit
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from tests.engine.mcp_support import CELLS, LIMITS, connect, structured
from tests.engine.test_inspect_eval import eval_env, inspect_argv
from tests.engine.test_inspect_provider import write_profile
from tests.network.payloads import SBXKIT_RUN, command, output
from tests.network.servers import OTHER_NAME
from tests.network.test_broker import (
    API,
    PORT,
    PROBE,
    TOKEN_ENV,
    Api,
    assert_clean,
    running_api,
)
from tests.network.test_broker import network as broker_network
from tests.network.test_ports import ECHO, echoed, host_listeners
from tests.supervision import (
    auto_launched_supervisors,
    private_state_dir,
    running_supervisor,
    signal_supervisors,
    supervisor_pids,
    wait_gone,
)
from tests.witness import BUSYBOX, PYTHON, Witness

MARK = "sbxkit-surface-port"
SERVE = ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp"]
INTERPRETER_SERVES = f"""
import http.server, threading

class Quiet(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory="/tmp", **kwargs)

    def log_message(self, *args):
        pass

open("/tmp/mark", "w").write({MARK!r})
server = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Quiet)
threading.Thread(target=server.serve_forever, daemon=True).start()
"""


def fetch_until_served(host_port: int, path: str = "/mark", seconds: float = 30.0) -> bytes:
    """The page at the host's ``127.0.0.1:host_port``, once the sandbox's server answers."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{host_port}{path}", timeout=10) as r:
                return bytes(r.read())
        except OSError:
            assert time.monotonic() < deadline, f"nothing answered on {host_port}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def api(tier: str) -> Iterator[Api]:
    with running_api() as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(api: Api) -> None:
    api.clear()


def refused(host_port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", host_port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def listeners(host_port: int) -> set[int]:
    """The pids holding a listening TCP socket on ``host_port`` (this namespace's table)."""
    inodes = {f"socket:[{row.split()[9]}]" for row in host_listeners(host_port)}
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                pids.add(int(pid))
        except OSError:
            continue  # gone, or not ours to read
    return pids


def network_table(api: Api) -> str:
    """The profile's network: the API allowed, its rule (the value from the caller's
    environment, the upstream's CA named), and port 8000 forwarded."""
    return f"""
[sandbox.docker.network]
allow = ["{OTHER_NAME}:{PORT}"]
ports = [8000]
inject = [{{host = "{OTHER_NAME}", header = "Authorization", \
value_from = "env:{TOKEN_ENV}", ca_file = "{api.ca_file}"}}]
"""


# -- the command line --------------------------------------------------------------------------


def test_sbxkit_run_inject_reaches_the_api_with_the_host_trust_store(
    api: Api, witness: Witness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sbxkit run --inject HOST:Authorization=env:NAME``: the payload's request reaches the
    upstream with the header, and the token is nowhere the payload can read. A ``--inject``
    rule names no CA, so the proxy verifies the upstream against its host's trust store: a
    supervisor whose OpenSSL trusts the test CA (``SSL_CERT_FILE``, OpenSSL's own variable)
    lets the call through, the tier's other supervisor (which does not) refuses it unsent."""
    flags = [
        *("--allow", f"{OTHER_NAME}:{PORT}"),
        *("--inject", f"{OTHER_NAME}:Authorization=env:{TOKEN_ENV}"),
        *("--memory", "256m", "--timeout", "90"),
    ]
    argv = [*SBXKIT_RUN, *flags, PYTHON, "--", *command(PROBE, f"{API}/cli")]
    state = private_state_dir()
    monkeypatch.setenv("SSL_CERT_FILE", str(api.ca_file))  # the supervisor's trust store only
    with running_supervisor(state):
        monkeypatch.delenv("SSL_CERT_FILE")
        env = {**os.environ, "SBXKIT_STATE_DIR": str(state)}
        assert env[TOKEN_ENV] == f"Bearer {api.token}"
        proc = subprocess.run(argv, capture_output=True, timeout=240, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "exited", doc
    got = output(doc["stdout"].encode())
    assert got["reply"] == [200, "api /cli granted"], got
    assert api.seen() == [[f"Bearer {api.token}"]]
    assert_clean(got)
    assert api.token not in proc.stdout.decode() + proc.stderr.decode()
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    api.clear()
    # the same run with a supervisor that does not trust the upstream: refused, nothing sent
    other = private_state_dir()
    with running_supervisor(other):
        env = {**os.environ, "SBXKIT_STATE_DIR": str(other)}
        proc = subprocess.run(argv, capture_output=True, timeout=240, check=False, env=env)
    doc = json.loads(proc.stdout)
    status, body = output(doc["stdout"].encode())["reply"]
    assert (status, "CERTIFICATE_VERIFY_FAILED" in body) == (502, True), body
    assert api.seen() == []


# -- Inspect -----------------------------------------------------------------------------------

TASK = """
import json, time, urllib.request

import anyio
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.solver import solver
from inspect_ai.util import sandbox

from sbxkit.inspect_provider import SbxkitSandboxEnvironment

PROBE = {probe!r}
URL = {url!r}
SERVE = "python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp >/dev/null 2>&1 &"


def fetch(port):
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/mark", timeout=10) as r:
                return r.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@solver
def broker_and_port():
    async def solve(state, generate):
        box = sandbox()
        called = await box.exec(["python3", "-c", PROBE, URL])
        state.store.set("probe", called.stdout)
        await box.write_file("mark", {mark!r})
        started = await box.exec(["sh", "-c", SERVE])
        state.store.set("started", started.returncode)
        ports = await box.as_type(SbxkitSandboxEnvironment).ports()
        state.store.set("ports", [[p.address, p.host_port, p.sandbox_port] for p in ports])
        state.store.set("page", await anyio.to_thread.run_sync(fetch, ports[0].host_port))
        return state

    return solve


@task
def broker_surface():
    return Task(
        dataset=[Sample(input="call the api, serve a page", id=1)],
        solver=[broker_and_port()],
        sandbox=("sbxkit", "profile.toml"),
        model=get_model("mockllm/model"),
    )
"""


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_an_inspect_sample_gets_injection_and_a_port_from_its_profile(
    api: Api, witness: Witness, tmp_path: Path, backend: str
) -> None:
    """A real ``inspect eval``: the profile's rule lets the sample's payload call the API
    without the token, and the solver (on the host) fetches the sample's ``http.server``
    through the port ``sandbox().as_type(SbxkitSandboxEnvironment).ports()`` reports; the port
    refuses once the eval ended."""
    write_profile(tmp_path / "profile.toml", PYTHON, network_table(api))
    (tmp_path / "task.py").write_text(TASK.format(probe=PROBE, url=f"{API}/inspect", mark=MARK))
    proc = subprocess.run(
        inspect_argv("eval", "task.py", "--log-format", "json", "--display", "plain"),
        cwd=tmp_path,
        env={**eval_env(tmp_path), "INSPECT_ASYNC_BACKEND": backend},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    (log_path,) = (tmp_path / "logs").glob("*.json")
    log = json.loads(log_path.read_text())
    assert log["status"] == "success", log.get("error")
    (sample,) = log["samples"]
    assert sample.get("error") is None, sample["error"]
    store = sample["store"]
    got = output(store["probe"].encode())
    assert got["reply"] == [200, "api /inspect granted"], got
    assert_clean(got)
    assert api.seen() == [[f"Bearer {api.token}"]]
    assert store["started"] == 0
    ((address, host_port, sandbox_port),) = store["ports"]
    assert (address, sandbox_port) == ("127.0.0.1", 8000)
    assert store["page"] == MARK
    assert api.token not in log_path.read_text()
    assert witness.containers(label="sbxkit.inspect.task=broker_surface") == []
    assert refused(host_port)


# -- MCP ---------------------------------------------------------------------------------------


def mcp_profile(api: Api, directory: Path) -> Path:
    path = directory / "mcp-profile.toml"
    path.write_text(
        f'[sandbox.docker]\nimage = "{PYTHON}"\n{LIMITS}\n{network_table(api)}\n[mcp]\n'
        f'images = ["{PYTHON}", "{BUSYBOX}"]\nmax_sandboxes_per_client = 3\n'
        "max_sandboxes = 6\nidle_timeout = 300\nlifetime = 600\n"
    )
    return path


def text_of(result: mcp_types.CallToolResult) -> str:
    return "\n".join(
        part.text for part in result.content if isinstance(part, mcp_types.TextContent)
    )


@pytest.mark.parametrize("cell", CELLS)
async def test_mcp_reports_the_ports_and_its_sandboxes_call_the_api_without_the_token(
    cell: str, api: Api, tmp_path: Path
) -> None:
    """Through the MCP SDK's client: ``sandbox_open`` says the host port (structured and in
    its text), a ``process_start``ed ``http.server`` is fetched there from the host, and
    ``sandbox_list`` says it again; a ``sandbox_exec`` calls the API through the profile's
    rule without ever holding the token; the ``python`` tool's interpreter reports its own
    port (structured and text) and its server is fetched there too. Every port refuses once
    its sandbox is closed. (On the old code: no ``ports`` in any result.)"""
    profile = mcp_profile(api, tmp_path)
    async with connect(cell, profile, tmp_path) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        described = tools["sandbox_open"].description or ""
        assert "inbound ports 8000" in described, described
        assert f"adds the credentials for {OTHER_NAME}" in described, described

        opened_result = await client.call_tool("sandbox_open", {})
        opened = structured(opened_result)
        ((port),) = opened["ports"]
        assert (port["address"], port["sandbox_port"]) == ("127.0.0.1", 8000)
        assert port["host_port"] > 0
        assert json.loads(text_of(opened_result))["ports"] == opened["ports"]
        box = opened["sandbox_id"]
        structured(
            await client.call_tool(
                "sandbox_write_file", {"sandbox_id": box, "path": "mark", "content": MARK}
            )
        )
        structured(await client.call_tool("process_start", {"sandbox_id": box, "command": SERVE}))
        assert fetch_until_served(port["host_port"]) == MARK.encode()
        listed = structured(await client.call_tool("sandbox_list", {}))
        assert [entry["ports"] for entry in listed["sandboxes"]] == [[port]]

        ran = structured(
            await client.call_tool(
                "sandbox_exec", {"sandbox_id": box, "command": command(PROBE, f"{API}/mcp")}
            )
        )
        got = output(ran["stdout"].encode())
        assert got["reply"] == [200, "api /mcp granted"], got
        assert_clean(got)
        assert api.seen() == [[f"Bearer {api.token}"]]

        answer = await client.call_tool("python", {"code": INTERPRETER_SERVES})
        fields = structured(answer)
        ((served),) = fields["ports"]
        assert served["sandbox_port"] == 8000
        assert served["host_port"] != port["host_port"]
        said = f"127.0.0.1:{served['host_port']}->8000"
        assert said in text_of(answer), text_of(answer)
        assert fetch_until_served(served["host_port"]) == MARK.encode()

        structured(await client.call_tool("sandbox_close", {"sandbox_id": box}))
        assert refused(port["host_port"])
    assert refused(served["host_port"])
    assert api.token not in (tmp_path / "mcp-profile.toml").read_text()


# -- both directions at once -------------------------------------------------------------------

HELD = r"""
import urllib.request
try:
    urllib.request.urlopen("https://other-name.sbxkit.test:8443/hold", timeout=60).read()
    said = "answered"
except Exception as error:
    said = "ended " + type(error).__name__
open("/tmp/hold-ended", "w").write(said)
"""
"""An injected request the upstream holds open (``/hold``); what ended it, in a file."""


async def test_a_supervisor_sigkill_ends_an_injected_and_an_inbound_connection_at_once(
    engine: Engine, api: Api
) -> None:
    """One sandbox with an inject rule and a port, a connection open each way through its
    supervisor — an injected HTTPS request the upstream holds, and a host connection to the
    sandbox's echo server — when the supervisor is SIGKILLed: both end (the payload's request
    fails, the host end reads its end, the echo server inside sees its connection end) and the
    port refuses; the relaunched supervisor re-adopts the sandbox."""
    state_dir = private_state_dir()
    backend = DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(state_dir)),
        recover_at_open=False,
    )
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=["sleep", "1"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=256 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=90
        ),
        network=msgspec.structs.replace(broker_network(api), ports=["8001"]),
    )
    with auto_launched_supervisors(state_dir):
        async with sbxkit.open_sandbox(spec, backend=backend) as sandbox:
            await sandbox.put_files({"echo.py": ECHO.encode(), "held.py": HELD.encode()}, "/tmp")
            await sandbox.start(["python3", "/tmp/echo.py"])
            (port,) = await sandbox.ports()
            held = await trio.to_thread.run_sync(echoed, port)
            await sandbox.start(["python3", "/tmp/held.py"])
            with trio.fail_after(30):
                while True:
                    if [f"Bearer {api.token}"] in api.seen():  # /hold reached, with the token
                        break
                    await trio.sleep(0.05)
            with held:
                held.settimeout(10)
                pids = signal_supervisors(state_dir)
                assert len(pids) == 1, pids
                wait_gone(pids)
                try:
                    ended = held.recv(16)
                except ConnectionResetError:
                    ended = b""
            assert ended == b""
            # The killed supervisor's port is closed. The caller's link relaunches a supervisor
            # at once to re-adopt the sandbox, and that one forwards the port again: whoever
            # listens now must be one of the new supervisors.
            if not refused(port.host_port):
                assert listeners(port.host_port) <= set(supervisor_pids(state_dir)) - set(pids)
            with trio.fail_after(20):
                while True:
                    echo = (await sandbox.exec(["cat", "/tmp/echo-ended"])).stdout
                    hold = (await sandbox.exec(["cat", "/tmp/hold-ended"])).stdout
                    if echo and hold:
                        break
                    await trio.sleep(0.1)
            assert echo == b"ended"
            assert hold.startswith(b"ended "), hold  # not answered: the proxy died under it
