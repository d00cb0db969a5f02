"""A node's agent: the long-lived Ray actor that owns the node's engine and supervisor link.

One agent runs on each sandbox node for the batch (the driver pins it there). It opens the
node's Docker engine once — the socket its environment names (``DOCKER_HOST``, else the
standard places) — and runs every job Ray places on the node through sbxkit's one-shot
lifecycle with the default owner: the node's own supervisor admits, journals and removes each
sandbox exactly as for a local run (``run_many`` of one job, so a supervisor whose hard bounds
are used up is waited for as locally).

What the agent allows is its node's own configuration (``node_settings``): the node's
environment (``SBXKIT_ENV``, ``SBXKIT_EVIDENCE``, ``SBXKIT_NETWORK_AUDIT_LOG``,
``SBXKIT_LABELS``, ``SBXKIT_STATE_DIR``) and, if ``SBXKIT_NODE_PROFILE`` names one, a profile's
operator switches (``enable_bind_mounts``, ``enable_named_volumes``, its supervisor). The driver
sends only its container labels: nothing it sends widens a node's policy.

Everything the agent reports or returns is sealed with the batch's keys from the node's cluster
secret (``seal.py``), and it runs only jobs sealed with the same keys.

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

from sbxkit._consumers.harness import Job, JobError, JobResult, run_many
from sbxkit._grammar.profile import load_profile, profile_settings
from sbxkit._model.settings import Settings
from sbxkit._plan.plan import effective_settings
from sbxkit._protocol.fingerprint import implementation_fingerprint
from sbxkit._util.portal import Portal
from sbxkit.backends.docker import DockerBackend
from sbxkit.cluster.images import image_fingerprints
from sbxkit.cluster.seal import Forged, Keys, context
from sbxkit.cluster.secret import load_secret
from sbxkit.cluster.wire import (
    Cancelled,
    Done,
    JoinRefused,
    NodeReport,
    Outcome,
    RemoteJob,
    SealedOutcome,
    SealedReport,
    Unsealed,
    decode_job,
    decode_terms,
    encode,
)
from sbxkit.errors import SbxError

WIRE_SOURCES = (
    "cluster/wire.py",
    "cluster/seal.py",
    "_consumers/harness.py",
    "_model/result.py",
    "_model/spec.py",
    "_model/settings.py",
)
"""What the driver and the agents must agree on, besides the supervisor's own protocol."""


@functools.cache
def implementation() -> str:
    """This sbxkit's fingerprint for the cluster: the wire's sources and the supervisor's."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(implementation_fingerprint().encode())
    for relative in WIRE_SOURCES:
        digest.update(relative.encode() + b"\0" + (root / relative).read_bytes())
    return digest.hexdigest()[:32]


NODE_PROFILE_ENV = "SBXKIT_NODE_PROFILE"


def node_settings(driver_labels: dict[str, str]) -> Settings:
    """What this node allows: its own profile (``SBXKIT_NODE_PROFILE``) and environment; the
    driver's labels are added under the node's own."""
    path = os.environ.get(NODE_PROFILE_ENV, "").strip()
    own = profile_settings(load_profile(path))[0] if path else Settings()
    own = effective_settings(own)
    return msgspec.structs.replace(own, labels={**driver_labels, **own.labels})


class NodeAgent:
    """The actor's body (the driver wraps it with ``ray.remote``); see the module doc."""

    def __init__(self, terms: bytes, node_name: str) -> None:
        batch = decode_terms(terms)
        self._problem: str | None = None  # reported by join, never raised here
        self._keys: Keys | None = None
        self._settings = Settings()
        try:
            self._keys = Keys(load_secret(), batch.batch_id)
            self._settings = node_settings(batch.labels)
        except SbxError as exc:
            self._problem = str(exc)
        self._capacity_wait_s = batch.capacity_wait_s
        self._name = node_name
        self._node_id = ""
        self._portal = Portal()
        self._portal.start()
        self._backend: DockerBackend | None = None
        self._runs: set[asyncio.Task[object]] = set()
        self._closing = False

    # -- joining --------------------------------------------------------------------------------

    async def join(self, images: list[str], challenge: bytes) -> bytes:
        """Check the node for the batch: engine, supervisor (launched if absent, one recovery
        pass), the images' content. Returns a ``SealedReport`` (a ``NodeReport`` bound to
        ``challenge`` and this node), or ``JoinRefused`` when it cannot seal one."""
        import ray  # the actor runs under Ray: its runtime context names the node

        self._node_id = ray.get_runtime_context().get_node_id()
        if self._keys is None:
            return encode(JoinRefused(reason=self._problem or "no cluster secret"))
        report: NodeReport = await self._portal.acall(self._join, images, challenge)
        bound = context(challenge, self._node_id)
        return encode(SealedReport(sealed=self._keys.seal("report", bound, encode(report))))

    async def _join(self, images: list[str], challenge: bytes) -> NodeReport:
        backend = DockerBackend(settings=self._settings)
        report = NodeReport(
            node_id=self._node_id,
            name=self._name,
            implementation=implementation(),
            engine=os.environ.get("DOCKER_HOST", "(discovered)"),
            agent_pid=os.getpid(),
            challenge=challenge,
        )
        if self._problem is not None:  # the secret is fine, the node's configuration not
            return msgspec.structs.replace(report, config_error=self._problem)
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

    async def run(self, index: int, attempt: int, sealed_job: bytes, caller_pid: int) -> bytes:
        """Run one attempt of a job (a sealed ``RemoteJob``); returns its ``Done`` or
        ``Cancelled``, sealed and bound to ``index`` and ``attempt``. A job that does not open
        with this batch's keys is not run (``Unsealed``).

        ``caller_pid``: the relay task's process on this node. Should it die (its Ray worker
        killed), nobody would receive this run's result and the job would be retried: the run is
        cancelled, its container removed, rather than left running as a silent duplicate."""
        if self._keys is None:
            return encode(Unsealed(reason=self._problem or "no cluster secret"))
        bound = context(index, attempt)
        try:
            job = decode_job(self._keys.open("job", bound, sealed_job))
        except (Forged, msgspec.DecodeError) as exc:
            return encode(Unsealed(reason=f"the job did not open: {exc}"))
        return self._seal(bound, await self._attempt(job, caller_pid))

    async def _attempt(self, job: RemoteJob, caller_pid: int) -> Outcome:
        cancelled = Cancelled(node=self._name, node_id=self._node_id)
        task = asyncio.current_task()
        if self._closing or self._backend is None or task is None:
            return cancelled
        self._runs.add(task)
        try:
            done: JobResult = await self._portal.acall(self._run, job, caller_pid)
        except asyncio.CancelledError:  # the container is already removed (Portal.acall)
            return cancelled
        finally:
            self._runs.discard(task)
        return Done(job=done, node=self._name, node_id=self._node_id)

    def _seal(self, bound: bytes, outcome: Outcome) -> bytes:
        assert self._keys is not None
        return encode(SealedOutcome(sealed=self._keys.seal("outcome", bound, encode(outcome))))

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
