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

from sbxkit.archive import ArchiveError
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
from sbxkit.gpu import GpuRequest
from sbxkit.harness import Job, JobError, JobResult
from sbxkit.harness import run_many as _run_many
from sbxkit.mounts import BindMount, TmpfsMount, VolumeMount
from sbxkit.owner import InProcessOwner, Owner
from sbxkit.policy import LEASE_LABEL, build_create_body
from sbxkit.profile import apply_profile, load_profile
from sbxkit.pty import PtySession, open_pty
from sbxkit.result import PhaseTimings, RunResult, Status, Usage
from sbxkit.runner import run
from sbxkit.session import Sandbox, SandboxExit, SandboxExpired, SandboxUnusable, open_sandbox
from sbxkit.settings import Settings
from sbxkit.spec import Limits, MiB, SandboxSpec, parse_size, spec_from_dict, validate_spec
from sbxkit.stdio import StdioWorker, open_stdio_worker
from sbxkit.supervisor.client import CapacityExhausted, SupervisedOwner, SupervisorError
from sbxkit.unwrap import plain_async

run_many = plain_async(_run_many)
"""``sbxkit.harness.run_many`` with no exception group escaping its nursery (Ctrl-C is plain)."""

# Non-trio callers: ``sbxkit.blocking`` (scripts, notebooks) and ``sbxkit.aio`` (asyncio).
from sbxkit import aio, blocking  # noqa: E402

__all__ = [
    "LEASE_LABEL",
    "ArchiveError",
    "BindMount",
    "CapacityExhausted",
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
    "GpuRequest",
    "GrantError",
    "GrantResult",
    "Grants",
    "ImageError",
    "InProcessOwner",
    "InputGrant",
    "Job",
    "JobError",
    "JobResult",
    "Limits",
    "MiB",
    "NotFound",
    "OutputGrant",
    "Owner",
    "PhaseTimings",
    "PtySession",
    "Receipt",
    "RunResult",
    "Sandbox",
    "SandboxExit",
    "SandboxExpired",
    "SandboxSpec",
    "SandboxUnusable",
    "SbxError",
    "Settings",
    "SpecError",
    "Status",
    "StdioWorker",
    "SupervisedOwner",
    "SupervisorError",
    "TmpfsMount",
    "Usage",
    "VolumeMount",
    "aio",
    "apply_profile",
    "blocking",
    "build_create_body",
    "load_profile",
    "open_engine",
    "open_pty",
    "open_sandbox",
    "open_stdio_worker",
    "parse_size",
    "run",
    "run_many",
    "run_with_grants",
    "spec_from_dict",
    "validate_spec",
]
