"""The public surface's table: each public name and the private module that defines it.

``sbxkit``'s ``__init__`` loads names from it on first use (PEP 562). Each defining module ends
with ``publish(__name__, globals())``: its public classes and functions then show the path users
import them by (``sbxkit.DockerBackend``, not ``sbxkit.backends.docker.DockerBackend``) in
reprs, tracebacks and pickles, however they were reached. Errors live in ``sbxkit.errors``,
itself public, and keep it.

msgspec Structs (``SandboxSpec``, ``RunResult`` ...) keep their defining module: msgspec
resolves their postponed annotations in that module's namespace when it first decodes one, and
under ``sbxkit`` their names are not there.
"""

from __future__ import annotations

PUBLIC_MODULE = "sbxkit"

WHERE: dict[str, str] = {
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
    "attach_sandbox": "sbxkit._consumers.reattach",
    "SandboxHandle": "sbxkit._consumers.handle",
    "ReattachRefused": "sbxkit.errors",
    "check_spec": "sbxkit._plan.plan",
    "CheckedSpec": "sbxkit._plan.plan",
    "DockerBackend": "sbxkit.backends.docker",
    "Backend": "sbxkit.backends.base",
    "AdmissionTimeout": "sbxkit.errors",
    "ArchiveError": "sbxkit.errors",
    "SandboxFileNotFound": "sbxkit.errors",
    "Process": "sbxkit._consumers.processes",
    "Interpreter": "sbxkit._consumers.interpreter",
    "open_interpreter": "sbxkit._consumers.interpreter",
    "InterpreterPool": "sbxkit._consumers.interp_pool",
    "open_interpreter_pool": "sbxkit._consumers.interp_pool",
    "CodeResult": "sbxkit._consumers.interp_frames",
    "CodeError": "sbxkit._consumers.interp_frames",
    "InterpreterDied": "sbxkit.errors",
    "ProcessExit": "sbxkit._consumers.process_log",
    "ProcessError": "sbxkit.errors",
    "ProcessStillRunning": "sbxkit.errors",
    "TooManyProcesses": "sbxkit.errors",
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
    "PortForward": "sbxkit._model.network_ports",
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
    "PaceStep": "sbxkit._consumers.paced",
    "Pacing": "sbxkit._consumers.paced",
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
    "CreateRequest": "sbxkit._lifecycle.owner",
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
    "Metrics": "sbxkit._model.result",
    "MetricsUnavailable": "sbxkit.errors",
    "StdioWorker": "sbxkit._consumers.stdio",
    "SupervisedOwner": "sbxkit._lifecycle.supervised",
    "SupervisorError": "sbxkit.errors",
    "CreateInterrupted": "sbxkit.errors",
    "TmpfsMount": "sbxkit._model.mounts",
    "VolumeMount": "sbxkit._model.mounts",
    "Workspace": "sbxkit._model.spec",
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


def publish(module: str, namespace: dict[str, object]) -> None:
    """Show the public names ``module`` defines under ``sbxkit``."""
    for name, where in WHERE.items():
        if where != module:
            continue
        value = namespace.get(name)
        if hasattr(value, "__struct_fields__"):
            continue  # a msgspec Struct: see the module's docstring
        if isinstance(value, type) or (callable(value) and hasattr(value, "__code__")):
            value.__module__ = PUBLIC_MODULE


__all__ = ["PUBLIC_MODULE", "WHERE", "publish"]
