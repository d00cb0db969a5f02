"""The hardened defaults hold against a real payload on the real engine.

Every check here is made from inside the sandbox (what the payload can see and do) and, where a
host-side fact is the point (a listener, a canary file), from the host as well. Each negative
check has a positive control next to it, so a broken probe cannot pass for a working limit.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sbxkit._lifecycle.uid_holds import host_id_problem
from sbxkit._model.spec import MiB
from sbxkit.engine.client import Engine
from tests.engine.helpers import (
    assert_half_fits_double_does_not,
    assert_oom_outcome,
    fill_half_then_double,
    python_spec,
    spec,
    text,
    unique,
)
from tests.engine.oneshot_paths import OneShot
from tests.engine.runtimes import is_gvisor, min_pids, read_only_error
from tests.witness import Witness


async def test_the_payload_runs_as_a_uid_and_gid_of_its_own(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, witness: Witness
) -> None:
    """No user named: one id, uid and gid and only group, from the sandbox range of this
    daemon (the host's own ids, or the ones a remapping daemon maps), that no host account or
    group has (sbxkit._model.uids)."""
    result = await oneshot(spec(busybox, "id -u; id -g; id -G", runtime=runtime), engine=engine)

    assert result.ok, result
    uid, gid, groups = text(result.stdout).split()
    assert uid == gid == groups
    assert int(uid) in witness.sandbox_uids()
    assert host_id_problem(int(uid)) is None


async def test_home_is_the_writable_scratch_unless_the_spec_says_otherwise(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    """A uid of its own has no passwd entry in the image: runc alone would say HOME=/ (which
    is read-only) and crun would leave it unset. Tools that write under $HOME (pip, git, a
    cache) find the scratch space, on every runtime and path; a spec's HOME is kept."""
    probe = 'echo "home=$HOME"; mkdir -p "$HOME/.cache/tool" && echo written'
    result = await oneshot(spec(busybox, probe, runtime=runtime), engine=engine)
    assert result.ok, result
    assert text(result.stdout).split() == ["home=/tmp", "written"]
    named = spec(busybox, 'echo "home=$HOME"', env={"HOME": "/tmp/mine"}, runtime=runtime)
    result = await oneshot(named, engine=engine)
    assert text(result.stdout).split() == ["home=/tmp/mine"]


async def test_root_filesystem_is_read_only(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    script = (
        "echo x > /etc/owned; etc=$?; "
        "echo x > /owned; root=$?; "
        "echo x > /tmp/owned && echo tmp=ok; "  # positive control: the probe itself works
        'echo "etc=$etc root=$root"; '
        '[ "$etc" -ne 0 ] && [ "$root" -ne 0 ] && exit 3; exit 0'
    )
    result = await oneshot(spec(busybox, script, runtime=runtime), engine=engine)

    assert result.status == "exited"
    assert result.exit_code == 3, result
    stdout = text(result.stdout)
    assert "tmp=ok" in stdout
    assert "etc=0" not in stdout
    assert "root=0" not in stdout
    errors = text(result.stderr).splitlines()
    for path in ("/etc/owned", "/owned"):
        lines = [line for line in errors if f"{path}:" in line]
        assert lines, (path, errors)
        assert all(read_only_error(runtime) in line for line in lines), lines


async def test_tmp_is_writable_by_the_sandbox_user_up_to_its_size(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    script = fill_half_then_double("/tmp")
    result = await oneshot(spec(busybox, script, scratch_bytes=MiB, runtime=runtime), engine=engine)
    assert_half_fits_double_does_not(result)


async def test_a_write_past_fsize_fails(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    script = "dd if=/dev/zero of=/tmp/big bs=64k count=32; rc=$?; wc -c < /tmp/big; exit $rc"
    result = await oneshot(spec(busybox, script, fsize_bytes=MiB, runtime=runtime), engine=engine)

    assert result.status == "exited", result
    assert result.exit_code not in (None, 0), result
    size = int(text(result.stdout).strip())
    assert 0 < size <= MiB


def proc_limits(text_: str) -> dict[str, tuple[str, str]]:
    """``/proc/PID/limits`` as {name: (soft, hard)}: the name fills the first 26 columns."""
    rows = text_.splitlines()[1:]
    return {row[:26].strip(): (row[26:].split()[0], row[26:].split()[1]) for row in rows}


async def test_the_rlimits_are_the_sandboxs_own_inside(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    """The payload's own ``/proc/self/limits`` hold policy's ``HostConfig.Ulimits``: the
    spec's file-size bound and no message queues, on Podman its open-files and processes
    bounds too. The engine applies them (rootless Docker on cgroup v2 too: the cgroup v2 cell);
    rootless Podman 4.3 drops them and the host sets them before the payload runs
    (test_podman.py, the cgroup v2 cell)."""
    fsize = 3 * MiB
    result = await oneshot(
        spec(busybox, "cat /proc/self/limits", fsize_bytes=fsize, runtime=runtime), engine=engine
    )

    if is_gvisor(runtime):
        # gVisor's /proc has no limits file; its fsize bound shows in
        # test_a_write_past_fsize_fails, and it has no message queues at all.
        assert "No such file or directory" in text(result.stderr), result
        return
    assert result.ok, result
    limits = proc_limits(text(result.stdout))
    assert limits["Max file size"] == (str(fsize), str(fsize)), limits
    assert limits["Max msgqueue size"] == ("0", "0"), limits
    if engine.is_podman:
        assert limits["Max open files"] == ("1024", "4096"), limits
        assert limits["Max processes"] == ("32768", "32768"), limits


async def test_host_environment_is_invisible_but_spec_env_is_passed(
    oneshot: OneShot,
    runtime: str | None,
    engine: Engine,
    busybox: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    canary = unique("host-canary")
    explicit = unique("explicit-value")
    monkeypatch.setenv("SBXKIT_TEST_CANARY", canary)
    assert os.environ["SBXKIT_TEST_CANARY"] == canary

    result = await oneshot(
        spec(busybox, "env", env={"SBXKIT_EXPLICIT": explicit}, runtime=runtime), engine=engine
    )

    assert result.ok, result
    env = text(result.stdout)
    assert canary not in env
    assert "SBXKIT_TEST_CANARY" not in env
    assert f"SBXKIT_EXPLICIT={explicit}" in env.splitlines()


async def test_host_canary_files_are_invisible(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, tmp_path: Path
) -> None:
    name = unique("canary")
    content = unique("canary-content")
    in_tmp = tmp_path / name
    in_root = Path("/root") / name
    in_tmp.write_text(content + "\n")
    try:
        in_root.write_text(content + "\n")
        own = f"/tmp/{name}-inner"
        script = (
            f"echo {content} > {own}; "
            # busybox find -xdev stays on the devices of all its roots: the rootfs and /tmp.
            f"echo FIND; find / /tmp -xdev -name '{name}*' 2>/dev/null | sort -u; "
            f"echo GREP; grep -rl {content} /tmp /work /etc /root 2>/dev/null; "
            "echo END"
        )
        result = await oneshot(spec(busybox, script, runtime=runtime), engine=engine)
    finally:
        in_root.unlink(missing_ok=True)

    assert result.status == "exited", result
    lines = text(result.stdout).split()
    find_hits = lines[lines.index("FIND") + 1 : lines.index("GREP")]
    grep_hits = lines[lines.index("GREP") + 1 : lines.index("END")]
    # Positive control: the same searches do find the payload's own file — and nothing else.
    assert find_hits == [own]
    assert grep_hits == [own]


async def test_a_listener_on_host_loopback_is_unreachable(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, python_image: str
) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        nc = await oneshot(
            spec(
                busybox,
                f"nc -w 2 127.0.0.1 {port} </dev/null; echo nc=$?",
                timeout_s=10.0,
                runtime=runtime,
            ),
            engine=engine,
        )
        probe = (
            "import socket, sys\n"
            "try:\n"
            "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('failed', type(exc).__name__)\n"
        )
        py = await oneshot(
            python_spec(python_image, probe, str(port), timeout_s=10.0, runtime=runtime),
            engine=engine,
        )

        assert nc.status == "exited", nc
        assert "nc=0" not in text(nc.stdout)
        assert "nc=" in text(nc.stdout)
        assert "can't connect" in text(nc.stderr), nc
        assert py.ok, py
        assert text(py.stdout).split()[0] == "failed", py

        # Nothing ever completed a handshake with the listener...
        with pytest.raises(BlockingIOError):
            listener.accept()
        # ...and that check can fail: a real connection is seen.
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            listener.setblocking(True)
            listener.settimeout(2)
            peer, _ = listener.accept()
            peer.close()
    finally:
        listener.close()


async def test_only_loopback_interface_exists(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    result = await oneshot(spec(busybox, "ls /sys/class/net", runtime=runtime), engine=engine)

    assert result.ok, result
    assert text(result.stdout).split() == ["lo"]


async def test_a_fork_loop_hits_the_pids_ceiling(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    ceiling = max(32, min_pids(runtime))
    script = (
        f"i=0; while [ $i -lt {2 * ceiling} ]; do sleep 5 & i=$((i+1)); echo $i; done; "
        'echo "finished $i"'
    )
    result = await oneshot(
        spec(busybox, script, pids=ceiling, timeout_s=10.0, runtime=runtime), engine=engine
    )

    assert result.status == "exited", result
    assert result.exit_code != 0
    assert "finished" not in text(result.stdout)
    started = [int(n) for n in text(result.stdout).split()]
    assert started, result  # it did fork a while ...
    assert max(started) < ceiling  # ... but never past the ceiling
    if is_gvisor(runtime):
        # The ceiling also counts gVisor's own threads: the whole sandbox ends (exit 2, the Go
        # runtime's fatal exit) instead of one fork failing with EAGAIN.
        assert result.exit_code == 2, result
    else:
        assert "can't fork" in text(result.stderr)


async def test_a_large_python_allocation_is_oom_killed(
    oneshot: OneShot, runtime: str | None, engine: Engine, python_image: str, witness: Witness
) -> None:
    # 32 MiB step by step, then one 64 MiB block: a loop of small steps at the ceiling can
    # thrash on the container's own file pages instead (btrfs storage: 3 of 10 plain
    # `docker run`s, docs/security.md), and the run is then the timeout it is.
    code = (
        "chunks = []\n"
        "for _ in range(32):\n"
        "    chunks.append(b'x' * (1 << 20))\n"
        "    print(len(chunks), flush=True)\n"
        "chunks.append(b'x' * (64 << 20))\n"
        "print('survived', flush=True)\n"
    )
    result = await oneshot(
        python_spec(python_image, code, memory_bytes=64 * MiB, runtime=runtime), engine=engine
    )

    assert_oom_outcome(result, witness)
    # It did allocate, and died in the block that would have held more than the whole limit.
    assert text(result.stdout).split() == [str(n) for n in range(1, 33)], result


async def test_tail_of_dev_zero_is_oom_killed(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str, witness: Witness
) -> None:
    result = await oneshot(
        spec(busybox, "tail /dev/zero", memory_bytes=64 * MiB, runtime=runtime), engine=engine
    )

    assert_oom_outcome(result, witness)


CGROUP_PROBE = """
if [ -f /sys/fs/cgroup/cpu.max ]; then
  echo "version 2"
  echo "cpu $(cat /sys/fs/cgroup/cpu.max)"
  echo "pids $(cat /sys/fs/cgroup/pids.max)"
  echo "memory $(cat /sys/fs/cgroup/memory.max)"
else
  echo "version 1"
  echo "cpu $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"
  echo "pids $(cat /sys/fs/cgroup/pids/pids.max)"
  echo "memory $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"
fi
"""


async def test_cgroup_shows_the_cpu_pids_and_memory_limits(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    pids = max(48, min_pids(runtime))
    result = await oneshot(
        spec(busybox, CGROUP_PROBE, cpus=0.5, pids=pids, memory_bytes=96 * MiB, runtime=runtime),
        engine=engine,
    )

    if is_gvisor(runtime):
        # gVisor mounts no cgroupfs in the sandbox; the host-side cgroup holds the limits
        # (test_conformance.py::test_the_host_cgroup_holds_the_limits).
        assert result.status == "exited", result
        assert "No such file or directory" in text(result.stderr), result
        assert text(result.stdout).split()[:2] == ["version", "1"], result
        return
    assert result.ok, result
    values = {
        line.split()[0]: line.split()[1:] for line in text(result.stdout).strip().splitlines()
    }
    assert values["version"] in (["1"], ["2"]), values
    quota, period = (int(x) for x in values["cpu"])
    assert quota > 0
    assert period > 0
    assert quota / period == 0.5
    assert values["pids"] == [str(pids)]
    assert values["memory"] == [str(96 * MiB)]


# The sandbox's own CPU counters around a one-second busy loop (v2: cpu.stat has usage_usec;
# v1: cpu.stat and cpuacct.usage), each line prefixed with when it was read.
CPU_BURN = """
stat=/sys/fs/cgroup/cpu.stat
[ -f /sys/fs/cgroup/cpu.max ] || stat=/sys/fs/cgroup/cpu/cpu.stat
probe() {
  echo "$1 uptime $(cut -d' ' -f1 /proc/uptime)"
  sed "s/^/$1 /" "$stat" || exit 9
  if [ -f /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then
    echo "$1 usage_ns $(cat /sys/fs/cgroup/cpuacct/cpuacct.usage)"
  fi
}
probe before
timeout 1 sh -c 'while :; do :; done'
probe after
"""


def cpu_counters(stdout: bytes) -> dict[str, dict[str, float]]:
    """{"before": ..., "after": ...}: uptime and CPU seconds used, and the throttled periods."""
    read: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    for line in text(stdout).splitlines():
        when, key, value = line.split()
        read[when][key] = float(value)
    for counters in read.values():
        if "usage_usec" in counters:
            counters["used_s"] = counters["usage_usec"] / 1e6
        else:
            counters["used_s"] = counters["usage_ns"] / 1e9
    return read


async def test_a_busy_loop_is_throttled_to_its_cpu_quota(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    """The CPU limit enforced, not only written down: a busy loop in a sandbox of 0.05 CPU is
    throttled by the kernel (``nr_throttled`` grows) and its cgroup's CPU time over the loop
    stays near 5 % of the wall time it took."""
    cpus = 0.05
    result = await oneshot(spec(busybox, CPU_BURN, cpus=cpus, runtime=runtime), engine=engine)

    if is_gvisor(runtime):
        # No cgroupfs inside gVisor: the host-side cgroup holds the quota (test_conformance.py,
        # test_each_cell_runs_under_its_runtime_and_the_host_cgroup_holds_the_limits).
        assert (result.status, result.exit_code) == ("exited", 9), result
        return
    assert result.ok, result
    read = cpu_counters(result.stdout)
    wall = read["after"]["uptime"] - read["before"]["uptime"]
    used = read["after"]["used_s"] - read["before"]["used_s"]
    throttled = read["after"]["nr_throttled"] - read["before"]["nr_throttled"]
    assert wall >= 0.9, read
    assert used > 0, read  # the loop did run ...
    assert throttled > 0, read  # ... and the kernel stopped it at the quota ...
    # ... so it used at most its share (twice it, plus a tick per period of overrun).
    assert used <= 2 * cpus * wall + 0.05, (used, wall, read)


async def test_payload_has_no_capabilities_and_no_new_privileges(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    result = await oneshot(spec(busybox, "cat /proc/self/status", runtime=runtime), engine=engine)

    assert result.ok, result
    status = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in text(result.stdout).splitlines())
    )
    for field in ("CapEff", "CapPrm", "CapBnd", "CapInh"):
        assert int(status[field], 16) == 0, (field, status[field])
    if is_gvisor(runtime):
        # gVisor's /proc/self/status has neither line (its kernel predates ambient
        # capabilities in that file); no_new_privs is still set on the sandbox process.
        assert "CapAmb" not in status
        assert "NoNewPrivs" not in status
        return
    assert int(status["CapAmb"], 16) == 0
    assert status["NoNewPrivs"] == "1"
