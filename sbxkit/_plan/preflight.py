"""Host- and daemon-side checks that must pass before any container exists.

The pure rules in ``sbxkit._model.mounts`` judge what a spec says; this shell judges what it names:
bind sources are canonicalised on the host (every link resolved) and the same path rules are
applied again to the real path, so a link cannot smuggle in ``/var/run/docker.sock``; special
files are refused; named volumes must already exist (sbxkit never creates or removes one), and
a local volume that is really a bind of a host directory is judged as a bind.

Host source paths and their parents must stay under the operator's control while Docker mounts
them: resolving a path and then mounting it is not atomic against a concurrent host-side swap.

``check_daemon`` asks ``/info`` — only when the spec needs it — whether the requested OCI
runtime is registered and which CDI GPUs exist, and hands the answers to the pure rules in
``sbxkit._model.rules`` and ``sbxkit._model.gpu``.
"""

from __future__ import annotations

import os
import stat
import time

import msgspec

from sbxkit._model.gpu import GpuCursor, resolve_gpus
from sbxkit._model.mounts import (
    BindMount,
    ExpectedMount,
    ResolvedMounts,
    TmpfsMount,
    VolumeMount,
    check_host_path,
)
from sbxkit._model.rules import (
    PODMAN_AUTO_USERNS,
    PODMAN_AUTO_WITNESS,
    check_podman_controllers,
    check_rootless_docker,
)
from sbxkit._model.runtimes import GVISOR_RUNTIME, check_podman_runtime, plan_runtime, runtime_name
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec, parse_user
from sbxkit._model.uids import HOST_UIDS, MAPPED_UIDS, UidRange, remapping
from sbxkit.engine.client import Engine
from sbxkit.engine.models import MountSpec
from sbxkit.errors import NotFound, SpecError

# Docker 26 (API 1.45) added VolumeOptions.Subpath; an older daemon would silently ignore it
# and mount the whole volume.
SUBPATH_API = (1, 45)


def resolve_host_path(field: str, source: str, *, state_dir: str | None) -> str:
    """Canonicalise a bind source and re-check it; refuse special files and dangling links.
    Where a link chain points is checked before whether it exists: a chain into a protected
    path is refused as that, even when nothing is there (yet)."""
    check_host_path(field, source, state_dir=state_dir)
    real_state = os.path.realpath(state_dir) if state_dir else None
    pointed = os.path.realpath(source)
    _check_resolved(field, pointed, state_dir, real_state)
    try:
        real = os.path.realpath(source, strict=True)
    except (OSError, RuntimeError) as exc:
        raise SpecError(field, f"{source} must exist on the host ({exc})") from None
    if real != pointed:  # a link changed in between: judge what is there now
        _check_resolved(field, real, state_dir, real_state)
    mode = os.lstat(real).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise SpecError(
            field,
            f"{real} is a special file; only directories and regular files can be bind-mounted",
        )
    return real


def _check_resolved(field: str, real: str, state_dir: str | None, real_state: str | None) -> None:
    """A resolved source against the state directory as given and as resolved."""
    check_host_path(field, real, state_dir=real_state)
    if state_dir and state_dir != real_state:
        check_host_path(field, real, state_dir=state_dir)


def _bind_string(source: str, mount: BindMount) -> str:
    options = ["ro" if mount.read_only else "rw", "rprivate"]
    if mount.selinux_label == "shared":
        options.append("z")
    elif mount.selinux_label == "private":
        options.append("Z")
    return f"{source}:{mount.target}:{','.join(options)}"


def tmpfs_options(mount: TmpfsMount, user: str | None, *, podman: bool = False) -> str:
    """Always bounded, nosuid and nodev, owned by the sandbox user; noexec unless ``exec``.

    Podman refuses ``uid=``/``gid=``: there the tmpfs is root's, with the mode asked for. A
    spec with no user gets its owner when its uid is known (``policy.hardened_body``).
    """
    access = "ro" if "ro" in mount.options else "rw"
    execute = "exec" if "exec" in mount.options else "noexec"
    options = f"{access},nosuid,nodev,{execute},size={mount.size_bytes},mode={mount.mode:o}"
    if podman or user is None:
        return options
    uid, gid = parse_user(user)
    return f"{options},uid={uid},gid={gid}"


async def resolve_mounts(engine: Engine, spec: SandboxSpec, settings: Settings) -> ResolvedMounts:
    resolved = ResolvedMounts()
    state_dir = settings.supervisor_state_dir
    for index, mount in enumerate(spec.mounts):
        field = f"mounts[{index}]"
        if isinstance(mount, BindMount):
            real = resolve_host_path(f"{field}.source", mount.source, state_dir=state_dir)
            resolved.binds.append(_bind_string(real, mount))
            resolved.expected.append(
                ExpectedMount(
                    type="bind", source=real, destination=mount.target, rw=not mount.read_only
                )
            )
        elif isinstance(mount, VolumeMount):
            await _resolve_volume(engine, field, mount, settings, resolved)
        else:
            resolved.tmpfs[mount.target] = tmpfs_options(mount, spec.user, podman=engine.is_podman)
    return resolved


async def _resolve_volume(
    engine: Engine, field: str, mount: VolumeMount, settings: Settings, resolved: ResolvedMounts
) -> None:
    try:
        volume = await engine.volume_inspect(mount.source)
    except NotFound:
        raise SpecError(
            f"{field}.source", f"no volume named {mount.source!r}; sbxkit never creates volumes"
        ) from None
    options = volume.options or {}
    if volume.driver != "local":
        # A plugin driver can mount anything (NFS, the host's disks); we cannot judge it.
        raise SpecError(
            f"{field}.source",
            f"volume {mount.source!r} uses the driver "
            f"{volume.driver!r}; only plain local volumes are allowed",
        )
    if options:
        # A local volume with driver options mounts something of the host's choosing
        # (o=bind/rbind of a directory, a device, an overlay): judge it as a bind of `device`.
        device = options.get("device", "")
        kind = options.get("type", "")
        bind_flags = set(options.get("o", "").split(","))
        plain_bind = kind in ("", "none") and bool(bind_flags & {"bind", "rbind"})
        if not settings.enable_bind_mounts:
            raise SpecError(
                f"{field}.source",
                f"volume {mount.source!r} is backed by the host "
                f"({options!r}); that is a bind mount, and bind mounts are disabled",
            )
        if not plain_bind or not device.startswith("/"):
            raise SpecError(
                f"{field}.source",
                f"volume {mount.source!r} has driver options "
                f"{options!r}; only a plain bind of a host directory is allowed",
            )
        resolve_host_path(f"{field}.source", device, state_dir=settings.supervisor_state_dir)
    volume_options: dict[str, object] = {"NoCopy": True}
    if mount.subpath is not None:
        major, minor = (int(part) for part in engine.api_version.split("."))
        if (major, minor) < SUBPATH_API:
            raise SpecError(
                f"{field}.subpath",
                f"needs Engine API 1.45 (Docker 26); this "
                f"daemon speaks {engine.api_version} and would mount the whole "
                "volume",
            )
        volume_options["Subpath"] = mount.subpath
    resolved.mounts.append(
        MountSpec(
            type="volume",
            source=mount.source,
            target=mount.target,
            read_only=mount.read_only,
            volume_options=volume_options,
        )
    )
    resolved.expected.append(
        ExpectedMount(
            type="volume", source=mount.source, destination=mount.target, rw=not mount.read_only
        )
    )


UID_RANGE_MAX_AGE_S = 60.0
"""How long a daemon's uid range is kept (per socket, in this process): whether it maps its
containers' uids changes only with its configuration, and a one-shot run opens a fresh engine
each time."""
_uid_ranges: dict[str, tuple[float, UidRange]] = {}


async def daemon_remapping(engine: Engine) -> str | None:
    """``userns`` or ``rootless`` when the daemon maps its containers' uids to subordinate host
    ids (its ``/info``, or Podman's rootless flag), else None (``sbxkit._model.uids.remapping``)."""
    if engine.is_podman:
        return "rootless" if (await engine.podman_host()).security.rootless else None
    return remapping((await engine.cached_info()).security_options or [])


async def sandbox_uid_range(engine: Engine) -> UidRange:
    """Where a sandbox's own uid comes from on this daemon (``sbxkit._model.uids``): ``MAPPED_UIDS``
    when it maps container uids to subordinate ids (``userns-remap``, rootless), else
    ``HOST_UIDS``."""
    now = time.monotonic()
    kept = _uid_ranges.get(engine.socket_path)
    if kept is not None and now - kept[0] < UID_RANGE_MAX_AGE_S:
        return kept[1]
    uids = MAPPED_UIDS if await daemon_remapping(engine) is not None else HOST_UIDS
    _uid_ranges[engine.socket_path] = (now, uids)
    return uids


async def root_inside_witness(
    engine: Engine, runtime: str | None, userns_mode: str | None
) -> str | None:
    """What says root inside a container is not root on the host, for this daemon, runtime
    and ``HostConfig.UsernsMode`` (``ROOT_INSIDE_WITNESSES``), or None: gVisor by the runtime
    asked for; else the daemon's own word — it remaps user namespaces, or runs rootless; else,
    on rootful Podman, a body that asks for a user namespace of its own
    (``PODMAN_AUTO_USERNS``). Another ``userns_mode`` is no witness: on a remapping Docker,
    ``host`` would undo the remapping."""
    if userns_mode is not None and userns_mode != PODMAN_AUTO_USERNS:
        return None
    if runtime_name(runtime) == GVISOR_RUNTIME:
        return "gvisor" if userns_mode is None else None
    remapped = await daemon_remapping(engine)
    if remapped is not None:
        return remapped if userns_mode is None else None
    if engine.is_podman and userns_mode == PODMAN_AUTO_USERNS:
        return PODMAN_AUTO_WITNESS
    return None


async def planned_root_witness(engine: Engine, runtime: str | None) -> str | None:
    """The witness a workspace's root is planned on (``root_inside_witness``): rootful Podman's
    is a body with ``PODMAN_AUTO_USERNS``, every other one a body without a ``UsernsMode``."""
    witness = await root_inside_witness(engine, runtime, None)
    if witness is None and engine.is_podman:
        witness = await root_inside_witness(engine, runtime, PODMAN_AUTO_USERNS)
    return witness


def planned_userns_mode(witness: str | None) -> str | None:
    """The ``HostConfig.UsernsMode`` a body planned on ``witness`` carries (pure)."""
    return PODMAN_AUTO_USERNS if witness == PODMAN_AUTO_WITNESS else None


QUOTA_DRIVERS = frozenset({"btrfs"})
"""Storage drivers whose ``StorageOpt`` ``size`` sbxkit relies on for a writable image's bound
(the kernel's quota: a write past it fails). btrfs counts the image's blocks as well, so the
size asked is the image's plus the bound. overlay2 takes a size only on XFS with project
quotas, which this project's test hosts lack: there, as on every other driver, the supervisor
watches the daemon's ``SizeRw`` instead (docs/workspace.md)."""


async def disk_quota_base(engine: Engine, image_size: int) -> int | None:
    """What the daemon's storage quota counts besides a writable image's writes, or None where
    no quota is relied on (Podman, and drivers outside ``QUOTA_DRIVERS``)."""
    if engine.is_podman:
        return None
    driver = (await engine.cached_info()).driver
    return image_size if driver in QUOTA_DRIVERS else None


class InfoFacts(msgspec.Struct, frozen=True):
    """What planning needs of a daemon's ``/info``, judged once a minute per socket."""

    read_at: float
    rootless_refusal: SpecError | None
    """Why a rootless Docker daemon cannot hold the limits (``check_rootless_docker``)."""
    default_runtime: str
    registered: tuple[str, ...]
    remapped: bool
    """Its container uids are subordinate host ids (userns-remap or rootless: ``remapping``)."""


_daemon_facts: dict[str, InfoFacts] = {}


async def info_facts(engine: Engine) -> InfoFacts:
    """The daemon's ``InfoFacts``, read once a minute per socket, as the uid range is
    (``UID_RANGE_MAX_AGE_S``): a one-shot run opens a fresh engine each time."""
    now = time.monotonic()
    kept = _daemon_facts.get(engine.socket_path)
    if kept is None or now - kept.read_at >= UID_RANGE_MAX_AGE_S:
        info = await engine.cached_info()
        verdict: SpecError | None = None
        if not engine.is_podman:
            try:
                check_rootless_docker(
                    info.security_options or [],
                    cgroup_version=info.cgroup_version,
                    memory=info.memory_limit,
                    pids=info.pids_limit,
                    cpu=info.cpu_cfs_quota,
                )
            except SpecError as refused:
                verdict = refused
        kept = InfoFacts(
            now,
            verdict,
            info.default_runtime,
            tuple(info.runtimes or {}),
            remapping(info.security_options or []) is not None,
        )
        _daemon_facts[engine.socket_path] = kept
    return kept


class DaemonPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon's ``/info`` decided: the runtime's daemon name and the CDI GPU ids."""

    runtime: str | None = None
    gpu_devices: list[str] | None = None
    host_rlimits: bool = False
    """The engine drops ``HostConfig.Ulimits`` (rootless Podman): the host sets them on the
    sandbox's processes before its payload runs (``sbxkit._kernel.rlimits``)."""


async def check_daemon(engine: Engine, spec: SandboxSpec, gpu_cursor: GpuCursor) -> DaemonPlan:
    """Refuse a runtime the daemon lacks and resolve GPUs, before any container exists.

    The runtime is ``plan_runtime``'s (crun by default where a runc-default Docker daemon
    registers it); its ``/info`` facts are kept per socket a minute (``info_facts``), as
    the one-shot path's hot loop would otherwise ask for them on every run. The GPU cursor
    advances only when devices were chosen by count. A Podman service that cannot enforce the
    limits (rootless on cgroup v1: no controllers) is refused (its answer is read once), and
    so is a runtime other than its default, which its compat API would silently ignore; so is
    a rootless Docker daemon that cannot hold the limits (``InfoFacts.rootless_refusal``).
    Rootless Podman on v2 drops the rlimits: the host sets them (``DaemonPlan.host_rlimits``).
    """
    facts = None if engine.is_podman else await info_facts(engine)  # read once per plan
    if facts is not None and facts.rootless_refusal is not None:
        raise SpecError(facts.rootless_refusal.field, facts.rootless_refusal.rule)
    host_rlimits = False
    if engine.is_podman:
        host = await engine.podman_host()
        host_rlimits = check_podman_controllers(
            host.cgroup_controllers or [],
            rootless=host.security.rootless,
            version=host.cgroup_version,
        )
        if spec.runtime is not None:
            check_podman_runtime(spec.runtime, (await engine.cached_info()).default_runtime)
    if engine.is_podman and spec.runtime is None and spec.gpus is None:
        return DaemonPlan(host_rlimits=host_rlimits)
    if facts is None:
        facts = await info_facts(engine)
    runtime = plan_runtime(
        spec.runtime,
        podman=engine.is_podman,
        default_runtime=facts.default_runtime,
        registered=facts.registered,
        fsize_bytes=spec.limits.fsize_bytes,
        gpus=spec.gpus is not None,
        remapped=facts.remapped,
    )
    if spec.gpus is None:
        return DaemonPlan(runtime=runtime, host_rlimits=host_rlimits)
    info = await engine.cached_info()  # CDI devices, read fresh for each choice by count
    gpu_devices, gpu_cursor.position = resolve_gpus(spec.gpus, info, gpu_cursor.position)
    return DaemonPlan(runtime=runtime, gpu_devices=gpu_devices, host_rlimits=host_rlimits)
