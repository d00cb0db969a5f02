"""The OpenAI Agents SDK's options and session state for sbxkit, and what they map to (pure):
the sbxkit spec of a session, the refusals by name, a command's exit code
(sbxkit.integrations.openai_agents uses them; docs/integrations.md)."""

from __future__ import annotations

from typing import Any, Literal

from agents.sandbox.manifest import Manifest
from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from pydantic import Field

from sbxkit._model.mounts import TmpfsMount
from sbxkit._model.spec import Limits, MiB, SandboxSpec, Workspace
from sbxkit._model.units import GiB
from sbxkit.errors import SpecError

BACKEND_ID = "sbxkit"

# A command's end other than its own exit, as the exit codes shells and `timeout` use.
_STATUS_CODES = {
    "timed_out": 124,
    "output_exceeded": 123,
    "disk_exceeded": 122,
    "oom_killed": 137,
    "killed": 137,
}


class SbxkitSandboxClientOptions(BaseSandboxClientOptions):
    """How an SDK session's sandbox is made. Every limit has a bounded default; nothing here
    can loosen sbxkit's hardening (the body is not configurable)."""

    type: Literal["sbxkit"] = "sbxkit"
    image: str
    """A local image: sbxkit never pulls (``docker pull`` or load it first)."""
    cpus: float = 1.0
    memory_bytes: int = 1 * GiB
    """The whole budget, the workspace's and ``/tmp``'s tmpfs included."""
    pids: int = 256
    output_bytes: int = 16 * MiB
    """Per command and stream, and per ``exec_command`` process (merged)."""
    timeout_s: float = 3600.0
    """The sandbox's whole life; a command's own timeout is the SDK's."""
    workspace_bytes: int | None = 256 * MiB
    """The manifest's root is a tmpfs this large, the sandbox user's, programs may run there.
    None: no tmpfs; the root must be writable in the image (``disk_bytes``)."""
    scratch_bytes: int = 64 * MiB
    """``/tmp`` (noexec unless ``exec_tmp``)."""
    fsize_bytes: int = 64 * MiB
    """The largest file a process may write, and the largest file ``read`` returns."""
    archive_bytes: int = 1 * GiB
    """The largest workspace tar a snapshot may hold."""
    root: bool = False
    """Root inside (``sbxkit.Workspace``): only where the daemon proves it is not the host's
    root (``--userns-remap``, rootless, gVisor); refused by name elsewhere."""
    disk_bytes: int | None = None
    """The image's own files writable, bounded (``Workspace(disk_bytes=...)``)."""
    exec_tmp: bool = False
    """``/tmp`` may hold programs (a workspace's option; the SDK's helpers do not need it)."""
    user: str | None = None
    """``UID:GID``, non-root; None: a uid of the sandbox's own."""
    runtime: str | None = None
    """An OCI runtime the daemon has (``gvisor``)."""
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    max_processes: int = 16
    """``exec_command`` processes running at once; the least recently used is ended for
    another, as the SDK's own backends do."""
    exposed_ports: tuple[int, ...] = ()
    """Refused unless empty: an sbxkit sandbox has no network to publish a port on."""
    network_mode: str | None = None
    """Refused unless None or ``none``."""

    def __init__(self, image: str, **fields: Any) -> None:
        super().__init__(image=image, **fields)


class SbxkitSandboxSessionState(SandboxSessionState):
    """What ``resume`` needs: the options (to make a replacement) and, after ``detach``, the
    sbxkit handle. The handle is a secret, spent by the first ``resume``: keep a serialized
    state as you would a password."""

    type: Literal["sbxkit"] = "sbxkit"
    options: SbxkitSandboxClientOptions
    handle: str | None = None

    def _sanitize_persisted_provider_identity(
        self, data: dict[str, Any], *, mount_authority_redacted: bool
    ) -> None:
        if mount_authority_redacted:
            data["handle"] = None
            data["workspace_root_ready"] = False


def coerce_options(options: object) -> SbxkitSandboxClientOptions:
    """Our options, or the SDK Docker client's (``type == "docker"``: image, labels,
    exposed_ports, network_mode carried over, to be refused or kept by the same rules)."""
    if isinstance(options, SbxkitSandboxClientOptions):
        return options
    if getattr(options, "type", None) == "docker":
        return SbxkitSandboxClientOptions(
            image=getattr(options, "image", ""),
            exposed_ports=tuple(getattr(options, "exposed_ports", ())),
            network_mode=getattr(options, "network_mode", None),
            labels=dict(getattr(options, "labels", {}) or {}),
        )
    raise SpecError(
        "options",
        f"{type(options).__name__} is not SbxkitSandboxClientOptions (nor the Docker client's)",
    )


def refuse(options: SbxkitSandboxClientOptions, manifest: Manifest) -> None:
    """Raise SpecError naming what the SDK asked that sbxkit will not do (pure)."""
    if options.exposed_ports:
        raise SpecError(
            "exposed_ports",
            f"{options.exposed_ports!r}: an sbxkit sandbox has no network, so no port is "
            "published (its network is 'none')",
        )
    if options.network_mode not in (None, "none"):
        raise SpecError(
            "network_mode",
            f"{options.network_mode!r}: an sbxkit sandbox has no network ('none' only)",
        )
    if manifest.users or manifest.groups:
        names = [u.name for u in manifest.users] + [g.name for g in manifest.groups]
        raise SpecError(
            "manifest.users",
            f"{names!r}: sbxkit makes no accounts in a sandbox (useradd needs root and a "
            "writable /etc); commands run as the sandbox's own user",
        )
    for entry, path in manifest.mount_targets():
        raise SpecError(
            f"manifest.entries[{path.as_posix()!r}]",
            f"{type(entry).__name__}: storage mounts need CAP_SYS_ADMIN and /dev/fuse in the "
            "sandbox, or a Docker volume plugin, which sbxkit never grants",
        )
    for index, grant in enumerate(manifest.extra_path_grants):
        if grant.host_path is not None:
            raise SpecError(
                f"manifest.extra_path_grants[{index}].host_path",
                f"{grant.host_path!r}: no host path is bound into an sbxkit sandbox here; put "
                "the files in the manifest's entries",
            )


_LIMIT_OPTIONS = frozenset(
    ("cpus", "memory_bytes", "pids", "output_bytes", "timeout_s", "fsize_bytes", "scratch_bytes")
)
"""The options that are ``Limits`` fields of the same name (``root`` and ``disk_bytes`` are the
workspace's)."""


def sandbox_spec(
    options: SbxkitSandboxClientOptions, root: str, env: dict[str, str]
) -> SandboxSpec:
    """The sbxkit spec of an SDK session (pure): the manifest's root a tmpfs of its own."""
    mounts = []
    if options.workspace_bytes is not None:
        mounts.append(TmpfsMount(target=root, size_bytes=options.workspace_bytes, options=["exec"]))
    workspace = None
    if options.root or options.disk_bytes is not None or options.exec_tmp:
        workspace = Workspace(
            root=options.root, disk_bytes=options.disk_bytes, exec_tmp=options.exec_tmp
        )
    return SandboxSpec(
        image=options.image,
        command=["unused"],  # a session runs its keep-alive
        limits=Limits(**{name: getattr(options, name) for name in _LIMIT_OPTIONS}),
        env=env,
        user=options.user,
        runtime=options.runtime,
        labels=dict(options.labels),
        mounts=list(mounts),
        workspace=workspace,
    )


def exit_code(status: str, code: int | None) -> int:
    """A command's exit code for the SDK: its own, or what ended it as shells say it."""
    if status == "exited" and code is not None:
        return code
    return _STATUS_CODES.get(status, 125)
