"""The user-facing sandbox spec and the rules it must satisfy before any container exists.

Everything here is pure: structs in, `SpecError` out. Validation refuses rather than repairs,
because a silently "fixed" limit is a limit the caller did not ask for. Docker spells
"unlimited" as 0 or -1 in most resource fields, so every mandatory bound must be a finite,
strictly positive number; anything else would reach the daemon as "no limit at all".
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, TypeVar

import msgspec

from sbxkit._model.gpu import GpuRequest, validate_gpu_request
from sbxkit._model.image_ref import image_reference_problem
from sbxkit._model.mounts import Mount, validate_mounts
from sbxkit._model.network_terms import Network
from sbxkit._model.predicates import has_control
from sbxkit._model.rules import (
    LEASE_LABEL,
    RESERVED_LABELS,
    RUNTIME_ENV_RESERVE,
    check_env,
    check_env_size,
    check_network,
    merge_labels,
    parse_extra_flags,
    string_items,
)
from sbxkit._model.runtimes import check_runtime_fit
from sbxkit._model.settings import Settings
from sbxkit._model.textcheck import check_utf8
from sbxkit._model.uids import ranges_shown, reserved_range_of
from sbxkit._model.units import GiB, KiB, MiB, parse_size
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

__all__ = [
    "LEASE_LABEL",
    "GiB",
    "GpuRequest",
    "KiB",
    "Limits",
    "MiB",
    "Network",
    "SandboxSpec",
    "Workspace",
    "body_ids",
    "parse_size",
    "parse_user",
    "root_inside",
    "spec_from_dict",
    "validate_command",
    "validate_spec",
    "validate_user",
    "validate_workspace",
    "writable_image",
]

INT64_MAX = 2**63 - 1
"""Docker stores byte counts as int64; larger values overflow in the daemon."""

MIN_MEMORY_BYTES = 6 * MiB
MIN_DISK_BYTES = 1 * MiB
"""Docker refuses memory limits below 6 MiB (``linuxMinMemory``)."""

MIN_CPUS = 0.01
"""The kernel's smallest CFS quota (1 ms per 100 ms period); smaller values round to no limit."""

MAX_CPUS = 1024.0
MAX_PIDS = 4_194_304
MAX_TRANSFER_ENTRIES = 10_000_000
"""The kernel's ceiling for ``pid_max`` on 64-bit systems."""

MAX_ID = 2**31 - 1
"""Largest uid/gid runc accepts ("uids and gids must be in range 0-2147483647"); the kernel's
own ceiling (2**32 - 2) is higher, but a container with a larger id is created, then fails."""

MIN_TIMEOUT_S = 0.001
MAX_TIMEOUT_S = 30 * 24 * 3600.0
"""30 days: a finite bound beyond which a deadline stops meaning anything (1e300 was accepted
as finite, and left a one-shot unbounded)."""

MAX_OUTPUT_BYTES = 1024 * MiB
"""Output is kept in memory, per stream: more than 1 GiB per stream is not a bound."""

MAX_SIZE_BYTES = 1024 * 1024 * MiB
"""1 TiB for memory, fsize and scratch: larger is no machine's capacity (the supervisor also
refuses memory above the host's budget)."""

MAX_WORKDIR_BYTES = 1024
"""A workdir longer than this is refused before the daemon fails on it (PATH_MAX is 4096,
including the daemon's own prefix, and its error leaked that prefix)."""

MAX_NAME_BYTES = 255
"""NAME_MAX: the longest single path component."""

MAX_ARG_BYTES = 128 * 1024 - 1
"""One argument: Linux's MAX_ARG_STRLEN (128 KiB, the NUL included); longer never execs."""
MAX_COMMAND_BYTES = 1024 * 1024
"""The whole command (UTF-8, each argument's NUL included): the same bound on every path."""
KERNEL_DIRS = ("/dev", "/proc", "/sys")
"""Mounted by the runtime over the image: device nodes and kernel files, never a workdir
(runc refuses ``/dev/null``, ``/proc/x`` and ``/sys/x`` only after create)."""

MANDATORY_LIMITS = ("cpus", "memory_bytes", "pids", "output_bytes", "timeout_s")

_MANDATORY = "mandatory: set a finite bound"
_UNBOUNDED = "must be > 0 (0 and -1 mean unbounded to Docker)"
_NOT_FINITE = "must be a finite number (NaN and infinity are not bounds)"
_ROOT = "root users are refused"

_USER_RE = re.compile(r"([0-9]+):([0-9]+)")
_RUNTIME_RE = re.compile(r"[A-Za-z0-9._-]+")


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Resource ceilings; the first five are mandatory.

    A type checker sees them as required (``Limits()`` does not type-check). At run time they
    default to None so that validation can name every missing one in a single SpecError
    instead of a TypeError naming only the first (profiles also build partial limits).
    """

    if TYPE_CHECKING:
        cpus: float
        memory_bytes: int
        pids: int
        output_bytes: int
        timeout_s: float
    else:
        cpus: float | None = None
        """CPUs as a fraction of cores; sent to Docker as NanoCpus = cpus * 1e9."""
        memory_bytes: int | None = None
        """Memory ceiling; swap is disabled, so this is the whole budget."""
        pids: int | None = None
        """Maximum number of processes and threads in the container."""
        output_bytes: int | None = None
        """Per stream (stdout and stderr each): exactly N bytes pass, N + 1 is an overflow."""
        timeout_s: float | None = None
        """Elapsed (wall clock) time from start to exit."""
    fsize_bytes: int = 64 * MiB
    """Largest file a process may write (RLIMIT_FSIZE)."""
    scratch_bytes: int = 64 * MiB
    """Size of the tmpfs mounted at /tmp. Writable places: this, ``/dev/shm`` (``shm_bytes``)
    and any writable mount the spec asks for; the root is read-only and ``/dev/mqueue`` holds
    no queue (RLIMIT_MSGQUEUE is 0). Both tmpfs are charged to ``memory_bytes``."""
    shm_bytes: int = 64 * MiB
    """Size of ``/dev/shm`` (HostConfig.ShmSize; POSIX shared memory, semaphores)."""
    transfer_bytes: int = 1024 * MiB
    """Content bytes one ``put_dir`` or ``get_dir`` moves at most; a call may ask for less."""
    transfer_entries: int = 100_000
    """Directories and files one ``put_dir`` or ``get_dir`` moves at most."""


class Workspace(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A sandbox for an agentic harness (docs/workspace.md). ``root`` (the default): the payload
    runs as root inside, with the few capabilities a package manager needs — allowed only
    where root inside is provably not root on the host (a daemon that remaps user namespaces,
    a rootless engine, rootful Podman with a user namespace per container, or gVisor), and
    refused by name elsewhere, before anything exists."""

    root: bool = True
    disk_bytes: int | None = None
    """The image's own filesystem writable, bounded at this many bytes written (the kernel's
    quota where the daemon's storage has one, else the daemon's ``SizeRw`` watched by the
    supervisor: ``disk_exceeded``; docs/workspace.md). None: read-only, as every sandbox."""
    exec_tmp: bool = False
    """The scratch ``/tmp`` may hold programs that run (it is ``noexec`` otherwise)."""


class SandboxSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What to run and within which bounds. Hardening is not configurable here."""

    image: str
    command: list[str]
    limits: Limits
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Set in the container as given; ``SBXKIT_LEASE`` and ``SBXKIT_SANDBOX`` are the
    runtime's and overwrite any value here. Nothing comes from the host unless put here."""
    user: str | None = None
    """``UID:GID``, non-root. None (the default): a uid of the sandbox's own, the same for its
    gid, that no host account and no other live sandbox uses (``sbxkit._model.uids``)."""
    workdir: str | None = None
    network: str | Network = "none"
    """``none`` (default), ``bridge``, ``managed``, or a governed network
    (``Network(allow=[...], callback=...)``: still ``none``, with an allow-list proxy and a
    callback endpoint on the sandbox's own loopback; docs/network.md). Bridge is unrestricted
    egress, not destination authorisation; bridge and managed are refused when ``SBXKIT_ENV``
    says production."""
    runtime: str | None = None
    """An OCI runtime registered in the daemon (``gvisor`` means ``runsc``); None is crun where
    a Docker daemon's default is runc and it registers crun, else the daemon's default
    (``sbxkit._model.runtimes.plan_runtime``); ``runc`` keeps runc."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    mounts: list[Mount] = msgspec.field(default_factory=list)
    extra_flags: list[str] = msgspec.field(default_factory=list)
    """``docker run``-style flags; only ``--label=key=value`` is accepted (merged into labels)."""
    gpus: GpuRequest | None = None
    """CDI GPUs: explicit device names or a count chosen round-robin from the daemon's."""
    workspace: Workspace | None = None
    """A workspace sandbox (``Workspace``): root inside, where that is not root on the host."""


# --- helpers -----------------------------------------------------------------------------------


def _is_zero(digits: str) -> bool:
    """True for every spelling of id 0 ("0", "00" ...); text-only, so huge inputs skip int()."""
    return digits != "" and digits.strip("0") == ""


def _check_positive_int(field: str, value: object, *, maximum: int = INT64_MAX) -> int:
    """A strictly positive int no larger than maximum (bool refused: True is not a count)."""
    if value is None:
        raise SpecError(field, _MANDATORY)
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field, _NOT_FINITE)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"must be an integer, got {type(value).__name__}")
    if value <= 0:
        raise SpecError(field, _UNBOUNDED)
    if value > maximum:
        raise SpecError(field, f"must be <= {maximum}")
    return value


def _check_positive_float(field: str, value: object) -> float:
    """A finite, strictly positive number (ints accepted, as msgspec converts them too)."""
    if value is None:
        raise SpecError(field, _MANDATORY)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range (10**400)
        raise SpecError(field, _NOT_FINITE) from None
    if not math.isfinite(number):
        raise SpecError(field, _NOT_FINITE)
    if number <= 0:
        raise SpecError(field, _UNBOUNDED)
    return number


def validate_user(user: str | None, field: str = "user") -> None:
    """A named user must be a numeric, non-root ``UID:GID`` outside the ranges sbxkit gives
    sandboxes their own uids from (one named there could share a live sandbox's)."""
    if user is None:
        return
    for number in parse_user(user, field):
        if reserved_range_of(number) is not None:
            raise SpecError(
                field,
                f"id {number} is in the ranges sbxkit gives each sandbox a uid of its own from "
                f"({ranges_shown()}); leave the user unset to get one, or name an id outside them",
            )


ROOT_USER = "0:0"
"""A workspace's user (``Workspace.root``): root inside its own user namespace."""


def body_ids(user: str, field: str = "Config.User") -> tuple[int, int]:
    """The ids a create body runs as: a spec's (``parse_user``'s rules), a uid of the sandbox's
    own, or a workspace's root inside (``ROOT_USER``)."""
    if user == ROOT_USER:
        return 0, 0
    return parse_user(user, field)


def parse_user(user: str, field: str = "user") -> tuple[int, int]:
    """Split a numeric "UID:GID" into ids, refusing root and anything not checkable offline.

    Names are refused because their meaning depends on the image's /etc/passwd, which we
    cannot read before start; a missing GID would default to the image's (often 0).
    """
    if not isinstance(user, str):
        raise SpecError(field, "must be a string 'UID:GID'")
    if any(part == "root" or _is_zero(part) for part in user.split(":")):
        raise SpecError(field, _ROOT)
    match = _USER_RE.fullmatch(user)
    if match is None:
        raise SpecError(
            field, "must be numeric 'UID:GID'; names are refused as they cannot be checked"
        )
    ids: list[int] = []
    for part in match.groups():
        if len(part) > 10:
            raise SpecError(field, f"ids must be in 1..{MAX_ID} (runc's range)")
        number = int(part)
        if part != str(number):
            raise SpecError(field, "ids must be plain decimal without leading zeros")
        if number > MAX_ID:
            raise SpecError(field, f"ids must be in 1..{MAX_ID} (runc's range)")
        ids.append(number)
    return ids[0], ids[1]


# --- validation --------------------------------------------------------------------------------


def check_limit(name: str, value: object, field: str | None = None) -> None:
    """Refuse one absent, unbounded or out-of-range ``Limits`` field (``field`` names it in
    the error, e.g. a profile's ``sandbox.docker.limits.memory``)."""
    where = field or f"limits.{name}"
    if name == "cpus":
        cpus = _check_positive_float(where, value)
        if cpus < MIN_CPUS:
            raise SpecError(where, f"must be >= {MIN_CPUS} (smaller rounds to no limit)")
        if cpus > MAX_CPUS:
            raise SpecError(where, f"must be <= {MAX_CPUS:g}")
    elif name == "memory_bytes":
        memory = _check_positive_int(where, value, maximum=MAX_SIZE_BYTES)
        if memory < MIN_MEMORY_BYTES:
            raise SpecError(
                where,
                f"must be at least 6m ({MIN_MEMORY_BYTES} bytes, Docker's minimum), "
                f"got {memory} bytes",
            )
    elif name == "pids":
        _check_positive_int(where, value, maximum=MAX_PIDS)
    elif name == "timeout_s":
        timeout = _check_positive_float(where, value)
        if not MIN_TIMEOUT_S <= timeout <= MAX_TIMEOUT_S:
            raise SpecError(
                where, f"must be in {MIN_TIMEOUT_S:g}..{MAX_TIMEOUT_S:.0f} seconds (30 days)"
            )
    elif name == "output_bytes":
        _check_positive_int(where, value, maximum=MAX_OUTPUT_BYTES)
    elif name in ("fsize_bytes", "scratch_bytes", "shm_bytes", "transfer_bytes"):
        _check_positive_int(where, value, maximum=MAX_SIZE_BYTES)
    elif name == "transfer_entries":
        _check_positive_int(where, value, maximum=MAX_TRANSFER_ENTRIES)
    else:
        raise SpecError(where, "unknown limit")


def validate_limits(limits: Limits) -> None:
    """Refuse absent, unbounded or out-of-range limits: every absent mandatory one named in a
    single error, otherwise the first offending field."""
    missing = [name for name in MANDATORY_LIMITS if getattr(limits, name) is None]
    if missing:
        raise SpecError(", ".join(f"limits.{name}" for name in missing), _MANDATORY)
    for name in Limits.__struct_fields__:
        check_limit(name, getattr(limits, name))


def validate_image(image: object, field: str = "image") -> None:
    """A plain image reference (it travels in a URL path, so only reference characters)."""
    if not isinstance(image, str) or not image:
        raise SpecError(field, "must be a non-empty image reference")
    if any(ch.isspace() for ch in image) or has_control(image):
        raise SpecError(field, "must not contain whitespace or control characters")
    # The daemon's own grammar (sbxkit/_model/image_ref.py): what passes also cannot traverse a URL.
    problem = image_reference_problem(image)
    if problem is not None:
        raise SpecError(field, f"{problem} (got {image!r})")


def validate_command(command: object) -> None:
    if not isinstance(command, list) or not command:
        raise SpecError("command", "must be a non-empty list of arguments")
    for index, arg in enumerate(command):
        field = f"command[{index}]"
        if not isinstance(arg, str):
            raise SpecError(field, "must be a string")
        if "\0" in arg:
            raise SpecError(field, "must not contain NUL")
    if command[0] == "":
        raise SpecError("command[0]", "the program name must not be empty")
    sizes = [len(arg.encode("utf-8", "surrogatepass")) for arg in command]
    for index, size in enumerate(sizes):
        if size > MAX_ARG_BYTES:
            raise SpecError(
                f"command[{index}]",
                f"{size} bytes; one argument holds at most {MAX_ARG_BYTES} (Linux's limit)",
            )
    if sum(sizes) + len(sizes) > MAX_COMMAND_BYTES:
        raise SpecError(
            "command",
            f"{sum(sizes) + len(sizes)} bytes in all; at most {MAX_COMMAND_BYTES} "
            "(pass large inputs as files or stdin)",
        )


def validate_env(env: object, field: str = "env") -> None:
    """Well-formed keys, no NUL, and room left for the runtime's own keys under the cap."""
    check_env_size(check_env(env, field), field, reserve=RUNTIME_ENV_RESERVE)


def validate_workdir(workdir: object, field: str = "workdir") -> None:
    if workdir is None:
        return
    if not isinstance(workdir, str) or not workdir.startswith("/"):
        raise SpecError(field, "must be an absolute path")
    if has_control(workdir):
        raise SpecError(field, "must not contain control characters")
    check_utf8(workdir, field)
    if len(workdir.encode()) > MAX_WORKDIR_BYTES:
        raise SpecError(field, f"must be at most {MAX_WORKDIR_BYTES} bytes")
    resolved: list[str] = []
    for part in workdir.split("/"):
        if len(part.encode()) > MAX_NAME_BYTES:
            raise SpecError(field, f"a path component is longer than {MAX_NAME_BYTES} bytes")
        if part == "..":
            resolved = resolved[:-1]
        elif part not in ("", "."):
            resolved.append(part)
    canonical = "/" + "/".join(resolved)
    for kernel_dir in KERNEL_DIRS:
        if canonical == kernel_dir or canonical.startswith(kernel_dir + "/"):
            raise SpecError(
                field,
                f"{canonical} is refused: {', '.join(KERNEL_DIRS)} hold the runtime's device "
                "nodes and kernel files, not directories of the image",
            )


def validate_runtime_name(runtime: object, field: str = "runtime") -> None:
    """A plain name; whether the daemon has it is checked against /info before create."""
    if runtime is not None and (
        not isinstance(runtime, str) or _RUNTIME_RE.fullmatch(runtime) is None
    ):
        raise SpecError(field, "must be a plain runtime name matching [A-Za-z0-9._-]+")


def validate_labels(labels: object, field: str = "labels") -> None:
    for where, key, value in string_items(labels, field):
        if key in RESERVED_LABELS:
            raise SpecError(where, f"{key!r} is reserved for sbxkit")
        if not key:
            raise SpecError(where, "key must not be empty")
        if has_control(key) or has_control(value):
            raise SpecError(where, "keys and values must not contain control characters")


def parse_label_list(text: str, field: str) -> dict[str, str]:
    """``k=v,k2=v2`` (an environment variable's labels), checked like a spec's labels."""
    labels: dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not key:
            raise SpecError(field, f"expected KEY=VALUE[,KEY=VALUE...], got {item.strip()!r}")
        labels[key] = value
    validate_labels(labels, field)
    return labels


def spec_labels(spec: SandboxSpec) -> dict[str, str]:
    """The user's labels: ``labels`` plus the ones carried by ``--label=`` extra flags."""
    return merge_labels(spec.labels, parse_extra_flags(spec.extra_flags))


def validate_workspace(workspace: object, user: str | None) -> None:
    """A workspace is a ``Workspace``; with root inside it names no user of its own. (A
    governed network is judged with the daemon: it is served only where the sandbox's network
    namespace is the host kernel's, which for root inside means a remapping daemon's runc.)"""
    if not isinstance(workspace, Workspace):
        raise SpecError("workspace", f"must be a Workspace, got {type(workspace).__name__}")
    if not isinstance(workspace.root, bool):
        raise SpecError("workspace.root", "must be true or false")
    if not isinstance(workspace.exec_tmp, bool):
        raise SpecError("workspace.exec_tmp", "must be true or false")
    if workspace.disk_bytes is not None:
        field = "workspace.disk_bytes"
        disk = _check_positive_int(field, workspace.disk_bytes, maximum=MAX_SIZE_BYTES)
        if disk < MIN_DISK_BYTES:
            raise SpecError(field, f"must be >= {MIN_DISK_BYTES} (1 MiB)")
    if workspace.exec_tmp and not (workspace.root or workspace.disk_bytes is not None):
        raise SpecError(
            "workspace.exec_tmp",
            "is offered to a workspace with root inside or a writable image (disk_bytes): "
            "elsewhere the scratch stays noexec",
        )
    if not workspace.root:
        return
    if user is not None:
        raise SpecError(
            "user",
            "a workspace with root inside runs as uid 0 in its own user namespace; leave user "
            "unset",
        )


def writable_image(spec: SandboxSpec) -> int | None:
    """The bound on what the spec's sandbox writes to its image's filesystem, or None when
    that filesystem is read-only (``Workspace.disk_bytes``)."""
    return None if spec.workspace is None else spec.workspace.disk_bytes


def root_inside(spec: SandboxSpec) -> bool:
    """The spec's payload runs as root inside (a ``Workspace`` with ``root``)."""
    return spec.workspace is not None and spec.workspace.root


def validate_spec(spec: SandboxSpec, settings: Settings | None = None) -> None:
    """Raise SpecError for the first rule the spec breaks; return None if it may run.

    Defensive about types: a spec built in Python skips msgspec's type checks, and a wrong
    type must surface as SpecError, never as TypeError deep inside the engine client.

    ``settings.environment`` carries the raw ``SBXKIT_ENV``; with no settings (a pure call)
    it is unset, i.e. development. ``sbxkit._consumers.runner.run`` always reads the real one.
    """
    settings = settings or Settings()
    if not isinstance(spec, SandboxSpec):
        raise SpecError("spec", f"must be a SandboxSpec, got {type(spec).__name__}")
    check_utf8(spec)  # first: every rule below may assume text that can be sent
    if not isinstance(spec.limits, Limits):
        raise SpecError("limits", "must be a Limits")
    validate_limits(spec.limits)
    validate_image(spec.image)
    validate_command(spec.command)
    validate_env(spec.env)
    validate_user(spec.user)
    validate_workdir(spec.workdir)
    check_network(spec.network, settings.environment)
    validate_runtime_name(spec.runtime)
    check_runtime_fit(spec.runtime, spec.network, spec.limits.pids, spec.limits.fsize_bytes)
    validate_labels(spec.labels)
    validate_labels(spec_labels(spec), "extra_flags")
    if spec.gpus is not None:
        validate_gpu_request(spec.gpus)
    if spec.workspace is not None:
        validate_workspace(spec.workspace, spec.user)
    if not isinstance(spec.mounts, list):
        raise SpecError("mounts", "must be a list")
    validate_mounts(
        spec.mounts,
        enable_bind_mounts=settings.enable_bind_mounts,
        enable_named_volumes=settings.enable_named_volumes,
        state_dir=settings.supervisor_state_dir,
    )


# --- decoding ----------------------------------------------------------------------------------

_LOCATION_RE = re.compile(r" - at `(?:key` in `)?\$(?P<path>[^`]*)`$")
_UNKNOWN_RE = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`")
_MISSING_RE = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def spec_error_from(error: msgspec.ValidationError) -> SpecError:
    """Turn msgspec's "<message> - at `$.a.b`" into SpecError("a.b", "<message>")."""
    message = str(error)
    path = ""
    location = _LOCATION_RE.search(message)
    if location is not None:
        path = location["path"].removeprefix(".")
        message = message[: location.start()]
    unknown = _UNKNOWN_RE.match(message)
    if unknown is not None:
        return SpecError(_join(path, unknown["name"]), "unknown field")
    missing = _MISSING_RE.match(message)
    if missing is not None:
        return SpecError(_join(path, missing["name"]), "required field is missing")
    return SpecError(path or "spec", message)


_T = TypeVar("_T")


def decoded_as(data: object, kind: type[_T]) -> _T:
    """Decoded JSON or TOML ``data`` as a ``kind``: msgspec's refusal becomes a SpecError
    naming the field (``spec_error_from``)."""
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as error:
        raise spec_error_from(error) from None


def spec_from_dict(data: object) -> SandboxSpec:
    """Build a spec from decoded JSON/TOML data and validate it; every refusal is a SpecError."""
    spec = decoded_as(data, SandboxSpec)
    validate_spec(spec)
    return spec


publish(__name__, globals())  # public names show as sbxkit.NAME
