"""The durable lease journal: one private directory, one file per lease, fsync'd.

The state directory is absolute, a real directory (not a link), owned by the runtime uid and
mode 0700. Records are regular files, mode 0600, with one link, opened without following links.
Anything else is a ``StorageError`` that blocks new execution: a journal we cannot trust cannot
promise cleanup.

Writes are atomic and durable: create a temp file (exclusive, 0600) → write → fsync → rename
over the record → fsync the directory. Deletion is unlink → fsync the directory. These are
blocking calls; the service runs them in a worker thread from a single journal task, so the
event loop never waits on the disk and there is exactly one writer.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Container
from pathlib import Path
from typing import TypeVar

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

T = TypeVar("T")


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
            self._fsync_dir()
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
        self._fsync_dir()

    def delete_record(self, lease: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path / record_filename(lease))
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Operation:
    """A blocking state operation, its completion, and its outcome."""

    def __init__(self, work: Callable[[], object]) -> None:
        self.work = work
        self.done = trio.Event()
        self.result: object = None
        self.error: BaseException | None = None


class Journal:
    """The single writer. One task runs ``serve``; others submit operations and await them.

    Each operation runs in a worker thread (``os.fsync`` must not block the event loop), one at a
    time, in submission order. ``fsyncs`` counts file and directory fsyncs for the benchmark.
    """

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._send, self._receive = trio.open_memory_channel[_Operation](0)
        self.writes = 0
        self.deletes = 0

    async def serve(self) -> None:
        async with self._receive:
            async for operation in self._receive:
                try:
                    operation.result = await trio.to_thread.run_sync(operation.work)
                except Exception as exc:  # handed back to the submitter
                    operation.error = exc
                operation.done.set()

    async def _submit(self, work: Callable[[], T]) -> T:
        operation = _Operation(work)
        await self._send.send(operation)
        # The operation now runs to completion whatever happens to the submitter: a record
        # write that was started must not be abandoned halfway (its result is still durable).
        with trio.CancelScope(shield=True):
            await operation.done.wait()
        if operation.error is not None:
            raise operation.error
        return operation.result  # type: ignore[return-value]

    async def write(self, record: LeaseRecord) -> None:
        await self._submit(lambda: self.state.write_record(record))
        self.writes += 1

    async def delete(self, lease: str) -> None:
        await self._submit(lambda: self.state.delete_record(lease))
        self.deletes += 1

    @property
    def fsyncs(self) -> int:
        """fsync calls made: a write is file + directory, a delete is directory."""
        return 2 * self.writes + self.deletes


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
