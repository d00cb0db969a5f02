"""Harness mode: run many one-shot jobs, boundedly parallel, within the host's budget.

``run_many`` is what a benchmark harness (or ``sbxkit batch``) wants from sbxkit: hand it a list of
jobs, get one result per job. Each job is one ``run_once`` of a backend (Docker by default), so each
keeps the whole one-shot lifecycle (docs/architecture.md, "The one-shot lifecycle") and removes its
own container through its owner, whatever happens — a timeout, an error, or the caller cancelling
the batch.

Host admission is the owner's, in one place whatever the caller: the supervisor queues each
run until its memory fits the host's budget (docs/operations.md, "Capacity and admission"), and
refuses at once, as that job's error, one that never could. ``run_many`` itself only bounds its
own share (``Admission``, pure):

- at most ``parallel`` jobs are in flight; when the caller names none, a limit that starts at
  ``default_parallel()`` and moves with each window's CPU busy share and throughput, between
  one per core and ``PARALLEL_CAP`` (``pacing.py``: the rule; ``paced.py``: its shell);
- optionally, a budget of the caller's own (``host_memory_bytes``, ``host_cpus``): the summed
  ``limits.memory_bytes`` / ``limits.cpus`` of this batch's jobs in flight stay within it (a
  batch that must leave room for others). Off by default: the supervisor already admits;
- jobs start in input order: the head of the queue waits for room rather than being overtaken
  by smaller jobs behind it, so a large job is never starved;
- a job larger than the caller's own budget could never start: it is refused with a
  ``SpecError`` naming it before anything runs.

Failures are per job: an ``SbxError`` (or any other exception) of one run becomes that job's
error result (the error's class and message), and the batch goes on. A supervisor whose hard
bounds are momentarily used up (``CapacityExhausted``: records or connections, e.g. another
client shares it) is waited for, with backoff, up to ``capacity_wait_s``. Cancelling
``run_many`` cancels every run in flight; each removes its container (shielded) before the
cancellation propagates; jobs not yet started never start.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import msgspec
import trio

from sbxkit._consumers.paced import (
    PARALLEL_CAP,
    PARALLEL_PER_CORE,
    PacedLimit,
    PaceStep,
    Pacing,
    default_parallel,
)
from sbxkit._consumers.pacing import Pacer
from sbxkit._lifecycle.owner import Owner
from sbxkit._model.call_checks import check_stdin
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._util.public import publish
from sbxkit._util.unwrap import plain_async
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerBackend, docker_backend
from sbxkit.engine.client import Engine, engine_or_open
from sbxkit.errors import CapacityExhausted, SpecError
from sbxkit.pool.inprocess import Pool
from sbxkit.pool.shapes import PoolPerShape, open_shape_pools

__all__ = [
    "PARALLEL_CAP",
    "PARALLEL_PER_CORE",
    "Admission",
    "Budget",
    "Job",
    "JobError",
    "JobId",
    "JobResult",
    "Need",
    "PaceStep",
    "Pacing",
    "default_parallel",
    "need_of",
    "run_many",
]

JobId = str | int
"""A job's identity in the caller's terms (unique within one batch)."""

CAPACITY_WAIT_S = 60.0
"""How long a job waits, in total, for a supervisor that refuses it as full."""
_CAPACITY_BACKOFF_S = (0.05, 1.0)


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One sandboxed run of a batch."""

    id: JobId
    spec: SandboxSpec | CheckedSpec
    """A ``CheckedSpec`` (``sbxkit batch`` checks every line first) is not validated again."""
    stdin: bytes | None = None


class JobError(msgspec.Struct, frozen=True, kw_only=True):
    """Why a job has no ``RunResult``: the exception's class name and message.

    ``container_id`` and ``lease`` are set when the error carried them (a cleanup failure
    keeps its lease for recovery: ``sbxkit leases``)."""

    type: str
    message: str
    container_id: str | None = None
    lease: str | None = None
    field: str | None = None
    """The spec field a refusal names (``SpecError``), else None."""


class JobResult(msgspec.Struct, frozen=True, kw_only=True):
    """One job's outcome: exactly one of ``result`` and ``error`` is set.

    ``started_at`` (admission) and ``finished_at`` (the run returned, its container removed)
    are ``trio.current_time()`` readings: compare them with each other, not with wall time.
    ``queued_s`` is the wait for admission since ``run_many`` began.
    """

    id: JobId
    result: RunResult | None = None
    error: JobError | None = None
    queued_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    node: str | None = None
    """On a cluster (``cluster=``): the name of the node the attempt ran on; None locally."""
    attempt: int = 1
    """On a cluster: which attempt of the job this is (a lost attempt is retried)."""
    lost: bool = False
    """On a cluster: the attempt's node (or its agent) was lost mid-run and the job goes to
    another attempt. Only ``on_result`` hears about lost attempts; ``run_many`` returns each
    job's final result."""

    @property
    def ok(self) -> bool:
        """The payload ran and exited 0."""
        return self.result is not None and self.result.ok

    @property
    def elapsed_s(self) -> float:
        return self.finished_at - self.started_at


# --- admission (pure) ----------------------------------------------------------------------------


class Need(msgspec.Struct, frozen=True):
    """What one job reserves while in flight: memory bytes and CPU in nano-CPUs (1e9 = 1)."""

    memory_bytes: int
    nano_cpus: int


class Budget(msgspec.Struct, frozen=True):
    """The host's capacity. None on an axis means that axis is not bounded."""

    memory_bytes: int | None
    nano_cpus: int | None


def need_of(spec: SandboxSpec | CheckedSpec) -> Need:
    """A spec's reservation. Absent or malformed limits count as 0 here: the run refuses them
    itself (SpecError, as that job's error result) before anything is created."""
    if isinstance(spec, CheckedSpec):
        spec = spec.spec
    memory = spec.limits.memory_bytes
    cpus = spec.limits.cpus
    memory_bytes = memory if isinstance(memory, int) and not isinstance(memory, bool) else 0
    nano_cpus = (
        round(cpus * 1e9)
        if isinstance(cpus, int | float) and not isinstance(cpus, bool) and math.isfinite(cpus)
        else 0
    )
    return Need(max(memory_bytes, 0), max(nano_cpus, 0))


class Admission:
    """Who may start now: in-flight count and summed reservations against the budget.

    Pure bookkeeping, no I/O and no waiting; the caller asks ``admit`` in queue order and calls
    ``release`` when a job has finished (its container removed).
    """

    def __init__(self, parallel: int, budget: Budget) -> None:
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise SpecError("parallel", f"must be an integer >= 1, got {parallel!r}")
        self.parallel = parallel
        self.budget = budget
        self.in_flight = 0
        self.memory_in_use = 0
        self.nano_cpus_in_use = 0

    def check(self, job_id: JobId, need: Need) -> None:
        """Refuse a job that could never start, even on an idle host."""
        memory, cpus = self.budget.memory_bytes, self.budget.nano_cpus
        if memory is not None and need.memory_bytes > memory:
            raise SpecError(
                f"job {job_id!r}: limits.memory_bytes",
                f"{need.memory_bytes} exceeds the batch's memory budget of {memory} bytes; "
                "it could never start",
            )
        if cpus is not None and need.nano_cpus > cpus:
            raise SpecError(
                f"job {job_id!r}: limits.cpus",
                f"{need.nano_cpus / 1e9:g} exceeds the batch's CPU budget of "
                f"{cpus / 1e9:g}; it could never start",
            )

    def fits(self, need: Need) -> bool:
        memory, cpus = self.budget.memory_bytes, self.budget.nano_cpus
        return (
            self.in_flight < self.parallel
            and (memory is None or self.memory_in_use + need.memory_bytes <= memory)
            and (cpus is None or self.nano_cpus_in_use + need.nano_cpus <= cpus)
        )

    def admit(self, need: Need) -> bool:
        """Reserve ``need`` and return True if it fits now; otherwise change nothing."""
        if not self.fits(need):
            return False
        self.in_flight += 1
        self.memory_in_use += need.memory_bytes
        self.nano_cpus_in_use += need.nano_cpus
        return True

    def release(self, need: Need) -> None:
        """Return an admitted job's reservation."""
        if self.in_flight < 1:
            raise RuntimeError("release without a matching admit")
        self.in_flight -= 1
        self.memory_in_use -= need.memory_bytes
        self.nano_cpus_in_use -= need.nano_cpus


# --- the I/O shell -------------------------------------------------------------------------------

OwnerFactory = Callable[[Engine], Owner]
ResultCallback = Callable[[JobResult], object]
StartCallback = Callable[[JobId], object]
JobRunner = Callable[[int, Job, Backend], Awaitable[RunResult]]
"""Runs job ``index`` once: cold on the given backend, or claimed from a pool."""


@dataclass(frozen=True, kw_only=True)
class ClusterBatch:
    """What ``run_many`` hands a cluster whole: the jobs, each one's need, and its terms."""

    jobs: Sequence[Job]
    needs: Sequence[Need]
    parallel: int
    on_result: ResultCallback | None
    on_start: StartCallback | None
    settings: Settings | None
    capacity_wait_s: float


class ClusterRunner(Protocol):
    """Where ``run_many(cluster=...)`` sends a batch: ``sbxkit.RayCluster`` (sbxkit/cluster/),
    which runs each job on a node of its cluster through that node's own supervisor."""

    async def run_jobs(self, batch: ClusterBatch) -> list[JobResult]: ...


def _error_of(exc: BaseException) -> JobError:
    container_id = getattr(exc, "container_id", None)
    lease = getattr(exc, "lease", None)
    field = getattr(exc, "field", None)
    return JobError(
        type=type(exc).__name__,
        message=str(exc),
        container_id=container_id if isinstance(container_id, str) else None,
        lease=lease if isinstance(lease, str) else None,
        field=field if isinstance(field, str) else None,
    )


def caller_budget(host_memory_bytes: int | None, host_cpus: float | None) -> Budget:
    """The caller's own cap on this batch, or no cap (None) on an axis not given."""
    if host_memory_bytes is not None and (
        isinstance(host_memory_bytes, bool)
        or not isinstance(host_memory_bytes, int)
        or host_memory_bytes <= 0
    ):
        raise SpecError("host_memory_bytes", "must be a positive integer")
    if host_cpus is not None and (
        isinstance(host_cpus, bool)
        or not isinstance(host_cpus, int | float)
        or not math.isfinite(host_cpus)
        or host_cpus <= 0
    ):
        raise SpecError("host_cpus", "must be a finite number > 0")
    return Budget(
        memory_bytes=host_memory_bytes,
        nano_cpus=None if host_cpus is None else round(host_cpus * 1e9),
    )


async def _run_job(
    backend: Backend, index: int, job: Job, capacity_wait_s: float, runner: JobRunner
) -> RunResult:
    """One run; a supervisor that is full is retried with backoff (nothing was created)."""
    delay, ceiling = _CAPACITY_BACKOFF_S
    deadline = trio.current_time() + capacity_wait_s
    while True:
        try:
            return await runner(index, job, backend)
        except CapacityExhausted:
            if trio.current_time() + delay > deadline:
                raise
        await trio.sleep(delay)
        delay = min(delay * 2, ceiling)


def _unchanged(parallel: int) -> None:
    pass


async def _cold(index: int, job: Job, backend: Backend) -> RunResult:
    return await backend.run_once(job.spec, job.stdin)


@asynccontextmanager
async def _job_runner(
    pool: Pool | PoolPerShape | None,
    pool_backend: Callable[[], Backend],
    jobs: Sequence[Job],
    parallel: int,
) -> AsyncIterator[tuple[JobRunner, Callable[[int], None]]]:
    """How the batch runs a job: cold, from the caller's pool, or from a pool per shape
    opened (and closed) here; and what follows a new in-flight limit (the pools per shape
    park no more than it)."""
    if pool is None:
        yield _cold, _unchanged
        return
    if isinstance(pool, Pool):
        # The pool parks no more than this batch's jobs still to claim (Pool.batch).
        with pool.batch([job.spec for job in jobs]) as batch:

            async def claim(index: int, job: Job, backend: Backend) -> RunResult:
                return await batch.run(index, job.spec, job.stdin)

            yield claim, _unchanged
        return
    backend = pool_backend()
    assert isinstance(backend, DockerBackend)  # run_many refused any other
    specs = [job.spec for job in jobs]
    async with open_shape_pools(backend, specs, parallel=parallel, options=pool) as pools:

        async def claim_by_shape(index: int, job: Job, backend: Backend) -> RunResult:
            return await pools.run(index, job.spec, job.stdin, backend)

        yield claim_by_shape, pools.set_parallel


@plain_async  # its nursery's errors (and Ctrl-C) leave as themselves, not as a group
async def run_many(
    jobs: Iterable[Job],
    *,
    parallel: int | None = None,
    host_memory_bytes: int | None = None,
    host_cpus: float | None = None,
    engine: Engine | None = None,
    owner_factory: OwnerFactory | None = None,
    on_result: ResultCallback | None = None,
    settings: Settings | None = None,
    socket_path: str | None = None,
    capacity_wait_s: float = CAPACITY_WAIT_S,
    on_start: StartCallback | None = None,
    backend: Backend | None = None,
    pool: Pool | PoolPerShape | None = None,
    cluster: ClusterRunner | None = None,
    ahead: int | None = None,
    pacing: Pacing | None = None,
) -> list[JobResult]:
    """Run every job once, at most ``parallel`` at a time (and within ``host_memory_bytes`` /
    ``host_cpus`` of summed limits, when given: this batch's own share of the host).
    ``parallel`` None: a limit that starts at ``default_parallel()``, from the host's cores,
    and moves with the host's CPU busy share and the batch's throughput, window by window
    (sbxkit/_consumers/pacing.py; ``pacing`` injects the CPU reading, bounds the limit and
    hears each move). ``parallel`` is required with ``cluster``, whose nodes' cores are not
    this host's; a ``parallel`` given is the limit for the whole batch.

    Returns one ``JobResult`` per job, in input order; ``on_result`` (synchronous) is called
    with each as it completes, ``on_start`` with a job's id as the batch starts it.
    ``owner_factory(engine)`` makes each run's owner (default: the
    runner's, the supervisor). The engine is opened for the batch when not given.
    ``backend`` runs the jobs elsewhere (a ``DockerBackend`` you configured, or the sbx
    runtime), instead of ``engine``, ``owner_factory``, ``settings`` and ``socket_path``.
    ``pool`` runs each job in a pre-started container of its shape when one is parked, cold
    otherwise (``RunResult.pooled`` says which): a ``PoolPerShape`` opens a pool per shape of
    the batch for the batch, sized for the jobs still to start, never more than ``parallel``
    parked in all (docs/pool.md); a ``Pool`` you opened (``sbxkit.open_pool``) serves its one
    shape, parking no more than the batch's jobs still to claim (``Pool.batch``). A removal
    of a parked container that failed is raised when the batch ends.
    ``cluster`` (``sbxkit.RayCluster``) runs the batch on a Ray cluster instead, each job on a
    node whose own supervisor admits and removes it (docs/cluster.md); ``parallel`` then bounds
    the jobs in flight across the cluster, and the local engine options do not apply.
    ``ahead`` starts no job more than ``ahead`` places after the earliest job still running
    (``sbxkit batch --order input``: what waits for an earlier job is bounded); None: no such
    bound. Local batches only.

    Raises ``SpecError`` before anything runs for a bad ``parallel`` or budget, duplicate job
    ids, or a job larger than the caller's own budget. Host admission (the memory budget, live
    sandboxes, launches in flight) is the supervisor's: a run waits there for its turn. An
    exception from ``on_result`` stops the batch
    (the runs in flight are cancelled and removed) and is re-raised unchanged. Cancellation is
    honoured: every container in flight is removed by its run before it propagates.

    Under ``trio.run``, Ctrl-C arrives as ``KeyboardInterrupt`` wherever the code happens to
    be, possibly inside a run's cleanup; turn SIGINT into cancellation instead
    (``trio.open_signal_receiver``, as ``sbxkit batch`` does) so every removal completes.
    """
    job_list = list(jobs)
    if capacity_wait_s < 0 or not math.isfinite(capacity_wait_s):
        raise SpecError("capacity_wait_s", "must be a finite number >= 0")
    seen: dict[JobId, int] = {}
    for index, job in enumerate(job_list):
        if not isinstance(job, Job):
            raise SpecError(f"jobs[{index}]", f"must be a Job, got {type(job).__name__}")
        check_stdin(job.stdin, f"jobs[{index}].stdin")
        if job.id in seen:
            raise SpecError(f"jobs[{index}].id", f"{job.id!r} repeats jobs[{seen[job.id]}].id")
        seen[job.id] = index
    if ahead is not None and ahead < 1:
        raise SpecError("ahead", f"must be at least 1, got {ahead}")
    if cluster is not None:
        _refuse_beside_cluster(
            ahead=ahead,
            engine=engine,
            owner_factory=owner_factory,
            socket_path=socket_path,
            backend=backend,
            pool=pool,
            host_memory_bytes=host_memory_bytes,
            host_cpus=host_cpus,
        )
    pacer: Pacer | None = None
    if parallel is None:
        if cluster is not None:
            reason = "give it with cluster=: this host's cores say nothing of the cluster's"
            raise SpecError("parallel", reason)
        pacer = (pacing if pacing is not None else Pacing()).pacer()
        parallel = pacer.limit
    elif pacing is not None:
        raise SpecError("pacing", "adapts a batch without parallel; a parallel given is fixed")
    admission = Admission(parallel, caller_budget(host_memory_bytes, host_cpus))
    if isinstance(pool, PoolPerShape):
        pool.check()
        if backend is not None and not isinstance(backend, DockerBackend):
            raise SpecError("pool", f"pre-started sandboxes need Docker, not {backend.kind!r}")
    elif pool is not None and not isinstance(pool, Pool):
        raise SpecError("pool", f"must be a PoolPerShape or a Pool, got {type(pool).__name__}")
    needs = [need_of(job.spec) for job in job_list]
    for job, need in zip(job_list, needs, strict=True):
        admission.check(job.id, need)
    if cluster is not None:
        batch = ClusterBatch(
            jobs=job_list,
            needs=needs,
            parallel=parallel,
            on_result=on_result,
            on_start=on_start,
            settings=settings,
            capacity_wait_s=capacity_wait_s,
        )
        return await cluster.run_jobs(batch)

    async def dispatch(backend_for_job: Callable[[], Backend]) -> list[JobResult]:
        async with _job_runner(pool, backend_for_job, job_list, admission.parallel) as (
            runner,
            resize,
        ):

            def set_limit(limit: int) -> None:
                admission.parallel = limit
                resize(limit)  # the pools per shape park for the limit in force

            pace = (
                None
                if pacer is None
                else PacedLimit(pacer, pacing if pacing is not None else Pacing(), set_limit)
            )
            return await _dispatch(
                backend_for_job,
                job_list,
                needs,
                admission,
                on_result,
                capacity_wait_s,
                on_start,
                runner,
                ahead,
                pace,
            )

    if backend is not None:
        docker_backend(backend, engine=engine, settings=settings, socket_path=socket_path)
        if owner_factory is not None:
            raise SpecError("backend", "give owner_factory's owner to the backend, not beside it")
        return await dispatch(lambda: backend)
    async with engine_or_open(engine, socket_path) as eng:

        def backend_for_job() -> Backend:
            owner = owner_factory(eng) if owner_factory is not None else None
            # A job's slot (and its share of a caller's budget) frees once its container is
            # gone, not at the payload's exit: ``parallel`` bounds containers that exist.
            return DockerBackend(engine=eng, owner=owner, settings=settings, wait_for_removal=True)

        return await dispatch(backend_for_job)


def _refuse_beside_cluster(**options: object) -> None:
    """A cluster batch runs on each node's own engine and supervisor: the local options have
    nothing to apply to."""
    given = sorted(name for name, value in options.items() if value is not None)
    if given:
        raise SpecError(
            "cluster",
            f"runs each job on a node's own engine and supervisor; {', '.join(given)} "
            "cannot be given with it",
        )


async def _dispatch(
    backend_for_job: Callable[[], Backend],
    jobs: Sequence[Job],
    needs: Sequence[Need],
    admission: Admission,
    on_result: ResultCallback | None,
    capacity_wait_s: float,
    on_start: StartCallback | None,
    runner: JobRunner,
    ahead: int | None = None,
    pace: PacedLimit | None = None,
) -> list[JobResult]:
    results: list[JobResult | None] = [None] * len(jobs)
    earliest = [0]  # the first index without a result
    begun = trio.current_time()
    freed = [trio.Event()]
    dispatched = [0]  # jobs the dispatcher has started
    callback_error: list[BaseException] = []

    def wake() -> None:
        freed[0].set()
        freed[0] = trio.Event()

    async with trio.open_nursery() as nursery:

        async def work(index: int, job: Job, need: Need, started: float) -> None:
            try:
                try:
                    outcome = await _run_job(backend_for_job(), index, job, capacity_wait_s, runner)
                except Exception as exc:  # one job's failure is its result, not the batch's
                    finished = trio.current_time()
                    done = JobResult(id=job.id, error=_error_of(exc))
                else:
                    finished = trio.current_time()
                    done = JobResult(id=job.id, result=outcome)
            finally:
                admission.release(need)
                wake()
            done = msgspec.structs.replace(
                done, queued_s=started - begun, started_at=started, finished_at=finished
            )
            results[index] = done
            while earliest[0] < len(results) and results[earliest[0]] is not None:
                earliest[0] += 1
            try:
                if pace is not None and pace.job_done(queue_left=dispatched[0] < len(jobs)):
                    wake()  # a higher limit: the head of the queue may start now
                if on_result is not None:
                    on_result(done)
            except Exception as exc:
                callback_error.append(exc)
                nursery.cancel_scope.cancel()

        for index, (job, need) in enumerate(zip(jobs, needs, strict=True)):
            while ahead is not None and index - earliest[0] >= ahead:
                await freed[0].wait()
            while not admission.admit(need):
                await freed[0].wait()
            dispatched[0] += 1
            if on_start is not None:
                on_start(job.id)
            nursery.start_soon(work, index, job, need, trio.current_time())
    if callback_error:
        raise callback_error[0]
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


publish(__name__, globals())  # public names show as sbxkit.NAME
