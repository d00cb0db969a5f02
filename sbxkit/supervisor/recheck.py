"""The supervisor's second look at every create body: refuse what policy never produces.

Pure (``resolve`` aside, which the service passes as ``os.path.realpath`` and tests leave out).
The client builds bodies with ``sbxkit._plan.policy.build_create_body``; a raw client on the control
socket can send anything. The supervisor is no privilege boundary against its own account
(docs/security.md), but it sees every create, so it holds each body to the hardened invariants
and refuses the first broken one with the Engine API field it concerns:

- ``unknown_field``: the raw JSON may name only fields sbxkit's models carry (anything else —
  ``Devices``, ``PidMode``, ``VolumesFrom`` — would be dropped silently by decoding; it is
  refused instead, so a hostile body is seen as one);
- ``recheck_body``: the invariants themselves (the list is in docs/security.md, "The
  supervisor's re-check list"; ``tests/unit/test_recheck.py`` proves policy output passes).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from sbxkit._kernel.scripts import IO_TARGET, io_bind, io_root
from sbxkit._model.gpu import GpuRequest, validate_gpu_request
from sbxkit._model.mounts import check_host_path, check_target
from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_inject import inject_terms_problem
from sbxkit._model.network_terms import NetworkTerms, network_env, owned_keys
from sbxkit._model.rules import (
    HOST_GATEWAY_ALIAS,
    PODMAN_AUTO_USERNS,
    ROOT_INSIDE_CAPS,
    check_network,
)
from sbxkit._model.spec import ROOT_USER, body_ids, parse_user
from sbxkit._plan.policy import (
    DISK_LABEL,
    LEASE_LABEL,
    NO_MESSAGE_QUEUES,
    PODMAN_SEALED_TMPFS,
    PODMAN_ULIMITS,
    SCRATCH_PATH,
    disk_bound,
    managed_hosts,
    named_callback,
)
from sbxkit.engine.discovery import candidate_sockets
from sbxkit.engine.models import (
    ContainerCreate,
    DeviceRequest,
    HostConfig,
    MountSpec,
    VolumeReply,
)
from sbxkit.errors import SbxError, SpecError
from sbxkit.supervisor.config import Config

Resolve = Callable[[str], str]


class BodyRefusal(msgspec.Struct, frozen=True):
    """Why a body is refused: the Engine API field and the rule it breaks."""

    field: str
    reason: str


class _Refused(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason)
        self.refusal = BodyRefusal(field, reason)


def _refuse(field: str, reason: str) -> _Refused:
    return _Refused(field, reason)


# -- fields the models do not carry ---------------------------------------------------------------


def unknown_field(raw: object, model: type[msgspec.Struct] = ContainerCreate) -> str | None:
    """The path of the first key in the raw JSON ``raw`` that ``model`` does not carry."""
    return _unknown(raw, _type_info(model), "")


@functools.cache
def _type_info(model: type[msgspec.Struct]) -> msgspec.inspect.Type:
    """msgspec's description of a model (about a millisecond to build, so built once)."""
    return msgspec.inspect.type_info(model)


def _unknown(raw: object, info: msgspec.inspect.Type, path: str) -> str | None:
    if isinstance(info, msgspec.inspect.UnionType):
        for member in info.types:
            if not isinstance(member, msgspec.inspect.NoneType):
                found = _unknown(raw, member, path)
                if found is not None:
                    return found
        return None
    if isinstance(info, msgspec.inspect.StructType) and isinstance(raw, dict):
        fields = {f.encode_name: f.type for f in info.fields}
        for key, value in raw.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in fields:
                return where
            found = _unknown(value, fields[key], where)
            if found is not None:
                return found
        return None
    if isinstance(info, msgspec.inspect.ListType) and isinstance(raw, list):
        for index, item in enumerate(raw):
            found = _unknown(item, info.item_type, f"{path}[{index}]")
            if found is not None:
                return found
    return None


# -- the invariants -------------------------------------------------------------------------------


def recheck_body(
    body: ContainerCreate,
    *,
    lease: str,
    state_dir: str,
    environment: bytes | None,
    resolve: Resolve | None = None,
    io_dir_problem: IoDirProblem | None = None,
    network: NetworkTerms | None = None,
) -> BodyRefusal | None:
    """None when ``body`` is one policy can produce for ``lease``; else the first refusal.

    ``state_dir`` is the supervisor's own (no bind may overlap it); ``environment`` the raw
    ``SBXKIT_ENV`` the supervisor started with (bridge and managed are refused in
    production); ``resolve`` canonicalises bind sources on the host (links are followed and
    re-judged); ``io_dir_problem`` looks at a kernel path FIFO directory on the host;
    ``network`` the governed network the lease registered, which the body's network fields
    and owned variables must match exactly.
    """
    try:
        _check_config(body, lease)
        host = body.host_config
        if host is None:
            raise _refuse("HostConfig", "absent: no limits and no hardening")
        _check_hardening(host)
        if body.user == ROOT_USER and not host.cap_add:
            raise _refuse(
                "Config.User",
                f"{ROOT_USER} is only a workspace's root, which keeps {list(ROOT_INSIDE_CAPS)}",
            )
        if host.cap_add and body.user != ROOT_USER:
            raise _refuse("HostConfig.CapAdd", "only a workspace's root keeps capabilities")
        _check_userns(body, host)
        _check_limits(host)
        _check_disk(body, host)
        _check_network(body, host, environment, network)
        _check_owned_env(body, network)
        _check_tmpfs(
            host.tmpfs,
            owned=network.tmpfs if network is not None else {},
            exec_scratch=body.user == ROOT_USER or disk_bound(body) is not None,
        )
        binds = _check_io_bind(host.binds or [], body, lease, state_dir, io_dir_problem)
        _check_binds(binds, state_dir, resolve)
        _check_mounts(host.mounts or [])
        _check_devices(host.device_requests or [])
    except _Refused as refused:
        return refused.refusal
    return None


def _spec_rule(field: str, check: Callable[..., object], *args: Any, **kwargs: Any) -> None:
    """Run a policy rule; its SpecError becomes a refusal of ``field``."""
    try:
        check(*args, **kwargs)
    except SpecError as error:
        raise _refuse(field, error.rule) from None


def _check_config(body: ContainerCreate, lease: str) -> None:
    if body.user is None:
        raise _refuse("Config.User", "absent: the payload would run as the image's user")
    if body.user != ROOT_USER:  # a workspace's root: its daemon is asked in admitting.py
        _spec_rule("Config.User", parse_user, body.user, "Config.User")
    if (body.labels or {}).get(LEASE_LABEL) != lease:
        raise _refuse(f"Config.Labels.{LEASE_LABEL}", f"must be the registered lease {lease}")
    if body.entrypoint != []:
        raise _refuse("Config.Entrypoint", "must be [] (the image's entrypoint never runs)")
    if f"SBXKIT_LEASE={lease}" not in (body.env or []):
        raise _refuse("Config.Env", f"must carry SBXKIT_LEASE={lease}")
    if body.healthcheck is None or body.healthcheck.test != ["NONE"]:
        raise _refuse("Config.Healthcheck", 'must be {"Test": ["NONE"]}')


_EXPECTED: tuple[tuple[str, str, object], ...] = (
    ("cap_drop", "HostConfig.CapDrop", ["ALL"]),
    ("security_opt", "HostConfig.SecurityOpt", ["no-new-privileges"]),
    ("ipc_mode", "HostConfig.IpcMode", "private"),
    ("cgroupns_mode", "HostConfig.CgroupnsMode", "private"),
    ("auto_remove", "HostConfig.AutoRemove", False),
    ("init", "HostConfig.Init", True),
)


def _check_hardening(host: HostConfig) -> None:
    if host.privileged:
        raise _refuse("HostConfig.Privileged", "must be false")
    if host.cap_add and sorted(host.cap_add) != sorted(ROOT_INSIDE_CAPS):
        raise _refuse(
            "HostConfig.CapAdd",
            f"{host.cap_add!r}: only a workspace's root keeps any: {list(ROOT_INSIDE_CAPS)}",
        )
    for opt in host.security_opt or []:
        if opt != "no-new-privileges":
            raise _refuse(
                "HostConfig.SecurityOpt",
                f"{opt!r} is refused: only no-new-privileges (the daemon's default seccomp "
                "and AppArmor profiles stay on)",
            )
    for attribute, field, wanted in _EXPECTED:
        value = getattr(host, attribute)
        if value != wanted:
            raise _refuse(field, f"is {value!r}; policy sets {wanted!r}")
    if host.restart_policy is None or host.restart_policy.name != "no":
        raise _refuse("HostConfig.RestartPolicy", 'must be {"Name": "no"}')
    if host.log_config is None or host.log_config.type != "none":
        raise _refuse("HostConfig.LogConfig", 'must be {"Type": "none"}')


def _check_userns(body: ContainerCreate, host: HostConfig) -> None:
    """No ``UsernsMode`` (the daemon's), or rootful Podman's user namespace of a workspace's
    root's own (``PODMAN_AUTO_USERNS``; admitting.py asks whether the daemon is that Podman).
    ``host`` on a remapping Docker would run root inside as the host's root."""
    mode = host.userns_mode
    if mode is None:
        return
    if mode != PODMAN_AUTO_USERNS:
        raise _refuse(
            "HostConfig.UsernsMode",
            f"{mode!r} is refused: only {PODMAN_AUTO_USERNS!r}, a workspace's root's own user "
            "namespace on rootful Podman",
        )
    if body.user != ROOT_USER:
        raise _refuse("HostConfig.UsernsMode", "only a workspace's root takes one of its own")


_ALLOWED_ULIMITS = {u.name: u for u in PODMAN_ULIMITS} | {NO_MESSAGE_QUEUES.name: NO_MESSAGE_QUEUES}


def _positive(field: str, value: int | None) -> int:
    if value is None or isinstance(value, bool) or value <= 0:
        raise _refuse(field, f"is {value!r}; must be a bound > 0")
    return value


def _check_limits(host: HostConfig) -> None:
    memory = _positive("HostConfig.Memory", host.memory)
    if host.memory_swap != memory:
        raise _refuse("HostConfig.MemorySwap", f"must equal Memory ({memory}): no swap on top")
    _positive("HostConfig.NanoCpus", host.nano_cpus)
    _positive("HostConfig.PidsLimit", host.pids_limit)
    _positive("HostConfig.ShmSize", host.shm_size)
    names: list[str] = []
    for index, ulimit in enumerate(host.ulimits or []):
        field = f"HostConfig.Ulimits[{index}]"
        names.append(ulimit.name)
        if ulimit.name == "fsize":
            _positive(field, ulimit.soft)
            if ulimit.soft != ulimit.hard:
                raise _refuse(field, "fsize must have soft = hard")
        elif _ALLOWED_ULIMITS.get(ulimit.name) != ulimit:
            raise _refuse(field, f"{ulimit.name} {ulimit.soft}/{ulimit.hard} is not set by policy")
    for required in ("fsize", NO_MESSAGE_QUEUES.name):
        if names.count(required) != 1:
            raise _refuse("HostConfig.Ulimits", f"must set {required} exactly once")


def _check_disk(body: ContainerCreate, host: HostConfig) -> None:
    """A read-only root, or a workspace's writable one with its bound (``DISK_LABEL``) and at
    most a ``StorageOpt`` ``size`` no smaller than the bound."""
    label = (body.labels or {}).get(DISK_LABEL)
    if host.readonly_rootfs is True:
        if label is not None:
            raise _refuse(f"Config.Labels.{DISK_LABEL}", "only a writable root carries a bound")
        if host.storage_opt:
            raise _refuse("HostConfig.StorageOpt", "only a writable root takes a size")
        return
    if host.readonly_rootfs is not False:
        raise _refuse("HostConfig.ReadonlyRootfs", f"is {host.readonly_rootfs!r}; must be set")
    bound = disk_bound(body)
    if label is None:
        raise _refuse(
            "HostConfig.ReadonlyRootfs",
            f"is false without a bound: only a workspace's writable image (disk_bytes, "
            f"label {DISK_LABEL}) has a writable root",
        )
    if bound is None:
        raise _refuse(f"Config.Labels.{DISK_LABEL}", f"is {label!r}; must be a count of bytes")
    opts = host.storage_opt or {}
    if set(opts) - {"size"}:
        raise _refuse("HostConfig.StorageOpt", f"{sorted(opts)}: only size is set by policy")
    size = opts.get("size")
    if size is not None and not (size.isdigit() and int(size) >= bound):
        raise _refuse("HostConfig.StorageOpt", f"size {size!r} must be bytes >= the bound {bound}")


def _check_terms(network: NetworkTerms) -> None:
    if network.mode not in ("none", "managed"):
        raise _refuse("network.mode", "must be none or managed")
    try:
        parse_allow_list(network.allow, "network.allow")
    except SpecError as error:
        raise _refuse(error.field, error.rule) from None
    if network.mode == "managed" and network.allow:
        raise _refuse("network.allow", "a managed network routes; it takes no allow-list")
    if network.audit_log is not None and not network.audit_log.startswith("/"):
        raise _refuse("network.audit_log", "must be an absolute path")
    if network.mode == "none" and (network.gateway or network.network_name):
        raise _refuse("network.gateway", "only the managed network has a gateway")
    problem = inject_terms_problem(network.inject, network.allow, network.mode)
    if problem is not None:
        raise _refuse("network.inject", problem)


def _check_network(
    body: ContainerCreate,
    host: HostConfig,
    environment: bytes | None,
    network: NetworkTerms | None,
) -> None:
    mode = host.network_mode
    managed = network is not None and network.mode == "managed"
    if network is not None:
        _check_terms(network)
    if managed:
        assert network is not None
        _spec_rule("HostConfig.NetworkMode", check_network, "managed", environment)
        if mode != network.network_name:
            raise _refuse("HostConfig.NetworkMode", "must be the managed network's name")
        if body.network_disabled is not False:
            raise _refuse("Config.NetworkDisabled", "must be false for the managed network")
        if host.extra_hosts != managed_hosts(network):
            raise _refuse("HostConfig.ExtraHosts", "only the managed network's host aliases")
        return
    _spec_rule("HostConfig.NetworkMode", check_network, mode, environment)
    bridge = mode == "bridge"
    if network is not None and bridge:
        raise _refuse("HostConfig.NetworkMode", "a governed network is NetworkMode none")
    disabled = not bridge and not named_callback(network)
    if body.network_disabled is not disabled:
        raise _refuse("Config.NetworkDisabled", f"must be {str(disabled).lower()} for {mode}")
    extra = host.extra_hosts
    if extra is not None and not (bridge and extra == [HOST_GATEWAY_ALIAS]):
        raise _refuse("HostConfig.ExtraHosts", f"only [{HOST_GATEWAY_ALIAS!r}] under bridge")


def _check_owned_env(body: ContainerCreate, network: NetworkTerms | None) -> None:
    """The owned variables are exactly sbxkit's for the registered network, each listed once:
    a body cannot point the proxy variables elsewhere, and one it does not set is unset
    (``KEY``; ``KEY=`` for Podman: ``unset_env``) so an image's value cannot reach the payload.
    Listed twice, Docker hands both to the payload, where the first one wins a lookup."""
    wanted = network_env(network)
    owned = owned_keys(network)
    found: dict[str, list[str | None]] = {}
    for item in body.env or []:
        key, sep, value = item.partition("=")
        if key in owned:
            found.setdefault(key, []).append(value if sep else None)
    for key in owned:
        values = found.get(key, [])
        ok = len(values) == 1 and values[0] in ((wanted[key],) if key in wanted else (None, ""))
        if not ok:
            raise _refuse("Config.Env", "the governed network's variables are not sbxkit's")


_TMPFS_FLAGS = frozenset({"rw", "ro", "nosuid", "nodev", "noexec", "exec"})
_TMPFS_NUMBERS = {"size": re.compile(r"[1-9][0-9]{0,18}"), "uid": re.compile(r"[0-9]{1,10}")}
_TMPFS_NUMBERS |= {"gid": _TMPFS_NUMBERS["uid"], "mode": re.compile(r"[0-7]{1,4}")}


def _check_tmpfs(
    tmpfs: dict[str, str] | None,
    *,
    owned: dict[str, str] | None = None,
    exec_scratch: bool = False,
) -> None:
    """Bounded, nosuid, nodev tmpfs; the scratch also noexec, unless the body is a workspace's
    that may ask otherwise (``exec_scratch``: root inside or a writable image; exec_tmp)."""
    tmpfs = tmpfs or {}
    if SCRATCH_PATH not in tmpfs:
        raise _refuse("HostConfig.Tmpfs", f"must mount the bounded scratch at {SCRATCH_PATH}")
    for target, options in tmpfs.items():
        field = f"HostConfig.Tmpfs[{target}]"
        if owned and target in owned:
            if options != owned[target]:
                raise _refuse(field, f"must be {owned[target]!r} (the TLS bundle's)")
            continue
        if target in PODMAN_SEALED_TMPFS:
            if options != PODMAN_SEALED_TMPFS[target]:
                raise _refuse(field, f"must be {PODMAN_SEALED_TMPFS[target]!r} (sealed)")
            continue
        if target != SCRATCH_PATH:
            _spec_rule(field, check_target, field, target)
        parts = options.split(",")
        for part in parts:
            key, _, value = part.partition("=")
            pattern = _TMPFS_NUMBERS.get(key)
            if part not in _TMPFS_FLAGS and (pattern is None or not pattern.fullmatch(value)):
                raise _refuse(field, f"option {part!r} is not one policy sets")
        keys = [part.partition("=")[0] for part in parts]
        noexec = target == SCRATCH_PATH and not exec_scratch
        needed = ["size", "nosuid", "nodev"] + (["noexec"] if noexec else [])
        if noexec and "exec" in parts:
            raise _refuse(field, "must not have exec (the scratch is noexec)")
        for need in needed:
            if need not in keys:
                raise _refuse(field, f"must have {need} (a bounded, nosuid, nodev tmpfs)")
        if len(set(keys)) != len(keys):
            raise _refuse(field, "an option is repeated")


_BIND_OPTIONS = frozenset({"ro", "rw", "rprivate", "z", "Z"})
IoDirProblem = Callable[[str, int, int], "str | None"]
"""``(directory, uid, gid)`` → why it is not a lease's FIFO directory, or None."""


def _check_io_bind(
    binds: list[str],
    body: ContainerCreate,
    lease: str,
    state_dir: str,
    io_dir_problem: IoDirProblem | None,
) -> list[str]:
    """The kernel path's bind (sbxkit/kernel), judged by its own rule: the lease's directory
    under the state dir's FIFO root, read-only, holding only its three FIFOs of the sandbox
    user; the rest are ordinary binds."""
    ordinary = []
    for index, bind in enumerate(binds):
        source, _, rest = bind.partition(":")
        if not rest.startswith(IO_TARGET + ":"):
            ordinary.append(bind)
            continue
        field = f"HostConfig.Binds[{index}]"
        expected = str(io_root(Path(state_dir)) / lease)
        if bind != io_bind(expected):
            raise _refuse(field, f"the FIFO bind must be {io_bind(expected)}")
        uid, gid = body_ids(body.user or "")  # Config.User was checked before
        if io_dir_problem is not None:
            problem = io_dir_problem(source, uid, gid)
            if problem is not None:
                raise _refuse(field, problem)
    return ordinary


def _check_binds(binds: list[str], state_dir: str, resolve: Resolve | None) -> None:
    for index, bind in enumerate(binds):
        field = f"HostConfig.Binds[{index}]"
        parts = bind.split(":")
        if len(parts) != 3:
            raise _refuse(field, "must be SOURCE:TARGET:OPTIONS as policy writes it")
        source, target, options = parts
        _spec_rule(field, check_host_path, field, source, state_dir=state_dir)
        _spec_rule(field, check_target, field, target)
        flags = options.split(",")
        if not set(flags) <= _BIND_OPTIONS or "rprivate" not in flags:
            raise _refuse(field, f"options {options!r}: ro|rw, rprivate, and z|Z only")
        if (("ro" in flags) + ("rw" in flags)) != 1 or len(set(flags)) != len(flags):
            raise _refuse(field, f"options {options!r}: exactly one of ro and rw")
        if resolve is not None:
            real = resolve(source)
            if real != source:
                raise _refuse(field, f"{source} is not a resolved path (it resolves to {real})")
            real_state = resolve(state_dir)
            _spec_rule(field, check_host_path, field, real, state_dir=real_state)


_VOLUME_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", re.ASCII)


def _check_mounts(mounts: list[MountSpec]) -> None:
    for index, mount in enumerate(mounts):
        field = f"HostConfig.Mounts[{index}]"
        if mount.type != "volume":
            raise _refuse(field, f"type {mount.type!r}: binds and tmpfs travel elsewhere")
        if mount.source is None or not _VOLUME_NAME.fullmatch(mount.source):
            raise _refuse(f"{field}.Source", "must be an existing volume's name")
        _spec_rule(f"{field}.Target", check_target, f"{field}.Target", mount.target)
        if mount.read_only is None:
            raise _refuse(f"{field}.ReadOnly", "must be explicit")
        if mount.bind_options is not None or mount.tmpfs_options is not None:
            raise _refuse(field, "a volume mount carries VolumeOptions only")
        options: dict[str, Any] = dict(mount.volume_options or {})
        if options.get("NoCopy") is not True or not set(options) <= {"NoCopy", "Subpath"}:
            raise _refuse(
                f"{field}.VolumeOptions", "only NoCopy=true and Subpath (no DriverConfig)"
            )
        subpath = options.get("Subpath")
        if subpath is not None and (
            not isinstance(subpath, str) or subpath.startswith("/") or ".." in subpath.split("/")
        ):
            raise _refuse(f"{field}.VolumeOptions.Subpath", "must be relative without '..'")


def volume_backing_problem(
    volume: VolumeReply, state_dir: str, resolve: Resolve | None = None
) -> str | None:
    """Why a named volume the body mounts is not one policy lets through (the daemon's
    ``/volumes/{name}`` reply), or None: a plain local volume, or one that is a plain bind of
    a host directory no bind rule forbids (as ``sbxkit._plan.preflight`` judges it)."""
    if volume.driver != "local":
        return f"uses the driver {volume.driver!r}; only plain local volumes are allowed"
    options = volume.options or {}
    if not options:
        return None
    device = options.get("device", "")
    plain_bind = options.get("type", "") in ("", "none") and bool(
        set(options.get("o", "").split(",")) & {"bind", "rbind"}
    )
    if not plain_bind or not device.startswith("/"):
        return f"has driver options {options!r}; only a plain bind of a host directory"
    try:
        check_host_path("device", device, state_dir=state_dir)
        if resolve is not None:
            check_host_path("device", resolve(device), state_dir=resolve(state_dir))
    except SpecError as error:
        return f"is backed by the host path {device}: {error.rule}"
    return None


def _check_devices(requests: list[DeviceRequest]) -> None:
    if len(requests) > 1:
        raise _refuse("HostConfig.DeviceRequests", "at most one (CDI) request")
    for request in requests:
        field = "HostConfig.DeviceRequests[0]"
        if request.driver != "cdi" or request.count is not None or request.capabilities:
            raise _refuse(field, "only a CDI request listing DeviceIDs (GPUs)")
        request_ids = GpuRequest(devices=request.device_ids)
        _spec_rule(f"{field}.DeviceIDs", validate_gpu_request, request_ids, f"{field}.DeviceIDs")


# -- the engine socket ----------------------------------------------------------------------------


def allowed_engine_sockets(config: Config, environ: Mapping[str, str]) -> frozenset[str]:
    """The daemon sockets callers may name: the operator's ``--engine-socket`` list, else the
    one the supervisor's start environment names (``DOCKER_HOST``, else the standard places)."""
    if config.engine_sockets:
        return frozenset(config.engine_sockets)
    try:
        return frozenset(candidate_sockets(dict(environ)))
    except SbxError:
        return frozenset()  # a DOCKER_HOST that is no unix socket names none


def engine_socket_problem(asked: str, pinned: str | None, allowed: frozenset[str]) -> str | None:
    """Why the supervisor will not talk to the socket a caller names, or None.

    With ``--docker-socket`` the supervisor reaches the daemon only through that socket,
    whatever the caller names (a relay), so there is nothing to refuse."""
    if pinned is not None or asked in allowed:
        return None
    return (
        f"{asked} is not a daemon socket this supervisor was started for "
        f"({', '.join(sorted(allowed)) or 'none'}); start one with --engine-socket {asked} "
        "(or use another state directory)"
    )


__all__ = [
    "BodyRefusal",
    "allowed_engine_sockets",
    "engine_socket_problem",
    "recheck_body",
    "unknown_field",
    "volume_backing_problem",
]
