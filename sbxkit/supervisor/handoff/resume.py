"""A handed-off run carried on in a restarted supervisor (``RunResume``; docs/operations.md).

The supervisor a run was handed to died while the command line held its ends; the command
line saw the payload end (``RunEnded``'s status, the exit code read from its own pidfd of
the init: the kernel's word) and asks this supervisor — restarted, or launched for it — to
finish the run as the dead one would have:

- the lease is re-adopted with its secret exactly as an ``Adopt`` is (adopting.py: the
  record's hash checked, the next one journaled before anything else, the container verified
  by its label, the lease's original lifetime deadline kept); a run that cannot be re-adopted
  is answered ``RunError`` and the command line prints its ``lost`` line;
- the exit is judged with ``kernel_verdict`` as ever (the sandbox's memory cgroup is gone, so
  an OOM kill is the daemon's to tell, as for any exit read after its cgroup went);
- the container is removed under the re-adopted lease's task and the removal confirmed
  (``Closed``) before the report goes out: the record is closed once, by that task;
- a command line interrupted meanwhile (``ended`` None) asks for the removal only, answered
  ``RunInterrupted`` as a ``RunCancel`` is.
"""

from __future__ import annotations

import trio

from sbxkit._grammar.common import exit_code_for, exit_code_for_error
from sbxkit._grammar.run_grammar import RunBounds, status_notice
from sbxkit._lifecycle.attached import Outcome
from sbxkit._lifecycle.kernel_run import kernel_verdict
from sbxkit._lifecycle.outcome import Verdict, judge_exit
from sbxkit._model.result import PhaseTimings, RunResult, own_exit_code
from sbxkit._protocol.wire import (
    Adopt,
    Closed,
    Expiring,
    Orphaned,
    Queued,
    RunEnded,
    RunError,
    RunInterrupted,
    RunReport,
    RunResume,
    Unadopted,
)
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError, SbxError
from sbxkit.supervisor.adopting import Adopting
from sbxkit.supervisor.handoff.owner import LocalReplies
from sbxkit.supervisor.handoff.serve import LOST, Reported, result_document
from sbxkit.supervisor.lease import Intent, Peer, log

__all__ = ["serve_resume"]

REMOVAL_S = 60.0
"""How long the removal may take before the run is reported lost (``close_timeout_s``)."""


async def serve_resume(service: Adopting, peer: Peer, resume: RunResume) -> None:
    """Answer one ``RunResume`` (see the module's docstring)."""
    await peer.send(await _resumed(service, resume))


async def _never_queued(_queued: Queued) -> None:
    await trio.lowlevel.checkpoint()  # an adoption is never queued


async def _resumed(service: Adopting, resume: RunResume) -> RunReport | RunInterrupted | RunError:
    lease = resume.lease
    replies = LocalReplies(_never_queued)
    adopt = Adopt(lease=lease, secret=resume.secret, next_secret_hash=resume.next_secret_hash)
    live = await service.adopt_lease(replies, adopt)
    if live is None:
        refusal = replies.take(Unadopted) or replies.take(Closed)
        reason = refusal.reason if isinstance(refusal, Unadopted) else "its container is gone"
        return _lost(lease, None, f"a handed-off run was not re-adopted: {reason}")
    container_id = live.record.container_id or ""
    ended = resume.ended
    if ended is None:  # the command line was interrupted: the removal is all it asks for
        removal = await _removal(live.intent, replies)
        if removal is not None:
            return _lost(lease, container_id, removal)
        log(f"lease {lease}: a handed-off run interrupted after its supervisor died; removed")
        return RunInterrupted()
    try:
        engine = await service.engine_for(live.record.engine_socket)
        verdict, code = await _verdict(engine, container_id, resume, ended, replies)
    except SbxError as exc:
        live.intent.request_stop("caller closed")
        return _lost(lease, container_id, f"judging a resumed run: {exc}")
    removing = trio.current_time()
    removal = await _removal(live.intent, replies)
    if removal is not None:
        return _lost(lease, container_id, removal)
    log(f"lease {lease}: a handed-off run resumed by its command line; container removed")
    result = RunResult(
        status=verdict.status,
        exit_code=own_exit_code(verdict.status, code),
        stdout=b"",
        stderr=b"",
        overflowed=ended.overflowed,
        container_id=container_id,
        lease=lease,
        timings=PhaseTimings(
            queued_s=resume.queued_s,
            run_s=resume.run_s,
            remove_s=trio.current_time() - removing,
        ),
        oom_evidence=verdict.oom_evidence,
        kill_evidence=verdict.kill_evidence,
        pooled=resume.pooled,
        evidence="kernel",  # only a run on the kernel's evidence is handed off
    )
    document = None
    if resume.json:
        document = result_document(result, ended.stdout_bytes, ended.stderr_bytes)
    bounds = RunBounds(
        timeout_s=resume.timeout_s,
        output_bytes=resume.output_bytes,
        memory_bytes=live.record.memory_bytes,
        disk_bytes=resume.disk_bytes,
    )
    return RunReport(
        exit_status=exit_code_for(result), json=document, notice=status_notice(result, bounds)
    )


async def _removal(intent: Intent, replies: LocalReplies) -> str | None:
    """End the re-adopted lease (its task removes the container and closes the record); None
    once the daemon confirmed the removal, else why not."""
    intent.request_stop("caller closed")
    with trio.move_on_after(REMOVAL_S):
        while True:
            message = await replies.receive()
            if isinstance(message, Closed):
                return None
            if isinstance(message, Orphaned):
                return message.reason
    return f"no removal within {REMOVAL_S:g} s"


async def _verdict(
    engine: Engine, container_id: str, resume: RunResume, ended: RunEnded, replies: LocalReplies
) -> tuple[Verdict, int | None]:
    """``kernel_verdict`` of the exit the command line saw, as the dead supervisor's."""
    outcome = Outcome(Reported(ended))
    outcome.status = ended.status
    outcome.exit_code = resume.exit_code
    if outcome.status == "exited" and resume.exit_code is None:
        raise SbxError("the command line saw the payload exit but not its status")

    async def ended_by_owner() -> Expiring | None:
        await trio.lowlevel.checkpoint()
        expiring = replies.take(Expiring)
        return expiring if isinstance(expiring, Expiring) else None

    async def judge(code: int | None) -> Verdict:
        return await judge_exit(engine, container_id, code, ended_by_owner=ended_by_owner)

    verdict, code, _evidence = await kernel_verdict(
        engine, container_id, judge, outcome, "kernel", None
    )
    return verdict, code


def _lost(lease: str, container_id: str | None, reason: str) -> RunError:
    """Not carried on: the command line prints its own ``lost`` line (``RunStarted``)."""
    log(f"lease {lease}: {reason}")
    lost = CleanupError(lease, container_id or None, LOST)
    return RunError(exit_status=exit_code_for_error(lost), stderr=f"sbxkit: error: {reason}\n")
