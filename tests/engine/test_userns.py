"""The userns cell's own checks (run by ``./dev test`` against ``scripts/userns-engine-up``'s
``dockerd --userns-remap=default``).

The conformance subset proves the hardened contract there; these prove that the engine under
test really remaps, and, from the host, what a sandbox's ids are on it: its own uid from the
range such daemons map (sbxkit._model.uids), which the kernel maps to a subordinate host id,
never to one a host account has.
"""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from sbxkit._consumers.oneshot import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._model.spec import SandboxSpec, Workspace
from sbxkit._model.uids import MAPPED_UIDS
from sbxkit.engine.client import Engine
from tests.engine.helpers import runtime_limits, text
from tests.witness import Witness

pytestmark = pytest.mark.userns


def id_map(pid: int, kind: str) -> list[tuple[int, int, int]]:
    """``/proc/PID/{uid,gid}_map`` read from the host: (inside, outside, count) lines."""
    lines = Path(f"/proc/{pid}/{kind}_map").read_text().splitlines()
    return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in lines)]


def host_ids(pid: int) -> tuple[int, int]:
    """The real uid and gid of a process, as the host's kernel sees them."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def subordinate_start(account: str, path: str) -> int:
    """Where ``account``'s range starts in /etc/subuid or /etc/subgid (dockerd's remap)."""
    for line in Path(path).read_text().splitlines():
        name, start, _count = line.split(":")
        if name == account:
            return int(start)
    raise AssertionError(f"{account} has no range in {path}")


def test_the_engine_under_test_remaps_user_namespaces(witness: Witness) -> None:
    assert witness.maps_uids()
    options = witness.get("/info")["SecurityOptions"]
    assert any("name=userns" in option for option in options), options
    assert witness.sandbox_uids() == MAPPED_UIDS


async def test_a_sandbox_uid_is_a_subordinate_host_id_never_a_host_accounts(
    witness: Witness, engine: Engine, busybox: str
) -> None:
    spec = SandboxSpec(image=busybox, command=["unused"], limits=runtime_limits(None))
    async with open_sandbox(spec, engine=engine) as sandbox:
        said = await sandbox.exec(["sh", "-c", "id -u; id -g"])
        pid = witness.get(f"/containers/{sandbox.container_id}/json")["State"]["Pid"]
        uid_map, gid_map = id_map(pid, "uid"), id_map(pid, "gid")
        host_uid, host_gid = host_ids(pid)
    uid, gid = map(int, text(said.stdout).split())
    assert uid == gid
    assert uid in MAPPED_UIDS
    # The kernel's word: one range, container 0 upward onto dockremap's subordinate ids.
    ((inside, outside, count),) = uid_map
    assert (inside, outside) == (0, subordinate_start("dockremap", "/etc/subuid"))
    assert outside > 0
    assert count >= 65536
    assert gid_map == [(0, subordinate_start("dockremap", "/etc/subgid"), gid_map[0][2])]
    # The keep-alive runs as the sandbox's uid: on the host, that is outside + uid.
    assert (host_uid, host_gid) == (outside + uid, gid_map[0][1] + gid)
    assert outside <= host_uid < outside + count  # dockremap's, never a host account's
    with pytest.raises(KeyError):
        pwd.getpwuid(host_uid)
    assert not witness.sbxkit_containers()


async def test_a_workspace_is_root_inside_and_dockremaps_id_outside(
    witness: Witness, engine: Engine, busybox: str
) -> None:
    """Root inside a workspace is uid 0 with five capabilities in the sandbox's user namespace;
    on the host, the kernel maps it onto dockremap's first subordinate id."""
    spec = SandboxSpec(
        image=busybox,
        command=["unused"],
        limits=runtime_limits(None),
        workspace=Workspace(),
    )
    async with open_sandbox(spec, engine=engine) as sandbox:
        said = await sandbox.exec(
            ["sh", "-c", "id -u; echo x > /tmp/f && chown 4321:4321 /tmp/f && stat -c %u /tmp/f"]
        )
        pid = witness.get(f"/containers/{sandbox.container_id}/json")["State"]["Pid"]
        uid_map = id_map(pid, "uid")
        host_uid, _ = host_ids(pid)
    assert text(said.stdout).split() == ["0", "4321"]
    start = subordinate_start("dockremap", "/etc/subuid")
    assert uid_map[0][:2] == (0, start)
    assert host_uid == start  # root inside: an id no host account has
    with pytest.raises(KeyError):
        pwd.getpwuid(host_uid)
    assert not witness.sbxkit_containers()


async def test_a_workspace_one_shot_run_passes_its_stdin_through_the_gate(
    witness: Witness, engine: Engine, busybox: str
) -> None:
    """A cold run waits behind its gate while its root is proven; its stdin then arrives
    byte-exact (the gate's line is not the payload's)."""
    data = bytes(range(256)) * 64
    spec = SandboxSpec(
        image=busybox,
        command=["sh", "-c", "id -u >&2; cat"],
        limits=runtime_limits(None),
        workspace=Workspace(),
    )
    result = await run(spec, data, engine=engine)
    assert result.ok, result
    assert (result.stderr, result.stdout) == (b"0\n", data)
    assert not witness.sbxkit_containers()
