"""The host side of ``put_dir`` and ``get_dir``: walking a host tree into a tar stream, and
writing a checked tar stream into a host directory (sbxkit/_consumers/tar_stream.py checks it).

Reading (``put_dir``): the tree is listed first without following anything — a symbolic link,
device, FIFO or socket in it is refused, and the bounds are checked — and only then streamed,
one file at a time; a file that changed size since it was listed is refused.

Writing (``get_dir``): into a directory that did not exist or was empty, through directory
descriptors opened with ``O_NOFOLLOW`` and files created with ``O_CREAT | O_EXCL |
O_NOFOLLOW``: nothing is followed and nothing that was there is overwritten. Directories are
made 0o700 and files 0o600 (0o700 when the sandbox's file had its owner's execute bit), before
the umask; no owner, time or other mode bit from the sandbox is kept. On a failure
``discard`` removes what was written.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Generator
from dataclasses import dataclass

import trio

from sbxkit._consumers.archive import relative_name
from sbxkit._consumers.tar_stream import END_BLOCKS, padding, tar_header
from sbxkit.errors import ArchiveError, SpecError

__all__ = [
    "HostWriter",
    "LocalEntry",
    "TreeTarStream",
    "discard",
    "host_path",
    "open_target",
    "walk_tree",
]

CHUNK = 256 * 1024
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def host_path(local_dir: object) -> str:
    """``local_dir`` (a ``str`` or ``os.PathLike[str]``) as a non-empty string."""
    try:
        path = os.fspath(local_dir)  # type: ignore[call-overload]
    except TypeError:
        path = None
    if not isinstance(path, str) or not path:
        raise SpecError("local_dir", f"must be a non-empty str or os.PathLike, got {local_dir!r}")
    return path


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


@dataclass(frozen=True)
class LocalEntry:
    """One member of a host tree: its name relative to the top, and what it is."""

    name: str
    directory: bool
    size: int = 0
    executable: bool = False


def walk_tree(root: str, *, max_bytes: int, max_entries: int) -> list[LocalEntry]:
    """Every directory and regular file under ``root``, each directory before its contents.

    Nothing is followed below ``root``; links and special files are refused, as are names that
    are not UTF-8 or hold control characters, and more than ``max_entries`` members or
    ``max_bytes`` of content (counted while walking: a huge tree is refused early).
    """
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            raise ArchiveError(root, "not a directory")
    except FileNotFoundError:
        raise ArchiveError(root, "no such directory on the host") from None
    entries: list[LocalEntry] = []
    total = 0
    pending = [""]
    while pending:
        top = pending.pop()
        with os.scandir(os.path.join(root, top) if top else root) as listing:
            found = sorted(listing, key=lambda entry: entry.name)
        for item in found:
            name = f"{top}/{item.name}" if top else item.name
            shown = os.path.join(root, name)
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise ArchiveError(shown, "the name is not UTF-8") from None
            relative_name(name)
            info = item.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                entries.append(LocalEntry(name, directory=True))
                pending.append(name)
            elif stat.S_ISREG(info.st_mode):
                entries.append(LocalEntry(name, False, info.st_size, bool(info.st_mode & 0o100)))
                total += info.st_size
            else:
                raise ArchiveError(
                    shown, f"{_kind(info.st_mode)}: only directories and regular files are copied"
                )
            if len(entries) > max_entries:
                raise ArchiveError(root, f"more than {max_entries} entries (max_entries)")
            if total > max_bytes:
                raise ArchiveError(root, f"more than {max_bytes} bytes of file content (max_bytes)")
    return entries


def _tar_chunks(
    root: str, entries: list[LocalEntry], uid: int, gid: int, mtime: int
) -> Generator[bytes, None, None]:
    buffer = bytearray()
    for entry in entries:
        mode = 0o755 if entry.directory or entry.executable else 0o644
        buffer += tar_header(
            entry.name,
            directory=entry.directory,
            size=entry.size,
            mode=mode,
            uid=uid,
            gid=gid,
            mtime=mtime,
        )
        if not entry.directory:
            shown = os.path.join(root, entry.name)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(shown, flags)
            except OSError as exc:
                raise ArchiveError(shown, f"cannot read it: {exc.strerror}") from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size:
                    raise ArchiveError(shown, "changed while it was being copied")
                left = entry.size
                while left:
                    data = os.read(fd, min(left, CHUNK))
                    if not data:
                        raise ArchiveError(shown, "changed while it was being copied")
                    buffer += data
                    left -= len(data)
                    if len(buffer) >= CHUNK:
                        yield bytes(buffer)
                        buffer.clear()
            finally:
                os.close(fd)
            buffer += padding(entry.size)
        if len(buffer) >= CHUNK:
            yield bytes(buffer)
            buffer.clear()
    yield bytes(buffer + END_BLOCKS)


class TreeTarStream(trio.abc.ReceiveStream):
    """A tar of ``entries`` (from ``walk_tree``) under ``root``, owned by ``uid:gid``, read a
    chunk at a time in a worker thread as the sandbox takes it."""

    def __init__(
        self, root: str, entries: list[LocalEntry], *, uid: int, gid: int, mtime: int
    ) -> None:
        self._chunks = _tar_chunks(root, entries, uid, gid, mtime)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await trio.to_thread.run_sync(next, self._chunks, b"")

    async def aclose(self) -> None:
        self._chunks.close()  # closes the file being read, if any
        await trio.lowlevel.checkpoint()


def open_target(path: str) -> tuple[int, bool]:
    """A descriptor of the host directory ``get_dir`` writes into, and whether it made it: the
    directory must not exist (its parent must) or be empty, and must not be a link."""
    try:
        os.mkdir(path, 0o700)
        made = True
    except FileExistsError:
        made = False
    except OSError as exc:
        raise ArchiveError(path, f"cannot create the host directory: {exc.strerror}") from None
    try:
        fd = os.open(path, _DIR_OPEN)
    except OSError as exc:
        reason = exc.strerror
        if os.path.islink(path):
            reason = "a symbolic link (name a real, empty directory)"
        raise ArchiveError(path, f"cannot write into it: {reason}") from None
    if not made and os.listdir(fd):
        os.close(fd)
        raise ArchiveError(path, "exists and is not empty: get_dir writes into a new or empty dir")
    return fd, made


def discard(fd: int, path: str, made: bool) -> None:
    """Remove what was written under the target (by descriptor, following nothing), and the
    target itself if ``open_target`` made it."""
    for name in os.listdir(fd):
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
    if made:
        os.rmdir(path)


class HostWriter:
    """A ``TreeSink`` that writes under the directory ``root_fd`` (shown as ``shown``)."""

    def __init__(self, root_fd: int, shown: str) -> None:
        self._root = root_fd
        self._shown = shown
        self._made: set[str] = set()  # directories this writer created
        self._parent: tuple[str, int] | None = None  # the last parent, kept open
        self._file: int | None = None
        self._name = ""

    def _fail(self, name: str, exc: OSError) -> ArchiveError:
        return ArchiveError(f"{self._shown}/{name}", f"cannot write it on the host: {exc.strerror}")

    def _dir_fd(self, name: str) -> int:
        """The directory ``name`` (``""``: the top), made 0o700 where missing."""
        if not name:
            return self._root
        if self._parent is not None and self._parent[0] == name:
            return self._parent[1]
        fd = self._root
        done: list[str] = []
        try:
            for part in name.split("/"):
                done.append(part)
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    self._made.add("/".join(done))
                except FileExistsError:
                    pass
                inner = os.open(part, _DIR_OPEN, dir_fd=fd)
                if fd != self._root:
                    os.close(fd)
                fd = inner
        except OSError as exc:
            if fd != self._root:
                os.close(fd)
            raise self._fail("/".join(done), exc) from None
        self.close_parent()
        self._parent = (name, fd)
        return fd

    def close_parent(self) -> None:
        if self._parent is not None:
            os.close(self._parent[1])
            self._parent = None

    def directory(self, name: str, mode: int) -> None:
        parent, _, base = name.rpartition("/")
        fd = self._dir_fd(parent)
        try:
            os.mkdir(base, 0o700, dir_fd=fd)
        except FileExistsError:
            if name not in self._made:  # made as a parent already: fine; anything else is not
                raise ArchiveError(f"{self._shown}/{name}", "already exists on the host") from None
        except OSError as exc:
            raise self._fail(name, exc) from None
        self._made.add(name)

    def file_start(self, name: str, size: int, mode: int) -> None:
        parent, _, base = name.rpartition("/")
        fd = self._dir_fd(parent)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self._file = os.open(base, flags, 0o700 if mode & 0o100 else 0o600, dir_fd=fd)
        except OSError as exc:
            raise self._fail(name, exc) from None
        self._name = name

    def file_data(self, data: bytes) -> None:
        assert self._file is not None
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._file, view) :]
        except OSError as exc:
            raise self._fail(self._name, exc) from None

    def file_end(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None

    def close(self) -> None:
        self.file_end()
        self.close_parent()
