"""Workspaces with root inside, on the main test daemon (rootful Docker 20.10, no userns-remap):
refused by name under runc before anything exists — by the caller and, asked directly, by the
supervisor — and served under gVisor, whose kernel the payload's root lives in. The userns
cell proves the same on a remapping daemon (tests/engine/test_userns.py)."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest

from sbxkit._consumers.oneshot import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.rules import ROOT_INSIDE_CAPS
from sbxkit._model.runtimes import GVISOR_MIN_PIDS
from sbxkit._model.spec import SandboxSpec, Workspace
from sbxkit._plan.policy import build_create_body, container_name
from sbxkit._protocol.wire import Refused, Register, Reservation
from sbxkit.engine.client import Engine, open_engine
from sbxkit.errors import ContainerMismatch, SpecError
from tests.engine.helpers import runtime_limits, text, unique
from tests.engine.test_supervisor import first_reply
from tests.faultproxy import Answer, FaultProxy
from tests.supervision import running_supervisor
from tests.witness import Witness

CAP_BITS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
}
"""linux/capability.h's numbers of the capabilities a workspace's root keeps."""
CAPS_MASK = sum(1 << CAP_BITS[name] for name in ROOT_INSIDE_CAPS)


def workspace(image: str, script: str, runtime: str | None = None, **labels: str) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["sh", "-c", script],
        limits=runtime_limits(runtime, pids=GVISOR_MIN_PIDS),
        runtime=runtime,
        labels=labels,
        workspace=Workspace(),
    )


def created_since(witness: Witness, since: float, marker: str) -> list[str]:
    events = witness.events(since, time.time(), type=["container"], label=[f"mark={marker}"])
    return [event["Action"] for event in events]


async def test_root_inside_is_refused_by_name_under_runc_before_anything_exists(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    marker, since = unique("ws"), time.time()
    with pytest.raises(SpecError) as caught:
        await run(workspace(busybox, "id -u", mark=marker), engine=engine)
    assert caught.value.field == "workspace"
    for remedy in ("--userns-remap", "rootless", "gvisor"):
        assert remedy in caught.value.rule
    with pytest.raises(SpecError) as session:
        async with open_sandbox(workspace(busybox, "unused", mark=marker), engine=engine):
            pass
    assert session.value.field == "workspace"
    assert created_since(witness, since, marker) == []
    assert not witness.sbxkit_containers()


def test_the_supervisor_refuses_a_root_body_under_runc_whatever_its_caller_says(
    state_dir: Path, witness: Witness, busybox: str
) -> None:
    """A raw client skips the caller's check and registers the body a workspace would have:
    the supervisor asks the daemon itself and refuses it, naming Config.User."""
    lease = secrets.token_hex(16)
    body = build_create_body(workspace(busybox, "id -u"), lease)
    assert body.host_config is not None
    register = Register(
        lease=lease,
        name=container_name(lease),
        engine_socket=witness.socket_path,
        body=body,
        reservation=Reservation(
            memory_bytes=body.host_config.memory or 0, nano_cpus=body.host_config.nano_cpus or 0
        ),
        startup_deadline_s=30.0,
        lifetime_deadline_s=60.0,
    )
    with running_supervisor(state_dir) as supervisor:
        reply = first_reply(supervisor.socket_path, register)
    assert isinstance(reply, Refused), reply
    assert (reply.code, reply.field) == ("policy", "Config.User")
    assert "--userns-remap" in reply.reason
    assert not witness.sbxkit_containers()


async def test_root_inside_runs_under_gvisor_with_its_short_list_of_capabilities(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    script = (
        "id -u; id -g; grep CapEff /proc/self/status; "
        "echo x > /tmp/f && chown 4321:4321 /tmp/f && stat -c %u /tmp/f; "
        "echo x > /etc/owned 2>/dev/null || echo read-only"
    )
    result = await run(workspace(busybox, script, "gvisor"), engine=engine)
    assert result.ok, result
    lines = text(result.stdout).splitlines()
    assert lines[:2] == ["0", "0"]
    assert int(lines[2].split()[1], 16) == CAPS_MASK
    assert lines[3:] == ["4321", "read-only"]
    assert not witness.sbxkit_containers()


async def test_a_gvisor_workspace_session_runs_its_execs_as_root(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    async with open_sandbox(workspace(busybox, "unused", "gvisor"), engine=engine) as sandbox:
        assert sandbox.user == "0:0"
        said = await sandbox.exec(["id", "-u"])
        await sandbox.put_files({"in.txt": b"hello"})
        got = await sandbox.get_files(["in.txt"])
    assert text(said.stdout).strip() == "0"
    assert got == {"in.txt": b"hello"}
    assert not witness.sbxkit_containers()


async def test_a_daemon_that_lies_about_remapping_is_caught_by_the_hosts_kernel(
    witness: Witness, busybox: str
) -> None:
    """A proxy answers ``/info`` for the daemon, ``name=userns`` added. The caller plans root
    inside (an in-process owner: no supervisor asks the real daemon); the container is created
    as 0:0 on plain runc and started behind its gate. The host's kernel, asked before anything
    is written to the gate, reads the init's uid map as the host's own: refused, removed."""
    info = witness.get("/info")
    info["SecurityOptions"] = [*(info.get("SecurityOptions") or []), "name=userns"]
    marker, since = unique("lie"), time.time()
    spec = workspace(busybox, "echo ran", mark=marker)
    with FaultProxy(witness.socket_path) as proxy:
        proxy.add_fault("info", Answer(json.dumps(info).encode()))
        async with open_engine(proxy.path) as engine:
            with pytest.raises(ContainerMismatch) as caught:
                await run(spec, engine=engine, owner=InProcessOwner(engine))
        assert proxy.faulted("info") >= 1
    assert "maps the container's ids onto host root" in caught.value.what
    assert "though the daemon said userns" in caught.value.what
    actions = created_since(witness, since, marker)
    assert (actions[0], actions[-1]) == ("create", "destroy"), actions
    assert "start" in actions, actions
    assert not witness.sbxkit_containers()
