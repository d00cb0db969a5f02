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
    from sbxkit._consumers.broker import (
        GrantError,
        GrantResult,
        Grants,
        InputGrant,
        OutputGrant,
        Receipt,
        run_with_grants,
    )
    from sbxkit._consumers.harness import Job, JobError, JobResult, run_many
    from sbxkit._consumers.oneshot import run
    from sbxkit._consumers.pty import PtySession, open_pty
    from sbxkit._consumers.session import (
        Sandbox,
        SandboxExit,
        SandboxExpired,
        SandboxUnusable,
        open_sandbox,
    )
    from sbxkit._consumers.stdio import StdioWorker, open_stdio_worker
    from sbxkit._grammar.profile import apply_profile, load_profile
    from sbxkit._lifecycle.owner import InProcessOwner, Owner
    from sbxkit._lifecycle.supervised import SupervisedOwner
    from sbxkit._model.gpu import GpuRequest
    from sbxkit._model.mounts import BindMount, TmpfsMount, VolumeMount
    from sbxkit._model.network_audit import Denial
    from sbxkit._model.network_terms import CallbackTls, Network
    from sbxkit._model.result import PhaseTimings, RunResult, Status, Usage
    from sbxkit._model.settings import Settings
    from sbxkit._model.spec import (
        Limits,
        MiB,
        SandboxSpec,
        parse_size,
        spec_from_dict,
        validate_spec,
    )
    from sbxkit._model.units import GiB, KiB, parse_duration
    from sbxkit._plan.plan import CheckedSpec, check_spec
    from sbxkit._plan.policy import LEASE_LABEL, build_create_body
    from sbxkit.backends.base import Backend, open_backend
    from sbxkit.backends.docker import DockerBackend
    from sbxkit.cluster import ClusterUnavailable, NodeRefusal, RayCluster
    from sbxkit.engine.client import Deadlines, Engine, open_engine
    from sbxkit.errors import (
        AdmissionTimeout,
        ArchiveError,
        CapacityExhausted,
        CleanupError,
        Conflict,
        ContainerMismatch,
        CreateInterrupted,
        EngineConnectionError,
        EngineError,
        EngineProtocolError,
        EngineTimeout,
        EngineUnavailable,
        ImageChanged,
        ImageError,
        NetworkUnavailable,
        NeverFits,
        NotFound,
        PoolUnavailable,
        SandboxFileNotFound,
        SbxError,
        SpecError,
        SupervisorError,
    )
    from sbxkit.pool.held import HeldPool, PooledBackend
    from sbxkit.pool.inprocess import Pool, open_pool
    from sbxkit.pool.shapes import PoolPerShape

# Public name -> the module that defines it. Loaded on first use (PEP 562), so that
# ``python -m sbxkit run`` — a process per sandbox in a harness — pays only for what it uses.
_WHERE: dict[str, str] = {
    "open_pool": "sbxkit.pool.inprocess",
    "Pool": "sbxkit.pool.inprocess",
    "HeldPool": "sbxkit.pool.held",
    "PooledBackend": "sbxkit.pool.held",
    "PoolUnavailable": "sbxkit.errors",
    "PoolPerShape": "sbxkit.pool.shapes",
    "RayCluster": "sbxkit.cluster.api",
    "NodeRefusal": "sbxkit.cluster.join",
    "ClusterUnavailable": "sbxkit.errors",
    "open_backend": "sbxkit.backends.base",
    "check_spec": "sbxkit._plan.plan",
    "CheckedSpec": "sbxkit._plan.plan",
    "DockerBackend": "sbxkit.backends.docker",
    "Backend": "sbxkit.backends.base",
    "AdmissionTimeout": "sbxkit.errors",
    "ArchiveError": "sbxkit.errors",
    "SandboxFileNotFound": "sbxkit.errors",
    "BindMount": "sbxkit._model.mounts",
    "CapacityExhausted": "sbxkit.errors",
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
    "GpuRequest": "sbxkit._model.gpu",
    "Network": "sbxkit._model.network_terms",
    "CallbackTls": "sbxkit._model.network_terms",
    "Denial": "sbxkit._model.network_audit",
    "NetworkUnavailable": "sbxkit.errors",
    "GrantError": "sbxkit.errors",
    "GrantResult": "sbxkit._consumers.grants",
    "Grants": "sbxkit._consumers.grants",
    "ImageError": "sbxkit.errors",
    "InProcessOwner": "sbxkit._lifecycle.owner",
    "InputGrant": "sbxkit._consumers.grants",
    "Job": "sbxkit._consumers.harness",
    "JobError": "sbxkit._consumers.harness",
    "JobResult": "sbxkit._consumers.harness",
    "LEASE_LABEL": "sbxkit._plan.policy",
    "Limits": "sbxkit._model.spec",
    "MiB": "sbxkit._model.spec",
    "KiB": "sbxkit._model.units",
    "GiB": "sbxkit._model.units",
    "parse_duration": "sbxkit._model.units",
    "NeverFits": "sbxkit.errors",
    "NotFound": "sbxkit.errors",
    "OutputGrant": "sbxkit._consumers.grants",
    "Owner": "sbxkit._lifecycle.owner",
    "PhaseTimings": "sbxkit._model.result",
    "PtySession": "sbxkit._consumers.pty",
    "Receipt": "sbxkit._consumers.grants",
    "RunResult": "sbxkit._model.result",
    "Sandbox": "sbxkit._consumers.session",
    "SandboxExit": "sbxkit._lifecycle.owned",
    "SandboxExpired": "sbxkit.errors",
    "SandboxSpec": "sbxkit._model.spec",
    "SandboxUnusable": "sbxkit.errors",
    "SbxError": "sbxkit.errors",
    "Settings": "sbxkit._model.settings",
    "SpecError": "sbxkit.errors",
    "Status": "sbxkit._model.result",
    "Usage": "sbxkit._model.result",
    "StdioWorker": "sbxkit._consumers.stdio",
    "SupervisedOwner": "sbxkit._lifecycle.supervised",
    "SupervisorError": "sbxkit.errors",
    "CreateInterrupted": "sbxkit.errors",
    "TmpfsMount": "sbxkit._model.mounts",
    "VolumeMount": "sbxkit._model.mounts",
    "apply_profile": "sbxkit._grammar.profile",
    "build_create_body": "sbxkit._plan.policy",
    "load_profile": "sbxkit._grammar.profile",
    "open_engine": "sbxkit.engine.client",
    "open_pty": "sbxkit._consumers.pty",
    "open_sandbox": "sbxkit._consumers.session",
    "open_stdio_worker": "sbxkit._consumers.stdio",
    "parse_size": "sbxkit._model.units",
    "run": "sbxkit._consumers.oneshot",
    "run_many": "sbxkit._consumers.harness",
    "run_with_grants": "sbxkit._consumers.broker",
    "spec_from_dict": "sbxkit._model.spec",
    "validate_spec": "sbxkit._model.spec",
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
