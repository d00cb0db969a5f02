"""Long-lived sandboxes: ``open_sandbox``, ``Sandbox.exec`` and file transfer.

A session is one hardened container (the same create body, post-create verification and owner
as a one-shot run, docs/security.md) whose own command only keeps it alive — ``sleep`` under the
init process. Work happens in Docker execs. The owner (the supervisor by default) holds the
lease with a lifetime deadline of ``spec.limits.timeout_s``: the whole session's time limit.
Leaving the ``async with`` block — normally, by an exception or by cancellation — removes the
container through the owner in a shielded, time-bounded scope, and a removal failure is raised.

Ending one exec. The Engine API cannot kill an exec (moby #9167), so every exec runs through a
wrapper that makes the command the leader of a new process group and session and records that
group's id in the sandbox's scratch space::

    sh -c 'f=/tmp/.sbxkit-exec-TOKEN; setsid sh -c "echo $$ >$f.pid; exec CMD"'

On a timeout, an output overflow, an error or the caller's cancellation, a second exec sends
``SIGKILL`` to the whole group (``kill -KILL -PGID``). The outer ``sh`` stays the exec's main
process, so ``setsid`` never has to fork (a process-group leader cannot call ``setsid()``, and
runc makes every exec's main process one: busybox's ``setsid`` would then fork and exit at
once). A wrapper that has not yet recorded its group is found by its token in ``/proc`` and
killed before it starts the command; nothing a payload writes can cancel an exec.

A descendant that leaves the group (``setsid``, ``setpgid``) escapes that kill; it ends when
the sandbox closes, because removing the container kills every process in it.

Files. The sandbox's root filesystem is read-only and its writable scratch is a tmpfs, which the
Engine's archive endpoints cannot see (Docker 20.10: ``PUT`` is refused with "container rootfs is
marked read-only", ``GET`` reads the image's directory underneath the tmpfs). So
``put_files``/``get_files`` run ``tar`` inside the sandbox through the same exec machinery (as the
sandbox user, under a time limit and a byte cap), and ``sbxkit._consumers.archive`` builds and
parses the archives on this side with the confinement rules.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Unpack

import trio

from sbxkit._consumers.archive import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    build_tar,
    check_missing,
    check_root,
    check_transfer,
    confine,
    confine_dir,
    expect_exactly,
    member_paths,
    parse_tar,
    relative_name,
    stream_cap,
)
from sbxkit._consumers.dirs import DirTransfer, StdoutSink
from sbxkit._consumers.exec_pump import discard_until_eof, pump_exec
from sbxkit._consumers.exec_scripts import (
    GET_SCRIPT,
    KILL_SCRIPT,
    PUT_SCRIPT,
    wrapped_exec,
)
from sbxkit._consumers.handle import detach_sandbox
from sbxkit._consumers.process_log import DEFAULT_MAX_PROCESSES
from sbxkit._consumers.processes import ProcessTable, running, start_process
from sbxkit._lifecycle.attached import OutputCallback
from sbxkit._lifecycle.metrics import (
    DEFAULT_INTERVAL_S,
    MetricsReader,
    check_interval,
    metric_stream,
)
from sbxkit._lifecycle.outcome import SIGNAL_EXIT_BASE, Verdict, judge_exit
from sbxkit._lifecycle.output import OutputCapture
from sbxkit._lifecycle.owned import KILL_BUDGET_S, OwnedContainer, SandboxExit
from sbxkit._lifecycle.usage import USAGE_SCRIPT, parse_usage
from sbxkit._model.call_checks import check_argv as _check_argv
from sbxkit._model.call_checks import check_stdin
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import spec_owned_keys
from sbxkit._model.result import Metrics, PhaseTimings, RunResult, Status, Usage
from sbxkit._model.rules import merge_env, runtime_env
from sbxkit._model.spec import SandboxSpec, body_ids, check_limit, validate_workdir
from sbxkit._plan.plan import CheckedSpec
from sbxkit._plan.policy import SCRATCH_PATH
from sbxkit._protocol.wire import Expiring
from sbxkit._util.public import publish
from sbxkit._util.stdin import StdinSource
from sbxkit.backends.base import Backend
from sbxkit.backends.docker import DockerOptions, docker_backend
from sbxkit.engine.execapi import ExecCreate, exec_create, exec_inspect, exec_start
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import (
    ArchiveError,
    Conflict,
    NotFound,
    SandboxExpired,
    SandboxUnusable,
    SbxError,
)

__all__ = [
    "Sandbox",
    "SandboxExit",
    "SandboxExpired",
    "SandboxUnusable",
    "open_sandbox",
    "serving",
]

KEEPALIVE_MARGIN_S = 60
"""The keep-alive ``sleep`` outlasts the session's time limit: the owner's removal at the
lifetime deadline, not the container stopping by itself, ends an abandoned session."""
DRAIN_GRACE_S = 3.0
"""After its group is killed, how long an exec's stream may take to close (the daemon closes
it up to 2 s after the exec's main process exits when a descendant still holds its pipes)."""
KILL_ATTEMPTS = 3
EXIT_POLL_S = 5.0

# --- the session ---------------------------------------------------------------------------


class OwnedView:
    """What every long-lived handle (sandbox, PTY, stdio worker) says about its container."""

    _box: OwnedContainer

    @property
    def container_id(self) -> str:
        return self._box.container_id

    @property
    def lease(self) -> str:
        return self._box.lease

    @property
    def deadline(self) -> float:
        """trio clock time at which the sandbox's time limit ends it."""
        return self._box.deadline


class Sandbox(OwnedView, DirTransfer):
    """A running long-lived sandbox. Use it only inside its ``open_sandbox`` block."""

    def __init__(
        self, box: OwnedContainer, files_root: str, max_processes: int = DEFAULT_MAX_PROCESSES
    ) -> None:
        self._box = box
        self.files_root = files_root
        self._unusable: str | None = None
        self.processes = ProcessTable(max_processes)  # background ones (processes.py)

    start = start_process
    detach = detach_sandbox  # hand it to another process (handle.py, reattach.py)

    @property
    def spec(self) -> SandboxSpec:
        return self._box.spec

    @property
    def user(self) -> str:
        """``UID:GID`` every command in it runs as: the spec's, or the sandbox's own uid."""
        return self._box.user

    async def denials(self) -> tuple[Denial, ...]:
        """What the sandbox's governed network refused so far (docs/network.md)."""
        return await self._box.denials()

    async def ports(self) -> tuple[PortForward, ...]:
        """Its inbound ports as the host reaches them (docs/network.md, "Inbound ports"):
        ``127.0.0.1:HOST_PORT`` forwards to the sandbox's own ``127.0.0.1:PORT``."""
        return await self._box.ports()

    # -- exec ---------------------------------------------------------------------------------

    async def exec(
        self,
        argv: Sequence[str],
        stdin: bytes | None = None,
        *,
        timeout: float | None = None,
        max_output: int | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        """Run ``argv`` in the sandbox as the sandbox user; return a one-shot ``RunResult``.

        ``timeout`` (default: the spec's ``timeout_s``) bounds start to exit; ``max_output``
        (default: the spec's ``output_bytes``) caps stdout and stderr each: exactly N bytes
        pass, N + 1 is ``output_exceeded``. On a timeout, an overflow, an error or
        cancellation the exec's whole process group is killed before this returns or raises.
        ``stdin`` is fed then closed; without it the command's stdin is empty.
        ``on_output(stream, chunk)`` gets the output as it arrives, within the cap.
        """
        command = _check_argv(argv)
        check_stdin(stdin)
        timeout = self._box.timeout_s if timeout is None else timeout
        check_limit("timeout_s", timeout, "timeout")
        max_output = self._box.output_bytes if max_output is None else max_output
        check_limit("output_bytes", max_output, "max_output")
        validate_workdir(workdir, "workdir")
        env_list: list[str] | None = None
        if env:
            owned = spec_owned_keys(self.spec.network)  # the container's values stand
            merged = merge_env(dict(env), runtime=runtime_env(self.lease), field="env", owned=owned)
            env_list = [f"{key}={value}" for key, value in sorted(merged.items())]
        return await self._run(
            command, stdin, timeout, max_output, workdir, env_list, on_output=on_output
        )

    def _check_usable(self) -> None:
        if self._unusable is not None:
            raise SandboxUnusable(self.container_id, self._unusable)

    async def _run(
        self,
        argv: list[str],
        stdin: StdinSource | None,
        timeout: float,
        max_output: int,
        workdir: str | None = None,
        env: list[str] | None = None,
        on_stdout: StdoutSink | None = None,
        on_output: OutputCallback | None = None,
    ) -> RunResult:
        self._check_usable()
        engine = self._box.engine
        token = secrets.token_hex(8)
        body = wrapped_exec(
            token, argv, user=self._box.user, stdin=stdin is not None, env=env, workdir=workdir
        )
        clock = trio.current_time
        timings: dict[str, float] = {}
        began = time.time()  # the daemon stamps its events with this host's clock
        t0 = clock()
        try:
            exec_id = await exec_create(engine, self.container_id, body)
        except (NotFound, Conflict) as exc:
            self._unusable = f"its container is not running ({exc.message})"
            raise SandboxUnusable(self.container_id, self._unusable) from exc
        t1 = clock()
        timings["create_s"] = t1 - t0
        capture = OutputCapture(max_output)
        status: Status = "exited"
        stream: HijackedStream | None = None
        may_run = False
        ended = False
        t2 = t1
        try:
            with trio.move_on_after(timeout):
                may_run = True  # from here the daemon may run it, even if we are cancelled
                stream = await exec_start(engine, exec_id)
                t2 = clock()
                timings["start_s"] = t2 - t1
                ended, overflowed = await pump_exec(stream, capture, stdin, on_stdout, on_output)
                if overflowed:
                    status = "output_exceeded"
            if not ended and status == "exited":
                status = "timed_out"
            timings["run_s"] = clock() - t2
        finally:
            if may_run and not ended:
                with trio.CancelScope(shield=True):
                    t_kill = clock()
                    await self._end_group(token, stream)
                    timings["remove_s"] = clock() - t_kill
            if stream is not None:
                await stream.aclose()
        exit_code: int | None = None
        verdict = Verdict(status=status)
        if status == "exited":
            exit_code, ending = await self._exit_or_ending(exec_id)
            if ending is not None:  # the owner removed the container: the session is over
                self._unusable = f"sbxkit ended it: {ending.reason}"
                verdict = Verdict(status=ending.status, kill_evidence=self._unusable)
            elif exit_code is not None and exit_code > SIGNAL_EXIT_BASE:
                # An exit of its own stands: no evidence to read. Only this exec's window
                # counts: an earlier exec's OOM is not this one's.
                verdict = await judge_exit(engine, self.container_id, exit_code, since=began)
            if verdict.status != "exited":
                exit_code = None
        return RunResult(
            status=verdict.status,
            exit_code=exit_code,
            stdout=capture.stdout,
            stderr=capture.stderr,
            overflowed=capture.overflowed,
            container_id=self.container_id,
            lease=self.lease,
            timings=PhaseTimings(**timings),
            oom_evidence=verdict.oom_evidence,
            kill_evidence=verdict.kill_evidence,
        )

    async def _exit_or_ending(self, exec_id: str) -> tuple[int | None, Expiring | None]:
        """The exec's exit code and, for a signal exit or a gone container, the owner's word
        if it ended the container itself (a writable image past its bound, its lifetime)."""
        try:
            exit_code: int | None = await self._exit_code(exec_id)
        except NotFound:
            exit_code = None
        if exit_code is not None and exit_code <= SIGNAL_EXIT_BASE:
            return exit_code, None
        ending = await self._box.owner_ending()
        if ending is None and exit_code is None:
            self._unusable = "its container is gone"
            raise SandboxUnusable(self.container_id, self._unusable)
        return exit_code, ending

    async def _exit_code(self, exec_id: str) -> int:
        """The exec's exit code; its stream closed, so it is exiting if not yet exited."""
        engine = self._box.engine
        delay = 0.005
        with trio.move_on_after(EXIT_POLL_S):
            while True:
                info = await exec_inspect(engine, exec_id)
                if not info.running and info.exit_code is not None:
                    return info.exit_code
                await trio.sleep(delay)
                delay = min(delay * 2, 0.2)
        raise SandboxUnusable(
            self.container_id, f"exec {exec_id[:12]} still running {EXIT_POLL_S:g} s after EOF"
        )

    async def _end_group(self, token: str, stream: HijackedStream | None) -> None:
        """Kill the exec's process group from inside (shielded by the caller, time-bounded).

        The exec's own stream is read and discarded all the while: left unread, a command that
        was still writing in bulk (``yes``, ``cat`` of a large file) fills the socket, dockerd's
        copy of that exec's output blocks, and with it the daemon's handling of the container's
        exits, so the killer's own stream never closes (issue 27.5: 20 s, then the container was
        killed). If the killer cannot run (e.g. the pids limit is exhausted by the very group it
        should end), the container is killed instead: the guarantee holds and the sandbox is
        marked unusable. A container that is already gone has no processes left to kill.
        """
        drained = trio.Event()
        async with trio.open_nursery() as nursery:
            if stream is not None:
                nursery.start_soon(discard_until_eof, stream, drained)
            else:
                drained.set()
            problem = await self._kill_group(token)
            if problem is not None:
                self._unusable = f"an exec's process group could not be killed ({problem}); " + (
                    "the container was killed instead"
                )
                # If even this fails, removal on close still ends everything.
                with trio.move_on_after(KILL_BUDGET_S), contextlib.suppress(SbxError):
                    await self._box.kill()
            with trio.move_on_after(DRAIN_GRACE_S):
                await drained.wait()
            nursery.cancel_scope.cancel()

    async def _kill_group(self, token: str) -> str | None:
        """Run the killer, retrying within ``KILL_BUDGET_S``; what went wrong, or None."""
        problem: str | None = None
        with trio.move_on_after(KILL_BUDGET_S) as budget:
            for attempt in range(KILL_ATTEMPTS):
                try:
                    await self._run_killer(token)
                    problem = None
                    break
                except (NotFound, Conflict) as exc:
                    problem = None  # the container is gone or stopped: nothing runs in it
                    self._unusable = f"its container is not running ({exc})"
                    break
                except SbxError as exc:
                    problem = str(exc)
                    await trio.sleep(0.05 * (attempt + 1))
        if budget.cancelled_caught and problem is None:
            problem = f"the killer did not finish within {KILL_BUDGET_S:g} s"
        return problem

    async def _run_killer(self, token: str) -> None:
        engine = self._box.engine
        body = ExecCreate(
            cmd=["sh", "-c", KILL_SCRIPT, "sbxkit-kill", token],
            attach_stdin=False,
            attach_stdout=True,
            attach_stderr=True,
            tty=False,
            privileged=False,
            user=self._box.user,
        )
        exec_id = await exec_create(engine, self.container_id, body)
        killer = await exec_start(engine, exec_id)
        try:
            output = b""
            while chunk := await killer.receive_some():
                output += chunk[:4096]
        finally:
            await killer.aclose()
        code = await self._exit_code(exec_id)
        if code != 0:
            raise SbxError(f"the killer exited {code}: {output[:200]!r}")

    async def usage(self) -> Usage:
        """The sandbox's peak memory and CPU time so far, read from its cgroup
        (sbxkit/_lifecycle/usage.py): the high-water mark since it started, and the CPU time of
        everything it ran."""
        result = await self._run(["sh", "-c", USAGE_SCRIPT], None, self._box.timeout_s, 4096)
        if not result.ok:
            raise SbxError(f"reading the sandbox's cgroup failed: {result.stderr[:200]!r}")
        return parse_usage(result.stdout.decode("ascii", "replace"))

    def metrics(self, interval_s: float = DEFAULT_INTERVAL_S) -> AsyncIterator[Metrics]:
        """A reading of the sandbox's CPU, memory, pids and I/O every ``interval_s`` seconds,
        taken from its cgroup on the host (sbxkit/_lifecycle/metrics.py): no exec, nothing the
        payload can write. Ends when the sandbox is gone; ``MetricsUnavailable`` where this
        host cannot read its cgroup (a remote daemon, a file this user may not read)."""
        interval_s = check_interval(interval_s)
        self._check_usable()
        return metric_stream(self._box.engine, self.container_id, interval_s)

    async def metrics_reader(self) -> MetricsReader:
        """The sandbox's cgroup, found once: ``read()`` takes a reading (or None once the
        sandbox is gone). What ``metrics`` polls; the ``aio`` and ``blocking`` faces too."""
        self._check_usable()
        return await MetricsReader.open(self._box.engine, self.container_id)

    # -- files --------------------------------------------------------------------------------

    async def put_files(
        self,
        files: Mapping[str, bytes],
        dest_dir: str = ".",
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        timeout: float | None = None,
    ) -> None:
        """Write ``files`` (relative name → content) under ``dest_dir`` in the sandbox.

        ``dest_dir`` is relative to the file root or absolute under it; names are relative,
        without ``..``. At most ``max_files`` files and ``max_bytes`` bytes of content. Existing
        directories keep their modes; a file where a directory is named, or the reverse, a
        link on the way, a failing ``tar`` (no space, the file size limit): ``ArchiveError``."""
        destination = confine_dir(dest_dir, self.files_root)
        uid, gid = body_ids(self._box.user)
        tar = build_tar(
            files,
            uid=uid,
            gid=gid,
            mtime=int(time.time()),
            max_files=max_files,
            max_bytes=max_bytes,
        )
        relative = destination[len(self.files_root) :].strip("/")
        on_the_way = member_paths({relative: b""}) if relative else []
        named = {relative_name(name) for name in files}
        inside = [(f"{relative}/{n}".lstrip("/"), n in named) for n in member_paths(files)]
        folders = [*on_the_way, *(path for path, is_file in inside if not is_file)]
        written = [path for path, is_file in inside if is_file]
        result = await self._run(
            [
                "sh",
                "-c",
                PUT_SCRIPT,
                "sbxkit-put",
                self.files_root,
                destination,
                str(len(folders)),
                *folders,
                *written,
            ],
            tar,
            self._box.timeout_s if timeout is None else timeout,
            64 * 1024,
        )
        check_transfer(result, destination, "writing")

    async def get_files(
        self,
        paths: Sequence[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        timeout: float | None = None,
    ) -> dict[str, bytes]:
        """Read regular files from the sandbox: ``{path as given: content}``.

        Each path is relative to the file root or absolute under it. Links, directories,
        devices and FIFOs are refused (``ArchiveError``), as are more than ``max_files`` files
        or ``max_bytes`` bytes of content.
        """
        if isinstance(paths, str):
            raise ArchiveError(paths, "paths must be a list of paths, not one string")
        wanted: dict[str, str] = {}
        for path in paths:
            clean = confine(path, self.files_root)
            if clean in wanted.values():
                raise ArchiveError(path, "the same file is requested twice")
            wanted[path] = clean
        if not wanted:
            return {}
        if len(wanted) > max_files:
            raise ArchiveError("*", f"more than {max_files} files")
        result = await self._run(
            ["sh", "-c", GET_SCRIPT, "sbxkit-get", self.files_root]
            + ["./" + clean for clean in wanted.values()],
            None,
            self._box.timeout_s if timeout is None else timeout,
            stream_cap(max_bytes, len(wanted)),
        )
        if result.status == "output_exceeded" and result.overflowed == "stdout":
            raise ArchiveError("*", f"more than {max_bytes} bytes of file content")
        check_missing(result, wanted, self.files_root)
        check_transfer(result, self.files_root, "reading")
        found = parse_tar(result.stdout, max_files=max_files, max_bytes=max_bytes)
        expect_exactly(found, wanted.values())
        return {path: found[clean] for path, clean in wanted.items()}


def keepalive_command(timeout_s: float) -> list[str]:
    """``sleep`` a little longer than the session may last (the owner removes it first)."""
    return ["sleep", str(math.ceil(timeout_s) + KEEPALIVE_MARGIN_S)]


@asynccontextmanager
async def open_sandbox(
    spec: SandboxSpec | CheckedSpec,
    *,
    files_root: str = SCRATCH_PATH,
    backend: Backend | None = None,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    **docker: Unpack[DockerOptions],
) -> AsyncIterator[Sandbox]:
    """A long-lived sandbox for ``Sandbox.exec``, ``put_files`` and ``get_files``.

    ``spec.command`` is replaced by a keep-alive ``sleep`` (the image needs one); everything
    else — image checks, hardened body, mounts, verification, limits — is as for ``run``.
    ``spec.limits.timeout_s`` is the whole session's time limit: when it passes, the block is
    cancelled, the container removed and ``SandboxExpired`` raised. However the block ends,
    the container is removed through the owner (the supervisor by default) before this
    returns; a removal failure raises ``CleanupError``.

    ``files_root`` (default ``/tmp``, the scratch tmpfs) confines file transfers; it must be
    writable by the sandbox user (the root filesystem is read-only). ``backend`` (instead of
    the engine, owner, settings and socket) is a ``DockerBackend`` you configured; a backend
    that cannot serve sessions refuses before anything is created. ``max_processes`` bounds the
    background processes (``Sandbox.start``) running at once.
    """
    check_root(files_root)
    limits = spec.spec.limits if isinstance(spec, CheckedSpec) else spec.limits
    check_limit("timeout_s", limits.timeout_s)
    assert limits.timeout_s is not None
    chosen = docker_backend(backend, **docker)
    keepalive = keepalive_command(limits.timeout_s)
    async with chosen.own(spec, "session", command=keepalive) as box:
        await box.start()
        async with serving(box, files_root, max_processes) as sandbox:
            yield sandbox


@asynccontextmanager
async def serving(
    box: OwnedContainer, files_root: str, max_processes: int
) -> AsyncIterator[Sandbox]:
    """The session on a started container, until its block ends or its deadline passes
    (``SandboxExpired``); its background processes' tasks end before the caller removes it."""
    sandbox = Sandbox(box, files_root, max_processes)
    try:
        async with running(sandbox.processes):
            with trio.CancelScope(deadline=box.deadline) as scope:
                yield sandbox
    finally:
        sandbox._unusable = "the sandbox was closed"
    if scope.cancelled_caught:
        # from None: the deadline's trio.Cancelled is how, not what; it is no cause to show
        raise SandboxExpired(box.lease, box.container_id, box.timeout_s) from None


publish(__name__, globals())  # public names show as sbxkit.NAME
