"""Whole directories in and out of a session: ``put_dir`` and ``get_dir``, streamed.

``Sandbox`` (sbxkit/_consumers/session.py) takes them from ``DirTransfer``. They move a tree
through the same exec route as ``put_files``/``get_files`` — ``tar`` inside the sandbox, since
the Engine's archive endpoints cannot see its tmpfs — but never hold it whole: ``put_dir`` feeds
the exec's stdin from ``TreeTarStream`` a chunk at a time, ``get_dir`` hands each chunk of its
stdout to ``TarReader``, which checks every member before ``HostWriter`` writes it
(sbxkit/_consumers/tar_stream.py, host_tree.py). In the sandbox, ``PUT_DIR_SCRIPT`` and
``GET_DIR_SCRIPT`` confine both by the resolved path, like the file scripts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from sbxkit._consumers.archive import check_transfer, confine_dir, member_paths
from sbxkit._consumers.exec_scripts import GET_DIR_SCRIPT, MISSING_STATUS, PUT_DIR_SCRIPT
from sbxkit._consumers.host_tree import (
    HostWriter,
    TreeTarStream,
    discard,
    host_path,
    open_target,
    walk_tree,
)
from sbxkit._consumers.tar_stream import (
    TarReader,
    check_bounds,
)
from sbxkit._model.result import RunResult
from sbxkit._model.spec import body_ids, check_limit
from sbxkit._util.stdin import StdinSource
from sbxkit.errors import SandboxFileNotFound, SpecError

if TYPE_CHECKING:
    from sbxkit._lifecycle.owned import OwnedContainer

__all__ = ["DirTransfer", "StdoutSink"]

StdoutSink = Callable[[bytes], Awaitable[None]]
"""Where an exec's stdout goes instead of its capped capture (``Sandbox._run``)."""
TRANSFER_STDERR = 64 * 1024


class DirTransfer:
    """``put_dir`` and ``get_dir`` for ``Sandbox``, on its exec machinery."""

    files_root: str
    _box: OwnedContainer

    if TYPE_CHECKING:

        def _check_usable(self) -> None: ...

        async def _run(
            self,
            argv: list[str],
            stdin: StdinSource | None,
            timeout: float,
            max_output: int,
            workdir: str | None = None,
            env: list[str] | None = None,
            on_stdout: StdoutSink | None = None,
        ) -> RunResult: ...

    async def put_dir(
        self,
        local_dir: str | os.PathLike[str],
        dest: str,
        *,
        max_bytes: int | None = None,
        max_entries: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Copy the host directory tree ``local_dir`` into the sandbox at ``dest``, streamed.

        ``dest`` is relative to the file root or absolute under it; it is created if missing
        and merged into if not (files the tree names are replaced), but no directory on the way
        to it may be a link, nor anything under it already. Only directories and regular files
        are copied: a link, device, FIFO or socket in the tree is refused, as are more than
        ``max_entries`` directories and files or ``max_bytes`` bytes of content — all before
        anything is sent. Both default to the spec's ``limits.transfer_entries`` and
        ``limits.transfer_bytes``, and may not exceed them.
        Everything is owned by the sandbox user; files are 0o644, or 0o755 when executable on
        the host. A failure midway (no space, a file changed while copied) raises
        ``ArchiveError`` and may leave part of the tree in the sandbox.
        """
        root = host_path(local_dir)
        max_bytes, max_entries = self._bounds(max_bytes, max_entries)
        destination = confine_dir(dest, self.files_root)
        timeout = self._transfer_timeout(timeout)
        uid, gid = body_ids(self._box.user)
        entries = await trio.to_thread.run_sync(
            lambda: walk_tree(root, max_bytes=max_bytes, max_entries=max_entries)
        )
        relative = destination[len(self.files_root) :].strip("/")
        on_the_way = member_paths({relative: b""}) if relative else []
        stream = TreeTarStream(root, entries, uid=uid, gid=gid, mtime=int(time.time()))
        argv = ["sh", "-c", PUT_DIR_SCRIPT, "sbxkit-put", self.files_root, destination]
        result = await self._run([*argv, *on_the_way], stream, timeout, TRANSFER_STDERR)
        check_transfer(result, destination, "writing")

    async def get_dir(
        self,
        src: str,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        max_entries: int | None = None,
        timeout: float | None = None,
    ) -> None:
        """Copy the sandbox directory tree ``src`` to the host directory ``local_dir``, streamed.

        ``src`` is relative to the file root or absolute under it (a link to a place inside
        the root is followed; one leading out is refused). ``local_dir`` must not exist (it is
        created, 0o700) or be an empty directory, and not be a link. Only directories and
        regular files come out: a link (symbolic or hard), device or FIFO in the tree, a member
        name that is absolute or holds ``..``, more than ``max_entries`` directories and files
        or ``max_bytes`` bytes of content (default and ceiling: the spec's
        ``limits.transfer_*``) raise ``ArchiveError`` — and then everything written
        into ``local_dir`` is removed again (``local_dir`` too, if this made it). On the host
        nothing is followed or overwritten; directories are 0o700, files 0o600 (0o700 when
        executable in the sandbox).
        """
        source = confine_dir(src, self.files_root)
        target = host_path(local_dir)
        max_bytes, max_entries = self._bounds(max_bytes, max_entries)
        timeout = self._transfer_timeout(timeout)
        relative = source[len(self.files_root) :].strip("/")
        self._check_usable()
        fd, made = open_target(target)
        writer = HostWriter(fd, target)
        reader = TarReader(writer, max_bytes=max_bytes, max_entries=max_entries)

        async def take(data: bytes) -> None:
            await trio.to_thread.run_sync(reader.feed, data)

        try:
            try:
                result = await self._run(
                    ["sh", "-c", GET_DIR_SCRIPT, "sbxkit-get", self.files_root, f"./{relative}"],
                    None,
                    timeout,
                    TRANSFER_STDERR,
                    on_stdout=take,
                )
            finally:
                writer.close()
            if result.status == "exited" and result.exit_code == MISSING_STATUS:
                raise SandboxFileNotFound(src, source)
            check_transfer(result, source, "reading")
            reader.close()
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(discard, fd, target, made)
            raise
        finally:
            os.close(fd)

    def _bounds(self, max_bytes: int | None, max_entries: int | None) -> tuple[int, int]:
        """A call's bounds: the spec's unless it asks for less; more is refused by name."""
        limits = self._box.spec.limits
        spec_bytes, spec_entries = limits.transfer_bytes, limits.transfer_entries
        chosen = check_bounds(
            spec_bytes if max_bytes is None else max_bytes,
            spec_entries if max_entries is None else max_entries,
        )
        for field, value, ceiling, name in (
            ("max_bytes", chosen[0], spec_bytes, "transfer_bytes"),
            ("max_entries", chosen[1], spec_entries, "transfer_entries"),
        ):
            if value > ceiling:
                raise SpecError(field, f"{value} is more than the spec's limits.{name} ({ceiling})")
        return chosen

    def _transfer_timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self._box.timeout_s
        check_limit("timeout_s", timeout, "timeout")
        return timeout
