"""How a claim reaches its parked container and how its run is watched: two transports, one
contract (docs/pool.md).

- ``AttachTransport`` (the daemon's path): the claim line and stdin go through the container's
  attach stream, output comes back multiplexed on it, the exit is the daemon's ``wait``.
- ``FifoTransport`` (the kernel's path, ``sbxkit._kernel``): the claim line and stdin go into the
  sandbox's ``in`` FIFO, output comes from its ``out``/``err`` FIFOs until their EOF, the exit
  is its init's pidfd — verified when the container was parked.

Either way the claim line is the same (``line.py``), and so are the caps, the time limit
(from the claim) and the verdict's rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sbxkit._lifecycle.attached import Outcome, Ran, supervise
from sbxkit._lifecycle.kernel_run import Judge, kernel_verdict
from sbxkit._lifecycle.kernel_watch import Exited, Feed, KernelIO, KernelSupervise, supervise_kernel
from sbxkit._lifecycle.outcome import Verdict
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.result import Evidence, RunResult
from sbxkit._util.stdin import Prefixed
from sbxkit.engine.client import Engine, Waiter
from sbxkit.engine.transport import HijackedStream

__all__ = ["AttachTransport", "ClaimTransport", "Claimed", "FifoTransport"]


@dataclass(frozen=True)
class Claimed:
    """How a claimed run ended: its outcome (output, status), the verdict, the exit code (an
    exit of its own only) and what decided it."""

    outcome: Outcome
    verdict: Verdict
    exit_code: int | None
    evidence: Evidence

    def result(
        self,
        container_id: str,
        lease: str,
        *,
        start_s: float,
        run_s: float,
        remove_s: float,
        denials: tuple[Denial, ...],
        ports: tuple[PortForward, ...],
    ) -> RunResult:
        """The run's ``RunResult``, ``pooled``: no queue and no create of its own (the
        container was parked before the claim); ``start_s`` is the claim's own wait."""
        ran = Ran(
            verdict=self.verdict,
            exit_code=self.exit_code,
            capture=self.outcome.capture,
            start_s=start_s,
            run_s=run_s,
            evidence=self.evidence,
        )
        return ran.result_of(container_id, lease, 0.0, 0.0, remove_s, denials, ports, pooled=True)


class ClaimTransport(Protocol):
    async def run(self, feed: Feed, judge: Judge) -> Claimed: ...

    async def aclose(self) -> None: ...


@dataclass
class AttachTransport:
    """The daemon's path: the attach stream and the registered ``wait``."""

    attach: HijackedStream
    waiter: Waiter

    async def run(self, feed: Feed, judge: Judge) -> Claimed:
        stream = Prefixed(feed.line, feed.stdin)  # the claim line, then the run's own stdin
        outcome = await supervise(
            self.attach, self.waiter, stream, feed.max_output, feed.timeout_s, feed.on_output
        )
        verdict, code = Verdict(status=outcome.status), None
        if outcome.status == "exited":
            code = outcome.exit_code
            verdict = await judge(code)
        return Claimed(outcome, verdict, code, "daemon")

    async def aclose(self) -> None:
        await self.waiter.aclose()
        await self.attach.aclose()


@dataclass
class FifoTransport:
    """The kernel's path: the sandbox's FIFOs and its init's pidfd."""

    io: KernelIO
    exited: Exited
    evidence: Evidence
    engine: Engine
    container_id: str
    supervise: KernelSupervise = field(default=supervise_kernel)
    """Who watches the run (this process, unless the run was handed off: sbxkit.handoff)."""

    async def run(self, feed: Feed, judge: Judge) -> Claimed:
        # parked: its launch was over long ago (no after_go)
        outcome = await self.supervise(self.io, self.exited, feed, None)
        verdict, code, evidence = await kernel_verdict(
            self.engine, self.container_id, judge, outcome, self.evidence, self.io.init
        )
        return Claimed(outcome, verdict, code, evidence)

    async def aclose(self) -> None:
        await self.io.aclose()
