"""The hand-off's messages (wire.py names them among the rest; pure).

``sbxkit run`` may hand its whole run to the supervisor (sbxkit/handoff, docs/operations.md):
the supervisor parses its argv with the CLI's own parser, plans, claims or creates, starts
the sandbox on its FIFOs, and hands the command line the FIFO ends and the init's pidfd;
the command line feeds stdin and reads output itself, and asks for the verdict:

    Hello, Run(argv, state_dir, env, …) ─►
                                     ◄─     Queued …  (while it waits for capacity)
                                     ◄─     RunDeclined (nothing ran: the full path runs it)
                                          | RunError (an error to print as it is)
                                          | RunStarted(line, caps, …) + the ends (SCM_RIGHTS)
    RunEnded(status, byte counts)    ─►     (the verdict; removal, waited for when sbxkit
                                     ◄─      killed the payload)  RunReport | RunError
    RunCancel(signal)                ─►     (at any point: removal first)
                                     ◄─     RunInterrupted | RunError

Should the supervisor die while the command line holds the ends, the command line re-adopts
the run in the next one (launched if need be) with the lease's secret from ``RunStarted``:

    Hello, RunResume(lease, secret, next_hash, ended, exit_code, …) ─►
                                     ◄─     (adopted, judged, removed)  RunReport | RunError
    (interrupted: ended=None, cancel=signal) ◄─ (adopted, removed)  RunInterrupted | RunError
"""

from __future__ import annotations

from typing import Literal

from sbxkit._protocol.framing import Message


class Run(Message, tag="run"):
    """``sbxkit run`` handed to the supervisor (instead of Register; sbxkit/handoff).

    ``argv`` is the command line after ``sbxkit`` (it starts with ``run``), parsed here by the
    CLI's own parser. ``env`` holds the caller's variables the run is judged under (those the
    planning reads, those ``--env NAME`` names, those that find the daemon); ``state_dir`` is
    where the caller found this supervisor. ``json`` and ``stdin`` are what the caller's quick
    scan of argv found: the run is declined unless the parse agrees."""

    argv: list[str]
    state_dir: str
    env: dict[str, str]
    json: bool
    stdin: str | None = None


class RunEnded(Message, tag="run_ended"):
    """The handed-off run's payload ended, as the command line saw it on its FIFOs and the
    init's pidfd (or its time limit or an output cap ended it): judge it."""

    status: Literal["exited", "timed_out", "output_exceeded"]
    stdout_bytes: int
    stderr_bytes: int
    overflowed: Literal["stdout", "stderr"] | None = None


class RunCancel(Message, tag="run_cancel"):
    """The command line got ``signal`` (SIGINT, SIGTERM): remove the sandbox, then answer."""

    signal: int


class RunDeclined(Message, tag="run_declined"):
    """The handed-off run is not served here (an option the hand-off does not take, a refusal,
    the daemon's path ...): nothing of its payload ran; the command line runs it itself."""

    reason: str


class RunStarted(Message, tag="run_started"):
    """The sandbox waits for ``line`` on its stdin (the go line, or a pool's claim line):
    its ends ride with this message (``SCM_RIGHTS``: stdin, stdout, stderr, the init's pidfd).
    The command line writes ``line`` then its stdin, keeps ``output_bytes`` per stream, ends
    the run after ``timeout_s``, and drains output at most ``drain_s`` after the exit. Should
    this supervisor be gone before the verdict, it resumes the run in the next one
    (``RunResume``, with ``secret``); failing that it prints ``lost_stderr`` (and
    ``lost_json`` under ``--json``) and exits ``lost_status``."""

    lease: str
    line: bytes
    output_bytes: int
    timeout_s: float
    drain_s: float
    fds: int
    lost_status: int
    lost_stderr: str
    lost_json: str | None = None
    secret: str | None = None
    """The lease's secret (the record journals only its hash): should this supervisor die,
    the command line re-adopts the run in the next one with it (``RunResume``; a governed
    run's listeners died with this supervisor: its egress stays closed). None: the lease
    cannot be re-adopted."""
    engine_socket: str = ""
    """The daemon the lease's container lives on (a supervisor launched to resume serves it)."""
    pooled: bool = False
    queued_s: float = 0.0
    """What the verdict's result says beside the command line's own figures."""
    disk_bytes: int | None = None
    """The bound on the sandbox's writable image, for the verdict line (None: read-only)."""


class RunResume(Message, tag="run_resume"):
    """A handed-off run whose supervisor died (instead of Register;
    sbxkit/supervisor/handoff/resume.py): re-adopt its lease with ``secret`` (as ``Adopt`` does:
    ``next_secret_hash`` is journaled), judge the exit the command line saw — ``exit_code`` read
    from its pidfd of the init, the kernel's word — remove the container, and answer ``RunReport``
    as the dead supervisor would have (else ``RunError``: the command line prints its ``lost``
    line)."""

    lease: str
    secret: str
    next_secret_hash: str
    ended: RunEnded | None = None
    """None: the command line was interrupted (``cancel``): remove, answer RunInterrupted."""
    cancel: int | None = None
    exit_code: int | None = None
    json: bool = False
    pooled: bool = False
    queued_s: float = 0.0
    run_s: float = 0.0
    output_bytes: int | None = None
    timeout_s: float | None = None
    disk_bytes: int | None = None
    """``RunStarted``'s limits, echoed: the verdict line names them (``memory_bytes`` is the
    lease record's)."""


class RunReport(Message, tag="run_report"):
    """The handed-off run's result: the exit status, the ``--json`` document (its ``stdout``
    and ``stderr`` empty: the command line puts its own output there), and the line said after
    the payload's stderr (``sbxkit: timed out after 30 s``), if any."""

    exit_status: int
    json: str | None = None
    notice: str | None = None


class RunError(Message, tag="run_error"):
    """The handed-off run failed as ``sbxkit run`` reports failures: ``stderr`` to print,
    ``json`` (under ``--json``) to print on stdout, and the exit status."""

    exit_status: int
    stderr: str
    json: str | None = None


class RunInterrupted(Message, tag="run_interrupted"):
    """The answer to RunCancel: the sandbox is removed (or was never created)."""
