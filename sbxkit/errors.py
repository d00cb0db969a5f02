"""One error root for everything sbxkit raises.

Every public function raises an `SbxError` subclass, never a bare trio, OS or h11 exception.
Each subclass carries the context a user needs to act: the field and rule for refused input,
the HTTP method, path, status and daemon message for engine errors, the container and lease
for cleanup failures.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Sequence
from typing import Any


class SbxError(Exception):
    """Root of every error sbxkit raises."""


class SpecError(SbxError):
    """Refused input: a field of the spec breaks a rule. Raised before any container exists."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class NeverFits(SpecError):
    """The sandbox is larger than the host's whole budget (memory above the memory budget,
    CPUs above the daemon's count or an operator's CPU budget): it could never start, so it is
    refused at once, before anything is queued or created. CLI exit status 2."""

    def __init__(self, field: str, rule: str, *, lease: str | None = None) -> None:
        super().__init__(field, rule)
        self.lease = lease


class EngineUnavailable(SbxError):
    """No usable Docker engine at the socket (absent, not answering, or too old)."""

    def __init__(self, socket_path: str, reason: str) -> None:
        super().__init__(f"Docker engine at {socket_path} is unavailable: {reason}")
        self.socket_path = socket_path
        self.reason = reason


class EngineConnectionError(SbxError):
    """The connection to the daemon broke in the middle of a call (daemon gone or reset)."""

    def __init__(self, method: str, path: str, reason: str) -> None:
        super().__init__(f"{method} {path}: connection to the Docker engine lost: {reason}")
        self.method = method
        self.path = path
        self.reason = reason


class EngineProtocolError(SbxError):
    """The daemon's bytes broke HTTP/1.1 or the stream framing: the connection is unusable."""


class EngineTimeout(SbxError):
    """An Engine API call did not finish before its deadline."""

    def __init__(self, method: str, path: str, seconds: float) -> None:
        super().__init__(f"{method} {path}: no answer within {seconds:g} s")
        self.method = method
        self.path = path
        self.seconds = seconds


class EngineError(SbxError):
    """The daemon answered an Engine API call with an error status."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        message = scrub_daemon_paths(message)  # the daemon's data-root is not the user's business
        super().__init__(f"{method} {path} -> {status}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.message = message


class NotFound(EngineError):
    """404 from the daemon."""


class Conflict(EngineError):
    """409 from the daemon."""


class ImageError(SbxError):
    """The image cannot be used: missing locally (sbxkit never pulls) or refused by policy."""

    def __init__(self, image: str, reason: str) -> None:
        super().__init__(f"image {image!r}: {reason}")
        self.image = image
        self.reason = reason


class ContainerMismatch(SbxError):
    """The created container is not what was asked for; it was removed without starting."""

    def __init__(self, container_id: str, what: str) -> None:
        super().__init__(f"container {container_id[:12]}: {what}")
        self.container_id = container_id
        self.what = what


class ImageChanged(ContainerMismatch):
    """The container was created from another image than the one its run was planned on (the
    name was moved to another image since it was inspected); removed without starting."""


class CleanupError(SbxError):
    """Removing a sandbox's container failed. The lease is kept so removal can be retried."""

    def __init__(self, lease: str, container_id: str | None, reason: str) -> None:
        target = container_id[:12] if container_id else "(id unknown)"
        super().__init__(f"lease {lease}: removing container {target} failed: {reason}")
        self.lease = lease
        self.container_id = container_id
        self.reason = reason


class UidTaken(SbxError):
    """The uid a lease's sandbox would run as (``sbxkit._model.uids``) is a host account's, in a
    subordinate range, or held by another owner: nothing was created. A run is planned again
    under a new lease, and so a new uid, a few times (``UID_ATTEMPTS``) before this is raised."""

    def __init__(self, lease: str, reason: str) -> None:
        super().__init__(f"lease {lease}: no uid of its own: {reason}")
        self.lease = lease
        self.reason = reason


UID_ATTEMPTS = 8
"""How many leases (each with its own uid) a sandbox is planned under before ``UidTaken``."""


# -- the engine's stream framing -------------------------------------------------------------------


class FrameError(EngineProtocolError):
    """The attach stream broke Docker's framing: the connection carries no trustworthy output."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(f"attach stream framing broken at byte {offset}: {problem}")
        self.offset = offset  # position in the whole stream, counted from the first byte fed
        self.problem = problem


# -- governed networking ---------------------------------------------------------------------------


class NetworkUnavailable(SbxError):
    """The governed network could not be put in place for a sandbox (its payload never ran)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"governed network: {reason}")
        self.reason = reason


# -- the command line's files and extras -----------------------------------------------------------


class MissingExtra(SpecError):
    """The MCP SDK (the ``sbxkit[mcp]`` extra) is not installed."""


class JobsFileError(SpecError):
    """A line of the jobs file is not a valid job. Raised before anything runs."""

    def __init__(self, source: str, line: int, field: str, rule: str) -> None:
        super().__init__(field, rule)
        self.args = (f"{source} line {line}: {field}: {rule}",)
        self.source = source
        self.line = line


class ResultsFileError(SpecError):
    """The results file holds a line that is not a complete result: it is not ours to extend."""

    def __init__(self, source: str, line: int, rule: str) -> None:
        super().__init__("results", rule)
        self.args = (f"{source} line {line}: {rule}",)
        self.source = source
        self.line = line


# -- pools -----------------------------------------------------------------------------------------


class PoolUnavailable(SbxError):
    """The supervisor could not park a container of the shape (``PooledBackend.warm``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"pool: {reason}")
        self.reason = reason


# -- the kernel path -------------------------------------------------------------------------------


class IoDirError(SbxError):
    """The FIFO root or a lease's FIFO directory is not what sbxkit made."""


# -- the sbx microVM backend -----------------------------------------------------------------------


class SbxUnavailable(EngineUnavailable):
    """The ``sbx`` binary cannot be run (not installed, not executable) or does not answer."""

    def __init__(self, binary: str, reason: str) -> None:
        super().__init__(binary, reason)
        self.args = (f"sbx ({binary}) is unavailable: {reason}",)
        self.binary = binary


class SbxCommandError(SbxError):
    """An ``sbx`` command failed (non-zero exit or no answer within its deadline)."""

    def __init__(self, what: str, returncode: int | None, detail: str) -> None:
        status = "timed out" if returncode is None else f"exit status {returncode}"
        super().__init__(f"sbx {what} failed ({status}): {detail or 'no output'}")
        self.what = what
        self.returncode = returncode
        self.detail = detail


class SbxCleanupError(CleanupError):
    """``sbx rm --force`` could not be confirmed (the sandbox is still listed), or the run's
    workspace could not be deleted. The sandbox's name carries the runner id, so the next
    start of that runner retries the removal."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name, name, reason)
        self.args = (f"removing sandbox {name} failed: {reason}",)
        self.name = name


class RunnerInUse(SbxError):
    """Another live runner holds this runner id's lock (two would remove each other's runs)."""

    def __init__(self, runner_id: str, lock_path: str) -> None:
        super().__init__(f"runner id {runner_id!r} is held by a live runner ({lock_path})")
        self.runner_id = runner_id
        self.lock_path = lock_path


class SandboxListError(SbxError):
    """``sbx ls`` printed something that is neither JSON nor a NAME-headed table."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot read the output of `sbx ls`: {reason}")
        self.reason = reason


# -- sandboxes -------------------------------------------------------------------------------------


class SandboxExpired(SbxError):
    """The session's time limit (``spec.limits.timeout_s``) ended the ``async with`` block;
    the container was removed."""

    def __init__(self, lease: str, container_id: str, seconds: float) -> None:
        super().__init__(
            f"sandbox {container_id[:12]} (lease {lease}): the session's time limit of "
            f"{seconds:g} s passed; the sandbox was removed"
        )
        self.lease = lease
        self.container_id = container_id
        self.seconds = seconds


class SandboxUnusable(SbxError):
    """The sandbox can no longer run work (its container was killed or stopped)."""

    def __init__(self, container_id: str, reason: str) -> None:
        super().__init__(f"sandbox {container_id[:12]} is unusable: {reason}")
        self.container_id = container_id
        self.reason = reason


class MetricsUnavailable(SbxError):
    """This host cannot read a sandbox's cgroup (``Sandbox.metrics``, ``sbxkit top``); the
    message says why: a remote or VM-backed daemon, a stopped container, a file's mode."""


class ProcessError(SbxError):
    """A background process (``Sandbox.start``) refused an operation: its stdin is closed or
    was never attached, it has ended, or it is not a terminal."""

    def __init__(self, process_id: str, reason: str) -> None:
        super().__init__(f"process {process_id}: {reason}")
        self.process_id = process_id
        self.reason = reason


class TooManyProcesses(ProcessError):
    """``Sandbox.start`` beyond the session's limit of live background processes."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            "(not started)",
            f"the sandbox already runs {limit} background processes, its limit "
            "(open_sandbox(max_processes=...)); wait for or kill one first",
        )
        self.limit = limit


class ProcessStillRunning(ProcessError):
    """``Process.wait(timeout)`` returned before the process ended (it keeps running)."""

    def __init__(self, process_id: str, seconds: float) -> None:
        super().__init__(process_id, f"still running after waiting {seconds:g} s")
        self.seconds = seconds


class InterpreterDied(SbxError):
    """An interpreter (``open_interpreter``) ended or was ended: its process exited or was
    killed (``status``, ``exit_code`` and ``evidence`` say how, on the daemon's evidence where
    there is any), it broke its protocol, or it did not stop after an interrupt. Its state is
    gone; ``Interpreter.restart()`` starts a fresh one."""

    def __init__(
        self,
        reason: str,
        *,
        status: str | None = None,
        exit_code: int | None = None,
        evidence: str | None = None,
    ) -> None:
        super().__init__(f"the interpreter died: {reason}")
        self.reason = reason
        self.status = status
        self.exit_code = exit_code
        self.evidence = evidence


class SessionError(SbxError):
    """A command naming an open session (``sbxkit open``) could not reach it, or what it
    asked failed there. ``code`` is the exit status the command line gives it."""

    def __init__(self, name: str, reason: str, *, code: int, field: str | None = None) -> None:
        super().__init__(f"session {name}: {reason}")
        self.name = name
        self.reason = reason
        self.code = code
        self.field = field


# -- the supervisor --------------------------------------------------------------------------------


class LinkLost(SbxError):
    """The lease's connection is gone for good: the lease was not re-adopted (or is over)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SupervisorError(SbxError):
    """The supervisor refused or failed a request, or could not be reached."""

    def __init__(self, reason: str, *, code: str = "error", lease: str | None = None) -> None:
        super().__init__(f"supervisor: {reason}")
        self.reason = reason
        self.code = code
        self.lease = lease


class ReattachRefused(SupervisorError):
    """The supervisor refused to hand a detached sandbox over (``attach_sandbox``): a wrong
    secret, a handle already used, a lease unknown, ended, or carried by a connection. The
    lease is untouched; the supervisor's log says the same. ``ended``: the lease is over (no
    record of it, or its keep deadline passed), not refused for cause — a caller may make a
    new sandbox instead."""

    def __init__(self, lease: str, reason: str, *, ended: bool = False) -> None:
        super().__init__(f"reattach refused: {reason}", code="reattach", lease=lease)
        self.ended = ended


class SupervisorConnectionLost(SupervisorError):
    """The connection to the supervisor closed while sending."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"connection lost: {reason}", code="connection")


class CreateInterrupted(SupervisorError):
    """The connection to the supervisor was lost while it created the lease's container (it
    died), and no restarted supervisor handed a container over: none appeared in time, or
    none answered. The caller never heard of a container, so nothing of its payload ran; the
    lease is the supervisor's from here (its journal's record: recovery removes any container
    the interrupted create made). A one-shot run registers afresh under a new lease
    (``DockerBackend.run_once``)."""


class CapacityExhausted(SupervisorError):
    """A hard bound is used up — lease records or connections — and the request was refused
    explicitly (nothing was created). Retrying later can succeed; CLI exit status 75."""


class AdmissionTimeout(CapacityExhausted):
    """The request waited for capacity (memory, live sandboxes, launches) longer than the
    supervisor's admission deadline (``--admission-timeout``); nothing was created."""


# -- clusters --------------------------------------------------------------------------------------


class ClusterUnavailable(EngineUnavailable):
    """The Ray cluster cannot run the batch: unreachable, no node accepted, or none left.
    (An ``EngineUnavailable``: ``sbxkit batch --ray`` exits 69.)"""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(address, reason)
        self.args = (f"Ray cluster at {address}: {reason}",)
        self.address = address


class ClusterUnauthenticated(ClusterUnavailable):
    """The Ray cluster lets in callers without its token (it does not enforce token
    authentication), or the driver has no token for one that does: nothing is sent to it.
    (``sbxkit batch --ray`` exits 69, with how to turn it on.)"""


# -- the blocking and asyncio layers ---------------------------------------------------------------


class PortalClosed(SbxError):
    """The portal's trio thread has ended; nothing more can run through it."""


class CallCancelled(SbxError):
    """The call was cancelled from outside the trio thread before it finished."""


# -- file grants and transfers ---------------------------------------------------------------------


class GrantError(SbxError):
    """A granted file could not be used safely, so it was refused.

    Raised before the run for inputs (no container was created) and after it for outputs
    (the container was already removed; ``result`` is the run's result). ``published`` lists
    outputs that were published before the failure: empty for every refusal found while
    checking, since all outputs are checked before the first is published.
    """

    def __init__(
        self,
        grant: str,
        path: str,
        reason: str,
        *,
        published: Sequence[Any] = (),
        result: Any = None,
    ) -> None:
        super().__init__(f"{grant} ({path}): {reason}")
        self.grant = grant
        self.path = path
        self.reason = reason
        # Typed loosely here, where nothing above the ground floor is known: ``published`` holds
        # ``sbxkit.Receipt``s, ``result`` is the run's ``sbxkit.RunResult`` (or None).
        self.published: list[Any] = list(published)
        self.result: Any = result


class ArchiveError(SbxError):
    """A file transfer was refused: a name escapes the root, a member is not a regular file,
    or a cap was exceeded. ``member`` is the offending name (or ``"*"`` for a cap)."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"file transfer refused: {member!r}: {reason}")
        self.member = member
        self.reason = reason


class SandboxFileNotFound(ArchiveError, FileNotFoundError):
    """``get_files`` named a file that is not in the sandbox. An ``ArchiveError`` (so an
    ``SbxError``) and a ``FileNotFoundError``: ``member`` and ``filename`` are the path as
    given, ``path`` where it was looked for."""

    def __init__(self, member: str, path: str) -> None:
        ArchiveError.__init__(self, member, f"no such file in the sandbox ({path})")
        self.errno = errno.ENOENT
        self.strerror = "No such file in the sandbox"
        self.filename = member
        self.path = path

    def __str__(self) -> str:
        return f"no such file in the sandbox: {self.member!r} ({self.path})"


# -- the MCP server --------------------------------------------------------------------------------


class QuotaExhausted(SbxError):
    """No sandbox slot left for this client, or for all clients together."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class UnknownSandbox(SpecError):
    """No open sandbox of this client has that id (never opened, another client's, ended)."""

    def __init__(self, rule: str) -> None:
        super().__init__("sandbox_id", rule)


class HubStopping(SbxError):
    """The server is stopping: no sandbox is opened any more."""


class Unauthenticated(SbxError):
    """An HTTP request reached a tool without the gate's identity (never, when served by
    ``sbxkit.mcp.transports``): refused rather than guessed."""


# -- the supervisor's wire and state directory -----------------------------------------------------


class WireError(SbxError):
    """A peer broke the supervisor protocol (oversized, malformed or unexpected message)."""


class StorageError(SbxError):
    """The supervisor's state is unsafe or malformed; new execution is blocked until fixed."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"supervisor state {path}: {problem}")
        self.path = path
        self.problem = problem


# -- the daemon's messages, as sbxkit repeats them -------------------------------------------------
#
# What sbxkit repeats of the daemon's error messages, and which of them mean "your input".
#
# The daemon's messages name its own storage: a 5000-character workdir came back as ``lstat
# /var/lib/docker/overlay2/<64 hex>/merged/aaaa...: file name too long``, telling a sandbox user
# the host's data-root. ``scrub_daemon_paths`` rewrites such paths before any sbxkit error
# carries them: a container's root filesystem path becomes the path inside the container, and
# any other absolute path through a 64-hex id directory becomes ``<daemon>/<id-dir>/...``, and
# a named volume's data directory (``<data-root>/volumes/NAME/_data``, which Docker 26 names when
# a volume ``subpath`` is missing) becomes ``volume NAME``.
#
# ``is_refusal_status`` and ``create_refusal_in`` say which engine failures are refused input (CLI
# exit 2, not 70; ``sbxkit/_grammar/daemon_refusal.py``): a 4xx answer to the container create,
# other than 409 (the create's name is sbxkit's own), whether the create ran in-process or in the
# supervisor (its ``create failed`` reason carries the daemon's status line). Pure.


_ID = r"[0-9a-f]{64}"
_ROOTFS = re.compile(
    rf"/[^\s:'\"]*?/(?:overlay2?|fuse-overlayfs|vfs/dir|aufs/mnt|btrfs/subvolumes|zfs/graph"
    rf"|devicemapper/mnt)/{_ID}(?:-init)?(?:/merged|/diff|/rootfs)?(?=/|[\s:'\"]|$)"
)
"""A container's root filesystem as the storage driver mounts it under the data-root."""
_ID_DIR = re.compile(rf"/[^\s:'\"]*?/({_ID})(?:-init)?(?=/|[\s:'\"]|$)")
"""Any other absolute path reaching into a 64-hex id directory (containers/, image/ ...)."""

_VOLUME_DATA = re.compile(
    r"/[^\s:'\"]*?/volumes/([a-zA-Z0-9][a-zA-Z0-9_.-]+)/_data(?=/|[\s:'\"]|$)"
)
"""A named volume's data directory under the data-root."""

_CREATE_LINE = re.compile(r"\bPOST \S*/containers/create\S* -> (?P<status>\d{3}):")


def scrub_daemon_paths(message: str) -> str:
    """``message`` without the daemon's host paths (see the section above)."""
    inside = _ROOTFS.sub(lambda m: "" if m.string[m.end() : m.end() + 1] == "/" else "/", message)
    volumes = _VOLUME_DATA.sub(lambda m: f"volume {m[1]}", inside)
    return _ID_DIR.sub(lambda m: f"<daemon>/{m[1][:12]}", volumes)


def is_refusal_status(status: int) -> bool:
    """A 4xx other than 409 (the create's name is sbxkit's own, not the user's input)."""
    return 400 <= status < 500 and status != 409


def create_refusal_in(reason: str) -> bool:
    """Whether a supervisor's ``create failed: ...`` reason carries a refusal status."""
    match = _CREATE_LINE.search(reason)
    return (
        reason.startswith("create failed:")
        and match is not None
        and is_refusal_status(int(match["status"]))
    )
