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

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not ``typing``'s: ``python -m sbxkit`` and the CLI's hand-off skip it
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    from sbxkit import aio, blocking
    from sbxkit.archive import ArchiveError, SandboxFileNotFound
    from sbxkit.backends.base import Backend, open_backend
    from sbxkit.backends.docker import DockerBackend
    from sbxkit.broker import (
        GrantError,
        GrantResult,
        Grants,
        InputGrant,
        OutputGrant,
        Receipt,
        run_with_grants,
    )
    from sbxkit.cluster import ClusterUnavailable, NodeRefusal, RayCluster
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
        ImageChanged,
        ImageError,
        NeverFits,
        NotFound,
        SbxError,
        SpecError,
    )
    from sbxkit.gpu import GpuRequest
    from sbxkit.harness import Job, JobError, JobResult, run_many
    from sbxkit.mounts import BindMount, TmpfsMount, VolumeMount
    from sbxkit.network.audit import Denial
    from sbxkit.network.netns import NetworkUnavailable
    from sbxkit.network.terms import CallbackTls, Network
    from sbxkit.oneshot import run
    from sbxkit.owner import InProcessOwner, Owner
    from sbxkit.plan import CheckedSpec, check_spec
    from sbxkit.policy import LEASE_LABEL, build_create_body
    from sbxkit.pool.held import HeldPool, PooledBackend, PoolUnavailable
    from sbxkit.pool.inprocess import Pool, open_pool
    from sbxkit.pool.shapes import PoolPerShape
    from sbxkit.profile import apply_profile, load_profile
    from sbxkit.pty import PtySession, open_pty
    from sbxkit.result import PhaseTimings, RunResult, Status, Usage
    from sbxkit.session import Sandbox, SandboxExit, SandboxExpired, SandboxUnusable, open_sandbox
    from sbxkit.settings import Settings
    from sbxkit.spec import Limits, MiB, SandboxSpec, parse_size, spec_from_dict, validate_spec
    from sbxkit.stdio import StdioWorker, open_stdio_worker
    from sbxkit.supervisor.client import SupervisedOwner
    from sbxkit.supervisor.connect import (
        AdmissionTimeout,
        CapacityExhausted,
        CreateInterrupted,
        SupervisorError,
    )
    from sbxkit.units import GiB, KiB, parse_duration

# Public name -> the module that defines it. Loaded on first use (PEP 562), so that
# ``python -m sbxkit run`` — a process per sandbox in a harness — pays only for what it uses.
_WHERE: dict[str, str] = {
    "open_pool": "sbxkit.pool.inprocess",
    "Pool": "sbxkit.pool.inprocess",
    "HeldPool": "sbxkit.pool.held",
    "PooledBackend": "sbxkit.pool.held",
    "PoolUnavailable": "sbxkit.pool.held",
    "PoolPerShape": "sbxkit.pool.shapes",
    "RayCluster": "sbxkit.cluster",
    "NodeRefusal": "sbxkit.cluster",
    "ClusterUnavailable": "sbxkit.cluster",
    "open_backend": "sbxkit.backends.base",
    "check_spec": "sbxkit.plan",
    "CheckedSpec": "sbxkit.plan",
    "DockerBackend": "sbxkit.backends.docker",
    "Backend": "sbxkit.backends.base",
    "AdmissionTimeout": "sbxkit.supervisor.connect",
    "ArchiveError": "sbxkit.archive",
    "SandboxFileNotFound": "sbxkit.archive",
    "BindMount": "sbxkit.mounts",
    "CapacityExhausted": "sbxkit.supervisor.connect",
    "CleanupError": "sbxkit.errors",
    "Conflict": "sbxkit.errors",
    "ContainerMismatch": "sbxkit.errors",
    "ImageChanged": "sbxkit.errors",
    "Deadlines": "sbxkit.engine.client",
    "Engine": "sbxkit.engine.client",
    "EngineConnectionError": "sbxkit.errors",
    "EngineError": "sbxkit.errors",
    "EngineProtocolError": "sbxkit.errors",
    "EngineTimeout": "sbxkit.errors",
    "EngineUnavailable": "sbxkit.errors",
    "GpuRequest": "sbxkit.gpu",
    "Network": "sbxkit.network.terms",
    "CallbackTls": "sbxkit.network.terms",
    "Denial": "sbxkit.network.audit",
    "NetworkUnavailable": "sbxkit.network.netns",
    "GrantError": "sbxkit.broker",
    "GrantResult": "sbxkit.broker",
    "Grants": "sbxkit.broker",
    "ImageError": "sbxkit.errors",
    "InProcessOwner": "sbxkit.owner",
    "InputGrant": "sbxkit.broker",
    "Job": "sbxkit.harness",
    "JobError": "sbxkit.harness",
    "JobResult": "sbxkit.harness",
    "LEASE_LABEL": "sbxkit.policy",
    "Limits": "sbxkit.spec",
    "MiB": "sbxkit.spec",
    "KiB": "sbxkit.units",
    "GiB": "sbxkit.units",
    "parse_duration": "sbxkit.units",
    "NeverFits": "sbxkit.errors",
    "NotFound": "sbxkit.errors",
    "OutputGrant": "sbxkit.broker",
    "Owner": "sbxkit.owner",
    "PhaseTimings": "sbxkit.result",
    "PtySession": "sbxkit.pty",
    "Receipt": "sbxkit.broker",
    "RunResult": "sbxkit.result",
    "Sandbox": "sbxkit.session",
    "SandboxExit": "sbxkit.session",
    "SandboxExpired": "sbxkit.session",
    "SandboxSpec": "sbxkit.spec",
    "SandboxUnusable": "sbxkit.session",
    "SbxError": "sbxkit.errors",
    "Settings": "sbxkit.settings",
    "SpecError": "sbxkit.errors",
    "Status": "sbxkit.result",
    "Usage": "sbxkit.result",
    "StdioWorker": "sbxkit.stdio",
    "SupervisedOwner": "sbxkit.supervisor.client",
    "SupervisorError": "sbxkit.supervisor.connect",
    "CreateInterrupted": "sbxkit.supervisor.connect",
    "TmpfsMount": "sbxkit.mounts",
    "VolumeMount": "sbxkit.mounts",
    "apply_profile": "sbxkit.profile",
    "build_create_body": "sbxkit.policy",
    "load_profile": "sbxkit.profile",
    "open_engine": "sbxkit.engine.client",
    "open_pty": "sbxkit.pty",
    "open_sandbox": "sbxkit.session",
    "open_stdio_worker": "sbxkit.stdio",
    "parse_size": "sbxkit.spec",
    "run": "sbxkit.oneshot",
    "run_many": "sbxkit.harness",
    "run_with_grants": "sbxkit.broker",
    "spec_from_dict": "sbxkit.spec",
    "validate_spec": "sbxkit.spec",
}
_SUBMODULES = ("aio", "blocking")  # non-trio callers: scripts and notebooks, asyncio


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value: Any = importlib.import_module(f"sbxkit.{name}")
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'sbxkit' has no attribute {name!r}")
    globals()[name] = value  # once loaded, a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "LEASE_LABEL",
    "AdmissionTimeout",
    "ArchiveError",
    "Backend",
    "BindMount",
    "CallbackTls",
    "CapacityExhausted",
    "CheckedSpec",
    "CleanupError",
    "ClusterUnavailable",
    "Conflict",
    "ContainerMismatch",
    "CreateInterrupted",
    "Deadlines",
    "Denial",
    "DockerBackend",
    "Engine",
    "EngineConnectionError",
    "EngineError",
    "EngineProtocolError",
    "EngineTimeout",
    "EngineUnavailable",
    "GiB",
    "GpuRequest",
    "GrantError",
    "GrantResult",
    "Grants",
    "HeldPool",
    "ImageChanged",
    "ImageError",
    "InProcessOwner",
    "InputGrant",
    "Job",
    "JobError",
    "JobResult",
    "KiB",
    "Limits",
    "MiB",
    "Network",
    "NetworkUnavailable",
    "NeverFits",
    "NodeRefusal",
    "NotFound",
    "OutputGrant",
    "Owner",
    "PhaseTimings",
    "Pool",
    "PoolPerShape",
    "PoolUnavailable",
    "PooledBackend",
    "PtySession",
    "RayCluster",
    "Receipt",
    "RunResult",
    "Sandbox",
    "SandboxExit",
    "SandboxExpired",
    "SandboxFileNotFound",
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
    "check_spec",
    "load_profile",
    "open_backend",
    "open_engine",
    "open_pool",
    "open_pty",
    "open_sandbox",
    "open_stdio_worker",
    "parse_duration",
    "parse_size",
    "run",
    "run_many",
    "run_with_grants",
    "spec_from_dict",
    "validate_spec",
]
