"""msgspec models for the Engine API endpoints sbxkit uses.

Request bodies omit unset fields so the daemon applies nothing we did not ask for. Response
models accept unknown fields: the daemon adds fields in every release. Field names follow the
API's PascalCase; the few keys that do not (``OOMKilled``, ``message``) are renamed explicitly.
"""

from __future__ import annotations

import msgspec


class Body(msgspec.Struct, rename="pascal", omit_defaults=True):
    """Base for request bodies we send: unset means absent from the JSON."""


class Reply(msgspec.Struct, rename="pascal"):
    """Base for daemon responses: unknown fields are ignored, missing ones take defaults."""


# --- container create -------------------------------------------------------------------------


class Ulimit(Body):
    name: str
    soft: int
    hard: int


class RestartPolicy(Body):
    name: str


class LogConfig(Body):
    type: str


class HealthConfig(Body):
    test: list[str]


class DeviceRequest(Body):
    driver: str | None = None
    count: int | None = None
    device_ids: list[str] | None = msgspec.field(default=None, name="DeviceIDs")
    capabilities: list[list[str]] | None = None


class MountSpec(Body):
    """An entry of HostConfig.Mounts (bind, volume or tmpfs)."""

    type: str
    target: str
    source: str | None = None
    read_only: bool | None = None
    bind_options: dict[str, object] | None = None
    volume_options: dict[str, object] | None = None
    tmpfs_options: dict[str, object] | None = None


class HostConfig(Body):
    nano_cpus: int | None = None
    memory: int | None = None
    memory_swap: int | None = None
    pids_limit: int | None = None
    ulimits: list[Ulimit] | None = None
    readonly_rootfs: bool | None = None
    ipc_mode: str | None = None
    cgroupns_mode: str | None = None
    cap_drop: list[str] | None = None
    cap_add: list[str] | None = None
    security_opt: list[str] | None = None
    restart_policy: RestartPolicy | None = None
    log_config: LogConfig | None = None
    network_mode: str | None = None
    init: bool | None = None
    privileged: bool | None = None
    auto_remove: bool | None = None
    tmpfs: dict[str, str] | None = None
    binds: list[str] | None = None
    mounts: list[MountSpec] | None = None
    runtime: str | None = None
    extra_hosts: list[str] | None = None
    device_requests: list[DeviceRequest] | None = None
    shm_size: int | None = None
    storage_opt: dict[str, str] | None = None
    userns_mode: str | None = None


class ContainerCreate(Body):
    image: str
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None
    env: list[str] | None = None
    user: str | None = None
    working_dir: str | None = None
    labels: dict[str, str] | None = None
    attach_stdin: bool | None = None
    attach_stdout: bool | None = None
    attach_stderr: bool | None = None
    open_stdin: bool | None = None
    stdin_once: bool | None = None
    tty: bool | None = None
    network_disabled: bool | None = None
    healthcheck: HealthConfig | None = None
    stop_signal: str | None = None
    host_config: HostConfig | None = None


class ContainerCreateReply(Reply):
    id: str
    warnings: list[str] | None = None


# --- inspect, list, wait ------------------------------------------------------------------------


class ContainerState(Reply):
    status: str = ""
    running: bool = False
    oom_killed: bool = msgspec.field(default=False, name="OOMKilled")
    exit_code: int = 0
    error: str = ""
    pid: int = 0
    started_at: str = ""
    finished_at: str = ""


class ContainerConfigReply(Reply):
    image: str = ""
    user: str = ""
    labels: dict[str, str] | None = None
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None


class UlimitReply(Reply):
    name: str = ""
    soft: int = 0
    hard: int = 0


class LogConfigReply(Reply):
    type: str = ""


class RestartPolicyReply(Reply):
    name: str = ""


class DeviceRequestReply(Reply):
    driver: str = ""
    count: int = 0
    device_ids: list[str] | None = msgspec.field(default=None, name="DeviceIDs")


class HostConfigReply(Reply):
    ipc_mode: str = ""
    cgroupns_mode: str = ""
    auto_remove: bool = False
    log_config: LogConfigReply | None = None
    restart_policy: RestartPolicyReply | None = None
    nano_cpus: int = 0
    memory: int = 0
    memory_swap: int = 0
    pids_limit: int | None = None
    readonly_rootfs: bool = False
    privileged: bool = False
    network_mode: str = ""
    cap_add: list[str] | None = None
    cap_drop: list[str] | None = None
    security_opt: list[str] | None = None
    ulimits: list[UlimitReply] | None = None
    tmpfs: dict[str, str] | None = None
    init: bool | None = None
    runtime: str = ""
    binds: list[str] | None = None
    extra_hosts: list[str] | None = None
    device_requests: list[DeviceRequestReply] | None = None
    shm_size: int = 0
    storage_opt: dict[str, str] | None = None


class MountPoint(Reply):
    type: str = ""
    name: str = ""
    source: str = ""
    destination: str = ""
    rw: bool = msgspec.field(default=False, name="RW")


class ContainerInspect(Reply):
    id: str
    name: str = ""
    image: str = ""
    """The id of the image the container was created from."""
    state: ContainerState = msgspec.field(default_factory=ContainerState)
    config: ContainerConfigReply = msgspec.field(default_factory=ContainerConfigReply)
    host_config: HostConfigReply = msgspec.field(default_factory=HostConfigReply)
    mounts: list[MountPoint] | None = None
    hosts_path: str = ""
    """The daemon's own file bind-mounted at the container's ``/etc/hosts``."""
    size_rw: int | None = None
    """Bytes the container wrote to its own filesystem layer (asked with ``size=1`` only)."""


class ContainerSummary(Reply):
    id: str
    names: list[str] | None = None
    labels: dict[str, str] | None = None
    state: str = ""


class WaitError(Reply):
    message: str = ""


class ContainerWaitReply(Reply):
    status_code: int
    error: WaitError | None = None


class VolumeReply(Reply):
    name: str = ""
    driver: str = ""
    mountpoint: str = ""
    options: dict[str, str] | None = None


# --- images, system ----------------------------------------------------------------------------


class ImageConfig(Reply):
    volumes: dict[str, object] | None = None
    env: list[str] | None = None
    user: str = ""
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None


class ImageInspect(Reply):
    id: str
    config: ImageConfig | None = None
    size: int = 0


class VersionReply(Reply):
    version: str = ""
    api_version: str = ""
    min_api_version: str = msgspec.field(default="", name="MinAPIVersion")
    os: str = msgspec.field(default="", name="Os")
    arch: str = ""
    kernel_version: str = ""


class RuntimeInfo(Reply):
    path: str = msgspec.field(default="", name="path")


class DiscoveredDevice(Reply):
    """An entry of ``/info`` ``DiscoveredDevices`` (API 1.48+): a device a driver can provide."""

    source: str = ""
    id: str = msgspec.field(default="", name="ID")


class InfoReply(Reply):
    runtimes: dict[str, RuntimeInfo] | None = None
    default_runtime: str = ""
    cgroup_version: str = ""
    cgroup_driver: str = ""
    server_version: str = ""
    ncpu: int = msgspec.field(default=0, name="NCPU")
    mem_total: int = 0
    cdi_spec_dirs: list[str] | None = msgspec.field(default=None, name="CDISpecDirs")
    discovered_devices: list[DiscoveredDevice] | None = None
    name: str = ""
    operating_system: str = ""
    kernel_version: str = ""
    security_options: list[str] | None = None
    memory_limit: bool = False
    pids_limit: bool = False
    cpu_cfs_quota: bool = False
    """Whether the daemon can enforce a memory, pids and CPU quota limit (a rootless daemon:
    whether its user's cgroup has that controller delegated)."""
    driver: str = ""
    """The storage driver (``overlay2``, ``btrfs`` ...)."""


class PodmanSecurity(msgspec.Struct, rename="camel"):
    rootless: bool = False


class PodmanHost(msgspec.Struct, rename="camel"):
    """The part of Podman's own ``/libpod/info`` sbxkit reads: which cgroup controllers the
    service may use (none when rootless on cgroup v1) and whether it is rootless."""

    cgroup_version: str = ""
    cgroup_controllers: list[str] | None = None
    security: PodmanSecurity = msgspec.field(default_factory=PodmanSecurity)


class PodmanInfo(msgspec.Struct):
    host: PodmanHost = msgspec.field(default_factory=PodmanHost)


class PodmanIdMappings(msgspec.Struct, rename="pascal"):
    """A container's user namespace maps as Podman recorded them at create (``INSIDE:HOST:COUNT``
    lines); absent when it has none of its own."""

    uid_map: list[str] | None = None
    gid_map: list[str] | None = None


class PodmanContainerHostConfig(msgspec.Struct, rename="pascal"):
    id_mappings: PodmanIdMappings | None = msgspec.field(default=None, name="IDMappings")


class PodmanContainerInspect(msgspec.Struct, rename="pascal"):
    """The part of Podman's own ``/libpod/containers/ID/json`` sbxkit reads."""

    host_config: PodmanContainerHostConfig = msgspec.field(
        default_factory=PodmanContainerHostConfig
    )


class ErrorReply(msgspec.Struct):
    message: str = ""


# --- events -----------------------------------------------------------------------------------


class EventActor(Reply):
    id: str = msgspec.field(default="", name="ID")
    attributes: dict[str, str] | None = None


class Event(msgspec.Struct):
    """One line of ``/events`` (lower-case top-level keys in this endpoint)."""

    type: str = msgspec.field(default="", name="Type")
    action: str = msgspec.field(default="", name="Action")
    actor: EventActor = msgspec.field(default_factory=EventActor, name="Actor")
    time_nano: int = msgspec.field(default=0, name="timeNano")
