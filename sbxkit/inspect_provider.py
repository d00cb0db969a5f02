"""sbxkit as an Inspect sandbox provider: ``sandbox=("sbxkit", "profile.toml")``.

Installed with ``pip install '.[inspect]'``; the ``inspect_ai`` entry point imports this
module, which registers the provider under the name ``sbxkit``. Each sample gets one hardened,
supervised, long-lived sbxkit sandbox (``sbxkit.open_sandbox``) built from a sbxkit profile;
it is removed at sample cleanup, and by the supervisor if the eval process is killed.

On Inspect's trio backend (``INSPECT_ASYNC_BACKEND=trio``) sbxkit runs in the eval's own event
loop; on asyncio (Inspect's default) each sandbox's trio code runs in a portal thread. What this
provider refuses by design, and why, is in docs/inspect.md.
"""

from __future__ import annotations

import errno
import functools
import posixpath
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import anyio
import msgspec
import sniffio
import trio
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)

from sbxkit import aio
from sbxkit._consumers.session import Sandbox, SandboxExpired, SandboxUnusable, open_sandbox
from sbxkit._grammar.profile import apply_profile, load_profile
from sbxkit._model.network_ports import PortForward
from sbxkit._model.result import RunResult
from sbxkit._model.spec import body_ids
from sbxkit._plan.plan import CheckedSpec, check_spec
from sbxkit._protocol.journal import default_state_dir
from sbxkit._util.portal import Portal
from sbxkit.errors import SbxError, SpecError

T = TypeVar("T")

PROVIDER = "sbxkit"
INSPECT_LABEL = "sbxkit.inspect.task"
DEFAULT_WORKDIR = "/tmp"
"""The per-sample working directory: the scratch tmpfs (every writable place is listed in
docs/security.md, "Every writable place")."""
EXEC_NOT_PERMITTED = 126


def _on_trio() -> bool:
    try:
        return sniffio.current_async_library() == "trio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


class _Loop:
    """Where one sandbox's trio code runs: the eval's own loop when Inspect runs on trio; a
    portal (trio in a worker thread, sbxkit/_util/portal.py) when it runs on asyncio, so that
    cancelling an Inspect task still cancels the sbxkit call and waits for its cleanup."""

    def __init__(self) -> None:
        self.portal: Portal | None = None
        if not _on_trio():
            self.portal = Portal()
            self.portal.start()

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self.portal is None:
            return await fn(*args)
        return await self.portal.acall(fn, *args)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        if self.portal is None:
            trio.lowlevel.spawn_system_task(fn, name="sbxkit-inspect-sandbox")
        else:
            self.portal.submit(fn)

    async def close(self) -> None:
        if self.portal is not None:
            await anyio.to_thread.run_sync(self.portal.close)


def sample_spec(config: SandboxEnvironmentConfigType | None, task_name: str) -> CheckedSpec:
    """The sandbox a sample gets: the profile's image, limits and policy, ``/tmp`` as the
    working directory unless the profile names one, and a label naming the task."""
    if not isinstance(config, str):
        raise SpecError(
            "sandbox config",
            'the sbxkit sandbox needs a profile: sandbox=("sbxkit", "path/to/profile.toml")',
        )
    profile = load_profile(Path(config))
    spec, settings, _ = apply_profile(profile, ["true"])
    labels = {**spec.labels, INSPECT_LABEL: task_name}
    workdir = spec.workdir or DEFAULT_WORKDIR
    # The profile's spec with Inspect's task label and a working directory: every other field
    # is derived, never copied (a new SandboxSpec field cannot be dropped here).
    spec = msgspec.structs.replace(spec, labels=labels, workdir=workdir)
    return check_spec(spec, settings)


class _Holder:
    """Keeps one ``open_sandbox`` block open in a trio system task until released: Inspect
    opens a sample's sandbox in one task and cleans it up in another, and a trio cancel
    scope must be left in the task that entered it."""

    def __init__(self, checked: CheckedSpec) -> None:
        self.checked = checked
        self.opened = trio.Event()
        self.release = trio.Event()
        self.closed = trio.Event()
        self.sandbox: Sandbox | None = None
        self.error: BaseException | None = None

    async def release_and_wait(self) -> None:
        self.release.set()
        with trio.CancelScope(shield=True):
            await self.closed.wait()

    async def hold(self) -> None:
        try:
            async with open_sandbox(self.checked) as sandbox:
                self.sandbox = sandbox
                self.opened.set()
                await self.release.wait()
        except Exception as exc:  # a system task must not raise; the waiter re-raises it
            self.error = exc
        finally:
            self.opened.set()
            self.closed.set()


@sandboxenv(name=PROVIDER)
class SbxkitSandboxEnvironment(SandboxEnvironment):
    """One sbxkit sandbox of a sample (see the module doc)."""

    def __init__(self, holder: _Holder, loop: _Loop) -> None:
        super().__init__()
        self._holder = holder
        self._loop = loop

    @property
    def _sandbox(self) -> Sandbox:
        sandbox = self._holder.sandbox
        if sandbox is None or self._holder.closed.is_set():
            raise SandboxUnavailableError("the sbxkit sandbox is closed")
        return sandbox

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        sample_spec(config, task_name)  # a bad profile fails the task before any sample runs

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        holder = _Holder(sample_spec(config, task_name))
        loop = _Loop()
        loop.spawn(holder.hold)
        await loop.call(holder.opened.wait)
        if holder.sandbox is None:
            await loop.close()
            assert holder.error is not None
            raise holder.error
        return {"default": cls(holder, loop)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        errors: list[BaseException] = []
        for environment in environments.values():
            if isinstance(environment, SbxkitSandboxEnvironment):
                holder = environment._holder
                await environment._loop.call(holder.release_and_wait)
                await environment._loop.close()
                if holder.error is not None and not isinstance(holder.error, SandboxExpired):
                    errors.append(holder.error)
        if errors:
            raise errors[0]

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup sbxkit``: ask the supervisor to recover every lease whose
        owner is gone (a killed eval's sandboxes are normally removed at once anyway)."""
        from sbxkit._lifecycle import leases_admin as admin
        from sbxkit._protocol.wire import Recover

        async def recover() -> None:
            report = await admin.request(default_state_dir(), Recover())
            for line in report.lines:
                print(line)

        if sniffio.current_async_library() == "trio":
            await recover()
        else:
            await aio.call(recover)

    # -- exec ---------------------------------------------------------------------------------

    def _workdir(self, cwd: str | None) -> str:
        base = self._sandbox.spec.workdir or DEFAULT_WORKDIR
        return base if cwd is None else posixpath.normpath(posixpath.join(base, cwd))

    def _check_user(self, user: str | None) -> None:
        """Every exec runs as the sandbox's one user; naming it is fine (a workspace's root
        inside answers to ``root`` too)."""
        if user is None:
            return
        uid, gid = body_ids(self._sandbox.user)
        names = {str(uid), f"{uid}:{gid}"} | ({"root"} if (uid, gid) == (0, 0) else set())
        if user not in names:
            what = "root inside its workspace" if uid == 0 else "non-root, no capabilities"
            raise SandboxUserUnsupportedError(
                f"the sbxkit sandbox runs every command as {uid}:{gid} ({what}); it cannot "
                f"run as {user!r}"
            )

    async def _exec(
        self,
        argv: list[str],
        stdin: bytes | None,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        max_output: int,
    ) -> RunResult:
        run = functools.partial(
            self._sandbox.exec,
            argv,
            stdin,
            timeout=timeout,
            max_output=max_output,
            workdir=self._workdir(cwd),
            env=env,
        )
        try:
            return await self._loop.call(run)
        except SandboxUnusable as exc:
            raise SandboxUnavailableError(str(exc)) from exc

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` as the sandbox user. A timeout kills the command's whole process group
        and raises ``TimeoutError`` (never retried: a command may not be idempotent)."""
        self._check_user(user)
        stdin = input.encode("utf-8") if isinstance(input, str) else input
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        result = await self._exec(cmd, stdin, cwd=cwd, env=env, timeout=timeout, max_output=limit)
        if result.status == "timed_out":
            raise TimeoutError(
                f"command timed out after {timeout} s (its process group was killed)"
            )
        if result.status == "output_exceeded":
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                _text(result.stdout),
            )
        code = result.exit_code if result.exit_code is not None else 137
        stderr = _text(result.stderr)
        if code == EXEC_NOT_PERMITTED and "permission denied" in stderr.lower():
            raise PermissionError(errno.EACCES, stderr.strip(), cmd[0] if cmd else "")
        return ExecResult(
            success=code == 0, returncode=code, stdout=_text(result.stdout), stderr=stderr
        )

    # -- inbound ports ------------------------------------------------------------------------

    async def ports(self) -> tuple[PortForward, ...]:
        """The sample's inbound ports (the profile's ``network.ports``) as the host reaches
        them: a connection to ``address:host_port`` on the host reaches the sandbox's own
        ``127.0.0.1:sandbox_port``. A solver or scorer on the host gets them with
        ``await sandbox().as_type(SbxkitSandboxEnvironment).ports()`` (docs/inspect.md)."""
        sandbox = self._sandbox
        return await self._loop.call(sandbox.ports)

    # -- files --------------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        script = 'd=$(dirname -- "$1") && mkdir -p -- "$d" && cat > "$1"'
        result = await self._exec(
            ["sh", "-c", script, "sbxkit-write", file], data, max_output=64 * 1024
        )
        _raise_file_error(result, file)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        result = await self._exec(["cat", "--", file], None, max_output=limit)
        if result.status == "output_exceeded" and result.overflowed == "stdout":
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        _raise_file_error(result, file)
        return result.stdout.decode("utf-8") if text else result.stdout


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _raise_file_error(result: RunResult, file: str) -> None:
    """Map a failed ``cat``/write to the exceptions Inspect's contract names."""
    if result.ok:
        return
    message = _text(result.stderr).strip()
    lowered = message.lower()
    if result.status == "timed_out":
        raise TimeoutError(f"{file}: timed out")
    if "is a directory" in lowered:
        raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if "no such file" in lowered or "not a directory" in lowered:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    if "permission denied" in lowered or "read-only file system" in lowered:
        raise PermissionError(errno.EACCES, "Permission denied", file)
    raise SbxError(f"{file}: {result.status} {result.exit_code}: {message[:500]}")
