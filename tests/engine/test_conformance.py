"""What every runtime cell must show beyond the shared behaviour tests, and what it refuses.

The conformance subset is every real-engine test that takes the ``runtime`` fixture
(tests/engine/runtimes.py): hardening, outcomes, sessions, PTYs and the caller-SIGKILL test run
once per runtime. This module adds the checks that only make sense per runtime: that a cell
really ran under the runtime it names, that the host-side cgroup holds the limits (gVisor shows
no cgroupfs inside), and the refusals by name of what a runtime cannot honour.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from sbxkit.runner import run
from sbxkit.session import open_sandbox
from sbxkit.spec import MiB
from tests.engine.helpers import containers_with_marker, host_processes_of, spec, unique
from tests.engine.runtimes import is_gvisor
from tests.witness import Witness

CGROUP_V1 = Path("/sys/fs/cgroup")


def host_cgroup_limits(container_id: str) -> dict[str, str]:
    """pids, memory and CPU quota of the container's cgroup as the host sees it (cgroup v1 with
    the cgroupfs driver, as on the CI machine, or v2 with the same parent)."""
    if (CGROUP_V1 / "pids").is_dir():
        return {
            "pids": (CGROUP_V1 / "pids/docker" / container_id / "pids.max").read_text().strip(),
            "memory": (CGROUP_V1 / "memory/docker" / container_id / "memory.limit_in_bytes")
            .read_text()
            .strip(),
            "cpu": (CGROUP_V1 / "cpu/docker" / container_id / "cpu.cfs_quota_us")
            .read_text()
            .strip(),
        }
    group = CGROUP_V1 / "docker" / container_id
    return {
        "pids": (group / "pids.max").read_text().strip(),
        "memory": (group / "memory.max").read_text().strip(),
        "cpu": (group / "cpu.max").read_text().split()[0],
    }


def host_file(path: str) -> bytes:
    return Path(path).read_bytes()


def host_userns() -> str:
    return os.readlink("/proc/self/ns/user")


def host_process_facts(container_id: str) -> list[dict[str, str]]:
    """For each runtime process on the host that names the container (not the shim)."""
    facts: list[dict[str, str]] = []
    for pid in host_processes_of(container_id):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            status = Path(f"/proc/{pid}/status").read_text()
            userns = os.readlink(f"/proc/{pid}/ns/user")
        except OSError:
            continue
        if "shim" in argv0:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        facts.append({"kind": Path(argv0).name, "userns": userns, **fields})
    return facts


async def test_each_cell_runs_under_its_runtime_and_the_host_cgroup_holds_the_limits(
    runtime: str | None, busybox: str, engine: Engine, witness: Witness
) -> None:
    session = spec(busybox, "unused", runtime=runtime, cpus=0.5, memory_bytes=96 * MiB, pids=160)
    async with open_sandbox(session, engine=engine) as sandbox:
        inspected = witness.get(f"/containers/{sandbox.container_id}/json")
        kernel = await sandbox.exec(["cat", "/proc/version"])
        limits = host_cgroup_limits(sandbox.container_id)
        host_side = host_process_facts(sandbox.container_id)

    assert inspected["HostConfig"]["Runtime"] == (runtime or "runc")
    assert kernel.ok, kernel
    host_kernel = host_file("/proc/version")
    if is_gvisor(runtime):
        assert kernel.stdout != host_kernel  # gVisor answers with its own kernel
    else:
        assert kernel.stdout == host_kernel  # runc and crun share the host's
    assert limits == {"pids": "160", "memory": str(96 * MiB), "cpu": "50000"}
    if is_gvisor(runtime):
        # gVisor's own processes on the host: the Sentry runs as 65534 in a user namespace of
        # its own, the gofer as host root with file capabilities; both under seccomp and
        # no_new_privs (docs/security.md, "Runtimes").
        kinds = {facts["kind"]: facts for facts in host_side}
        assert set(kinds) == {"runsc-sandbox", "runsc-gofer"}, host_side
        assert kinds["runsc-sandbox"]["Uid"].split()[0] == "65534"
        assert kinds["runsc-sandbox"]["userns"] != host_userns()
        for facts in kinds.values():
            assert (facts["NoNewPrivs"], facts["Seccomp"]) == ("1", "2"), facts


@pytest.mark.parametrize("name", ["runsc", "gvisor"])
async def test_bridge_and_a_low_pids_ceiling_are_refused_under_gvisor_by_name(
    name: str, busybox: str, engine: Engine, witness: Witness
) -> None:
    """runsc is registered with --network=none, and its pids ceiling counts its own threads:
    both refusals come before anything exists on the daemon."""
    marker = unique("gvisor-refusal")
    since = time.time()
    bridged = msgspec.structs.replace(
        spec(busybox, f"echo {marker}", runtime=name), network="bridge"
    )
    with pytest.raises(SpecError) as bridge:
        await run(bridged, engine=engine)
    with pytest.raises(SpecError) as pids:
        await run(spec(busybox, f"echo {marker}", runtime=name, pids=127), engine=engine)
    # Positive control: the same spec with 128 pids runs under gVisor.
    ok = await run(spec(busybox, f"echo {marker}", runtime=name, pids=128), engine=engine)
    until = time.time()

    assert bridge.value.field == "network"
    assert "gVisor" in bridge.value.rule
    assert pids.value.field == "limits.pids"
    assert "at least 128" in pids.value.rule
    assert ok.ok, ok
    assert ok.stdout == f"{marker}\n".encode()
    creates = witness.events(since, until, type=["container"], event=["create"])
    assert len(creates) == 1, creates  # only the positive control was ever created
    assert containers_with_marker(witness, marker) == []
