"""A one-shot payload on the kernel path: the parallel of
``sbxkit._lifecycle.attached.run_attached``.

The container was created with its stdio on host FIFOs (``plan.io_dir``) and a command that
waits for the host's go (``scripts.cold_command``). Here: the host's ends are opened, the
container started, its init opened as a verified pidfd while the shell is blocked, the shell's
sync byte awaited, then the go line and stdin written and the run supervised
(``supervise.supervise_kernel``). An exit by itself (≤ 128) is final at once, on the kernel's
word; a signal exit waits for the daemon's evidence, as on the daemon's path
(docs/security.md). ``NotAlive``: the shell never ran — neither did the payload — and the
caller may run it on the daemon's path instead.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import trio

from sbxkit._kernel.fifos import open_host_ends
from sbxkit._kernel.init import ContainerInit, InitUnverified
from sbxkit._kernel.initpid import cgroup_layout_known, init_pid_on_host, learn_cgroup_layout
from sbxkit._kernel.scripts import GO_LINE
from sbxkit._lifecycle.attached import Outcome, OutputCallback, Ran, RunTimes
from sbxkit._lifecycle.kernel_watch import (
    Exited,
    Feed,
    KernelIO,
    KernelSupervise,
    NotAlive,
    supervise_kernel,
)
from sbxkit._lifecycle.outcome import SIGNAL_EXIT_BASE, Verdict
from sbxkit._lifecycle.owned import OwnedContainer
from sbxkit._model.result import Evidence
from sbxkit._util.stdin import StdinSource
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError

__all__ = [
    "ALIVE_LIMIT_S",
    "Judge",
    "NotAlive",
    "OwnerLaunch",
    "kernel_verdict",
    "run_on_fifos",
    "start_on_fifos",
    "started_on_fifos",
]

ALIVE_LIMIT_S = 30.0
"""The longest the shell may take to say it runs once started."""
DAEMON_EVIDENCE_S = 30.0
DEATH_POLL_S = 0.05


async def _died(engine: Engine, container_id: str) -> int:
    """The exit of a container whose init could not be held as a pidfd (another PID
    namespace): the daemon's word, polled while the shell waits."""
    while True:
        state = (await engine.container_inspect(container_id)).state
        if not state.running:
            return state.exit_code
        await trio.sleep(DEATH_POLL_S)


class OwnerLaunch(Protocol):
    """A container its owner starts (``OwnedContainer.launched_by_owner``)."""

    async def said_or_launched(self, said: Callable[[], Awaitable[None]]) -> bool: ...

    async def launch_answer(self) -> None: ...


async def start_on_fifos(
    engine: Engine,
    container_id: str,
    io_dir: str,
    start: Callable[[], Awaitable[None]],
    launched: OwnerLaunch | None = None,
    *,
    runtime: str | None,
) -> tuple[KernelIO, Exited, Evidence]:
    """Open the host's ends, ``start()`` the container, hold its init, wait for the shell's
    word; the streams (the caller closes them), how to wait for the exit, and which evidence
    that wait is. ``NotAlive`` (ends closed) if the shell never ran.

    ``launched``: its owner starts it instead. Whichever comes first is waited for, the
    shell's word or the daemon's answer to that start (whose work after the start then
    overlaps the payload's run); the init is held either way while the shell waits for its
    go line — where the host does not know the daemon's cgroup layout yet, once the daemon
    answered (its ``State.Pid`` names the init from then on). ``runtime``: the create body's
    (``HostConfig.Runtime``), whose cgroup layout the init is looked for in."""
    io = KernelIO.of(open_host_ends(Path(io_dir)))  # opens only: the FIFOs never block here
    try:
        if launched is None:
            await start()
        else:
            await launched.said_or_launched(
                functools.partial(trio.lowlevel.wait_readable, io.stderr.fileno())
            )
            if not cgroup_layout_known(engine.socket_path, runtime):
                await launched.launch_answer()  # State.Pid is the daemon's once it answered
        exited: Exited
        evidence: Evidence = "kernel"
        try:
            io.init = await _verified_init(engine, container_id, runtime)
            exited = io.init.exited
            died = exited
        except InitUnverified:
            # Alive but not a process of ours to hold, or already dead: the daemon decides.
            evidence = "daemon"
            died = exited = lambda: _died(engine, container_id)
        await io.alive(died, ALIVE_LIMIT_S)
    except BaseException:
        await io.aclose()
        raise
    return io, exited, evidence


async def _verified_init(engine: Engine, container_id: str, runtime: str | None) -> ContainerInit:
    """The started container's init, verified: found on the host where its daemon's cgroup
    layout under ``runtime`` is known (``initpid``), else by ``State.Pid``. ``InitUnverified``
    if neither is."""
    pid = init_pid_on_host(engine.socket_path, runtime, container_id)
    if pid is not None:
        with contextlib.suppress(InitUnverified):
            return ContainerInit.verified(pid, container_id)
    pid = (await engine.container_inspect(container_id)).state.pid
    init = ContainerInit.verified(pid, container_id)
    learn_cgroup_layout(engine.socket_path, runtime, init.oom.directory, container_id)
    return init


@asynccontextmanager
async def started_on_fifos(
    box: OwnedContainer, *, launched: bool = True
) -> AsyncIterator[tuple[KernelIO, Exited, Evidence]]:
    """``start_on_fifos`` for an owned container; the ends are closed when the block ends.
    ``launched``: as ``OwnedContainer.start``'s."""
    assert box.plan.io_dir is not None
    io, exited, evidence = await start_on_fifos(
        box.engine,
        box.container_id,
        box.plan.io_dir,
        functools.partial(box.start, launched=launched),
        box if box.launched_by_owner else None,
        runtime=box.plan.body.host_config.runtime if box.plan.body.host_config else None,
    )
    try:
        yield io, exited, evidence
    finally:
        await io.aclose()


Judge = Callable[[int | None], Awaitable[Verdict]]
"""Judges a signal exit on the daemon's evidence (``OwnedContainer.judge``)."""


async def kernel_verdict(
    engine: Engine,
    container_id: str,
    judge: Judge,
    outcome: Outcome,
    evidence: Evidence,
    init: ContainerInit | None,
) -> tuple[Verdict, int | None, Evidence]:
    """The verdict of a run on the kernel path: an exit by itself (≤ 128) on the kernel's
    word alone — with a child's OOM kill noted from the sandbox's memory cgroup, read on the
    host, or from the daemon's records when the cgroup was gone before the host could tell —
    and a signal exit on the daemon's evidence once the daemon has seen the exit."""
    if outcome.status != "exited":
        return Verdict(status=outcome.status), None, evidence
    code = outcome.exit_code
    if evidence == "kernel" and code is not None and code <= SIGNAL_EXIT_BASE:
        oom = await init.oom_kills_since() if init is not None else None
        if oom == 0:  # the memory cgroup, read on the host: no process of it was OOM-killed
            return Verdict(status="exited"), code, "kernel"
        if oom is not None:
            note = (
                f"the sandbox's memory cgroup counted {oom} OOM kill(s): a process in the "
                f"sandbox was OOM-killed; the payload exited {code} by itself"
            )
            return Verdict(status="exited", oom_evidence=note), code, "kernel"
        # The cgroup was gone before it was read: whether a child was OOM-killed is the
        # daemon's to tell. The status and the code stay the kernel's: the daemon only notes.
        await _daemon_saw_exit(engine, container_id)
        return await judge(code), code, "kernel"
    await _daemon_saw_exit(engine, container_id)
    return await judge(code), code, "daemon"  # the status the signal exit had, as ever


async def _daemon_saw_exit(engine: Engine, container_id: str) -> None:
    """Wait (bounded) until the daemon has seen the exit: its ``OOMKilled`` and events are
    its own once it did."""
    with trio.move_on_after(DAEMON_EVIDENCE_S), contextlib.suppress(SbxError):
        waiter = await engine.container_wait(container_id, "not-running")
        try:
            await waiter.result()
        finally:
            await waiter.aclose()


async def run_on_fifos(
    box: OwnedContainer,
    stdin: StdinSource | None,
    on_output: OutputCallback | None = None,
    supervise: KernelSupervise = supervise_kernel,
) -> Ran:
    """Run the box's command once on the kernel path; the time limit starts once the shell
    said it runs (the payload starts at the go line). ``NotAlive``: it never ran.
    ``supervise`` watches the run (this process, unless the run was handed off)."""
    times = RunTimes()
    # Its owner hears the launch is over right after the go line, not before it (AfterGo). A
    # governed network's listeners go in after the start, which that message precedes; an
    # owner that started the container itself knew when the daemon answered.
    after_go = None if box.governed or box.launched_by_owner else box.launched
    async with started_on_fifos(box, launched=box.governed) as (io, exited, evidence):
        times.began()
        feed = Feed(GO_LINE, stdin, box.output_bytes, box.timeout_s, on_output)
        outcome = await supervise(io, exited, feed, after_go)
        times.ended()
        verdict, exit_code, evidence = await kernel_verdict(  # the init's OOM watch still open
            box.engine, box.container_id, box.judge, outcome, evidence, io.init
        )
    return times.ran(verdict, exit_code, outcome.capture, evidence)
