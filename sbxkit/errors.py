"""One error root for everything sbxkit raises.

Every public function raises an `SbxError` subclass, never a bare trio, OS or h11 exception.
Each subclass carries the context a user needs to act: the field and rule for refused input,
the HTTP method, path, status and daemon message for engine errors, the container and lease
for cleanup failures.
"""

from __future__ import annotations

from sbxkit.daemon_messages import scrub_daemon_paths


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
    """The uid a lease's sandbox would run as (``sbxkit.uids``) is a host account's, in a
    subordinate range, or held by another owner: nothing was created. A run is planned again
    under a new lease, and so a new uid, a few times (``UID_ATTEMPTS``) before this is raised."""

    def __init__(self, lease: str, reason: str) -> None:
        super().__init__(f"lease {lease}: no uid of its own: {reason}")
        self.lease = lease
        self.reason = reason


UID_ATTEMPTS = 8
"""How many leases (each with its own uid) a sandbox is planned under before ``UidTaken``."""
