"""Inbound ports (issue 45, item 2): the host reaches a server on the sandbox's own loopback.

``Network(ports=[8000])`` makes the lease's owner listen on the host's 127.0.0.1 (a free port)
and pass each connection from the owner's own account into the sandbox's network namespace, to
its ``127.0.0.1:8000`` — under ``NetworkMode: none``, with no route and no bridge. Here a
Python ``http.server`` in the sandbox is fetched from the host through the forwarded port, for
a session (supervised and in this process) and a session claimed from the supervisor's pool;
another local account (a real one, tests/accounts.py) is refused; the port closes with the
sandbox and with a SIGKILLed supervisor (a connection through it ends on both sides); bad
``--port`` values are refused before anything exists. The tier's own check after every test
proves no container, no setns thread and no socket of another namespace left behind; each test
also proves no host listener is left on the ports it used.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import trio

import sbxkit
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import Network
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.pool.held import HeldPool, PooledBackend
from tests.accounts import local_account
from tests.network.payloads import SBXKIT_RUN
from tests.network.servers import ALLOWED, Servers
from tests.supervision import (
    SupervisorProcess,
    auto_launched_supervisors,
    private_state_dir,
    running_supervisor,
    signal_supervisors,
    wait_gone,
)
from tests.witness import PYTHON, Witness

SERVE = ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp"]
MARK = "sbxkit-port-test"

ECHO = r"""
import socket
server = socket.create_server(("127.0.0.1", 8001))
connection, _ = server.accept()
while data := connection.recv(65536):
    connection.sendall(data)
open("/tmp/echo-ended", "w").write("ended")
"""

ACCOUNT_FETCH = r"""
import socket, sys
try:
    connection = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
    connection.sendall(b"GET /mark HTTP/1.0\r\nHost: x\r\n\r\n")
    print(repr(connection.recv(65536)))
except OSError as error:
    print(type(error).__name__)
"""


def spec(network: Network, **extra: object) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=["sleep", "1"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=90
        ),
        network=network,
        **extra,  # type: ignore[arg-type]
    )


def fetch(port: PortForward, path: str = "/mark") -> bytes:
    with urllib.request.urlopen(f"http://{port.url_host}:{port.host_port}{path}", timeout=10) as r:
        return bytes(r.read())


async def serving(sandbox: sbxkit.Sandbox) -> PortForward:
    """The sandbox's one forwarded port, once its ``http.server`` answers through it."""
    await sandbox.put_files({"mark": MARK.encode()}, "/tmp")
    await sandbox.start(SERVE)
    (port,) = await sandbox.ports()
    assert (port.address, port.sandbox_port) == ("127.0.0.1", 8000)
    assert port.host_port > 0
    assert await fetched(port) == MARK.encode()
    return port


async def fetched(port: PortForward) -> bytes:
    """The page through ``port``, once the sandbox's server listens (within 30 s)."""
    with trio.fail_after(30):
        while True:
            try:
                return await trio.to_thread.run_sync(fetch, port)
            except OSError:
                await trio.sleep(0.1)


def refused(port: PortForward) -> bool:
    """Nothing listens on the host's port any more."""
    try:
        socket.create_connection((port.address, port.host_port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def host_listeners(port: int) -> list[str]:
    """Rows of this namespace's TCP tables listening on ``port`` (state 0A)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                rows.append(row)
    return rows


async def test_a_sessions_http_server_is_fetched_from_the_host(
    backend: DockerBackend, servers: Servers
) -> None:
    """The payload's server on its own 127.0.0.1:8000, fetched by urllib on the host; the
    host port refuses once the session ended (on the old code: ``network.ports`` was an
    unknown field, refused)."""
    async with sbxkit.open_sandbox(spec(Network(ports=[8000])), backend=backend) as sandbox:
        port = await serving(sandbox)
        listing = await trio.to_thread.run_sync(fetch, port, "/")
        assert b"Directory listing" in listing
        assert await sandbox.denials() == ()
    assert refused(port)
    assert host_listeners(port.host_port) == []


INTERPRETER_SERVES = f"""
import http.server, threading

class Quiet(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory="/tmp", **kwargs)

    def log_message(self, *args):  # no output between the interpreter's calls
        pass

open("/tmp/mark", "w").write({MARK!r})
server = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Quiet)
threading.Thread(target=server.serve_forever, daemon=True).start()
"""


async def test_an_interpreter_sessions_server_is_fetched_from_the_host(
    backend: DockerBackend, servers: Servers
) -> None:
    """An interpreter session (issue 45: ports from an interpreter session too): code run in it
    starts a server on the sandbox's 127.0.0.1:8000 that outlives the call; the host fetches
    it through the port ``interp.sandbox.ports()`` reports, the interpreter goes on answering,
    and the port refuses once the session ended."""
    async with sbxkit.open_interpreter(spec(Network(ports=[8000])), backend=backend) as interp:
        started = await interp.run_code(INTERPRETER_SERVES)
        assert started.error is None, started.error
        (port,) = await interp.sandbox.ports()
        assert (port.address, port.sandbox_port) == ("127.0.0.1", 8000)
        assert await fetched(port) == MARK.encode()
        assert (await interp.run_code("server.server_address")).text == "('127.0.0.1', 8000)"
    assert refused(port)
    assert host_listeners(port.host_port) == []


async def test_another_local_account_is_refused(backend: DockerBackend, servers: Servers) -> None:
    """A real second account connects to the forwarded port on the same loopback: the owner
    closes it before a byte reaches the sandbox, and says why (its uid, not the owner's);
    the owner's own request right after is served."""
    async with sbxkit.open_sandbox(spec(Network(ports=[8000])), backend=backend) as sandbox:
        port = await serving(sandbox)
        with local_account() as attacker:
            ran = await trio.to_thread.run_sync(
                lambda: attacker.python(
                    ACCOUNT_FETCH, str(port.host_port), capture_output=True, text=True
                )
            )
        assert ran.returncode == 0, ran.stderr
        answer = ran.stdout.strip()
        assert answer in ("b''", "ConnectionResetError"), answer  # not a byte of the page
        denials = await sandbox.denials()
        assert [(d.destination, d.kind) for d in denials] == [("127.0.0.1:8000", "inbound")]
        assert f"uid {attacker.uid}, not the sandbox owner's" in denials[0].reason
        assert await trio.to_thread.run_sync(fetch, port) == MARK.encode()


async def test_a_session_claimed_from_the_supervisors_pool_forwards_its_port(
    engine: Engine, supervisor: SupervisorProcess, servers: Servers, witness: Witness
) -> None:
    """A pooled sandbox: its port was bound when it was parked, and the claimer learns it."""
    backend = PooledBackend(
        pool=HeldPool(size=1, refill=False),
        engine=engine,
        settings=Settings(supervisor_state_dir=str(supervisor.state_dir)),
        recover_at_open=False,
    )
    pooled = spec(Network(ports=[8000]))
    assert await backend.warm(pooled) == 1
    (parked,) = witness.sbxkit_containers()
    async with sbxkit.open_sandbox(pooled, backend=backend) as sandbox:
        assert sandbox.container_id == parked["Id"]  # claimed, not cold
        port = await serving(sandbox)
    await backend.end(pooled)
    assert refused(port)


async def test_a_supervisor_sigkill_closes_the_port_both_ways(
    engine: Engine, witness: Witness, servers: Servers
) -> None:
    """A connection through the port is open (an echo server inside answers through it) when
    the supervisor is SIGKILLed: the host end reads its end, the sandbox's end sees its
    connection end, and the port the dead supervisor bound refuses. The caller's relaunched
    supervisor re-adopts the lease and forwards again, on a port it reports."""
    state_dir = private_state_dir()
    backend = DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(state_dir)),
        recover_at_open=False,
    )
    network = Network(ports=["8001"], allow=[f"{ALLOWED}:80"])
    with auto_launched_supervisors(state_dir):
        async with sbxkit.open_sandbox(spec(network), backend=backend) as sandbox:
            await sandbox.put_files({"echo.py": ECHO.encode()}, "/tmp")
            await sandbox.start(["python3", "/tmp/echo.py"])
            (port,) = await sandbox.ports()
            held = await trio.to_thread.run_sync(echoed, port)
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
            assert refused(port)
            with trio.fail_after(20):
                while True:
                    if (await sandbox.exec(["cat", "/tmp/echo-ended"])).stdout == b"ended":
                        break  # the sandbox's end of the connection ended too
                    await trio.sleep(0.1)
            with trio.fail_after(30):
                while True:
                    again = await sandbox.ports()
                    if again and again[0].host_port:
                        break
                    await trio.sleep(0.1)
        assert refused(again[0])
    assert host_listeners(port.host_port) == []


def echoed(port: PortForward) -> socket.socket:
    """A connection through ``port`` the sandbox's echo server answered (once it listens)."""
    deadline = time.monotonic() + 30
    while True:
        held = socket.create_connection(("127.0.0.1", port.host_port), 5)
        try:
            held.sendall(b"ping")
            if held.recv(16) == b"ping":
                return held
        except OSError:
            pass
        held.close()
        assert time.monotonic() < deadline, "the echo server never answered"
        time.sleep(0.1)


def test_the_command_line_opens_lists_and_closes_a_forwarded_port(witness: Witness) -> None:
    """``sbxkit open --port 127.0.0.1::8000`` says the host port (``--json``, and on stderr),
    ``sbxkit sessions`` lists it, the page comes through it, and ``sbxkit close`` closes it."""
    state = private_state_dir()
    sessions = Path(tempfile.mkdtemp(prefix="sbxports-", dir="/tmp"))
    os.chmod(sessions, 0o700)
    env = {**os.environ, "SBXKIT_STATE_DIR": str(state), "SBXKIT_SESSIONS_DIR": str(sessions)}

    def sbxkit_cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "sbxkit", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (args, done.stderr)
        return done

    try:
        with running_supervisor(state):
            opened = sbxkit_cli(
                "open", "--name", "web", "--json", "--port", "127.0.0.1::8000", PYTHON
            )
            (given,) = json.loads(opened.stdout)["ports"]
            port = PortForward(**given)
            assert (port.address, port.sandbox_port) == ("127.0.0.1", 8000)
            assert f"sbxkit: web forwards 127.0.0.1:{port.host_port}->8000" in opened.stderr
            assert f"127.0.0.1:{port.host_port}->8000" in sbxkit_cli("sessions").stdout
            sbxkit_cli("exec", "-d", "web", "--", *SERVE)
            deadline = time.monotonic() + 30
            while True:
                try:
                    assert b"Directory listing" in fetch(port, "/")
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the server never answered"
                    time.sleep(0.1)
            sbxkit_cli("close", "web")
            assert refused(port)
    finally:
        shutil.rmtree(sessions, ignore_errors=True)
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


ONE_REQUEST = (
    "import http.server as h; "
    "h.HTTPServer(('127.0.0.1', 8000), h.SimpleHTTPRequestHandler).handle_request()"
)


def test_a_one_shot_run_serves_on_the_host_port_it_names(witness: Witness) -> None:
    """``sbxkit run --port 18000:8000``: the payload serves one request, which the host sends
    to the port it named while the run runs; the result lists the port."""
    port = PortForward(host_port=18000, sandbox_port=8000)
    flags = ["--port", "18000:8000", "--workdir", "/tmp"]
    run = subprocess.Popen(
        [*SBXKIT_RUN, *flags, PYTHON, "--", "python3", "-c", ONE_REQUEST],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert b"Directory listing" in fetch(port, "/")
                break
            except OSError:
                assert run.poll() is None, run.communicate()
                assert time.monotonic() < deadline, "the run's server never answered"
                time.sleep(0.1)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    doc = json.loads(out)
    assert doc["status"] == "exited", err
    assert doc["ports"] == [{"address": "127.0.0.1", "host_port": 18000, "sandbox_port": 8000}]
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    assert refused(port)


def test_bad_ports_are_refused_before_anything_exists(witness: Witness) -> None:
    began = time.time()
    for flags, field, words in (
        (["--port", "0"], "--port[0]", "the sandbox port must be a number from 1 to 65535"),
        (["--port", "70000"], "--port[0]", "the sandbox port must be a number from 1 to 65535"),
        (["--port", "8000", "--port", "x:1:80"], "--port[1]", "must be an IP address"),
        (["--port", "0.0.0.0:18000:8000"], "--port[0]", "is not loopback"),
        (["--port", "8000/udp"], "--port[0]", "only tcp ports"),
        (["--port", "3128", "--allow", ALLOWED], "--port[0]", "sbxkit's own listener"),
        (["--port-beyond-loopback"], "--port-beyond-loopback", "only meaningful with"),
    ):
        proc = subprocess.run(
            [*SBXKIT_RUN, *flags, PYTHON, "--", "true"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        error = json.loads(proc.stdout)["error"]
        assert (error["field"], words in error["message"]) == (field, True), error
    production = subprocess.run(
        [
            *SBXKIT_RUN,
            "--port",
            "0.0.0.0:18000:8000",
            "--port-beyond-loopback",
            PYTHON,
            "--",
            "true",
        ],
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "SBXKIT_ENV": "production"},
    )
    assert production.returncode == 2, production.stderr
    assert json.loads(production.stdout)["error"]["field"] == "--port-beyond-loopback"
    assert witness.events(began, time.time() + 1, type=["container"], event=["create"]) == []
