"""One-shot file grants: inputs as private snapshots, outputs staged and published with receipts.

The payload never sees the operator's live directories. The spec's configured bind mounts are
only *ceilings*: every granted path must lie inside one (outputs inside one with
``read_only = false``), and none of them is passed to Docker. Instead:

- **Inputs** are opened without following a link in any component (a walk from ``/`` with
  ``O_NOFOLLOW``), must be regular files with exactly one link and at most ``max_bytes``, and
  are copied — hashing as they go — into a private broker directory (0700). Each copy is
  mode 0444, owned by the broker, and bind-mounted read-only at its ``target``.
- **Outputs** are written by the payload into a private staging directory, bind-mounted
  read-write at ``output_dir``. Nothing is published unless the run returned (the container's
  removal confirmed: ``run`` raises otherwise) and the success criterion holds. Then each
  staged file is re-checked (opened without following links, regular, one link, within
  ``max_bytes``), copied into a temp file inside the held destination parent, fsync'd,
  published with ``link(2)`` — which never replaces an existing name — and the parent is
  fsync'd. Each publication yields a ``Receipt`` of path, bytes and sha256.
- The per-file size limit (``RLIMIT_FSIZE``) becomes the smaller of the spec's and the largest
  output's ``max_bytes``: grants tighten it, never loosen it.

The broker's directory is removed whatever happens (error, cancellation). Host parents of the
granted paths must stay under the operator's control: the no-link walk refuses links that exist
when a path is opened, but a concurrent rename of a parent directory by another host account is
outside what any path-based check can rule out (see ``docs/grants.md``).

Blocking file work runs in worker threads so the event loop never waits on the disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import secrets
import shutil
import stat
import tempfile
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import trio

from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError, SpecError
from sbxkit.mounts import (
    MAX_MOUNTS,
    BindMount,
    Mount,
    check_target,
    is_within,
    overlap_reason,
    protected_reason,
)
from sbxkit.owner import Owner
from sbxkit.preflight import resolve_host_path
from sbxkit.result import RunResult
from sbxkit.runner import effective_settings, run
from sbxkit.settings import Settings
from sbxkit.spec import INT64_MAX, MiB, SandboxSpec, parse_user, validate_spec

__all__ = [
    "DEFAULT_INPUT_MAX_BYTES",
    "GrantError",
    "GrantResult",
    "Grants",
    "InputGrant",
    "OutputGrant",
    "Receipt",
    "check_grants",
    "derive_spec",
    "exited_zero",
    "open_directory",
    "publish_outputs",
    "run_with_grants",
    "snapshot_input",
]

DEFAULT_INPUT_MAX_BYTES = 64 * MiB
"""An input larger than this is refused unless its grant says otherwise."""

MAX_OUTPUTS = 32
"""Outputs per run; each holds two descriptors while it is published."""

SNAPSHOT_MODE = 0o444
"""Readable by the sandbox user; nobody is the payload's owner, and the mount is read-only."""

STAGING_MODE = 0o700
CHUNK = 1024 * 1024
NAME_MAX = 255
TEMP_PREFIX = ".sbxkit-"
TEMP_SUFFIX = ".tmp"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused after fstat anyway).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


class GrantError(SbxError):
    """A granted file could not be used safely, so it was refused.

    Raised before the run for inputs (no container was created) and after it for outputs
    (the container was already removed; ``result`` is the run's result). ``published`` lists
    outputs that were published before the failure: empty for every refusal found while
    checking, since all outputs are checked before the first is published.
    """

    def __init__(
        self,
        grant: str,
        path: str,
        reason: str,
        *,
        published: Sequence[Receipt] = (),
        result: RunResult | None = None,
    ) -> None:
        super().__init__(f"{grant} ({path}): {reason}")
        self.grant = grant
        self.path = path
        self.reason = reason
        self.published: list[Receipt] = list(published)
        self.result = result


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
    if any(unicodedata.category(ch) == "Cc" for ch in path):
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
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
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


# --- file primitives (blocking) ----------------------------------------------------------------


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISREG, "regular file"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def _why(dir_fd: int, name: str, shown: str, exc: OSError, *, want_dir: bool) -> str:
    """Explain a failed no-follow open of ``name`` (under ``dir_fd``) in the user's terms."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return f"{shown} does not exist"
    except OSError:
        return f"{shown}: {exc.strerror or exc}"
    if stat.S_ISLNK(mode):
        return f"{shown} is a symbolic link; grant paths are never followed through links"
    if want_dir and not stat.S_ISDIR(mode):
        return f"{shown} is a {_kind(mode)}, not a directory"
    if not want_dir and not stat.S_ISREG(mode):
        return f"{shown} is a {_kind(mode)}, not a regular file"
    return f"{shown}: {exc.strerror or exc}"


def open_directory(path: str, *, grant: str = "path") -> int:
    """Open the absolute directory ``path`` without following a link in any component.

    Walks from ``/`` one component at a time (``O_DIRECTORY | O_NOFOLLOW`` relative to the
    previous descriptor), so a link anywhere in the path is refused rather than resolved.
    Returns the descriptor; the caller closes it.
    """
    fd = os.open("/", _DIR_FLAGS)
    walked = ""
    try:
        for part in path.split("/"):
            if not part:
                continue
            walked += "/" + part
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise GrantError(grant, path, _why(fd, part, walked, exc, want_dir=True)) from None
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_regular(
    dir_fd: int, name: str, *, grant: str, shown: str, max_bytes: int
) -> tuple[int, os.stat_result]:
    """Open ``name`` under ``dir_fd`` without following it: a regular file, one link, small."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise GrantError(grant, shown, _why(dir_fd, name, shown, exc, want_dir=False)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise GrantError(grant, shown, f"is a {_kind(info.st_mode)}, not a regular file")
        if info.st_nlink != 1:
            raise GrantError(
                grant,
                shown,
                f"has {info.st_nlink} hard links; only a file with exactly one link is accepted",
            )
        if info.st_size > max_bytes:
            raise GrantError(grant, shown, f"is {info.st_size} bytes, over max_bytes {max_bytes}")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _copy_hashing(
    src: int, dst: int, *, expected: int, max_bytes: int, grant: str, shown: str
) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` hashing as it goes; the size must stay what fstat said."""
    digest = hashlib.sha256()
    total = 0
    while chunk := os.read(src, min(CHUNK, max_bytes + 1 - total)):
        total += len(chunk)
        if total > max_bytes:
            raise GrantError(grant, shown, f"grew past max_bytes {max_bytes} while being copied")
        digest.update(chunk)
        _write_all(dst, chunk)
    if total != expected:
        raise GrantError(
            grant, shown, f"changed size while being copied ({expected} -> {total} bytes)"
        )
    return total, digest.hexdigest()


def snapshot_input(grant: InputGrant, dest_dir_fd: int, dest_name: str, *, label: str) -> Receipt:
    """Copy the granted file into ``dest_dir_fd``/``dest_name`` (mode 0444); return its receipt.

    The source is opened without following links anywhere in its path and must be a regular
    file with one link and at most ``max_bytes``. Raises GrantError; OS errors are mapped.
    """
    path = grant.host_path
    parent, leaf = posixpath.split(path)
    try:
        parent_fd = open_directory(parent, grant=label)
        try:
            src, info = _open_regular(
                parent_fd, leaf, grant=label, shown=path, max_bytes=grant.max_bytes
            )
        finally:
            os.close(parent_fd)
        try:
            dst = os.open(dest_name, _CREATE_FLAGS, 0o400, dir_fd=dest_dir_fd)
            try:
                size, sha256 = _copy_hashing(
                    src,
                    dst,
                    expected=info.st_size,
                    max_bytes=grant.max_bytes,
                    grant=label,
                    shown=path,
                )
                os.fchmod(dst, SNAPSHOT_MODE)
            finally:
                os.close(dst)
        finally:
            os.close(src)
    except OSError as exc:
        raise GrantError(label, path, f"snapshot failed: {exc.strerror or exc}") from None
    return Receipt(path=path, bytes=size, sha256=sha256)


@dataclass
class _Pending:
    label: str
    grant: OutputGrant
    staged_fd: int = -1
    parent_fd: int = -1
    size: int = 0
    temp: str | None = None
    sha256: str = ""

    @property
    def leaf(self) -> str:
        return posixpath.basename(self.grant.host_path)

    def close(self) -> None:
        if self.temp is not None and self.parent_fd >= 0:
            # Best effort: the temp name is unguessable and the file private (0600).
            with contextlib.suppress(OSError):
                os.unlink(self.temp, dir_fd=self.parent_fd)
            self.temp = None
        for fd in (self.staged_fd, self.parent_fd):
            if fd >= 0:
                os.close(fd)
        self.staged_fd = self.parent_fd = -1


def publish_outputs(
    staging_fd: int, outputs: Sequence[OutputGrant], *, labels: Sequence[str] | None = None
) -> list[Receipt]:
    """Publish each staged ``outputs[i].name`` (under ``staging_fd``) to its ``host_path``.

    Three phases, so a refusal found by checking publishes nothing:
      1. check: every staged file opened without following links (regular, one link, within
         max_bytes); every destination parent opened with no link in its path and held; no
         destination name may exist;
      2. copy each into a temp file created exclusively (0600) in its held parent, hashing,
         set the grant's mode, fsync;
      3. publish each with ``link(temp, final)`` relative to the held parent — it fails if the
         name exists, so nothing is ever replaced — unlink the temp, fsync the parent.
    Raises GrantError (with ``published`` listing what phase 3 already published).
    """
    labels = list(labels) if labels is not None else [f"outputs[{i}]" for i in range(len(outputs))]
    pending = [_Pending(label, grant) for label, grant in zip(labels, outputs, strict=True)]
    receipts: list[Receipt] = []
    try:
        for item in pending:
            _check_output(staging_fd, item)
        for item in pending:
            _stage_temp(item)
        for item in pending:
            receipts.append(_link_output(item))
    except GrantError as exc:
        exc.published = [*receipts, *exc.published]
        raise
    finally:
        for item in pending:
            item.close()
    return receipts


def _check_output(staging_fd: int, item: _Pending) -> None:
    grant = item.grant
    shown = f"staged output {grant.name!r}"
    item.staged_fd, info = _open_regular(
        staging_fd, grant.name, grant=item.label, shown=shown, max_bytes=grant.max_bytes
    )
    item.size = info.st_size
    item.parent_fd = open_directory(posixpath.dirname(grant.host_path), grant=item.label)
    try:
        os.stat(item.leaf, dir_fd=item.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise GrantError(item.label, grant.host_path, f"cannot check: {exc.strerror}") from None
    raise GrantError(item.label, grant.host_path, "already exists; sbxkit never replaces a file")


def _stage_temp(item: _Pending) -> None:
    grant = item.grant
    temp = f"{TEMP_PREFIX}{secrets.token_hex(12)}{TEMP_SUFFIX}"
    try:
        fd = os.open(temp, _CREATE_FLAGS, 0o600, dir_fd=item.parent_fd)
    except OSError as exc:
        raise GrantError(
            item.label, grant.host_path, f"cannot create a temp file beside it: {exc.strerror}"
        ) from None
    item.temp = temp
    try:
        item.size, item.sha256 = _copy_hashing(
            item.staged_fd,
            fd,
            expected=item.size,
            max_bytes=grant.max_bytes,
            grant=item.label,
            shown=f"staged output {grant.name!r}",
        )
        os.fchmod(fd, grant.mode)
        os.fsync(fd)
    except OSError as exc:
        raise GrantError(item.label, grant.host_path, f"writing failed: {exc.strerror}") from None
    finally:
        os.close(fd)


def _link_output(item: _Pending) -> Receipt:
    grant = item.grant
    assert item.temp is not None
    try:
        os.link(
            item.temp,
            item.leaf,
            src_dir_fd=item.parent_fd,
            dst_dir_fd=item.parent_fd,
            follow_symlinks=False,
        )
    except FileExistsError:
        raise GrantError(
            item.label, grant.host_path, "already exists; sbxkit never replaces a file"
        ) from None
    except OSError as exc:
        raise GrantError(
            item.label,
            grant.host_path,
            f"cannot publish: link(2) failed ({exc.strerror}); the destination filesystem "
            "must support hard links",
        ) from None
    try:
        os.unlink(item.temp, dir_fd=item.parent_fd)
        item.temp = None
        os.fsync(item.parent_fd)
    except OSError as exc:
        raise GrantError(
            item.label,
            grant.host_path,
            f"published, but finishing failed: {exc.strerror}",
            published=[Receipt(path=grant.host_path, bytes=item.size, sha256=item.sha256)],
        ) from None
    return Receipt(path=grant.host_path, bytes=item.size, sha256=item.sha256)


# --- the broker's private directory ------------------------------------------------------------


@dataclass
class _Workspace:
    root: str
    root_fd: int
    inputs_fd: int
    staging_fd: int = -1

    @property
    def staging(self) -> str:
        return posixpath.join(self.root, "out")

    def snapshot(self, index: int) -> str:
        return posixpath.join(self.root, "in", str(index))


def _open_workspace(work_dir: str | None, uid: int, gid: int, staging: bool) -> _Workspace:
    """A fresh private directory (0700): ``in/`` for snapshots, ``out/`` for staging.

    The staging directory belongs to the sandbox user (mode 0700) when the broker can chown,
    else — a broker that is neither root nor the sandbox user — it is mode 0777 and private
    only through the 0700 root above it.
    """
    try:
        root = tempfile.mkdtemp(prefix="sbxkit-grants-", dir=work_dir)
    except OSError as exc:
        raise GrantError("work_dir", str(work_dir), f"cannot create: {exc.strerror}") from None
    ws = _Workspace(root=root, root_fd=-1, inputs_fd=-1)
    try:
        ws.root_fd = os.open(root, _DIR_FLAGS)
        os.mkdir("in", 0o700, dir_fd=ws.root_fd)
        ws.inputs_fd = os.open("in", _DIR_FLAGS, dir_fd=ws.root_fd)
        if staging:
            os.mkdir("out", 0o700, dir_fd=ws.root_fd)
            ws.staging_fd = os.open("out", _DIR_FLAGS, dir_fd=ws.root_fd)
            euid = os.geteuid()
            if euid == 0:
                os.fchown(ws.staging_fd, uid, gid)
                os.fchmod(ws.staging_fd, STAGING_MODE)
            elif euid != uid:
                os.fchmod(ws.staging_fd, 0o777)
    except BaseException as exc:
        problem = _dispose(ws)
        if problem is not None:
            exc.add_note(problem)
        if isinstance(exc, OSError):
            raise GrantError("work_dir", root, f"cannot prepare: {exc.strerror}") from None
        raise
    return ws


def _remove_workspace_path(root: str) -> str | None:
    try:
        shutil.rmtree(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"the broker directory {root} could not be removed: {exc}"
    return None


def _dispose(ws: _Workspace) -> str | None:
    for fd in (ws.staging_fd, ws.inputs_fd, ws.root_fd):
        if fd >= 0:
            os.close(fd)
    ws.staging_fd = ws.inputs_fd = ws.root_fd = -1
    return _remove_workspace_path(ws.root)


def _snapshot_all(inputs: Sequence[InputGrant], ws: _Workspace) -> list[Receipt]:
    return [
        snapshot_input(grant, ws.inputs_fd, str(index), label=f"grants.inputs[{index}]")
        for index, grant in enumerate(inputs)
    ]


# --- the entry point ---------------------------------------------------------------------------


async def run_with_grants(
    spec: SandboxSpec,
    grants: Grants,
    stdin: bytes | None = None,
    *,
    engine: Engine | None = None,
    owner: Owner | None = None,
    socket_path: str | None = None,
    settings: Settings | None = None,
    success: Callable[[RunResult], bool] = exited_zero,
    work_dir: str | None = None,
) -> GrantResult:
    """Run ``spec`` once with file grants; publish outputs only after a successful run.

    ``spec.mounts``' bind mounts are the ceilings (they need ``enable_bind_mounts`` like any
    bind mount) and are not mounted; the payload sees only the snapshots (read-only, at each
    input's ``target``) and the staging directory (at ``grants.output_dir``). ``success``
    decides, from the run's result, whether outputs are published (default: exit status 0).
    ``work_dir`` is where the broker's private directory is made (default: the system temp
    directory); it must be visible to the Docker daemon at the same path.

    Raises SpecError for malformed grants or grants outside the ceilings and GrantError for
    an input refused while snapshotting — in both cases before any container exists — and
    GrantError for an output refused while publishing (after removal). Errors from ``run``
    (including CleanupError) propagate and nothing is published. The broker's directory is
    removed in every case, cancellation included.
    """
    settings = effective_settings(settings)
    validate_spec(spec, settings)
    check_grants(spec, grants, settings)
    uid, gid = parse_user(spec.user)
    ws = await trio.to_thread.run_sync(_open_workspace, work_dir, uid, gid, bool(grants.outputs))
    try:
        outcome = await _run_in(
            ws, spec, grants, stdin, engine, owner, socket_path, settings, success
        )
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            problem = await trio.to_thread.run_sync(_dispose, ws)
        if problem is not None:
            exc.add_note(problem)
        raise
    with trio.CancelScope(shield=True):
        problem = await trio.to_thread.run_sync(_dispose, ws)
    if problem is not None:
        raise GrantError(
            "work_dir", ws.root, problem, published=outcome.receipts, result=outcome.result
        )
    return outcome


async def _run_in(
    ws: _Workspace,
    spec: SandboxSpec,
    grants: Grants,
    stdin: bytes | None,
    engine: Engine | None,
    owner: Owner | None,
    socket_path: str | None,
    settings: Settings,
    success: Callable[[RunResult], bool],
) -> GrantResult:
    inputs = await trio.to_thread.run_sync(_snapshot_all, grants.inputs, ws)
    snapshots = [ws.snapshot(index) for index in range(len(grants.inputs))]
    derived = derive_spec(spec, grants, snapshots, ws.staging if grants.outputs else None)
    # The only bind mounts left are the broker's own; enabling them enables nothing else.
    for mount in derived.mounts:
        if isinstance(mount, BindMount) and not is_within(mount.source, ws.root):
            raise AssertionError(f"bind source {mount.source} is not the broker's")
    derived_settings = msgspec.structs.replace(settings, enable_bind_mounts=True)
    validate_spec(derived, derived_settings)
    result = await run(
        derived,
        stdin,
        engine=engine,
        owner=owner,
        socket_path=socket_path,
        settings=derived_settings,
    )
    if not success(result):
        return GrantResult(result=result, receipts=[], inputs=inputs, published=False)
    if not grants.outputs:
        return GrantResult(result=result, receipts=[], inputs=inputs, published=True)
    labels = [f"grants.outputs[{index}]" for index in range(len(grants.outputs))]
    try:
        receipts = await trio.to_thread.run_sync(
            lambda: publish_outputs(ws.staging_fd, grants.outputs, labels=labels)
        )
    except GrantError as exc:
        exc.result = result
        raise
    return GrantResult(result=result, receipts=receipts, inputs=inputs, published=True)
