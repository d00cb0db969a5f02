"""The plan: everything one sandbox needs, decided once, before anything is created.

Parse, don't validate. ``check_spec`` validates a spec under the effective settings and returns
a ``CheckedSpec``; ``learn_daemon`` asks the daemon what only it can judge (the image, named
volumes, the runtime, CDI GPUs) and returns ``DaemonFacts``; ``build_plan`` (pure) turns the two
into a ``Plan`` with every derived field filled: the lease, the container name, the hardened
create body, the mounts the post-create inspection expects, the limits and the owner's backstop.
Every layer downstream (the owned container, one-shot runs, sessions, PTYs, stdio workers,
grants, the harness) takes a ``Plan`` or a ``CheckedSpec`` and never validates again.

``make_plan`` is the I/O shell that does the three in order; it is called once per sandbox.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from sbxkit._kernel.scripts import kernel_io
from sbxkit._model.call_checks import check_spec_type
from sbxkit._model.gpu import GpuCursor
from sbxkit._model.mounts import ExpectedMount, ResolvedMounts
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._model.rules import ROOT_INSIDE_REFUSED
from sbxkit._model.runtimes import runtime_name
from sbxkit._model.settings import Settings
from sbxkit._model.spec import (
    SandboxSpec,
    parse_label_list,
    root_inside,
    validate_command,
    validate_spec,
    writable_image,
)
from sbxkit._model.uids import HOST_UIDS, UidRange
from sbxkit._plan.network_planning import plan_network
from sbxkit._plan.policy import (
    container_name,
    hardened_body,
    with_own_user,
    with_scratch_home,
)
from sbxkit._plan.preflight import (
    DaemonPlan,
    check_daemon,
    disk_quota_base,
    planned_root_witness,
    planned_userns_mode,
    resolve_mounts,
    sandbox_uid_range,
)
from sbxkit._protocol.journal import default_state_dir
from sbxkit._util.environment import caller_environ, caller_environ_bytes
from sbxkit._util.public import publish
from sbxkit.engine.client import Engine
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import ImageError, NotFound, SpecError

__all__ = [
    "GPU_CURSOR",
    "LIFETIME_MARGIN_S",
    "CheckedSpec",
    "DaemonFacts",
    "Plan",
    "build_plan",
    "check_spec",
    "effective_settings",
    "learn_daemon",
    "make_plan",
    "new_lease_id",
]

LIFETIME_MARGIN_S = 120.0
"""The owner's backstop beyond the payload's own time limit: create, start and removal."""

GPU_CURSOR = GpuCursor()
"""This process's round-robin position over the daemon's CDI GPUs (sandboxes share it)."""


class CheckedSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A spec ``validate_spec`` accepted under these effective settings (``check_spec``),
    and the rules of the backend kind named by ``checked_for``."""

    spec: SandboxSpec
    settings: Settings
    checked_for: str = "docker"


class _Carried(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon decided that the plan carries on to the lease's owner as it is."""

    podman: bool = False
    network: NetworkTerms | None = None
    """What the lease's owner governs (sbxkit/network/), carried out once the container
    started: None when nothing is."""
    image_env: dict[str, str] = msgspec.field(default_factory=dict)
    """The image's own environment (``Config.Env``): what its containers start with."""
    image_id: str = ""
    root_witness: str | None = None
    """For a workspace with root inside: what says that root is not the host's
    (``ROOT_INSIDE_WITNESSES``: the daemon's user namespace remapping or rootlessness, gVisor,
    or on rootful Podman the body's own user namespace, ``planned_userns_mode``); the kernel
    is asked again once the container runs (``sbxkit._kernel.userns``)."""
    host_rlimits: bool = False
    """The engine drops the body's ulimits (rootless Podman): the host sets them on the
    sandbox's processes once it runs, before its payload does (``sbxkit._kernel.rlimits``)."""


_CARRIED = _Carried.__struct_fields__


class DaemonFacts(_Carried, frozen=True, kw_only=True):
    """What the daemon decided for a checked spec (``learn_daemon``)."""

    mounts: ResolvedMounts
    daemon: DaemonPlan
    sandbox_uids: UidRange = HOST_UIDS
    """Where a sandbox that names no user gets its own uid (``sbxkit._model.uids``)."""
    disk_quota_base: int | None = None
    """For a writable image: what the daemon's storage quota counts besides the writes
    (``disk_quota_base``); None where no quota holds the bound and the supervisor watches."""


class Plan(_Carried, frozen=True, kw_only=True):
    """One sandbox, fully decided: what is created, how it is verified and bounded."""

    spec: SandboxSpec
    """The spec as it runs: one that named no user carries the lease's own uid."""
    settings: Settings
    lease: str
    name: str
    body: ContainerCreate
    """The final create body (overrides applied); the post-create inspection compares to it."""
    expected_mounts: tuple[ExpectedMount, ...]
    timeout_s: float
    output_bytes: int
    lifetime_s: float
    """The owner's backstop: the time limit plus ``LIFETIME_MARGIN_S``."""
    io_dir: str | None = None
    """The kernel path's FIFO directory of this lease (``sbxkit._kernel``): its stdio are host
    FIFOs, its command is wrapped (``kernel.scripts.cold_command``). None: the daemon's path."""

    @property
    def user(self) -> str:
        """``UID:GID`` the sandbox runs as (the spec's, or the lease's own)."""
        user = self.body.user or self.spec.user
        assert user is not None  # build_plan fills it
        return user


def new_lease_id() -> str:
    """A fresh lease id: 128 random bits, hex (also the container name's suffix)."""
    return secrets.token_hex(16)


def effective_settings(settings: Settings | None) -> Settings:
    """Fill in what the environment decides: the supervisor state dir (bind sources may not
    overlap it, whichever supervisor owns the sandbox), the raw ``SBXKIT_ENV`` and
    ``SBXKIT_LABELS``.

    The variables are this process's, or the caller's of a run handed to the supervisor
    (``sbxkit/_util/environment.py``). This is the one place ``SBXKIT_ENV`` is read, as bytes: the
    pure rules parse it only when a decision depends on it (bridge networking), so a bad value
    breaks only what it governs.
    """
    settings = settings or Settings()
    if settings.supervisor_state_dir is None:
        state_dir = str(default_state_dir())
        settings = msgspec.structs.replace(settings, supervisor_state_dir=state_dir)
    environ = caller_environ()  # os.environ, or the caller's a handed-off run was sent with
    if settings.environment is None:
        raw = caller_environ_bytes("SBXKIT_ENV")
        if raw is not None:
            settings = msgspec.structs.replace(settings, environment=raw)
    evidence = environ.get("SBXKIT_EVIDENCE", "").strip().lower()
    if settings.evidence == "auto" and evidence:
        if evidence not in ("auto", "daemon"):
            raise SpecError("SBXKIT_EVIDENCE", f"must be auto or daemon, got {evidence!r}")
        settings = msgspec.structs.replace(settings, evidence=evidence)
    audit_log = environ.get("SBXKIT_NETWORK_AUDIT_LOG", "").strip()
    if settings.network_audit_log is None and audit_log:
        settings = msgspec.structs.replace(settings, network_audit_log=audit_log)
    if not settings.labels and environ.get("SBXKIT_LABELS", "").strip():
        labels = parse_label_list(environ["SBXKIT_LABELS"], "SBXKIT_LABELS")
        settings = msgspec.structs.replace(settings, labels=labels)
    return settings


def check_spec(
    spec: SandboxSpec | CheckedSpec,
    settings: Settings | None = None,
    *,
    command: Sequence[str] | None = None,
) -> CheckedSpec:
    """Validate once: a ``CheckedSpec`` checked for Docker passes through untouched (unless
    ``command`` replaces its command); one checked for another backend is checked again."""
    if isinstance(spec, CheckedSpec) and spec.checked_for != "docker":
        settings = spec.settings
        spec = spec.spec
    if isinstance(spec, CheckedSpec):
        if command is None:
            return spec
        validate_command(command)  # the one field that changed
        replaced = msgspec.structs.replace(spec.spec, command=list(command))
        return CheckedSpec(spec=replaced, settings=spec.settings)
    check_spec_type(spec, SandboxSpec)
    settings = effective_settings(settings)
    if command is not None:
        spec = msgspec.structs.replace(spec, command=list(command))
    validate_spec(spec, settings)
    return CheckedSpec(spec=spec, settings=settings)


IMAGE_FACTS_MAX_AGE_S = 10.0
"""How long a one-shot run may plan on an earlier inspection of the same image name
(``learn_daemon(reuse_image=True)``): the created container's image is checked against it
before start (``check_created``), so a name moved meanwhile raises ``ImageChanged`` and the
run is planned again on a fresh inspection."""
_IMAGE_FACTS_KEPT = 256
_image_facts: dict[tuple[str, str], tuple[float, ImageFacts]] = {}


class ImageFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a run needs of its image: its id, its environment, its size in bytes."""

    id: str
    env: dict[str, str]
    size: int = 0


async def check_image(engine: Engine, image: str, *, reuse: bool = False) -> ImageFacts:
    """The image must exist locally (never pulled) and declare no volumes; its id, its
    environment and size. ``reuse``: an inspection of the same name less than
    ``IMAGE_FACTS_MAX_AGE_S`` old answers."""
    key = (engine.socket_path, image)
    kept = _image_facts.get(key)
    if reuse and kept is not None and time.monotonic() - kept[0] < IMAGE_FACTS_MAX_AGE_S:
        return kept[1]
    _image_facts.pop(key, None)  # a failed inspection leaves no earlier one behind
    facts = await _inspect_image(engine, image)
    if len(_image_facts) >= _IMAGE_FACTS_KEPT:
        _image_facts.clear()
    _image_facts[key] = (time.monotonic(), facts)
    return facts


def forget_image(engine: Engine, image: str) -> None:
    """The next run of ``image`` on ``engine`` inspects it afresh (a run of it failed: a
    removed image is then refused as missing, not met at the create)."""
    _image_facts.pop((engine.socket_path, image), None)


async def _inspect_image(engine: Engine, image: str) -> ImageFacts:
    try:
        inspected = await engine.image_inspect(image)
    except NotFound:
        raise ImageError(
            image, "not present locally; sbxkit never pulls images (load or build it first)"
        ) from None
    volumes = (inspected.config.volumes if inspected.config else None) or {}
    if volumes:
        raise ImageError(
            image,
            "declares VOLUME " + ", ".join(sorted(volumes)) + "; anonymous "
            "volumes bypass the sandbox's writable-storage limits",
        )
    pairs = (inspected.config.env if inspected.config else None) or []
    env = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    return ImageFacts(id=inspected.id, env=env, size=inspected.size)


async def learn_daemon(
    engine: Engine, checked: CheckedSpec, gpu_cursor: GpuCursor, *, reuse_image: bool = False
) -> DaemonFacts:
    """What only the daemon can judge, before any container exists: the image (present, no
    VOLUME), the mounts, the runtime and GPUs. ``reuse_image``: see ``check_image``."""
    image = await check_image(engine, checked.spec.image, reuse=reuse_image)
    mounts = await resolve_mounts(engine, checked.spec, checked.settings)
    daemon = await check_daemon(engine, checked.spec, gpu_cursor)
    network = await plan_network(engine, checked.spec, checked.settings)
    named = checked.spec.user is not None or root_inside(checked.spec)  # no uid of its own
    uids = HOST_UIDS if named else await sandbox_uid_range(engine)
    witness = None
    if root_inside(checked.spec):
        witness = await planned_root_witness(engine, checked.spec.runtime)
        if witness is None:
            raise SpecError("workspace", ROOT_INSIDE_REFUSED)
    quota_base = None
    if writable_image(checked.spec) is not None:
        quota_base = await disk_quota_base(engine, image.size)
    return DaemonFacts(
        mounts=mounts,
        daemon=daemon,
        podman=engine.is_podman,
        image_env=image.env,
        image_id=image.id,
        disk_quota_base=quota_base,
        network=network,
        sandbox_uids=uids,
        root_witness=witness,
        host_rlimits=daemon.host_rlimits,
    )


def build_plan(
    checked: CheckedSpec,
    facts: DaemonFacts,
    *,
    lease: str,
    body_overrides: Mapping[str, Any] | None = None,
    fifo_root: Path | None = None,
) -> Plan:
    """The plan for a checked spec and the daemon's answers (pure).

    ``body_overrides`` replace fields of the hardened body (a PTY's ``tty``/``stdin_once``);
    the post-create verification compares the container against the final body. A
    ``fifo_root`` (its owner's) puts the sandbox on the kernel path (``kernel_io``).
    """
    spec = with_own_user(checked.spec, lease, facts.sandbox_uids)
    if facts.daemon.runtime != runtime_name(spec.runtime):  # the runtime the daemon plan chose
        spec = msgspec.structs.replace(spec, runtime=facts.daemon.runtime)
    if checked.spec.user is None:  # a uid of its own: no image's passwd gives it a home
        spec = with_scratch_home(spec, facts.image_env)
    body = hardened_body(
        spec,
        lease,
        settings=checked.settings,
        resolved=facts.mounts,
        gpu_devices=facts.daemon.gpu_devices,
        podman=facts.podman,
        network=facts.network,
        disk_quota_base=facts.disk_quota_base,
        userns_mode=planned_userns_mode(facts.root_witness),
    )
    if body_overrides:
        body = msgspec.structs.replace(body, **dict(body_overrides))
    expected_mounts = tuple(facts.mounts.expected)
    io_dir: str | None = None
    if fifo_root is not None:
        io_dir = str(fifo_root / lease)
        body, io_mount = kernel_io(body, io_dir, {**facts.image_env, **spec.env})
        expected_mounts = (*expected_mounts, io_mount)
    timeout_s, output_bytes = spec.limits.timeout_s, spec.limits.output_bytes
    assert timeout_s is not None  # validate_spec requires both
    assert output_bytes is not None
    return Plan(
        spec=spec,
        settings=checked.settings,
        lease=lease,
        name=container_name(lease),
        body=body,
        expected_mounts=expected_mounts,
        timeout_s=timeout_s,
        output_bytes=output_bytes,
        lifetime_s=timeout_s + LIFETIME_MARGIN_S,
        io_dir=io_dir,
        **{name: getattr(facts, name) for name in _CARRIED},
    )


async def make_plan(
    engine: Engine,
    spec: SandboxSpec | CheckedSpec,
    settings: Settings | None = None,
    *,
    gpu_cursor: GpuCursor = GPU_CURSOR,
    command: Sequence[str] | None = None,
    body_overrides: Mapping[str, Any] | None = None,
) -> Plan:
    """Check (unless already checked), ask the daemon, build: the one plan of one sandbox.

    Bad input raises ``SpecError`` before the daemon is contacted.
    """
    checked = check_spec(spec, settings, command=command)
    facts = await learn_daemon(engine, checked, gpu_cursor)
    return build_plan(checked, facts, lease=new_lease_id(), body_overrides=body_overrides)


publish(__name__, globals())  # public names show as sbxkit.NAME
