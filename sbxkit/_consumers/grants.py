"""One-shot file grants: the public types and the pure checks (``broker.py`` runs them).

Every granted path must lie inside one of the spec's bind mounts, which are only *ceilings*
(outputs inside one with ``read_only = false``); names, sizes and counts are checked before
anything is opened. ``derive_spec`` makes the spec the run actually uses: the grants' private
mounts instead of the ceilings, and the per-file size limit tightened, never loosened.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from sbxkit._model.mounts import (
    MAX_MOUNTS,
    BindMount,
    Mount,
    check_target,
    is_within,
    overlap_reason,
    protected_reason,
)
from sbxkit._model.predicates import has_control
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import INT64_MAX, MiB, SandboxSpec
from sbxkit._plan.preflight import resolve_host_path
from sbxkit._util.public import publish
from sbxkit.errors import SpecError

DEFAULT_INPUT_MAX_BYTES = 64 * MiB
"""An input larger than this is refused unless its grant says otherwise."""

MAX_OUTPUTS = 32
"""Outputs per run; each holds two descriptors while it is published."""

NAME_MAX = 255

# --- public types ------------------------------------------------------------------------------


class InputGrant(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A host file the payload may read, as a private read-only snapshot at ``target``."""

    host_path: str
    """Absolute, canonical, link-free path inside a configured bind mount (the ceiling)."""
    target: str
    """Where the snapshot appears in the container (a file path, e.g. ``/in/data.csv``)."""
    max_bytes: int = DEFAULT_INPUT_MAX_BYTES


class OutputGrant(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A file the payload writes as ``<output_dir>/<name>``, published to ``host_path``."""

    name: str
    """One path component: the staged file's name in the container's output directory."""
    host_path: str
    """Absolute, canonical destination; must not exist; its parent inside a writable ceiling."""
    max_bytes: int
    mode: int = 0o644
    """Permission bits of the published file (0 to 0o777; set explicitly, umask ignored)."""


class Grants(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    inputs: list[InputGrant] = msgspec.field(default_factory=list)
    outputs: list[OutputGrant] = msgspec.field(default_factory=list)
    output_dir: str = "/out"
    """The container directory where outputs are staged (mounted only if there are outputs)."""


class Receipt(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What was snapshotted or published: the host path, its size and its SHA-256 (hex)."""

    path: str
    bytes: int
    sha256: str


class GrantResult(msgspec.Struct, frozen=True, kw_only=True):
    """The run's result and the receipts.

    ``published`` is True when the success criterion held and every output was published
    (``receipts`` then lists them in grant order); False means nothing was published.
    """

    result: RunResult
    receipts: list[Receipt]
    inputs: list[Receipt]
    published: bool


def exited_zero(result: RunResult) -> bool:
    """The default success criterion: the payload exited by itself with status 0."""
    return result.ok


# --- pure checks -------------------------------------------------------------------------------


def _check_size(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, "must be an integer number of bytes")
    if not 0 < value <= INT64_MAX:
        raise SpecError(field, f"must be > 0 and <= {INT64_MAX}")
    return value


def _check_grant_path(field: str, path: object, state_dir: str | None) -> str:
    """Absolute, canonical, printable; never a protected path or the supervisor's state.

    Unlike a bind source, a grant path never reaches Docker (the broker's copies do), so
    Docker's bind syntax imposes nothing here: a ':' in a file name is fine.
    """
    if not isinstance(path, str) or not path:
        raise SpecError(field, "must be a non-empty string")
    if has_control(path):
        raise SpecError(field, "must not contain control characters")
    if not path.startswith("/"):
        raise SpecError(field, "must be an absolute path")
    if ".." in path.split("/"):
        raise SpecError(field, "must not contain '..' (traversal)")
    clean = posixpath.normpath("/" + path.lstrip("/"))
    if clean != path:
        raise SpecError(field, f"must be written canonically as {clean!r}")
    reason = protected_reason(clean) or overlap_reason(clean, state_dir)
    if reason:
        raise SpecError(field, f"{clean} is refused: {reason}")
    return clean


def _check_name(field: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise SpecError(field, "must be a non-empty file name")
    if "/" in name or name in (".", ".."):
        raise SpecError(field, "must be a single path component (no '/', '.' or '..')")
    if has_control(name):
        raise SpecError(field, "must not contain control characters")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise SpecError(field, f"must be at most {NAME_MAX} bytes")
    return name


@dataclass(frozen=True)
class _Ceiling:
    field: str
    paths: frozenset[str]  # as configured (normalised) and as resolved on the host
    writable: bool


def _ceilings(spec: SandboxSpec, settings: Settings) -> list[_Ceiling]:
    """The spec's bind mounts, resolved on the host (missing or special sources are refused)."""
    found: list[_Ceiling] = []
    for index, mount in enumerate(spec.mounts):
        if isinstance(mount, BindMount):
            field = f"mounts[{index}].source"
            real = resolve_host_path(field, mount.source, state_dir=settings.supervisor_state_dir)
            paths = frozenset({posixpath.normpath("/" + mount.source.lstrip("/")), real})
            found.append(_Ceiling(field, paths, writable=not mount.read_only))
    return found


def _inside(path: str, ceiling: _Ceiling) -> bool:
    return any(is_within(path, root) for root in ceiling.paths)


def check_grants(spec: SandboxSpec, grants: Grants, settings: Settings) -> None:
    """Refuse malformed grants and grants outside the ceilings, naming the grant (SpecError).

    ``spec`` must already be valid under ``settings``. A grant path is inside a ceiling if it
    lies within the mount's source as configured or as resolved; since grant paths are later
    opened without following any link, both spellings name the same files. Touches the host
    only to resolve the ceilings.
    """
    if not isinstance(grants, Grants):
        raise SpecError("grants", "must be a Grants")
    if not isinstance(grants.inputs, list) or not isinstance(grants.outputs, list):
        raise SpecError("grants", "inputs and outputs must be lists")
    if len(grants.outputs) > MAX_OUTPUTS:
        raise SpecError("grants.outputs", f"at most {MAX_OUTPUTS} outputs")
    kept = [m for m in spec.mounts if not isinstance(m, BindMount)]
    mounts = len(kept) + len(grants.inputs) + (1 if grants.outputs else 0)
    if mounts > MAX_MOUNTS:
        raise SpecError(
            "grants.inputs",
            f"{len(grants.inputs)} inputs need {mounts} mounts with the spec's other mounts; "
            f"at most {MAX_MOUNTS}",
        )
    state_dir = settings.supervisor_state_dir
    ceilings = _ceilings(spec, settings)
    targets: dict[str, str] = {}

    def claim(field: str, target: str) -> None:
        for other, owner in targets.items():
            if is_within(target, other) or is_within(other, target):
                raise SpecError(field, f"{target} collides with {owner} at {other}")
        targets[target] = field

    for index, mount in enumerate(spec.mounts):
        if not isinstance(mount, BindMount):
            claim(f"mounts[{index}].target", posixpath.normpath(mount.target))
    if grants.outputs:
        claim("grants.output_dir", check_target("grants.output_dir", grants.output_dir))

    for index, grant in enumerate(grants.inputs):
        field = f"grants.inputs[{index}]"
        if not isinstance(grant, InputGrant):
            raise SpecError(field, "must be an InputGrant")
        path = _check_grant_path(f"{field}.host_path", grant.host_path, state_dir)
        claim(f"{field}.target", check_target(f"{field}.target", grant.target))
        _check_size(f"{field}.max_bytes", grant.max_bytes)
        if not any(_inside(path, c) for c in ceilings):
            raise SpecError(
                f"{field}.host_path",
                f"{path} is outside every configured bind mount; configured mounts are the "
                "ceilings for grants",
            )

    names: set[str] = set()
    destinations: set[str] = set()
    for index, output in enumerate(grants.outputs):
        field = f"grants.outputs[{index}]"
        if not isinstance(output, OutputGrant):
            raise SpecError(field, "must be an OutputGrant")
        name = _check_name(f"{field}.name", output.name)
        if name in names:
            raise SpecError(f"{field}.name", f"duplicate output name {name!r}")
        names.add(name)
        path = _check_grant_path(f"{field}.host_path", output.host_path, state_dir)
        if path in destinations:
            raise SpecError(f"{field}.host_path", f"{path} is already another output's path")
        destinations.add(path)
        _check_size(f"{field}.max_bytes", output.max_bytes)
        if isinstance(output.mode, bool) or not isinstance(output.mode, int):
            raise SpecError(f"{field}.mode", "must be an integer")
        if not 0 <= output.mode <= 0o777:
            raise SpecError(f"{field}.mode", "must be permission bits 0 to 0o777")
        parent = posixpath.dirname(path)
        if not any(c.writable and _inside(parent, c) for c in ceilings):
            read_only = [c.field for c in ceilings if _inside(parent, c)]
            where = (
                f"is only inside read-only mounts ({', '.join(read_only)}); outputs need a mount "
                "with read_only = false"
                if read_only
                else "is outside every configured bind mount; configured mounts are the "
                "ceilings for grants"
            )
            raise SpecError(f"{field}.host_path", f"the parent {parent} {where}")


def derive_spec(
    spec: SandboxSpec,
    grants: Grants,
    snapshots: Sequence[str],
    staging: str | None,
) -> SandboxSpec:
    """The spec the broker runs: the ceilings replaced by the snapshots and the staging
    directory, and ``fsize`` tightened to the largest output's ``max_bytes``."""
    mounts: list[Mount] = [m for m in spec.mounts if not isinstance(m, BindMount)]
    for grant, source in zip(grants.inputs, snapshots, strict=True):
        mounts.append(BindMount(source=source, target=grant.target, read_only=True))
    limits = spec.limits
    if grants.outputs:
        if staging is None:
            raise ValueError("outputs need a staging directory")
        mounts.append(BindMount(source=staging, target=grants.output_dir, read_only=False))
        largest = max(output.max_bytes for output in grants.outputs)
        limits = msgspec.structs.replace(limits, fsize_bytes=min(limits.fsize_bytes, largest))
    return msgspec.structs.replace(spec, mounts=mounts, limits=limits)


publish(__name__, globals())  # public names show as sbxkit.NAME
