"""Tar archives for moving files in and out of a sandbox, with the confinement rules.

Pure: names and bytes in, a tar (or a dict of files) or ``ArchiveError`` out; no I/O beyond
in-memory buffers. ``sbxkit._consumers.session`` runs ``tar`` inside the sandbox and feeds this
module.

Rules, the same in both directions:

- Every path is confined to one root directory (the sandbox's file root, ``/tmp`` by
  default). A path is either relative to the root or absolute under it. ``..`` components are
  refused wherever they appear — even where they would resolve inside the root — and so are
  empty names, NUL and control characters, and absolute paths outside the root.
- Archives carry regular files only (``build_tar`` also adds their parent directories). On the
  way out of the sandbox every other member kind is refused: symbolic and hard links (a link
  could name anything; refusing all of them is simpler to trust than judging targets),
  devices, FIFOs, and — since callers ask for files — directories.
- Counts and sizes are capped: at most ``max_files`` files and ``max_bytes`` content bytes.
  Exactly N passes, N + 1 is refused.
"""

from __future__ import annotations

import io
import tarfile
import unicodedata
from collections.abc import Iterable, Mapping

from sbxkit._consumers.exec_scripts import MISSING_STATUS
from sbxkit._model.result import RunResult
from sbxkit.errors import ArchiveError, SandboxFileNotFound

DEFAULT_MAX_FILES = 1000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
TAR_BLOCK = 512
MEMBER_OVERHEAD = 3 * TAR_BLOCK
"""Worst-case tar bytes per member beyond its content: header, GNU long-name header and name
block, and padding — used to bound a tar stream before it is parsed."""
END_OVERHEAD = 20 * TAR_BLOCK
"""Two zero end blocks, rounded up to tar's default 10 KiB record, with room to spare."""


def stream_cap(max_bytes: int, max_files: int) -> int:
    """The most tar bytes an archive of ``max_files`` files and ``max_bytes`` content can take
    (an upper bound: the exact content cap is enforced when the archive is parsed)."""
    return max_bytes + max_files * MEMBER_OVERHEAD + END_OVERHEAD


def _has_control(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def check_root(root: str) -> str:
    """A file root: absolute, normalised (no ``.``, ``..``, empty or trailing components)."""
    if not isinstance(root, str) or not root.startswith("/"):
        raise ArchiveError(str(root), "the file root must be an absolute path")
    if _has_control(root):
        raise ArchiveError(root, "the file root must not contain control characters")
    parts = root.split("/")[1:]
    if root != "/" and any(part in ("", ".", "..") for part in parts):
        raise ArchiveError(root, "the file root must be normalised (no '.', '..' or '//')")
    return root


def confine(path: str, root: str) -> str:
    """``path`` (relative to ``root``, or absolute under it) as a clean relative path.

    ``"."`` components and repeated slashes are dropped; ``..`` anywhere, an absolute path
    outside ``root`` and a path naming ``root`` itself are refused.
    """
    check_root(root)
    if not isinstance(path, str) or not path:
        raise ArchiveError(str(path), "empty path")
    if _has_control(path):
        raise ArchiveError(path, "control characters (NUL included) are refused")
    rest = path
    if path.startswith("/"):
        prefix = root.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ArchiveError(path, f"absolute path outside the file root {root}")
        rest = path[len(prefix) :]
    parts = [part for part in rest.split("/") if part not in ("", ".")]
    if ".." in rest.split("/"):
        raise ArchiveError(path, "'..' components are refused")
    if not parts:
        raise ArchiveError(path, f"names the file root {root} itself, not a file in it")
    return "/".join(parts)


def confine_dir(path: str, root: str) -> str:
    """A destination directory: ``root`` itself (``"."``, ``""`` or ``root``) or a directory
    confined to it, as an absolute path."""
    check_root(root)
    if path in ("", ".") or (isinstance(path, str) and path.rstrip("/") == root.rstrip("/")):
        return root
    relative = confine(path, root)
    return root.rstrip("/") + "/" + relative


def relative_name(name: str) -> str:
    """A relative file name (a key of ``put_files``): no absolute paths, no ``..``."""
    if isinstance(name, str) and name.startswith("/"):
        raise ArchiveError(name, "file names are relative to the destination directory")
    return confine(name, "/")


def member_paths(files: Mapping[str, bytes]) -> list[str]:
    """Every directory and file an archive of ``files`` names, relative, parents first."""
    paths: set[str] = set()
    for name in files:
        parts = relative_name(name).split("/")
        paths.update("/".join(parts[: end + 1]) for end in range(len(parts)))
    return sorted(paths, key=lambda path: (path.count("/"), path))


def _check_caps(count: int, size: int, max_files: int, max_bytes: int) -> None:
    if count > max_files:
        raise ArchiveError("*", f"more than {max_files} files")
    if size > max_bytes:
        raise ArchiveError("*", f"more than {max_bytes} bytes of file content")


def build_tar(
    files: Mapping[str, bytes],
    *,
    uid: int = 0,
    gid: int = 0,
    mode: int = 0o644,
    mtime: int = 0,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> bytes:
    """A tar of ``files`` (relative name → content): regular files only, owned by ``uid:gid``.
    Names are checked with ``relative_name``. No directory member: the sandbox makes missing
    parents with ``mkdir -p`` (``PUT_SCRIPT``), which leaves existing ones as they are, where
    tar would reset an existing directory's mode to the member's."""
    if not isinstance(files, Mapping):
        raise ArchiveError("*", "files must be a mapping of name to bytes")
    names: dict[str, bytes] = {}
    for name, data in files.items():
        clean = relative_name(name)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ArchiveError(str(name), "content must be bytes")
        if clean in names:
            raise ArchiveError(str(name), "the same file is named twice")
        names[clean] = bytes(data)
    _check_caps(len(names), sum(len(d) for d in names.values()), max_files, max_bytes)
    directories = sorted(
        {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    )
    clash = set(directories) & set(names)
    if clash:
        raise ArchiveError(sorted(clash)[0], "named both as a file and as a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in names.items():
            info = _info(name, tarfile.REGTYPE, uid, gid, mode, mtime)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _info(name: str, kind: bytes, uid: int, gid: int, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mode = mode
    info.mtime = mtime
    return info


_KIND_NAMES = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
    tarfile.DIRTYPE: "directory",
    tarfile.CONTTYPE: "contiguous file",
}


def parse_tar(
    data: bytes,
    *,
    max_files: int = DEFAULT_MAX_FILES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, bytes]:
    """The regular files of an untrusted tar, by clean relative name.

    Refuses (``ArchiveError``) every member that is not a regular file, names that are
    absolute or contain ``..``, duplicate names, more than ``max_files`` members and more than
    ``max_bytes`` of content. Malformed archives are refused too.
    """
    files: dict[str, bytes] = {}
    size = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            while (member := tar.next()) is not None:
                name = member.name
                if not member.isreg() or member.type == tarfile.CONTTYPE:
                    kind = _KIND_NAMES.get(member.type, f"member type {member.type!r}")
                    raise ArchiveError(name, f"{kind} members are refused (regular files only)")
                clean = relative_name(name)
                if clean in files:
                    raise ArchiveError(name, "the archive names this file twice")
                size += member.size
                _check_caps(len(files) + 1, size, max_files, max_bytes)
                handle = tar.extractfile(member)
                if handle is None:  # pragma: no cover - regular members always have data
                    raise ArchiveError(name, "no data")
                content = handle.read()
                if len(content) != member.size:
                    raise ArchiveError(name, "truncated member")
                files[clean] = content
    except tarfile.TarError as exc:
        raise ArchiveError("*", f"malformed tar archive: {exc}") from None
    return files


def expect_exactly(files: Mapping[str, bytes], wanted: Iterable[str]) -> None:
    """The archive holds exactly the ``wanted`` names (clean relative paths), no more."""
    wanted_set = set(wanted)
    extra = sorted(set(files) - wanted_set)
    if extra:
        raise ArchiveError(extra[0], "not requested (a directory was named? ask for files)")
    missing = sorted(wanted_set - set(files))
    if missing:
        raise ArchiveError(missing[0], "missing from the archive")


def check_missing(result: RunResult, wanted: Mapping[str, str], root: str) -> None:
    """``GET_SCRIPT`` said a file is not there: ``SandboxFileNotFound`` naming it as given."""
    if result.status != "exited" or result.exit_code != MISSING_STATUS:
        return
    said = result.stderr.decode("utf-8", "replace").splitlines()
    for path, clean in wanted.items():
        if said and said[0] == "./" + clean:
            raise SandboxFileNotFound(path, f"{root.rstrip('/')}/{clean}")


def check_transfer(result: RunResult, where: str, doing: str) -> None:
    if result.ok:
        return
    detail = result.stderr.decode("utf-8", "replace").strip()[:500]
    if result.status == "exited":
        raise ArchiveError(where, f"tar {doing} failed with status {result.exit_code}: {detail}")
    raise ArchiveError(where, f"tar {doing} ended: {result.status.replace('_', ' ')} {detail}")
