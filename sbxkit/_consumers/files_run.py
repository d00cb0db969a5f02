"""``sbxkit.run(spec, files={...})`` and ``measure_usage=True``: a one-shot run whose command
finds files in ``/tmp``, or whose peak memory and CPU time are measured.

The root filesystem is read-only and ``/tmp`` is a tmpfs that exists only once the container
runs, so files cannot be placed before start. A run with files is therefore a short-lived
sandbox session: open (hardened and supervised as always), ``put_files`` into ``/tmp``, ``exec``
the command under the spec's limits, remove. The result is the exec's ``RunResult``: same
statuses, caps and time limit (a timeout kills the command's whole process group), the image
needs ``sh`` and ``tar`` (the exec wrapper and the file transfer use them).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from sbxkit._consumers.session import open_sandbox
from sbxkit._model.result import RunResult, Usage
from sbxkit._model.spec import SandboxSpec, check_limit
from sbxkit.backends.base import Backend

SESSION_MARGIN_S = 60.0
"""The session outlives the command's own limit by this much: open, transfer, removal."""


async def run_with_files(
    spec: SandboxSpec,
    stdin: bytes | None,
    files: Mapping[str, bytes],
    *,
    measure_usage: bool = False,
    backend: Backend,
) -> RunResult:
    """Put ``files`` (relative name → content) into ``/tmp``, then run ``spec.command``; with
    ``measure_usage``, read the sandbox's cgroup before and after it
    (sbxkit/_lifecycle/usage.py)."""
    check_limit("timeout_s", spec.limits.timeout_s)
    check_limit("output_bytes", spec.limits.output_bytes)
    session_limits = msgspec.structs.replace(
        spec.limits, timeout_s=spec.limits.timeout_s + SESSION_MARGIN_S
    )
    session_spec = msgspec.structs.replace(spec, limits=session_limits)
    async with open_sandbox(session_spec, backend=backend) as sandbox:
        if files:
            await sandbox.put_files(files)
        before = await sandbox.usage() if measure_usage else None
        result = await sandbox.exec(
            spec.command,
            stdin,
            timeout=spec.limits.timeout_s,
            max_output=spec.limits.output_bytes,
            workdir=spec.workdir,
        )
        result = msgspec.structs.replace(result, denials=await sandbox.denials())
        if before is None or result.status == "killed":
            return result
        after = await sandbox.usage()
        cpu = None
        if after.cpu_time_s is not None and before.cpu_time_s is not None:
            cpu = after.cpu_time_s - before.cpu_time_s
        usage = Usage(
            memory_peak_bytes=after.memory_peak_bytes, cpu_time_s=cpu, cgroup=after.cgroup
        )
        return msgspec.structs.replace(result, usage=usage)
