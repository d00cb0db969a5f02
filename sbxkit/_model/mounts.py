"""Mounts a sandbox may ask for, and the lexical rules they must pass (pure).

Three kinds, as in the compute-driver document: ``bind`` (an existing absolute host path),
``volume`` (an existing Docker named volume: never created or removed by sbxkit) and ``tmpfs``.
Bind mounts and named volumes are each off unless the operator's settings enable them. Every
mount is read-only unless it says ``read_only = false``.

This module checks what can be checked without touching the host: shapes, characters,
protected paths and their ancestors, targets over container system directories, duplicates and
overlap with the supervisor's state directory. ``sbxkit._plan.preflight`` then resolves bind sources
on the host (links, special files) and re-applies the same path rules to the resolved path.
"""

from __future__ import annotations

import posixpath
import re
from typing import Literal

import msgspec

from sbxkit._model.predicates import has_control
from sbxkit._util.public import publish
from sbxkit.engine.models import MountSpec
from sbxkit.errors import SpecError

MAX_MOUNTS = 32


class _MountKind(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, frozen=True):
    """What every kind of mount shares: a ``type`` tag, no field unknown. Each kind says
    ``frozen`` and ``kw_only`` again: msgspec does not inherit ``kw_only``, and type checkers
    read ``frozen`` per class."""


class BindMount(_MountKind, tag="bind", frozen=True, kw_only=True):
    source: str
    target: str
    read_only: bool = True
    selinux_label: Literal["shared", "private"] | None = None  # shared → z, private → Z


class VolumeMount(_MountKind, tag="volume", frozen=True, kw_only=True):
    source: str  # the volume's name
    target: str
    read_only: bool = True
    subpath: str | None = None  # relative, no ".."


class TmpfsMount(_MountKind, tag="tmpfs", frozen=True, kw_only=True):
    target: str
    size_bytes: int
    mode: int = 0o700
    options: list[str] = msgspec.field(default_factory=list)


Mount = BindMount | VolumeMount | TmpfsMount


class ExpectedMount(msgspec.Struct, frozen=True, kw_only=True):
    """What post-create inspection must find in the container's ``Mounts``."""

    type: str
    source: str  # host path for binds, volume name for volumes
    destination: str
    rw: bool


class ResolvedMounts(msgspec.Struct, frozen=True, kw_only=True):
    binds: list[str] = msgspec.field(default_factory=list)
    mounts: list[MountSpec] = msgspec.field(default_factory=list)
    tmpfs: dict[str, str] = msgspec.field(default_factory=dict)
    expected: list[ExpectedMount] = msgspec.field(default_factory=list)


# The kernel's interfaces, the runtime state and the boot files: no sandbox may see the host's,
# nor have a mount replace its own.
_KERNEL_AND_RUN = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot")

# Host paths no sandbox may see, nor any ancestor of them (an ancestor exposes them too).
PROTECTED_HOST_PATHS = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/docker",
    "/run/docker",
    "/var/lib/docker",
    "/run/containerd",
    "/var/run/containerd",
    "/var/lib/containerd",
    "/run/crun",
    "/run/runc",
    *_KERNEL_AND_RUN,
    "/etc",
    "/root",
    "/var/lib/kubelet",
    "/etc/kubernetes",
    "/var/lib/rancher",
    "/etc/rancher",
    "/run/k3s",
    "/var/lib/cni",
    "/etc/cni",
)

# Container paths a mount must not replace or sit inside: the image's system directories, the
# kernel interfaces, and sbxkit's own scratch.
SYSTEM_TARGETS = (
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    *_KERNEL_AND_RUN,
    "/tmp",
    "/.sbxkit",  # sbxkit's own: the kernel path's FIFO directory (sbxkit/kernel)
)

_VOLUME_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", re.ASCII)

TMPFS_OPTIONS = frozenset({"noexec", "exec", "nosuid", "nodev", "ro", "rw"})


def _clean(path: str) -> str:
    """Normal form as Docker sees it: POSIX keeps a leading "//", Docker collapses it."""
    return posixpath.normpath("/" + path.lstrip("/")) if path.startswith("/") else path


def is_within(path: str, root: str) -> bool:
    """``path`` equals ``root`` or lies below it (both absolute and normalised)."""
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def protected_reason(path: str) -> str | None:
    """Why a normalised absolute host path may not be mounted, or None."""
    if path == "/":
        return "/ is the host's root"
    for protected in PROTECTED_HOST_PATHS:
        if is_within(path, protected):
            return f"inside the protected host path {protected}"
        if is_within(protected, path):
            return f"an ancestor of the protected host path {protected}"
    return None


def overlap_reason(path: str, state_dir: str | None) -> str | None:
    if state_dir is None:
        return None
    state = _clean(state_dir)
    if is_within(path, state) or is_within(state, path):
        return f"overlaps the supervisor state directory {state}"
    return None


def _check_text(field: str, value: str, what: str) -> None:
    if not value:
        raise SpecError(field, f"{what} must not be empty")
    if value != value.strip():
        raise SpecError(field, f"{what} must not have surrounding whitespace")
    if has_control(value):
        raise SpecError(field, f"{what} must not contain control characters")


def _check_absolute(field: str, value: str, what: str) -> str:
    _check_text(field, value, what)
    if not value.startswith("/"):
        raise SpecError(field, f"{what} must be an absolute path")
    if ".." in value.split("/"):
        raise SpecError(field, f"{what} must not contain '..' (traversal)")
    if ":" in value:
        # Docker's bind syntax is source:target:options; a colon would be read as a separator.
        raise SpecError(field, f"{what} must not contain ':'")
    return _clean(value)


def check_host_path(field: str, path: str, *, state_dir: str | None) -> str:
    """Lexical rules for a bind source; returns the normalised path."""
    clean = _check_absolute(field, path, "source")
    reason = protected_reason(clean) or overlap_reason(clean, state_dir)
    if reason:
        raise SpecError(field, f"{clean} is refused: {reason}")
    return clean


def check_target(field: str, target: str) -> str:
    clean = _check_absolute(field, target, "target")
    if clean != target:
        # Post-create inspection compares what Docker reports, which is the normal form.
        raise SpecError(
            field, f"target must be in normal form ({clean!r}, no trailing '/', '//' or '.')"
        )
    if clean == "/":
        raise SpecError(field, "target / would replace the container's root")
    for system in SYSTEM_TARGETS:
        if is_within(clean, system):
            raise SpecError(
                field, f"target {clean} is over the container system directory {system}"
            )
    return clean


def validate_mounts(
    mounts: list[Mount],
    *,
    enable_bind_mounts: bool,
    enable_named_volumes: bool,
    state_dir: str | None,
) -> None:
    """Raise SpecError naming ``mounts[i].field`` for the first broken rule."""
    if len(mounts) > MAX_MOUNTS:
        raise SpecError("mounts", f"at most {MAX_MOUNTS} mounts")
    targets: dict[str, int] = {}
    for index, mount in enumerate(mounts):
        field = f"mounts[{index}]"
        if not isinstance(mount, BindMount | VolumeMount | TmpfsMount):
            raise SpecError(field, "must be a bind, volume or tmpfs mount")
        target = check_target(f"{field}.target", mount.target)
        if target in targets:
            raise SpecError(
                f"{field}.target", f"duplicate target {target} (also mounts[{targets[target]}])"
            )
        for other, other_index in targets.items():
            if is_within(target, other) or is_within(other, target):
                raise SpecError(
                    f"{field}.target", f"{target} nests with mounts[{other_index}] at {other}"
                )
        targets[target] = index
        if isinstance(mount, BindMount):
            if not enable_bind_mounts:
                raise SpecError(
                    f"{field}.type",
                    "bind mounts are disabled; the operator enables them with enable_bind_mounts "
                    "(a profile's [sandbox.docker] enable_bind_mounts = true)",
                )
            check_host_path(f"{field}.source", mount.source, state_dir=state_dir)
        elif isinstance(mount, VolumeMount):
            if not enable_named_volumes:
                raise SpecError(
                    f"{field}.type",
                    "named volumes are disabled; the operator enables them with "
                    "enable_named_volumes (a profile's [sandbox.docker] enable_named_volumes = "
                    "true)",
                )
            _check_text(f"{field}.source", mount.source, "volume name")
            if not _VOLUME_NAME.fullmatch(mount.source):
                raise SpecError(
                    f"{field}.source",
                    "a volume name must match Docker's [a-zA-Z0-9][a-zA-Z0-9_.-]+",
                )
            if mount.subpath is not None:
                _check_text(f"{field}.subpath", mount.subpath, "subpath")
                if mount.subpath.startswith("/") or ".." in mount.subpath.split("/"):
                    raise SpecError(f"{field}.subpath", "must be relative without '..'")
        else:
            if not 0 < mount.size_bytes <= 2**63 - 1:
                raise SpecError(f"{field}.size_bytes", "must be > 0 (a tmpfs is always bounded)")
            if not 0 <= mount.mode <= 0o7777:
                raise SpecError(f"{field}.mode", "must be a permission mode (0 to 0o7777)")
            for option in mount.options:
                if option not in TMPFS_OPTIONS:
                    raise SpecError(
                        f"{field}.options", f"{option!r} is not one of {sorted(TMPFS_OPTIONS)}"
                    )


publish(__name__, globals())  # public names show as sbxkit.NAME
