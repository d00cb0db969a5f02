"""The one-shot lifecycle: validate, create stopped, inspect, attach, start, stream, wait, remove.

Design.md §3 step by step. Whatever happens after creation — exit, timeout, output overflow, a
transport error, the caller's cancellation — ends in the same shielded, time-bounded removal
through the owner, and a removal failure is raised, never swallowed.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import trio

from sbxkit.engine.client import Engine, Waiter, engine_or_open
from sbxkit.engine.frames import Demuxer
from sbxkit.engine.models import ContainerCreate
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import EngineConnectionError, EngineError, ImageError, NotFound
from sbxkit.gpu import GpuCursor
from sbxkit.mounts import ExpectedMount, ResolvedMounts
from sbxkit.outcome import judge_exit
from sbxkit.output import OutputCapture, stream_name
from sbxkit.owner import Owner
from sbxkit.policy import build_create_body, container_name
from sbxkit.preflight import check_daemon, resolve_mounts
from sbxkit.result import PhaseTimings, RunResult, Status, Stream
from sbxkit.settings import Settings
from sbxkit.spec import SandboxSpec, parse_label_list, validate_spec
from sbxkit.supervisor.client import QueueObserver, SupervisedOwner
from sbxkit.supervisor.journal import default_state_dir
from sbxkit.unwrap import plain_async
from sbxkit.verify import check_created

# After the payload exits, its attach stream closes almost at once; don't hang on it
# (moby #41922: an attach stream can outlive its container).
DRAIN_GRACE_S = 2.0
STDIN_CHUNK = 64 * 1024
# Large output arrives faster than 64 KiB wake-ups can drain it; 256 KiB reads quarter them.
ATTACH_READ = 256 * 1024
SIGKILL_EXIT = 137
# The owner's backstop beyond the payload's own time limit: create, start and removal.
LIFETIME_MARGIN_S = 120.0

OutputCallback = Callable[[Stream, bytes], object]
"""``on_output(stream, chunk)``: output as it arrives, within the caps."""

GPU_CURSOR = GpuCursor()
"""This process's round-robin position over the daemon's CDI GPUs (runs share it)."""


def new_lease_id() -> str:
    """A fresh lease id: 128 random bits, hex (also the container name's suffix)."""
    return secrets.token_hex(16)


async def check_image(engine: Engine, image: str) -> None:
    """The image must exist locally (never pulled) and declare no volumes."""
    try:
        inspected = await engine.image_inspect(image)
    except NotFound:
        raise ImageError(
            image, "not present locally; sbxkit never pulls images (load or build it first)"
        ) from None
    volumes = (inspected.config.volumes if inspected.config else None) or {}
    if volumes:
        raise ImageError(
            image,
            "declares VOLUME " + ", ".join(sorted(volumes)) + "; anonymous "
            "volumes bypass the sandbox's writable-storage limits",
        )


async def run(
    spec: SandboxSpec,
    stdin: bytes | None = None,
    *,
    engine: Engine | None = None,
    owner: Owner | None = None,
    socket_path: str | None = None,
    settings: Settings | None = None,
    gpu_cursor: GpuCursor | None = None,
    on_queued: QueueObserver | None = None,
    on_output: OutputCallback | None = None,
) -> RunResult:
    """Run ``spec.command`` once in a fresh hardened sandbox and remove it.

    By default the container is owned by the supervisor process (auto-launched), so it is
    removed even if this process is killed; pass ``owner=InProcessOwner(engine)`` to keep
    ownership in-process (it does not survive a killed caller).

    The supervisor admits the run: while the host's memory budget (or its live-sandbox or
    launch bound) is used up, the run waits its turn in a FIFO queue (``on_queued(ahead,
    waited_s)`` hears about it; ``timings.queued_s`` says how long) and its time limit starts
    only when it starts. A run that can never fit raises ``NeverFits`` (a ``SpecError``) at once.

    Bad input raises SpecError before the daemon is contacted; what only the daemon can judge
    (the image, named volumes, the runtime being registered, CDI GPUs) is refused before
    create. The caller's trio cancel scope is honoured: the container is removed before
    Cancelled propagates.

    ``on_output(stream, chunk)`` (``stream`` is ``"stdout"`` or ``"stderr"``) is called with
    each chunk as it arrives, only with bytes within ``output_bytes``: the callback sees exactly
    what the result keeps. It runs in the run's task; if it raises, the run ends with that error
    (after removal).

    ``sbxkit.run`` (``oneshot.py``) adds ``files=`` and ``measure_usage=`` on top of this.
    """
    settings = effective_settings(settings)
    validate_spec(spec, settings)
    lease = new_lease_id()
    async with engine_or_open(engine, socket_path) as eng:
        body, resolved = await prepare_create(eng, spec, settings, lease, gpu_cursor or GPU_CURSOR)
        owner = owner or default_owner(eng, settings, on_queued)
        return await run_created(
            eng,
            owner,
            spec,
            body,
            lease,
            stdin,
            expected_mounts=resolved.expected,
            on_output=on_output,
        )


async def prepare_create(
    engine: Engine, spec: SandboxSpec, settings: Settings, lease: str, gpu_cursor: GpuCursor
) -> tuple[ContainerCreate, ResolvedMounts]:
    """What only the daemon can judge, then the hardened create body: the image (present, no
    VOLUME), the mounts, the runtime and GPUs. Shared by one-shot runs and sessions."""
    await check_image(engine, spec.image)
    resolved = await resolve_mounts(engine, spec, settings)
    plan = await check_daemon(engine, spec, gpu_cursor)
    body = build_create_body(
        spec,
        lease,
        settings=settings,
        resolved=resolved,
        gpu_devices=plan.gpu_devices,
        podman=engine.is_podman,
    )
    return body, resolved


def default_owner(
    engine: Engine, settings: Settings, on_queued: QueueObserver | None = None
) -> SupervisedOwner:
    """The supervisor of the settings' state dir (``effective_settings`` fills it in)."""
    assert settings.supervisor_state_dir is not None
    return SupervisedOwner(
        engine,
        state_dir=Path(settings.supervisor_state_dir),
        on_queued=on_queued,
        supervisor_command=settings.supervisor_command,
    )


def effective_settings(settings: Settings | None) -> Settings:
    """Fill in what the environment decides: the supervisor state dir (bind sources may not
    overlap it, whichever supervisor owns the run) and the raw ``SBXKIT_ENV``.

    This is the one place ``SBXKIT_ENV`` is read, as bytes: the pure rules parse it only when
    a decision depends on it (bridge networking), so a bad value breaks only what it governs.
    """
    settings = settings or Settings()
    if settings.supervisor_state_dir is None:
        state_dir = str(default_state_dir())
        settings = msgspec.structs.replace(settings, supervisor_state_dir=state_dir)
    if settings.environment is None:
        raw = os.environb.get(b"SBXKIT_ENV")
        if raw is not None:
            settings = msgspec.structs.replace(settings, environment=raw)
    if not settings.labels and os.environ.get("SBXKIT_LABELS", "").strip():
        labels = parse_label_list(os.environ["SBXKIT_LABELS"], "SBXKIT_LABELS")
        settings = msgspec.structs.replace(settings, labels=labels)
    return settings


async def run_created(
    engine: Engine,
    owner: Owner,
    spec: SandboxSpec,
    body: ContainerCreate,
    lease: str,
    stdin: bytes | None,
    *,
    expected_mounts: Sequence[ExpectedMount] = (),
    on_output: OutputCallback | None = None,
) -> RunResult:
    """Steps 3–9 for an already validated body."""
    assert spec.limits.output_bytes is not None
    assert spec.limits.timeout_s is not None
    name = container_name(lease)
    clock = trio.current_time
    container_id: str | None = None
    t0 = clock()
    timings: dict[str, float] = {}
    try:
        lifetime = spec.limits.timeout_s + LIFETIME_MARGIN_S
        container_id = await owner.create(lease, name, body, lifetime_s=lifetime)
        inspected = await engine.container_inspect(container_id)
        check_created(
            inspected,
            body,
            lease=lease,
            name=name,
            container_id=container_id,
            expected_mounts=expected_mounts,
            podman=engine.is_podman,
        )
        t1 = clock()
        timings["queued_s"] = queued = owner.queued_s(lease)
        timings["create_s"] = t1 - t0 - queued
        attach = await engine.container_attach(container_id, stdin=True)
        try:
            waiter = await engine.container_wait(container_id, "next-exit")
            try:
                await engine.container_start(container_id)
                await owner.started(lease)
                t2 = clock()
                timings["start_s"] = t2 - t1
                outcome = await _supervise(
                    attach,
                    waiter,
                    stdin,
                    spec.limits.output_bytes,
                    spec.limits.timeout_s,
                    on_output,
                )
                timings["run_s"] = clock() - t2
            finally:
                await waiter.aclose()
        finally:
            await attach.aclose()
        status, exit_code, evidence = outcome.status, None, None
        if status == "exited":
            # Only a payload that really exited has an exit code; after an overflow or a
            # timeout the code (if any) is sbxkit's kill, not the payload's answer.
            exit_code = outcome.exit_code
            status, evidence = await judge_exit(engine, container_id, exit_code)
    finally:
        t_remove = clock()
        with trio.CancelScope(shield=True):
            await owner.remove(lease, name, container_id)
        timings["remove_s"] = clock() - t_remove
    assert container_id is not None
    return RunResult(
        status=status,
        exit_code=exit_code,
        stdout=outcome.capture.stdout,
        stderr=outcome.capture.stderr,
        overflowed=outcome.capture.overflowed,
        container_id=container_id,
        lease=lease,
        timings=PhaseTimings(**timings),
        oom_evidence=evidence if status == "oom_killed" else None,
        kill_evidence=evidence if status == "killed" else None,
    )


class _Outcome:
    def __init__(self, capture: OutputCapture) -> None:
        self.capture = capture
        self.status: Status = "exited"
        self.exit_code: int | None = None


@plain_async  # its nursery's errors (and Ctrl-C) leave as themselves, not as a group
async def _supervise(
    attach: HijackedStream,
    waiter: Waiter,
    stdin: bytes | None,
    max_output: int,
    timeout_s: float,
    on_output: OutputCallback | None = None,
) -> _Outcome:
    """Feed stdin, stream output under the caps, wait for exit — all within the time limit."""
    outcome = _Outcome(OutputCapture(max_output))
    drained = trio.Event()
    with trio.move_on_after(timeout_s) as timer:
        async with trio.open_nursery() as nursery:

            async def pump_output() -> None:
                demuxer = Demuxer()
                while chunk := await attach.receive_some(ATTACH_READ):
                    for stream_id, data in demuxer.feed(chunk):
                        name = stream_name(stream_id)
                        before = outcome.capture.kept(name)
                        overflowed = outcome.capture.add(stream_id, data)
                        kept = outcome.capture.kept(name) - before
                        if on_output is not None and kept:
                            on_output(name, bytes(data[:kept]))  # never past the cap
                        if overflowed:
                            outcome.status = "output_exceeded"
                            nursery.cancel_scope.cancel()
                            return
                demuxer.close()
                drained.set()

            nursery.start_soon(_feed_stdin, attach, stdin)
            nursery.start_soon(pump_output)
            reply = await waiter.result()
            if reply.error is not None and reply.error.message:
                raise EngineError("POST", "wait", 500, reply.error.message)
            if outcome.status == "exited":
                outcome.exit_code = reply.status_code
            with trio.move_on_after(DRAIN_GRACE_S):
                await drained.wait()
            nursery.cancel_scope.cancel()
    if timer.cancelled_caught and outcome.status == "exited" and outcome.exit_code is None:
        outcome.status = "timed_out"
    return outcome


async def _feed_stdin(attach: HijackedStream, stdin: bytes | None) -> None:
    """Write stdin, then half-close so the payload sees EOF. A payload that stopped reading
    (or already exited) closes the pipe: that is its business, not an error."""
    try:
        if stdin:
            view = memoryview(stdin)
            for offset in range(0, len(view), STDIN_CHUNK):
                await attach.send_all(bytes(view[offset : offset + STDIN_CHUNK]))
        await attach.send_eof()
    except EngineConnectionError:
        pass
