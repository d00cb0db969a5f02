"""``sbxkit.run``: one command in one fresh sandbox, whatever it needs.

A plain run is the one-shot lifecycle (``runner.py``). A run with ``files=`` or
``measure_usage=True`` is a short sandbox session (``files_run.py``): files can only reach the
read-only sandbox's ``/tmp`` once it runs, and the cgroup's figures are gone once a plain run's
payload exits. Choosing between the two here, above both, keeps the lifecycle free of the
session layer that is built on it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sbxkit import runner
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from sbxkit.files_run import run_with_files
from sbxkit.gpu import GpuCursor
from sbxkit.owner import Owner
from sbxkit.result import RunResult
from sbxkit.runner import OutputCallback
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec
from sbxkit.supervisor.client import QueueObserver


async def run(
    spec: SandboxSpec,
    stdin: bytes | None = None,
    *,
    engine: Engine | None = None,
    owner: Owner | None = None,
    socket_path: str | None = None,
    settings: Settings | None = None,
    gpu_cursor: GpuCursor | None = None,
    on_queued: QueueObserver | None = None,
    on_output: OutputCallback | None = None,
    files: Mapping[str, bytes] | None = None,
    measure_usage: bool = False,
) -> RunResult:
    """Run ``spec.command`` once in a fresh hardened sandbox and remove it.

    Everything ``sbxkit.runner.run`` says holds (admission, ownership, refusals, cancellation,
    ``on_queued``, ``on_output``). ``files`` (relative name → content) are put into ``/tmp``
    before the command runs, and ``measure_usage`` fills ``RunResult.usage`` (peak memory, CPU
    time): both make the run a short sandbox session (the image needs ``sh`` and ``tar``).
    """
    if files is not None or measure_usage:
        if on_output is not None:
            raise SpecError("on_output", "not supported together with files or measure_usage")
        return await run_with_files(
            spec,
            stdin,
            files or {},
            measure_usage=measure_usage,
            engine=engine,
            owner=owner,
            socket_path=socket_path,
            settings=settings,
        )
    return await runner.run(
        spec,
        stdin,
        engine=engine,
        owner=owner,
        socket_path=socket_path,
        settings=settings,
        gpu_cursor=gpu_cursor,
        on_queued=on_queued,
        on_output=on_output,
    )
