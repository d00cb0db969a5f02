"""sbxkit as a sandbox backend of the OpenAI Agents SDK (``pip install '.[openai-agents]'``).

    from agents.run import RunConfig
    from agents.sandbox import SandboxRunConfig
    from sbxkit.integrations.openai_agents import SbxkitSandboxClient, SbxkitSandboxClientOptions

    run_config = RunConfig(sandbox=SandboxRunConfig(
        client=SbxkitSandboxClient(),
        options=SbxkitSandboxClientOptions(image="python:3.12-slim"),
    ))

Each SDK session is one ``sbxkit.aio.open_sandbox`` block: the hardened body, mandatory limits,
no network, the supervisor's removal if this process dies. The manifest's root is a bounded
tmpfs of the sandbox's own user; commands run as that user (``root=True``: root inside, where
a daemon proves it is not the host's). ``exec_command`` processes are ``Sandbox.start``
processes, read by cursor; ``resume`` in another process spends the handle a ``detach`` left in
the session state. What sbxkit will not do (publish ports, a network, accounts, mounts that
need ``CAP_SYS_ADMIN``, another user per command) is refused by name before anything exists.
docs/integrations.md has the mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
import uuid
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, TypeAlias

from agents.sandbox.errors import (
    ExecNonZeroError,
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import (
    RESOLVE_WORKSPACE_PATH_HELPER,
    RuntimeHelperScript,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from agents.sandbox.workspace_paths import posix_path_for_error, sandbox_path_str

from sbxkit import aio
from sbxkit._consumers.handle import SandboxHandle
from sbxkit._consumers.process_log import ProcessExit
from sbxkit._model.result import RunResult
from sbxkit.errors import ReattachRefused, SbxError, SpecError, TooManyProcesses
from sbxkit.integrations._openai_agents_options import (
    BACKEND_ID,
    SbxkitSandboxClientOptions,
    SbxkitSandboxSessionState,
    coerce_options,
    exit_code,
    refuse,
    sandbox_spec,
)

__all__ = [
    "SbxkitSandboxClient",
    "SbxkitSandboxClientOptions",
    "SbxkitSandboxSession",
    "SbxkitSandboxSessionState",
]


Opener: TypeAlias = Callable[[], AbstractAsyncContextManager[aio.AioSandbox]]
"""Opens (or reattaches) a session's sandbox: ``aio.open_sandbox`` or ``aio.attach_sandbox``."""


@dataclass
class _Running:
    """An ``exec_command`` process: its sbxkit handle and how far the model has read."""

    process: aio.AioProcess
    tty: bool
    cursor: int = 0
    done: bool = False
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)


class SbxkitSandboxSession(BaseSandboxSession):
    """One SDK session on one sbxkit sandbox (``aio.open_sandbox``, or ``attach_sandbox`` on
    resume). Commands, files and the workspace's tar all pass through ``Sandbox.exec``."""

    state: SbxkitSandboxSessionState

    def __init__(
        self,
        state: SbxkitSandboxSessionState,
        opener: Opener,
    ) -> None:
        self.state = state
        self._opener = opener
        self._stack: AsyncExitStack | None = None
        self._sandbox: aio.AioSandbox | None = None
        self._detached = False
        self._helpers: set[PurePath] = set()
        self._running: dict[int, _Running] = {}
        self._pty_lock = asyncio.Lock()

    # -- the sandbox's life -----------------------------------------------------------------

    async def open(self) -> None:
        """Enter the sandbox's block (made or reattached by the opener)."""
        stack = AsyncExitStack()
        self._sandbox = await stack.enter_async_context(self._opener())
        self._stack = stack
        self._helpers = set()

    @property
    def sandbox(self) -> aio.AioSandbox:
        if self._sandbox is None:
            raise SbxError("the sbxkit sandbox of this session is closed")
        return self._sandbox

    async def _ensure_backend_started(self) -> None:
        # Never a silent replacement: the sandbox's time limit is its whole life.
        if self._detached:
            raise SbxError("this session was detached: resume its state to continue it")
        if self._sandbox is None or not self._sandbox.usable:
            raise SbxError(
                "the sbxkit sandbox of this session has ended (closed, or past its timeout_s); "
                "create or resume a session for another"
            )

    async def _close_block(self) -> None:
        stack, self._stack, self._sandbox = self._stack, None, None
        if stack is not None:
            await stack.aclose()  # removes the container (or leaves it, once detached)

    async def _shutdown_backend(self) -> None:
        await self._close_block()

    async def stop(self) -> None:
        if self._detached:  # the snapshot was taken at detach; the sandbox is not ours now
            return
        await super().stop()

    async def running(self) -> bool:
        return self._sandbox is not None and self._sandbox.usable

    async def detach(self, keep_s: float) -> None:
        """Persist the snapshot, end the ``exec_command`` processes, and hand the sandbox to
        the supervisor for at most ``keep_s`` seconds; ``state.handle`` then resumes it once."""
        await self.run_pre_stop_hooks()
        await super().stop()
        handle = await self.sandbox.detach(keep_s)
        self.state.handle = handle.to_json().decode()
        self._detached = True
        await self._close_block()

    # -- commands ---------------------------------------------------------------------------

    async def exec(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
    ) -> ExecResult:
        _refuse_user(user)
        return await super().exec(*command, timeout=timeout, shell=shell, user=None)

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        return await self._run([str(part) for part in command], timeout=timeout)

    async def _run(
        self,
        argv: list[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        if argv and PurePath(argv[0]) in self._helpers:
            # The SDK's helpers are shell scripts in /tmp, which sbxkit mounts noexec: sh
            # reads them instead of the kernel executing them.
            argv = ["sh", *argv]
        try:
            result: RunResult = await self.sandbox.exec(
                argv,
                stdin,
                timeout=timeout,
                max_output=max_output,
                workdir=self._workdir(),
            )
        except SbxError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=str(exc)) from exc
        if result.status == "timed_out":
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        stderr = result.stderr
        if result.status != "exited":
            stderr += f"\nsbxkit: the command ended {result.status}\n".encode()
        return ExecResult(
            stdout=result.stdout,
            stderr=stderr,
            exit_code=exit_code(result.status, result.exit_code),
        )

    def _workdir(self) -> str | None:
        # The root is a tmpfs from the start; without one it exists once the manifest made it.
        if self.state.options.workspace_bytes is not None or self.state.workspace_root_ready:
            return self.state.manifest.root
        return None

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    async def _ensure_runtime_helper_installed(self, helper: RuntimeHelperScript) -> PurePath:
        # Installed once per sandbox: the SDK's probe (`test -x`) says no on a noexec /tmp.
        if helper.install_path not in self._helpers:
            result = await self.exec(*helper.install_command(), shell=False)
            if not result.ok():
                raise ExecNonZeroError(
                    result, command=("install_runtime_helper", str(helper.install_path))
                )
            self._helpers.add(helper.install_path)
        return helper.install_path

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        return await self._validate_remote_path_access(path, for_write=for_write)

    # -- files ------------------------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        _refuse_user(user)
        target = await self._validate_path_access(path)
        argv = ["cat", "--", sandbox_path_str(target)]
        result = await self._run(argv, max_output=self.state.options.fsize_bytes)
        if not result.ok():
            await self._raise_read_error_from_exec(
                path=path, workspace_path=target, command=argv, result=result
            )
        return io.BytesIO(result.stdout)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        _refuse_user(user)
        payload = coerce_write_payload(path=path, data=data).stream.read()
        target = await self._validate_path_access(path, for_write=True)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        result = await self._run(
            ["sh", "-c", script, "sh", sandbox_path_str(target)], stdin=bytes(payload)
        )
        if not result.ok():
            raise WorkspaceArchiveWriteError(
                path=target,
                context={"stderr": result.stderr.decode("utf-8", errors="replace")},
            )

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path()
        excludes = [
            f"--exclude=./{rel.as_posix().lstrip('/')}"
            for rel in sorted(self._persist_workspace_skip_relpaths(), key=Path.as_posix)
            if rel.as_posix().lstrip("/") not in ("", ".")
        ]
        argv = ["tar", *excludes, "-C", root.as_posix(), "-cf", "-", "."]
        result = await self._run(argv, max_output=self.state.options.archive_bytes)
        if not result.ok():
            raise WorkspaceArchiveReadError(
                path=posix_path_for_error(root),
                context={
                    "exit_code": result.exit_code,
                    "stderr": result.stderr.decode("utf-8", errors="replace"),
                },
            )
        return io.BytesIO(result.stdout)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode()
        try:
            validate_tar_bytes(bytes(raw), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(
                path=posix_path_for_error(root),
                context={"reason": exc.reason, "member": exc.member},
                cause=exc,
            ) from exc
        argv = ["sh", "-c", 'mkdir -p -- "$1" && tar -xf - -C "$1"', "sh", root.as_posix()]
        result = await self._run(argv, stdin=bytes(raw))
        if not result.ok():
            raise WorkspaceArchiveWriteError(
                path=posix_path_for_error(root),
                context={"stderr": result.stderr.decode("utf-8", errors="replace")},
            )

    # -- exec_command / write_stdin ---------------------------------------------------------

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        _refuse_user(user)
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        process = await self._start(argv, tty=tty)
        running = _Running(process=process, tty=tty)
        async with self._pty_lock:
            process_id = allocate_pty_process_id(set(self._running))
            self._running[process_id] = running
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._update(
            process_id, running, clamp_pty_yield_time_ms(yield_ms), max_output_tokens
        )

    async def _start(self, argv: list[str], *, tty: bool) -> aio.AioProcess:
        options = {"pty": tty, "workdir": self._workdir()}
        try:
            return await self.sandbox.start(argv, **options)
        except TooManyProcesses:
            await self._prune()
            return await self.sandbox.start(argv, **options)
        except SbxError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=str(exc)) from exc

    async def _prune(self) -> None:
        """End the least recently used process, as the SDK's backends choose it."""
        async with self._pty_lock:
            meta = [(pid, r.last_used, r.done) for pid, r in self._running.items()]
            chosen = process_id_to_prune_from_meta(meta)
            if chosen is None and meta:  # the SDK spares its 8 most recent; our bound is lower
                chosen = min(meta, key=lambda m: (not m[2], m[1]))[0]
            victim = self._running.pop(chosen, None) if chosen is not None else None
        if victim is not None:
            await _kill(victim)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            running = self._resolve_pty_session_entry(
                pty_processes=self._running, session_id=session_id
            )
        if chars:  # a plain pipe takes stdin too: sbxkit keeps every process's open
            with contextlib.suppress(SbxError):  # it ended: the update says so
                await running.process.write(chars.encode())
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=not chars)
        running.last_used = time.monotonic()
        return await self._update(session_id, running, wait_ms, max_output_tokens)

    async def _update(
        self, process_id: int, running: _Running, wait_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        async def poll(deadline: float) -> None:
            wait = max(0.0, deadline - time.monotonic())
            data, running.cursor, running.done = await running.process.read(
                running.cursor, wait=wait
            )
            if data:
                running.chunks.append(data)

        async def nothing(_: float) -> None:
            return None  # poll already waited for output

        output, tokens, closed = await collect_pty_output(
            output_chunks=running.chunks,
            output_lock=running.lock,
            output_notify=running.notify,
            is_done=lambda: running.done,
            yield_time_ms=wait_ms,
            max_output_tokens=max_output_tokens,
            poll_output=poll,
            wait_for_output=nothing,
        )
        code: int | None = None
        live: int | None = process_id
        if closed:
            ended: ProcessExit = await running.process.wait()
            code = exit_code(ended.status, ended.exit_code)
            live = None
            async with self._pty_lock:
                self._running.pop(process_id, None)
        return PtyExecUpdate(
            process_id=live, output=output, exit_code=code, original_token_count=tokens
        )

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._running.values())
            self._running.clear()
        for running in entries:
            await _kill(running)


async def _kill(running: _Running) -> None:
    with contextlib.suppress(SbxError):  # the sandbox went first: its processes with it
        await running.process.kill()


def _refuse_user(user: str | User | None) -> None:
    if user is not None:
        name = user.name if isinstance(user, User) else user
        raise SpecError(
            "user",
            f"{name!r}: every command of an sbxkit sandbox runs as the sandbox's own user "
            "(no sudo, no second account); leave the agent's run_as unset",
        )


async def _env(state: SbxkitSandboxSessionState) -> dict[str, str]:
    return {**state.options.env, **await state.manifest.environment.resolve()}


def _fresh_opener(
    state: SbxkitSandboxSessionState, socket_path: str | None, env: dict[str, str]
) -> Opener:
    spec = sandbox_spec(state.options, state.manifest.root, env)
    docker: dict[str, Any] = {} if socket_path is None else {"socket_path": socket_path}
    max_processes = min(state.options.max_processes, PTY_PROCESSES_MAX)
    return lambda: aio.open_sandbox(spec, max_processes=max_processes, **docker)


class SbxkitSandboxClient(BaseSandboxClient[SbxkitSandboxClientOptions]):
    """Creates SDK sessions on sbxkit sandboxes. ``socket_path``: the Docker daemon's socket
    (default: sbxkit's discovery, ``DOCKER_HOST`` first; docs/operations.md)."""

    backend_id = BACKEND_ID

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        super().__init__()
        self._socket_path = socket_path
        self._instrumentation = instrumentation or Instrumentation()

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: SbxkitSandboxClientOptions,
    ) -> SandboxSession:
        chosen = coerce_options(options)
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        refuse(chosen, manifest)
        session_id = uuid.uuid4()
        state = SbxkitSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            options=chosen,
        )
        opener = _fresh_opener(state, self._socket_path, await _env(state))
        inner = SbxkitSandboxSession(state, opener)
        await inner.open()
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = _inner(session)
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, SbxkitSandboxSessionState):
            raise TypeError("SbxkitSandboxClient.resume expects a SbxkitSandboxSessionState")
        refuse(state.options, state.manifest)
        handle_json, state.handle = state.handle, None  # single use, whatever happens
        inner: SbxkitSandboxSession | None = None
        if handle_json is not None:
            handle = SandboxHandle.from_json(handle_json)
            inner = SbxkitSandboxSession(state, lambda: aio.attach_sandbox(handle))
            try:
                await inner.open()
                inner._set_start_state_preserved(True)
            except ReattachRefused as exc:
                if not exc.ended:
                    raise  # a wrong or replayed secret is no reason to make another
                inner = None  # it ended (kept too long): a replacement, from the snapshot
        if inner is None:
            state.workspace_root_ready = False
            opener = _fresh_opener(state, self._socket_path, await _env(state))
            inner = SbxkitSandboxSession(state, opener)
            await inner.open()
            inner._set_start_state_preserved(False)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def detach(self, session: SandboxSession, keep_s: float) -> dict[str, object]:
        """Keep ``session``'s sandbox for at most ``keep_s`` seconds without this process and
        return its serialized state, which ``resume`` continues once, in any process of this
        account. It holds the handle's secret: store it as you would a password."""
        inner = _inner(session)
        await inner.detach(keep_s)
        return self.serialize_session_state(inner.state)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, SbxkitSandboxSessionState)


def _inner(session: SandboxSession) -> SbxkitSandboxSession:
    inner = session._inner
    if not isinstance(inner, SbxkitSandboxSession):
        raise TypeError("SbxkitSandboxClient expects a session it made")
    return inner
