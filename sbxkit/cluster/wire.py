"""What crosses Ray between the driver, a job's relay task and a node's agent (pure).

Every message is a msgspec Struct encoded as msgpack bytes, so Ray carries plain bytes and
nothing depends on pickling sbxkit's classes across versions; a node whose sbxkit differs is
refused at join instead (``join.py``). Reports, jobs and outcomes cross sealed (``seal.py``):
only what an agent holding the cluster secret sealed for this batch is believed.
"""

from __future__ import annotations

import msgspec

from sbxkit._consumers.harness import JobId, JobResult
from sbxkit._model.spec import SandboxSpec


class RemoteJob(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One attempt of a job, as the agent receives it."""

    id: JobId
    spec: SandboxSpec
    stdin: bytes | None = None
    attempt: int = 1


class AgentTerms(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a node's agent is started with: the batch's id (its keys' salt), the driver's
    container labels (tags; the node's own win) and how long a job may wait for a supervisor
    whose hard bounds are used up. No policy: what a node allows (bind mounts, named volumes,
    the environment kind, its audit log) is the node's own configuration, never the driver's."""

    batch_id: bytes
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    capacity_wait_s: float


class NodeReport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an agent found on its node when it joined (``join.judge`` decides)."""

    node_id: str
    """Ray's id of the node: how the driver knows which member a lost task or agent was."""
    name: str
    implementation: str
    """The fingerprint of the agent's sbxkit sources: the driver refuses a node whose sbxkit
    differs from its own."""
    engine: str
    """The daemon the node's agent uses (its ``DOCKER_HOST``, else ``(discovered)``)."""
    engine_error: str | None = None
    config_error: str | None = None
    """The node's own configuration (``SBXKIT_NODE_PROFILE``, its environment) is unusable."""
    supervisor_error: str | None = None
    images: dict[str, str | None] = msgspec.field(default_factory=dict)
    """Each image the batch names → its content fingerprint there (None: missing)."""
    supervisor_pid: int | None = None
    agent_pid: int = 0
    challenge: bytes = b""
    """The driver's challenge for this join, echoed (the seal binds it too)."""


class SealedReport(msgspec.Struct, frozen=True, kw_only=True, tag="sealed"):
    """A ``NodeReport`` sealed under the batch's report key, bound to the challenge and the
    node's Ray id."""

    sealed: bytes


class JoinRefused(msgspec.Struct, frozen=True, kw_only=True, tag="refused"):
    """The agent cannot seal a report (its node has no usable cluster secret). Unauthenticated:
    it can only ever make the driver refuse the node."""

    reason: str


JoinReply = SealedReport | JoinRefused


class Done(msgspec.Struct, frozen=True, kw_only=True, tag="done"):
    """The run ended, with a result or an sbxkit error; its container is removed."""

    job: JobResult
    node: str
    node_id: str


class AgentLost(msgspec.Struct, frozen=True, kw_only=True, tag="agent_lost"):
    """The relay saw its node's agent die during the run."""

    node_id: str
    reason: str


class NotAccepted(msgspec.Struct, frozen=True, kw_only=True, tag="not_accepted"):
    """Ray placed the relay on a node that has no accepted agent: nothing ran."""

    node_id: str


class Cancelled(msgspec.Struct, frozen=True, kw_only=True, tag="cancelled"):
    """The batch was cancelled; the run (if it started) removed its container first."""

    node: str
    node_id: str


Outcome = Done | AgentLost | NotAccepted | Cancelled


class SealedOutcome(msgspec.Struct, frozen=True, kw_only=True, tag="sealed"):
    """An ``Outcome`` sealed under the batch's outcome key, bound to the job's index and
    attempt: what an agent (or the relay, on a node holding the secret) returns."""

    sealed: bytes


class Unsealed(msgspec.Struct, frozen=True, kw_only=True, tag="unsealed"):
    """What a relay or agent returns when it cannot seal (no usable secret) or the job it got
    did not open: believed by nobody, it only sends the job back to the queue."""

    reason: str


Reply = SealedOutcome | Unsealed

_ENCODER = msgspec.msgpack.Encoder()
_OUTCOME = msgspec.msgpack.Decoder(Outcome)
_JOB = msgspec.msgpack.Decoder(RemoteJob)
_TERMS = msgspec.msgpack.Decoder(AgentTerms)
_REPORT = msgspec.msgpack.Decoder(NodeReport)
_JOIN_REPLY = msgspec.msgpack.Decoder(JoinReply)
_REPLY = msgspec.msgpack.Decoder(Reply)

Message = RemoteJob | AgentTerms | NodeReport | JoinReply | Outcome | Reply


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode_outcome(data: bytes) -> Outcome:
    return _OUTCOME.decode(data)


def decode_job(data: bytes) -> RemoteJob:
    return _JOB.decode(data)


def decode_terms(data: bytes) -> AgentTerms:
    return _TERMS.decode(data)


def decode_report(data: bytes) -> NodeReport:
    return _REPORT.decode(data)


def decode_join_reply(data: bytes) -> JoinReply:
    return _JOIN_REPLY.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _REPLY.decode(data)
