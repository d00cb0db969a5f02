"""Command profiles: an operator's TOML file of defaults for ``sbxkit run``.

::

    [sandbox.docker]
    image = "sbxkit-test/python:latest"
    user = "1000:1000"
    runtime = "gvisor"            # the daemon's runsc; any name must be registered in /info
    network_audit_log = "/var/log/sbxkit/egress.jsonl"   # governed decisions, one line each
    workdir = "/work"
    extra_flags = ["--label=team=ml"]
    enable_bind_mounts = true     # operator switches: off unless the profile says so
    enable_named_volumes = false

    [sandbox.docker.env]          # literal values: nothing is expanded from the host
    MODE = "batch"

    [sandbox.docker.labels]
    team = "ml"

    [sandbox.docker.limits]
    cpus = 1
    memory = "256m"               # sizes: "256m", "1.5g", "512KiB" or a byte count
    pids = 128
    max_output = "1m"
    timeout = 30                  # durations: seconds, or "500ms", "30s", "5m", "1h"
    fsize = "64m"
    scratch = "64m"
    shm = "64m"                   # /dev/shm

    [sandbox.docker.network]      # or network = "none" | "bridge" | "managed" (routed:
                                  # refused in production); a table is governed egress
    allow = ["pypi.org:443", "*.pythonhosted.org:443"]
    callback = "http://localhost:8080"

    [[sandbox.docker.mounts]]
    type = "bind"                 # bind | volume | tmpfs, fields as in sbxkit._model.mounts
    source = "/srv/data"
    target = "/data"

    [sandbox.docker.supervisor]
    binary = "/usr/local/bin/sbxkit-supervisor"   # what the client launches (SBXKIT_SUPERVISOR)
    state_dir = "/var/lib/sbxkit/leases"         # absolute

    [mcp]                         # sbxkit mcp: what models may have (_grammar/mcp_options.py)
    images = ["sbxkit-test/python:latest"]

The microVM runtime (docs/adr-sbx.md) is opt-in; ``[sandbox.docker]`` still carries the
spec's defaults (limits, env, workdir), and what a microVM cannot honour is refused here::

    [sandbox]
    runtime = "sandbox"           # default "docker"; "sandbox" runs through Docker's sbx CLI

    [sandbox.sbx]                 # refused unless runtime = "sandbox"
    binary = "sbx"                # on PATH, or an absolute path
    template = "docker/sandbox-templates:shell"   # the image (instead of sandbox.docker.image)
    agent = "shell"               # the `sbx create` agent
    kits = []                     # --kit references
    create_args = ["--memory", "8g"]              # extra `sbx create` flags (not --name/-t)

Decoding is pure: ``tomllib`` text in, a msgspec ``Profile`` out (unknown keys are refused by
their full path, e.g. ``sandbox.docker.limts``), and every value is checked by the same rules a
spec obeys, with the profile's path in the error. Only ``load_profile`` touches the disk
(``sbxkit._grammar.profile_files`` looks at the host files a profile names).
``apply_profile`` turns a profile into (SandboxSpec, Settings, SupervisorOptions); the CLI then
lays its explicit flags over it.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import msgspec

from sbxkit._grammar.mcp_options import McpOptions, validate_mcp_options
from sbxkit._model.call_checks import check_pool_options
from sbxkit._model.gpu import GpuRequest, validate_gpu_request
from sbxkit._model.mounts import Mount, validate_mounts
from sbxkit._model.network_terms import Network
from sbxkit._model.predicates import has_control
from sbxkit._model.rules import check_env, check_network, merge_labels, parse_extra_flags
from sbxkit._model.settings import Settings
from sbxkit._model.spec import (
    Limits,
    SandboxSpec,
    Workspace,
    check_limit,
    decoded_as,
    parse_user,
    validate_image,
    validate_labels,
    validate_runtime_name,
    validate_workdir,
    validate_workspace,
)
from sbxkit._model.textcheck import check_utf8
from sbxkit._model.units import parse_duration, parse_size
from sbxkit._util.bounded_read import read_bounded
from sbxkit._util.public import publish
from sbxkit.backends.sbx_commands import (
    DEFAULT_AGENT,
    DEFAULT_BINARY,
    check_agent,
    check_binary,
    check_create_args,
    check_kits,
    check_sandbox_fields,
)
from sbxkit.errors import SpecError

ROOT = "sandbox.docker"
SBX_ROOT = "sandbox.sbx"
MAX_PROFILE_BYTES = 1024 * 1024
"""A profile is a page of settings; anything larger is a mistake, not a configuration."""


class ProfileLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[sandbox.docker.limits]``: CLI-style names; sizes as strings ("256m") or byte counts,
    the timeout in seconds or as a string ("5m", read before decoding: ``read_durations``)."""

    cpus: float | None = None
    memory: int | str | None = None
    pids: int | None = None
    max_output: int | str | None = None
    timeout: float | None = None
    fsize: int | str | None = None
    scratch: int | str | None = None
    shm: int | str | None = None
    max_transfer: int | str | None = None
    max_transfer_entries: int | None = None


class ProfileWorkspace(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[sandbox.docker.workspace]``: ``sbxkit.Workspace`` with its disk bound as a size
    (``disk = "2g"``) or a byte count."""

    root: bool = True
    disk: int | str | None = None
    exec_tmp: bool = False


def profile_workspace(table: ProfileWorkspace, where: str = f"{ROOT}.workspace") -> Workspace:
    """The ``Workspace`` a profile's table asks for, its disk size parsed under its path."""
    disk = table.disk
    if isinstance(disk, str):
        disk = parse_size(disk, f"{where}.disk")
    return Workspace(root=table.root, disk_bytes=disk, exec_tmp=table.exec_tmp)


class SupervisorOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[sandbox.docker.supervisor]``: which helper the client launches, and its state dir."""

    binary: str | None = None
    state_dir: str | None = None


class PoolOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[sandbox.docker.pool]``: pre-started sandboxes ``sbxkit run`` and ``sbxkit batch``
    claim (docs/pool.md)."""

    size: int
    idle_ttl: float = 300.0
    max_timeout: float = 600.0


class DockerProfile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[sandbox.docker]``: defaults for a spec, plus the operator's switches."""

    image: str | None = None
    user: str | None = None
    runtime: str | None = None
    network: str | Network | None = None
    """A mode, or ``[sandbox.docker.network]``: a governed network (docs/network.md)."""
    network_audit_log: str | None = None
    """Where the governed network's decisions go (one JSON line each; absolute)."""
    workdir: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    extra_flags: list[str] = msgspec.field(default_factory=list)
    enable_bind_mounts: bool = False
    enable_named_volumes: bool = False
    evidence: Literal["auto", "daemon"] = "auto"
    """What decides a run's exit: ``auto`` (the kernel where the host can tell, else the
    daemon) or ``daemon`` (docs/security.md, "The kernel's evidence")."""
    limits: ProfileLimits = msgspec.field(default_factory=ProfileLimits)
    mounts: list[Mount] = msgspec.field(default_factory=list)
    gpus: GpuRequest | None = None
    workspace: ProfileWorkspace | None = None
    """``[sandbox.docker.workspace]``: a workspace sandbox (``sbxkit.Workspace``)."""
    supervisor: SupervisorOptions = msgspec.field(default_factory=SupervisorOptions)
    pool: PoolOptions | None = None


class SbxProfile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``[sandbox.sbx]``: how the sandbox runtime reaches ``sbx`` and creates each sandbox."""

    binary: str = DEFAULT_BINARY
    template: str | None = None
    agent: str = DEFAULT_AGENT
    kits: list[str] = msgspec.field(default_factory=list)
    create_args: list[str] = msgspec.field(default_factory=list)


class SandboxSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    docker: DockerProfile
    runtime: Literal["docker", "sandbox"] = "docker"
    """``sandbox`` runs each command in a Docker Sandboxes microVM (``sbx``)."""
    sbx: SbxProfile | None = None


class Profile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    sandbox: SandboxSection
    mcp: McpOptions | None = None
    """``[mcp]``: what ``sbxkit mcp`` lets models have (docs/mcp.md)."""


# Profile limit name → (Limits field, is a size).
LIMIT_FIELDS: dict[str, tuple[str, bool]] = {
    "cpus": ("cpus", False),
    "memory": ("memory_bytes", True),
    "pids": ("pids", False),
    "max_output": ("output_bytes", True),
    "timeout": ("timeout_s", False),
    "fsize": ("fsize_bytes", True),
    "scratch": ("scratch_bytes", True),
    "shm": ("shm_bytes", True),
}
TRANSFER_FIELDS: dict[str, tuple[str, bool]] = {
    "max_transfer": ("transfer_bytes", True),
    "max_transfer_entries": ("transfer_entries", False),
}
"""The bounds of one ``put_dir``/``get_dir``: a profile's too, but no MCP call's (the MCP
tools move single files, under ``mcp.max_file_bytes``)."""


@contextmanager
def _under(prefix: str) -> Iterator[None]:
    """Re-raise a spec rule's SpecError with the profile path in front of its field."""
    try:
        yield
    except SpecError as error:
        raise SpecError(f"{prefix}.{error.field}", error.rule) from None


def profile_limits(limits: ProfileLimits, where_root: str = f"{ROOT}.limits") -> dict[str, Any]:
    """The ``Limits`` fields a profile sets, sizes parsed, each checked under its own path
    (``where_root``: the table they came from, e.g. a tool call's ``limits``)."""
    values: dict[str, Any] = {}
    for name, (field, is_size) in {**LIMIT_FIELDS, **TRANSFER_FIELDS}.items():
        raw = getattr(limits, name)
        if raw is None:
            continue
        where = f"{where_root}.{name}"
        value = parse_size(raw, where) if is_size and isinstance(raw, str) else raw
        check_limit(field, value, where)
        values[field] = value
    return values


def _check_absolute(field: str, path: str | None) -> None:
    if path is None:
        return
    if not path.startswith("/"):
        raise SpecError(field, "must be an absolute path")
    if has_control(path):
        raise SpecError(field, "must not contain control characters")
    if ".." in path.split("/"):
        raise SpecError(field, "must not contain '..'")


def validate_profile(profile: Profile) -> None:
    """Every value a profile sets obeys the rules a spec obeys; errors name the TOML path."""
    check_utf8(profile)  # a Python caller's lone surrogate; TOML text is UTF-8 already
    docker = profile.sandbox.docker
    if docker.image is not None:
        validate_image(docker.image, f"{ROOT}.image")
    if docker.user is not None:
        parse_user(docker.user, f"{ROOT}.user")
    validate_runtime_name(docker.runtime, f"{ROOT}.runtime")
    validate_workdir(docker.workdir, f"{ROOT}.workdir")
    with _under(ROOT):  # these name fields relative to the table: env['K'], mounts[0].target
        if docker.network is not None:
            # Host and container:* never pass. Whether bridge may run depends on SBXKIT_ENV, which
            # only the run reads (sbxkit._consumers.runner), so here it is judged as development.
            check_network(docker.network, None)
        check_env(docker.env)
        validate_labels(docker.labels)
        merge_labels(docker.labels, parse_extra_flags(docker.extra_flags))
        if docker.gpus is not None:
            validate_gpu_request(docker.gpus)
        if docker.workspace is not None:
            workspace = profile_workspace(docker.workspace, "workspace")
            try:
                validate_workspace(workspace, docker.user)
            except SpecError as error:  # the table spells disk_bytes as disk
                field = "workspace.disk" if error.field == "workspace.disk_bytes" else None
                if field is None:
                    raise
                raise SpecError(field, error.rule) from None
        validate_mounts(
            docker.mounts,
            enable_bind_mounts=docker.enable_bind_mounts,
            enable_named_volumes=docker.enable_named_volumes,
            state_dir=docker.supervisor.state_dir,
        )
    profile_limits(docker.limits)
    _check_absolute(f"{ROOT}.network_audit_log", docker.network_audit_log)
    _check_absolute(f"{ROOT}.supervisor.binary", docker.supervisor.binary)
    _check_absolute(f"{ROOT}.supervisor.state_dir", docker.supervisor.state_dir)
    if docker.pool is not None:
        pool = docker.pool
        check_pool_options(pool.size, pool.idle_ttl, pool.max_timeout, f"{ROOT}.pool")
    if profile.mcp is not None:
        validate_mcp_options(profile.mcp)
    _validate_sandbox_runtime(profile)


def _validate_sandbox_runtime(profile: Profile) -> None:
    """``[sandbox.sbx]`` only with ``runtime = "sandbox"``; under it, refuse what a microVM
    cannot honour (each would be dropped silently or fail only inside the VM)."""
    section = profile.sandbox
    if section.runtime != "sandbox":
        if section.sbx is not None:
            raise SpecError(SBX_ROOT, 'sbx options need sandbox.runtime = "sandbox"')
        return
    docker = section.docker
    with _under(ROOT):
        check_sandbox_fields(
            network=docker.network if not isinstance(docker.network, Network) else "governed",
            user=docker.user,
            runtime=docker.runtime,
            mounts=docker.mounts,
            gpus=docker.gpus,
            labels=docker.labels,
            extra_flags=docker.extra_flags,
            env=docker.env,
            workspace=profile_workspace(docker.workspace) if docker.workspace else None,
        )
    sbx = section.sbx or SbxProfile()
    check_binary(sbx.binary, f"{SBX_ROOT}.binary")
    if sbx.template is not None:
        validate_image(sbx.template, f"{SBX_ROOT}.template")
        if docker.image is not None:
            raise SpecError(
                f"{SBX_ROOT}.template",
                f"the image is named twice (also {ROOT}.image); under the sandbox runtime "
                "the template is the image",
            )
    check_agent(sbx.agent, f"{SBX_ROOT}.agent")
    check_kits(sbx.kits, f"{SBX_ROOT}.kits")
    check_create_args(sbx.create_args, f"{SBX_ROOT}.create_args")


def sandbox_options(profile: Profile) -> SbxProfile | None:
    """The ``[sandbox.sbx]`` options when the profile selects the sandbox runtime, else None."""
    if profile.sandbox.runtime != "sandbox":
        return None
    return profile.sandbox.sbx or SbxProfile()


def decode_profile(text: str | bytes, source: str = "profile") -> Profile:
    """Parse and validate a profile's TOML text; every refusal is a SpecError naming a path."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError(source, "is not UTF-8 (TOML files are UTF-8)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SpecError(source, f"is not valid TOML: {error}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise SpecError(source, "nests arrays or tables too deeply to be a profile") from None
    return profile_from_dict(data)


DURATIONS = (("limits", "timeout"), ("pool", "idle_ttl"), ("pool", "max_timeout"))
"""``[sandbox.docker]`` keys that are durations: seconds, or ``"5m"``, ``"500ms"`` (units.py)."""


def read_durations(data: object) -> object:
    """``data`` with each duration of ``DURATIONS`` given as a string read into seconds (under
    its TOML path in an error); anything else is left for the profile's decoding to judge."""
    sandbox = data.get("sandbox") if isinstance(data, dict) else None
    docker = sandbox.get("docker") if isinstance(sandbox, dict) else None
    if not (isinstance(data, dict) and isinstance(sandbox, dict) and isinstance(docker, dict)):
        return data
    tables = {**docker}
    for table, key in DURATIONS:
        section = tables.get(table)
        if isinstance(section, dict) and isinstance(section.get(key), str):
            seconds = parse_duration(section[key], f"{ROOT}.{table}.{key}")
            tables[table] = {**section, key: seconds}
    return {**data, "sandbox": {**sandbox, "docker": tables}}


def profile_from_dict(data: object) -> Profile:
    """Convert decoded TOML data to a validated Profile; every refusal is a SpecError."""
    data = read_durations(data)
    profile = decoded_as(data, Profile)
    validate_profile(profile)
    return profile


def load_profile(path: str | Path) -> Profile:
    """Read and decode the profile at ``path`` (the one function here that does I/O): a
    regular file of at most ``MAX_PROFILE_BYTES``, read within ``READ_DEADLINE_S``; a FIFO,
    a device or a directory is refused by kind (sbxkit/_util/bounded_read.py)."""
    data = read_bounded(path, field="profile", limit=MAX_PROFILE_BYTES)
    return decode_profile(data, source=f"profile {path}")


def apply_profile(
    profile: Profile, command: list[str], *, image: str | None = None
) -> tuple[SandboxSpec, Settings, SupervisorOptions]:
    """A spec with the profile's defaults (``image`` overrides the profile's), the operator
    settings it enables, and the supervisor options. Callers lay explicit flags over the spec
    and validate it; limits the profile leaves out stay unset (and are refused if still unset).
    """
    docker = profile.sandbox.docker
    chosen = image if image is not None else docker.image
    sbx = sandbox_options(profile)
    if chosen is None and sbx is not None:
        chosen = sbx.template
        if chosen is None:
            raise SpecError(
                "image", f"no image: give IMAGE or set {SBX_ROOT}.template in the profile"
            )
    if chosen is None:
        raise SpecError("image", f"no image: give IMAGE or set {ROOT}.image in the profile")
    optional: dict[str, Any] = {}
    if docker.user is not None:
        optional["user"] = docker.user
    if docker.network is not None:
        optional["network"] = docker.network
    if docker.workspace is not None:
        optional["workspace"] = profile_workspace(docker.workspace)
    settings, supervisor = profile_settings(profile)
    spec = SandboxSpec(
        image=chosen,
        command=list(command),
        limits=Limits(**profile_limits(docker.limits)),
        env=dict(docker.env),
        workdir=docker.workdir,
        runtime=docker.runtime,
        labels=dict(docker.labels),
        mounts=list(docker.mounts),
        extra_flags=list(docker.extra_flags),
        gpus=docker.gpus,
        **optional,
    )
    return spec, settings, supervisor


def profile_settings(profile: Profile) -> tuple[Settings, SupervisorOptions]:
    """The operator settings a profile enables, and its supervisor options."""
    docker = profile.sandbox.docker
    settings = Settings(
        enable_bind_mounts=docker.enable_bind_mounts,
        enable_named_volumes=docker.enable_named_volumes,
        supervisor_state_dir=docker.supervisor.state_dir,
        supervisor_command=supervisor_command(docker.supervisor),
        evidence=docker.evidence,
        network_audit_log=docker.network_audit_log,
    )
    return settings, docker.supervisor


def supervisor_command(options: SupervisorOptions) -> str | None:
    """The ``SBXKIT_SUPERVISOR`` value that launches ``options.binary`` (quoted for shlex)."""
    return shlex.quote(options.binary) if options.binary is not None else None


publish(__name__, globals())  # public names show as sbxkit.NAME
