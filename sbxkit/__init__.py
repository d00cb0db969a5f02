"""sbxkit: run untrusted workloads in hardened Docker sandboxes that are always removed.

The curated public surface. Everything else is importable but undocumented and may change.

    import trio, sbxkit

    spec = sbxkit.SandboxSpec(
        image="sbxkit-test/busybox:latest",
        command=["sh", "-c", "echo hello"],
        limits=sbxkit.Limits(cpus=1, memory_bytes=256 * sbxkit.MiB, pids=64,
                             output_bytes=sbxkit.MiB, timeout_s=10),
    )
    result = trio.run(sbxkit.run, spec)
"""

from sbxkit.broker import (
    GrantError,
    GrantResult,
    Grants,
    InputGrant,
    OutputGrant,
    Receipt,
    run_with_grants,
)
from sbxkit.engine.client import Deadlines, Engine, open_engine
from sbxkit.errors import (
    CleanupError,
    Conflict,
    ContainerMismatch,
    EngineConnectionError,
    EngineError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    ImageError,
    NotFound,
    SbxError,
    SpecError,
)
from sbxkit.owner import InProcessOwner, Owner
from sbxkit.policy import LEASE_LABEL, build_create_body
from sbxkit.result import PhaseTimings, RunResult, Status
from sbxkit.runner import run
from sbxkit.spec import Limits, MiB, SandboxSpec, parse_size, spec_from_dict, validate_spec

__all__ = [
    "LEASE_LABEL",
    "CleanupError",
    "Conflict",
    "ContainerMismatch",
    "Deadlines",
    "Engine",
    "EngineConnectionError",
    "EngineError",
    "EngineProtocolError",
    "EngineTimeout",
    "EngineUnavailable",
    "GrantError",
    "GrantResult",
    "Grants",
    "ImageError",
    "InputGrant",
    "InProcessOwner",
    "Limits",
    "MiB",
    "NotFound",
    "OutputGrant",
    "Owner",
    "PhaseTimings",
    "Receipt",
    "RunResult",
    "SandboxSpec",
    "SbxError",
    "SpecError",
    "Status",
    "build_create_body",
    "open_engine",
    "parse_size",
    "run",
    "run_with_grants",
    "spec_from_dict",
    "validate_spec",
]
