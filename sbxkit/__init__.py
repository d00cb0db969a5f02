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

from sbxkit._util.public import WHERE as _WHERE

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
    from sbxkit._consumers.handle import SandboxHandle
    from sbxkit._consumers.harness import Job, JobError, JobResult, run_many
    from sbxkit._consumers.interp_frames import CodeError, CodeResult
    from sbxkit._consumers.interp_pool import InterpreterPool, open_interpreter_pool
    from sbxkit._consumers.interpreter import Interpreter, open_interpreter
    from sbxkit._consumers.oneshot import run
    from sbxkit._consumers.paced import PaceStep, Pacing
    from sbxkit._consumers.process_log import ProcessExit
    from sbxkit._consumers.processes import Process
    from sbxkit._consumers.pty import PtySession, open_pty
    from sbxkit._consumers.reattach import attach_sandbox
    from sbxkit._consumers.session import (
        Sandbox,
        SandboxExit,
        SandboxExpired,
        SandboxUnusable,
        open_sandbox,
    )
    from sbxkit._consumers.stdio import StdioWorker, open_stdio_worker
    from sbxkit._grammar.profile import apply_profile, load_profile
    from sbxkit._lifecycle.owner import CreateRequest, InProcessOwner, Owner
    from sbxkit._lifecycle.supervised import SupervisedOwner
    from sbxkit._model.gpu import GpuRequest
    from sbxkit._model.mounts import BindMount, TmpfsMount, VolumeMount
    from sbxkit._model.network_audit import Denial
    from sbxkit._model.network_ports import PortForward
    from sbxkit._model.network_terms import CallbackTls, Network
    from sbxkit._model.result import Metrics, PhaseTimings, RunResult, Status, Usage
    from sbxkit._model.settings import Settings
    from sbxkit._model.spec import (
        Limits,
        MiB,
        SandboxSpec,
        Workspace,
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
        InterpreterDied,
        MetricsUnavailable,
        NetworkUnavailable,
        NeverFits,
        NotFound,
        PoolUnavailable,
        ProcessError,
        ProcessStillRunning,
        ReattachRefused,
        SandboxFileNotFound,
        SbxError,
        SpecError,
        SupervisorError,
        TooManyProcesses,
    )
    from sbxkit.pool.held import HeldPool, PooledBackend
    from sbxkit.pool.inprocess import Pool, open_pool
    from sbxkit.pool.shapes import PoolPerShape

# Public name -> the module that defines it (sbxkit/_util/public.py). Loaded on first use
# (PEP 562), so that ``python -m sbxkit run`` — a process per sandbox in a harness — pays only
# for what it uses.
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
    "CodeError",
    "CodeResult",
    "Conflict",
    "ContainerMismatch",
    "CreateInterrupted",
    "CreateRequest",
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
    "Interpreter",
    "InterpreterDied",
    "InterpreterPool",
    "Job",
    "JobError",
    "JobResult",
    "KiB",
    "Limits",
    "Metrics",
    "MetricsUnavailable",
    "MiB",
    "Network",
    "NetworkUnavailable",
    "NeverFits",
    "NodeRefusal",
    "NotFound",
    "OutputGrant",
    "Owner",
    "PaceStep",
    "Pacing",
    "PhaseTimings",
    "Pool",
    "PoolPerShape",
    "PoolUnavailable",
    "PooledBackend",
    "PortForward",
    "Process",
    "ProcessError",
    "ProcessExit",
    "ProcessStillRunning",
    "PtySession",
    "RayCluster",
    "ReattachRefused",
    "Receipt",
    "RunResult",
    "Sandbox",
    "SandboxExit",
    "SandboxExpired",
    "SandboxFileNotFound",
    "SandboxHandle",
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
    "TooManyProcesses",
    "Usage",
    "VolumeMount",
    "Workspace",
    "aio",
    "apply_profile",
    "attach_sandbox",
    "blocking",
    "build_create_body",
    "check_spec",
    "load_profile",
    "open_backend",
    "open_engine",
    "open_interpreter",
    "open_interpreter_pool",
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
