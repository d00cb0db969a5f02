"""sbxkit as a LangChain deep agents sandbox backend (``pip install '.[deepagents]'``).

    from deepagents import create_deep_agent
    from sbxkit.integrations.deepagents import SbxkitSandbox

    with SbxkitSandbox(image="python:3.12-slim") as backend:       # or profile="agent.toml"
        agent = create_deep_agent(model=model, backend=backend)
        agent.invoke({"messages": [{"role": "user", "content": "..."}]})
    # the container is removed here

``SbxkitSandbox`` is a deep agents ``BaseSandbox``: ``execute`` runs the agent's shell command
string in one hardened, supervised sbxkit sandbox (``sh -c``, stdout and stderr combined, a
per-command timeout, output capped), ``upload_files``/``download_files`` move bytes anywhere in
it, and deep agents' own ``read``/``write``/``edit``/``ls``/``grep``/``glob`` run on top of
those (they need ``python3`` in the image). The sandbox opens when the backend is made and is
removed by ``close()`` (or the end of a ``with`` block); if the process ends first, sbxkit's
supervisor removes it when the process's connection drops, and in any case once its lifetime
(``limits.timeout_s``) passes. What maps to what, and what is refused: docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import msgspec
import trio
from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from sbxkit._consumers.session import Sandbox, open_sandbox
from sbxkit._grammar.profile import apply_profile, load_profile
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, SandboxSpec, Workspace
from sbxkit._model.units import GiB, MiB
from sbxkit._plan.plan import check_spec
from sbxkit._util.portal import Portal
from sbxkit.errors import PortalClosed, SandboxUnusable, SbxError, SpecError

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_WORKSPACE",
    "SbxkitSandbox",
]

T = TypeVar("T")

DEFAULT_LIMITS: Final = Limits(
    cpus=1,
    memory_bytes=1 * GiB,
    pids=256,
    output_bytes=4 * MiB,
    timeout_s=3600,
    scratch_bytes=256 * MiB,
)
"""The sandbox's bounds when only an image is given. ``output_bytes`` caps each command's
output: deep agents' ``read`` returns up to 500 KiB of a file through ``execute`` as JSON, whose
escapes can take several bytes per character. ``timeout_s`` is the sandbox's whole lifetime."""

DEFAULT_WORKSPACE: Final = Workspace(root=True, disk_bytes=2 * GiB, exec_tmp=True)
"""Root inside (never root on the host: sbxkit refuses it where it would be) and the image's own
files writable, bounded at 2 GiB written: deep agents' file tools take absolute paths anywhere
(``/notes.md``, ``/app/main.py``), and agents install what they need."""

DEFAULT_WORKDIR: Final = "/tmp"
"""Where commands run unless the spec or profile names a working directory: it always exists and
is writable (the scratch tmpfs)."""

DEFAULT_COMMAND_TIMEOUT: Final = 120
"""Seconds a command may run when ``execute`` is given no timeout (deep agents' own
``LocalShellBackend`` default)."""

MAX_FILE_BYTES: Final = 64 * MiB
"""The largest file ``upload_files``/``download_files`` move (``max_file_bytes``)."""

TIMED_OUT_EXIT: Final = 124
"""The exit code reported for a command stopped by its timeout (``timeout(1)``'s)."""

KILLED_EXIT: Final = 137
"""The exit code reported for a command the kernel killed (out of memory): 128 + SIGKILL."""

_COMBINED = 'exec 2>&1; exec sh -c "$1"'
"""Runs the command string as ``sh -c`` would, with its stderr on its stdout: one stream, in the
order the command wrote it."""

_UPLOAD = (
    'p=$1; d=${p%/*}; if [ -n "$d" ] && [ ! -d "$d" ]; then mkdir -p -- "$d" || exit 1; fi; '
    'if [ -d "$p" ]; then printf "%s: Is a directory\\n" "$p" >&2; exit 1; fi; '
    'exec cat > "$p"'
)
"""``$1`` the absolute path, the content on stdin: its directories are made as ``mkdir -p`` makes
them (existing ones untouched), the file created or replaced in place."""

_DOWNLOAD = (
    'p=$1; if [ -d "$p" ]; then printf "%s: Is a directory\\n" "$p" >&2; exit 1; fi; '
    'if [ -e "$p" ] && [ ! -f "$p" ]; then '
    'printf "%s: not a regular file\\n" "$p" >&2; exit 1; fi; '
    'exec cat -- "$p"'
)
"""``$1`` the absolute path: a regular file's bytes on stdout (through links, as ``cat``); a
device or FIFO is refused (``/dev/zero`` has no end)."""

_ERRORS: Final = (
    ("Is a directory", IS_DIRECTORY),
    ("No such file or directory", FILE_NOT_FOUND),
    ("Directory nonexistent", FILE_NOT_FOUND),  # dash's word for a missing parent
    ("Permission denied", PERMISSION_DENIED),
    ("Operation not permitted", PERMISSION_DENIED),
    ("Read-only file system", PERMISSION_DENIED),
    ("Not a directory", INVALID_PATH),
    ("File exists", INVALID_PATH),
    ("Too many levels of symbolic links", INVALID_PATH),
    ("File name too long", INVALID_PATH),
)
"""The sandbox's error text (the C library's ``strerror``, as ``sh``, ``mkdir`` and ``cat``
print it) mapped onto deep agents' ``FileOperationError`` codes, as deep agents'
``FilesystemBackend`` maps the same ``OSError``s."""


class SbxkitSandbox(BaseSandbox):
    """A deep agents sandbox backend on one sbxkit sandbox (see the module doc).

    Give exactly one of ``image`` (sbxkit's hardening with ``DEFAULT_LIMITS`` and
    ``DEFAULT_WORKSPACE``, or the ``limits``/``workspace`` given), ``profile`` (a sbxkit TOML
    profile: image, limits, workspace and operator settings; ``image`` may override its image)
    or ``spec`` (a ``SandboxSpec`` used as it is). Everything is checked, and refused with a
    ``SpecError`` naming the field and the rule, before any container exists; a missing image
    is refused (``ImageError``): sbxkit never pulls.
    """

    def __init__(
        self,
        image: str | None = None,
        *,
        profile: str | Path | None = None,
        spec: SandboxSpec | None = None,
        limits: Limits | None = None,
        workspace: Workspace | None = DEFAULT_WORKSPACE,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        settings: Settings | None = None,
        socket_path: str | None = None,
        command_timeout: int = DEFAULT_COMMAND_TIMEOUT,
        max_file_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        if spec is not None:
            given = [name for name, value in (("image", image), ("profile", profile)) if value]
            if given:
                raise SpecError(given[0], "give an image, a profile or a spec, not more than one")
            shaping = (limits, env, workdir)
            if any(value is not None for value in shaping) or workspace is not DEFAULT_WORKSPACE:
                raise SpecError(
                    "spec",
                    "a spec is used as it is: set its limits, workspace, env "
                    "and workdir in it, not beside it",
                )
            chosen = spec
        elif profile is not None:
            if settings is not None:
                raise SpecError(
                    "settings", "a profile carries its own settings: give one or the other"
                )
            if limits is not None or workspace is not DEFAULT_WORKSPACE:
                raise SpecError(
                    "profile",
                    "a profile sets its own limits and workspace: set them in it, not beside it",
                )
            chosen, settings, _ = apply_profile(load_profile(profile), ["true"], image=image)
            if env:
                chosen = msgspec.structs.replace(chosen, env={**chosen.env, **env})
            if workdir is not None:
                chosen = msgspec.structs.replace(chosen, workdir=workdir)
        elif image is not None:
            chosen = SandboxSpec(
                image=image,
                command=["true"],
                limits=DEFAULT_LIMITS if limits is None else limits,
                workspace=workspace,
                env=dict(env or {}),
                workdir=workdir,
            )
        else:
            raise SpecError("image", "no sandbox: give an image, a profile or a spec")
        if chosen.workdir is None:
            chosen = msgspec.structs.replace(chosen, workdir=DEFAULT_WORKDIR)
        checked = check_spec(chosen, settings)
        _check_positive("command_timeout", command_timeout)
        _check_positive("max_file_bytes", max_file_bytes)
        self._command_timeout = command_timeout
        self._max_file_bytes = max_file_bytes
        self._workdir = checked.spec.workdir or DEFAULT_WORKDIR
        self._held = _Held(functools.partial(open_sandbox, checked, socket_path=socket_path))
        self._sandbox = self._held.sandbox
        self._output_bytes = self._sandbox.spec.limits.output_bytes

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The sandbox's container id."""
        return self._sandbox.container_id

    @property
    def lease(self) -> str:
        """The supervisor's lease on the container (``sbxkit leases`` shows it)."""
        return self._sandbox.lease

    def close(self) -> None:
        """Remove the sandbox; returns once the container is gone. Later calls raise
        ``SandboxUnusable``; closing again does nothing. If the sandbox ended by itself first
        (its lifetime passed: ``SandboxExpired``), that is raised here."""
        self._held.close()

    async def aclose(self) -> None:
        """``close`` for asyncio code (the removal runs in a worker thread)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> SbxkitSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except SbxError as error:
            if exc is None:
                raise
            raise error from exc

    async def __aenter__(self) -> SbxkitSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.__exit__, exc_type, exc, traceback)

    # -- commands -----------------------------------------------------------------------------

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` with ``sh -c`` in the working directory, as the sandbox's user.

        ``timeout`` (seconds; default ``command_timeout``; 0: only the sandbox's lifetime
        bounds it) ends the command's whole process group; the output so far is returned with
        exit code 124. Output (stdout and stderr in one stream) past ``limits.output_bytes``
        stops the command: the first ``output_bytes`` are returned, ``truncated`` set and no
        exit code (it did not exit by itself).
        """
        return self._held.call(self._execute, command, timeout)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """``execute`` for asyncio; cancelling the awaiting task kills the command's process
        group before ``CancelledError`` propagates."""
        return await self._held.acall(self._execute, command, timeout)

    async def _execute(self, command: str, timeout: int | None) -> ExecuteResponse:
        if not isinstance(command, str) or not command:
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        limit = self._timeout(timeout)
        result = await self._sandbox.exec(
            ["sh", "-c", _COMBINED, "sh", command],
            timeout=limit,
            max_output=self._output_bytes,
            workdir=self._workdir,
        )
        return _response(result, limit, self._output_bytes)

    def _timeout(self, timeout: int | None) -> float | None:
        if timeout is None:
            return self._command_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise SpecError("timeout", f"must be a whole number of seconds >= 0, got {timeout!r}")
        return None if timeout == 0 else timeout

    # -- files --------------------------------------------------------------------------------

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (an absolute path anywhere the sandbox's user may write), making
        its directories; one error per file, in order, never raised."""
        return self._held.call(self._upload, files)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await self._held.acall(self._upload, files)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each regular file (an absolute path); one error per file, in order."""
        return self._held.call(self._download, paths)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await self._held.acall(self._download, paths)

    async def _upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            error = _path_error(path)
            if error is None and not isinstance(content, bytes | bytearray):
                error = f"content must be bytes, got {type(content).__name__}"
            elif error is None and len(content) > self._max_file_bytes:
                error = f"larger than {self._max_file_bytes} bytes (max_file_bytes)"
            if error is None:
                result = await self._file_exec(_UPLOAD, path, bytes(content), 64 * 1024)
                error = _file_error(result)
            responses.append(FileUploadResponse(path=path, error=error))
        return responses

    async def _download(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            error = _path_error(path)
            content = None
            if error is None:
                result = await self._file_exec(_DOWNLOAD, path, None, self._max_file_bytes)
                if result.status == "output_exceeded" and result.overflowed == "stdout":
                    error = f"larger than {self._max_file_bytes} bytes (max_file_bytes)"
                else:
                    error = _file_error(result)
                content = result.stdout if error is None else None
            responses.append(FileDownloadResponse(path=path, content=content, error=error))
        return responses

    async def _file_exec(
        self, script: str, path: str, stdin: bytes | None, max_output: int
    ) -> RunResult:
        return await self._sandbox.exec(
            ["sh", "-c", script, "sbxkit-file", path],
            stdin,
            timeout=self._command_timeout,
            max_output=max_output,
            workdir="/",
        )


def _check_positive(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(field, f"must be a positive whole number, got {value!r}")


def _response(result: RunResult, timeout: float | None, cap: int) -> ExecuteResponse:
    """A finished exec as deep agents reads it; a note says why a command did not exit by
    itself (the middleware adds the exit code and the truncation mark)."""
    output = _text(result.stdout + result.stderr)
    if result.status == "exited":
        return ExecuteResponse(output=output, exit_code=result.exit_code)
    if result.status == "timed_out":
        note = f"Error: Command timed out after {timeout:g} seconds (its processes were killed)."
        return ExecuteResponse(output=_noted(output, note), exit_code=TIMED_OUT_EXIT)
    if result.status == "output_exceeded":
        note = f"... Output truncated at {cap} bytes: the command was stopped there."
        return ExecuteResponse(output=_noted(output, note), exit_code=None, truncated=True)
    if result.status == "oom_killed":
        note = "Error: the command was killed: the sandbox ran out of memory."
        return ExecuteResponse(output=_noted(output, note), exit_code=KILLED_EXIT)
    note = f"Error: the command ended {result.status.replace('_', ' ')}."
    return ExecuteResponse(output=_noted(output, note), exit_code=result.exit_code)


def _noted(output: str, note: str) -> str:
    return f"{output.rstrip()}\n\n{note}" if output.strip() else note


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _path_error(path: object) -> str | None:
    """Deep agents' paths are absolute; a NUL cannot reach a file name."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return INVALID_PATH
    return None


def _file_error(result: RunResult) -> str | None:
    if result.ok:
        return None
    message = _text(result.stderr).strip()
    for text, code in _ERRORS:
        if text in message:
            return code
    if result.status != "exited":
        return f"{result.status.replace('_', ' ')}: {message[:200]}".rstrip(": ")
    return message[:200] or f"exit status {result.exit_code}"


class _Held:
    """One ``open_sandbox`` block held open in a task of its own portal (sbxkit/_util/portal.py)
    until ``close``: a deep agents backend is a plain object, opened in one call and closed in
    another, used from plain code and from asyncio alike."""

    def __init__(self, opener: Callable[[], AbstractAsyncContextManager[Sandbox]]) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._opened = threading.Event()
        self._release = trio.Event()
        self._held: list[Sandbox] = []
        self._portal = Portal()
        self._portal.start()
        self._holding = self._portal.submit(self._hold, opener)
        try:
            self._opened.wait()
        except BaseException:
            self._holding.cancel()
            self._holding.wait()
            self._portal.close()
            raise
        if not self._held:
            self._holding.wait()
            self._portal.close()
            self._holding.result()  # raises why it did not open
        self.sandbox = self._held[0]

    async def _hold(self, opener: Callable[[], AbstractAsyncContextManager[Sandbox]]) -> None:
        try:
            async with opener() as sandbox:
                self._held.append(sandbox)
                self._opened.set()
                await self._release.wait()
        finally:
            self._opened.set()  # wakes the opener if the sandbox never opened

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxUnusable(self.sandbox.container_id, "the backend was closed")

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        self._check_open()
        try:
            return self._portal.call(fn, *args)
        except PortalClosed:
            raise SandboxUnusable(self.sandbox.container_id, "the backend was closed") from None

    async def acall(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        self._check_open()
        try:
            return await self._portal.acall(fn, *args)
        except PortalClosed:
            raise SandboxUnusable(self.sandbox.container_id, "the backend was closed") from None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(PortalClosed):
            self._portal.run_sync(self._release.set)
        self._holding.wait()
        self._portal.close()
        self._holding.result()  # SandboxExpired, CleanupError: how the sandbox ended
