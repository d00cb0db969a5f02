"""Smoke tests against a REAL Docker Sandboxes ``sbx`` (the checklist of docs/adr-sbx.md §9).

Never collected by a plain ``pytest`` run (the file name does not match ``test_*.py``), so CI
and ``./dev test`` never select it. Run it on a machine with Docker Desktop / sbx, signed in
(``sbx login``) and with a default network policy chosen::

    SBXKIT_SBX_SMOKE=1 python -m pytest tests/smoke_sbx.py -v

Without ``SBXKIT_SBX_SMOKE=1``, or without ``sbx``, every test FAILS — it never skips: a
smoke run that proved nothing must not look like one that passed. Optional settings:
``SBXKIT_SBX_BINARY`` (default ``sbx``), ``SBXKIT_SBX_TEMPLATE`` (default
``docker/sandbox-templates:shell``). Each test creates real microVMs and removes them; each
checks with a raw ``sbx ls`` (not through sbxkit's parser) that none of its sandboxes remain.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.backends.base import open_backend
from sbxkit.backends.sbx import SbxBackend, SbxConfig
from sbxkit.backends.sbx_commands import (
    parse_sandbox_list,
    runner_prefix,
    sandbox_name,
    sbx_create_args,
)

BINARY = os.environ.get("SBXKIT_SBX_BINARY", "sbx")
TEMPLATE = os.environ.get("SBXKIT_SBX_TEMPLATE", "docker/sandbox-templates:shell")


@pytest.fixture(autouse=True)
def real_sbx() -> str:
    if os.environ.get("SBXKIT_SBX_SMOKE") != "1":
        pytest.fail(
            "tests/smoke_sbx.py drives a real sbx and creates microVMs; "
            "set SBXKIT_SBX_SMOKE=1 to run it"
        )
    found = shutil.which(BINARY)
    if found is None:
        pytest.fail(f"SBXKIT_SBX_SMOKE=1 but {BINARY!r} is not installed (or not on PATH)")
    return found


def raw_ls(binary: str) -> str:
    done = subprocess.run(
        [binary, "ls", "--json"], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout


@pytest.fixture
async def backend(real_sbx: str, tmp_path: Path) -> AsyncIterator[SbxBackend]:
    runner = SbxBackend(SbxConfig(binary=real_sbx, lock_dir=str(tmp_path / "locks")))
    async with open_backend(runner):
        yield runner
    leftovers = [line for line in raw_ls(real_sbx).splitlines() if runner.runner_id in line]
    assert leftovers == [], f"sandboxes left behind: {leftovers}"


def spec(command: list[str], **changes: Any) -> SandboxSpec:
    limits = {
        "cpus": 1.0,
        "memory_bytes": 256 * MiB,
        "pids": 256,
        "output_bytes": 1024 * 1024,
        "timeout_s": 300.0,
        **changes.pop("limits", {}),
    }
    return SandboxSpec(image=TEMPLATE, command=command, limits=Limits(**limits), **changes)


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


# Checklist 1 — the CLI answers, `sbx ls --json` parses, names come back.
def test_listing_parses(real_sbx: str) -> None:
    output = raw_ls(real_sbx)
    print("sbx ls --json:", output[:2000])
    names = parse_sandbox_list(output)
    assert all(isinstance(n, str) for n in names)


# Checklist 2 — create with the agent positional and the workspace at its host path; exec through
# the script (a symlink at / via sudo -n, the environment on stdin, stdin after it); rm.
async def test_a_run_end_to_end(backend: SbxBackend) -> None:
    result = await backend.run_once(
        spec(
            sh(
                'pwd; pwd -P; echo "$SMOKE_SECRET"; cat; id -u; echo to-stderr >&2; '
                "touch written-inside; exit 7"
            ),
            env={"SMOKE_SECRET": "value with spaces\nand a newline"},
            workdir="/work",
        ),
        b"stdin line\n",
    )
    print(result)
    assert result.status == "exited"
    assert result.exit_code == 7
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "/work"
    assert lines[1].startswith("/")  # the workspace's host path (the link's target)
    assert lines[2:5] == ["value with spaces", "and a newline", "stdin line"]
    assert lines[5] != "0", "the template's user is root"
    assert result.stderr == b"to-stderr\n"


# Checklist 3 — the deadline: rm --force is the kill, and the sandbox is gone.
async def test_timeout_removes_the_sandbox(backend: SbxBackend, real_sbx: str) -> None:
    result = await backend.run_once(spec(["sleep", "600"], limits={"timeout_s": 5.0}))
    assert result.status == "timed_out"
    assert result.container_id not in raw_ls(real_sbx)


# Checklist 4 — the output cap, through a real exec stream.
async def test_output_cap(backend: SbxBackend) -> None:
    result = await backend.run_once(spec(["yes"], limits={"output_bytes": 100_000}))
    assert result.status == "output_exceeded"
    assert len(result.stdout) == 100_000


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.sendall(conn.recv(1024).upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    server.close()


# Checklist 5 — a host port reached as host.docker.internal:PORT through one scoped policy rule.
async def test_host_port_grant(backend: SbxBackend, echo_server: int) -> None:
    script = (
        f"exec 3<>/dev/tcp/host.docker.internal/{echo_server}; "
        "printf 'ping\\n' >&3; read -r reply <&3; echo \"$reply\""
    )
    result = await backend.run_once(spec(["bash", "-c", script]), host_ports=[echo_server])
    print(result)
    assert result.stdout == b"PING\n"


# Checklist 6 — the motivation: a Docker daemon inside the VM can build an image.
async def test_docker_build_inside(backend: SbxBackend) -> None:
    script = (
        "printf 'FROM scratch\\nCOPY f /f\\n' > Dockerfile && echo x > f && "
        "docker build -q -t sbxkit-smoke:1 . && docker image inspect sbxkit-smoke:1 >/dev/null"
    )
    result = await backend.run_once(spec(sh(script)))
    print(result)
    assert result.exit_code == 0


# Checklist 7 — memory is the VM's fixed allocation; create_args sizes it.
async def test_memory_is_the_vms_allocation(real_sbx: str, tmp_path: Path) -> None:
    runner = SbxBackend(
        SbxConfig(binary=real_sbx, lock_dir=str(tmp_path / "locks"), create_args=["--memory", "2g"])
    )
    async with open_backend(runner):
        result = await runner.run_once(spec(["grep", "MemTotal", "/proc/meminfo"]))
    print(result.stdout)
    kib = int(result.stdout.split()[1])
    assert 0 < kib <= 2 * 1024 * 1024


# Checklist 8 — orphan reconciliation against the real listing's shape.
async def test_orphans_of_this_runner_are_removed_at_startup(real_sbx: str, tmp_path: Path) -> None:
    workspace = tmp_path / "orphan"
    workspace.mkdir()
    name = sandbox_name("smokeorphan", "f" * 16)
    argv = sbx_create_args(
        real_sbx, name=name, agent="shell", workspace=str(workspace), template=TEMPLATE
    )
    await trio.run_process(argv)
    assert name in raw_ls(real_sbx)
    runner = SbxBackend(
        SbxConfig(binary=real_sbx, runner_id="smokeorphan", lock_dir=str(tmp_path / "locks"))
    )
    async with open_backend(runner):
        pass
    listing = raw_ls(real_sbx)
    assert runner_prefix("smokeorphan") not in listing, json.dumps(listing)[:2000]
