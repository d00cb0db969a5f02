"""The one-shot run: ``run(spec)`` creates a fresh hardened sandbox, runs the command once and
removes the sandbox (docs/architecture.md, "The one-shot lifecycle").

The lifecycle itself is the backend's (``sbxkit.backends.docker.DockerBackend.run_once``): the plan
(``sbxkit._plan.plan``), the owned container (``sbxkit._lifecycle.owned``) and the attached payload
(``sbxkit._lifecycle.attached``). Whatever happens after creation — exit, timeout, output overflow,
a transport error, the caller's cancellation — ends in the same shielded, time-bounded removal
through the owner, and a removal failure is raised, never swallowed.
"""

from __future__ import annotations

from typing import Unpack

from sbxkit._lifecycle.attached import OutputCallback
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerOptions, docker_backend

__all__ = ["OutputCallback", "run"]


async def run(
    spec: SandboxSpec | CheckedSpec,
    stdin: StdinSource | None = None,
    *,
    on_output: OutputCallback | None = None,
    backend: Backend | None = None,
    **docker: Unpack[DockerOptions],
) -> RunResult:
    """Run ``spec.command`` once in a fresh hardened sandbox and remove it.

    By default the container is owned by the supervisor process (auto-launched), so it is
    removed even if this process is killed; pass ``owner=InProcessOwner(engine)`` to keep
    ownership in-process (it does not survive a killed caller). The Docker keywords
    (``DockerOptions``: ``engine``, ``owner``, ``settings``, ``socket_path``, ``gpu_cursor``,
    ``on_queued``) say where and how; or ``backend`` runs it on a backend you configured (a
    ``DockerBackend``, or the sbx runtime), and those keywords are then the backend's.

    The supervisor admits the run: while the host's memory budget (or its live-sandbox or
    launch bound) is used up, the run waits its turn in a FIFO queue (``on_queued(ahead,
    waited_s)`` hears about it; ``timings.queued_s`` says how long) and its time limit starts
    only when it starts. A run that can never fit raises ``NeverFits`` (a ``SpecError``) at once.

    Bad input raises SpecError before the daemon is contacted; what only the daemon can judge
    (the image, named volumes, the runtime being registered, CDI GPUs) is refused before
    create. The caller's trio cancel scope is honoured: the container is removed before
    Cancelled propagates.

    ``stdin`` is bytes, or a ``trio.abc.ReceiveStream`` (``sbxkit._util.stdin.FileStdin`` for a
    file) read a chunk at a time as the payload takes it, under the run's time limit, and
    closed at the end.

    ``on_output(stream, chunk)`` (``stream`` is ``"stdout"`` or ``"stderr"``) is called with
    each chunk as it arrives, only with bytes within ``output_bytes``: the callback sees exactly
    what the result keeps. It runs in the run's task; if it raises, the run ends with that error
    (after removal).

    ``sbxkit.run`` (``oneshot.py``) adds ``files=`` and ``measure_usage=`` on top of this.
    """
    chosen = docker_backend(backend, **docker)
    return await chosen.run_once(spec, stdin, on_output=on_output)
