"""The sandbox backend: each run in a Docker Sandboxes microVM, driven through the ``sbx`` CLI.

A hypervisor boundary instead of a shared kernel, and a full Docker daemon inside that
``CapDrop=ALL`` can never offer. Opt-in (``[sandbox] runtime = "sandbox"``), Docker Desktop /
``sbx`` machines only; docs/adr-sbx.md argues the design and lists what is still unverified.

One run (``SbxBackend.run_once``):

1. Refuse what this runtime cannot honour (``check_sbx_spec``) before any command runs.
2. Make a private workspace directory on the host; ``sbx create`` a sandbox named
   ``sbxkit-<runner id>-<run id>`` with the workspace mounted at its host path.
3. One ``sbx policy allow network --sandbox NAME localhost:PORT`` per typed host port.
4. ``sbx exec -i``: the exec script links the working directory to the workspace, reads the
   environment from stdin (never argv), and execs the command; the payload's stdin follows
   the environment on the same pipe. Output is capped per stream (exactly N bytes pass, N+1
   is ``output_exceeded``) and the run is bounded by ``limits.timeout_s`` — both enforced
   here, on the host side of the CLI.
5. Always, in a ``finally`` shielded from cancellation — after an exit, a timeout, an overflow,
   an error, the caller's cancellation, and even after a failed create: ``sbx rm --force``.
   That is also the kill: removing the sandbox stops every process in the VM. A removal that
   fails is confirmed against ``sbx ls``; a sandbox still listed (or a listing that fails)
   raises ``SbxCleanupError``. Then the workspace is deleted.

Limits. Elapsed time and output are enforced by this runner. Memory, CPU and pids are not
mapped: a microVM has a fixed RAM allocation it cannot exceed, so the host is protected by
construction (the obligation behind "mandatory memory" is the host's, which a container shares
and a VM does not); sizing it per sandbox goes through ``create_args`` (e.g.
``["--memory", "8g", "--cpus", "2"]``). ``fsize`` and ``scratch`` likewise do not apply: the
VM has its own disk.

Startup. ``preflight`` resolves the binary (a missing one is ``SbxUnavailable``), takes this
runner's lock (``<lock dir>/<runner id>.lock``, one live runner per id) and checks that
``sbx ls --json`` answers. ``reconcile_orphans`` then removes this runner id's leftovers and
those of runners whose lock file is present but no longer held (their process is dead);
sandboxes of live runners, or of runners this lock dir does not know, are never touched.

Every invocation goes through one injected ``Exec`` seam (``process_exec`` by default, on
``trio.run_process``), so the lifecycle is testable against a scripted stand-in
(tests/fake_sbx.py) — sbx exists neither in CI nor on the development machines.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from sbxkit._model.call_checks import check_stdin
from sbxkit._model.result import PhaseTimings, RunResult, Status, Stream
from sbxkit._model.rules import check_env, merge_env, runtime_env
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec, validate_spec
from sbxkit._plan.plan import CheckedSpec
from sbxkit._protocol.journal import default_state_dir
from sbxkit._util.flock import hold_or_close
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.base import Consumer, refuse
from sbxkit.backends.sbx_commands import (
    DEFAULT_AGENT,
    DEFAULT_BINARY,
    check_agent,
    check_binary,
    check_create_args,
    check_host_ports,
    check_kits,
    check_runner_id,
    check_sandbox_fields,
    check_workspace,
    encode_env,
    owner_of,
    parse_sandbox_list,
    sandbox_name,
    sbx_create_args,
    sbx_exec_args,
    sbx_exec_script,
    sbx_list_args,
    sbx_policy_args,
    sbx_remove_args,
)
from sbxkit.backends.sbx_exec import COMMAND_OUTPUT_CAP, CompletedCommand, Exec, process_exec
from sbxkit.errors import (
    RunnerInUse,
    SbxCleanupError,
    SbxCommandError,
    SbxError,
    SbxUnavailable,
    SpecError,
)

if TYPE_CHECKING:
    from sbxkit._lifecycle.owned import OwnedContainer

__all__ = [
    "CompletedCommand",
    "Exec",
    "RunnerInUse",
    "SbxBackend",
    "SbxCleanupError",
    "SbxCommandError",
    "SbxConfig",
    "SbxUnavailable",
    "check_sbx_spec",
    "process_exec",
]


# --- configuration ------------------------------------------------------------------------------


class SbxConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to reach ``sbx`` and what every sandbox is created with."""

    binary: str = DEFAULT_BINARY
    """``sbx`` on PATH, or an absolute path."""
    agent: str = DEFAULT_AGENT
    """The ``sbx create`` agent; ``shell`` has no agent binary at all."""
    kits: list[str] = msgspec.field(default_factory=list)
    create_args: list[str] = msgspec.field(default_factory=list)
    """Extra ``sbx create`` flags, e.g. ``["--memory", "8g"]`` (not ``--name``/``--template``)."""
    runner_id: str | None = None
    """Stable id for a long-lived runner (its orphans are found by name after a restart);
    None picks a random one — a dead runner's orphans are then found through its lock file."""
    lock_dir: str | None = None
    """Where runner locks live (default: ``sbx-runners`` beside the supervisor state dir)."""
    workspace_root: str | None = None
    """Where run workspaces are made (default: the system temp dir); must be shareable."""
    create_timeout_s: float = 600.0
    """``sbx create`` may pull the template image the first time."""
    command_timeout_s: float = 60.0
    """``ls``, ``policy`` and ``rm``."""


def check_sbx_spec(spec: SandboxSpec) -> None:
    """The spec rules plus what this runtime refuses (``check_sandbox_fields``)."""
    env = check_env(spec.env)
    mounts = spec.mounts if isinstance(spec.mounts, list) else []
    labels = spec.labels if isinstance(spec.labels, dict) else {}
    flags = spec.extra_flags if isinstance(spec.extra_flags, list) else []
    check_sandbox_fields(
        network=spec.network if isinstance(spec.network, str) else "governed",
        user=spec.user,
        runtime=spec.runtime,
        mounts=mounts,
        gpus=spec.gpus,
        labels=labels,
        extra_flags=flags,
        env=env,
        workspace=spec.workspace,
    )
    validate_spec(spec)


def _is_runner_id(text: str) -> bool:
    try:
        check_runner_id(text)
    except SpecError:
        return False
    return True


def _default_lock_dir() -> Path:
    return default_state_dir().parent / "sbx-runners"


def _try_lock(path: Path, *, create: bool) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None (absent, or held by a live one)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    return hold_or_close(fd)


def _rmtree(path: str) -> None:
    """Delete a workspace, making directories writable where the payload locked them."""

    def fix(function: Any, failed: str, exc_info: Any) -> None:
        parent = os.path.dirname(failed)
        if failed == path or not parent.startswith(path):
            raise exc_info[1]  # never chmod anything outside the workspace
        os.chmod(parent, stat.S_IRWXU)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, stat.S_IRWXU)
        function(failed)

    shutil.rmtree(path, onerror=fix)


SERVED: tuple[Consumer, ...] = ("run", "harness")
"""What the sbx runtime serves: one-shot runs, also batched."""
WHY_NOT = "a microVM is driven through the sbx CLI, not as a Docker container sbxkit owns"


# --- the backend --------------------------------------------------------------------------------


class SbxBackend:
    """Runs specs in Docker Sandboxes microVMs through the ``sbx`` CLI."""

    kind = "sandbox"

    def __init__(self, config: SbxConfig | None = None, *, exec: Exec | None = None) -> None:
        config = config or SbxConfig()
        check_binary(config.binary, "binary")
        check_agent(config.agent, "agent")
        check_kits(config.kits, "kits")
        check_create_args(config.create_args, "create_args")
        for field in ("create_timeout_s", "command_timeout_s"):
            value = getattr(config, field)
            if not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise SpecError(field, "must be a finite number of seconds > 0")
        self.config = config
        self.runner_id = check_runner_id(config.runner_id or secrets.token_hex(4), "runner_id")
        self._exec: Exec = exec or process_exec
        self._lock_dir = Path(config.lock_dir) if config.lock_dir else _default_lock_dir()
        self._lock_fd: int | None = None
        self._binary = config.binary
        self._live: set[str] = set()

    # -- lifecycle of the runner -----------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._lock_fd is not None

    async def preflight(self) -> None:
        """The binary exists and runs ``sbx ls --json``; this runner's id is ours alone."""
        if self.started:
            return
        self._binary = self._resolve_binary()
        path = self._lock_dir / f"{self.runner_id}.lock"
        try:
            self._lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = _try_lock(path, create=True)
        except OSError as error:
            raise SbxError(f"cannot take the runner lock {path}: {error}") from None
        if fd is None:
            raise RunnerInUse(self.runner_id, str(path))
        self._lock_fd = fd
        try:
            await self._list()
        except BaseException:
            self._release_lock()
            raise

    def _resolve_binary(self) -> str:
        binary = self.config.binary
        if binary.startswith("/"):
            if not os.path.isfile(binary) or not os.access(binary, os.X_OK):
                raise SbxUnavailable(binary, "not an executable file")
            return binary
        found = shutil.which(binary)
        if found is None:
            raise SbxUnavailable(
                binary,
                "not found on PATH (Docker Sandboxes: install sbx and run `sbx login`, or set "
                "sandbox.sbx.binary)",
            )
        return found

    async def reconcile_orphans(self) -> list[str]:
        """Remove this runner id's leftovers and those of runners proven dead by their lock.

        A sandbox of a run in flight in this process is never touched. Another runner's
        sandboxes are removed only while holding that runner's lock file (so it is not alive);
        its lock file is deleted once they are all gone. Names this lock dir has no lock file
        for belong to someone else and are left alone.
        """
        self._check_started()
        names = await self._list()
        removed: list[str] = []
        failures: list[SbxError] = []

        async def remove_all(targets: list[str]) -> bool:
            ok = True
            for name in targets:
                try:
                    await self._remove(name)
                    removed.append(name)
                except SbxError as error:
                    failures.append(error)
                    ok = False
            return ok

        await remove_all(
            [n for n in names if owner_of(n) == self.runner_id and n not in self._live]
        )
        for lock in sorted(self._lock_dir.glob("*.lock")):
            owner = lock.name.removesuffix(".lock")
            if owner == self.runner_id or not _is_runner_id(owner):
                continue
            try:
                fd = _try_lock(lock, create=False)
            except OSError:
                continue  # not a lock file this runner made (a link, unreadable)
            if fd is None:
                continue  # a live runner (or gone meanwhile)
            try:
                if await remove_all([n for n in names if owner_of(n) == owner]):
                    lock.unlink(missing_ok=True)
            finally:
                os.close(fd)
        if failures:
            raise failures[0]
        return removed

    async def aclose(self) -> None:
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is None:
            return
        with contextlib.suppress(OSError):
            (self._lock_dir / f"{self.runner_id}.lock").unlink()
        os.close(self._lock_fd)
        self._lock_fd = None

    def _check_started(self) -> None:
        if not self.started:
            raise SbxError("the sbx runner has not been started: call preflight() first")

    # -- one run ---------------------------------------------------------------------------------

    def check(self, spec: SandboxSpec | CheckedSpec, consumer: Consumer) -> CheckedSpec:
        """One-shot runs and harness batches only; the spec rules plus this runtime's."""
        if consumer not in SERVED:
            refuse(self.kind, consumer, SERVED, WHY_NOT)
        if isinstance(spec, CheckedSpec):
            if spec.checked_for == self.kind:
                return spec
            spec = spec.spec
        check_sbx_spec(spec)
        return CheckedSpec(spec=spec, settings=Settings(), checked_for=self.kind)

    def own(
        self, spec: SandboxSpec | CheckedSpec, consumer: Consumer, **_: Any
    ) -> AbstractAsyncContextManager[OwnedContainer]:
        """Refused at plan time: a microVM has no Docker container to own."""
        refuse(self.kind, consumer, SERVED, WHY_NOT)

    async def run_once(
        self,
        spec: SandboxSpec | CheckedSpec,
        stdin: StdinSource | None = None,
        *,
        on_output: Callable[[Stream, bytes], object] | None = None,
        host_ports: Sequence[int] = (),
    ) -> RunResult:
        """Run ``spec.command`` once in a fresh microVM sandbox and remove it.

        ``host_ports``: host TCP ports the run may connect to (as ``host.docker.internal:PORT``
        inside), each granted by a rule scoped to this sandbox. ``on_output`` is refused: the
        ``sbx exec`` output is captured whole, not streamed.
        """
        check_stdin(stdin, streams=True)
        if on_output is not None:
            raise SpecError("on_output", f"the {self.kind!r} runtime does not stream output")
        if stdin is not None and not isinstance(stdin, bytes):
            raise SpecError("stdin", f"the {self.kind!r} runtime takes stdin as bytes")
        spec = self.check(spec, "run").spec
        self._check_started()
        ports = check_host_ports(list(host_ports))
        timeout_s = spec.limits.timeout_s
        output_bytes = spec.limits.output_bytes
        if timeout_s is None or output_bytes is None:  # validate_spec refused these already
            raise SpecError("limits", "mandatory: set a finite bound")
        run_id = secrets.token_hex(8)
        name = sandbox_name(self.runner_id, run_id)
        env = merge_env(spec.env, runtime=runtime_env(run_id))
        clock = trio.current_time
        timings: dict[str, float] = {}
        self._live.add(name)
        workspace: str | None = None
        try:
            workspace = self._make_workspace(name)
            cwd = spec.workdir or workspace
            links = [(spec.workdir, workspace)] if spec.workdir else []
            exec_argv = sbx_exec_args(self._binary, name, sbx_exec_script(links, cwd), spec.command)
            t0 = clock()
            create = sbx_create_args(
                self._binary,
                name=name,
                agent=self.config.agent,
                workspace=workspace,
                template=spec.image,
                kits=self.config.kits,
                create_args=self.config.create_args,
            )
            await self._checked(create, "create", self.config.create_timeout_s)
            t1 = clock()
            timings["create_s"] = t1 - t0
            for argv in sbx_policy_args(self._binary, name, ports):
                await self._checked(argv, "policy allow network", self.config.command_timeout_s)
            t2 = clock()
            timings["start_s"] = t2 - t1
            done = await self._exec(
                exec_argv, encode_env(env) + (stdin or b""), timeout_s, output_bytes
            )
            timings["run_s"] = clock() - t2
        finally:
            t_remove = clock()
            with trio.CancelScope(shield=True):
                await self._cleanup(name, workspace)
            timings["remove_s"] = clock() - t_remove
        status, exit_code, evidence = _classify(done)
        return RunResult(
            status=status,
            exit_code=exit_code,
            stdout=done.stdout,
            stderr=done.stderr,
            overflowed=done.overflowed,
            container_id=name,
            lease=run_id,
            timings=PhaseTimings(**timings),
            oom_evidence=evidence,
        )

    async def _cleanup(self, name: str, workspace: str | None) -> None:
        """Remove the sandbox (even if create failed: it may exist anyway), then delete the
        workspace; a failed removal is reported before a failed deletion."""
        removal_error: SbxCleanupError | None = None
        try:
            await self._remove(name)
        except SbxCleanupError as error:
            removal_error = error
        finally:
            self._live.discard(name)
        if workspace is not None:
            try:
                self._delete_workspace(name, workspace)
            except SbxCleanupError:
                if removal_error is None:
                    raise
        if removal_error is not None:
            raise removal_error

    def _make_workspace(self, name: str) -> str:
        root = self.config.workspace_root
        path = os.path.realpath(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
        try:
            return check_workspace(path)
        except SpecError:
            os.rmdir(path)
            raise

    def _delete_workspace(self, name: str, workspace: str) -> None:
        try:
            _rmtree(workspace)
        except OSError as error:
            raise SbxCleanupError(
                name, f"the workspace {workspace} could not be deleted: {error}"
            ) from None

    # -- commands --------------------------------------------------------------------------------

    async def _run(self, argv: Sequence[str], timeout: float) -> CompletedCommand:
        return await self._exec(argv, b"", timeout, COMMAND_OUTPUT_CAP)

    async def _checked(self, argv: Sequence[str], what: str, timeout: float) -> CompletedCommand:
        done = await self._run(argv, timeout)
        if not done.ok:
            detail = (done.stderr or done.stdout).decode("utf-8", "replace").strip()
            raise SbxCommandError(what, done.returncode, detail[-2000:])
        return done

    async def _list(self) -> list[str]:
        done = await self._checked(sbx_list_args(self._binary), "ls", self.config.command_timeout_s)
        return parse_sandbox_list(done.stdout)

    async def _remove(self, name: str) -> None:
        """``sbx rm --force``; a failure is confirmed against ``sbx ls`` (gone is gone)."""
        try:
            await self._checked(
                sbx_remove_args(self._binary, name), "rm", self.config.command_timeout_s
            )
            return
        except SbxError as error:
            reason = str(error)
        try:
            still_there = name in await self._list()
        except SbxError as error:
            raise SbxCleanupError(name, f"{reason}; and listing failed: {error}") from None
        if still_there:
            raise SbxCleanupError(name, reason)


def _classify(done: CompletedCommand) -> tuple[Status, int | None, str | None]:
    if done.timed_out:
        return "timed_out", None, None
    if done.overflowed is not None:
        return "output_exceeded", None, None
    code = done.returncode
    if code is None or code < 0:
        raise SbxCommandError(
            "exec", code, f"the sbx client was killed by signal {-code if code else '?'}"
        )
    # sbx reports no OOM flag and no kill events: a 137 is reported as the exit it is, never
    # as an OOM nobody saw (sbxkit/_lifecycle/outcome.py).
    return "exited", code, None
