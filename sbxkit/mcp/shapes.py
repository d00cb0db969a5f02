"""What a tool call returns, as JSON-ready data (pure).

Every result is a JSON object (MCP's ``structuredContent``, checked against the tool's
``outputSchema`` in ``sbxkit.mcp.schemas``); the server also sends it serialized as the text
content, as the protocol asks for clients that read only text. Output is decoded as UTF-8
with replacement characters; the byte counts are the raw output's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sbxkit._grammar.profile import LIMIT_FIELDS
from sbxkit._model.network_ports import PortForward
from sbxkit._model.result import RunResult, json_fields
from sbxkit._model.spec import Limits
from sbxkit.errors import SbxError


class SandboxView(msgspec.Struct, frozen=True, kw_only=True):
    """What ``sandbox_open`` and ``sandbox_list`` say about one open sandbox."""

    sandbox_id: str
    image: str
    workdir: str
    files_root: str
    limits: Limits
    lifetime_s: float
    expires_in_s: float
    idle_timeout_s: float
    idle_s: float
    busy: bool
    ports: tuple[PortForward, ...] = ()
    """Its inbound ports as the host reaches them (empty when the profile forwards none)."""


def port_fields(ports: tuple[PortForward, ...]) -> list[dict[str, Any]]:
    """Forwarded ports as ``sbxkit run --json`` lists them: address, host_port, sandbox_port."""
    return [msgspec.structs.asdict(port) for port in ports]


def evidence(result: RunResult) -> dict[str, Any]:
    """Which evidence decided the status. ``oom``: what made it ``oom_killed`` (the daemon's
    ``OOMKilled`` flag or its ``oom`` event), or on an ``exited`` result that a child was
    OOM-killed; ``kill``: the daemon's record of a kill sbxkit did not send. ``timed_out``
    and ``output_exceeded`` are sbxkit's own kills and need none. ``witness``: who saw the
    exit, ``kernel`` or ``daemon`` (``RunResult.evidence``)."""
    return {
        "oom": result.oom_evidence,
        "kill": result.kill_evidence,
        "witness": result.evidence,
    }


COMMAND_FIELDS = (
    "status",
    "exit_code",
    "stdout",
    "stderr",
    "stdout_bytes",
    "stderr_bytes",
    "overflowed",
)
"""What a model gets of ``sbxkit run --json``'s fields (not container ids, leases, timings)."""


def command_result(result: RunResult) -> dict[str, Any]:
    """A finished command (``run``, ``sandbox_exec``), decoded as ``--json`` decodes it."""
    fields = json_fields(result)
    return {
        **{name: fields[name] for name in COMMAND_FIELDS},
        "evidence": evidence(result),
        "duration_s": round(result.timings.run_s, 3),
        "denials": [
            {"destination": d.destination, "reason": d.reason, "kind": d.kind}
            for d in result.denials
        ],
    }


def limits_fields(limits: Limits) -> dict[str, Any]:
    """Limits by the names a profile and a tool call use; sizes in bytes, times in seconds."""
    return {name: getattr(limits, field) for name, (field, _) in LIMIT_FIELDS.items()}


def sandbox_fields(view: SandboxView) -> dict[str, Any]:
    fields = msgspec.structs.asdict(view)
    fields["limits"] = limits_fields(view.limits)
    fields["ports"] = port_fields(view.ports)
    for name in ("lifetime_s", "expires_in_s", "idle_timeout_s", "idle_s"):
        fields[name] = round(fields[name], 1)
    return fields


def sandbox_list(
    views: list[SandboxView], *, per_client: int, held: int, held_in_all: int, in_all: int
) -> dict[str, Any]:
    return {
        "sandboxes": [sandbox_fields(view) for view in views],
        "open_or_running": held,
        "max_per_client": per_client,
        "open_or_running_in_all": held_in_all,
        "max_in_all": in_all,
    }


def error_fields(error: SbxError) -> dict[str, Any]:
    """A refused or failed call: the error's kind, the argument it names (when one is at
    fault) and its message."""
    field = getattr(error, "field", None)
    rule = getattr(error, "rule", None)
    return {
        "error": {
            "type": type(error).__name__,
            "field": field if isinstance(field, str) else None,
            "rule": rule if isinstance(rule, str) else None,
            "message": str(error),
        }
    }
