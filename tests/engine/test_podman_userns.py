"""Root inside a workspace on rootful Podman (the Podman cell, scripts/podman-up): the body asks
for a user namespace of the container's own (``HostConfig.UsernsMode`` ``auto:size=65536``),
whose ids Podman takes from the ``containers`` user's subordinate range that scripts/podman-up
provisions. What the host's kernel reports is read here from the host's ``/proc``; what the
daemon holds, through the independent witness."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

import msgspec
import pytest

import sbxkit
from sbxkit._consumers.oneshot import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._kernel.userns import read_uid_map
from sbxkit._lifecycle.owner import InProcessOwner, Owner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.rules import PODMAN_AUTO_USERNS
from sbxkit._plan.policy import build_create_body, container_name
from sbxkit._protocol.wire import Refused, Register, Reservation
from sbxkit.engine.client import Engine, open_engine
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import ContainerMismatch
from tests.engine.helpers import spec, text
from tests.engine.test_supervisor import first_reply
from tests.engine.test_workspace import CAPS_MASK, workspace
from tests.faultproxy import Answer, FaultProxy, Rewrite
from tests.supervision import running_supervisor
from tests.witness import Witness

pytestmark = pytest.mark.podman

IDS = 65536
"""The size of a workspace's map (``PODMAN_AUTO_USERNS``)."""


def containers_range() -> range:
    """The host uids ``/etc/subuid`` gives the ``containers`` user (scripts/podman-up)."""
    for line in Path("/etc/subuid").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == "containers":
            start, count = (int(field) for field in rest.split(":"))
            return range(start, start + count)
    pytest.fail("/etc/subuid has no range for containers: run scripts/podman-up", pytrace=False)


def init_pid(witness: Witness, container_id: str) -> int:
    pid: int = witness.get(f"/containers/{container_id}/json")["State"]["Pid"]
    assert pid > 0
    return pid


def host_uid_map(pid: int) -> str:
    """The host's kernel's ``uid_map`` of process ``pid``."""
    return Path(f"/proc/{pid}/uid_map").read_text()


def uid_map_lines(text_map: str) -> list[tuple[int, int, int]]:
    lines = [tuple(int(field) for field in line.split()) for line in text_map.splitlines()]
    return [(line[0], line[1], line[2]) for line in lines]


async def test_a_session_is_root_inside_and_a_subordinate_uid_on_the_host(
    engine: Engine, witness: Witness, python_image: str
) -> None:
    assert witness.is_podman()
    assert not (await engine.podman_host()).security.rootless
    script = (
        "id -u; id -g; grep CapEff /proc/self/status; stat -c %u /usr; "
        "echo x > /tmp/f && chown 4321:4321 /tmp/f && stat -c %u /tmp/f; "
        "(echo x > /usr/owned) 2>&1; echo rc=$?"
    )
    async with open_sandbox(workspace(python_image, "unused"), engine=engine) as sandbox:
        assert sandbox.user == "0:0"
        pid = init_pid(witness, sandbox.container_id)
        host_map = host_uid_map(pid)
        proof = read_uid_map(pid, sandbox.container_id)  # what the start's proof read
        said = await sandbox.exec(["sh", "-c", script])
        owner_on_host = os.stat(f"/proc/{pid}/root/tmp/f").st_uid

    assert said.ok, said
    lines = text(said.stdout).splitlines()
    assert lines[:2] == ["0", "0"]
    assert int(lines[2].split()[1], 16) == CAPS_MASK
    assert lines[3:5] == ["0", "4321"]  # the image's root-owned /usr, a chown that worked
    assert "Read-only file system" in lines[5], lines
    assert lines[6] != "rc=0"
    [(inside, outside, count)] = uid_map_lines(host_map)
    assert (inside, count) == (0, IDS)
    assert outside != 0
    assert outside in containers_range()
    assert outside + IDS - 1 in containers_range()
    assert owner_on_host == outside + 4321
    assert proof == host_map
    assert witness.sbxkit_containers() == []


async def test_a_one_shot_run_of_a_workspace_is_root_inside(witness: Witness, busybox: str) -> None:
    script = "id -u; cat /proc/self/uid_map; chown 4321:4321 /tmp && stat -c %u /tmp"
    result = await sbxkit.run(workspace(busybox, script), socket_path=witness.socket_path)

    assert result.ok, result
    assert result.evidence == "daemon"
    lines = text(result.stdout).splitlines()
    assert lines[0] == "0"
    [(inside, outside, count)] = uid_map_lines(lines[1])
    assert (inside, count) == (0, IDS)
    assert outside in containers_range()
    assert lines[2] == "4321"
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


def register(body: ContainerCreate, lease: str, socket_path: str) -> Register:
    assert body.host_config is not None
    return Register(
        lease=lease,
        name=container_name(lease),
        engine_socket=socket_path,
        body=body,
        reservation=Reservation(
            memory_bytes=body.host_config.memory or 0, nano_cpus=body.host_config.nano_cpus or 0
        ),
        startup_deadline_s=30.0,
        lifetime_deadline_s=60.0,
    )


def test_the_supervisor_takes_root_on_rootful_podman_only_in_its_own_user_namespace(
    state_dir: Path, witness: Witness, busybox: str
) -> None:
    """Raw clients skip the caller's plan: a workspace's body without its ``UsernsMode`` (root
    in the host's user namespace), one asking ``host``, and a sandbox of its own uid asking for
    a namespace are each refused by name, and nothing is created."""
    bodies = {
        "no UsernsMode": (workspace(busybox, "id -u"), None, "Config.User"),
        "host": (workspace(busybox, "id -u"), "host", "HostConfig.UsernsMode"),
        "not root": (spec(busybox, "id -u"), PODMAN_AUTO_USERNS, "HostConfig.UsernsMode"),
    }
    replies = {}
    with running_supervisor(state_dir) as supervisor:
        for name, (asked, userns_mode, _) in bodies.items():
            lease = secrets.token_hex(16)
            body = build_create_body(asked, lease, podman=True)
            assert body.host_config is not None
            host = msgspec.structs.replace(body.host_config, userns_mode=userns_mode)
            body = msgspec.structs.replace(body, host_config=host)
            replies[name] = first_reply(
                supervisor.socket_path, register(body, lease, witness.socket_path)
            )

    for name, (_, _, field) in bodies.items():
        reply = replies[name]
        assert isinstance(reply, Refused), (name, reply)
        assert (reply.code, reply.field) == ("policy", field), (name, reply)
    no_mode = replies["no UsernsMode"]
    assert isinstance(no_mode, Refused)
    assert PODMAN_AUTO_USERNS in no_mode.reason
    assert witness.containers() == []


def without_userns_mode(raw: bytes) -> bytes:
    body = json.loads(raw)
    del body["HostConfig"]["UsernsMode"]
    return json.dumps(body).encode()


FORGED_MAPS = json.dumps(
    {"HostConfig": {"IDMappings": {"UidMap": ["0:300000:65536"], "GidMap": ["0:300000:65536"]}}}
).encode()
"""Podman's own inspect of a container with a user namespace of its own, as a liar says it."""


async def run_through(
    proxy: FaultProxy, state_dir: Path, owner: str, script: str, busybox: str
) -> pytest.ExceptionInfo[ContainerMismatch]:
    """Run a workspace whose requests pass ``proxy``: the caller's, and with ``owner``
    ``supervisor`` also the supervisor's (``--docker-socket PROXY``, after its recheck took the
    body); expect ``ContainerMismatch``."""
    with contextlib.ExitStack() as stack:
        if owner == "supervisor":
            stack.enter_context(running_supervisor(state_dir, "--docker-socket", proxy.path))
        async with open_engine(proxy.path) as engine:
            chosen: Owner = (
                SupervisedOwner(engine, state_dir=state_dir)
                if owner == "supervisor"
                else InProcessOwner(engine)
            )
            with pytest.raises(ContainerMismatch) as caught:
                await run(workspace(busybox, script), engine=engine, owner=chosen)
        return caught


@pytest.mark.parametrize("owner", ["in-process", "supervisor"])
async def test_a_podman_that_drops_the_user_namespace_is_refused_before_the_start(
    witness: Witness, state_dir: Path, busybox: str, owner: str
) -> None:
    """A proxy drops ``UsernsMode`` from the create on its way to Podman. Before the start,
    Podman's own inspect records no map for the container: refused, removed, never started."""
    with FaultProxy(witness.socket_path) as proxy:
        proxy.add_fault("create", Rewrite(without_userns_mode))
        caught = await run_through(proxy, state_dir, owner, "echo ran", busybox)
        assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
        assert proxy.faulted("create") == 1
        assert proxy.seen("start") == 0
        assert proxy.errors == []
    assert "recorded no uid map for it" in caught.value.what
    assert witness.containers() == []


@pytest.mark.parametrize("owner", ["in-process", "supervisor"])
async def test_a_podman_that_lies_about_the_user_namespace_is_caught_by_the_hosts_kernel(
    witness: Witness, state_dir: Path, busybox: str, owner: str
) -> None:
    """The proxy drops ``UsernsMode`` from the create and answers Podman's own inspect with a
    map the container does not have. The container runs as the host's root behind its gate;
    the host's kernel, asked before the gate opens, reads the init's identity map: refused,
    removed, the payload never ran."""
    with FaultProxy(witness.socket_path) as proxy:
        proxy.define_kind("libpod-inspect", "GET", r"/libpod/containers/[^/]+/json$")
        proxy.add_fault("libpod-inspect", Answer(FORGED_MAPS))
        proxy.add_fault("create", Rewrite(without_userns_mode))
        caught = await run_through(proxy, state_dir, owner, "echo ran", busybox)
        assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
        assert proxy.faulted("libpod-inspect") == 1
        assert proxy.seen("start") == 1
        assert proxy.errors == []
    assert "maps the container's ids onto host root" in caught.value.what
    assert "though the daemon said userns-auto" in caught.value.what
    assert witness.containers() == []
