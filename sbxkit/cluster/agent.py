"""A node's agent: the long-lived Ray actor that owns the node's engine and supervisor link.

One agent runs on each sandbox node for the batch (the driver pins it there). It opens the
node's Docker engine once — the socket its environment names (``DOCKER_HOST``, else the
standard places) — and runs every job Ray places on the node through sbxkit's one-shot
lifecycle with the default owner: the node's own supervisor admits, journals and removes each
sandbox exactly as for a local run (``run_many`` of one job, so a supervisor whose hard bounds
are used up is waited for as locally).

sbxkit is trio; a Ray actor is asyncio. The agent keeps a trio loop in a thread (``Portal``)
and each Ray call awaits its run there; cancelling the call (the driver's Ctrl-C) removes the
container before the call returns. The supervisor is launched (when absent) in a session of its
own, so it outlives the raylet and this actor: if the node's Ray processes die, the
supervisor's connections from this process close and it removes every container they held.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
from pathlib import Path

import msgspec
import trio

from sbxkit.backends.docker import DockerBackend
from sbxkit.cluster.images import image_fingerprints
from sbxkit.cluster.wire import (
    Cancelled,
    Done,
    NodeReport,
    RemoteJob,
    decode_job,
    decode_terms,
    encode,
)
from sbxkit.errors import SbxError
from sbxkit.harness import Job, JobError, JobResult, run_many
from sbxkit.plan import effective_settings
from sbxkit.portal import Portal
from sbxkit.supervisor.fingerprint import implementation_fingerprint

WIRE_SOURCES = ("cluster/wire.py", "harness.py", "result.py", "spec.py", "settings.py")
"""What the driver and the agents must agree on, besides the supervisor's own protocol."""


@functools.cache
def implementation() -> str:
    """This sbxkit's fingerprint for the cluster: the wire's sources and the supervisor's."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(implementation_fingerprint().encode())
    for relative in WIRE_SOURCES:
        digest.update(relative.encode() + b"\0" + (root / relative).read_bytes())
    return digest.hexdigest()[:32]


class NodeAgent:
    """The actor's body (the driver wraps it with ``ray.remote``); see the module doc."""

    def __init__(self, terms: bytes, node_name: str) -> None:
        batch = decode_terms(terms)
        own = msgspec.structs.replace(
            batch.settings, supervisor_state_dir=None, supervisor_command=None
        )
        self._settings = effective_settings(own)  # this node's state dir, not the driver's
        self._capacity_wait_s = batch.capacity_wait_s
        self._name = node_name
        self._portal = Portal()
        self._portal.start()
        self._backend: DockerBackend | None = None
        self._runs: set[asyncio.Task[object]] = set()
        self._closing = False

    # -- joining --------------------------------------------------------------------------------

    async def join(self, images: list[str]) -> bytes:
        """Check the node for the batch: engine, supervisor (launched if absent, one recovery
        pass), the images' content. Returns a ``NodeReport``."""
        report: NodeReport = await self._portal.acall(self._join, images)
        return encode(report)

    async def _join(self, images: list[str]) -> NodeReport:
        import ray  # the actor runs under Ray: its runtime context names the node

        node_id = ray.get_runtime_context().get_node_id()
        backend = DockerBackend(settings=self._settings)
        report = NodeReport(
            node_id=node_id,
            name=self._name,
            implementation=implementation(),
            engine=os.environ.get("DOCKER_HOST", "(discovered)"),
            agent_pid=os.getpid(),
        )
        try:
            await backend.preflight()
        except SbxError as exc:
            return msgspec.structs.replace(report, engine_error=str(exc))
        assert backend.engine is not None
        fingerprints = await image_fingerprints(backend.engine, images)
        report = msgspec.structs.replace(
            report, engine=backend.engine.socket_path, images=fingerprints
        )
        try:
            await backend.reconcile_orphans()  # reaches (or launches) the node's supervisor
        except SbxError as exc:
            await backend.aclose()
            return msgspec.structs.replace(report, supervisor_error=str(exc))
        self._backend = backend
        return report

    # -- running --------------------------------------------------------------------------------

    async def run(self, job: bytes, caller_pid: int) -> bytes:
        """Run one attempt of a job (a ``RemoteJob``); returns its ``Done`` or ``Cancelled``.

        ``caller_pid``: the relay task's process on this node. Should it die (its Ray worker
        killed), nobody would receive this run's result and the job would be retried: the run is
        cancelled, its container removed, rather than left running as a silent duplicate."""
        task = asyncio.current_task()
        if self._closing or self._backend is None or task is None:
            return encode(Cancelled(node=self._name))
        self._runs.add(task)
        try:
            done: JobResult = await self._portal.acall(self._run, decode_job(job), caller_pid)
        except asyncio.CancelledError:  # the container is already removed (Portal.acall)
            return encode(Cancelled(node=self._name))
        finally:
            self._runs.discard(task)
        return encode(Done(job=done, node=self._name))

    async def _run(self, job: RemoteJob, caller_pid: int) -> JobResult:
        assert self._backend is not None
        results: list[JobResult] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when_gone, caller_pid, nursery.cancel_scope)
            results = await run_many(
                [Job(id=job.id, spec=job.spec, stdin=job.stdin)],
                parallel=1,
                backend=self._backend,
                capacity_wait_s=self._capacity_wait_s,
            )
            nursery.cancel_scope.cancel()
        if results:
            return results[0]
        return JobResult(
            id=job.id,
            error=JobError(type="RelayLost", message="the relay task's process died; run removed"),
        )

    # -- stopping -------------------------------------------------------------------------------

    async def cancel_all(self) -> int:
        """Cancel every run in flight and refuse new ones; returns once each has removed its
        container. Returns how many were cancelled."""
        self._closing = True
        runs = [task for task in self._runs if task is not asyncio.current_task()]
        for task in runs:
            task.cancel()
        if runs:
            await asyncio.wait(runs)
        return len(runs)

    async def close(self) -> None:
        """``cancel_all``, then close the engine and the trio thread."""
        await self.cancel_all()
        if self._backend is not None:
            backend, self._backend = self._backend, None
            await self._portal.acall(backend.aclose)
        await asyncio.get_running_loop().run_in_executor(None, self._portal.close)


async def _cancel_when_gone(pid: int, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` when process ``pid`` exits (its pidfd becomes readable). Without
    pidfds (Linux < 5.3) the run is not watched."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        scope.cancel()
        return
    except OSError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
        scope.cancel()
    finally:
        os.close(fd)
