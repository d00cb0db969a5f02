"""Whole directories in and out of a session (``put_dir``/``get_dir``) against the real engine.

The round trip compares every relative path and every byte; each refusal is checked on the
host (nothing written, nothing left) and, for ``put_dir``, inside the sandbox (nothing written
through a link). Hostile member names a real ``tar -c`` never writes (``../x``, ``/abs``) are
fed to the same reader and writer in tests/unit/test_tar_stream.py.
"""

from __future__ import annotations

import os
import random
import stat
import time
from pathlib import Path

import pytest

from sbxkit._consumers.session import open_sandbox
from sbxkit._model.spec import MiB, SandboxSpec
from sbxkit.blocking import open_sandbox as open_blocking
from sbxkit.engine.client import Engine
from sbxkit.errors import ArchiveError, SandboxFileNotFound, SpecError
from tests.engine.helpers import runtime_limits, text
from tests.witness import Witness


def session_spec(image: str, runtime: str | None = None, **overrides: object) -> SandboxSpec:
    limits = runtime_limits(runtime, **overrides)
    return SandboxSpec(image=image, command=["unused"], limits=limits, runtime=runtime)


def names(top: Path) -> list[str]:
    """What ``top`` holds (a sync helper: async tests must not block on pathlib)."""
    return sorted(path.name for path in top.iterdir())


def tree_of(top: Path) -> dict[str, bytes | None]:
    """Every directory (None) and file (its bytes) under ``top``, by relative path; a link or
    special file fails the test."""
    found: dict[str, bytes | None] = {}
    for path in sorted(top.rglob("*")):
        mode = path.lstat().st_mode
        name = path.relative_to(top).as_posix()
        if stat.S_ISDIR(mode):
            found[name] = None
        else:
            assert stat.S_ISREG(mode), name
            found[name] = path.read_bytes()
    return found


def make_tree(top: Path, files: int, seed: int) -> None:
    """``files`` small files in nested directories, a long name, an executable, an empty
    directory and one 8 MiB file."""
    rng = random.Random(seed)
    for index in range(files - 3):
        where = top / f"d{index % 10}" / f"e{index // 10 % 10}" / f"f{index // 100 % 10}"
        where.mkdir(parents=True, exist_ok=True)
        (where / f"file-{index}.txt").write_bytes(rng.randbytes(rng.randrange(0, 600)))
    deep = top / ("long-" * 15) / ("name-" * 15)
    deep.mkdir(parents=True)
    (deep / ("a-file-with-a-long-name-" * 5)).write_bytes(b"long\n")
    script = top / "run.sh"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    (top / "empty").mkdir()
    (top / "big.bin").write_bytes(rng.randbytes(8 * MiB))


async def test_a_10000_file_tree_round_trips_byte_exact(
    runtime: str | None, busybox: str, engine: Engine, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    make_tree(source, 10_000, seed=40)
    sent = tree_of(source)
    assert sum(1 for data in sent.values() if data is not None) == 10_000
    # The scratch is memory (gVisor keeps 11,000 inodes in its own kernel): room for both.
    # The session's life is a limit, not what is measured: gVisor's two tree copies took
    # 15-22 s on a 2-core machine that also ran the other cells (20 s was the default).
    spec = session_spec(
        busybox,
        runtime,
        scratch_bytes=128 * MiB,
        fsize_bytes=16 * MiB,
        memory_bytes=256 * MiB,
        timeout_s=120.0,
    )
    async with open_sandbox(spec, engine=engine) as sandbox:
        started = time.monotonic()
        await sandbox.put_dir(source, "work/tree")
        put_s = time.monotonic() - started
        listing = await sandbox.exec(
            ["sh", "-c", "find /tmp/work/tree | wc -l; ls -ln /tmp/work/tree/run.sh"]
        )
        count, line = text(listing.stdout).splitlines()
        assert int(count) == len(sent) + 1  # the top itself
        own = sandbox.user.partition(":")[0]
        assert line.split()[0] == "-rwxr-xr-x", line
        assert line.split()[2:4] == [own, own], line
        started = time.monotonic()
        await sandbox.get_dir("/tmp/work/tree", tmp_path / "out")
        get_s = time.monotonic() - started
    got = tree_of(tmp_path / "out")
    assert sorted(got) == sorted(sent)
    different = [name for name in sent if got[name] != sent[name]]
    assert not different, different[:5]
    assert (tmp_path / "out" / "run.sh").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "out" / "big.bin").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "out" / "d0").stat().st_mode & 0o777 == 0o700
    total = sum(len(data) for data in sent.values() if data is not None)
    print(f"\n{len(sent)} entries, {total / MiB:.1f} MiB:", end=" ")
    print(f"put_dir {put_s:.2f} s, get_dir {get_s:.2f} s")


async def test_get_dir_refuses_links_and_special_files_and_leaves_nothing(
    runtime: str | None, busybox: str, engine: Engine, tmp_path: Path
) -> None:
    plant = (
        "cd /tmp && mkdir sym hard fifo && echo x >sym/a && ln -s /etc/passwd sym/z "
        "&& echo x >hard/a && ln hard/a hard/b && echo x >fifo/a && mkfifo fifo/z"
    )
    out = tmp_path / "out"
    async with open_sandbox(session_spec(busybox, runtime), engine=engine) as sandbox:
        made = await sandbox.exec(["sh", "-c", plant])
        assert made.ok, made
        for src, kind in (("sym", "symbolic link"), ("hard", "hard link"), ("fifo", "FIFO")):
            with pytest.raises(ArchiveError, match=kind):
                await sandbox.get_dir(src, out)
            assert names(tmp_path) == []  # what it wrote (a) and made (out) is gone
            out.mkdir()
            with pytest.raises(ArchiveError, match=kind):
                await sandbox.get_dir(src, out)
            assert names(out) == []  # an empty directory given stays, emptied
            out.rmdir()
        with pytest.raises(ArchiveError, match=r"'\.\.' components"):
            await sandbox.get_dir("sym/..", out)
    dev_spec = session_spec(busybox, runtime)
    async with open_sandbox(dev_spec, engine=engine, files_root="/dev") as dev:
        with pytest.raises(ArchiveError, match="character device"):
            await dev.get_dir("pts", out)  # /dev/pts/ptmx
    assert names(tmp_path) == []


async def test_get_dir_is_confined_by_the_resolved_path(
    busybox: str, engine: Engine, tmp_path: Path
) -> None:
    """A source that leads out of the file root is refused; one that stays inside is
    followed; a missing one and a file are said as such; the host side must be new or empty."""
    plant = "ln -s /etc /tmp/job && mkdir /tmp/real && echo in >/tmp/real/f"
    plant += " && ln -s real /tmp/alias"
    async with open_sandbox(session_spec(busybox), engine=engine) as sandbox:
        made = await sandbox.exec(["sh", "-c", plant + " && echo f >/tmp/plain"])
        assert made.ok, made
        with pytest.raises(ArchiveError, match="outside the file root"):
            await sandbox.get_dir("job", tmp_path / "a")
        with pytest.raises(ArchiveError, match="outside the file root"):
            await sandbox.get_dir("job/ssl", tmp_path / "a")
        with pytest.raises(SandboxFileNotFound, match="absent"):
            await sandbox.get_dir("absent", tmp_path / "a")
        with pytest.raises(SandboxFileNotFound):
            await sandbox.get_dir("absent/deeper", tmp_path / "a")
        with pytest.raises(ArchiveError, match="not a directory"):
            await sandbox.get_dir("plain", tmp_path / "a")
        with pytest.raises(ArchiveError, match="outside the file root"):
            await sandbox.get_dir("/etc", tmp_path / "a")
        assert names(tmp_path) == []
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "keep").write_bytes(b"mine")
        with pytest.raises(ArchiveError, match="not empty"):
            await sandbox.get_dir("real", tmp_path / "full")
        assert (tmp_path / "full" / "keep").read_bytes() == b"mine"
        (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere").mkdir()
        with pytest.raises(ArchiveError, match="symbolic link"):
            await sandbox.get_dir("real", tmp_path / "link")
        assert list((tmp_path / "elsewhere").iterdir()) == []
        await sandbox.get_dir("alias", tmp_path / "ok")
    assert tree_of(tmp_path / "ok") == {"f": b"in\n"}


async def test_get_dir_bounds_are_exact(busybox: str, engine: Engine, tmp_path: Path) -> None:
    async with open_sandbox(session_spec(busybox), engine=engine) as sandbox:
        made = await sandbox.exec(
            ["sh", "-c", "mkdir -p /tmp/t/d && printf 12345 >/tmp/t/a && printf 678 >/tmp/t/d/b"]
        )
        assert made.ok, made
        await sandbox.get_dir("t", tmp_path / "exact", max_entries=3, max_bytes=8)
        assert tree_of(tmp_path / "exact") == {"a": b"12345", "d": None, "d/b": b"678"}
        with pytest.raises(ArchiveError, match=r"more than 2 entries \(max_entries\)"):
            await sandbox.get_dir("t", tmp_path / "n", max_entries=2)
        with pytest.raises(ArchiveError, match=r"more than 7 bytes .*\(max_bytes\)"):
            await sandbox.get_dir("t", tmp_path / "n", max_bytes=7)
        with pytest.raises(SpecError, match="max_entries: must be a whole number"):
            await sandbox.get_dir("t", tmp_path / "n", max_entries=-1)
    assert names(tmp_path) == ["exact"]


async def test_put_dir_refuses_links_special_files_and_bounds_before_sending(
    busybox: str, engine: Engine, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "a").write_bytes(b"12345")
    (tree / "d" / "b").write_bytes(b"678")
    async with open_sandbox(session_spec(busybox), engine=engine) as sandbox:
        with pytest.raises(ArchiveError, match=r"more than 2 entries \(max_entries\)"):
            await sandbox.put_dir(tree, "t", max_entries=2)
        with pytest.raises(ArchiveError, match=r"more than 7 bytes .*\(max_bytes\)"):
            await sandbox.put_dir(tree, "t", max_bytes=7)
        (tree / "d" / "link").symlink_to("/etc/passwd")
        with pytest.raises(ArchiveError, match="a symbolic link: only directories"):
            await sandbox.put_dir(tree, "t")
        (tree / "d" / "link").unlink()
        os.mkfifo(tree / "fifo")
        with pytest.raises(ArchiveError, match="a FIFO: only directories"):
            await sandbox.put_dir(tree, "t")
        (tree / "fifo").unlink()
        with pytest.raises(ArchiveError, match=r"'\.\.' components"):
            await sandbox.put_dir(tree, "../etc")
        with pytest.raises(ArchiveError, match="outside the file root"):
            await sandbox.put_dir(tree, "/etc")
        with pytest.raises(ArchiveError, match="no such directory on the host"):
            await sandbox.put_dir(tmp_path / "absent", "t")
        nothing = await sandbox.exec(["sh", "-c", "ls -A /tmp | grep -v '^.sbxkit-exec'"])
        assert nothing.stdout == b"", nothing  # every refusal above came before sending
        await sandbox.put_dir(tree, "t", max_entries=3, max_bytes=8)
        await sandbox.get_dir("t", tmp_path / "back")
    assert tree_of(tmp_path / "back") == {"a": b"12345", "d": None, "d/b": b"678"}


async def test_the_specs_transfer_limits_bound_both_ways(
    busybox: str, engine: Engine, tmp_path: Path
) -> None:
    """``limits.transfer_entries`` and ``transfer_bytes`` are every call's default and
    ceiling: a call may ask for less, never more."""
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "a").write_bytes(b"12345")
    (tree / "d" / "b").write_bytes(b"678")
    spec = session_spec(busybox, transfer_entries=2, transfer_bytes=8)
    async with open_sandbox(spec, engine=engine) as sandbox:
        with pytest.raises(ArchiveError, match=r"more than 2 entries \(max_entries\)"):
            await sandbox.put_dir(tree, "t")
        with pytest.raises(SpecError, match=r"max_entries: 3 is more than the spec's limits"):
            await sandbox.put_dir(tree, "t", max_entries=3)
        with pytest.raises(SpecError, match=r"max_bytes: 9 is more than the spec's limits"):
            await sandbox.get_dir("t", tmp_path / "n", max_bytes=9)
        (tree / "d" / "b").unlink()
        await sandbox.put_dir(tree, "t")  # a, d: two entries, five bytes
        with pytest.raises(ArchiveError, match=r"more than 4 bytes .*\(max_bytes\)"):
            await sandbox.get_dir("t", tmp_path / "n", max_bytes=4)
        await sandbox.get_dir("t", tmp_path / "back")
    assert tree_of(tmp_path / "back") == {"a": b"12345", "d": None}


async def test_put_dir_writes_through_no_link_in_the_sandbox(
    busybox: str, engine: Engine, tmp_path: Path
) -> None:
    """Links the payload planted — on the way to the destination, or anywhere under it — are
    refused before tar reads the stream; nothing lands in /dev/shm."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x.txt").write_bytes(b"escaped")
    plant = "ln -s /dev/shm /tmp/shm && mkdir -p /tmp/d && ln -s /dev/shm /tmp/d/sub"
    async with open_sandbox(session_spec(busybox), engine=engine) as sandbox:
        made = await sandbox.exec(["sh", "-c", plant])
        assert made.ok, made
        for dest in ("shm", "shm/deeper", "d"):
            with pytest.raises(ArchiveError, match="is a link"):
                await sandbox.put_dir(tree, dest)
        check = await sandbox.exec(["sh", "-c", "ls -A /dev/shm"])
        assert check.stdout == b"", check


def test_the_blocking_wrapper_copies_directories(
    busybox: str, witness: Witness, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "b").write_bytes(b"blocking")
    with open_blocking(session_spec(busybox), socket_path=witness.socket_path) as sandbox:
        sandbox.put_dir(tree, "job")
        assert sandbox.exec(["cat", "/tmp/job/d/b"]).stdout == b"blocking"
        sandbox.get_dir("job", tmp_path / "out")
    assert tree_of(tmp_path / "out") == {"d": None, "d/b": b"blocking"}
