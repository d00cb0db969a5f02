"""Tar streams of whole directory trees, for ``put_dir`` and ``get_dir``: headers out, an
incremental reader in.

Pure: names and bytes in; header bytes, calls on a ``TreeSink`` or ``ArchiveError`` out. The
archive.py rules hold, made for streams that never sit whole in memory:

- Members are directories and regular files only. Symbolic and hard links, devices, FIFOs,
  sparse files and global pax headers are refused by kind, the first one ending the transfer.
- Every name is checked with ``relative_name`` (no absolute names, no ``..``, no control
  characters) and may appear once; a tree's own top (``.``) is allowed once, as the first member.
- ``max_entries`` bounds the members (directories and files), ``max_bytes`` their content:
  exactly N passes, N + 1 is refused as soon as its header is read, before its data is written.
  The raw stream is bounded as well (``dir_stream_cap``), and so is every GNU long name and pax
  header, so no run of metadata can grow without a member to count.
"""

from __future__ import annotations

import tarfile
from typing import Protocol

from sbxkit._consumers.archive import _KIND_NAMES, END_OVERHEAD, TAR_BLOCK, relative_name
from sbxkit.errors import ArchiveError, SpecError

__all__ = [
    "END_BLOCKS",
    "TarReader",
    "TreeSink",
    "check_bounds",
    "dir_stream_cap",
    "padding",
    "tar_header",
]

NAME_MAX_BYTES = 4096
"""A GNU long name or pax path longer than Linux's PATH_MAX is refused."""
PAX_MAX_BYTES = 8192
DIR_MEMBER_OVERHEAD = 2 * TAR_BLOCK + PAX_MAX_BYTES + TAR_BLOCK
"""Worst-case stream bytes per member beyond its content: its header, one long-name or pax
header with its data, and padding."""
END_BLOCKS = b"\0" * (2 * TAR_BLOCK)

_KINDS = {
    **_KIND_NAMES,
    tarfile.GNUTYPE_SPARSE: "sparse file",
    tarfile.GNUTYPE_LONGLINK: "long link name",
    tarfile.XGLTYPE: "global pax header",
}
_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


def check_bounds(max_bytes: object, max_entries: object) -> tuple[int, int]:
    """``max_bytes`` and ``max_entries`` as given: whole numbers, 0 or more."""
    for field, value in (("max_bytes", max_bytes), ("max_entries", max_entries)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(field, f"must be a whole number >= 0, got {value!r}")
    assert isinstance(max_bytes, int)
    assert isinstance(max_entries, int)
    return max_bytes, max_entries


def dir_stream_cap(max_bytes: int, max_entries: int) -> int:
    """The most stream bytes a tree of ``max_entries`` members and ``max_bytes`` content takes."""
    return max_bytes + max_entries * DIR_MEMBER_OVERHEAD + END_OVERHEAD


def padding(size: int) -> bytes:
    """The zeros that round ``size`` content bytes up to whole tar blocks."""
    return b"\0" * (-size % TAR_BLOCK)


def tar_header(
    name: str, *, directory: bool, size: int = 0, mode: int, uid: int, gid: int, mtime: int
) -> bytes:
    """The header (with a GNU long-name header first if the name needs one) of one member."""
    info = tarfile.TarInfo(relative_name(name))
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.size = 0 if directory else size
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    info.mtime = mtime
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "strict")


class TreeSink(Protocol):
    """Where a checked stream's members go, in archive order."""

    def directory(self, name: str, mode: int) -> None: ...

    def file_start(self, name: str, size: int, mode: int) -> None: ...

    def file_data(self, data: bytes) -> None: ...

    def file_end(self) -> None: ...


class TarReader:
    """Reads an untrusted tar stream fed in arbitrary pieces, checking each member before
    ``sink`` sees it. ``close`` refuses a stream that ended before the archive's end."""

    def __init__(self, sink: TreeSink, *, max_bytes: int, max_entries: int) -> None:
        self._sink = sink
        self._max_bytes = max_bytes
        self._max_entries = max_entries
        self._cap = dir_stream_cap(max_bytes, max_entries)
        self._raw = 0
        self._entries = 0
        self._content = 0
        self._names: set[str] = set()
        self._buffer = bytearray()
        self._state = "header"  # header | name | pax | data | skip | ended
        self._need = TAR_BLOCK  # bytes the header, name or pax state collects
        self._meta_size = 0
        self._left = 0  # data or skip bytes still to come
        self._pad = 0
        self._long_name: str | None = None
        self._pax: dict[str, str] = {}
        self._meta = False  # a long name or pax header waits for its member

    @property
    def ended(self) -> bool:
        return self._state == "ended"

    def feed(self, data: bytes) -> None:
        self._raw += len(data)
        if self._raw > self._cap:
            raise ArchiveError(
                "*",
                f"the tar stream passed {self._cap} bytes, more than max_bytes="
                f"{self._max_bytes} and max_entries={self._max_entries} allow",
            )
        view = memoryview(data)
        pos = 0
        while pos < len(view) and self._state != "ended":  # after the end: zeros, ignored
            if self._state in ("data", "skip"):
                take = min(self._left, len(view) - pos)
                if self._state == "data":
                    self._sink.file_data(bytes(view[pos : pos + take]))
                pos += take
                self._left -= take
                if self._left == 0:
                    if self._state == "data":
                        self._sink.file_end()
                    self._skip(self._pad if self._state == "data" else 0)
                continue
            take = min(self._need - len(self._buffer), len(view) - pos)
            self._buffer += view[pos : pos + take]
            pos += take
            if len(self._buffer) == self._need:
                block = bytes(self._buffer)
                self._buffer.clear()
                self._complete(block)

    def close(self) -> None:
        if self._state != "ended":
            raise ArchiveError("*", "the tar stream ended before the end of the archive")

    def _skip(self, count: int) -> None:
        self._pad = 0
        if count:
            self._state, self._left = "skip", count
        else:
            self._state, self._need = "header", TAR_BLOCK

    def _complete(self, block: bytes) -> None:
        if self._state == "name":
            raw = block[: self._meta_size].split(b"\0", 1)[0]
            self._long_name = _decode(raw, "a GNU long name")
            self._skip(0)
        elif self._state == "pax":
            self._pax = _pax_records(block[: self._meta_size])
            self._skip(0)
        elif not any(block):
            if self._meta:
                raise ArchiveError("*", "a long name or pax header without its member")
            self._state = "ended"
        else:
            self._header(block)

    def _header(self, block: bytes) -> None:
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
        except tarfile.HeaderError as exc:
            raise ArchiveError("*", f"malformed tar header: {exc}") from None
        except UnicodeDecodeError:
            raise ArchiveError("*", "a member name is not UTF-8") from None
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE):
            limit = NAME_MAX_BYTES if info.type == tarfile.GNUTYPE_LONGNAME else PAX_MAX_BYTES
            if self._meta:
                raise ArchiveError("*", "two long-name or pax headers for one member")
            if info.size > limit:
                raise ArchiveError("*", f"a long name or pax header of more than {limit} bytes")
            self._meta = True
            self._meta_size = info.size
            self._state = "name" if info.type == tarfile.GNUTYPE_LONGNAME else "pax"
            self._need = info.size + len(padding(info.size))
            if self._need == 0:
                self._complete(b"")
            return
        name = self._pax.get("path", self._long_name or info.name)
        size = int(self._pax["size"]) if "size" in self._pax else info.size
        self._meta, self._long_name, self._pax = False, None, {}
        directory = info.type == tarfile.DIRTYPE
        if not directory and info.type not in _FILE_TYPES:
            kind = _KINDS.get(info.type, f"member type {info.type!r}")
            raise ArchiveError(name, f"{kind} members are refused (directories and files only)")
        if directory and name in (".", "./") and not self._names and not self._entries:
            self._names.add(".")  # the tree's own top: already the destination
            self._skip(0)
            return
        clean = relative_name(name)
        if clean in self._names:
            raise ArchiveError(name, "the archive names this twice")
        self._names.add(clean)
        self._entries += 1
        if self._entries > self._max_entries:
            raise ArchiveError("*", f"more than {self._max_entries} entries (max_entries)")
        if directory:
            if size:
                raise ArchiveError(name, "a directory member with content")
            self._sink.directory(clean, info.mode)
            self._skip(0)
            return
        self._content += size
        if self._content > self._max_bytes:
            raise ArchiveError(
                "*", f"more than {self._max_bytes} bytes of file content (max_bytes)"
            )
        self._sink.file_start(clean, size, info.mode)
        if size == 0:
            self._sink.file_end()
            self._skip(0)
        else:
            self._state, self._left, self._pad = "data", size, len(padding(size))


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ArchiveError("*", f"{what} is not UTF-8") from None


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``path`` and ``size`` of a pax header (``LEN key=value\\n`` records); the other keys
    (times, owners) are not used."""
    found: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        length_text, space, _ = data[pos : pos + 20].partition(b" ")
        if not space or not length_text.isdigit() or int(length_text) <= len(length_text) + 1:
            raise ArchiveError("*", "malformed pax header")
        record = data[pos : pos + int(length_text)]
        if len(record) != int(length_text) or not record.endswith(b"\n"):
            raise ArchiveError("*", "malformed pax header")
        key, equals, value = record[len(length_text) + 1 : -1].partition(b"=")
        if not equals:
            raise ArchiveError("*", "malformed pax header")
        if key in (b"path", b"size"):
            text = _decode(value, "a pax header")
            if key == b"size" and not text.isdigit():
                raise ArchiveError("*", f"a pax size that is not a number: {text!r}")
            found[key.decode()] = text
        pos += int(length_text)
    return found
