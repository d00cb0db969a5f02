"""Reading a sandbox's cgroup counters from inside it: peak memory and CPU time.

On the host these counters die with the container: Docker (cgroup v1 and v2) deletes the container's
cgroup when its main process exits, before ``wait`` returns, and the Engine API reports no final
usage. A one-shot run's numbers can therefore only be read while its sandbox is still alive, from
inside, after the command: ``run(..., measure_usage=True)`` runs the command as an exec in a short
session and reads them there (sbxkit/_consumers/files_run.py). The sandbox has its own cgroup
namespace, so its cgroup is the root of ``/sys/fs/cgroup``. Pure apart from the script the sandbox
runs.
"""

from __future__ import annotations

from typing import Literal

from sbxkit._model.result import Usage

USAGE_SCRIPT = (
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then "
    "echo v2; cat /sys/fs/cgroup/memory.peak 2>/dev/null || echo -; "
    "sed -n 's/^usage_usec //p' /sys/fs/cgroup/cpu.stat 2>/dev/null || echo -; "
    "else "
    "echo v1; cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes 2>/dev/null || echo -; "
    "cat /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null || echo -; "
    "fi"
)
"""Prints the cgroup version, the memory high-water mark in bytes and the CPU time charged
(v1: nanoseconds, v2: microseconds), one per line; ``-`` for what the kernel lacks."""

_CPU_UNIT_S = {"v1": 1e-9, "v2": 1e-6}


def parse_usage(text: str) -> Usage:
    """The script's three lines as ``Usage``; anything unreadable becomes None."""
    lines = [line.strip() for line in text.splitlines()]
    version: Literal["v1", "v2"] = "v2" if lines and lines[0] == "v2" else "v1"
    memory = _number(lines[1]) if len(lines) > 1 else None
    cpu = _number(lines[2]) if len(lines) > 2 else None
    return Usage(
        memory_peak_bytes=memory,
        cpu_time_s=None if cpu is None else cpu * _CPU_UNIT_S[version],
        cgroup=version,
    )


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None
