"""The driver's side of a cluster batch (``run_many(jobs, cluster=RayCluster(...))``).

Who decides what (docs/cluster.md): Ray decides membership (which nodes are alive), placement
(which node runs a job: the relay task's resources against what each node advertises) and
failure detection (a dead node or actor fails its tasks). sbxkit decides which nodes may join
(``join.judge``), admits, hardens and removes every sandbox on its node (the agent and that
node's supervisor), and keeps the batch's account: every attempt ends in exactly one outcome,
a lost one is retried up to ``retries`` times (``dispatch.Dispatch``).

The I/O shell: Ray's blocking calls run in worker threads, each relay's completion comes back
through its ``ObjectRef.future()`` into the trio loop. However the batch ends — done, failed,
cancelled (Ctrl-C) — the agents are told to cancel their runs and wait for their removals
first, then the relay tasks are cancelled and the agents stopped (shielded, time-bounded).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import trio

from sbxkit.cluster.dispatch import Dispatch
from sbxkit.cluster.membership import Membership
from sbxkit.cluster.options import ClusterOptions, ClusterUnavailable
from sbxkit.cluster.relay import relay
from sbxkit.cluster.resources import fits, job_resources
from sbxkit.cluster.wire import (
    AgentLost,
    AgentTerms,
    Cancelled,
    Done,
    NotAccepted,
    RemoteJob,
    decode_outcome,
    encode,
)
from sbxkit.errors import SbxError, SpecError
from sbxkit.harness import Job, JobError, JobResult, Need, ResultCallback, StartCallback
from sbxkit.plan import CheckedSpec, check_spec, effective_settings
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec

CLEANUP_BUDGET_S = 60.0
"""How long the end of a batch may take: the agents' removals, then Ray's own shutdown."""
NODE_ID = re.compile(r"node ID: ([0-9a-f]{16,})")


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise SpecError(
            "cluster", f"needs Ray, which is not installed ({exc}): pip install 'sbxkit[ray]'"
        ) from None
    return ray


async def run_on_cluster(
    options: ClusterOptions,
    jobs: Sequence[Job],
    needs: Sequence[Need],
    *,
    parallel: int,
    on_result: ResultCallback | None,
    on_start: StartCallback | None,
    settings: Settings | None,
    capacity_wait_s: float,
) -> list[JobResult]:
    ray = import_ray()
    batch_settings = effective_settings(settings)
    specs = [_spec_or_error(job, batch_settings) for job in jobs]
    images = sorted({spec.image for spec in specs if isinstance(spec, SandboxSpec)})
    terms = AgentTerms(
        settings=msgspec.structs.replace(
            batch_settings, supervisor_state_dir=None, supervisor_command=None
        ),
        capacity_wait_s=capacity_wait_s,
    )
    initialized_here = await trio.to_thread.run_sync(_connect, ray, options)
    membership = Membership(ray, options, encode(terms), images)
    batch = _Batch(ray, options, jobs, needs, specs, parallel, membership, on_result, on_start)
    try:
        await membership.start()
        return await batch.run()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_BUDGET_S):
            await batch.stop()
            await membership.stop()
            if initialized_here:
                await trio.to_thread.run_sync(ray.shutdown)


def _connect(ray: Any, options: ClusterOptions) -> bool:
    """Join the cluster as a driver (unless this process already is one); True if we did."""
    if ray.is_initialized():
        return False
    try:
        ray.init(
            address=options.address,
            namespace=options.namespace,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterUnavailable(options.address, f"cannot connect: {exc}") from None
    return True


def _spec_or_error(job: Job, settings: Settings) -> SandboxSpec | JobError:
    """The job's spec checked on the driver (bad input never leaves it), or its error."""
    try:
        checked = check_spec(job.spec, settings)
    except SbxError as exc:
        return JobError(type=type(exc).__name__, message=str(exc))
    assert isinstance(checked, CheckedSpec)
    return checked.spec


class _Batch:
    """The dispatch loop: submit relays as ``Dispatch`` allows, account for each outcome."""

    def __init__(
        self,
        ray: Any,
        options: ClusterOptions,
        jobs: Sequence[Job],
        needs: Sequence[Need],
        specs: Sequence[SandboxSpec | JobError],
        parallel: int,
        membership: Membership,
        on_result: ResultCallback | None,
        on_start: StartCallback | None,
    ) -> None:
        self.ray = ray
        self.options = options
        self.jobs = jobs
        self.needs = needs
        self.specs = specs
        self.membership = membership
        self.on_result = on_result
        self.on_start = on_start
        previous = [options.previous_attempts.get(job.id, 0) for job in jobs]
        self.dispatch = Dispatch(
            len(jobs), parallel=parallel, retries=options.retries, previous=previous
        )
        self.results: list[JobResult | None] = [None] * len(jobs)
        self.in_flight: dict[int, Any] = {}  # index → the relay's ObjectRef
        self.started: dict[int, float] = {}
        self.began = trio.current_time()
        self.relay = ray.remote(num_cpus=0, max_retries=0)(relay)

    async def run(self) -> list[JobResult]:
        send, receive = trio.open_memory_channel[tuple[int, Any, concurrent.futures.Future[Any]]](
            math.inf
        )
        self.token = trio.lowlevel.current_trio_token()
        self.send = send
        for index, spec in enumerate(self.specs):
            if isinstance(spec, JobError):
                self.dispatch.skip(index)
                self._end(index, JobResult(id=self.jobs[index].id, error=spec))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.membership.watch)
            while not self.dispatch.all_ended:
                self._submit_what_fits()
                self.membership.check_not_empty(self.dispatch.waiting + len(self.in_flight))
                with trio.move_on_after(self.membership.poll_s):
                    index, ref, future = await receive.receive()
                    self._handle(index, ref, future)
                    while True:  # everything else already done, before submitting again
                        try:
                            index, ref, future = receive.receive_nowait()
                        except trio.WouldBlock:
                            break
                        self._handle(index, ref, future)
            nursery.cancel_scope.cancel()
        return [result for result in self.results if result is not None]

    # -- submitting ---------------------------------------------------------------------------

    def _submit_what_fits(self) -> None:
        while (index := self.dispatch.next(self.membership.capacity)) is not None:
            spec = self.specs[index]
            assert isinstance(spec, SandboxSpec)
            asked = job_resources(self.needs[index])
            if not fits(asked, self.membership.largest):
                self.dispatch.finished(index)
                self._end(
                    index,
                    JobResult(
                        id=self.jobs[index].id,
                        error=JobError(
                            type="NeverFits",
                            message=f"no accepted node can hold it: it asks {asked}, the "
                            f"largest node offers {self.membership.largest}",
                        ),
                        attempt=self.dispatch.attempt(index),
                    ),
                )
                continue
            job = self.jobs[index]
            payload = encode(
                RemoteJob(
                    id=job.id, spec=spec, stdin=job.stdin, attempt=self.dispatch.attempt(index)
                )
            )
            placement: dict[str, Any] = {"resources": asked, "scheduling_strategy": "SPREAD"}
            if self.membership.excluded:
                excluded = ",".join(sorted(self.membership.excluded))
                placement["label_selector"] = {"ray.io/node-id": f"!in({excluded})"}
            ref = self.relay.options(**placement).remote(payload, self.membership.agents)
            self.in_flight[index] = ref
            self.started[index] = trio.current_time()
            ref.future().add_done_callback(_post_to(self.token, self.send, index, ref))
            if self.on_start is not None:
                self.on_start(job.id)

    # -- outcomes -----------------------------------------------------------------------------

    def _handle(self, index: int, ref: Any, future: concurrent.futures.Future[Any]) -> None:
        if self.in_flight.get(index) is not ref:
            return  # an attempt already accounted for
        del self.in_flight[index]
        try:
            outcome = decode_outcome(future.result())
        except self.ray.exceptions.TaskCancelledError:
            self._lost(index, "the relay task was cancelled", None)
            return
        except Exception as exc:  # Ray says the task (or its node) failed
            node_id = _node_id_of(exc)
            if node_id is not None:
                self.membership.node_lost(node_id)
            self._lost(index, _describe(exc), self.membership.name_of(node_id))
            return
        if isinstance(outcome, Done):
            self.dispatch.finished(index)
            attempt = self.dispatch.attempt(index)
            done = msgspec.structs.replace(outcome.job, node=outcome.node, attempt=attempt)
            self._end(index, done)
        elif isinstance(outcome, AgentLost):
            self.membership.agent_lost(outcome.node_id)
            name = self.membership.name_of(outcome.node_id)
            self._lost(index, f"the agent of node {name} died: {outcome.reason}", name)
        elif isinstance(outcome, NotAccepted):
            self.membership.not_accepted(outcome.node_id)
            self.dispatch.not_placed(index)
        else:
            assert isinstance(outcome, Cancelled)
            self._lost(index, f"node {outcome.node} cancelled the run", outcome.node)

    def _lost(self, index: int, reason: str, node: str | None) -> None:
        attempt = self.dispatch.attempt(index)
        retried = self.dispatch.lost(index)
        message = reason if retried else f"{reason} (retries used up: {self.options.retries})"
        self._end(
            index,
            JobResult(
                id=self.jobs[index].id,
                error=JobError(type="NodeLost", message=message),
                node=node,
                attempt=attempt,
                lost=retried,
            ),
        )

    def _end(self, index: int, done: JobResult) -> None:
        """Stamp the driver's clock on an attempt's outcome and report it."""
        now = trio.current_time()
        started = self.started.pop(index, now)
        done = msgspec.structs.replace(
            done,
            queued_s=started - self.began,
            started_at=started,
            finished_at=now,
        )
        if not done.lost:
            self.results[index] = done
        if self.on_result is not None:
            self.on_result(done)

    # -- stopping -----------------------------------------------------------------------------

    async def stop(self) -> None:
        """Runs still in flight (the batch was cancelled or failed): each agent cancels its
        runs and waits for their removals, then the relay tasks are cancelled."""
        if not self.in_flight:
            return
        await self.membership.cancel_runs()
        refs = list(self.in_flight.values())
        for ref in refs:
            self.ray.cancel(ref)
        await trio.to_thread.run_sync(
            lambda: self.ray.wait(refs, num_returns=len(refs), timeout=10.0)
        )


def _post_to(
    token: trio.lowlevel.TrioToken,
    send: trio.MemorySendChannel[tuple[int, Any, concurrent.futures.Future[Any]]],
    index: int,
    ref: Any,
) -> Callable[[concurrent.futures.Future[Any]], None]:
    """A done-callback (run in Ray's thread) handing the finished future to the trio loop."""

    def done(future: concurrent.futures.Future[Any]) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the batch is over
            token.run_sync_soon(send.send_nowait, (index, ref, future))

    return done


def _node_id_of(exc: BaseException) -> str | None:
    match = NODE_ID.search(str(exc))
    return match.group(1) if match else None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
