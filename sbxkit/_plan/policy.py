"""Turn a validated SandboxSpec into the one hardened container-create body sbxkit sends.

Pure: no I/O, no randomness, no environment. Every hardening choice is fixed here rather than
configurable, so a spec cannot weaken it: the spec only supplies the workload and its bounds.
The body is explicit about each protection (``Privileged=False``, ``AutoRemove=False`` ...)
instead of relying on daemon defaults, so an inspect after create can compare field by field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TypedDict, TypeVar, Unpack

import msgspec

from sbxkit._model.gpu import device_request
from sbxkit._model.mounts import ResolvedMounts
from sbxkit._model.network_terms import (
    MANAGED_ALIASES,
    NetworkTerms,
    network_env,
    network_mode,
    owned_keys,
    spec_owned_keys,
    unset_env,
)
from sbxkit._model.rules import (
    DISK_LABEL,
    HOST_GATEWAY_ALIAS,
    ROOT_INSIDE_CAPS,
    RUNTIME_ENV_KEYS,
    SCRATCH_HOME,
    merge_env,
    runtime_env,
)
from sbxkit._model.runtimes import runtime_name
from sbxkit._model.settings import Settings
from sbxkit._model.spec import (
    LEASE_LABEL,
    ROOT_USER,
    SandboxSpec,
    body_ids,
    root_inside,
    spec_labels,
    validate_spec,
    writable_image,
)
from sbxkit._model.uids import HOST_UIDS, UidRange, uid_for_lease
from sbxkit._util.public import publish
from sbxkit.engine.models import (
    ContainerCreate,
    ContainerInspect,
    HealthConfig,
    HostConfig,
    LogConfig,
    RestartPolicy,
    Ulimit,
)
from sbxkit.errors import SpecError

__all__ = [
    "DISK_LABEL",
    "LEASE_LABEL",
    "SCRATCH_PATH",
    "build_create_body",
    "container_name",
    "disk_bound",
    "hardened_body",
    "scratch_options",
    "watched_container",
    "watched_disk",
    "with_own_user",
]

_T = TypeVar("_T")

SCRATCH_PATH = "/tmp"
"""Where the bounded tmpfs scratch space is mounted; the root filesystem is read-only."""

_LEASE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Lease ids become part of a container name, which Docker restricts to this alphabet."""


def _check_lease(lease: str) -> None:
    if not isinstance(lease, str) or _LEASE_RE.fullmatch(lease) is None:
        raise SpecError("lease", "must match [A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def container_name(lease: str) -> str:
    """The container's name for a lease; unique per lease, so a retried create conflicts."""
    _check_lease(lease)
    return f"sbxkit-{lease}"


def scratch_options(spec: SandboxSpec, *, podman: bool = False) -> str:
    """tmpfs options for /tmp: bounded, non-executable (unless a workspace asks,
    ``Workspace.exec_tmp``), owned by the sandbox user.

    ``mode=1777`` is lost when the image already has a /tmp (Docker copies the directory's
    mode up), but ``uid``/``gid`` survive, so the sandbox user can always write its scratch.
    Podman refuses ``uid=``/``gid=`` ("unknown mount option") but keeps ``mode=1777``, so
    there the sticky, world-writable mode is what lets the sandbox user write.
    """
    exec_tmp = spec.workspace is not None and spec.workspace.exec_tmp
    noexec = "exec," if exec_tmp else "noexec,"  # Docker's own default is noexec
    options = f"rw,nosuid,nodev,{noexec}size={spec.limits.scratch_bytes},mode=1777"
    if podman:
        return options
    uid, gid = body_ids(spec.user or "")
    return f"{options},uid={uid},gid={gid}"


PODMAN_ULIMITS = (
    Ulimit(name="nofile", soft=1024, hard=4096),
    Ulimit(name="nproc", soft=32768, hard=32768),
)
"""Podman's default ``nofile``/``nproc`` exceed common hard limits, and start then fails with
"setrlimit RLIMIT_NOFILE: Operation not permitted"; Docker inherits containerd's. These
values sit under the hard limits seen on CI (20000 / 96364); ``nproc`` counts per host uid,
so it is far above any pids ceiling, which stays the real bound."""


NO_MESSAGE_QUEUES = Ulimit(name="msgqueue", soft=0, hard=0)
"""RLIMIT_MSGQUEUE 0: the payload cannot create a POSIX message queue (``mq_open`` and a file
in ``/dev/mqueue`` fail with EMFILE), so /dev/mqueue is no writable place; the default 800 KiB
per uid would be shared by every sandbox running as that uid."""


PODMAN_SEALED_TMPFS = {
    path: "ro,nosuid,nodev,noexec,size=4096,mode=755" for path in ("/run", "/var/tmp")
}
"""Podman's compat API mounts a writable, unbounded, executable tmpfs on /run and /var/tmp of
every read-only container (``--read-only-tmpfs``, which the API cannot turn off). A mount of
sbxkit's own at those paths replaces them: tiny and read-only, so /tmp stays the one writable,
bounded scratch space, as under Docker."""


def _required(value: _T | None, field: str) -> _T:
    """Narrow an Optional that validate_spec already checked (kept correct under python -O)."""
    if value is None:
        raise SpecError(field, "mandatory: set a finite bound")
    return value


def _env_list(env: dict[str, str]) -> list[str]:
    """Sorted so the same spec always produces byte-identical bodies."""
    return [f"{key}={value}" for key, value in sorted(env.items())]


def container_env(
    spec: SandboxSpec, lease: str, network: NetworkTerms | None = None
) -> dict[str, str]:
    """The spec's environment with the runtime's keys (``SBXKIT_LEASE``, ``SBXKIT_SANDBOX``,
    and a governed network's: the proxy variables, ``SBXKIT_ENDPOINT``, the TLS paths)
    written last, so no user or profile value can impersonate another lease or route around
    the proxy."""
    runtime = {**runtime_env(lease), **network_env(network)}
    return merge_env(spec.env, runtime=runtime, owned=owned_keys(network))


def claim_env(spec: SandboxSpec) -> dict[str, str]:
    """The spec's environment as a pool's claim line exports it: without the keys the runtime
    owns (the lease's, a governed network's), which the parked container's body already holds
    and no spec may override."""
    owned = spec_owned_keys(spec.network) | set(RUNTIME_ENV_KEYS)
    return {key: value for key, value in spec.env.items() if key not in owned}


def named_callback(network: NetworkTerms | None) -> bool:
    """A governed (``none``) sandbox whose callback is reached by name: Docker must give it its
    own ``/etc/hosts`` (``NetworkDisabled=false``; still only loopback under ``none``), which
    the governor extends with that name before the payload runs."""
    return network is not None and network.mode == "none" and network.callback is not None


def managed_hosts(network: NetworkTerms) -> list[str]:
    """``ExtraHosts`` of the managed network: the reference's host aliases, on the bridge's
    gateway (native Linux) or Docker's ``host-gateway`` (Docker Desktop and its kin)."""
    target = network.gateway or "host-gateway"
    return [f"{alias}:{target}" for alias in MANAGED_ALIASES]


def _gpu_ids(spec: SandboxSpec, gpu_devices: Sequence[str] | None) -> list[str] | None:
    """CDI ids for the body: resolved ones from the I/O shell, or the spec's explicit list."""
    if spec.gpus is None:
        if gpu_devices:
            raise SpecError("gpus", "GPU devices were resolved for a spec that asks for none")
        return None
    if gpu_devices is not None:
        if not gpu_devices:
            raise SpecError("gpus", "the resolved GPU device list is empty")
        return list(gpu_devices)
    if spec.gpus.devices is None:
        raise SpecError(
            "gpus.count",
            "a GPU count is resolved against the daemon's CDI devices before the body is built",
        )
    return list(spec.gpus.devices)


class BodyInputs(TypedDict, total=False):
    """What the I/O shell resolved for a body (``hardened_body``'s keywords)."""

    settings: Settings | None
    resolved: ResolvedMounts | None
    gpu_devices: Sequence[str] | None
    podman: bool
    network: NetworkTerms | None
    uids: UidRange
    image_env: Mapping[str, str]
    disk_quota_base: int | None
    userns_mode: str | None


def with_own_user(spec: SandboxSpec, lease: str, uids: UidRange = HOST_UIDS) -> SandboxSpec:
    """``spec`` as it runs under ``lease``: a spec that names no user gets the lease's own uid
    (and the same gid) in ``uids`` (``sbxkit._model.uids``); a workspace with root inside,
    root (``ROOT_USER``)."""
    if spec.user is not None:
        return spec
    if root_inside(spec):
        return msgspec.structs.replace(spec, user=ROOT_USER)
    uid = uid_for_lease(lease, uids)
    return msgspec.structs.replace(spec, user=f"{uid}:{uid}")


def with_scratch_home(spec: SandboxSpec, image_env: Mapping[str, str]) -> SandboxSpec:
    """``spec`` with ``HOME`` set to the scratch space, for a sandbox that runs as a uid of its
    own: no ``/etc/passwd`` of an image names it, so runc would say ``HOME=/`` (read-only) and
    crun would leave it unset. A ``HOME`` the spec or the image sets stays theirs."""
    if "HOME" in spec.env or "HOME" in image_env:
        return spec
    return msgspec.structs.replace(spec, env={**spec.env, **SCRATCH_HOME})


def _owned_tmpfs(options: str, user: str) -> str:
    """A resolved tmpfs of a spec that named no user, given the sandbox's own uid."""
    if any(option.startswith("uid=") for option in options.split(",")):
        return options
    uid, gid = body_ids(user)
    return f"{options},uid={uid},gid={gid}"


def build_create_body(
    spec: SandboxSpec, lease: str, **inputs: Unpack[BodyInputs]
) -> ContainerCreate:
    """Validate the spec, then ``hardened_body`` (the plan builder, which validated already,
    calls ``hardened_body`` itself)."""
    validate_spec(spec, inputs.get("settings"))
    return hardened_body(spec, lease, **inputs)


def hardened_body(
    spec: SandboxSpec,
    lease: str,
    *,
    settings: Settings | None = None,
    resolved: ResolvedMounts | None = None,
    gpu_devices: Sequence[str] | None = None,
    podman: bool = False,
    network: NetworkTerms | None = None,
    uids: UidRange = HOST_UIDS,
    image_env: Mapping[str, str] | None = None,
    disk_quota_base: int | None = None,
    userns_mode: str | None = None,
) -> ContainerCreate:
    """The hardened create body for a stopped container, for a spec ``validate_spec`` accepted.

    ``Entrypoint`` is an empty list, not omitted: omitted means "use the image's entrypoint",
    which would run image-chosen code in front of the command (and turn the command into its
    arguments). Docker treats a present-but-empty Entrypoint as "none", so the command runs
    exactly as given, under tini (``Init=True``).

    ``network="bridge"`` (allowed outside production only) opens the network:
    ``NetworkMode=bridge``, ``NetworkDisabled=false`` and a ``host.docker.internal`` alias for
    the host gateway; ``managed`` joins sbxkit's managed bridge (``network`` carries its name
    and gateway) with the reference's host aliases. A governed network (``network`` terms with
    mode none) stays ``NetworkMode=none`` and adds only its owned variables (and a tiny
    root-owned tmpfs for a client TLS bundle). ``gpu_devices`` are CDI ids the I/O shell
    resolved against the daemon (required when ``spec.gpus`` is a count). ``podman`` adapts
    the body to a Podman API service: scratch tmpfs without ``uid``/``gid`` and explicit
    ``nofile``/``nproc``. A spec that names no user runs as the lease's own uid in ``uids``
    (``with_own_user``) and, unless the spec or the image (``image_env``) sets one, the scratch
    space as its ``HOME`` (``with_scratch_home``). A workspace with ``disk_bytes`` has a
    writable root filesystem, labelled with its bound (``DISK_LABEL``); ``disk_quota_base``
    (the daemon's storage enforces ``StorageOpt`` ``size``) makes that bound the kernel's:
    ``size`` is the base (what the driver counts besides the writes) plus the bound.
    ``userns_mode``: a workspace's root on rootful Podman, in a user namespace of its own
    (``PODMAN_AUTO_USERNS``, ``sbxkit._plan.preflight.planned_userns_mode``).
    """
    _check_lease(lease)
    if userns_mode is not None and not root_inside(spec):
        raise SpecError("workspace", "only a workspace's root takes a user namespace of its own")
    if spec.user is None:
        spec = with_scratch_home(spec, image_env or {})
    spec = with_own_user(spec, lease, uids)
    assert spec.user is not None
    resolved = resolved or ResolvedMounts()
    if not podman:
        user = spec.user
        tmpfs = {path: _owned_tmpfs(options, user) for path, options in resolved.tmpfs.items()}
        resolved = msgspec.structs.replace(resolved, tmpfs=tmpfs)
    mode = network_mode(spec.network)
    bridge = mode == "bridge"
    managed = network if mode == "managed" else None
    if mode == "managed" and (managed is None or managed.network_name is None):
        raise SpecError("network", "the managed network is resolved before the body is built")
    routed = bridge or managed is not None
    network_mode_value = "bridge" if bridge else "none"
    extra_hosts = [HOST_GATEWAY_ALIAS] if bridge else None
    if managed is not None:
        assert managed.network_name is not None
        network_mode_value, extra_hosts = managed.network_name, managed_hosts(managed)
    gpu_ids = _gpu_ids(spec, gpu_devices)
    disk = writable_image(spec)
    storage_opt = None
    if disk is not None and disk_quota_base is not None:
        storage_opt = {"size": str(disk_quota_base + disk)}
    labels = {**spec_labels(spec), **(settings.labels if settings else {}), LEASE_LABEL: lease}
    if disk is not None:
        labels[DISK_LABEL] = str(disk)
    limits = spec.limits
    cpus = _required(limits.cpus, "limits.cpus")
    memory = _required(limits.memory_bytes, "limits.memory_bytes")
    host_config = HostConfig(
        nano_cpus=round(cpus * 1e9),
        memory=memory,
        memory_swap=memory,
        pids_limit=_required(limits.pids, "limits.pids"),
        ulimits=[
            Ulimit(name="fsize", soft=limits.fsize_bytes, hard=limits.fsize_bytes),
            NO_MESSAGE_QUEUES,
            *(PODMAN_ULIMITS if podman else ()),
        ],
        shm_size=limits.shm_bytes,
        readonly_rootfs=disk is None,
        storage_opt=storage_opt,
        ipc_mode="private",
        cgroupns_mode="private",
        cap_drop=["ALL"],
        cap_add=list(ROOT_INSIDE_CAPS) if root_inside(spec) else None,
        security_opt=["no-new-privileges"],
        restart_policy=RestartPolicy(name="no"),
        log_config=LogConfig(type="none"),
        network_mode=network_mode_value,
        extra_hosts=extra_hosts,
        init=True,
        privileged=False,
        auto_remove=False,
        tmpfs={
            SCRATCH_PATH: scratch_options(spec, podman=podman),
            **(PODMAN_SEALED_TMPFS if podman else {}),
            **(network.tmpfs if network is not None else {}),
            **resolved.tmpfs,
        },
        binds=list(resolved.binds) or None,
        mounts=list(resolved.mounts) or None,
        runtime=runtime_name(spec.runtime),
        device_requests=[device_request(gpu_ids)] if gpu_ids else None,
        userns_mode=userns_mode,
    )
    return ContainerCreate(
        image=spec.image,
        cmd=list(spec.command),
        entrypoint=[],
        env=[*_env_list(container_env(spec, lease, network)), *unset_env(network, podman=podman)],
        user=spec.user,
        working_dir=spec.workdir,
        labels=labels,
        attach_stdin=True,
        attach_stdout=True,
        attach_stderr=True,
        open_stdin=True,
        stdin_once=True,
        tty=False,
        network_disabled=not routed and not named_callback(network),
        healthcheck=HealthConfig(test=["NONE"]),
        host_config=host_config,
    )


def disk_bound(body: ContainerCreate) -> int | None:
    """The bound a writable root filesystem is held to (``DISK_LABEL``), or None (read-only,
    or a label that is not a positive count: ``recheck_body`` refuses such a body)."""
    label = (body.labels or {}).get(DISK_LABEL, "")
    host = body.host_config
    if host is None or host.readonly_rootfs is not False or not label.isdigit():
        return None
    return int(label) or None


def watched_disk(body: ContainerCreate) -> int | None:
    """The bound the supervisor watches (``SizeRw``): a writable root filesystem's, unless the
    daemon's storage holds it already (``StorageOpt`` ``size``)."""
    host = body.host_config
    return None if host is None or host.storage_opt else disk_bound(body)


def watched_container(info: ContainerInspect) -> int | None:
    """``watched_disk`` for a created container (a re-adopted lease has no body): the same
    rule on what the daemon recorded."""
    host = info.host_config
    body = ContainerCreate(
        image=info.image,
        labels=info.config.labels,
        host_config=HostConfig(readonly_rootfs=host.readonly_rootfs, storage_opt=host.storage_opt),
    )
    return watched_disk(body)


publish(__name__, globals())  # public names show as sbxkit.NAME
