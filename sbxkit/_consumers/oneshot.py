"""``sbxkit.run``: one command in one fresh sandbox, whatever it needs.

A plain run is the backend's one-shot lifecycle (``backends/docker.py``). A run with ``files=`` or
``measure_usage=True`` is a short sandbox session (``files_run.py``): files can only reach the
read-only sandbox's ``/tmp`` once it runs, and the cgroup's figures are gone once a plain run's
payload exits. Choosing between the two here, above both, keeps the lifecycle free of the
session layer that is built on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Unpack

from sbxkit._consumers.files_run import run_with_files
from sbxkit._lifecycle.attached import OutputCallback
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerOptions, docker_backend
from sbxkit.errors import SpecError


async def run(
    spec: SandboxSpec,
    stdin: StdinSource | None = None,
    *,
    on_output: OutputCallback | None = None,
    files: Mapping[str, bytes] | None = None,
    measure_usage: bool = False,
    backend: Backend | None = None,
    **docker: Unpack[DockerOptions],
) -> RunResult:
    """Run ``spec.command`` once in a fresh hardened sandbox and remove it.

    Everything ``sbxkit._consumers.runner.run`` says holds (admission, ownership, refusals,
    cancellation, ``on_queued``, ``on_output``). ``files`` (relative name → content) are put into
    ``/tmp`` before the command runs, and ``measure_usage`` fills ``RunResult.usage`` (peak memory,
    CPU time): both make the run a short sandbox session (the image needs ``sh`` and ``tar``).
    ``backend`` (instead of the engine, owner, socket, settings, GPU cursor and observer) runs it on
    a backend you configured; one that cannot serve sessions refuses ``files`` and ``measure_usage``
    before anything is created.
    """
    chosen = docker_backend(backend, **docker)
    if files is not None or measure_usage:
        if on_output is not None:
            raise SpecError("on_output", "not supported together with files or measure_usage")
        if stdin is not None and not isinstance(stdin, bytes):
            raise SpecError("stdin", "bytes only together with files or measure_usage")
        return await run_with_files(
            spec, stdin, files or {}, measure_usage=measure_usage, backend=chosen
        )
    return await chosen.run_once(spec, stdin, on_output=on_output)


publish(__name__, globals())  # public names show as sbxkit.NAME
