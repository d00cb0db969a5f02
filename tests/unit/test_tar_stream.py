"""The directory streams' reader and host writer, fed crafted (hostile) tars.

Each refusal is checked twice: the reader raises ``ArchiveError``, and the host writer behind it
left nothing outside its directory (and ``discard`` removes what it wrote inside).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sbxkit._consumers.host_tree import (
    HostWriter,
    LocalEntry,
    _tar_chunks,
    discard,
    open_target,
    walk_tree,
)
from sbxkit._consumers.tar_stream import TarReader, check_bounds, tar_header
from sbxkit.errors import ArchiveError, SpecError

BIG = 1 << 30


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **fields: object) -> tuple:
    return (name, kind, data, fields)


def crafted(*members: tuple, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar written by ``tarfile`` with whatever names and kinds it is given, unchecked."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for name, kind, data, fields in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            for key, value in fields.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buffer.getvalue()


class Collect:
    """A sink that records what it was given."""

    def __init__(self) -> None:
        self.found: dict[str, bytes | None] = {}
        self.modes: dict[str, int] = {}
        self._name = ""

    def directory(self, name: str, mode: int) -> None:
        self.found[name] = None

    def file_start(self, name: str, size: int, mode: int) -> None:
        self._name = name
        self.found[name] = b""
        self.modes[name] = mode

    def file_data(self, data: bytes) -> None:
        self.found[self._name] = (self.found[self._name] or b"") + data

    def file_end(self) -> None:
        pass


def read(data: bytes, piece: int | None = None, **bounds: int) -> dict[str, bytes | None]:
    sink = Collect()
    reader = TarReader(
        sink, max_bytes=bounds.get("max_bytes", BIG), max_entries=bounds.get("max_entries", 1000)
    )
    step = piece or len(data) or 1
    for offset in range(0, len(data), step):
        reader.feed(data[offset : offset + step])
    reader.close()
    return sink.found


def to_host(data: bytes, target: Path, **bounds: int) -> None:
    """Feed ``data`` to a writer under ``target``, discarding what it wrote on a refusal."""
    fd, made = open_target(str(target))
    writer = HostWriter(fd, str(target))
    reader = TarReader(
        writer, max_bytes=bounds.get("max_bytes", BIG), max_entries=bounds.get("max_entries", 1000)
    )
    try:
        try:
            for offset in range(0, len(data), 700):
                reader.feed(data[offset : offset + 700])
            reader.close()
        finally:
            writer.close()
    except ArchiveError:
        discard(fd, str(target), made)
        raise
    finally:
        os.close(fd)


TREE = crafted(
    member("./", tarfile.DIRTYPE),
    member("./d", tarfile.DIRTYPE),
    member("./d/a", data=b"alpha"),
    member("./" + "n" * 150 + "/x", data=b"long"),
    member("./e", data=b""),
)
EXPECTED = {"d": None, "d/a": b"alpha", "n" * 150 + "/x": b"long", "e": b""}


@pytest.mark.parametrize("piece", [1, 7, 511, 512, 513, 4096, None])
def test_a_tree_reads_the_same_in_any_pieces(piece: int | None) -> None:
    assert read(TREE, piece) == EXPECTED


def test_pax_names_and_ustar_prefixes_are_read() -> None:
    long = "p" * 120 + "/" + "q" * 120
    assert read(crafted(member(long, data=b"pax"), fmt=tarfile.PAX_FORMAT)) == {long: b"pax"}
    split = "u" * 90 + "/" + "v" * 90
    assert read(crafted(member(split, data=b"u"), fmt=tarfile.USTAR_FORMAT)) == {split: b"u"}


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ([member("../x", data=b"1")], "'..' components"),
        ([member("d/../../x", data=b"1")], "'..' components"),
        ([member("/etc/x", data=b"1")], "file names are relative"),
        ([member("s", tarfile.SYMTYPE, linkname="/etc/passwd")], "symbolic link members"),
        ([member("s", tarfile.SYMTYPE, linkname="inside")], "symbolic link members"),
        ([member("a", data=b"1"), member("h", tarfile.LNKTYPE, linkname="a")], "hard link"),
        ([member("c", tarfile.CHRTYPE, devmajor=1, devminor=3)], "character device"),
        ([member("b", tarfile.BLKTYPE, devmajor=8, devminor=0)], "block device"),
        ([member("f", tarfile.FIFOTYPE)], "FIFO members"),
        ([member("a", data=b"1"), member("./a", data=b"2")], "names this twice"),
        ([member("a\nb", data=b"1")], "control characters"),
    ],
)
def test_hostile_members_are_refused_and_nothing_is_left(
    members: list[tuple], said: str, tmp_path: Path
) -> None:
    data = crafted(*members)
    with pytest.raises(ArchiveError, match=said):
        read(data)
    with pytest.raises(ArchiveError, match=said):
        to_host(data, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # nothing outside, and what was inside discarded


def test_a_symlink_member_never_makes_a_later_file_land_outside(tmp_path: Path) -> None:
    """The classic two-step escape: a link ``d -> ..``, then a file ``d/x``."""
    data = crafted(member("d", tarfile.SYMTYPE, linkname=".."), member("d/x", data=b"out"))
    with pytest.raises(ArchiveError, match="symbolic link"):
        to_host(data, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_the_writer_follows_no_link_on_the_host(tmp_path: Path) -> None:
    """Were a link to appear in the target meanwhile (the host's own doing), the writer would
    refuse to go through it rather than follow it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "out"
    fd, _ = open_target(str(target))
    try:
        (target / "d").symlink_to(outside)
        (target / "f").symlink_to(outside / "f")
        writer = HostWriter(fd, str(target))
        with pytest.raises(ArchiveError, match="cannot write it on the host"):
            writer.file_start("d/x", 1, 0o644)
        with pytest.raises(ArchiveError, match="cannot write it on the host"):
            writer.file_start("f", 1, 0o644)
        with pytest.raises(ArchiveError, match="already exists"):
            writer.directory("d", 0o755)
        writer.close()
    finally:
        os.close(fd)
    assert list(outside.iterdir()) == []


def test_a_name_both_file_and_directory_is_refused(tmp_path: Path) -> None:
    data = crafted(member("a", data=b"1"), member("a/b", data=b"2"))
    with pytest.raises(ArchiveError, match="cannot write it on the host"):
        to_host(data, tmp_path / "out")
    data = crafted(member("a", data=b"1"), member("a", tarfile.DIRTYPE))
    with pytest.raises(ArchiveError, match="names this twice"):
        to_host(data, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_bounds_are_exact_and_refused_before_the_data() -> None:
    three = crafted(member("d", tarfile.DIRTYPE), member("d/a", data=b"12345"), member("b"))
    assert len(read(three, max_entries=3, max_bytes=5)) == 3
    with pytest.raises(ArchiveError, match=r"more than 2 entries \(max_entries\)"):
        read(three, max_entries=2)
    with pytest.raises(ArchiveError, match=r"more than 4 bytes of file content \(max_bytes\)"):
        read(three, max_bytes=4)
    sink = Collect()
    reader = TarReader(sink, max_bytes=4, max_entries=10)
    with pytest.raises(ArchiveError, match="max_bytes"):
        reader.feed(three)
    assert "d/a" not in sink.found  # refused at its header: the sink never began it


def test_truncated_malformed_and_endless_streams_are_refused() -> None:
    with pytest.raises(ArchiveError, match="ended before the end"):
        read(TREE[:1500])
    with pytest.raises(ArchiveError, match="ended before the end"):
        read(b"")
    broken = bytearray(TREE)
    broken[148:156] = b"0000000\0"  # the first header's checksum
    with pytest.raises(ArchiveError, match="malformed tar header"):
        read(bytes(broken))
    # Long-name headers one after another never reach a member to count: refused at once.
    longname = crafted(member("x" * 200, data=b"1"))[:1024]
    with pytest.raises(ArchiveError, match="two long-name or pax headers"):
        read(longname + longname)
    # The raw stream is bounded even where each member is small.
    reader = TarReader(Collect(), max_bytes=0, max_entries=0)
    with pytest.raises(ArchiveError, match="the tar stream passed"):
        reader.feed(b"\0" * 512 + b"\0" * 100_000)  # zeros after the end count too


def test_the_top_is_allowed_once_and_only_first() -> None:
    assert read(crafted(member(".", tarfile.DIRTYPE))) == {}
    with pytest.raises(ArchiveError, match="names the file root"):
        read(crafted(member("a", data=b"1"), member("./", tarfile.DIRTYPE)))


def test_headers_round_trip_through_the_reader() -> None:
    entries = [("d", True, b""), ("d/" + "l" * 200, False, b"x" * 1000), ("e", False, b"")]
    stream = b""
    for name, directory, data in entries:
        stream += tar_header(
            name, directory=directory, size=len(data), mode=0o644, uid=1, gid=2, mtime=0
        )
        stream += data + b"\0" * (-len(data) % 512)
    stream += b"\0" * 1024
    assert read(stream) == {name: (None if d else data) for name, d, data in entries}
    with pytest.raises(ArchiveError, match=r"'\.\.' components"):
        tar_header("../x", directory=False, mode=0o644, uid=0, gid=0, mtime=0)


def test_a_host_tree_streams_back_to_itself(tmp_path: Path) -> None:
    top = tmp_path / "top"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_bytes(os.urandom(300_000))
    (top / "x").write_bytes(b"")
    (top / "run").write_bytes(b"#!")
    (top / "run").chmod(0o755)
    entries = walk_tree(str(top), max_bytes=BIG, max_entries=10)
    assert entries[:3] == [
        LocalEntry("a", True),
        LocalEntry("run", False, 2, True),
        LocalEntry("x", False, 0, False),
    ]
    stream = b"".join(_tar_chunks(str(top), entries, 1000, 1000, 0))
    found = read(stream)
    assert found == {
        "a": None,
        "a/b": None,
        "a/b/f": (top / "a" / "b" / "f").read_bytes(),
        "run": b"#!",
        "x": b"",
    }
    to_host(stream, tmp_path / "copy")
    assert (tmp_path / "copy" / "run").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "copy" / "x").stat().st_mode & 0o777 == 0o600


def test_a_host_file_that_changes_while_streamed_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"12345")
    entries = walk_tree(str(tmp_path), max_bytes=BIG, max_entries=10)
    (tmp_path / "f").write_bytes(b"123")
    with pytest.raises(ArchiveError, match="changed while"):
        b"".join(_tar_chunks(str(tmp_path), entries, 0, 0, 0))


def test_walking_refuses_links_special_files_and_bounds(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"123")
    assert len(walk_tree(str(tmp_path), max_bytes=3, max_entries=2)) == 2
    with pytest.raises(ArchiveError, match=r"more than 1 entries \(max_entries\)"):
        walk_tree(str(tmp_path), max_bytes=3, max_entries=1)
    with pytest.raises(ArchiveError, match=r"more than 2 bytes of file content \(max_bytes\)"):
        walk_tree(str(tmp_path), max_bytes=2, max_entries=2)
    (tmp_path / "d" / "l").symlink_to(tmp_path / "d" / "f")
    with pytest.raises(ArchiveError, match=r"d/l.*a symbolic link"):
        walk_tree(str(tmp_path), max_bytes=BIG, max_entries=10)
    (tmp_path / "d" / "l").unlink()
    os.mkfifo(tmp_path / "d" / "p")
    with pytest.raises(ArchiveError, match=r"d/p.*a FIFO"):
        walk_tree(str(tmp_path), max_bytes=BIG, max_entries=10)
    with pytest.raises(ArchiveError, match="not a directory"):
        walk_tree(str(tmp_path / "d" / "f"), max_bytes=BIG, max_entries=10)


def test_the_target_must_be_new_or_empty_and_no_link(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_bytes(b"k")
    with pytest.raises(ArchiveError, match="not empty"):
        open_target(str(tmp_path / "full"))
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ArchiveError, match="symbolic link"):
        open_target(str(tmp_path / "link"))
    with pytest.raises(ArchiveError, match="cannot create"):
        open_target(str(tmp_path / "no" / "parent"))
    fd, made = open_target(str(tmp_path / "new"))
    os.close(fd)
    assert made
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10", None])
def test_bounds_must_be_whole_numbers(bad: object) -> None:
    with pytest.raises(SpecError, match=r"max_bytes: must be a whole number >= 0"):
        check_bounds(bad, 1)
    with pytest.raises(SpecError, match=r"max_entries: must be a whole number >= 0"):
        check_bounds(1, bad)
