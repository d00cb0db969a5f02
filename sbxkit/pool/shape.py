"""A pooled container's shape: what it is created from before any claim (pure).

Everything of a spec but its command, env, time limit and output cap — those come with the
claim (``line.py``). Two specs of one shape can be served by the same parked container.
"""

from __future__ import annotations

import msgspec

from sbxkit._model.spec import SandboxSpec
from sbxkit.pool.line import PARK_SCRIPT

__all__ = ["parked_spec", "shape_of"]


def shape_of(spec: SandboxSpec) -> SandboxSpec:
    """What a pooled container is created from: the spec without its command, env, time
    limit and output cap (they come with the claim)."""
    limits = msgspec.structs.replace(spec.limits, timeout_s=1.0, output_bytes=1)
    return msgspec.structs.replace(spec, command=["sh"], env={}, limits=limits)


def parked_spec(spec: SandboxSpec, idle_ttl_s: float, max_timeout_s: float) -> SandboxSpec:
    """The spec a parked container of ``spec``'s shape is planned from: the parked shell, no
    env, and a time limit that covers the longest wait plus the longest claimed run."""
    limits = msgspec.structs.replace(
        spec.limits, timeout_s=idle_ttl_s + max_timeout_s, output_bytes=1
    )
    return msgspec.structs.replace(shape_of(spec), command=["sh", "-c", PARK_SCRIPT], limits=limits)
