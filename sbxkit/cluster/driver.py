"""The driver's side of a cluster batch (``run_many(jobs, cluster=RayCluster(...))``).

Who decides what (docs/cluster.md): Ray decides membership (which nodes are alive), placement
(which node runs a job: the relay task's resources against what each node advertises) and
failure detection (a dead node or actor fails its tasks). sbxkit decides which nodes may join
(``join.judge``), admits, hardens and removes every sandbox on its node (the agent and that
node's supervisor), and keeps the batch's account: every attempt ends in exactly one outcome,
a lost one is retried up to ``retries`` times (``dispatch.Dispatch``).

Before anything of the batch is sent, the driver asks the cluster whether it enforces Ray's
token authentication (``rayauth``) and refuses it otherwise, and loads the cluster secret
(``secret``): every job crosses Ray sealed, every report and outcome is believed only if it
opens with the batch's keys (``seal``).

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

from sbxkit._consumers.harness import ClusterBatch, Job, JobError, JobResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec
from sbxkit._plan.plan import CheckedSpec, check_spec, effective_settings
from sbxkit.cluster.dispatch import Dispatch
from sbxkit.cluster.membership import Membership
from sbxkit.cluster.options import ClusterOptions
from sbxkit.cluster.rayauth import HOW_TO, cluster_enforces_token_auth
from sbxkit.cluster.relay import relay
from sbxkit.cluster.resources import RELAY_CPUS, fits, job_resources
from sbxkit.cluster.seal import Forged, Keys, context, new_batch_id
from sbxkit.cluster.secret import load_secret
from sbxkit.cluster.wire import (
    AgentLost,
    AgentTerms,
    Cancelled,
    Done,
    NotAccepted,
    Outcome,
    RemoteJob,
    SealedOutcome,
    decode_outcome,
    decode_reply,
    encode,
)
from sbxkit.errors import (
    ClusterUnauthenticated,
    ClusterUnavailable,
    ImageError,
    SbxError,
    SpecError,
)

CLEANUP_BUDGET_S = 60.0
"""How long the end of a batch may take: the agents' removals, then Ray's own shutdown."""
NODE_ID = re.compile(r"node ID: ([0-9a-f]{16,})")
NEVER_PULLS = "sbxkit never pulls images (load it on the nodes first)"
UNVERIFIED_TRIES = 3
"""Outcomes that do not verify one job may get back before it ends with an error."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise SpecError(
            "cluster",
            f"needs Ray, which is not installed ({exc}): pip install '.[ray]' in the sbxkit clone",
        ) from None
    return ray


async def run_on_cluster(options: ClusterOptions, work: ClusterBatch) -> list[JobResult]:
    ray = import_ray()
    keys = Keys(load_secret(), new_batch_id())  # refused by name before Ray is asked anything
    batch_settings = effective_settings(work.settings)
    specs = [_spec_or_error(job, batch_settings) for job in work.jobs]
    images = sorted({spec.image for spec in specs if isinstance(spec, SandboxSpec)})
    terms = AgentTerms(
        batch_id=keys.batch_id, labels=batch_settings.labels, capacity_wait_s=work.capacity_wait_s
    )
    initialized_here = await trio.to_thread.run_sync(_connect, ray, options)
    membership = Membership(ray, options, encode(terms), images, keys)
    batch = _Batch(ray, options, work, specs, membership, keys)
    try:
        await _refuse_unauthenticated(ray, options)
        async with trio.open_nursery() as nursery:  # the joins, for the whole batch
            await membership.start(nursery)
            results = await batch.run()
            nursery.cancel_scope.cancel()
        return results
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
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        refusal = _authentication_error(ray, exc)
        if refusal is not None:
            raise ClusterUnauthenticated(
                options.address,
                f"refused this driver's credentials ({refusal}): the cluster enforces token "
                "authentication; run the driver with RAY_AUTH_MODE=token and the cluster's "
                "token (RAY_AUTH_TOKEN_PATH=FILE or RAY_AUTH_TOKEN); docs/cluster.md",
            ) from None
        raise ClusterUnavailable(options.address, f"cannot connect: {exc}") from None
    return True


def _authentication_error(ray: Any, exc: BaseException | None) -> str | None:
    """What of ``exc`` says the cluster refused this driver's credentials, or None. ray.init
    wraps Ray's AuthenticationError, at times only as the text of a traceback it carries."""
    while exc is not None:
        if isinstance(exc, ray.exceptions.AuthenticationError):
            text = str(exc).strip()
            return (text.splitlines()[0] if text else type(exc).__name__)[:200]
        for line in str(exc).splitlines():
            if "AuthenticationError" in line or "InvalidAuthToken" in line:
                return line.strip()[:200]
        exc = exc.__cause__ or exc.__context__
    return None


async def _refuse_unauthenticated(ray: Any, options: ClusterOptions) -> None:
    """Raise ClusterUnauthenticated unless the cluster's GCS refuses a caller without its
    token (asked of the cluster itself, ``rayauth``)."""
    gcs = ray.get_runtime_context().gcs_address
    enforced = await cluster_enforces_token_auth(gcs)
    if enforced is True:
        return
    if enforced is False:
        raise ClusterUnauthenticated(
            options.address,
            f"does not enforce token authentication (its GCS at {gcs} answered a caller "
            "without a token): any account or network peer that reaches it can join and run "
            f"code on every node as the node's user; nothing was sent. To turn it on: {HOW_TO}",
        )
    raise ClusterUnauthenticated(
        options.address,
        f"could not be asked whether it enforces token authentication ({enforced}); nothing "
        "was sent",
    )


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
        work: ClusterBatch,
        specs: Sequence[SandboxSpec | JobError],
        membership: Membership,
        keys: Keys,
    ) -> None:
        self.ray, self.options, self.keys, self.membership = ray, options, keys, membership
        self.jobs, self.needs, self.specs = work.jobs, work.needs, specs
        self.on_result, self.on_start = work.on_result, work.on_start
        self.unverified = [0] * len(self.jobs)
        previous = [options.previous_attempts.get(job.id, 0) for job in self.jobs]
        self.dispatch = Dispatch(
            len(self.jobs), parallel=work.parallel, retries=options.retries, previous=previous
        )
        self.results: list[JobResult | None] = [None] * len(self.jobs)
        self.in_flight: dict[int, Any] = {}  # index → the relay's ObjectRef
        self.started: dict[int, float] = {}
        self.began = trio.current_time()
        self.relay = ray.remote(num_cpus=RELAY_CPUS, max_retries=0)(relay)

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
        if self.membership.stale:
            return  # an unknown node answered: not before the refresh has excluded it
        while (index := self.dispatch.next(self.membership.capacity)) is not None:
            spec = self.specs[index]
            assert isinstance(spec, SandboxSpec)
            asked = job_resources(self.needs[index])
            if not fits(asked, self.membership.largest):
                self._refuse(
                    index,
                    "NeverFits",
                    f"no accepted node can hold it: it asks {asked}, the largest node offers "
                    f"{self.membership.largest}",
                )
                continue
            lacking = self.membership.lacking(spec.image)
            if lacking and len(lacking) == len(self.membership.accepted):
                self._refuse(  # as a local batch says it, naming the cluster
                    index,
                    "ImageError",
                    str(ImageError(spec.image, f"not present on any accepted node; {NEVER_PULLS}")),
                )
                continue
            job = self.jobs[index]
            attempt = self.dispatch.attempt(index)
            payload = encode(RemoteJob(id=job.id, spec=spec, stdin=job.stdin, attempt=attempt))
            sealed = self.keys.seal("job", context(index, attempt), payload)
            placement: dict[str, Any] = {"resources": asked, "scheduling_strategy": "SPREAD"}
            if self.membership.excluded or lacking:
                excluded = ",".join(sorted(self.membership.excluded | lacking))
                placement["label_selector"] = {"ray.io/node-id": f"!in({excluded})"}
            ref = self.relay.options(**placement).remote(
                self.keys.batch_id, index, attempt, sealed, self.membership.agents
            )
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
            outcome = self._opened(index, future.result())
        except self.ray.exceptions.TaskCancelledError:
            self._lost(index, "the relay task was cancelled", None)
            return
        except Exception as exc:  # Ray says the task (or its node) failed
            node_id = _node_id_of(exc)
            if node_id is not None:
                self.membership.node_lost(node_id)
            self._lost(index, _describe(exc), self.membership.name_of(node_id))
            return
        if isinstance(outcome, str):
            self._unverified(index, outcome)
        elif isinstance(outcome, Done):
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

    def _opened(self, index: int, data: bytes) -> Outcome | str:
        """The relay's reply opened with the batch's outcome key, or why it does not open."""
        try:
            reply = decode_reply(data)
        except msgspec.DecodeError:
            return "a reply that is not sbxkit's"
        if not isinstance(reply, SealedOutcome):
            return f"an unsealed reply ({reply.reason[:200]})"
        bound = context(index, self.dispatch.attempt(index))
        try:
            return decode_outcome(self.keys.open("outcome", bound, reply.sealed))
        except (Forged, msgspec.DecodeError):
            return "an outcome that does not verify against the cluster secret"

    def _unverified(self, index: int, what: str) -> None:
        """Not from an agent holding the secret: whichever node sent it ran nothing of this
        batch (it could not open the job), so the attempt does not count; the job goes back
        to the queue, and relays wait until the node is excluded."""
        self.membership.unverified()
        self.unverified[index] += 1
        if self.unverified[index] < UNVERIFIED_TRIES:
            self.dispatch.not_placed(index)
            return
        self._refuse(
            index,
            "Unverified",
            f"{UNVERIFIED_TRIES} attempts came back with {what}; a node without the cluster "
            "secret took them",
        )

    def _refuse(self, index: int, kind: str, message: str) -> None:
        """The job ends here with an error of the driver's own (no node ran it to an end)."""
        self.dispatch.finished(index)
        error = JobError(type=kind, message=message)
        attempt = self.dispatch.attempt(index)
        self._end(index, JobResult(id=self.jobs[index].id, error=error, attempt=attempt))

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
