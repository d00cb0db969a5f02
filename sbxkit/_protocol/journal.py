"""The durable lease journal: one private directory, one file per lease, fsync'd.

The state directory is absolute, a real directory (not a link), owned by the runtime uid and
mode 0700. Records are regular files, mode 0600, with one link, opened without following links.
Anything else is a ``StorageError`` that blocks new execution: a journal we cannot trust cannot
promise cleanup.

Writes are atomic and durable: create a temp file (exclusive, 0600) → write → fsync → rename
over the record → fsync the directory. Deletion is unlink → fsync the directory. These are
blocking calls; the service runs them in a worker thread from a single journal task, so the
event loop never waits on the disk and there is exactly one writer.

Group commit: the journal task takes every operation queued while the previous group was on
disk, stages each in submission order (a write's file fsync and rename, a delete's unlink) and
makes the whole group durable with one directory fsync, in one worker-thread handoff. Every
submitter still returns only once its own operation is durable, so a lease record is on disk
before its container is created, exactly as with one fsync'd rename at a time.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Container
from pathlib import Path

import trio

from sbxkit._protocol.address import state_dir_text
from sbxkit._protocol.records import (
    RECORD_SUFFIX,
    LeaseRecord,
    decode_record,
    encode_record,
    record_filename,
)
from sbxkit._protocol.statedir import (
    LOCK_NAME,
    LOG_NAME,
    SOCKET_NAME,
    TEMP_PREFIX,
    check_state_path,
    scan_entries,
)
from sbxkit._util.flock import hold_or_close
from sbxkit.errors import StorageError


def default_state_dir(socket: str | None = None) -> Path:
    """``SBXKIT_STATE_DIR``, else the daemon's own under ``~/.sbxkit`` (``address.py``: the
    hand-off finds its supervisor by the same rule)."""
    return Path(state_dir_text(socket=socket))


def check_state_dir(path: Path, *, create: bool) -> Path:
    """Validate (and optionally create) the state directory; return it unchanged.

    The rules are ``statedir.check_state_path``'s: no link anywhere on the path, no ancestor
    another account can change, the directory the runtime uid's with mode 0700, and a socket
    path that fits AF_UNIX. Missing directories are created 0700, ancestors included."""
    if not path.is_absolute():
        raise StorageError(str(path), "must be an absolute path")
    if create:
        for directory in [*reversed(path.parents), path]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
    check_state_path(path)
    return path


class StateDir:
    """The files of one state directory. Methods are blocking; call them from a thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path / LOCK_NAME
        self.socket_path = path / SOCKET_NAME
        self.log_path = path / LOG_NAME

    # -- lock ----------------------------------------------------------------------------------

    def try_lock(self) -> int | None:
        """Take the exclusive instance lock; None if another supervisor holds it."""
        try:
            fd = os.open(
                self.lock_path,
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                0o600,
            )
        except OSError as exc:  # a link (ELOOP), a directory (EISDIR), …
            raise StorageError(str(self.lock_path), f"cannot be opened: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StorageError(str(self.lock_path), "is not a regular file")
        return hold_or_close(fd)

    def remove_stale_private_files(self) -> tuple[list[StorageError], list[str]]:
        """Delete the temp files a crashed writer left (safe only while holding the lock);
        return every odd entry (``statedir.entry_problem``) and the names deleted."""
        problems, stale = scan_entries(self.path)
        for name in stale:
            os.unlink(self.path / name)
        if stale:
            self.fsync_dir()
        return problems, stale

    # -- records -------------------------------------------------------------------------------

    def record_paths(self) -> list[Path]:
        return sorted(
            Path(entry.path)
            for entry in os.scandir(self.path)
            if entry.name.endswith(RECORD_SUFFIX)
        )

    def read_record(self, path: Path) -> LeaseRecord:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise StorageError(
                str(path), f"cannot open without following links: {exc.strerror}"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise StorageError(str(path), "is not a regular file")
            if info.st_nlink != 1:
                raise StorageError(str(path), f"has {info.st_nlink} links; records have one")
            if info.st_uid != os.geteuid():
                raise StorageError(str(path), f"is owned by uid {info.st_uid}")
            if stat.S_IMODE(info.st_mode) != 0o600:
                raise StorageError(
                    str(path), f"has mode {stat.S_IMODE(info.st_mode):04o}; must be 0600"
                )
            data = os.read(fd, 64 * 1024 + 1)
        finally:
            os.close(fd)
        record = decode_record(str(path), data)
        if path.name != record_filename(record.lease):
            raise StorageError(str(path), f"holds lease {record.lease}; the name disagrees")
        return record

    def audit(self, known: Container[str]) -> list[StorageError]:
        """Every problem of the directory as it is now, for a running supervisor: the path above
        and at it (raised), each odd entry, and each record file whose lease the supervisor does
        not hold — unreadable or malformed, or well-formed but not written by this instance
        (restart the supervisor to recover it). ``known`` is read live: a record is in it before
        its file is written and leaves it after its file is deleted. Temp files are the
        journal's own writes in flight here, not problems."""
        check_state_path(self.path)
        problems, _in_flight = scan_entries(self.path)
        for path in self.record_paths():
            if path.name[: -len(RECORD_SUFFIX)] in known:
                continue
            try:
                record = self.read_record(path)
            except StorageError as exc:
                if os.path.lexists(path):  # else deleted while we looked: not a problem
                    problems.append(exc)
                continue
            problems.append(
                StorageError(
                    str(path),
                    f"holds lease {record.lease}, which this supervisor did not write while "
                    "running; restart it to recover the lease, or remove the file",
                )
            )
        return problems

    def load_records(self) -> list[LeaseRecord]:
        return [self.read_record(path) for path in self.record_paths()]

    def write_record(self, record: LeaseRecord) -> None:
        self.stage_record(record)
        self.fsync_dir()

    def delete_record(self, lease: str) -> None:
        self.unlink_record(lease)
        self.fsync_dir()

    def stage_record(self, record: LeaseRecord) -> None:
        """Write, fsync and rename a record into place; durable after the next ``fsync_dir``."""
        final = self.path / record_filename(record.lease)
        temp = self.path / f"{TEMP_PREFIX}{record.lease}-{secrets.token_hex(4)}"
        fd = os.open(
            temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            data = encode_record(record)
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        os.close(fd)
        os.rename(temp, final)

    def unlink_record(self, lease: str) -> None:
        """Unlink a lease's record (gone already is fine); durable after the next ``fsync_dir``."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / record_filename(lease))

    def fsync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Operation:
    """One queued record write (``record``) or delete (``lease``), its completion and outcome.
    ``first``: blocking work a delete does in the worker thread before the unlink.
    ``durable``: its group fsyncs the directory for it (every write does; a delete may wait
    for the next group that does, ``Journal.delete``)."""

    def __init__(
        self,
        record: LeaseRecord | None,
        lease: str,
        first: Callable[[], None] | None = None,
        *,
        durable: bool = True,
    ) -> None:
        self.record = record
        self.lease = lease
        self.first = first
        self.durable = durable or record is not None
        self.done = trio.Event()
        self.error: BaseException | None = None


class Journal:
    """The single writer. One task runs ``serve``; others submit operations and await them.

    ``serve`` commits groups: each operation queued while the previous group was on disk goes
    into the next, staged in submission order and made durable by one directory fsync, all in
    one worker thread (``os.fsync`` must not block the event loop). ``fsyncs`` counts the file
    and directory fsyncs made, for the benchmark; ``groups`` the directory fsyncs that ended a
    group.
    """

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._queue: list[_Operation] = []
        self._queued = trio.Event()
        self._serving = True
        self.writes = 0
        self.deletes = 0
        self.groups = 0
        self._fsyncs = 0

    async def serve(self) -> None:
        try:
            while True:
                await self._queued.wait()
                self._queued = trio.Event()
                group, self._queue = self._queue, []
                # Not cancellable (the thread runs to its end): a started write is never
                # abandoned halfway, and its submitter hears the outcome.
                try:
                    self._fsyncs += await trio.to_thread.run_sync(self._commit, group)
                    self.groups += 1
                except BaseException as exc:  # not known durable: nobody may hear success
                    for operation in group:
                        if operation.error is None:
                            operation.error = trio.BrokenResourceError("the journal failed")
                            operation.error.__cause__ = exc
                    raise
                finally:
                    for operation in group:
                        operation.done.set()
        finally:
            self._serving = False
            for operation in self._queue:  # queued but never started: nothing reached the disk
                operation.error = trio.BrokenResourceError("the journal has stopped")
                operation.done.set()
            self._queue = []

    def _commit(self, group: list[_Operation]) -> int:
        """Stage each operation in order, then one directory fsync; returns the fsyncs made."""
        fsyncs = 0
        staged: list[_Operation] = []
        for operation in group:
            try:
                if operation.record is not None:
                    self.state.stage_record(operation.record)
                    fsyncs += 1
                else:
                    if operation.first is not None:
                        operation.first()  # its failure keeps the record, as before it
                    self.state.unlink_record(operation.lease)
            except Exception as exc:  # handed back to its submitter; the others go on
                operation.error = exc
            else:
                staged.append(operation)
        # A group of deletes that need not be durable yet makes no fsync: the next group's
        # directory fsync covers their unlinks too.
        if any(operation.durable for operation in staged):
            try:
                self.state.fsync_dir()
                fsyncs += 1
            except Exception as exc:  # not durable: every staged submitter hears it
                for operation in staged:
                    operation.error = exc
        return fsyncs

    def _queue_operation(self, operation: _Operation) -> _Operation:
        if not self._serving:
            raise trio.BrokenResourceError("the journal has stopped")
        self._queue.append(operation)
        self._queued.set()
        return operation

    async def finish(self, operation: _Operation) -> None:
        """Wait until a queued operation is durable (or raise its error). It runs to
        completion whatever happens to the waiter: a record write that was started must not
        be abandoned halfway (its result is still durable)."""
        with trio.CancelScope(shield=True):
            await operation.done.wait()
        if operation.error is not None:
            raise operation.error

    async def _submit(self, operation: _Operation) -> None:
        await self.finish(self._queue_operation(operation))

    async def write(self, record: LeaseRecord) -> None:
        await self._submit(_Operation(record, record.lease))
        self.writes += 1

    def start_write(self, record: LeaseRecord) -> _Operation:
        """Queue a record write and return at once: the caller overlaps other work with its
        commit and awaits ``finish`` before anyone may rely on the record (no task spawned)."""
        operation = self._queue_operation(_Operation(record, record.lease))
        self.writes += 1
        return operation

    async def delete(
        self, lease: str, first: Callable[[], None] | None = None, *, durable: bool = True
    ) -> None:
        """Delete a lease's record; ``first`` (blocking: a lease's FIFO directory removed, say)
        runs in the worker thread just before the unlink, never on the event loop, where a
        directory operation waits behind the journal's fsyncs on the same filesystem.

        ``durable=False``: return once the record is unlinked, its directory fsync left to the
        next group that makes one (a write's). For a record whose container the daemon
        confirmed removed: if a crash loses the unlink, the record comes back as one whose
        container recovery finds gone (``NotFound``) and releases — what a crash just before
        the delete leaves already."""
        await self._submit(_Operation(None, lease, first, durable=durable))
        self.deletes += 1

    @property
    def fsyncs(self) -> int:
        """fsync calls made: one per record written, one per group's directory (a group of
        non-durable deletes alone makes none)."""
        return self._fsyncs


__all__ = [
    "LOCK_NAME",
    "LOG_NAME",
    "SOCKET_NAME",
    "TEMP_PREFIX",
    "Journal",
    "StateDir",
    "check_state_dir",
    "default_state_dir",
]
