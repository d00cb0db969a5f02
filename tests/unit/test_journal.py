"""The lease journal on a real filesystem: state-dir safety, record files, lock, fsyncs.

No daemon and no supervisor process; every test works in its own ``tmp_path``. The tests run as
root (the suite's environment), so a "foreign owner" is made with ``chown 65534``.
"""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from sbxkit._protocol import records as rec
from sbxkit._protocol.journal import LOCK_NAME, Journal, StateDir, check_state_dir
from sbxkit._protocol.records import LeaseRecord, encode_record, record_filename
from sbxkit.errors import StorageError

LEASE_A = "a" * 32
LEASE_B = "b" * 32
FOREIGN_UID = 65534


def record(
    lease: str = LEASE_A, state: rec.LeaseState = "creating", **extra: object
) -> LeaseRecord:
    now = time.time()
    fields: dict[str, object] = {
        "lease": lease,
        "name": f"sbxkit-{lease}",
        "state": state,
        "engine_socket": "/var/run/docker.sock",
        "registered_at": now,
        "lifetime_deadline": now + 60,
        "memory_bytes": 64 * 1024 * 1024,
        "nano_cpus": 500_000_000,
    }
    if state == "created":
        fields["container_id"] = "c" * 64
    fields.update(extra)
    return LeaseRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    path = tmp_path / "leases"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    return path


@pytest.fixture
def state(state_path: Path) -> StateDir:
    return StateDir(state_path)


def raw_record_file(directory: Path, name: str, data: bytes, mode: int = 0o600) -> Path:
    path = directory / name
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def refusal(call: Callable[[], object]) -> StorageError:
    with pytest.raises(StorageError) as info:
        call()
    return info.value


# --- check_state_dir ----------------------------------------------------------------------------


def test_an_own_0700_directory_is_accepted(state_path: Path) -> None:
    assert check_state_dir(state_path, create=False) == state_path


def test_create_makes_a_missing_directory_0700(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "leases"
    old = os.umask(0)  # even a permissive umask must not widen it
    try:
        assert check_state_dir(path, create=True) == path
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


def test_a_relative_path_is_refused() -> None:
    error = refusal(lambda: check_state_dir(Path("relative/leases"), create=True))
    assert error.path == "relative/leases"
    assert "absolute" in error.problem


def test_a_missing_directory_is_refused_without_create(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    error = refusal(lambda: check_state_dir(path, create=False))
    assert error.path == str(path)
    assert "does not exist" in error.problem
    assert not path.exists()


def test_a_symlink_to_a_good_directory_is_refused(state_path: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(state_path)
    for create in (False, True):
        error = refusal(functools.partial(check_state_dir, link, create=create))
        assert error.path == str(link)
        assert "symbolic link" in error.problem


def test_a_regular_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    os.chmod(path, 0o700)
    error = refusal(lambda: check_state_dir(path, create=True))
    assert error.path == str(path)
    assert "not a directory" in error.problem


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o710, 0o707])
def test_a_group_or_world_accessible_directory_is_refused(state_path: Path, mode: int) -> None:
    os.chmod(state_path, mode)
    error = refusal(lambda: check_state_dir(state_path, create=True))
    assert error.path == str(state_path)
    assert f"{mode:04o}" in error.problem
    assert "0700" in error.problem
    assert str(state_path) in str(error)


def test_a_foreign_owned_directory_is_refused(state_path: Path) -> None:
    os.chown(state_path, FOREIGN_UID, FOREIGN_UID)
    error = refusal(lambda: check_state_dir(state_path, create=True))
    assert error.path == str(state_path)
    assert f"uid {FOREIGN_UID}" in error.problem


# --- records: write, read, refuse ---------------------------------------------------------------


def test_write_then_read_round_trips(state: StateDir) -> None:
    original = record(reason=None)
    state.write_record(original)
    path = state.path / record_filename(LEASE_A)
    assert state.record_paths() == [path]
    assert state.read_record(path) == original
    assert state.load_records() == [original]


def test_rewriting_replaces_the_record(state: StateDir) -> None:
    first = record()
    state.write_record(first)
    second = rec.created(first, "d" * 64)
    state.write_record(second)
    assert state.load_records() == [second]
    assert sorted(os.listdir(state.path)) == [record_filename(LEASE_A)]


def test_a_written_record_is_0600_with_one_link_and_no_temp_left(state: StateDir) -> None:
    old = os.umask(0)
    try:
        state.write_record(record())
    finally:
        os.umask(old)
    info = os.lstat(state.path / record_filename(LEASE_A))
    assert stat.S_ISREG(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_nlink == 1
    assert info.st_uid == os.geteuid()
    assert os.listdir(state.path) == [record_filename(LEASE_A)]


def test_a_hard_linked_record_is_refused(state: StateDir, tmp_path: Path) -> None:
    state.write_record(record())
    path = state.path / record_filename(LEASE_A)
    os.link(path, tmp_path / "second-link")
    error = refusal(lambda: state.read_record(path))
    assert error.path == str(path)
    assert "2 links" in error.problem


def test_a_symlinked_record_is_refused(state: StateDir, tmp_path: Path) -> None:
    target = raw_record_file(tmp_path, "elsewhere", encode_record(record()))
    path = state.path / record_filename(LEASE_A)
    path.symlink_to(target)
    error = refusal(lambda: state.read_record(path))
    assert error.path == str(path)
    assert "following links" in error.problem


def test_a_record_under_the_wrong_name_is_refused(state: StateDir) -> None:
    path = raw_record_file(state.path, record_filename(LEASE_B), encode_record(record(LEASE_A)))
    error = refusal(lambda: state.read_record(path))
    assert error.path == str(path)
    assert LEASE_A in error.problem
    assert "name disagrees" in error.problem


@pytest.mark.parametrize(
    "data",
    [b"{not json", b"", b"null", b'{"version": 1}', b"\xff\xfe\x00"],
    ids=["broken", "empty", "null", "partial", "binary"],
)
def test_a_malformed_record_is_a_storage_error_naming_the_file(
    state: StateDir, data: bytes
) -> None:
    path = raw_record_file(state.path, record_filename(LEASE_A), data)
    error = refusal(lambda: state.read_record(path))
    assert error.path == str(path)
    assert "malformed record" in error.problem
    assert str(path) in str(error)


def test_unknown_fields_version_and_missing_id_are_refused(state: StateDir) -> None:
    good = encode_record(record())
    cases = {
        "unknown field": good.replace(b'{"version"', b'{"argv":["secret"],"version"'),
        "version 2": good.replace(b'"version":1', b'"version":2'),
        "created without id": encode_record(record()).replace(b'"creating"', b'"created"'),
        "bad state": good.replace(b'"creating"', b'"running"'),
    }
    for label, data in cases.items():
        path = raw_record_file(state.path, record_filename(LEASE_A), data)
        error = refusal(functools.partial(state.read_record, path))
        assert error.path == str(path), label


def test_an_oversized_record_is_refused(state: StateDir) -> None:
    big = encode_record(record(reason="x" * (rec.MAX_RECORD_BYTES + 1)))
    path = raw_record_file(state.path, record_filename(LEASE_A), big)
    error = refusal(lambda: state.read_record(path))
    assert "over" in error.problem


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400, 0o700])
def test_a_record_with_another_mode_is_refused(state: StateDir, mode: int) -> None:
    path = raw_record_file(state.path, record_filename(LEASE_A), encode_record(record()), mode)
    error = refusal(lambda: state.read_record(path))
    assert f"{mode:04o}" in error.problem


def test_a_foreign_owned_record_is_refused(state: StateDir) -> None:
    state.write_record(record())
    path = state.path / record_filename(LEASE_A)
    os.chown(path, FOREIGN_UID, FOREIGN_UID)
    error = refusal(lambda: state.read_record(path))
    assert f"uid {FOREIGN_UID}" in error.problem


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_record_that_is_not_a_regular_file_is_refused(state: StateDir, kind: str) -> None:
    path = state.path / record_filename(LEASE_A)
    if kind == "directory":
        path.mkdir(mode=0o600)
    else:
        os.mkfifo(path, 0o600)  # O_NONBLOCK: opening it must not hang
    error = refusal(lambda: state.read_record(path))
    assert error.path == str(path)


def test_record_paths_lists_only_records(state: StateDir) -> None:
    state.write_record(record(LEASE_A))
    state.write_record(record(LEASE_B))
    (state.path / "notes.txt").write_text("")
    (state.path / ".tmp-leftover").write_text("")
    assert [p.name for p in state.record_paths()] == [
        record_filename(LEASE_A),
        record_filename(LEASE_B),
    ]


def test_delete_removes_the_record_and_tolerates_a_missing_one(state: StateDir) -> None:
    state.write_record(record())
    state.delete_record(LEASE_A)
    assert os.listdir(state.path) == []
    state.delete_record(LEASE_A)  # already gone: no error


def test_record_filename_refuses_a_malformed_lease() -> None:
    for lease in ["A" * 32, "a" * 31, "a" * 33, "../" + "a" * 29, ""]:
        with pytest.raises(ValueError, match="32 lowercase hex"):
            record_filename(lease)


# --- stale files and the lock -------------------------------------------------------------------


def test_remove_stale_private_files_deletes_temp_files_only(state: StateDir) -> None:
    state.write_record(record())
    keep = ["notes.tmp-1", "tmp-x", "x.tmp-", LOCK_NAME, "supervisor.log"]
    stale = [".tmp-" + LEASE_B + "-0a0b0c0d", ".tmp-", ".tmp-anything"]
    for name in keep + stale:
        (state.path / name).write_text("x")
    odd, removed = state.remove_stale_private_files()
    assert sorted(removed) == sorted(stale)
    assert sorted(os.listdir(state.path)) == sorted([*keep, record_filename(LEASE_A)])
    # Names the supervisor never writes are kept, and reported: they block execution.
    assert sorted(e.path for e in odd) == sorted(str(state.path / n) for n in keep[:3])
    assert state.remove_stale_private_files()[1] == []


def test_the_lock_is_exclusive_per_open_file_description(state: StateDir) -> None:
    first = state.try_lock()
    assert first is not None
    try:
        assert state.try_lock() is None  # a second open + flock in the same process fails
        assert StateDir(state.path).try_lock() is None
    finally:
        os.close(first)
    again = state.try_lock()
    assert again is not None  # released with its descriptor
    os.close(again)
    assert stat.S_IMODE(os.lstat(state.lock_path).st_mode) == 0o600


def test_the_lock_refuses_a_symlinked_lock_file(state: StateDir, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("")
    state.lock_path.symlink_to(target)
    error = refusal(state.try_lock)
    assert error.path == str(state.lock_path)
    assert "Too many levels of symbolic links" in error.problem


# --- state transitions --------------------------------------------------------------------------


def test_created_only_from_creating() -> None:
    after = rec.created(record(state="creating"), "e" * 64)
    assert after.state == "created"
    assert after.container_id == "e" * 64
    states: tuple[rec.LeaseState, ...] = ("created", "uncertain")
    for state in states:
        with pytest.raises(ValueError, match=f"created from state {state}"):
            rec.created(record(state=state), "e" * 64)


def test_uncertain_never_from_created() -> None:
    tombstone = rec.uncertain(record(state="creating"), "create timed out")
    assert tombstone.state == "uncertain"
    assert tombstone.reason == "create timed out"
    assert tombstone.container_id is None
    assert rec.uncertain(tombstone, "again").reason == "again"
    with pytest.raises(ValueError, match="never uncertain"):
        rec.uncertain(record(state="created"), "no")


# --- durability: fsync order and count ----------------------------------------------------------


class FsyncSpy:
    """Counts ``os.fsync`` calls by the kind of file they target, and logs renames in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        real_fsync = os.fsync
        real_rename = os.rename

        def fsync(fd: int) -> None:
            kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            self.events.append(f"fsync:{kind}")
            real_fsync(fd)

        def rename(src: str | Path, dst: str | Path) -> None:
            self.events.append("rename")
            real_rename(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)

    @property
    def fsyncs(self) -> int:
        return sum(e.startswith("fsync") for e in self.events)


def test_a_write_fsyncs_file_then_renames_then_fsyncs_the_directory(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(monkeypatch)
    state.write_record(record())
    assert spy.events == ["fsync:file", "rename", "fsync:dir"]
    assert spy.fsyncs == 2


def test_a_delete_fsyncs_the_directory_once(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    state.write_record(record())
    spy = FsyncSpy(monkeypatch)
    state.delete_record(LEASE_A)
    assert spy.events == ["fsync:dir"]


def test_a_failed_fsync_leaves_neither_temp_nor_record(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output error"):
        state.write_record(record())
    assert os.listdir(state.path) == []


async def serve_a_created_lease(journal: Journal, nursery: trio.Nursery) -> None:
    """Start ``journal``'s worker in ``nursery``; journal LEASE_A's creating record, then its
    created one."""
    nursery.start_soon(journal.serve)
    first = record()
    await journal.write(first)
    await journal.write(rec.created(first, "f" * 64))


async def test_the_journal_counter_matches_the_real_fsyncs(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Journal.fsyncs`` (the benchmark's figure) equals the fsync calls actually made."""
    spy = FsyncSpy(monkeypatch)
    journal = Journal(state)
    async with trio.open_nursery() as nursery:
        await serve_a_created_lease(journal, nursery)
        await journal.delete(LEASE_A)
        nursery.cancel_scope.cancel()
    assert spy.fsyncs == 5
    assert journal.fsyncs == spy.fsyncs
    assert os.listdir(state.path) == []


async def test_a_delete_not_durable_yet_waits_for_the_next_directory_fsync(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record whose container the daemon removed is unlinked at once and fsyncs nothing of
    its own: the next write's directory fsync, after the unlink, makes it durable."""
    journal = Journal(state)
    async with trio.open_nursery() as nursery:
        await serve_a_created_lease(journal, nursery)
        spy = FsyncSpy(monkeypatch)
        await journal.delete(LEASE_A, durable=False)
        assert os.listdir(state.path) == []
        assert spy.events == []
        await journal.write(record(LEASE_B))
        assert spy.events == ["fsync:file", "rename", "fsync:dir"]
        await journal.delete(LEASE_B)  # durable: its own directory fsync, as before
        assert spy.events[-1] == "fsync:dir"
        nursery.cancel_scope.cancel()
    assert journal.fsyncs == 4 + 3
    assert os.listdir(state.path) == []


async def test_a_journal_operation_error_reaches_its_submitter(state: StateDir) -> None:
    journal = Journal(state)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.serve)
        # Root ignores mode bits, so break the write by moving the directory away.
        state.path.rename(state.path.with_name("moved"))
        with pytest.raises(FileNotFoundError):
            await journal.write(record())
        assert journal.writes == 0
        nursery.cancel_scope.cancel()


async def test_a_deletes_first_work_runs_off_the_event_loop_before_the_unlink(
    state: StateDir,
) -> None:
    """A lease's FIFO directory goes in the journal's worker thread, just before its record's
    unlink (``Journal.delete(first=...)``): never on the event loop, and a failure keeps the
    record and reaches the submitter, as the removal did on the event loop."""
    import threading

    journal = Journal(state)
    seen: list[tuple[int, bool]] = []
    path = state.path / record_filename(LEASE_A)

    def first() -> None:
        seen.append((threading.get_ident(), path.exists()))

    def broken() -> None:
        raise PermissionError(13, "Permission denied")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.serve)
        await journal.write(record())
        await journal.delete(LEASE_A, first=first)
        assert seen == [(seen[0][0], True)]  # ran while the record still existed
        assert seen[0][0] != threading.get_ident()  # in the worker thread
        assert not path.exists()
        await journal.write(record())
        with pytest.raises(PermissionError):
            await journal.delete(LEASE_A, first=broken)
        assert path.exists()  # kept: the reaper retries, as before
        nursery.cancel_scope.cancel()


class GroupSpy:
    """Logs renames (by record file), directory fsyncs and submitter returns, in order; holds
    the first file fsync until ``release`` is set, so that the others queue behind it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        self.events: list[str] = []
        self.first_fsync = threading.Event()
        self.release = threading.Event()
        real_fsync = os.fsync
        real_rename = os.rename

        def fsync(fd: int) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.events.append("fsync:dir")
            elif not self.first_fsync.is_set():
                self.first_fsync.set()
                self.release.wait(10)
            real_fsync(fd)

        def rename(src: str | Path, dst: str | Path) -> None:
            real_rename(src, dst)
            self.events.append(f"rename:{Path(dst).name}")

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)


async def test_concurrent_writes_share_one_directory_fsync_and_wait_for_it(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: writes queued behind a slow one go to disk together with one directory
    fsync, and no submitter returns before the directory fsync that follows its rename."""
    spy = GroupSpy(monkeypatch)
    journal = Journal(state)
    leases = [f"{i:x}" * 32 for i in range(8)]

    async def write(lease: str) -> None:
        await journal.write(record(lease))
        spy.events.append(f"return:{record_filename(lease)}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.serve)
        async with trio.open_nursery() as writers:
            writers.start_soon(write, leases[0])
            await trio.to_thread.run_sync(spy.first_fsync.wait, 10)
            for lease in leases[1:]:
                writers.start_soon(write, lease)
            await trio.testing.wait_all_tasks_blocked()
            spy.release.set()
        nursery.cancel_scope.cancel()

    assert spy.events.count("fsync:dir") == 2  # the slow first write, then the other seven
    assert journal.groups == 2
    assert journal.fsyncs == len(leases) + 2
    for lease in leases:
        name = record_filename(lease)
        renamed = spy.events.index(f"rename:{name}")
        durable = spy.events.index("fsync:dir", renamed)
        assert spy.events.index(f"return:{name}") > durable
    assert sorted(os.listdir(state.path)) == sorted(record_filename(x) for x in leases)


async def test_a_failed_operation_in_a_group_reaches_only_its_submitter(
    state: StateDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = GroupSpy(monkeypatch)
    real_open = os.open

    def open_(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if f"-{LEASE_B}-" in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_)
    journal = Journal(state)
    outcomes: dict[str, BaseException | None] = {}
    lease_c = "c" * 32

    async def write(lease: str) -> None:
        try:
            await journal.write(record(lease))
        except OSError as exc:
            outcomes[lease] = exc
        else:
            outcomes[lease] = None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.serve)
        first = record("d" * 32)
        async with trio.open_nursery() as writers:
            writers.start_soon(journal.write, first)
            await trio.to_thread.run_sync(spy.first_fsync.wait, 10)
            for lease in (LEASE_A, LEASE_B, lease_c):
                writers.start_soon(write, lease)
            await trio.testing.wait_all_tasks_blocked()
            spy.release.set()
        nursery.cancel_scope.cancel()

    assert journal.groups == 2
    assert outcomes[LEASE_A] is None
    assert outcomes[lease_c] is None
    assert isinstance(outcomes[LEASE_B], OSError)
    assert "No space" in str(outcomes[LEASE_B])
    assert journal.writes == 3
    assert sorted(os.listdir(state.path)) == sorted(
        record_filename(x) for x in (LEASE_A, lease_c, "d" * 32)
    )


async def test_a_stopped_journal_refuses_instead_of_hanging(state: StateDir) -> None:
    journal = Journal(state)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.serve)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
        await journal.write(record())
    assert os.listdir(state.path) == []
