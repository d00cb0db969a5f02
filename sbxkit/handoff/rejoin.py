"""The command line's side of ``RunResume``: a handed-off run outlives its supervisor.

``client.py`` holds the sandbox's ends and the init's pidfd, so the payload runs on and its
output is kept whatever happens to the supervisor. Should the connection drop before the
verdict (``RunEnded`` unsent or ``RunReport`` unread), the lease's record is held by the
restarted supervisor for its grace period (adopting.py: the record journaled the hash of the
secret ``RunStarted`` carried). Here, a rare path that may load trio and the supervisor's
client: the exit status is read from the pidfd (the kernel's word), the state directory's
supervisor is reached — launched if none runs, as any lease's re-adoption does (link.py) —
and sent ``RunResume`` with the secret and a fresh one's hash, again with the same pair until
an answer comes or ``ADOPT_WITHIN_S`` passed. Its ``RunReport`` is printed as the dead
supervisor's would have been; anything else leaves the command line's ``lost`` line.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import trio

from sbxkit._kernel.init import REAP_LIMIT_S, REAP_POLL_S
from sbxkit._kernel.pidfd import exit_status, status_code, wait_reaped
from sbxkit._lifecycle.connect import connect_supervisor, receive_reply
from sbxkit._lifecycle.link import ADOPT_WITHIN_S, RETRY_CEILING_S, new_secret
from sbxkit._protocol.proof import secret_hash
from sbxkit._protocol.wire import RunEnded, RunError, RunInterrupted, RunReport, RunResume
from sbxkit.errors import SbxError

__all__ = ["rejoin", "resume_message"]

ANSWER_S = 120.0
"""The longest a resumed run's answer may take: its verdict, then its removal confirmed."""


def rejoin(
    started: dict[str, Any],
    ended: dict[str, Any] | None,
    pidfd: int,
    run_s: float,
    state_dir: str,
    json_output: bool,
    cancel: int | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """The answer (as the command line reads messages) of the next supervisor for the run
    ``started`` — ``RunReport`` for a run that ``ended``, ``RunInterrupted`` for one the
    command line was interrupted in (``cancel``, its signal) — or None; and what happened,
    for the hand-off's trace."""
    if not started.get("secret"):
        return None, "lost: the lease cannot be re-adopted (no secret)"
    code = None
    if ended is not None and ended["status"] == "exited":
        code = _exit_code(pidfd)
        if code is None:
            return None, "lost: the init's exit status could not be read"
    resume = resume_message(started, ended, code, run_s, json_output, cancel)
    engine_socket = started.get("engine_socket") or None
    wakeup = signal.set_wakeup_fd(-1)  # the hand-off's: trio would warn, and set its own
    try:
        answer, how = trio.run(_resume, resume, Path(state_dir), engine_socket)
    finally:
        signal.set_wakeup_fd(wakeup, warn_on_full_buffer=False)
    if answer is None:
        return None, how
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(answer))
    return decoded, how


def resume_message(
    started: dict[str, Any],
    ended: dict[str, Any] | None,
    exit_code: int | None,
    run_s: float,
    json_output: bool,
    cancel: int | None = None,
) -> RunResume:
    """``RunResume`` for the run ``started`` (as the command line decoded it), which ended as
    ``ended`` (its ``RunEnded``) with ``exit_code``, or was interrupted by ``cancel``: the
    lease's secret and a fresh one's hash. Should the next supervisor die too, the very same
    pair is sent again (proof.py accepts it as the retry of an adoption whose answer was
    lost), so the fresh secret is never needed."""
    return RunResume(
        lease=started["lease"],
        secret=started["secret"],
        next_secret_hash=secret_hash(new_secret()),
        ended=None
        if ended is None
        else msgspec.convert({k: v for k, v in ended.items() if k != "type"}, RunEnded),
        cancel=cancel,
        exit_code=exit_code,
        json=json_output,
        pooled=bool(started.get("pooled")),
        queued_s=float(started.get("queued_s", 0.0)),
        run_s=run_s,
        output_bytes=started.get("output_bytes"),
        timeout_s=started.get("timeout_s"),
        disk_bytes=started.get("disk_bytes"),
    )


def _exit_code(pidfd: int) -> int | None:
    """The init's exit as Docker spells it, once reaped (the kernel's word)."""
    deadline = time.monotonic() + REAP_LIMIT_S
    while time.monotonic() < deadline:
        try:
            status = exit_status(pidfd)
        except OSError:
            return None
        if status is not None:
            return status_code(status)
        wait_reaped(pidfd, REAP_POLL_S)
    return None


async def _resume(
    resume: RunResume, state_dir: Path, engine_socket: str | None
) -> tuple[RunReport | RunInterrupted | None, str]:
    problem = "no supervisor answered"
    delay = 0.05
    deadline = trio.current_time() + ADOPT_WITHIN_S  # for a first answer; the removal may last
    while trio.current_time() < deadline:
        try:
            session = await connect_supervisor(
                state_dir, resume, engine_sockets=None if engine_socket is None else [engine_socket]
            )
        except (SbxError, OSError) as exc:
            problem = str(exc)
        else:
            try:
                reply = await receive_reply(session, "resume", ANSWER_S)
                if isinstance(reply, RunReport):
                    return reply, "resumed: the supervisor died; the one after it judged the run"
                if isinstance(reply, RunInterrupted):
                    return reply, "resumed: the supervisor died; the one after it removed the run"
                if isinstance(reply, RunError):
                    return None, f"lost: {reply.stderr.strip()}"
                problem = f"unexpected {type(reply).__name__}"  # e.g. Refused: again
            except SbxError as exc:
                problem = str(exc)  # it died again before answering: the same pair again
            finally:
                with trio.CancelScope(shield=True):
                    await session.aclose()
        await trio.sleep(delay)
        delay = min(delay * 2, RETRY_CEILING_S)
    return None, f"lost: not resumed within {ADOPT_WITHIN_S:g} s ({problem})"
