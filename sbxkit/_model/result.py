"""The typed outcome of a sandboxed run."""

from __future__ import annotations

from typing import Literal

import msgspec

from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._util.public import publish

Status = Literal["exited", "timed_out", "output_exceeded", "oom_killed", "killed", "disk_exceeded"]
Stream = Literal["stdout", "stderr"]
Evidence = Literal["kernel", "daemon"]
"""What decided a run's exit: the kernel (its init's pidfd, its FIFOs' EOF) or the daemon (its
``wait`` and, for a signal exit, its ``OOMKilled`` flag and events). docs/security.md."""


class PhaseTimings(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds spent in each phase of the lifecycle (monotonic clock)."""

    queued_s: float = 0.0  # waiting for admission (memory, live sandboxes, launches)
    create_s: float = 0.0  # owner create + post-create inspection, after admission
    start_s: float = 0.0  # attach + wait registration + start
    run_s: float = 0.0  # start returned → exit, timeout or overflow
    remove_s: float = 0.0  # forced removal confirmed by the daemon


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """What the sandbox's cgroup measured (``run(..., measure_usage=True)``, ``Sandbox.usage``).

    ``memory_peak_bytes``: the memory cgroup's high-water mark since the sandbox started
    (cgroup v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``; None where the kernel has
    neither). ``cpu_time_s``: CPU time charged to the cgroup (v1 ``cpuacct.usage``, v2
    ``cpu.stat`` ``usage_usec``) — for a run, the difference across the command.
    """

    memory_peak_bytes: int | None
    cpu_time_s: float | None
    cgroup: Literal["v1", "v2"]


class Metrics(msgspec.Struct, frozen=True, kw_only=True):
    """One reading of a running sandbox's cgroup on the host (``Sandbox.metrics``, ``sbxkit
    top``); a counter the kernel lacks is None.

    ``at``: unix seconds of the reading. ``cpu_time_s``: CPU time charged to everything the
    sandbox ran (v1 ``cpuacct.usage``, v2 ``cpu.stat`` ``usage_usec``); ``cpu_rate``: CPUs in
    use on average since the previous reading (1.0 is one core busy; None on the first).
    ``memory_bytes``: memory charged now (v1 ``memory.usage_in_bytes``, v2 ``memory.current``,
    page cache included); ``memory_peak_bytes``: its high-water mark since the sandbox started
    (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``). ``pids``: tasks in it now
    (``pids.current``). ``io_read_bytes``/``io_write_bytes``: block-device bytes since it
    started (v1 ``blkio.throttle.io_service_bytes_recursive``, v2 ``io.stat``); writes to its
    tmpfs scratch touch no device and are not among them.
    """

    at: float
    cgroup: Literal["v1", "v2"]
    cpu_time_s: float | None
    cpu_rate: float | None
    memory_bytes: int | None
    memory_peak_bytes: int | None
    pids: int | None
    io_read_bytes: int | None
    io_write_bytes: int | None


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """What happened. ``exit_code`` is the payload's own when it exited, else None.

    ``oom_evidence`` says what decided ``oom_killed``: Docker's ``OOMKilled`` flag, or — since
    the flag is not always set (moby #15621) — the daemon's ``oom`` event. A signal exit is
    ``oom_killed`` or ``killed`` only on such evidence, never on its status (137) alone. On an
    ``exited`` result it notes that another process of the sandbox (a child) was OOM-killed
    while the payload exited by itself: the payload's code stands.
    """

    status: Status
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    overflowed: Stream | None
    container_id: str
    lease: str
    timings: PhaseTimings
    oom_evidence: str | None = None
    kill_evidence: str | None = None
    """For ``killed``: the daemon's record of a kill sbxkit did not send (``docker kill``, a
    daemon shutdown); see sbxkit/_lifecycle/outcome.py."""
    usage: Usage | None = None
    """Peak memory and CPU time, when asked for (``measure_usage=True``); None otherwise."""
    pooled: bool = False
    """The run claimed a pre-started container of a ``Pool`` (docs/pool.md), not a cold one."""
    evidence: Evidence = "daemon"
    """What decided the exit (``Evidence``): ``kernel`` where the host can tell, else
    ``daemon`` (a signal exit is always judged on the daemon's evidence)."""
    denials: tuple[Denial, ...] = ()
    """What a governed network refused during the run (docs/network.md): each destination and
    the rule; the first 100 (the operator's audit log has every decision)."""
    ports: tuple[PortForward, ...] = ()
    """The inbound ports the run's sandbox had, as bound on the host (docs/network.md)."""

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0


def own_exit_code(status: Status, code: int | None) -> int | None:
    """``RunResult.exit_code``: the payload's code only when it exited by itself. After a kill
    (sbxkit's for a limit, the kernel's OOM killer, someone's ``docker kill``) the 137 is the
    kill's, not the payload's answer; the status says which kill it was."""
    return code if status == "exited" else None


def json_fields(result: RunResult) -> dict[str, object]:
    """The result as JSON-ready fields (``sbxkit run --json`` and ``sbxkit batch`` lines): text
    decoded as UTF-8 with replacement, byte counts of the raw output, timings in seconds."""
    return {
        "status": result.status,
        "exit_code": result.exit_code,
        "stdout": result.stdout.decode("utf-8", "replace"),
        "stderr": result.stderr.decode("utf-8", "replace"),
        "stdout_bytes": len(result.stdout),
        "stderr_bytes": len(result.stderr),
        "overflowed": result.overflowed,
        "container_id": result.container_id,
        "lease": result.lease,
        "oom_evidence": result.oom_evidence,
        "kill_evidence": result.kill_evidence,
        "usage": None if result.usage is None else msgspec.structs.asdict(result.usage),
        "timings": msgspec.structs.asdict(result.timings),
        "pooled": result.pooled,
        "evidence": result.evidence,
        "denials": [msgspec.structs.asdict(denial) for denial in result.denials],
        "ports": [msgspec.structs.asdict(port) for port in result.ports],
    }


publish(__name__, globals())  # public names show as sbxkit.NAME
