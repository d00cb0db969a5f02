"""The file grant broker's file primitives and rules, on the real filesystem (no daemon).

Snapshots refuse every path that is not a plain file reached without links; publication never
replaces a name, leaves no temp file behind, and fsyncs the file before publishing it and the
directory after; the ceilings are the spec's bind mounts, read-only ones for inputs only.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sbxkit._consumers import broker, grant_files
from sbxkit._consumers.broker import (
    GrantError,
    Grants,
    InputGrant,
    OutputGrant,
    check_grants,
    derive_spec,
    open_directory,
    publish_outputs,
    run_with_grants,
    snapshot_input,
)
from sbxkit._model.mounts import BindMount, TmpfsMount
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.errors import EngineUnavailable, SpecError

SETTINGS = Settings(enable_bind_mounts=True, supervisor_state_dir="/nonexistent/sbxkit-state")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def dir_fd(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A destination directory and a descriptor for it."""
    path = tmp_path / "dest"
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    yield path, fd
    os.close(fd)


def make_spec(*mounts: Any, fsize: int = 64 * MiB) -> SandboxSpec:
    return SandboxSpec(
        image="sbxkit-test/busybox:latest",
        command=["true"],
        limits=Limits(
            cpus=1.0,
            memory_bytes=64 * MiB,
            pids=16,
            output_bytes=MiB,
            timeout_s=10.0,
            fsize_bytes=fsize,
        ),
        mounts=list(mounts),
    )


# --- snapshots ---------------------------------------------------------------------------------


def snap(grant: InputGrant, dest: tuple[Path, int], name: str = "0") -> broker.Receipt:
    return snapshot_input(grant, dest[1], name, label="grants.inputs[0]")


def test_snapshot_copies_hashes_and_is_read_only(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    data = os.urandom(3 * grant_files.CHUNK + 17)  # several chunks and a tail
    source = tmp_path / "input.bin"
    source.write_bytes(data)

    receipt = snap(InputGrant(host_path=str(source), target="/in/x", max_bytes=len(data)), dir_fd)

    copy = dir_fd[0] / "0"
    assert copy.read_bytes() == data
    assert receipt == broker.Receipt(path=str(source), bytes=len(data), sha256=sha256(data))
    info = copy.lstat()
    assert stat.S_IMODE(info.st_mode) == 0o444
    assert info.st_nlink == 1
    assert not os.path.samefile(copy, source)
    source.write_bytes(b"changed afterwards")
    assert copy.read_bytes() == data  # a private snapshot, not a view


def test_snapshot_of_an_empty_file(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    source = tmp_path / "empty"
    source.touch()

    receipt = snap(InputGrant(host_path=str(source), target="/in/x"), dir_fd)

    assert (receipt.bytes, receipt.sha256) == (0, sha256(b""))


def test_snapshot_refuses_a_symlinked_file(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"secret")
    link = tmp_path / "link"
    link.symlink_to(real)

    with pytest.raises(GrantError, match="symbolic link") as caught:
        snap(InputGrant(host_path=str(link), target="/in/x"), dir_fd)

    assert caught.value.grant == "grants.inputs[0]"
    assert os.listdir(dir_fd[0]) == []


def test_snapshot_refuses_a_symlinked_parent_component(
    tmp_path: Path, dir_fd: tuple[Path, int]
) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "file").write_bytes(b"secret")
    (tmp_path / "alias").symlink_to(real_dir)

    with pytest.raises(GrantError, match=r"alias is a symbolic link"):
        snap(InputGrant(host_path=str(tmp_path / "alias" / "file"), target="/in/x"), dir_fd)
    assert os.listdir(dir_fd[0]) == []


def test_snapshot_refuses_a_hard_linked_file(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    source = tmp_path / "file"
    source.write_bytes(b"data")
    os.link(source, tmp_path / "second-name")

    with pytest.raises(GrantError, match="2 hard links"):
        snap(InputGrant(host_path=str(source), target="/in/x"), dir_fd)


def test_snapshot_refuses_a_fifo_without_blocking(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    with pytest.raises(GrantError, match="FIFO, not a regular file"):
        snap(InputGrant(host_path=str(fifo), target="/in/x"), dir_fd)


def test_snapshot_refuses_a_directory(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    with pytest.raises(GrantError, match="directory, not a regular file"):
        snap(InputGrant(host_path=str(tmp_path), target="/in/x"), dir_fd)


def test_snapshot_refuses_a_missing_file(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    with pytest.raises(GrantError, match="does not exist"):
        snap(InputGrant(host_path=str(tmp_path / "nope"), target="/in/x"), dir_fd)


def test_snapshot_size_boundary(tmp_path: Path, dir_fd: tuple[Path, int]) -> None:
    source = tmp_path / "file"
    source.write_bytes(b"x" * 100)

    assert snap(InputGrant(host_path=str(source), target="/in/x", max_bytes=100), dir_fd).bytes
    with pytest.raises(GrantError, match="100 bytes, over max_bytes 99"):
        snap(InputGrant(host_path=str(source), target="/in/x", max_bytes=99), dir_fd, "1")


def test_open_directory_walks_without_links(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "jump").symlink_to(tmp_path / "a")

    fd = open_directory(str(tmp_path / "a" / "b"))
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "a" / "b"))
    finally:
        os.close(fd)
    with pytest.raises(GrantError, match="jump is a symbolic link"):
        open_directory(str(tmp_path / "jump" / "b"))
    (tmp_path / "file").touch()
    with pytest.raises(GrantError, match="regular file, not a directory"):
        open_directory(str(tmp_path / "file"))


# --- ceilings ----------------------------------------------------------------------------------


@pytest.fixture
def ceilings(tmp_path: Path) -> tuple[Path, Path]:
    ro = tmp_path / "ro"
    rw = tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    return ro, rw


def ceiling_spec(ro: Path, rw: Path, *extra: Any) -> SandboxSpec:
    return make_spec(
        BindMount(source=str(ro), target="/data"),
        BindMount(source=str(rw), target="/results", read_only=False),
        *extra,
    )


def inp(path: Path | str, target: str = "/in/x") -> InputGrant:
    return InputGrant(host_path=str(path), target=target)


def out(path: Path | str, name: str = "result", max_bytes: int = 1000) -> OutputGrant:
    return OutputGrant(name=name, host_path=str(path), max_bytes=max_bytes)


def test_grants_inside_the_ceilings_pass(ceilings: tuple[Path, Path]) -> None:
    ro, rw = ceilings
    grants = Grants(
        inputs=[inp(ro / "a"), inp(ro / "sub" / "b", "/in/y"), inp(rw / "c", "/in/z")],
        outputs=[out(rw / "result"), out(rw / "deep" / "r2", "r2")],
    )

    check_grants(ceiling_spec(ro, rw), grants, SETTINGS)


@pytest.mark.parametrize(
    ("grants", "field", "message"),
    [
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(ro.parent / "elsewhere")]),
            "grants.inputs[0].host_path",
            "outside every configured bind mount",
            id="input-outside",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(str(ro) + "2/file")]),
            "grants.inputs[0].host_path",
            "outside every configured bind mount",
            id="input-in-a-sibling-with-the-same-prefix",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(ro / "result")]),
            "grants.outputs[0].host_path",
            "only inside read-only mounts (mounts[0].source)",
            id="output-in-a-read-only-ceiling",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(ro.parent / "result")]),
            "grants.outputs[0].host_path",
            "outside every configured bind mount",
            id="output-outside",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw)]),
            "grants.outputs[0].host_path",
            "outside every configured bind mount",
            id="output-replacing-the-ceiling-itself",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(f"{ro}/../rw/x")]),
            "grants.inputs[0].host_path",
            "traversal",
            id="traversal",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(f"{ro}//x")]),
            "grants.inputs[0].host_path",
            "canonically",
            id="non-canonical",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp("relative/x")]),
            "grants.inputs[0].host_path",
            "absolute",
            id="relative",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp("/etc/passwd")]),
            "grants.inputs[0].host_path",
            "protected host path /etc",
            id="protected",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw / "a", "a/b")]),
            "grants.outputs[0].name",
            "single path component",
            id="name-with-slash",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw / "a", "..")]),
            "grants.outputs[0].name",
            "single path component",
            id="name-dotdot",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw / "a", "")]),
            "grants.outputs[0].name",
            "non-empty",
            id="name-empty",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw / "a", "x"), out(rw / "b", "x")]),
            "grants.outputs[1].name",
            "duplicate",
            id="duplicate-name",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw / "a", "x"), out(rw / "a", "y")]),
            "grants.outputs[1].host_path",
            "already another output",
            id="duplicate-destination",
        ),
        pytest.param(
            lambda ro, rw: Grants(outputs=[out(rw / "a", max_bytes=0)]),
            "grants.outputs[0].max_bytes",
            "> 0",
            id="zero-max-bytes",
        ),
        pytest.param(
            lambda ro, rw: Grants(
                outputs=[OutputGrant(name="a", host_path=str(rw / "a"), max_bytes=1, mode=0o4755)]
            ),
            "grants.outputs[0].mode",
            "0 to 0o777",
            id="setuid-mode",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(ro / "a", "/out/a")], outputs=[out(rw / "r")]),
            "grants.inputs[0].target",
            "collides with grants.output_dir",
            id="input-inside-the-output-dir",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(ro / "a", "/scratch/a")]),
            "grants.inputs[0].target",
            "collides with mounts[2].target",
            id="input-inside-a-tmpfs-mount",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(ro / "a", "/tmp/a")]),
            "grants.inputs[0].target",
            "system directory /tmp",
            id="input-over-a-system-directory",
        ),
        pytest.param(
            lambda ro, rw: Grants(inputs=[inp(ro / "a"), inp(ro / "b")]),
            "grants.inputs[1].target",
            "collides with grants.inputs[0].target",
            id="same-target-twice",
        ),
    ],
)
def test_grants_are_refused_naming_the_grant(
    ceilings: tuple[Path, Path], grants: Any, field: str, message: str
) -> None:
    ro, rw = ceilings
    spec = ceiling_spec(ro, rw, TmpfsMount(target="/scratch", size_bytes=MiB))

    with pytest.raises(SpecError, match=re.escape(message)) as caught:
        check_grants(spec, grants(ro, rw), SETTINGS)

    assert caught.value.field == field


def test_grant_paths_never_reach_docker_so_a_colon_is_fine(ceilings: tuple[Path, Path]) -> None:
    ro, rw = ceilings
    grants = Grants(inputs=[inp(ro / "a:b")], outputs=[out(rw / "c:d", "e:f")])

    check_grants(ceiling_spec(ro, rw), grants, SETTINGS)


def test_a_ceiling_containing_the_supervisor_state_is_refused(tmp_path: Path) -> None:
    spec = make_spec(BindMount(source=str(tmp_path), target="/data"))
    settings = Settings(enable_bind_mounts=True, supervisor_state_dir=str(tmp_path / "state"))

    with pytest.raises(SpecError, match="supervisor state directory") as caught:
        check_grants(spec, Grants(inputs=[inp(tmp_path / "state" / "lease")]), settings)
    assert caught.value.field == "mounts[0].source"


def test_without_bind_mounts_every_grant_is_outside(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="outside every configured bind mount"):
        check_grants(make_spec(), Grants(inputs=[inp(tmp_path / "x")]), SETTINGS)


def test_a_ceiling_configured_through_a_link_covers_its_real_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    spec = make_spec(BindMount(source=str(tmp_path / "alias"), target="/data"))

    check_grants(spec, Grants(inputs=[inp(real / "x")]), SETTINGS)
    # Lexically inside too; the no-link walk refuses it later (tested above).
    check_grants(spec, Grants(inputs=[inp(tmp_path / "alias" / "x")]), SETTINGS)


def test_a_missing_ceiling_is_refused(tmp_path: Path) -> None:
    spec = make_spec(BindMount(source=str(tmp_path / "gone"), target="/data"))

    with pytest.raises(SpecError, match="must exist") as caught:
        check_grants(spec, Grants(), SETTINGS)
    assert caught.value.field == "mounts[0].source"


async def test_refusal_happens_before_the_engine_or_the_disk_is_touched(
    ceilings: tuple[Path, Path], tmp_path: Path
) -> None:
    ro, rw = ceilings
    work = tmp_path / "work"
    work.mkdir()

    with pytest.raises(SpecError, match="outside"):
        await run_with_grants(
            ceiling_spec(ro, rw),
            Grants(inputs=[inp(tmp_path / "elsewhere")]),
            socket_path=str(tmp_path / "no-daemon.sock"),  # EngineUnavailable if reached
            settings=SETTINGS,
            work_dir=str(work),
        )
    assert os.listdir(work) == []


async def test_bind_mounts_disabled_refuses_the_ceilings(
    ceilings: tuple[Path, Path], tmp_path: Path
) -> None:
    ro, rw = ceilings
    with pytest.raises(SpecError, match="bind mounts are disabled"):
        await run_with_grants(
            ceiling_spec(ro, rw),
            Grants(),
            socket_path=str(tmp_path / "no-daemon.sock"),
            settings=Settings(supervisor_state_dir="/nonexistent/sbxkit-state"),
        )


async def test_a_refused_input_snapshot_leaves_no_broker_directory(
    ceilings: tuple[Path, Path], tmp_path: Path
) -> None:
    ro, rw = ceilings
    (ro / "a").write_bytes(b"a")
    os.link(ro / "a", ro / "a2")
    work = tmp_path / "work"
    work.mkdir()

    with pytest.raises(GrantError, match="hard links"):
        await run_with_grants(
            ceiling_spec(ro, rw),
            Grants(inputs=[inp(ro / "a")], outputs=[out(rw / "r")]),
            socket_path=str(tmp_path / "no-daemon.sock"),
            settings=SETTINGS,
            work_dir=str(work),
        )
    assert os.listdir(work) == []


async def test_a_failed_run_removes_the_broker_directory(
    ceilings: tuple[Path, Path], tmp_path: Path
) -> None:
    ro, rw = ceilings
    (ro / "a").write_bytes(b"a")
    work = tmp_path / "work"
    work.mkdir()

    with pytest.raises(EngineUnavailable, match=r"no-daemon\.sock"):
        await run_with_grants(
            ceiling_spec(ro, rw),
            Grants(inputs=[inp(ro / "a")], outputs=[out(rw / "r")]),
            socket_path=str(tmp_path / "no-daemon.sock"),
            settings=SETTINGS,
            work_dir=str(work),
        )
    assert os.listdir(work) == []
    assert os.listdir(rw) == []


# --- the derived spec --------------------------------------------------------------------------


def test_derived_spec_replaces_the_ceilings_and_tightens_fsize(
    ceilings: tuple[Path, Path],
) -> None:
    ro, rw = ceilings
    tmpfs = TmpfsMount(target="/scratch", size_bytes=MiB)
    spec = ceiling_spec(ro, rw, tmpfs)
    grants = Grants(
        inputs=[inp(ro / "a", "/in/a")],
        outputs=[out(rw / "r", "r", max_bytes=1000), out(rw / "s", "s", max_bytes=5000)],
        output_dir="/results",
    )

    derived = derive_spec(spec, grants, ["/broker/in/0"], "/broker/out")

    assert derived.mounts == [
        tmpfs,
        BindMount(source="/broker/in/0", target="/in/a", read_only=True),
        BindMount(source="/broker/out", target="/results", read_only=False),
    ]
    assert derived.limits.fsize_bytes == 5000
    assert msgspec.structs.replace(derived, mounts=spec.mounts, limits=spec.limits) == spec


@pytest.mark.parametrize(
    ("spec_fsize", "outputs", "expected"),
    [
        (64 * MiB, [], 64 * MiB),  # no outputs: untouched
        (1000, [5000], 1000),  # never loosened
        (64 * MiB, [10, 20], 20),
    ],
)
def test_fsize_is_only_ever_tightened(spec_fsize: int, outputs: list[int], expected: int) -> None:
    grants = Grants(
        outputs=[out(f"/x/{i}", f"o{i}", max_bytes=size) for i, size in enumerate(outputs)]
    )

    derived = derive_spec(make_spec(fsize=spec_fsize), grants, [], "/broker/out")

    assert derived.limits.fsize_bytes == expected


# --- publication -------------------------------------------------------------------------------


class Stage:
    """A staging directory (what the payload wrote) and a destination directory."""

    def __init__(self, root: Path) -> None:
        self.staging = root / "staging"
        self.dest = root / "dest"
        self.staging.mkdir()
        self.dest.mkdir()
        self.fd = os.open(self.staging, os.O_RDONLY | os.O_DIRECTORY)

    def publish(self, *outputs: OutputGrant) -> list[broker.Receipt]:
        return publish_outputs(self.fd, outputs)

    def out(self, name: str, max_bytes: int = 1000, dest: str | None = None) -> OutputGrant:
        return OutputGrant(
            name=name, host_path=str(self.dest / (dest or name)), max_bytes=max_bytes
        )

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def stage(tmp_path: Path) -> Iterator[Stage]:
    s = Stage(tmp_path)
    yield s
    s.close()


def test_publish_writes_the_file_with_a_correct_receipt(stage: Stage) -> None:
    data = os.urandom(2 * grant_files.CHUNK + 5)
    (stage.staging / "result").write_bytes(data)

    [receipt] = stage.publish(stage.out("result", max_bytes=len(data)))

    published = stage.dest / "result"
    assert published.read_bytes() == data
    assert receipt.path == str(published)
    assert receipt.bytes == len(data)
    assert receipt.sha256 == hashlib.sha256(published.read_bytes()).hexdigest()
    info = published.lstat()
    assert stat.S_IMODE(info.st_mode) == 0o644
    assert info.st_nlink == 1
    assert os.listdir(stage.dest) == ["result"]  # no temp leftovers


def test_publish_applies_the_grant_mode_whatever_the_umask(stage: Stage) -> None:
    (stage.staging / "r").write_bytes(b"x")
    old = os.umask(0o077)
    try:
        stage.publish(
            OutputGrant(name="r", host_path=str(stage.dest / "r"), max_bytes=1, mode=0o640)
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE((stage.dest / "r").lstat().st_mode) == 0o640


def test_publish_never_replaces_an_existing_file(stage: Stage) -> None:
    (stage.staging / "result").write_bytes(b"payload's")
    existing = stage.dest / "result"
    existing.write_bytes(b"operator's precious data")
    before = existing.stat()

    with pytest.raises(GrantError, match="already exists; sbxkit never replaces") as caught:
        stage.publish(stage.out("result"))

    assert existing.read_bytes() == b"operator's precious data"
    after = existing.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert os.listdir(stage.dest) == ["result"]
    assert caught.value.published == []


def test_publish_never_replaces_a_dangling_symlink(stage: Stage, tmp_path: Path) -> None:
    (stage.staging / "result").write_bytes(b"payload's")
    (stage.dest / "result").symlink_to(tmp_path / "would-be-created")

    with pytest.raises(GrantError, match="already exists"):
        stage.publish(stage.out("result"))

    assert (stage.dest / "result").is_symlink()
    assert not (tmp_path / "would-be-created").exists()


def test_publish_never_replaces_a_file_that_appears_at_the_last_moment(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    (stage.staging / "result").write_bytes(b"payload's")
    real_link = os.link

    def racing_link(src: Any, dst: Any, **kwargs: Any) -> None:
        (stage.dest / "result").write_bytes(b"won the race")
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(os, "link", racing_link)

    with pytest.raises(GrantError, match="already exists; sbxkit never replaces"):
        stage.publish(stage.out("result"))

    assert (stage.dest / "result").read_bytes() == b"won the race"
    assert os.listdir(stage.dest) == ["result"]  # the temp file is gone


def test_publish_refuses_a_staged_symlink(stage: Stage, tmp_path: Path) -> None:
    target = tmp_path / "host-secret"
    target.write_bytes(b"secret")
    (stage.staging / "result").symlink_to(target)

    with pytest.raises(GrantError, match="staged output 'result' is a symbolic link"):
        stage.publish(stage.out("result"))

    assert os.listdir(stage.dest) == []


def test_publish_refuses_a_staged_hard_link(stage: Stage) -> None:
    (stage.staging / "a").write_bytes(b"x")
    os.link(stage.staging / "a", stage.staging / "result")

    with pytest.raises(GrantError, match="2 hard links"):
        stage.publish(stage.out("result"))
    assert os.listdir(stage.dest) == []


def test_publish_refuses_a_staged_fifo_and_a_directory(stage: Stage) -> None:
    os.mkfifo(stage.staging / "fifo")
    (stage.staging / "dir").mkdir()

    with pytest.raises(GrantError, match="FIFO, not a regular file"):
        stage.publish(stage.out("fifo"))
    with pytest.raises(GrantError, match="directory, not a regular file"):
        stage.publish(stage.out("dir"))
    assert os.listdir(stage.dest) == []


def test_publish_size_boundary(stage: Stage) -> None:
    (stage.staging / "big").write_bytes(b"x" * 101)
    (stage.staging / "exact").write_bytes(b"x" * 100)

    with pytest.raises(GrantError, match="101 bytes, over max_bytes 100"):
        stage.publish(stage.out("big", max_bytes=100))
    assert os.listdir(stage.dest) == []
    [receipt] = stage.publish(stage.out("exact", max_bytes=100))
    assert receipt.bytes == 100


def test_publish_refuses_a_missing_output(stage: Stage) -> None:
    with pytest.raises(GrantError, match="does not exist"):
        stage.publish(stage.out("never-written"))


def test_publish_refuses_a_destination_parent_reached_through_a_link(
    stage: Stage, tmp_path: Path
) -> None:
    (stage.staging / "result").write_bytes(b"x")
    (tmp_path / "alias").symlink_to(stage.dest)
    grant = OutputGrant(name="result", host_path=str(tmp_path / "alias" / "result"), max_bytes=9)

    with pytest.raises(GrantError, match="alias is a symbolic link"):
        stage.publish(grant)
    assert os.listdir(stage.dest) == []


def test_a_refusal_found_while_checking_publishes_nothing(stage: Stage, tmp_path: Path) -> None:
    (stage.staging / "good").write_bytes(b"fine")
    (stage.staging / "bad").symlink_to(tmp_path / "elsewhere")

    with pytest.raises(GrantError, match="outputs\\[1\\]"):
        stage.publish(stage.out("good"), stage.out("bad"))

    assert os.listdir(stage.dest) == []


def test_a_late_refusal_reports_what_was_already_published(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    (stage.staging / "a").write_bytes(b"first")
    (stage.staging / "b").write_bytes(b"second")
    real_link = os.link

    def link_then_race(src: Any, dst: Any, **kwargs: Any) -> None:
        if dst == "b":
            (stage.dest / "b").write_bytes(b"someone else's")
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(os, "link", link_then_race)

    with pytest.raises(GrantError) as caught:
        stage.publish(stage.out("a"), stage.out("b"))

    assert [r.path for r in caught.value.published] == [str(stage.dest / "a")]
    assert caught.value.published[0].sha256 == sha256(b"first")
    assert (stage.dest / "b").read_bytes() == b"someone else's"
    assert sorted(os.listdir(stage.dest)) == ["a", "b"]


def test_publish_fsyncs_the_file_before_and_the_directory_after_publishing(
    stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    (stage.staging / "result").write_bytes(b"durable")
    calls: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        calls.append((kind, (stage.dest / "result").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)

    stage.publish(stage.out("result"))

    # The temp file is durable before its name is published; the directory after.
    assert calls == [("file", False), ("dir", True)]


# --- the private directory ---------------------------------------------------------------------


def test_workspace_is_private_and_staging_belongs_to_the_sandbox_user(tmp_path: Path) -> None:
    ws = broker._open_workspace(str(tmp_path), (4242, 4343), True)
    try:
        root = Path(ws.root)
        assert root.parent == tmp_path
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert stat.S_IMODE((root / "in").stat().st_mode) == 0o700
        staging = (root / "out").stat()
        assert stat.S_IMODE(staging.st_mode) == 0o700
        if os.geteuid() == 0:
            assert (staging.st_uid, staging.st_gid) == (4242, 4343)
    finally:
        assert broker._dispose(ws) is None
    assert os.listdir(tmp_path) == []


def test_workspace_for_a_broker_that_cannot_chown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ws = broker._open_workspace(str(tmp_path), (4242, 4343), True)
    try:
        # Writable by the sandbox user, reachable only through the 0700 root.
        assert stat.S_IMODE((Path(ws.root) / "out").stat().st_mode) == 0o777
        assert stat.S_IMODE(Path(ws.root).stat().st_mode) == 0o700
    finally:
        broker._dispose(ws)


def test_a_sandbox_of_its_own_uid_gets_a_staging_dir_private_through_its_root(
    tmp_path: Path,
) -> None:
    """A spec that names no user runs as a uid chosen when the run is planned, after the
    workspace exists: its staging directory is 0777 under the 0700 root."""
    ws = broker._open_workspace(str(tmp_path), None, True)
    try:
        assert stat.S_IMODE((Path(ws.root) / "out").stat().st_mode) == 0o777
        assert stat.S_IMODE(Path(ws.root).stat().st_mode) == 0o700
    finally:
        broker._dispose(ws)


def test_dispose_removes_whatever_the_payload_left(tmp_path: Path) -> None:
    ws = broker._open_workspace(str(tmp_path), (4242, 4343), True)
    staging = Path(ws.staging)
    (staging / "deep" / "er").mkdir(parents=True)
    (staging / "deep" / "er" / "f").write_bytes(b"x")
    (staging / "link").symlink_to(tmp_path)  # must not be followed
    (staging / "deep").chmod(0o000)

    assert broker._dispose(ws) is None
    assert os.listdir(tmp_path) == []


def test_an_unusable_work_dir_is_a_grant_error(tmp_path: Path) -> None:
    with pytest.raises(GrantError, match="cannot create"):
        broker._open_workspace(str(tmp_path / "missing"), (1, 1), False)
