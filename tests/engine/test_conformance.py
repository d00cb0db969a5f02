"""What every runtime cell must show beyond the shared behaviour tests, and what it refuses.

The conformance subset is every real-engine test that takes the ``runtime`` fixture
(tests/engine/runtimes.py): hardening, outcomes, sessions, PTYs and the caller-SIGKILL test run
once per runtime, the one-shot ones on the cold and the pooled path (the ``oneshot`` fixture,
tests/engine/oneshot_paths.py), so the Podman cell exercises the pool too. This module adds the
checks that only make sense per runtime: that a cell really ran under the runtime it names, that
the host-side cgroup holds the limits (gVisor shows no cgroupfs inside), and the refusals by
name of what a runtime cannot honour.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from sbxkit._consumers.session import open_sandbox
from sbxkit._model.runtimes import GVISOR_MIN_PIDS
from sbxkit._model.spec import MiB
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from tests.engine.helpers import containers_with_marker, host_processes_of, spec, text, unique
from tests.engine.oneshot_paths import OneShot
from tests.engine.runtimes import is_gvisor, planned_default_runtime
from tests.witness import Witness

CGROUP_ROOT = Path("/sys/fs/cgroup")


def container_cgroup(controller_root: Path, container_id: str) -> Path:
    """The container's cgroup under one hierarchy: Docker's ``docker/ID``, Podman's
    ``libpod_parent/libpod-ID`` (the cgroupfs drivers), found by the id."""
    found = [p for p in controller_root.glob(f"*/*{container_id}*") if p.is_dir()]
    assert len(found) == 1, (controller_root, container_id, found)
    return found[0]


def host_cgroup_limits(container_id: str, init_pid: int) -> dict[str, str]:
    """pids, memory and CPU quota of the container's cgroup as the host sees it (cgroup v1,
    as on the CI machine, or v2)."""
    if (CGROUP_ROOT / "pids").is_dir():
        pids = container_cgroup(CGROUP_ROOT / "pids", container_id)
        memory = container_cgroup(CGROUP_ROOT / "memory", container_id)
        cpu = container_cgroup(CGROUP_ROOT / "cpu", container_id)
        return {
            "pids": (pids / "pids.max").read_text().strip(),
            "memory": (memory / "memory.limit_in_bytes").read_text().strip(),
            "cpu": (cpu / "cpu.cfs_quota_us").read_text().strip(),
        }
    # v2: the group the container's init is in, as the kernel says. Under the systemd driver
    # crun puts it in a ``container`` child of the ``docker-ID.scope`` that systemd made: the
    # limits are on the child, the scope keeps systemd's defaults.
    line = Path(f"/proc/{init_pid}/cgroup").read_text().strip()
    assert line.startswith("0::/"), line
    group = CGROUP_ROOT / line.removeprefix("0::/")
    assert container_id in str(group), (container_id, group)
    return {
        "pids": (group / "pids.max").read_text().strip(),
        "memory": (group / "memory.max").read_text().strip(),
        "cpu": (group / "cpu.max").read_text().split()[0],
    }


def oci_runtime(witness: Witness, container_id: str) -> str:
    """The OCI runtime a container runs under. Podman's compat inspect says ``oci`` for every
    runtime; its own (libpod) inspect names it."""
    if witness.is_podman():
        return str(witness.get(f"/v4.0.0/libpod/containers/{container_id}/json")["OCIRuntime"])
    return str(witness.get(f"/containers/{container_id}/json")["HostConfig"]["Runtime"])


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
    session = spec(busybox, "unused", runtime=runtime, cpus=0.5, memory_bytes=96 * MiB, pids=300)
    async with open_sandbox(session, engine=engine) as sandbox:
        runtime_used = oci_runtime(witness, sandbox.container_id)
        kernel = await sandbox.exec(["cat", "/proc/version"])
        init_pid = witness.get(f"/containers/{sandbox.container_id}/json")["State"]["Pid"]
        limits = host_cgroup_limits(sandbox.container_id, init_pid)
        host_side = host_process_facts(sandbox.container_id)

    assert runtime_used == (runtime or planned_default_runtime(witness))
    assert kernel.ok, kernel
    host_kernel = host_file("/proc/version")
    if is_gvisor(runtime):
        assert kernel.stdout != host_kernel  # gVisor answers with its own kernel
    else:
        assert kernel.stdout == host_kernel  # runc and crun share the host's
    assert limits == {"pids": "300", "memory": str(96 * MiB), "cpu": "50000"}
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
    oneshot: OneShot, name: str, busybox: str, engine: Engine, witness: Witness
) -> None:
    """runsc is registered with --network=none, and its pids ceiling counts its own threads:
    both refusals come before anything exists on the daemon."""
    marker = unique("gvisor-refusal")
    since = time.time()
    bridged = msgspec.structs.replace(
        spec(busybox, f"echo {marker}", runtime=name), network="bridge"
    )
    with pytest.raises(SpecError) as bridge:
        await oneshot(bridged, engine=engine)
    with pytest.raises(SpecError) as pids:
        await oneshot(
            spec(busybox, f"echo {marker}", runtime=name, pids=GVISOR_MIN_PIDS - 1), engine=engine
        )
    # Positive control: the same spec at the floor runs under gVisor.
    ok = await oneshot(
        spec(busybox, f"echo {marker}", runtime=name, pids=GVISOR_MIN_PIDS), engine=engine
    )
    until = time.time()

    assert bridge.value.field == "network"
    assert "gVisor" in bridge.value.rule
    assert pids.value.field == "limits.pids"
    assert f"at least {GVISOR_MIN_PIDS}" in pids.value.rule
    assert ok.ok, ok
    assert ok.stdout == f"{marker}\n".encode()
    creates = witness.events(since, until, type=["container"], event=["create"])
    assert len(creates) == 1, creates  # only the positive control was ever created
    assert containers_with_marker(witness, marker) == []


WRITABLE_PROBE = (
    "for d in / /etc /root /home /usr /var /var/tmp /run /dev /dev/shm /dev/mqueue /tmp /work; do "
    '[ -d "$d" ] || continue; '
    '(echo x >"$d/.sbxkit-probe") 2>/dev/null && echo "$d"; '
    "done; exit 0"
)


async def test_only_the_scratch_space_and_shared_memory_are_writable(
    oneshot: OneShot, runtime: str | None, busybox: str, engine: Engine
) -> None:
    """As the sandbox user, a file can be created in /tmp and /dev/shm (tmpfs, charged to the
    memory limit) and nowhere else — including Podman's /run and /var/tmp, which sbxkit seals."""
    result = await oneshot(spec(busybox, WRITABLE_PROBE, runtime=runtime), engine=engine)

    assert result.ok, result
    writable = text(result.stdout).split()
    assert "/tmp" in writable  # positive control: the probe can write
    assert sorted(writable) == ["/dev/shm", "/tmp"], writable
