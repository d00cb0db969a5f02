"""What crosses Ray between the driver, a job's relay task and a node's agent (pure).

Every message is a msgspec Struct encoded as msgpack bytes, so Ray carries plain bytes and
nothing depends on pickling sbxkit's classes across versions; a node whose sbxkit differs is
refused at join instead (``join.py``).
"""

from __future__ import annotations

import msgspec

from sbxkit.harness import JobId, JobResult
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec


class RemoteJob(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One attempt of a job, as the agent receives it."""

    id: JobId
    spec: SandboxSpec
    stdin: bytes | None = None
    attempt: int = 1


class AgentTerms(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a node's agent is started with: the batch's settings (the driver's, less its own
    supervisor state dir and command: each node's are its own) and how long a job may wait
    for a supervisor whose hard bounds are used up."""

    settings: Settings
    capacity_wait_s: float


class NodeReport(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an agent found on its node when it joined (``join.judge`` decides)."""

    node_id: str
    name: str
    implementation: str
    engine: str
    engine_error: str | None = None
    supervisor_error: str | None = None
    images: dict[str, str | None] = msgspec.field(default_factory=dict)
    """Each image the batch names → its content fingerprint there (None: missing)."""
    supervisor_pid: int | None = None
    agent_pid: int = 0


class Done(msgspec.Struct, frozen=True, kw_only=True, tag="done"):
    """The run ended, with a result or an sbxkit error; its container is removed."""

    job: JobResult
    node: str


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


Outcome = Done | AgentLost | NotAccepted | Cancelled

_ENCODER = msgspec.msgpack.Encoder()
_OUTCOME = msgspec.msgpack.Decoder(Outcome)
_JOB = msgspec.msgpack.Decoder(RemoteJob)
_TERMS = msgspec.msgpack.Decoder(AgentTerms)
_REPORT = msgspec.msgpack.Decoder(NodeReport)


def encode(message: RemoteJob | AgentTerms | NodeReport | Outcome) -> bytes:
    return _ENCODER.encode(message)


def decode_outcome(data: bytes) -> Outcome:
    return _OUTCOME.decode(data)


def decode_job(data: bytes) -> RemoteJob:
    return _JOB.decode(data)


def decode_terms(data: bytes) -> AgentTerms:
    return _TERMS.decode(data)


def decode_report(data: bytes) -> NodeReport:
    return _REPORT.decode(data)
