"""A job's relay task: what Ray places by resources, handing the job to its node's agent.

Ray places tasks, not actor calls, by resources: each job is one task asking for a sandbox and
its memory (``resources.job_resources``), so Ray puts it on a node whose advertised budget has
room. Wherever it lands, the task hands the job to that node's agent and waits for the outcome,
holding the resources for the run. It never runs a sandbox itself.
"""

from __future__ import annotations

import os
from typing import Any

from sbxkit.cluster.wire import AgentLost, NotAccepted, encode


def relay(job: bytes, agents: dict[str, Any]) -> bytes:
    """Run ``job`` through the agent of the node this task runs on (``agents``: node id → the
    agent's actor handle). Returns the agent's outcome, ``AgentLost`` if it died meanwhile,
    or ``NotAccepted`` when this node has no accepted agent (nothing ran)."""
    import ray  # runs in a Ray worker

    node_id = ray.get_runtime_context().get_node_id()
    agent = agents.get(node_id)
    if agent is None:
        return encode(NotAccepted(node_id=node_id))
    call = agent.run.remote(job, os.getpid())
    try:
        outcome: bytes = ray.get(call)
    except ray.exceptions.RayActorError as exc:
        return encode(AgentLost(node_id=node_id, reason=_first_line(exc)))
    except BaseException:  # cancelled (KeyboardInterrupt, TaskCancelledError): the run too
        ray.cancel(call)
        raise
    return outcome


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
