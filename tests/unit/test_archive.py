"""The pure archive module: confinement of names, member kinds, caps, round trips."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._consumers.archive import (
    build_tar,
    confine,
    confine_dir,
    expect_exactly,
    parse_tar,
    relative_name,
    stream_cap,
)
from sbxkit.errors import ArchiveError


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("a.txt", "a.txt"),
        ("./a.txt", "a.txt"),
        ("dir//sub/./b", "dir/sub/b"),
        ("/tmp/a.txt", "a.txt"),
        ("/tmp/dir/b", "dir/b"),
        ("-rf", "-rf"),
    ],
)
def test_confine_accepts_paths_under_the_root(path: str, expected: str) -> None:
    assert confine(path, "/tmp") == expected


@pytest.mark.parametrize(
    "path",
    [
        "../x",
        "a/../../x",
        "a/../b",  # refused even though it would resolve inside the root
        "..",
        "/etc/x",
        "/tmpfoo/x",  # a sibling sharing the root's prefix is outside
        "/tmp",
        "/tmp/",
        ".",
        "",
        "a\0b",
        "a\nb",
    ],
)
def test_confine_refuses_escapes_and_non_files(path: str) -> None:
    with pytest.raises(ArchiveError):
        confine(path, "/tmp")


def test_confine_dir_allows_the_root_itself() -> None:
    assert confine_dir(".", "/tmp") == "/tmp"
    assert confine_dir("/tmp", "/tmp") == "/tmp"
    assert confine_dir("out/x", "/tmp") == "/tmp/out/x"
    for bad in ("../etc", "/etc", "/tmp/../etc"):
        with pytest.raises(ArchiveError):
            confine_dir(bad, "/tmp")


@pytest.mark.parametrize("root", ["tmp", "/tmp/", "/a//b", "/a/../b", "/a/./b"])
def test_a_root_must_be_absolute_and_normalised(root: str) -> None:
    with pytest.raises(ArchiveError):
        confine("x", root)


def test_relative_names_refuse_absolute_paths() -> None:
    assert relative_name("a/b") == "a/b"
    for bad in ("/etc/x", "/tmp/x", "../x", "x/../../y"):
        with pytest.raises(ArchiveError):
            relative_name(bad)


# --- building --------------------------------------------------------------------------------


def test_build_then_parse_round_trips_with_files_only() -> None:
    files = {"a.txt": b"hello", "d/e/f.bin": bytes(range(256)) * 10}
    data = build_tar(files, uid=65534, gid=65534)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        kinds = {m.name: m.type for m in tar.getmembers()}
        owners = {(m.uid, m.gid) for m in tar.getmembers()}
    # No directory member: tar would reset an existing directory's mode (the sandbox makes
    # missing parents with mkdir -p instead).
    assert kinds == {"a.txt": tarfile.REGTYPE, "d/e/f.bin": tarfile.REGTYPE}
    assert owners == {(65534, 65534)}
    # Directories are not files: parsing (which refuses them) sees the files only once they
    # are stripped, which is what the sandbox's tar -c of named files produces.
    regular = tar_of(*((member(n), c) for n, c in files.items()))
    assert parse_tar(regular) == files


@pytest.mark.parametrize("name", ["../x", "/etc/x", "a/../../x", "", "a\0"])
def test_build_refuses_escaping_names(name: str) -> None:
    with pytest.raises(ArchiveError):
        build_tar({name: b"x"})


def test_build_refuses_a_name_that_is_both_file_and_directory() -> None:
    with pytest.raises(ArchiveError, match="both as a file and as a directory"):
        build_tar({"a": b"1", "a/b": b"2"})


def test_build_caps_are_exact() -> None:
    build_tar({"a": b"x" * 10}, max_bytes=10)
    with pytest.raises(ArchiveError, match="more than 10 bytes"):
        build_tar({"a": b"x" * 11}, max_bytes=10)
    build_tar({str(i): b"" for i in range(3)}, max_files=3)
    with pytest.raises(ArchiveError, match="more than 3 files"):
        build_tar({str(i): b"" for i in range(4)}, max_files=3)


def test_stream_cap_bounds_a_full_archive() -> None:
    files = {("n" * 150) + str(i): b"x" * 1000 for i in range(5)}
    data = tar_of(*((member(n), c) for n, c in files.items()))
    assert len(data) <= stream_cap(5000, 5)


# --- parsing untrusted archives ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "data", "reason"),
    [
        (member("link", tarfile.SYMTYPE, linkname="/etc/passwd"), None, "symbolic link"),
        (member("link", tarfile.SYMTYPE, linkname="inside.txt"), None, "symbolic link"),
        (member("hard", tarfile.LNKTYPE, linkname="/etc/shadow"), None, "hard link"),
        (member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3), None, "character device"),
        (member("blk", tarfile.BLKTYPE, devmajor=8, devminor=0), None, "block device"),
        (member("fifo", tarfile.FIFOTYPE), None, "FIFO"),
        (member("dir", tarfile.DIRTYPE), None, "directory"),
        (member("../x"), b"escape", "'..'"),
        (member("/etc/x"), b"absolute", "relative"),
        (member("a/../b"), b"x", "'..'"),
    ],
)
def test_parse_refuses_links_devices_fifos_and_escapes(
    info: tarfile.TarInfo, data: bytes | None, reason: str
) -> None:
    with pytest.raises(ArchiveError, match=reason):
        parse_tar(tar_of((member("ok.txt"), b"fine"), (info, data)))


def test_parse_caps_are_exact() -> None:
    data = tar_of((member("a"), b"x" * 6), (member("b"), b"y" * 4))
    assert parse_tar(data, max_bytes=10) == {"a": b"x" * 6, "b": b"y" * 4}
    with pytest.raises(ArchiveError, match="more than 9 bytes"):
        parse_tar(data, max_bytes=9)
    assert len(parse_tar(data, max_files=2)) == 2
    with pytest.raises(ArchiveError, match="more than 1 files"):
        parse_tar(data, max_files=1)


def test_parse_refuses_duplicates_and_garbage() -> None:
    with pytest.raises(ArchiveError, match="twice"):
        parse_tar(tar_of((member("a"), b"1"), (member("./a"), b"2")))
    with pytest.raises(ArchiveError, match="malformed"):
        parse_tar(b"\x01" * 1024)
    truncated = tar_of((member("a"), b"x" * 5000))[:1024]
    with pytest.raises(ArchiveError):
        parse_tar(truncated)


def test_expect_exactly_names_extra_and_missing_files() -> None:
    expect_exactly({"a": b""}, ["a"])
    with pytest.raises(ArchiveError, match="not requested"):
        expect_exactly({"a": b"", "b": b""}, ["a"])
    with pytest.raises(ArchiveError, match="missing"):
        expect_exactly({}, ["a"])


_SEGMENT = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/"),
    min_size=1,
    max_size=8,
)


@given(st.lists(st.one_of(_SEGMENT, st.sampled_from([".", "..", ""])), max_size=6), st.booleans())
def test_confine_never_returns_a_path_that_leaves_the_root(
    parts: list[str], absolute: bool
) -> None:
    path = ("/tmp/" if absolute else "") + "/".join(parts)
    try:
        clean = confine(path, "/tmp")
    except ArchiveError:
        return
    pieces = clean.split("/")
    assert not {"..", ".", ""} & set(pieces)
    assert not clean.startswith("/")
