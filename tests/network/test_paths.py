"""Every way a governed sandbox is reached: cold (the gate), pooled in this process, held by
the supervisor, a session, the CLI, ``sbxkit.run``, a batch and the Inspect provider from a
profile — and the consumers that cannot be governed, refused before anything exists.

The Done-when's agent-style run is here: Python's urllib in the python test image fetching over
HTTPS from an allowed name through the injected proxy variables, and refused on another name,
through the command line and ``sbxkit.run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

import sbxkit
from sbxkit._model.network_terms import Network
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from sbxkit.pool.held import HeldPool, PooledBackend
from tests.network.payloads import FETCH, SBXKIT_RUN, command, output
from tests.network.servers import ALLOWED, DENIED, Servers
from tests.supervision import SupervisorProcess
from tests.witness import PYTHON, Witness

GOOD, BAD = f"https://{ALLOWED}/agent", f"https://{DENIED}/agent"


def agent_spec(servers: Servers, **network: Any) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=command(FETCH, GOOD, BAD),
        env={"TEST_CA": servers.ca_pem},
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
        ),
        network=Network(allow=[f"{ALLOWED}:443"], **network),
    )


def assert_agent_run(stdout: bytes | str, servers: Servers) -> None:
    got = output(stdout.encode() if isinstance(stdout, str) else stdout)
    assert got[GOOD] == [200, f"A {ALLOWED} /agent"]
    assert got[BAD][0] == "error"
    assert "403" in got[BAD][1]
    assert [path for _, path, _ in servers.seen["a"].requests] == ["/agent"]
    assert servers.seen["b"].requests == []


async def test_sbxkit_run_agent_style(servers: Servers) -> None:
    """``sbxkit.run`` with its defaults: the auto-launched supervisor owns the lease."""
    result = await sbxkit.run(agent_spec(servers))
    assert result.ok, result.stderr
    assert_agent_run(result.stdout, servers)
    assert [(d.destination, d.reason) for d in result.denials] == [
        (f"{DENIED}:443", "not on the allow-list")
    ]


async def test_a_run_with_files_carries_its_denials(servers: Servers) -> None:
    """``sbxkit.run(files=...)`` is a short session: its result carries the session's denials."""
    spec = msgspec.structs.replace(
        agent_spec(servers), command=["python3", "/tmp/fetch.py", GOOD, BAD]
    )
    result = await sbxkit.run(spec, files={"fetch.py": FETCH.encode()})
    assert result.ok, result.stderr
    assert_agent_run(result.stdout, servers)
    assert [d.destination for d in result.denials] == [f"{DENIED}:443"]


def test_the_command_line_agent_style(servers: Servers) -> None:
    proc = subprocess.run(
        [
            *SBXKIT_RUN,
            "--allow",
            f"{ALLOWED}:443",
            "--env",
            "TEST_CA",
            "--memory",
            "128m",
            PYTHON,
            "--",
            "python3",
            "-c",
            FETCH,
            GOOD,
            BAD,
        ],
        env={**os.environ, "TEST_CA": servers.ca_pem},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert_agent_run(doc["stdout"], servers)
    assert doc["denials"] == [
        {"destination": f"{DENIED}:443", "reason": "not on the allow-list", "kind": "connect"}
    ]


def test_the_command_line_refuses_bad_network_flags_before_anything_exists(
    witness: Witness,
) -> None:
    began = time.time()
    for flags, field in (
        (["--allow", "https://x.example"], "--allow[0]"),
        (["--network", "bridge", "--allow", "x.example"], "--allow"),
        (
            ["--callback", "http://x.example:8080", "--tls-ca", "/etc/hostname"],
            "--tls-ca/--tls-cert/--tls-key",
        ),
        (["--tls-key", "/etc/hostname"], "--tls-ca"),
    ):
        proc = subprocess.run(
            [*SBXKIT_RUN, *flags, PYTHON, "--", "true"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert json.loads(proc.stdout)["error"]["field"] == field
    assert witness.events(began, time.time() + 1, type=["container"], event=["create"]) == []


async def test_a_pool_in_this_process_parks_governed_containers(
    backend: DockerBackend, servers: Servers
) -> None:
    spec = agent_spec(servers)
    async with sbxkit.open_pool(spec, size=1, backend=backend, refill=False) as pool:
        await pool.wait_ready(1)
        result = await pool.run(spec)
    assert result.pooled
    assert result.ok, result.stderr
    assert_agent_run(result.stdout, servers)
    assert [d.destination for d in result.denials] == [f"{DENIED}:443"]


async def test_a_pool_held_by_the_supervisor_parks_governed_containers(
    engine: Engine, supervisor: SupervisorProcess, servers: Servers
) -> None:
    backend = PooledBackend(
        pool=HeldPool(size=1, refill=False, wait_for_removal=True),
        engine=engine,
        settings=Settings(supervisor_state_dir=str(supervisor.state_dir)),
        recover_at_open=False,
    )
    spec = agent_spec(servers)
    assert await backend.warm(spec) == 1
    result = await backend.run_once(spec)
    assert result.pooled
    assert result.ok, result.stderr
    assert_agent_run(result.stdout, servers)
    assert [d.destination for d in result.denials] == [f"{DENIED}:443"]
    # another allow-list is another shape (its own pool): it never gets this one's container
    other = msgspec.structs.replace(spec, network=Network(allow=[f"{DENIED}:443"]))
    result = await backend.run_once(other)
    assert [d.destination for d in result.denials] == [f"{ALLOWED}:443"]
    assert output(result.stdout)[BAD][0] == 200
    await backend.end(spec)
    await backend.end(other)


async def test_a_session_claimed_from_the_supervisors_pool_is_governed(
    engine: Engine, supervisor: SupervisorProcess, servers: Servers, witness: Witness
) -> None:
    backend = PooledBackend(
        pool=HeldPool(size=1, refill=False),
        engine=engine,
        settings=Settings(supervisor_state_dir=str(supervisor.state_dir)),
        recover_at_open=False,
    )
    spec = msgspec.structs.replace(agent_spec(servers), env={})  # a session with env goes cold
    assert await backend.warm(spec) == 1
    (parked,) = witness.sbxkit_containers()
    async with sbxkit.open_sandbox(spec, backend=backend) as sandbox:
        assert sandbox.container_id == parked["Id"]  # claimed, not cold
        result = await sandbox.exec(list(spec.command), env={"TEST_CA": servers.ca_pem})
        assert result.ok, result.stderr
        assert_agent_run(result.stdout, servers)
        assert [d.destination for d in await sandbox.denials()] == [f"{DENIED}:443"]
    await backend.end(spec)


async def test_a_session_has_its_listeners_before_the_first_exec(
    backend: DockerBackend, servers: Servers
) -> None:
    spec = agent_spec(servers)
    async with sbxkit.open_sandbox(spec, backend=backend) as sandbox:
        result = await sandbox.exec(list(spec.command))
        assert result.ok, result.stderr
        assert_agent_run(result.stdout, servers)
        assert [d.destination for d in await sandbox.denials()] == [f"{DENIED}:443"]
        # an exec's env cannot point the proxy elsewhere either
        show = ["sh", "-c", 'echo "$HTTPS_PROXY $SBXKIT_ENDPOINT"']
        hostile = {"HTTPS_PROXY": "http://198.51.100.10:3128", "SBXKIT_ENDPOINT": "http://x:1"}
        shown = await sandbox.exec(show, env=hostile)
        assert shown.stdout == b"http://127.0.0.1:3128 \n"


async def test_ptys_and_stdio_workers_are_refused_before_anything_exists(
    backend: DockerBackend, servers: Servers, witness: Witness
) -> None:
    began = time.time()
    spec = agent_spec(servers)
    with pytest.raises(SpecError) as info:
        async with sbxkit.open_pty(spec, backend=backend):
            pass
    assert info.value.field == "network"
    assert "not served for pty" in info.value.rule
    with pytest.raises(SpecError, match="not served for stdio"):
        async with sbxkit.open_stdio_worker(spec, backend=backend):
            pass
    assert witness.events(began, time.time() + 1, type=["container"], event=["create"]) == []


def write_profile(path: Path, audit: Path) -> Path:
    path.write_text(
        f"""
[sandbox.docker]
image = "{PYTHON}"
network_audit_log = "{audit}"

[sandbox.docker.limits]
cpus = 1
memory = "128m"
pids = 64
max_output = "1m"
timeout = 60

[sandbox.docker.network]
allow = ["{ALLOWED}:443"]
"""
    )
    return path


def test_a_batch_takes_the_network_from_its_profile(servers: Servers, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    profile = write_profile(tmp_path / "profile.toml", audit)
    jobs = tmp_path / "jobs.jsonl"
    job = {
        "id": "agent",
        "command": ["python3", "-c", FETCH, GOOD, BAD],
        "env": {"TEST_CA": servers.ca_pem},
    }
    jobs.write_text(json.dumps(job) + "\n")
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sbxkit",
            "batch",
            str(jobs),
            "--profile",
            str(profile),
            "--out",
            str(out),
        ],
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    line = json.loads(out.read_text())
    assert_agent_run(line["stdout"], servers)
    assert line["denials"] == [
        {"destination": f"{DENIED}:443", "reason": "not on the allow-list", "kind": "connect"}
    ]
    decisions = [json.loads(entry) for entry in audit.read_text().splitlines()]
    # a denial is written at once, an allowed connection when it ends
    assert sorted((d["destination"], d["verdict"]) for d in decisions) == [
        (f"{ALLOWED}:443", "allowed"),
        (f"{DENIED}:443", "denied"),
    ]


async def test_the_inspect_provider_takes_the_network_from_its_profile(
    servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sbxkit.inspect_provider import SbxkitSandboxEnvironment

    monkeypatch.setenv("INSPECT_ASYNC_BACKEND", "trio")
    profile = write_profile(tmp_path / "profile.toml", tmp_path / "audit.jsonl")
    environments = await SbxkitSandboxEnvironment.sample_init("net", str(profile), {})
    try:
        result = await environments["default"].exec(
            ["python3", "-c", FETCH, GOOD, BAD], env={"TEST_CA": servers.ca_pem}
        )
        assert result.success, result.stderr
        assert_agent_run(result.stdout, servers)
    finally:
        await SbxkitSandboxEnvironment.sample_cleanup("net", str(profile), environments, False)
