"""File grants on the host: the no-link walk, input snapshots and output publication.

Blocking primitives (``broker.py`` runs them in worker threads): inputs are opened without
following a link in any component, must be regular files with one link, and are copied —
hashing as they go — into the broker's private directory; outputs are re-checked, copied into a
temp file inside the held destination parent, fsync'd and published with ``link(2)``, which
never replaces an existing name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from sbxkit._consumers.grants import InputGrant, OutputGrant, Receipt
from sbxkit.errors import GrantError

SNAPSHOT_MODE = 0o444
"""Readable by the sandbox user; nobody is the payload's owner, and the mount is read-only."""

STAGING_MODE = 0o700
CHUNK = 1024 * 1024
TEMP_PREFIX = ".sbxkit-"
TEMP_SUFFIX = ".tmp"

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused after fstat anyway).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    fd = os.open("/", DIR_FLAGS)
    walked = ""
    try:
        for part in path.split("/"):
            if not part:
                continue
            walked += "/" + part
            try:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
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
