"""A job's relay task: what Ray places by resources, handing the job to its node's agent.

Ray places tasks, not actor calls, by resources: each job is one task asking for a sandbox and
its memory (``resources.job_resources``), so Ray puts it on a node whose advertised budget has
room. Wherever it lands, the task hands the job to that node's agent and waits for the outcome,
holding the resources for the run. It never runs a sandbox itself, and never sees the job in
the clear: it carries the job sealed (``seal.py``) and returns the agent's sealed outcome. What
it says itself (no agent here, the agent died) it seals with its node's cluster secret; without
one, it says so unsealed, which the driver only takes as "not run here".

It waits for the agent through the call's future, not ``ray.get``: a task blocked in
``ray.get`` gives its CPU back to the node, and Ray then starts one more worker process for the
next relay; holding the CPU (``resources.RELAY_CPUS``) is what bounds a node's relays, and so its
Ray workers, by its CPUs.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any

from sbxkit.cluster.seal import Keys, context
from sbxkit.cluster.secret import load_secret
from sbxkit.cluster.wire import AgentLost, NotAccepted, Outcome, SealedOutcome, Unsealed, encode
from sbxkit.errors import SbxError

POLL_S = 0.2


def relay(
    batch_id: bytes, index: int, attempt: int, sealed_job: bytes, agents: dict[str, Any]
) -> bytes:
    """Run attempt ``attempt`` of job ``index`` (``sealed_job``) through the agent of the node
    this task runs on (``agents``: node id → the agent's actor handle). Returns the agent's
    sealed outcome, ``AgentLost`` if it died meanwhile, or ``NotAccepted`` when this node has no
    accepted agent (nothing ran)."""
    import ray  # runs in a Ray worker

    node_id = ray.get_runtime_context().get_node_id()
    agent = agents.get(node_id)
    if agent is None:
        return _reply(batch_id, index, attempt, NotAccepted(node_id=node_id))
    call = agent.run.remote(index, attempt, sealed_job, os.getpid())
    try:
        outcome = _wait(call)
    except ray.exceptions.RayActorError as exc:
        lost = AgentLost(node_id=node_id, reason=_first_line(exc))
        return _reply(batch_id, index, attempt, lost)
    except BaseException:  # cancelled (KeyboardInterrupt, TaskCancelledError): the run too
        ray.cancel(call)
        raise
    return outcome


def _wait(call: Any) -> bytes:
    """The call's result, polled so that a cancellation (Ray interrupts the main thread)
    is seen within ``POLL_S``; never ``ray.get``, which would release the relay's CPU."""
    future: concurrent.futures.Future[bytes] = call.future()
    while True:
        try:
            return future.result(timeout=POLL_S)
        except concurrent.futures.TimeoutError:
            continue


def _reply(batch_id: bytes, index: int, attempt: int, outcome: Outcome) -> bytes:
    try:
        keys = _keys(batch_id)
    except SbxError as exc:
        return encode(Unsealed(reason=f"{type(outcome).__name__}, unsealed: {exc}"))
    sealed = keys.seal("outcome", context(index, attempt), encode(outcome))
    return encode(SealedOutcome(sealed=sealed))


@functools.lru_cache(maxsize=4)
def _keys(batch_id: bytes) -> Keys:
    """This node's keys for the batch (a Ray worker runs many relays of one batch)."""
    return Keys(load_secret(), batch_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
