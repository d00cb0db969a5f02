"""A one-shot payload on an owned container: attach, start, stream, wait (docs/architecture.md,
"The one-shot lifecycle", steps 5–8).

``run_attached`` runs a verified, still stopped container's command once: it attaches (before
start, so no output is lost), registers the ``next-exit`` wait, starts, feeds stdin, streams
output under the caps and waits for the exit, all within the time limit. The caller's
``owned_container`` block removes the container afterwards, whatever happened here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from sbxkit._lifecycle.outcome import Verdict
from sbxkit._lifecycle.output import OutputCapture, stream_name
from sbxkit._lifecycle.owned import OwnedContainer, attached
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.result import (
    Evidence,
    PhaseTimings,
    RunResult,
    Status,
    Stream,
    own_exit_code,
)
from sbxkit._util.stdin import StdinSource, write_stdin
from sbxkit._util.unwrap import plain_async
from sbxkit.engine.client import Waiter
from sbxkit.engine.frames import Demuxer
from sbxkit.engine.transport import HijackedStream
from sbxkit.errors import EngineConnectionError, EngineError

__all__ = ["Outcome", "OutputCallback", "Ran", "RunTimes", "feed_stdin", "run_attached"]

# After the payload exits, its attach stream closes almost at once; don't hang on it
# (moby #41922: an attach stream can outlive its container).
DRAIN_GRACE_S = 2.0
# Large output arrives faster than 64 KiB wake-ups can drain it; 256 KiB reads quarter them.
ATTACH_READ = 256 * 1024

OutputCallback = Callable[[Stream, bytes], object]
"""``on_output(stream, chunk)``: output as it arrives, within the caps."""


@dataclass(frozen=True, kw_only=True)
class Ran:
    """How the payload ended; ``result`` makes the ``RunResult`` once removal is timed."""

    verdict: Verdict
    exit_code: int | None
    capture: OutputCapture
    start_s: float
    run_s: float
    evidence: Evidence = "daemon"

    def result(
        self,
        box: OwnedContainer,
        denials: tuple[Denial, ...] = (),
        ports: tuple[PortForward, ...] = (),
    ) -> RunResult:
        """The run's result, after the ``owned_container`` block ended (removal timed);
        ``denials`` are what its governed network refused."""
        return self.result_of(
            box.container_id,
            box.lease,
            box.queued_s,
            box.create_s,
            box.remove_s or 0.0,
            denials,
            ports,
        )

    def result_of(
        self,
        container_id: str,
        lease: str,
        queued_s: float,
        create_s: float,
        remove_s: float,
        denials: tuple[Denial, ...] = (),
        ports: tuple[PortForward, ...] = (),
        *,
        pooled: bool = False,
    ) -> RunResult:
        """``result`` for a container known by its id and lease alone (a claimed one)."""
        timings = PhaseTimings(
            queued_s=queued_s,
            create_s=create_s,
            start_s=self.start_s,
            run_s=self.run_s,
            remove_s=remove_s,
        )
        return RunResult(
            status=self.verdict.status,
            exit_code=own_exit_code(self.verdict.status, self.exit_code),
            stdout=self.capture.stdout,
            stderr=self.capture.stderr,
            overflowed=self.capture.overflowed,
            container_id=container_id,
            lease=lease,
            timings=timings,
            oom_evidence=self.verdict.oom_evidence,
            kill_evidence=self.verdict.kill_evidence,
            pooled=pooled,
            evidence=self.evidence,
            denials=denials,
            ports=ports,
        )


async def run_attached(
    box: OwnedContainer, stdin: StdinSource | None, on_output: OutputCallback | None = None
) -> Ran:
    """Run the box's command once; the time limit starts when the container has started."""
    times = RunTimes()
    async with attached(box) as (attach, waiter):
        times.began()
        outcome = await supervise(attach, waiter, stdin, box.output_bytes, box.timeout_s, on_output)
        times.ended()
    verdict, exit_code = Verdict(status=outcome.status), None
    if outcome.status == "exited":
        # Only a payload that really exited has an exit code; after an overflow or a
        # timeout the code (if any) is sbxkit's kill, not the payload's answer.
        exit_code = outcome.exit_code
        verdict = await box.judge(exit_code)
    return times.ran(verdict, exit_code, outcome.capture)


class RunTimes:
    """A run's two phases on trio's clock: from asking for the start until the payload runs
    (``start_s``), then until it ended (``run_s``)."""

    def __init__(self) -> None:
        self._asked = self._began = trio.current_time()
        self._run_s = 0.0

    def began(self) -> None:
        self._began = trio.current_time()

    def ended(self) -> None:
        self._run_s = trio.current_time() - self._began

    def ran(
        self,
        verdict: Verdict,
        exit_code: int | None,
        capture: OutputCapture,
        evidence: Evidence = "daemon",
    ) -> Ran:
        return Ran(
            verdict=verdict,
            exit_code=exit_code,
            capture=capture,
            start_s=self._began - self._asked,
            run_s=self._run_s,
            evidence=evidence,
        )


class Outcome:
    """How a run's supervision ended: its status, the exit code (an exit of its own only) and
    the capped output."""

    def __init__(self, capture: OutputCapture) -> None:
        self.capture = capture
        self.status: Status = "exited"
        self.exit_code: int | None = None

    def take(self, stream_id: int, data: bytes, on_output: OutputCallback | None) -> bool:
        """Capture ``data`` of one stream under the caps, tell ``on_output`` exactly what was
        kept; True when this overflowed the cap (the status is then ``output_exceeded``)."""
        name = stream_name(stream_id)
        before = self.capture.kept(name)
        overflowed = self.capture.add(stream_id, data)
        kept = self.capture.kept(name) - before
        if on_output is not None and kept:
            on_output(name, bytes(data[:kept]))  # never past the cap
        if overflowed:
            self.status = "output_exceeded"
        return overflowed

    async def exited_with(self, code: int, drained: trio.Event, pumps: trio.Nursery) -> None:
        """The payload exited with ``code``: it stands unless sbxkit already ended the run (an
        overflow); the output gets ``DRAIN_GRACE_S`` to reach EOF, then the pumps stop."""
        if self.status == "exited":
            self.exit_code = code
        with trio.move_on_after(DRAIN_GRACE_S):
            await drained.wait()
        pumps.cancel_scope.cancel()

    def after(self, limit: trio.CancelScope) -> Outcome:
        """The outcome once the time limit's scope is left: ``timed_out`` if the limit ended a
        run that had not exited."""
        if limit.cancelled_caught and self.status == "exited" and self.exit_code is None:
            self.status = "timed_out"
        return self


@plain_async  # its nursery's errors (and Ctrl-C) leave as themselves, not as a group
async def supervise(
    attach: HijackedStream,
    waiter: Waiter,
    stdin: StdinSource | None,
    max_output: int,
    timeout_s: float,
    on_output: OutputCallback | None = None,
) -> Outcome:
    """Feed stdin, stream output under the caps, wait for exit — all within the time limit."""
    outcome = Outcome(OutputCapture(max_output))
    drained = trio.Event()
    with trio.move_on_after(timeout_s) as timer:
        async with trio.open_nursery() as nursery:

            async def pump_output() -> None:
                demuxer = Demuxer()
                while chunk := await attach.receive_some(ATTACH_READ):
                    for stream_id, data in demuxer.feed(chunk):
                        if outcome.take(stream_id, data, on_output):
                            nursery.cancel_scope.cancel()
                            return
                demuxer.close()
                drained.set()

            nursery.start_soon(feed_stdin, attach, stdin)
            nursery.start_soon(pump_output)
            reply = await waiter.result()
            if reply.error is not None and reply.error.message:
                raise EngineError("POST", "wait", 500, reply.error.message)
            await outcome.exited_with(reply.status_code, drained, nursery)
    return outcome.after(timer)


async def feed_stdin(stream: HijackedStream, stdin: StdinSource | None) -> None:
    """Write stdin, then half-close so the command sees EOF. A stream is read a chunk at a
    time, each when the socket took the last (back-pressure), and closed at the end. A command
    that stopped reading (or already exited) closes the pipe: that is its business, not an
    error."""
    try:
        await write_stdin(stream.send_all, stdin)
        await stream.send_eof()
    except EngineConnectionError:
        pass
